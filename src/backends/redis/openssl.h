/* openssl.h -- OpenSSL for the Redis backend's TLS, loaded on first use.
 *
 * Linking libssl and libcrypto made every process that links libdlock --
 * and every `dlock` start -- load and initialise them, rediss:// or not:
 * `dlock --version` took 2.1x as long (docs/benchmarks.md). So tls.c
 * (rediss://, redlocks://) reaches OpenSSL through this table, filled by
 * dlopen("libssl.so.3") (src/dlsym.c; libcrypto comes with it) when the
 * first TLS client opens (Redlock's script digests are computed at
 * build time, not by libcrypto). The names below map the ordinary calls onto it -- OpenSSL's macros too, which
 * expand to these functions -- so the code reads as plain OpenSSL; a call
 * missing from the list fails the link (libdlock links no OpenSSL).
 */
#ifndef DLOCK_REDIS_OPENSSL_H
#define DLOCK_REDIS_OPENSSL_H

#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#define DLOCK__OPENSSL_FUNCS(X) \
    X(BIO_clear_flags) \
    X(BIO_get_data) \
    X(BIO_get_new_index) \
    X(BIO_meth_free) \
    X(BIO_meth_new) \
    X(BIO_meth_set_create) \
    X(BIO_meth_set_ctrl) \
    X(BIO_meth_set_read) \
    X(BIO_meth_set_write) \
    X(BIO_new) \
    X(BIO_set_data) \
    X(BIO_set_flags) \
    X(BIO_set_init) \
    X(ERR_clear_error) \
    X(ERR_error_string_n) \
    X(ERR_get_error) \
    X(ERR_peek_error) \
    X(ERR_reason_error_string) \
    X(SSL_CTX_check_private_key) \
    X(SSL_CTX_ctrl) \
    X(SSL_CTX_free) \
    X(SSL_CTX_load_verify_locations) \
    X(SSL_CTX_new) \
    X(SSL_CTX_set_default_verify_paths) \
    X(SSL_CTX_set_options) \
    X(SSL_CTX_set_verify) \
    X(SSL_CTX_use_PrivateKey_file) \
    X(SSL_CTX_use_certificate_chain_file) \
    X(SSL_connect) \
    X(SSL_ctrl) \
    X(SSL_free) \
    X(SSL_get0_param) \
    X(SSL_get_error) \
    X(SSL_get_verify_result) \
    X(SSL_new) \
    X(SSL_read) \
    X(SSL_set1_host) \
    X(SSL_set_bio) \
    X(SSL_write) \
    X(TLS_client_method) \
    X(X509_VERIFY_PARAM_set1_ip_asc) \
    X(X509_verify_cert_error_string)

struct dlock__openssl_api {
#define DLOCK__OPENSSL_FIELD(f) __typeof__(f) *f;
    DLOCK__OPENSSL_FUNCS(DLOCK__OPENSSL_FIELD)
#undef DLOCK__OPENSSL_FIELD
};

extern struct dlock__openssl_api dlock__openssl;

/* Load OpenSSL once (thread-safe). DLOCK_OK, or DLOCK_ENOTBUILT with a
 * message naming the library and the package to install. */
int dlock__openssl_load(void);

#ifndef DLOCK__OPENSSL_TABLE /* (openssl.c names the symbols themselves) */
#define BIO_clear_flags dlock__openssl.BIO_clear_flags
#define BIO_get_data dlock__openssl.BIO_get_data
#define BIO_get_new_index dlock__openssl.BIO_get_new_index
#define BIO_meth_free dlock__openssl.BIO_meth_free
#define BIO_meth_new dlock__openssl.BIO_meth_new
#define BIO_meth_set_create dlock__openssl.BIO_meth_set_create
#define BIO_meth_set_ctrl dlock__openssl.BIO_meth_set_ctrl
#define BIO_meth_set_read dlock__openssl.BIO_meth_set_read
#define BIO_meth_set_write dlock__openssl.BIO_meth_set_write
#define BIO_new dlock__openssl.BIO_new
#define BIO_set_data dlock__openssl.BIO_set_data
#define BIO_set_flags dlock__openssl.BIO_set_flags
#define BIO_set_init dlock__openssl.BIO_set_init
#define ERR_clear_error dlock__openssl.ERR_clear_error
#define ERR_error_string_n dlock__openssl.ERR_error_string_n
#define ERR_get_error dlock__openssl.ERR_get_error
#define ERR_peek_error dlock__openssl.ERR_peek_error
#define ERR_reason_error_string dlock__openssl.ERR_reason_error_string
#define SSL_CTX_check_private_key dlock__openssl.SSL_CTX_check_private_key
#define SSL_CTX_ctrl dlock__openssl.SSL_CTX_ctrl
#define SSL_CTX_free dlock__openssl.SSL_CTX_free
#define SSL_CTX_load_verify_locations dlock__openssl.SSL_CTX_load_verify_locations
#define SSL_CTX_new dlock__openssl.SSL_CTX_new
#define SSL_CTX_set_default_verify_paths dlock__openssl.SSL_CTX_set_default_verify_paths
#define SSL_CTX_set_options dlock__openssl.SSL_CTX_set_options
#define SSL_CTX_set_verify dlock__openssl.SSL_CTX_set_verify
#define SSL_CTX_use_PrivateKey_file dlock__openssl.SSL_CTX_use_PrivateKey_file
#define SSL_CTX_use_certificate_chain_file dlock__openssl.SSL_CTX_use_certificate_chain_file
#define SSL_connect dlock__openssl.SSL_connect
#define SSL_ctrl dlock__openssl.SSL_ctrl
#define SSL_free dlock__openssl.SSL_free
#define SSL_get0_param dlock__openssl.SSL_get0_param
#define SSL_get_error dlock__openssl.SSL_get_error
#define SSL_get_verify_result dlock__openssl.SSL_get_verify_result
#define SSL_new dlock__openssl.SSL_new
#define SSL_read dlock__openssl.SSL_read
#define SSL_set1_host dlock__openssl.SSL_set1_host
#define SSL_set_bio dlock__openssl.SSL_set_bio
#define SSL_write dlock__openssl.SSL_write
#define TLS_client_method dlock__openssl.TLS_client_method
#define X509_VERIFY_PARAM_set1_ip_asc dlock__openssl.X509_VERIFY_PARAM_set1_ip_asc
#define X509_verify_cert_error_string dlock__openssl.X509_verify_cert_error_string
#endif

#endif /* DLOCK_REDIS_OPENSSL_H */
