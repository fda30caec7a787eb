/* check_election.c -- the leader election's contract, written once and
 * run against every backend of tests/lib/contract.h that has elections;
 * a backend without them is held to its documented DLOCK_ENOTSUP instead
 * of being skipped.
 *
 * What is tested: campaign, proclaim and resign as observers see them;
 * one leader at a time among N campaigning processes (a counter in shared
 * memory raised and lowered by the leaders); kill -9 of the leader hands
 * leadership to a waiting campaigner (file: at once; otherwise at the end
 * of its lease); an observer follows every change; campaigns and
 * observations end at a cancel or their bound; forced loss of
 * leadership calls the lost callback; on etcd, the real etcdctl elect
 * (Go's concurrency.Election) campaigns and observes beside dlock. Tests
 * wait on conditions, never on fixed sleeps, and never assert on time.
 *
 * DLOCK_TEST=<substring or glob of "backend/test"> runs a subset.
 */
#include <check.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "contract.h"
#include "dlock.h"
#include "testutil.h"

/* The fixtures whose backend has elections (docs/backends.md). */
static bool has_elections(const struct ct_fixture *f)
{
    return strcmp(f->name, "file") == 0 || strcmp(f->name, "etcd") == 0 ||
           strcmp(f->name, "zk") == 0 || strncmp(f->name, "redis", 5) == 0 ||
           strcmp(f->name, "redlock") == 0 || strcmp(f->name, "mysql") == 0 ||
           strcmp(f->name, "postgres") == 0;
}

/* ------------------------------------------------------------- helpers */

static dlock_election *election(dlock_client *c, const char *name)
{
    dlock_election *e = NULL;
    EXPECT_RC(dlock_election_new(c, name, 0, &e), DLOCK_OK);
    ck_assert_ptr_nonnull(e);
    return e;
}

static uint64_t token_of(dlock_election *e)
{
    uint64_t t = 0;
    EXPECT_RC(dlock_election_token(e, &t), DLOCK_OK);
    ck_assert_uint_gt(t, 0);
    return t;
}

static dlock_leader *leader_now(dlock_client *c, const char *name)
{
    dlock_leader *l = NULL;
    EXPECT_RC(dlock_election_leader(c, name, &l), DLOCK_OK);
    ck_assert_ptr_nonnull(l);
    return l;
}

/* Assert that election NAME, read through C, is led with VALUE and TOKEN
 * (VALUE NULL: nobody leads). */
static void expect_leader(dlock_client *c, const char *name, const char *value, uint64_t token)
{
    dlock_leader *l = leader_now(c, name);
    if (!value) {
        ck_assert_int_eq(dlock_leader_held(l), 0);
        ck_assert_uint_eq(dlock_leader_token(l), 0);
    } else {
        ck_assert_int_eq(dlock_leader_held(l), 1);
        ck_assert_str_eq(dlock_leader_value(l), value);
        ck_assert_uint_eq(dlock_leader_token(l), token);
        ck_assert_str_ne(dlock_leader_id(l), "");
    }
    dlock_leader_free(l);
}

/* A campaign in a thread of its own: RC is 1 until it returns. */
struct campaigner {
    dlock_election *e;
    const char *value;
    int64_t wait;
    dlock_cancel *cancel;
    int rc;
    atomic_int done;
    atomic_long tid;
    pthread_t th;
};

static void *campaigner_main(void *arg)
{
    struct campaigner *k = arg;
    k->tid = syscall(SYS_gettid);
    k->rc = dlock_election_campaign(k->e, k->value, k->wait, k->cancel);
    atomic_store(&k->done, 1);
    return NULL;
}

static void campaigner_start(struct campaigner *k, dlock_election *e, const char *value,
                             int64_t wait, dlock_cancel *cancel)
{
    memset(k, 0, sizeof *k);
    k->e = e;
    k->value = value;
    k->wait = wait;
    k->cancel = cancel;
    k->rc = 1;
    ck_assert_int_eq(pthread_create(&k->th, NULL, campaigner_main, k), 0);
}

static int campaigner_join(struct campaigner *k)
{
    pthread_join(k->th, NULL);
    return k->rc;
}

/* ------------------------------------------------------------ the tests */

/* Campaign, proclaim, resign, and what observers and a second campaigner
 * see of each. */
