/* contract.h -- one backend behind one interface, so the lock contract is
 * written once (tests/check_contract.c) and run against every backend and
 * URL form: the file backend in a temp directory, a redis-server in both
 * wire layouts, an etcd member, a ZooKeeper server.
 *
 * A fixture starts its server once, in the process that runs the suite
 * (Check's unchecked fixture, before the tests fork), hands out URLs with
 * any query appended, and says what the backend documents differently
 * (capability bits) so a contract case asserts the documented difference
 * instead of skipping. It also answers "does the backend see a waiter on
 * this name", the condition a test waits for before it releases or
 * cancels, so no test has to guess with a fixed sleep.
 */
#ifndef DLOCK_CONTRACT_H
#define DLOCK_CONTRACT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "dlock.h"

/* What a backend does that others do not (docs/backends.md). */
enum ct_caps {
    CT_LEASES = 1u << 0,      /* holds have leases: finite validity, a dead or
                                 paused holder loses its hold */
    CT_SHARED = 1u << 1,      /* DLOCK_SHARED works (else DLOCK_ENOTSUP) */
    CT_FORCE_LIVE = 1u << 2,  /* force-release takes a lock from a live holder
                                 (file: DLOCK_ENOTSUP, the kernel holds it) */
    CT_FIXED_LEASE = 1u << 3, /* DLOCK_LEASE_FIXED honoured; with CT_LEASES and
                                 without this bit the acquire is DLOCK_ENOTSUP */
    CT_SERVER = 1u << 4,      /* a server on host:port (file: a local directory) */
    CT_WAITERS_EXACT = 1u << 5, /* waiters() falls back to 0 once a waiter leaves
                                   (file: a watch lingers in the client's pool) */
    CT_FAIR = 1u << 6,        /* DLOCK_LOCK_FAIR: first come, first served
                                 (else DLOCK_ENOTSUP from dlock_lock_new) */
    CT_NAMES_NEST = 1u << 7,  /* a lock sees the holder of a name nested under
                                 it ("a" under "a/b") as a contender, as Go's
                                 concurrency.Mutex does (no backend today: etcd
                                 takes only keys NAME/<hex> as contenders) */
    CT_READERS_BOUNDED = 1u << 8, /* a reader waiting behind a stream of writers
                                     gets in once the writers queued before it
                                     had their turn (etcd, zk: one queue in
                                     arrival order); without it a waiting writer
                                     keeps new readers out, and with one always
                                     waiting a reader waits as long as the
                                     stream lasts (file, redis, Redlock) */
    CT_NO_VALUE = 1u << 9, /* keeps no lock value: dlock_value_set() and
                              dlock_value_get() answer DLOCK_ENOTSUP naming
                              the backend (every other fixture must keep one) */
    CT_LOCK_DELAY = 1u << 10,  /* ?lock_delay= kept: a hold ended without a
                                 clean release keeps the name from every
                                 acquirer for the delay (else DLOCK_ENOTSUP
                                 at connect, naming the option) */
    CT_NO_GUARDED = 1u << 11, /* keeps no guarded keys: dlock_guarded_put(),
                                 _delete() and _get() answer DLOCK_ENOTSUP
                                 naming the backend (every other fixture must
                                 keep them) */
};

struct ct_fixture {
    const char *name;   /* the test case's name: "file", "redis", "redis-simple"... */
    const char *scheme; /* URL scheme, for malformed URLs of this backend */
    unsigned caps;      /* enum ct_caps */
    bool started;
    char error[512];    /* why start() failed */
    void *priv;

