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

/* redis_info_number(), redis_info_script_calls(): read INFO as `dlock
 * bench` does */
#include "../../cli/redis_info.h"
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
    char *certs;                    /* the directory of those files (DIR, or a topology's) */
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
/* The same with the certificates already made in CERTS (the directory of
 * another server's: one CA for a whole topology). */
bool fx_redis_start_tls_with(struct fx_redis *r, const char *certs, const char *const *extra);
/* SIGKILL the server (a crash); fx_redis_restart() brings it back empty
 * on the same port. */
void fx_redis_kill(struct fx_redis *r);
bool fx_redis_restart(struct fx_redis *r);
/* Stop the server and remove its directory. */
void fx_redis_stop(struct fx_redis *r);

/* Redis behind Sentinel: a master, replicas of it and sentinels
 * monitoring it as FX_SENTINEL_MASTER (quorum 2, down after 1 s), all on
 * loopback; started in that order, each waited for (the replicas online,
 * every sentinel seeing the replicas and the other sentinels), so a
 * failover can run as soon as it starts. */
#define FX_SENTINEL_MASTER "dlockm"
#define FX_SENTINEL_MAX 5

struct fx_sentinels {
    struct fx_redis master, replicas[FX_SENTINEL_MAX];
    size_t nreplicas, nsentinels;
    pid_t sentinel_pid[FX_SENTINEL_MAX];
    int sentinel_port[FX_SENTINEL_MAX];
    char *dir;
    char url[512]; /* "redis+sentinel://127.0.0.1:P1,.../dlockm" */
    const char *sentinel_password; /* set before start: the sentinels' requirepass */
    /* set before start: everything also speaks TLS (one CA, in DIR), the
     * sentinels monitor the TLS ports and URL is "rediss+sentinel://
     * <the sentinels' TLS ports>/dlockm?tls_ca=CA"; the plain ports stay
     * for the fixture's own looks */
    bool tls;
    int sentinel_tls_port[FX_SENTINEL_MAX];
};

bool fx_sentinels_start(struct fx_sentinels *t, size_t nreplicas, size_t nsentinels);
/* The same, replica I replicating from the port VIA(master port, I, ARG)
 * returns (a proxy in front of the master, to hold replication back). */
bool fx_sentinels_start_via(struct fx_sentinels *t, size_t nreplicas, size_t nsentinels,
                            int (*via)(int master_port, size_t i, void *arg), void *arg);
void fx_sentinels_stop(struct fx_sentinels *t);
/* The port of the instance the sentinels name as master now (0: none). */
int fx_sentinels_master_port(const struct fx_sentinels *t);
/* The server of T listening on PORT, plain or TLS (the master or a
 * replica). */
struct fx_redis *fx_sentinels_server(struct fx_sentinels *t, int port);
/* SENTINEL FAILOVER, then wait until every sentinel names a new master
 * that says ROLE master and the old one no longer does; the new master's
 * port, 0 on failure. */
int fx_sentinels_failover(struct fx_sentinels *t);

/* Redis Cluster: NMASTERS masters with REPLICAS replicas each, made with
 * `redis-cli --cluster create` on loopback (node timeout 1 s, so a killed
 * master is replaced within seconds), waited for until every node says
 * cluster_state:ok and names the same master for every slot. */
#define FX_CLUSTER_MAX 9

struct fx_cluster {
    struct fx_redis node[FX_CLUSTER_MAX]; /* the masters first, then the replicas */
    size_t n;
    char bus_port[FX_CLUSTER_MAX][16]; /* --cluster-port: a free port, not port + 10000 */
    const char *extra[FX_CLUSTER_MAX][14];
    char url[1024]; /* "redis+cluster://127.0.0.1:P1,127.0.0.1:P2,..." (every node) */
    /* set before start: every node also serves TLS (one CA, in CERTS),
     * on the cluster bus and between master and replica too (tls-cluster,
     * tls-replication), the cluster is made over the TLS ports and URL is
     * "rediss+cluster://<the TLS ports>?tls_ca=CA". The plain ports stay
     * for the fixture's own looks: a node names its plain ports to a
     * plain client (CLUSTER SLOTS, MOVED), its TLS ports to a TLS one. */
    bool tls;
    char *certs;
};

bool fx_cluster_start(struct fx_cluster *t, size_t nmasters, size_t replicas);
void fx_cluster_stop(struct fx_cluster *t);
/* Wait until every running node says cluster_state:ok and they agree on
 * the master of every slot (false after 30 s). */
bool fx_cluster_wait_ok(struct fx_cluster *t);
/* The slot of KEY and the port of the master serving SLOT now, as a
 * running node says (0: none). */
unsigned fx_cluster_keyslot(struct fx_cluster *t, const char *key);
int fx_cluster_master_of(struct fx_cluster *t, unsigned slot);
/* The port of a running replica of the master at PORT (0: none). */
int fx_cluster_replica_of(struct fx_cluster *t, int port);
/* The server of T listening on PORT. */
struct fx_redis *fx_cluster_server(struct fx_cluster *t, int port);
/* CLUSTER FAILOVER on REPLICA, then wait until the cluster is ok with it
 * serving its old master's slots: true when it does. */
bool fx_cluster_failover(struct fx_cluster *t, int replica);
/* A raw command to the node on PORT (NULL when it does not answer). */
#ifdef DLOCK_HAVE_REDIS
redisReply *fx_cluster_raw(int port, const char *fmt, ...);
/* A raw command to the server or sentinel on 127.0.0.1:PORT, after AUTH
 * PASSWORD when not NULL, 1 s to connect and to answer (it may be
 * frozen): the reply (caller frees), NULL when it does not answer. */
redisReply *fx_redis_raw_at(int port, const char *password, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
#endif

#ifdef DLOCK_HAVE_REDIS
/* A raw connection to the server (AUTH with PASSWORD when not NULL);
 * NULL when it cannot connect. Free with redisFree(). */
redisContext *fx_redis_raw(const struct fx_redis *r, const char *password);
/* Subscribers of the release channel of lock NAME
 * ("redisson_lock__channel:{NAME}") on the server at PORT (plain) --
 * sharded ones (SSUBSCRIBE, a cluster's) when SHARDED -- or -1 when it
 * does not answer. fx_redis_wait_lock_subscribers() waits, 20 s at the
 * most, until there are WANT, and returns the count it saw last. */
long long fx_redis_lock_subscribers(int port, const char *name, bool sharded);
long long fx_redis_wait_lock_subscribers(int port, const char *name, bool sharded,
                                         long long want);
#endif

#endif