TU_TEST(campaign_proclaim_resign, 30)
{
    dlock_client *a = ct_open_test(NULL), *b = ct_open_test(NULL);
    dlock_election *ea = election(a, "lead"), *eb = election(b, "lead");
    expect_leader(b, "lead", NULL, 0);
    EXPECT_RC(dlock_election_resign(ea), DLOCK_ENOTOWNER);
    EXPECT_RC(dlock_election_proclaim(ea, "x"), DLOCK_ENOTOWNER);
    uint64_t t = 0;
    EXPECT_RC(dlock_election_token(ea, &t), DLOCK_ENOTOWNER);
    ck_assert_int_eq(dlock_election_validity_ms(ea), 0);

    EXPECT_RC(dlock_election_campaign(ea, "10.0.0.1:80", DLOCK_TRY, NULL), DLOCK_OK);
    uint64_t ta = token_of(ea);
    ck_assert_int_ne(dlock_election_validity_ms(ea), 0);
    expect_leader(b, "lead", "10.0.0.1:80", ta);
    EXPECT_RC(dlock_election_campaign(ea, "again", DLOCK_TRY, NULL), DLOCK_EMISUSE);
    EXPECT_RC(dlock_election_campaign(eb, "10.0.0.2:80", DLOCK_TRY, NULL), DLOCK_EBUSY);
    EXPECT_RC(dlock_election_campaign(eb, "10.0.0.2:80", 100, NULL), DLOCK_ETIMEDOUT);

    /* Proclaim: a new value and version, the same leader and token. */
    dlock_leader *before = leader_now(b, "lead");
    EXPECT_RC(dlock_election_proclaim(ea, "10.0.0.1:81"), DLOCK_OK);
    dlock_leader *after = leader_now(b, "lead");
    ck_assert_str_eq(dlock_leader_value(after), "10.0.0.1:81");
    ck_assert_uint_eq(dlock_leader_token(after), ta);
    ck_assert_uint_ne(dlock_leader_version(after), dlock_leader_version(before));
    dlock_leader_free(before);
    dlock_leader_free(after);

    /* A waiting campaigner leads once the leader resigns. */
    struct campaigner k;
    campaigner_start(&k, eb, "10.0.0.2:80", DLOCK_FOREVER, NULL);
    EXPECT_RC(dlock_election_resign(ea), DLOCK_OK);
    EXPECT_RC(campaigner_join(&k), DLOCK_OK);
    uint64_t tb = token_of(eb);
    ck_assert_uint_gt(tb, ta);
    expect_leader(a, "lead", "10.0.0.2:80", tb);
    EXPECT_RC(dlock_election_resign(eb), DLOCK_OK);
    expect_leader(a, "lead", NULL, 0);
    /* The resigned handle campaigns again. */
    EXPECT_RC(dlock_election_campaign(ea, "back", DLOCK_TRY, NULL), DLOCK_OK);
    ck_assert_uint_gt(token_of(ea), tb);
    dlock_election_free(ea); /* resigns */
    expect_leader(b, "lead", NULL, 0);
    dlock_election_free(eb);
    TU_CLOSE_CLIENTS(a, b);
}

/* N processes campaign in rounds: never two leaders at once. */
enum { LEADER_ROUNDS = 5 };
struct shared_count {
    char *url;
    struct tu_inside leaders;
};

/* A forked child's side of fork_child_frees: the parent's election
 * refuses it (DLOCK_EMISUSE), then it frees it and closes the client,
 * under an alarm. 0, or a bit per failed check. */
struct election_of_parent {
    dlock_client *c;
    dlock_election *e;
};

static int child_frees_election(void *arg)
{
    const struct election_of_parent *ep = arg;
    uint64_t t;
    int bad = 0;
    bad |= (dlock_election_proclaim(ep->e, "child") != DLOCK_EMISUSE) << 0;
    bad |= (dlock_election_resign(ep->e) != DLOCK_EMISUSE) << 1;
    bad |= (dlock_election_token(ep->e, &t) != DLOCK_EMISUSE) << 2;
    bad |= (dlock_election_cancel(ep->e) != DLOCK_EMISUSE) << 3;
    dlock_election_free(ep->e);
    dlock_client_close(ep->c);
    return bad;
}

/* A child after fork() that frees the election and closes the client it
 * inherited, while the parent leads with a lease its keeper renews, ends
 * at once and changes nothing: the parent still leads, with its value and
 * token, and resigns itself. */
