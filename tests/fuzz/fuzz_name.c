/* fuzz_name.c -- libFuzzer target for lock-name encoding (src/names.c),
 * the mapping every backend uses to keep a name inside its directory, key
 * space or base path: for any bytes, the encoding decodes back to the
 * same name, holds only letters, digits, '-', '_', '%' and the bytes the
 * caller keeps, is never "." or "..", and (with DLOCK__ENC_NO_LEADING_DOT)
 * never starts with a dot. The first input byte picks the kept set, as
 * the backends pass them.
 * Corpus: tests/fuzz/corpus/name/.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* as the callers pass them: redis/etcd (none), file ("."), zk */
    static const char *const keeps[] = {"", ".", ".~:@+=,"};
    if (size < 2)
        return 0;
    const char *keep = keeps[data[0] % 3];
    unsigned flags = (data[0] & 4) ? DLOCK__ENC_NO_LEADING_DOT : 0;
    /* the name: the rest, up to its first NUL (names are C strings) */
    char *name = strndup((const char *)data + 1, size - 1);
    if (!name)
        return 0;
    char *enc = dlock__name_encode(name, keep, flags);
    if (!enc)
        abort();
    for (const char *p = enc; *p; p++) {
        int ok = (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
                 *p == '-' || *p == '_' || *p == '%' || strchr(keep, *p);
        if (!ok)
            abort();
    }
    if (strcmp(enc, ".") == 0 || strcmp(enc, "..") == 0)
        abort();
    if ((flags & DLOCK__ENC_NO_LEADING_DOT) && enc[0] == '.')
        abort();
    char *dec = dlock__name_decode(enc);
    if (!dec || strcmp(dec, name) != 0)
        abort();
    free(dec);
    free(enc);
    free(name);
    return 0;
}