    bool (*start)(struct ct_fixture *f);
    void (*stop)(struct ct_fixture *f);
    /* The backend's URL with QUERY ("k=v&k2=v2", may be NULL) appended
     * to the fixture's own options. Caller frees. */
    char *(*url)(const struct ct_fixture *f, const char *query);
    /* A URL of this backend that nobody answers: PORT on 127.0.0.1, which
     * nothing listens on (file: a directory that does not exist, the one
     * case where "unreachable" has no port). Caller frees. */
    char *(*unreachable_url)(const struct ct_fixture *f, int port);
    /* How many waiters the backend sees on NAME, asked through client C
     * (opened with ?prefix=PREFIX, which NAME does not include); -1 when
     * it cannot tell. File: inotify watches of this process on the lock
     * file, which outlive a wait in the client's pool, so only a rise
     * from 0 means "a waiter is asleep". */
    long (*waiters)(const struct ct_fixture *f, dlock_client *c, const char *prefix,
                    const char *name);
    /* Make the fixture's servers serve no write (etcd, ZooKeeper: every
     * server process stopped, SIGSTOP waited for; Redis: CLIENT PAUSE
     * WRITE, see contract.c) or, with !STOP, serve again. A request that
     * timed out meanwhile is never served. NULL for the file backend (no
     * server). */
    void (*pause)(const struct ct_fixture *f, bool stop);
};

/* Every fixture, in the order the suite runs them; NULL-terminated. */
extern struct ct_fixture *const ct_fixtures[];

/* ------------------------------------------- suites run over the fixtures */

/* The fixture of the running test case (set in the runner as the case
 * starts, inherited by every forked test) and the running test's key
 * prefix ("<tag><pid>-<serial>-", fresh for each test), so tests never
 * see each other's names. */
extern struct ct_fixture *CT;
extern char ct_prefix[64];

/* main() of a suite run over the fixtures: for each fixture, a test case
 * named after it holding the tests TU_TEST registered (tests/lib/
 * testutil.h) for which RUNS(fixture, test name) is true (RUNS NULL:
 * every test), that DLOCK_TEST lets through; the fixture's server started
 * once around the case (a start that fails fails each test, naming why)
 * and a fresh prefix beginning with TAG around each test; a fixture
 * $DLOCK_SKIP_FIXTURES names (tu_fixture_skipped) has no case in this
 * run. Returns what tu_run_suite() does. */
int ct_main(const char *suite, const char *tag,
            bool (*runs)(const struct ct_fixture *f, const char *test));

/* The running fixture's URL with this test's prefix and EXTRA options
 * ("k=v&k2=v2", may be NULL); caller frees. ct_open_test(): a client of
 * it, asserting that it opened. */
char *ct_test_url(const char *extra);
struct dlock_client *ct_open_test(const char *extra);

/* The paused and killed holders of the contract suites: a forked child
 * that holds, then tells the test through marker files in DIR.
 * ct_holder_held(): in the child, DIR/held gets TOKEN; with KILL_ONLY
 * the child then waits to be killed, else until DIR/go exists.
 * ct_holder_done(): in the child, DIR/done gets "RC RC2 FIRED ZERO" (its
 * two releases' codes, the lost callbacks it saw, 1 when both validities
 * were 0).
 *
 * In the test, struct ct_holder is the frame: ct_holder_open() makes the
 * test's URL with options OPTS and a fresh directory (TAG) for the
 * markers; the test forks its holder into PID; ct_holder_wait() waits
 * until it holds and returns its token; ct_holder_resume() lets the
 * stopped holder go on (DIR/go, SIGCONT) and reads DIR/done into *RC,
 * *RC2, *FIRED, *ZERO; ct_holder_kill() kills it (SIGKILL, a crash) and
 * reaps it; ct_holder_close() removes the directory and frees the URL. */
void ct_holder_held(const char *dir, uint64_t token, bool kill_only);
void ct_holder_done(const char *dir, int rc, int rc2, int fired, int zero);
struct ct_holder {
    char *url, *dir;
    pid_t pid;
};
struct ct_holder ct_holder_open(const char *opts, const char *tag);
uint64_t ct_holder_wait(const struct ct_holder *h);
void ct_holder_resume(const struct ct_holder *h, int *rc, int *rc2, int *fired, int *zero);
void ct_holder_kill(const struct ct_holder *h);
void ct_holder_close(struct ct_holder *h);

/* Assert that CALL returns WANT; the message names the call, the code
 * and dlock_errmsg(). */
#define EXPECT_RC(call, want)                                                                \
    do {                                                                                     \
        int rc_ = (call);                                                                    \
        ck_assert_msg(rc_ == (want), "%s: %s (%s), expected %s", #call, dlock_err_name(rc_), \
                      dlock_errmsg(), dlock_err_name(want));                                 \
    } while (0)

#endif