TU_TEST(fork_child_frees, 60)
{
    dlock_client *a = ct_open_test("lease=2s"), *b = ct_open_test(NULL);
    dlock_election *ea = election(a, "fk");
    EXPECT_RC(dlock_election_campaign(ea, "parent", DLOCK_TRY, NULL), DLOCK_OK);
    uint64_t t = token_of(ea);
    tu_fork_bounded(child_frees_election, &(struct election_of_parent){a, ea});
    ck_assert_uint_eq(token_of(ea), t);
    expect_leader(b, "fk", "parent", t);
    EXPECT_RC(dlock_election_resign(ea), DLOCK_OK);
    expect_leader(b, "fk", NULL, 0);
    dlock_election_free(ea);
    dlock_client_close(a);
    dlock_client_close(b);
}

/* Process P (a tu_fork_all child): LEADER_ROUNDS campaigns, each
 * counted in SC while it leads. */
static int campaign_rounds(int p, void *arg)
{
    struct shared_count *sc = arg;
    dlock_client *c = NULL;
    dlock_election *e = NULL;
    if (dlock_open(sc->url, &c) || dlock_election_new(c, "n", 0, &e))
        return 10;
    char me[32];
    snprintf(me, sizeof me, "proc-%d", p);
    for (int r = 0; r < LEADER_ROUNDS; r++) {
        if (dlock_election_campaign(e, me, 60000, NULL))
            return 11;
        tu_inside_enter(&sc->leaders);
        /* While leading, observers see this process's value. */
        dlock_leader *l = NULL;
        if (dlock_election_leader(c, "n", &l) || strcmp(dlock_leader_value(l), me) != 0)
            return 12;
        dlock_leader_free(l);
        tu_inside_leave(&sc->leaders);
        if (dlock_election_resign(e))
            return 13;
    }
    dlock_election_free(e);
    dlock_client_close(c);
    return 0;
}

TU_TEST(one_leader_among_n, 120)
{
    enum { PROCS = 4 };
    struct shared_count *sc = tu_shared_new(sizeof *sc);
    sc->url = ct_test_url(NULL);
    tu_fork_all(PROCS, campaign_rounds, sc);
    ck_assert_int_eq(atomic_load(&sc->leaders.max), 1);
    ck_assert_int_eq(atomic_load(&sc->leaders.rounds), PROCS * LEADER_ROUNDS);
    free(sc->url);
    tu_shared_free(sc, sizeof *sc);
}

/* kill -9 of the leader: a waiting campaigner leads (file: at once; else
 * when the dead leader's lease ends) with a greater token, and observers
 * see it. */
TU_TEST(kill9_leader, 60)
{
    struct ct_holder h = ct_holder_open("lease=1500ms", "elect-kill9");
    h.pid = tu_fork();
    if (h.pid == 0) {
        dlock_client *c = NULL;
        dlock_election *e = NULL;
        uint64_t t = 0;
        if (dlock_open(h.url, &c) || dlock_election_new(c, "k9", 0, &e) ||
            dlock_election_campaign(e, "doomed", 30000, NULL) || dlock_election_token(e, &t))
            _exit(10);
        ct_holder_held(h.dir, t, true);
        _exit(0);
    }
    uint64_t t1 = ct_holder_wait(&h);
    dlock_client *c = tu_open(h.url);
    expect_leader(c, "k9", "doomed", t1);
    dlock_election *e = election(c, "k9");
    struct campaigner k;
    campaigner_start(&k, e, "heir", DLOCK_FOREVER, NULL);
    ct_holder_kill(&h);
    EXPECT_RC(campaigner_join(&k), DLOCK_OK); /* the test's time limit fails a hang */
    uint64_t t2 = token_of(e);
    ck_assert_uint_gt(t2, t1);
    expect_leader(c, "k9", "heir", t2);
    dlock_election_free(e);
    dlock_client_close(c);
    ct_holder_close(&h);
}

/* An observer following the election sees each change, in order. */
struct follower {
    dlock_client *c;
    char seen[8][64]; /* value, or "-" for no leader */
    atomic_int ready; /* the first reading is taken */
    atomic_int n;
    int rc;
    pthread_t th;
};

static void *follower_main(void *arg)
{
    struct follower *f = arg;
    dlock_leader *known = NULL;
    f->rc = dlock_election_leader(f->c, "obs", &known);
    atomic_store(&f->ready, 1);
    while (!f->rc && atomic_load(&f->n) < 4) {
        dlock_leader *next = NULL;
        f->rc = dlock_election_observe(f->c, "obs", known, DLOCK_FOREVER, NULL, &next);
        if (f->rc)
            break;
        int i = atomic_load(&f->n);
        snprintf(f->seen[i], sizeof f->seen[i], "%s",
                 dlock_leader_held(next) ? dlock_leader_value(next) : "-");
        dlock_leader_free(known);
        known = next;
        atomic_store(&f->n, i + 1);
    }
    dlock_leader_free(known);
    return NULL;
}

