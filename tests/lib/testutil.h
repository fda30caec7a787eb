/* testutil.h -- what every test binary needs around Check: temporary
 * directories, free loopback ports, starting real server processes and
 * stopping them, running the dlock CLI and reading its exit status.
 *
 * Servers are started as children with PR_SET_PDEATHSIG, in their own
 * process group, so a crashed or timed-out test never leaves one behind.
 */
#ifndef DLOCK_TESTUTIL_H
#define DLOCK_TESTUTIL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* A fresh directory under $TMPDIR or /tmp (caller frees the string).
 * tu_rmrf() removes a tree. */
char *tu_tmpdir(const char *tag);
void tu_rmrf(const char *path);

/* The per-test fixture of the suites on the file backend: a fresh
 * temporary directory in *DIR and its "file://" URL in *URL;
 * tu_file_fixture_end() removes the directory and frees both. */
void tu_file_fixture(const char *tag, char **dir, char **url);
void tu_file_fixture_end(char **dir, char **url);

/* A TCP port on 127.0.0.1 that nothing listens on right now. */
int tu_free_port(void);
/* A socket listening on a free port of 127.0.0.1 (*PORT) with BACKLOG,
 * never accepting unless the caller does: a silent server, a proxy's
 * front, or (BACKLOG 0, its queue filled) a port that drops SYNs. */
int tu_listen_loopback(int *port, int backlog);
/* A connection to 127.0.0.1:PORT (close-on-exec), -1 when refused. */
int tu_dial_loopback(int port);
/* Send all LEN bytes of BUF on FD (no SIGPIPE); false when it breaks. */
bool tu_send_all(int fd, const char *buf, size_t len);
/* A name server that never answers, for this process (and the children
 * it starts after) only: private mount and network namespaces (a user
 * namespace too when not root), loopback up, /etc/resolv.conf naming a
 * UDP socket on 127.0.0.1:53 that never replies, the resolver's own
 * timeout 30 s. Servers started before it are out of reach. Returns the
 * socket. */
int tu_silent_name_server(void);
/* The address the fixtures' servers listen on: $DLOCK_TEST_LISTEN, else
 * 127.0.0.1. The fault harness (tests/chaos/) sets 0.0.0.0 inside a
 * network namespace of its own, so that workers in other namespaces reach
 * the servers over veth pairs; probes and URLs keep 127.0.0.1. */
const char *tu_listen_addr(void);
/* Wait until something accepts on 127.0.0.1:PORT; false after TIMEOUT_MS. */
bool tu_wait_port(int port, int timeout_ms);

/* Start ARGV (argv[0] looked up in PATH) in the background, stdout and
 * stderr appended to LOG (NULL = /dev/null), killed if we die. */
pid_t tu_spawn(const char *const argv[], const char *log);
/* The same, with AS_NOBODY run as nobody (TU_NOBODY, HOME=/tmp) when we
 * are root: servers that refuse to run as root (PostgreSQL). */
#define TU_NOBODY 65534
pid_t tu_spawn_as_nobody(const char *const argv[], const char *log, bool as_nobody);
/* SIGTERM, then SIGKILL after GRACE_MS; reaps. Returns the wait status. */
int tu_stop(pid_t pid, int grace_ms);
/* Stop a server tu_spawn() started with signal SIG: SIGKILL kills its
 * process group at once (a crash), any other signal is tu_stop(). */
void tu_stop_with(pid_t pid, int sig, int grace_ms);
/* Run PATH with ARGV and environment ENVP (NULL: ours) as a plain
 * fork() and execve() would, its stdout into a pipe and nothing else
 * changed (for seeing what an exec'd child inherits); asserts that it
 * exits 0 and returns what it wrote (caller frees). */
char *tu_exec_output(const char *path, char *const argv[], char *const envp[]);
/* Everything FD gives until end of file, as a string (caller frees). */
char *tu_read_fd(int fd);

/* Run ARGV to completion with extra environment ENV ("K=V" strings,
 * NULL-terminated, may be NULL) and optional STDIN_TEXT. Captures stdout
 * and stderr into *OUT / *ERR when not NULL (caller frees). Returns the
 * exit status, or 128+N when killed by signal N. */
