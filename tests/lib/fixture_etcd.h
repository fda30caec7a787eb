/* fixture_etcd.h -- real etcd servers for the tests: a single member or a
 * cluster of several on loopback ports, from Debian's etcd-server package,
 * each in its own data directory under one temp directory. Heartbeat and
 * election timeouts are short (50 ms / 500 ms) so leases of one or two
 * seconds are allowed and a killed leader is replaced quickly. Members are
 * children of the calling process (tu_spawn: killed with it), so start
 * them from an unchecked fixture and every forked test shares them.
 *
 * No etcd client library: readiness and leadership are asked of the
 * servers through `etcdctl` (also from Debian), which the tests use anyway
 * to play the other client's part.
 */
#ifndef DLOCK_FIXTURE_ETCD_H
#define DLOCK_FIXTURE_ETCD_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#define ETCDF_MAX 5

struct etcdf_member {
    pid_t pid;        /* 0 when stopped */
    char name[8];     /* "n0", "n1", ... */
    int client_port;  /* on 127.0.0.1 */
    int peer_port;
    char *dir;        /* its data directory */
    char *log;        /* its output */
};

struct etcdf {
    int n;
    struct etcdf_member m[ETCDF_MAX];
    char *dir;        /* the temp directory of the whole fixture */
    char *endpoints;  /* "127.0.0.1:p1,127.0.0.1:p2,..." */
    char error[512];  /* why a start failed */
    const char *extra[8]; /* more etcd flags for every member (NULL-ended) */
    char *cert_dir;   /* etcdf_start_tls(): ca.pem, server*.pem, client*.pem */
};

/* Start N members (1 = single member) and wait until the cluster has a
 * leader and every member answers. False with f->error set on failure. */
bool etcdf_start(struct etcdf *f, int n);
/* The same, with EXTRA (NULL-terminated, may be NULL) added to every
 * member's command line, e.g. {"--auth-token-ttl", "1", NULL}. */
bool etcdf_start_args(struct etcdf *f, int n, const char *const *extra);
/* One member serving TLS only, with client certificates required: makes a
 * CA, a server certificate for 127.0.0.1 and a client certificate with
 * openssl into f->cert_dir. */
bool etcdf_start_tls(struct etcdf *f);
/* Stop every member and remove the directory. */
void etcdf_stop(struct etcdf *f);

/* Stop member I with SIG (SIGKILL = crash, SIGTERM = clean) and reap it. */
void etcdf_member_stop(struct etcdf *f, int i, int sig);
/* Start member I again on its ports and data; wait until it is healthy
 * (up to TIMEOUT_MS). */
bool etcdf_member_start(struct etcdf *f, int i, int timeout_ms);

/* Start every member whose client port does not answer (stopped, or a
 * child of a test process that ended), all before waiting: a member of a
 * cluster alone never becomes healthy. Then wait until all are. */
bool etcdf_revive(struct etcdf *f, int timeout_ms);

/* Index of the leader as the members see it (-1 when none answers). */
int etcdf_leader(struct etcdf *f);
/* Wait until every running member is healthy (has a leader). */
bool etcdf_wait_healthy(struct etcdf *f, int timeout_ms);

/* Run etcdctl against every member's endpoint with the arguments given
 * (NULL-terminated), capturing stdout/stderr (may be NULL; caller frees).
 * Returns the exit status. */
int etcdf_ctl(const struct etcdf *f, char **out, char **err, ...);

/* The sum of etcd's grpc_server_handled_total for METHOD ("Txn",
 * "Range"; "" for every unary method: the streams Watch and
 * LeaseKeepAlive are counted only when they end) on the member at
 * 127.0.0.1:PORT, from its /metrics: how many requests it answered;
 * -1 when the metrics cannot be read. */
long long etcdf_handled(int port, const char *method);

/* The value of the gauge or counter NAME ("etcd_debugging_mvcc_watch_stream_total"),
 * summed over its labels, on the member at 127.0.0.1:PORT, from its
 * /metrics; -1 when the metrics cannot be read. */
long long etcdf_metric(int port, const char *name);

/* "etcd://127.0.0.1:p1,...[PATH][?QUERY]" (caller frees). */
char *etcdf_url(const struct etcdf *f, const char *path, const char *query);

#endif