static void wait_seen(struct follower *f, int n)
{
    for (int i = 0; i < 3000 && atomic_load(&f->n) < n; i++)
        tu_sleep_ms(10);
    ck_assert_int_ge(atomic_load(&f->n), n);
}

TU_TEST(observe_follows, 60)
{
    dlock_client *a = ct_open_test(NULL), *b = ct_open_test(NULL), *o = ct_open_test(NULL);
    dlock_election *ea = election(a, "obs"), *eb = election(b, "obs");
    struct follower f = {.c = o};
    ck_assert_int_eq(pthread_create(&f.th, NULL, follower_main, &f), 0);
    for (int i = 0; i < 3000 && !atomic_load(&f.ready); i++)
        tu_sleep_ms(10);
    EXPECT_RC(dlock_election_campaign(ea, "one", DLOCK_TRY, NULL), DLOCK_OK);
    wait_seen(&f, 1);
    EXPECT_RC(dlock_election_proclaim(ea, "two"), DLOCK_OK);
    wait_seen(&f, 2);
    EXPECT_RC(dlock_election_resign(ea), DLOCK_OK);
    wait_seen(&f, 3);
    EXPECT_RC(dlock_election_campaign(eb, "three", DLOCK_TRY, NULL), DLOCK_OK);
    pthread_join(f.th, NULL);
    EXPECT_RC(f.rc, DLOCK_OK);
    ck_assert_str_eq(f.seen[0], "one");
    ck_assert_str_eq(f.seen[1], "two");
    ck_assert_str_eq(f.seen[2], "-");
    ck_assert_str_eq(f.seen[3], "three");
    dlock_election_free(ea);
    dlock_election_free(eb);
    TU_CLOSE_CLIENTS(a, b, o);
}

/* Campaigns and observations end at their bound and at a cancel, and a
 * canceled campaign leaves nothing behind. */
TU_TEST(cancel_and_bounds, 60)
{
    dlock_client *a = ct_open_test(NULL), *b = ct_open_test(NULL);
    dlock_election *ea = election(a, "c"), *eb = election(b, "c");
    EXPECT_RC(dlock_election_campaign(ea, "a", DLOCK_TRY, NULL), DLOCK_OK);
    uint64_t ta = token_of(ea);
    dlock_cancel *k = NULL;
    EXPECT_RC(dlock_cancel_new(&k), DLOCK_OK);
    struct campaigner w;
    campaigner_start(&w, eb, "b", DLOCK_FOREVER, k);
    ck_assert(tu_wait_thread_asleep(&w.tid, 10000));
    EXPECT_RC(dlock_cancel_fire(k), DLOCK_OK);
    EXPECT_RC(campaigner_join(&w), DLOCK_ECANCELED);
    /* dlock_election_cancel reaches a campaign in progress. */
    campaigner_start(&w, eb, "b", DLOCK_FOREVER, NULL);
    while (!atomic_load(&w.done)) {
        EXPECT_RC(dlock_election_cancel(eb), DLOCK_OK);
        tu_sleep_ms(5);
    }
    EXPECT_RC(campaigner_join(&w), DLOCK_ECANCELED);
    /* The canceled campaigns left no contender: the leader is unchanged,
     * and once it resigns a try wins at once. */
    expect_leader(b, "c", "a", ta);
    dlock_leader *known = leader_now(b, "c"), *next = (dlock_leader *)1;
    EXPECT_RC(dlock_election_observe(b, "c", known, 100, NULL, &next), DLOCK_ETIMEDOUT);
    ck_assert_ptr_null(next);
    EXPECT_RC(dlock_election_observe(b, "c", known, DLOCK_FOREVER, k, &next), DLOCK_ECANCELED);
    ck_assert_ptr_null(next);
    dlock_leader_free(known);
    EXPECT_RC(dlock_election_resign(ea), DLOCK_OK);
    EXPECT_RC(dlock_election_campaign(eb, "b", DLOCK_TRY, NULL), DLOCK_OK);
    ck_assert_uint_gt(token_of(eb), ta);
    dlock_cancel_free(k);
    dlock_election_free(ea);
    dlock_election_free(eb);
    TU_CLOSE_CLIENTS(a, b);
}