int tu_run(const char *const argv[], const char *const env[], char **out, char **err);

/* Path of the dlock CLI under test ($DLOCK_BIN, else build/dlock). */
const char *tu_dlock_bin(void);
/* tu_run() of the dlock CLI with ARGS (NULL-terminated, at most 30) and
 * extra environment ENV (may be NULL). TU_DLOCK(out, err, env, "run", ...)
 * writes the argument list in place. */
int tu_dlock(char **out, char **err, const char *const env[], const char *const args[]);
#define TU_DLOCK(out, err, env, ...) tu_dlock(out, err, env, (const char *const[]){__VA_ARGS__, NULL})

/* Write TEXT to PATH (created or truncated), plainly. */
void tu_write_file(const char *path, const char *text);
/* Read a whole file (caller frees); NULL if missing. */
char *tu_read_file(const char *path);
/* The number a marker file at PATH holds, asserting that it exists. */
uint64_t tu_read_u64(const char *path);
/* printf into a fresh string. */
char *tu_fmt(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Sleep MS milliseconds (for letting a child reach a state; never for
 * asserting on time). */
void tu_sleep_ms(int ms);
/* SIGSTOP PID and return once every thread of it is stopped (a signal
 * sent is not yet a process stopped: a request sent right after kill()
 * could still be served). */
void tu_pause(pid_t pid);
/* Wait until PATH exists (a child's "I hold it now" marker); false after
 * TIMEOUT_MS. */
bool tu_wait_file(const char *path, int timeout_ms);
/* Write TEXT to PATH through a temporary file and a rename, so that a
 * process waiting for PATH never reads it half written. */
void tu_write_marker(const char *path, const char *text);
/* fork(), asserting that it worked. */
pid_t tu_fork(void);
/* Reap PID: its exit status, or 128+N when killed by signal N. */
int tu_wait_exit(pid_t pid);
/* N processes at once, child I running CHILD(I, ARG) and exiting with
 * what it returns (0: it passed); returns once every one has ended,
 * asserting that each exited 0. */
void tu_fork_all(int n, int (*child)(int i, void *arg), void *arg);
/* One child running CHILD(ARG) under a 30 s alarm (SIGALRM's default
 * action, not Check's timeout handler, which kills the whole group) and
 * exiting with what it returns; asserts that it exited 0, saying "hung"
 * when the alarm ended it. For a child doing what must never block. */
void tu_fork_bounded(int (*child)(void *arg), void *arg);
/* SIZE zeroed bytes shared with the children the test forks (counters
 * they raise and lower); tu_shared_free(P, SIZE) unmaps them. */
void *tu_shared_new(size_t size);
void tu_shared_free(void *p, size_t size);
/* Who is inside a hold, counted by the holders themselves (threads, or
 * processes when it lives in tu_shared_new memory): tu_inside_enter()
 * on entering, after the acquire, returns how many are inside now,
 * itself included, and raises MAX; tu_inside_leave() before the release
 * counts a round. */
struct tu_inside {
    atomic_int now, max, rounds;
};
int tu_inside_enter(struct tu_inside *in);
void tu_inside_leave(struct tu_inside *in);
/* Wait until the thread whose gettid() is *TID (0 until the thread sets
 * it) sleeps in the kernel -- futex (a condition variable or a mutex),
 * poll or ppoll -- on three reads in a row 5 ms apart; false after
 * TIMEOUT_MS. How a test knows a thread is inside a blocking call before
 * it cancels or releases, instead of sleeping a fixed time. */
bool tu_wait_thread_asleep(const atomic_long *tid, int timeout_ms);
/* FN(ARG) in a detached thread (a server's accept loop, one thread per
 * connection it accepted), asserting that the thread was created. */
void tu_thread_detached(void *(*fn)(void *), void *arg);

/* Milliseconds on the monotonic clock (for reporting how long a step
 * took; never for asserting on it). */
int64_t tu_mono_ms(void);

/* The library calls every backend test makes, asserting that they worked
 * (the Check message names the call, the error and dlock_errmsg()):
 * tu_open() a client for URL, tu_lock() an exclusive handle on NAME,
 * tu_token() of a held lock, TU_ACQUIRE_OK() waiting at most WAIT ms. */
struct dlock_client;
struct dlock_lock;
struct dlock_client *tu_open(const char *url);
struct dlock_lock *tu_lock(struct dlock_client *c, const char *name);
/* The names dlock_list(C, PATTERN) gives, asserting that it worked: as a
 * NULL-terminated array (free with tu_free_names), or as one string with
 * SEP after each name (caller frees). */
char **tu_list_names(struct dlock_client *c, const char *pattern);
char *tu_list_text(struct dlock_client *c, const char *pattern, const char *sep);
void tu_free_names(char **v);
size_t tu_count_names(char **v);
bool tu_listed(char **v, const char *name);
/* tu_lock() with a mode (a dlock_mode) and flags of its own. */
struct dlock_lock *tu_lock_mode(struct dlock_client *c, const char *name, int mode, unsigned flags);
uint64_t tu_token(struct dlock_lock *l);
/* What dlock_inspect(C, NAME) tells, asserting that it worked: whether
 * NAME is held (tu_held) and how many wait for it (tu_waiters). */
int tu_held(struct dlock_client *c, const char *name);
long tu_waiters(struct dlock_client *c, const char *name);
#define TU_ACQUIRE_OK(l, wait)                                                                \
    do {                                                                                      \
        int rc_ = dlock_acquire((l), (wait));                                                 \
        ck_assert_msg(rc_ == DLOCK_OK, "acquire '%s': %s: %s", dlock_lock_name(l),            \
                      dlock_err_name(rc_), dlock_errmsg());                                   \
    } while (0)

/* dlock_release(L) asserted to work (the message names the lock). */
#define TU_RELEASE_OK(l)                                                                      \
    do {                                                                                      \
        int rc_ = dlock_release(l);                                                           \
        ck_assert_msg(rc_ == DLOCK_OK, "release '%s': %s: %s", dlock_lock_name(l),            \
                      dlock_err_name(rc_), dlock_errmsg());                                   \
    } while (0)

/* dlock_open(URL) asserted to fail with WANT (a dlock code) and a message
 * that holds TEXT; dlock_errmsg() still tells it afterwards. */
#define TU_OPEN_FAILS(url, want, text)                                                        \
    do {                                                                                      \
        struct dlock_client *c_ = NULL;                                                       \
        int rc_ = dlock_open((url), &c_);                                                     \
        ck_assert_msg(rc_ == (want) && strstr(dlock_errmsg(), (text)) != NULL,                \
                      "open '%s': %s, not %s with '%s': %s", (url), dlock_err_name(rc_),      \
                      dlock_err_name(want), (text), dlock_errmsg());                          \
    } while (0)

/* dlock_acquire(L, WAIT) asserted to return WANT (a dlock code; the
 * message names WHAT, the step of the test, the code it returned and
 * dlock_errmsg()). */
#define TU_ACQUIRE_EXPECT(l, wait, want, what)                                                \
    do {                                                                                      \
        int rc_ = dlock_acquire((l), (wait));                                                 \
        ck_assert_msg(rc_ == (want), "%s: acquire '%s': %s, not %s: %s", (what),              \
                      dlock_lock_name(l), dlock_err_name(rc_), dlock_err_name(want),          \
                      dlock_errmsg());                                                        \
    } while (0)

/* TU_ACQUIRE_OK(L, WAIT), then a release that must work: the name can be
 * taken (again) and given back. */
void tu_acquire_release(struct dlock_lock *l, int64_t wait);
/* A handle on NAME through C, taken at once and given back: its token;
 * tu_next_token() asserts it greater than LAST (fencing tokens only grow). */
uint64_t tu_take_token(struct dlock_client *c, const char *name);
uint64_t tu_next_token(struct dlock_client *c, const char *name, uint64_t last);

/* The end of a test: TU_FREE_LOCKS(a, b, ...) frees each handle in
 * order, TU_CLOSE_CLIENTS(c, d, ...) closes each client in order (NULL:
 * nothing, as dlock_lock_free and dlock_client_close do). */
#define TU_FREE_LOCKS(...) \
    tu_free_locks((struct dlock_lock *[]){__VA_ARGS__}, \
                  sizeof((struct dlock_lock *[]){__VA_ARGS__}) / sizeof(struct dlock_lock *))
#define TU_CLOSE_CLIENTS(...) \
    tu_close_clients((struct dlock_client *[]){__VA_ARGS__}, \
                     sizeof((struct dlock_client *[]){__VA_ARGS__}) / sizeof(struct dlock_client *))
void tu_free_locks(struct dlock_lock *const *l, size_t n);
/* Release each of the N held handles of L (asserting DLOCK_OK) and free
 * it; TU_RELEASE_FREE(a, b, ...) does so with the handles written in place. */
void tu_release_free_all(struct dlock_lock *const *l, size_t n);
#define TU_RELEASE_FREE(...) \
    tu_release_free_all((struct dlock_lock *[]){__VA_ARGS__}, \
                        sizeof((struct dlock_lock *[]){__VA_ARGS__}) / sizeof(struct dlock_lock *))
void tu_close_clients(struct dlock_client *const *c, size_t n);

/* The frames of the backend tests, written once here; each test file
 * opens them on the URLs of its own fixture.
 *
 * tu_solo: a client of URL (malloc'd, taken over) with a handle on NAME
 * -- a test of one client. tu_solo_close() frees the handle, the client
 * and the URL. */
struct tu_solo {
    char *url;
    struct dlock_client *c;
    struct dlock_lock *l;
};
struct tu_solo tu_solo_open(char *url, const char *name);
void tu_solo_close(struct tu_solo *s);
/* tu_solo_open() for a thread other than the test's (no assertion): a
 * client of URL (not taken over: S->url stays NULL) with an exclusive
 * handle on NAME in *S. DLOCK_OK, or the code of the call that failed,
 * with nothing left open. */
int tu_solo_open_quiet(const char *url, const char *name, struct tu_solo *s);

/* What a lost callback saw: tu_on_lost (a dlock_lost_fn whose ARG is a
 * struct tu_lost) counts the calls and keeps the last reason;
 * tu_wait_lost() waits up to TIMEOUT_MS until it fired N times. */
struct tu_lost {
    atomic_int fired;
    char why[512];
};
void tu_on_lost(struct dlock_lock *l, const char *why, void *arg);
/* The same for a semaphore's permits (a dlock_permit_lost_fn). */
struct dlock_semaphore;
struct dlock_permit;
void tu_on_permit_lost(struct dlock_semaphore *s, struct dlock_permit *p, const char *why,
                       void *arg);
bool tu_wait_lost(struct tu_lost *f, int n, int timeout_ms);

/* An election watched across a server restart (what `dlock leader
 * --watch` does): client A of URL leads election NAME with "before", an
 * observer client follows it in a thread of its own
 * (dlock_election_observe with DLOCK_FOREVER from each leader it sees),
 * RESTART(ARG) restarts the server; then A resigns (its rc ignored: the
 * restart may have taken its hold) and client B campaigns with "after".
 * Asserts that the observer reported B as leader, every observe of its
 * loop returning DLOCK_OK meanwhile (a transient error is retried, not
 * the end of the watch). */
void tu_watch_across_restart(const char *url, const char *name, void (*restart)(void *arg),
                             void *arg);

/* tu_pair: two clients (A and B, taken over) with a handle each on NAME
 * -- a test of one client against another; LOST records la's lost
 * callback once tu_pair_watch_lost() registered it. tu_pair_close() frees
 * the handles and closes the clients. */
struct tu_pair {
    struct dlock_client *a, *b;
    struct dlock_lock *la, *lb;
    struct tu_lost lost;
};
struct tu_pair tu_pair_of(struct dlock_client *a, struct dlock_client *b, const char *name);
void tu_pair_watch_lost(struct tu_pair *p);
void tu_pair_close(struct tu_pair *p);

/* tu_waiter: an acquire of L waiting at most WAIT, in a thread of its
 * own. tu_waiter_start() runs dlock_acquire_ex(L, WAIT, CANCEL); when it
 * worked the thread reads the token into TOKEN and, unless KEEP, releases.
 * RC is 1 (no dlock code) until the acquire returns, DONE is set when the
 * thread ends, TID is the thread's id (for tu_wait_thread_asleep()).
 * tu_waiter_join() joins the thread and returns RC. */
struct tu_waiter {
    struct dlock_lock *l;
    int64_t wait;
    struct dlock_cancel *cancel;
    bool keep;
    atomic_int rc; /* read while the thread runs: atomic */
    uint64_t token;
    atomic_int done;
    atomic_long tid;
    pthread_t th;
};
void tu_waiter_start(struct tu_waiter *w, struct dlock_lock *l, int64_t wait);
/* tu_waiter_start() with a cancel object and KEEP. */
void tu_waiter_start_ex(struct tu_waiter *w, struct dlock_lock *l, int64_t wait,
                        struct dlock_cancel *cancel, bool keep);
int tu_waiter_join(struct tu_waiter *w);
/* dlock_lock_cancel() of W's handle again and again (each asserted) until
 * W's acquire returns, then joined: for a wait nothing shows, where only
 * a cancel that reached it can end an unbounded one. */
void tu_waiter_cancel_until_returned(struct tu_waiter *w);
/* Wait up to TIMEOUT_MS until W's thread is done. */
bool tu_waiter_wait_done(struct tu_waiter *w, int timeout_ms);
/* A wait forever of L (tu_waiter) with a cancel object fired once its
 * thread is seen blocked (tu_wait_thread_asleep; with TIMED_SLEEPS a
 * clock_nanosleep counts too); then PID (a stopped server; 0: none) is
 * continued after TIMEOUT_MS at the most. Whether the wait returned
 * before that; its code in *RC. */
bool tu_canceled_wait_returns(struct dlock_lock *l, bool timed_sleeps, pid_t pid, int timeout_ms,
                              int *rc);

/* THREADS threads take turns on the handles L[0..N) (thread i on
 * L[i % N]): ROUNDS acquires (each waiting at most WAIT) and releases.
 * Inside each hold a thread checks that no other is inside and bumps a
 * shared counter by a read, a pause and a write (a lost update shows two
 * holders). Asserts that every call worked, nobody found another inside
 * and the counter is THREADS * ROUNDS. */
void tu_exclusion_run(struct dlock_lock *const *l, size_t n, int threads, int rounds,
                      int64_t wait);

/* tu_sem_taker: dlock_semaphore_acquire(S, K, WAIT, CANCEL) in a thread
 * of its own, which releases what it got. RC is 1 until the acquire
 * returns; TID is the thread's id (for tu_wait_thread_asleep()).
 * tu_sem_taker_join() joins the thread and returns RC. */
struct tu_sem_taker {
    struct dlock_semaphore *s;
    unsigned k;
    int64_t wait;
    struct dlock_cancel *cancel;
    atomic_int rc; /* read while the thread runs: atomic */
    atomic_long tid;
    pthread_t th;
};
void tu_sem_taker_start(struct tu_sem_taker *t, struct dlock_semaphore *s, unsigned k,
                        int64_t wait, struct dlock_cancel *cancel);
int tu_sem_taker_join(struct tu_sem_taker *t);
/* A handle on semaphore NAME of PERMITS through C (tu_semaphore), and K
 * of its permits, waiting at most WAIT (tu_permit), each asserted to work
 * (the message names the call, the error and dlock_errmsg()). */
struct dlock_semaphore *tu_semaphore(struct dlock_client *c, const char *name, unsigned permits);
struct dlock_permit *tu_permit(struct dlock_semaphore *s, unsigned k, int64_t wait);
/* Assert that semaphore S (NAME of PERMITS, asked through C) is full:
 * a try is busy, and inspect shows HOLDERS holders and no free permit. */
void tu_sem_full(struct dlock_client *c, struct dlock_semaphore *s, const char *name,
                 unsigned permits, size_t holders);
/* Two clients of URL, each with a handle on semaphore NAME of PERMITS
 * (URL is the caller's); tu_sem_pair_close() frees both handles and
 * closes both clients. */
struct tu_sem_pair {
    struct dlock_client *a, *b;
    struct dlock_semaphore *sa, *sb;
};
struct tu_sem_pair tu_sem_pair_open(const char *url, const char *name, unsigned permits);
void tu_sem_pair_close(struct tu_sem_pair *p);

/* fork(); in the child, a client of URL takes NAME in MODE (a dlock_mode;
 * waiting at most WAIT) -- the child exits 10 when it cannot -- and *L is
 * its held handle. Returns the child's pid to the parent, 0 to the child. */
pid_t tu_fork_holding(const char *url, const char *name, int mode, int64_t wait,
                      struct dlock_lock **l);

/* ------------------------------------------------ registering the tests */

/* A test registers itself where it is written, so a test binary keeps no
 * table of its tests:
 *
 *     TU_TEST(waits, 30)
 *     {
 *         ...
 *     }
 *
 * defines the Check test NAME (NAME is both what Check's log shows and
 * what DLOCK_TEST matches) with a time limit of TIMEOUT seconds (0 = 60),
 * and adds it, before main() runs, to the binary's own test case.
 * TU_TEST_IN(TCASE, NAME, TIMEOUT) adds it to the test case TCASE that
 * TU_CASE(TCASE, ...) declared above it instead. Tests run in the order
 * they are written in the file, each case's after the binary's own case,
 * the cases in the order they are declared. A test inside #ifdef is
 * registered when it is compiled. */
struct TTest;
struct tu_case;
struct tu_reg {
    const struct tu_case *tcase; /* NULL: the binary's own case */
    const struct TTest *tt;
    int timeout;
    struct tu_reg *next;
};
void tu_register(struct tu_reg *r);

#define TU_TEST_IN(tcase, name, timeout) TU_TEST_AT_(&tu_case_##tcase, name, timeout)
#define TU_TEST(name, timeout) TU_TEST_AT_(NULL, name, timeout)
#define TU_TEST_AT_(case_, name, timeout_)                                                   \
    static void tu_fn_##name(int _i __attribute__((unused)));                                \
    static const struct TTest tu_tt_##name = {#name, tu_fn_##name, __FILE__, __LINE__};     \
    static struct tu_reg tu_reg_##name = {case_, &tu_tt_##name, timeout_, NULL};            \
    __attribute__((constructor)) static void tu_add_##name(void)                            \
    {                                                                                        \
        tu_register(&tu_reg_##name);                                                         \
    }                                                                                        \
    static void tu_fn_##name(int _i __attribute__((unused)))

/* A test case of its own, TCASE (an identifier; its name in logs and in
 * DLOCK_TEST), with a fixture: SETUP and TEARDOWN (either may be NULL)
 * run around each test in the test's process (TU_AROUND_EACH, Check's
 * checked fixture) or once around the whole case in the runner
 * (TU_AROUND_CASE, unchecked: a server the case's tests share). */
enum tu_around { TU_AROUND_EACH, TU_AROUND_CASE };
struct tu_case {
    const char *name;
    void (*setup)(void);
    void (*teardown)(void);
    enum tu_around around;
    int line;
    struct tu_case *next;
};
void tu_register_case(struct tu_case *c);
#define TU_CASE(tcase, setup_, teardown_, around_)                                           \
    static struct tu_case tu_case_##tcase = {#tcase, setup_, teardown_, around_, __LINE__, NULL}; \
    __attribute__((constructor)) static void tu_add_case_##tcase(void)                       \
    {                                                                                        \
        tu_register_case(&tu_case_##tcase);                                                  \
    }

/* main() of a test binary: the suite SUITE; its own test case, also named
 * SUITE, holds what TU_TEST registered, with SETUP and TEARDOWN (may be
 * NULL) around each test; then each TU_CASE. Returns what tu_run_suite()
 * does. */
int tu_main(const char *suite, void (*setup)(void), void (*teardown)(void));

/* Whether $DLOCK_SKIP_FIXTURES (names separated by spaces or commas)
 * names FIXTURE, a backend's fixture ('_' in it read as '-'): the suites
 * run over every backend leave such a fixture out of the run (make
 * check-san-ci: README, testing), saying so on stderr, prefixed with
 * SUITE. tu_skip_fixture_tests(SUITE): the same for the tests of the
 * binary's own case, each named after its backend (check_chaos), taken
 * out before tu_main() adds them. */
bool tu_fixture_skipped(const char *suite, const char *fixture);
void tu_skip_fixture_tests(const char *suite);

/* Long schedules: `make check` (and so CI) runs a short one of a test
 * whose whole schedule takes minutes; `make check-long` sets DLOCK_LONG=1
 * and runs the whole. tu_long() says which this run is.
 * tu_long_only(SUITE, TEST): a test of the binary's own case that only
 * the long run has, taken out otherwise (saying so on stderr) before
 * tu_main() adds it. */
bool tu_long(void);
void tu_long_only(const char *suite, const char *test);

/* One registered test: its name (what DLOCK_TEST matches), its Check
 * function and its time limit in seconds (0 = 60). */
struct tu_test {
    const char *name;
    const struct TTest *fn;
    int timeout;
};
/* The tests registered in TCASE (NULL: the binary's own case), in the
 * order of the source: *N of them in an array the caller frees. */
struct tu_test *tu_registered(const struct tu_case *tcase, size_t *n);

/* Add to S a test case named TCASE holding the tests of TESTS[0..N) that
 * the name filter lets through, with a time limit of the largest timeout
 * among them (Check limits a whole test case). Returns the test case, to
 * attach fixtures to, or NULL when the filter let no test through (then
 * nothing is added, so a case's servers are not started for nothing).
 *
 * The filter: $DLOCK_TEST unset or empty runs everything; otherwise a
 * test runs when "TCASE/NAME" contains it (a substring), or, when it holds
 * a glob character (* ? [), when it matches the whole of "TCASE/NAME".
 * DLOCK_TEST=cancel runs every cancel test, DLOCK_TEST=zk/ every test of
 * the zk case. Check's own CK_RUN_CASE / CK_RUN_SUITE still apply.
 * With $DLOCK_TEST_LIST set, each test added is printed as "TCASE/NAME
 * TIMEOUT" and tu_run_suite() runs none. */
struct Suite;
struct TCase;
struct TCase *tu_add_tests(struct Suite *s, const char *tcase, const struct tu_test *tests,
                           size_t n);
#define TU_COUNT(a) (sizeof(a) / sizeof *(a))

/* Run every test of suite S, each in its own process (Check's fork
 * mode), and return the exit status for main(): 0 when all passed. Says
 * so on stderr when DLOCK_TEST let no test through. */
int tu_run_suite(struct Suite *s);

/* ------------------------------------------------------ a fenced store */

/* A storage service that honours fencing tokens, in the file PATH ("max
 * count stale"): a write with a token older than the newest one seen is
 * refused and counted as stale. False when refused (or PATH cannot be
 * opened). */
bool tu_fenced_write(const char *path, uint64_t token);
/* Accepted writes in the fenced store PATH so far; *STALE (may be NULL)
 * gets the refused ones. */
uint64_t tu_fenced_count(const char *path, uint64_t *stale);

/* How a fenced worker takes its turns: up to WRITES per hold, each while
 * the hold has more than MIN_VALIDITY_MS left, PAUSE_MS apart, then REST_MS
 * after the release. */
struct tu_fenced_turn {
    int writes;
    int64_t min_validity_ms;
    int pause_ms;
    int rest_ms;
};
/* Fork a worker that takes lock "fenced" at URL, writes to "<DIR>/store"
 * through the fence while the hold is valid, releases; until "<DIR>/stop"
 * appears. ECONN, EUNAVAIL and ELOST are taken as an outage (a cluster's
 * leader gone) and tried again. Exits 0 unless a stale write or another
 * error; writes "accepted turns lost failed-acquires" to
 * "<DIR>/count.<pid>". */
pid_t tu_fenced_worker(const char *url, const char *dir, const struct tu_fenced_turn *turn);
/* Stop the N workers W of DIR, check each exited 0, and return the sum of
 * their accepted writes (each worker's line goes to stderr under WHAT). */
uint64_t tu_fenced_stop(const pid_t *w, int n, const char *dir, const char *what);

#endif
