/* tls.c -- TLS for the Redis backend's connections (rediss://), through
 * OpenSSL, loaded when the first rediss:// client opens (openssl.h).
 *
 * One SSL_CTX per client: the server is verified against tls_ca (a file
 * or a directory of hashed certificates) or the system store, and its
 * certificate must name the host of the URL (SSL_set1_host; an IP
 * address is matched against the certificate's IP entries); SNI carries
 * the host name. tls_cert/tls_key give a client certificate. The
 * handshake runs inside the connect bound (net.c), non-blocking, polled
 * like every other wait. OpenSSL's own socket BIO writes with write(2),
 * which raises SIGPIPE on a closed connection; the BIO here uses
 * send(MSG_NOSIGNAL) and recv(2) on our non-blocking socket instead.
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <arpa/inet.h>
#include "openssl.h"
#include "redis.h"

/* ================================================================ the BIO */

static BIO_METHOD *bio_method;
static pthread_once_t bio_once = PTHREAD_ONCE_INIT;

static int bio_fd(BIO *b)
{
    return (int)(intptr_t)BIO_get_data(b);
}

static int bio_write(BIO *b, const char *buf, int len)
{
    BIO_clear_retry_flags(b);
    ssize_t n;
    do
        n = send(bio_fd(b), buf, (size_t)len, MSG_NOSIGNAL);
    while (n < 0 && errno == EINTR);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
        BIO_set_retry_write(b);
    return (int)n;
}

static int bio_read(BIO *b, char *buf, int len)
{
    BIO_clear_retry_flags(b);
    ssize_t n;
    do
        n = recv(bio_fd(b), buf, (size_t)len, 0);
    while (n < 0 && errno == EINTR);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
        BIO_set_retry_read(b);
    return (int)n;
}

static long bio_ctrl(BIO *b, int cmd, long num, void *ptr)
{
    (void)b;
    (void)num;
    (void)ptr;
    return cmd == BIO_CTRL_FLUSH ? 1 : 0;
}

static int bio_create(BIO *b)
{
    BIO_set_init(b, 1);
    return 1;
}

static void bio_method_make(void)
{
    BIO_METHOD *m = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK, "dlock socket");
    if (m && BIO_meth_set_write(m, bio_write) && BIO_meth_set_read(m, bio_read) &&
        BIO_meth_set_ctrl(m, bio_ctrl) && BIO_meth_set_create(m, bio_create))
        bio_method = m;
    else if (m)
        BIO_meth_free(m);
}

/* ============================================================ the context */

/* The first error OpenSSL queued, as text (the queue is then cleared). */
static const char *ssl_error_text(char *buf, size_t len)
{
    unsigned long e = ERR_get_error();
    ERR_clear_error();
    if (!e)
        return "unknown TLS error";
    const char *reason = ERR_reason_error_string(e);
    if (reason)
        snprintf(buf, len, "%s", reason);
    else
        ERR_error_string_n(e, buf, len);
    return buf;
}

int dlock__redis_tls_context(struct redis_state *s, const char *ca, const char *cert,
                             const char *key)
{
    char why[256];
    if ((cert == NULL) != (key == NULL))
        return dlock__err(DLOCK_EBADURL, "bad URL '%s': tls_cert and tls_key go together",
                          s->c->url.redacted);
    int rc = dlock__openssl_load();
    if (rc)
        return rc;
    pthread_once(&bio_once, bio_method_make);
    if (!bio_method)
        return dlock__err(DLOCK_ENOMEM, "%s: TLS: cannot make the socket BIO", s->where);
    SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
    if (!ctx)
        return dlock__err(DLOCK_ENOMEM, "%s: TLS: %s", s->where, ssl_error_text(why, sizeof why));
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
    SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
    /* servers close without close_notify: that is an end, not an attack
     * on a lock reply (every reply is self-delimiting RESP) */
    SSL_CTX_set_options(ctx, SSL_OP_IGNORE_UNEXPECTED_EOF);
    struct stat st;
    if (ca) {
        bool dir = stat(ca, &st) == 0 && S_ISDIR(st.st_mode);
        if (SSL_CTX_load_verify_locations(ctx, dir ? NULL : ca, dir ? ca : NULL) != 1)
            rc = dlock__err(DLOCK_EINVAL, "%s: TLS: cannot load tls_ca '%s': %s", s->where, ca,
                            ssl_error_text(why, sizeof why));
    } else if (SSL_CTX_set_default_verify_paths(ctx) != 1) {
        rc = dlock__err(DLOCK_EINVAL, "%s: TLS: cannot load the system's CA store: %s", s->where,
                        ssl_error_text(why, sizeof why));
    }
    if (!rc && cert && SSL_CTX_use_certificate_chain_file(ctx, cert) != 1)
        rc = dlock__err(DLOCK_EINVAL, "%s: TLS: cannot load tls_cert '%s': %s", s->where, cert,
                        ssl_error_text(why, sizeof why));
    if (!rc && key && SSL_CTX_use_PrivateKey_file(ctx, key, SSL_FILETYPE_PEM) != 1)
        rc = dlock__err(DLOCK_EINVAL, "%s: TLS: cannot load tls_key '%s': %s", s->where, key,
                        ssl_error_text(why, sizeof why));
    if (!rc && key && SSL_CTX_check_private_key(ctx) != 1)
        rc = dlock__err(DLOCK_EINVAL, "%s: TLS: tls_key '%s' does not match tls_cert '%s'",
                        s->where, key, cert);
    if (rc) {
        SSL_CTX_free(ctx);
        return rc;
    }
    s->tls = ctx;
    return DLOCK_OK;
}