/* Leadership taken away (a forced release of the election's key): the
 * lost callback fires once, the token is refused, resign says DLOCK_ELOST
 * and the handle campaigns again. File: the kernel holds the lock, the
 * force is refused and the leader stays. The leader's lease is 5 s: the
 * keeper finds the loss at its next renewal, a third of the lease on
 * (the default 30 s lease kept each fixture waiting 10 s). */
struct lost_seen {
    atomic_int fired;
    dlock_election *e;
};

static void on_lost(dlock_election *e, const char *why, void *arg)
{
    (void)why;
    struct lost_seen *s = arg;
    if (e == s->e)
        atomic_fetch_add(&s->fired, 1);
}

TU_TEST(lost_callback, 60)
{
    dlock_client *a = ct_open_test("lease=5s"), *b = ct_open_test(NULL);
    dlock_election *e = election(a, "lost");
    struct lost_seen seen = {.e = e};
    EXPECT_RC(dlock_election_on_lost(e, on_lost, &seen), DLOCK_OK);
    EXPECT_RC(dlock_election_campaign(e, "v", DLOCK_TRY, NULL), DLOCK_OK);
    uint64_t t = token_of(e);
    if (!(CT->caps & CT_FORCE_LIVE)) {
        EXPECT_RC(dlock_force_release(b, "lost"), DLOCK_ENOTSUP);
        expect_leader(b, "lost", "v", t);
        EXPECT_RC(dlock_election_resign(e), DLOCK_OK);
    } else {
        EXPECT_RC(dlock_force_release(b, "lost"), DLOCK_OK);
        for (int i = 0; i < 3000 && atomic_load(&seen.fired) == 0; i++)
            tu_sleep_ms(10);
        ck_assert_int_eq(atomic_load(&seen.fired), 1);
        ck_assert_int_eq(dlock_election_validity_ms(e), 0);
        uint64_t t2 = 0;
        EXPECT_RC(dlock_election_token(e, &t2), DLOCK_ELOST);
        EXPECT_RC(dlock_election_proclaim(e, "w"), DLOCK_ELOST);
        EXPECT_RC(dlock_election_resign(e), DLOCK_ELOST);
    }
    EXPECT_RC(dlock_election_campaign(e, "again", DLOCK_TRY, NULL), DLOCK_OK);
    ck_assert_uint_gt(token_of(e), t);
    ck_assert_int_eq(atomic_load(&seen.fired), (CT->caps & CT_FORCE_LIVE) ? 1 : 0);
    dlock_election_free(e);
    TU_CLOSE_CLIENTS(a, b);
}

/* etcd: Go's concurrency.Election, played by the real etcdctl. `etcdctl
 * elect NAME PROPOSAL` leads and dlock's campaign waits for it, then
 * dlock leads and `etcdctl elect -l NAME` observes its value and its
 * proclaims. */

/* http://host:port of the running etcd fixture (from its URL). */
static char *etcd_endpoint(void)
{
    char *url = ct_test_url(NULL);
    const char *hp = strstr(url, "://");
    ck_assert_ptr_nonnull(hp);
    hp += 3;
    size_t n = strcspn(hp, "/?");
    char *ep = tu_fmt("http://%.*s", (int)n, hp);
    free(url);
    return ep;
}

/* Wait until the file PATH contains TEXT (a process's log). */
static bool log_has(const char *path, const char *text)
{
    for (int i = 0; i < 2000; i++) {
        char *got = tu_read_file(path);
        bool yes = got && strstr(got, text);
        free(got);
        if (yes)
            return true;
        tu_sleep_ms(10);
    }
    return false;
}

