/* openssl.c -- loads OpenSSL on the first rediss:// or redlocks:// client
 * (openssl.h says why). */
#define DLOCK__OPENSSL_TABLE
#include "openssl.h"

#include "backend.h"

struct dlock__openssl_api dlock__openssl;

int dlock__openssl_load(void)
{
    static const struct dlock__dl_sym syms[] = {
#define SYM(f) {(void **)&dlock__openssl.f, #f},
        DLOCK__OPENSSL_FUNCS(SYM)
#undef SYM
    };
    static struct dlock__dl_lib lib =
        DLOCK__DL_LIB("libssl.so.3", "the Redis backend (rediss://, redlocks://)", "libssl3", syms,
                      NULL);
    return dlock__dl_load(&lib);
}
