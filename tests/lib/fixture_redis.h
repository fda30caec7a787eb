/* fixture_redis.h -- a real redis-server for the tests and the benchmark.
 *
 * Each test starts its own server on a free loopback port in a fresh
 * temporary directory (no persistence), talks to it through dlock and,
 * to play other clients' parts (Redisson, redis-py), through a raw hiredis
 * connection; it can kill and restart the server on the same port to test
 * faults. The server dies with the test process (PR_SET_PDEATHSIG).
 */
#ifndef DLOCK_FIXTURE_REDIS_H
#define DLOCK_FIXTURE_REDIS_H

#include <stdbool.h>
#include <sys/types.h>

#ifdef DLOCK_HAVE_REDIS
#include <hiredis/hiredis.h>
#endif

#define FX_REDIS_MAX_ARGS 16

struct fx_redis {
    pid_t pid;          /* 0 when not running */
    int port;
    char *dir;          /* temp dir: log, unix socket */
    char *log;
    char *sock;         /* unix socket path (always enabled) */
    char url[256];      /* "redis://127.0.0.1:PORT" */
    const char *extra[FX_REDIS_MAX_ARGS]; /* extra server arguments */
    /* TLS (fx_redis_start_tls): a second port, certificates made with
     * openssl(1) in DIR at start; 0 / NULL without. */
    int tls_port;
    char *ca, *other_ca;            /* the CA that signed the server's and client's
                                       certificates; one that signed nothing here */
    char *client_cert, *client_key; /* signed by CA */
    char tls_url[512];              /* "rediss://127.0.0.1:TLS_PORT?tls_ca=CA" */
};

/* Start redis-server with EXTRA arguments (NULL-terminated, may be NULL;
 * the strings must outlive R), wait until it answers. false (with the
 * server log on stderr) when it cannot start: the caller must fail. */
bool fx_redis_start(struct fx_redis *r, const char *const *extra);
/* The same, serving TLS on TLS_PORT beside the plain PORT (raw helpers
 * keep using the plain one): a CA, a server certificate for localhost and
 * 127.0.0.1 and a client certificate are made with openssl(1) first.
 * Client certificates are optional unless EXTRA says
 * "--tls-auth-clients", "yes". */
bool fx_redis_start_tls(struct fx_redis *r, const char *const *extra);
/* SIGKILL the server (a crash); fx_redis_restart() brings it back empty
 * on the same port. */
void fx_redis_kill(struct fx_redis *r);
bool fx_redis_restart(struct fx_redis *r);
/* Stop the server and remove its directory. */
void fx_redis_stop(struct fx_redis *r);

#ifdef DLOCK_HAVE_REDIS
/* A raw connection to the server (AUTH with PASSWORD when not NULL);
 * NULL when it cannot connect. Free with redisFree(). */
redisContext *fx_redis_raw(const struct fx_redis *r, const char *password);
#endif

#endif