TU_TEST(etcdctl_interop, 90)
{
    char *ep = etcd_endpoint(), *name = tu_fmt("%sboth", ct_prefix);
    char *dir = tu_tmpdir("elect-etcdctl");
    char *log = tu_fmt("%s/elect.log", dir), *olog = tu_fmt("%s/observe.log", dir);
    dlock_client *c = ct_open_test(NULL);
    /* etcdctl leads; dlock sees its proposal and waits its turn. */
    const char *elect[] = {"etcdctl", "--endpoints", ep, "elect", name, "from-etcdctl", NULL};
    pid_t ctl = tu_spawn(elect, log);
    dlock_leader *none = NULL, *l = NULL;
    EXPECT_RC(dlock_election_observe(c, "both", NULL, 0, NULL, &none), DLOCK_OK);
    if (!dlock_leader_held(none))
        EXPECT_RC(dlock_election_observe(c, "both", none, 20000, NULL, &l), DLOCK_OK);
    else
        l = none, none = NULL;
    ck_assert_str_eq(dlock_leader_value(l), "from-etcdctl");
    uint64_t tctl = dlock_leader_token(l);
    dlock_election *e = election(c, "both");
    EXPECT_RC(dlock_election_campaign(e, "from-dlock", DLOCK_TRY, NULL), DLOCK_EBUSY);
    struct campaigner k;
    campaigner_start(&k, e, "from-dlock", DLOCK_FOREVER, NULL);
    tu_stop(ctl, 5000); /* SIGTERM: etcdctl closes its session, its key goes */
    EXPECT_RC(campaigner_join(&k), DLOCK_OK);
    ck_assert_uint_gt(token_of(e), tctl);
    /* etcdctl observes dlock's leader and its proclaims. */
    const char *observe[] = {"etcdctl", "--endpoints", ep, "elect", "-l", name, NULL};
    pid_t obs = tu_spawn(observe, olog);
    ck_assert_msg(log_has(olog, "from-dlock"), "etcdctl elect -l never showed dlock's value");
    EXPECT_RC(dlock_election_proclaim(e, "proclaimed"), DLOCK_OK);
    ck_assert_msg(log_has(olog, "proclaimed"), "etcdctl elect -l never showed the proclaim");
    /* A second etcdctl campaigner waits behind dlock, and leads once dlock
     * resigns. */
    ctl = tu_spawn(elect, log);
    EXPECT_RC(dlock_election_resign(e), DLOCK_OK);
    ck_assert_msg(log_has(olog, "from-etcdctl"), "etcdctl never led after dlock resigned");
    tu_stop(ctl, 5000);
    tu_stop(obs, 5000);
    dlock_leader_free(none);
    dlock_leader_free(l);
    dlock_election_free(e);
    dlock_client_close(c);
    tu_rmrf(dir);
    free(dir);
    free(log);
    free(olog);
    free(name);
    free(ep);
}

/* SIGTERM to PID again and again until it exits or GRACE_MS (a bound
 * only) pass: a stop that reaches a program more than once, some of them
 * while it exits. Its wait status, or SIGKILL's. */
static int stop_again_and_again(pid_t pid, int grace_ms)
{
    int status = 0;
    for (int waited = 0; waited < grace_ms; waited++) {
        kill(pid, SIGTERM);
        if (waitpid(pid, &status, WNOHANG) == pid)
            return status;
        tu_sleep_ms(1);
    }
    return tu_stop(pid, 0);
}

/* The command line: `dlock elect` runs its command only while leading,
 * with DLOCK_TOKEN; a second `dlock elect -n` is busy (1); `dlock leader`
 * prints the leader (0) and, with --watch --json, follows it to "no
 * leader" once the command ends, and ends at SIGTERM with 0 -- also when
 * SIGTERMs keep coming while it exits. */
TU_TEST(cli_elect, 90)
{
    char *url = ct_test_url(NULL), *dir = tu_tmpdir("elect-cli");
    char *tok = tu_fmt("%s/tok", dir), *go = tu_fmt("%s/go", dir);
    char *log = tu_fmt("%s/elect.log", dir), *wlog = tu_fmt("%s/watch.log", dir);
    char *script = tu_fmt("echo \"$DLOCK_TOKEN\" > %s.tmp && mv %s.tmp %s; "
                          "while [ ! -e %s ]; do sleep 0.05; done",
                          tok, tok, tok, go);
    const char *elect[] = {tu_dlock_bin(), "-u", url,  "elect", "--value", "node one",
                           "cli",          "--", "sh", "-c",    script,    NULL};
    pid_t leader = tu_spawn(elect, log);
    ck_assert_msg(tu_wait_file(tok, 30000), "dlock elect never ran its command");
    uint64_t token = tu_read_u64(tok);
    ck_assert_uint_gt(token, 0);
    char *out = NULL;
    const char *show[] = {"-u", url, "leader", "cli", NULL};
    ck_assert_int_eq(tu_dlock(&out, NULL, NULL, show), 0);
    char *want = tu_fmt("token=%" PRIu64 " ", token);
    ck_assert_msg(strstr(out, want) && strstr(out, "value=node one"), "dlock leader: %s", out);
    free(want);
    free(out);
    const char *second[] = {"-u", url, "elect", "-n", "cli", "--", "true", NULL};
    ck_assert_int_eq(tu_dlock(NULL, NULL, NULL, second), 1);
    const char *watch[] = {tu_dlock_bin(), "-u", url, "leader", "cli", "--watch", "--json", NULL};
    pid_t watcher = tu_spawn(watch, wlog);
    ck_assert_msg(log_has(wlog, "\"value\":\"node one\""), "watch never showed the leader");
    tu_write_marker(go, "go");
    ck_assert_int_eq(tu_wait_exit(leader), 0);
    ck_assert_msg(log_has(wlog, "\"leader\":false"), "watch never showed the leader gone");
    /* SIGTERM ends the watch with 0, and so does one that lands while it
     * exits (tu_stop and a shell's kill of the group send two). */
    int status = stop_again_and_again(watcher, 30000);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "dlock leader --watch: %d",
                  status);
    const char *none[] = {"-u", url, "leader", "cli", NULL};
    ck_assert_int_eq(tu_dlock(NULL, NULL, NULL, none), 1);
    tu_rmrf(dir);
    free(dir);
    free(tok);
    free(go);
    free(log);
    free(wlog);
    free(script);
    free(url);
}