void dlock__redis_tls_context_free(struct ssl_ctx_st *ctx)
{
    if (ctx) /* (without one, OpenSSL may not be loaded) */
        SSL_CTX_free(ctx);
}

/* ========================================================== a connection */

int dlock__redis_tls_start(struct rconn *k, struct ssl_ctx_st *ctx, const char *host)
{
    SSL *ssl = SSL_new(ctx);
    BIO *bio = ssl ? BIO_new(bio_method) : NULL;
    if (!ssl || !bio) {
        SSL_free(ssl);
        return dlock__err(DLOCK_ENOMEM, "%s: TLS: out of memory", k->where);
    }
    BIO_set_data(bio, (void *)(intptr_t)k->fd);
    SSL_set_bio(ssl, bio, bio);
    k->tls = ssl;
    unsigned char ip[16];
    bool is_ip = inet_pton(AF_INET, host, ip) == 1 || inet_pton(AF_INET6, host, ip) == 1;
    if (is_ip) {
        X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), host);
    } else {
        SSL_set_tlsext_host_name(ssl, host);
        SSL_set1_host(ssl, host);
    }
    return DLOCK_OK;
}

int dlock__redis_tls_step(struct rconn *k, short *events)
{
    char why[256];
    SSL *ssl = k->tls;
    *events = 0;
    ERR_clear_error();
    errno = 0;
    int r = SSL_connect(ssl);
    if (r == 1)
        return DLOCK_OK;
    int e = SSL_get_error(ssl, r);
    if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) {
        *events = e == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT;
        return DLOCK_OK;
    }
    long verify = SSL_get_verify_result(ssl);
    if (verify != X509_V_OK) {
        ERR_clear_error();
        return dlock__err(DLOCK_ECONN, "%s: TLS: the server's certificate was refused: %s",
                          k->where, X509_verify_cert_error_string(verify));
    }
    unsigned long first = ERR_peek_error();
    if (!first)
        return dlock__err(DLOCK_ECONN, "%s: TLS handshake: the server closed the connection%s",
                          k->where,
                          errno ? "" : " (is it a plain, non-TLS port? then use redis://)");
    return dlock__err(DLOCK_ECONN, "%s: TLS handshake failed: %s (is it a TLS port?)", k->where,
                      ssl_error_text(why, sizeof why));
}

ssize_t dlock__redis_tls_io(struct rconn *k, char *buf, size_t len, bool write)
{
    SSL *ssl = k->tls;
    ERR_clear_error();
    int n = write ? SSL_write(ssl, buf, (int)len) : SSL_read(ssl, buf, (int)len);
    if (n > 0) {
        k->tls_want_write = false;
        if (write)
            k->tls_write_wants_read = false;
        return n;
    }
    int e = SSL_get_error(ssl, n);
    k->tls_want_write = e == SSL_ERROR_WANT_WRITE;
    /* A write that must first read (a renegotiation, a key update): the
     * socket's being writable says nothing, so the poll waits for input
     * (dlock__redis_conn_events) instead of spinning on POLLOUT. */
    if (write)
        k->tls_write_wants_read = e == SSL_ERROR_WANT_READ;
    if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) {
        errno = EAGAIN;
        return -1;
    }
    if (e == SSL_ERROR_ZERO_RETURN || (e == SSL_ERROR_SYSCALL && errno == 0))
        return 0; /* closed */
    if (e == SSL_ERROR_SYSCALL)
        return -1; /* errno says why */
    char why[256];
    dlock__redis_conn_fail(k, "TLS: %s", ssl_error_text(why, sizeof why));
    errno = EPROTO;
    return -1;
}

void dlock__redis_tls_free(struct rconn *k)
{
    SSL_free(k->tls); /* frees the BIO; the socket is ours */
    k->tls = NULL;
}
