/* fixture_zk.h -- real ZooKeeper servers for the tests: one standalone
 * server or an ensemble of several on loopback ports, from Debian's
 * zookeeper package (a JVM running QuorumPeerMain with a zoo.cfg we write
 * into a temp directory). tickTime is short (250 ms) so sessions of a
 * second or two are allowed and expire quickly; sessions may last up to
 * ten minutes (a test that needs the keeper asleep for long asks so). Servers are children of
 * the calling process (tu_spawn: killed with it), so start them from an
 * unchecked fixture and every forked test shares them.
 *
 * Plain POSIX, no ZooKeeper client: the servers are probed with the
 * four-letter words ("ruok", "srvr") over TCP.
 */
#ifndef DLOCK_FIXTURE_ZK_H
#define DLOCK_FIXTURE_ZK_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#define ZKF_MAX 5

struct zkf_server {
    pid_t pid;         /* 0 when stopped */
    int id;            /* myid, from 1 */
    int port;          /* client port on 127.0.0.1 */
    int quorum_port, election_port;
    char *dir;         /* its data directory (keeps its config and log) */
    char *cfg, *log;
};

struct zkf {
    int n;             /* 1 = standalone */
    struct zkf_server s[ZKF_MAX];
    char *dir;         /* the temp directory of the whole fixture */
    char *hosts;       /* "127.0.0.1:p1,127.0.0.1:p2,..." */
    char error[512];   /* why a start failed */
};

/* Start N servers (1 = standalone) and wait until they serve (an
 * ensemble: a leader elected). False with f->error set on failure. */
bool zkf_start(struct zkf *f, int n);
/* Stop every server and remove the directory. */
void zkf_stop(struct zkf *f);

/* Stop server I with SIG (SIGKILL for a crash, SIGTERM for a clean stop)
 * and reap it. */
void zkf_server_stop(struct zkf *f, int i, int sig);
/* Start server I again on the same ports and data; wait until it serves
 * (up to TIMEOUT_MS). */
bool zkf_server_start(struct zkf *f, int i, int timeout_ms);

/* Index of the ensemble's leader (-1 none yet); standalone: 0. */
int zkf_leader(struct zkf *f);
/* Wait until every running server serves and one leads. */
bool zkf_wait_serving(struct zkf *f, int timeout_ms);

/* A four-letter word's reply from 127.0.0.1:PORT (caller frees); NULL
 * when nothing answers. */
char *zkf_4lw(int port, const char *word);

/* "zk://127.0.0.1:p1,...[/chroot]?lease=..": a URL for the fixture with
 * QUERY appended when not NULL (caller frees). */
char *zkf_url(const struct zkf *f, const char *path, const char *query);

#endif