/* Until election NAME has a campaigner queued behind its leader, read
 * through C (a bound only; a backend that does not count waiters, -1,
 * cannot say). */
static void wait_queued(dlock_client *c, const char *name)
{
    for (int i = 0; i < 3000; i++) {
        dlock_info *info = NULL;
        EXPECT_RC(dlock_inspect(c, name, &info), DLOCK_OK);
        long n = dlock_info_waiter_count(info);
        dlock_info_free(info);
        if (n != 0)
            return;
        tu_sleep_ms(10);
    }
    ck_abort_msg("the second campaigner never queued");
}

/* Check that the lines of LOG (a leader --watch's output) end, in order,
 * with WANT's N texts; a "none?" may be missing. */
static void expect_lines(const char *log, const char *const *want, size_t n)
{
    char *got = tu_read_file(log);
    ck_assert_ptr_nonnull(got);
    const char *line = got;
    /* the CLI's warnings on stderr (a fixture's URL with a password) are
     * not the watch's lines */
    while (strncmp(line, "dlock: warning:", 15) == 0 && strchr(line, '\n'))
        line = strchr(line, '\n') + 1;
    for (size_t i = 0; i < n; i++) {
        bool optional = strcmp(want[i], "none?") == 0;
        size_t len = optional ? 4 : strlen(want[i]);
        const char *eol = strchr(line, '\n');
        bool match = eol && (size_t)(eol - line) >= len && memcmp(eol - len, want[i], len) == 0;
        if (optional && !match)
            continue;
        ck_assert_msg(match, "line %zu is not '...%s' (one line per change):\n%s", i + 1, want[i],
                      got);
        line = eol + 1;
    }
    free(got);
}

/* `dlock leader --watch` prints one line per change, never one twice:
 * nobody, a campaign, a proclaim, HANDOVERS times a queued campaigner
 * taking over at the leader's resign (etcd moves its key to the session
 * lease then: a put that changes nothing an observer sees, printed again
 * when the watcher read the leader before it), a resign, and a last
 * campaign that marks the end (the lines up to it are complete by then).
 * Between leaders a "none" may show where the handover is not one
 * write. */
enum { HANDOVERS = 6 };
TU_TEST(cli_watch_once_per_change, 120)
{
    char *url = ct_test_url(NULL), *dir = tu_tmpdir("elect-watch");
    char *wlog = tu_fmt("%s/watch.log", dir);
    const char *watch[] = {tu_dlock_bin(), "-u", url, "leader", "once", "--watch", NULL};
    pid_t watcher = tu_spawn(watch, wlog);
    ck_assert_msg(log_has(wlog, "none\n"), "watch never showed no leader");
    dlock_client *c[2] = {ct_open_test(NULL), ct_open_test(NULL)};
    dlock_election *e[2] = {election(c[0], "once"), election(c[1], "once")};
    const char *want[4 + 2 * HANDOVERS + 2] = {"none", "value=first", "value=second"};
    size_t n = 3;
    EXPECT_RC(dlock_election_campaign(e[0], "first", DLOCK_TRY, NULL), DLOCK_OK);
    ck_assert_msg(log_has(wlog, "value=first\n"), "watch never showed the campaign");
    EXPECT_RC(dlock_election_proclaim(e[0], "second"), DLOCK_OK);
    ck_assert_msg(log_has(wlog, "value=second\n"), "watch never showed the proclaim");
    char values[HANDOVERS][32];
    int leader = 0;
    for (int r = 0; r < HANDOVERS; r++) {
        snprintf(values[r], sizeof values[r], "value=heir%d", r);
        struct campaigner heir;
        campaigner_start(&heir, e[!leader], values[r] + 6, DLOCK_FOREVER, NULL);
        wait_queued(c[leader], "once");
        EXPECT_RC(dlock_election_resign(e[leader]), DLOCK_OK);
        EXPECT_RC(campaigner_join(&heir), DLOCK_OK);
        leader = !leader;
        char *seen = tu_fmt("%s\n", values[r]);
        ck_assert_msg(log_has(wlog, seen), "watch never showed %s", values[r]);
        free(seen);
        want[n++] = "none?";
        want[n++] = values[r];
    }
    EXPECT_RC(dlock_election_resign(e[leader]), DLOCK_OK);
    char *gone = tu_fmt("%s\nnone\n", values[HANDOVERS - 1]);
    ck_assert_msg(log_has(wlog, gone), "watch never showed the last resign");
    free(gone);
    EXPECT_RC(dlock_election_campaign(e[!leader], "end", DLOCK_TRY, NULL), DLOCK_OK);
    ck_assert_msg(log_has(wlog, "value=end\n"), "watch never showed the last campaign");
    want[n++] = "none";
    want[n++] = "value=end";
    tu_stop(watcher, 5000);
    expect_lines(wlog, want, n);
    EXPECT_RC(dlock_election_resign(e[!leader]), DLOCK_OK);
    dlock_election_free(e[0]);
    dlock_election_free(e[1]);
    TU_CLOSE_CLIENTS(c[0], c[1]);
    tu_rmrf(dir);
    free(dir);
    free(wlog);
    free(url);
}

/* The leader's id and value are the server's text to whoever runs
 * `dlock leader`: a value holding an escape sequence (any campaigner,
 * or anyone who can write the server, sets it) reaches the terminal with
 * its control characters (C0, DEL, C1 as U+009B) written as \xHH, on
 * one line, not raw. */
TU_TEST(cli_leader_text_escaped, 60)
{
    char *url = ct_test_url(NULL);
    dlock_client *c = ct_open_test(NULL);
    dlock_election *e = election(c, "esc");
    const char *value = "a\x1b]0;pwned\x07\x1b[2J\nfake=1\x7f\xc2\x9b"
                        "31m";
    EXPECT_RC(dlock_election_campaign(e, value, DLOCK_TRY, NULL), DLOCK_OK);
    const char *argv[] = {tu_dlock_bin(), "-u", url, "leader", "esc", NULL};
    char *out = NULL;
    ck_assert_int_eq(tu_run(argv, NULL, &out, NULL), 0);
    for (const char *p = out; *p; p++)
        ck_assert_msg((unsigned char)*p >= 0x20 && *p != 0x7f &&
                              !((unsigned char)p[0] == 0xc2 && (unsigned char)p[1] < 0xa0)
                          ? true
                          : p[0] == '\n' && !p[1],
                      "a control character (%#x) in `dlock leader`'s line: %s", (unsigned char)*p,
                      out);
    ck_assert_msg(strstr(out, "value=a\\x1b]0;pwned\\x07\\x1b[2J\\x0afake=1\\x7f\\xc2\\x9b31m\n"),
                  "the value not escaped as \\xHH: %s", out);
    free(out);
    EXPECT_RC(dlock_election_resign(e), DLOCK_OK);
    dlock_election_free(e);
    TU_CLOSE_CLIENTS(c);
    free(url);
}

TU_TEST(not_supported, 30)
{
    dlock_client *c = ct_open_test(NULL);
    dlock_election *e = (dlock_election *)1;
    EXPECT_RC(dlock_election_new(c, "x", 0, &e), DLOCK_ENOTSUP);
    ck_assert_ptr_null(e);
    ck_assert_msg(strstr(dlock_errmsg(), dlock_client_backend(c)), "message: %s", dlock_errmsg());
    dlock_leader *l = (dlock_leader *)1;
    EXPECT_RC(dlock_election_leader(c, "x", &l), DLOCK_ENOTSUP);
    ck_assert_ptr_null(l);
    dlock_client_close(c);
}

/* The election tests run on a backend that has elections (etcdctl_interop
 * on etcd alone), not_supported on the others. */
static bool runs_on(const struct ct_fixture *f, const char *test)
{
    if (strcmp(test, "not_supported") == 0)
        return !has_elections(f);
    if (strcmp(test, "etcdctl_interop") == 0)
        return strcmp(f->name, "etcd") == 0;
    return has_elections(f);
}

int main(void)
{
    return ct_main("election", "e", runs_on);
}
