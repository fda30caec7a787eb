/* check_redis_hostile.c -- the Redis backend against a misbehaving
 * server: a fake one that answers wrong, huge or trickled replies, a
 * restart that lost data, absurd tokens, names that alias its own keys,
 * a stalled server, and replies lost to downgrades, multi-locks and
 * semaphores (through the proxy of redis_suite.h).
 */
#include "redis_suite.h"

/* ------------------------------------------------ a misbehaving server */

/* A fake Redis server on loopback, a thread per connection: it answers
 * SCRIPT LOAD as a server would (any 40-character digest does) and
 * misbehaves at the first other command, the way a broken server or a
 * hostile proxy could. */
enum fake_mode {
    FAKE_HUGE_BULK, /* announce a 1 GiB bulk string and stream it as fast as it goes */
    FAKE_TRICKLE,   /* announce a reply, then send it one byte per 100 ms, forever */
    FAKE_CLOSE,     /* read a little of the command, then close the connection */
    FAKE_ZERO_TOKEN, /* answer the acquire's script with :0, a grant of token 0 */
    FAKE_SENTINEL_BAD_PORT, /* a sentinel naming its master at port "abc" */
};

struct fake_server {
    int listen_fd, port;
    enum fake_mode mode;
    pthread_t thread;
    atomic_int stop;
    atomic_int misbehaved; /* connections that got the bad answer */
};

struct fake_conn {
    struct fake_server *fs;
    int fd;
};

static void fake_misbehave(struct fake_server *fs, int fd)
{
    atomic_fetch_add(&fs->misbehaved, 1);
    if (fs->mode == FAKE_HUGE_BULK) {
        static char zeros[64 * 1024];
        const char *head = "$1073741824\r\n";
        if (!tu_send_all(fd, head, strlen(head)))
            return;
        for (size_t sent = 0; sent < (1u << 30) && !atomic_load(&fs->stop); sent += sizeof zeros)
            if (!tu_send_all(fd, zeros, sizeof zeros))
                return;
    } else if (fs->mode == FAKE_TRICKLE) {
        if (!tu_send_all(fd, "$1000\r\n", 7))
            return;
        while (!atomic_load(&fs->stop) && tu_send_all(fd, "x", 1))
            tu_sleep_ms(100);
    } else if (fs->mode == FAKE_ZERO_TOKEN) {
        tu_send_all(fd, ":0\r\n", 4);
    } else if (fs->mode == FAKE_SENTINEL_BAD_PORT) {
        const char *addr = "*2\r\n$9\r\n127.0.0.1\r\n$3\r\nabc\r\n";
        tu_send_all(fd, addr, strlen(addr));
    }
    /* FAKE_CLOSE: the caller closes with the command half read */
}

static void *fake_conn_main(void *arg)
{
    struct fake_conn *fc = arg;
    struct fake_server *fs = fc->fs;
    redisReader *rd = redisReaderCreate();
    char buf[4096];
    bool done = false;
    while (!done && !atomic_load(&fs->stop)) {
        struct pollfd p = {.fd = fc->fd, .events = POLLIN};
        if (poll(&p, 1, 100) <= 0)
            continue;
        ssize_t n = recv(fc->fd, buf, sizeof buf, 0);
        if (n <= 0)
            break;
        redisReaderFeed(rd, buf, (size_t)n);
        void *cmd = NULL;
        while (!done && redisReaderGetReply(rd, &cmd) == REDIS_OK && cmd) {
            redisReply *r = cmd;
            if (r->type == REDIS_REPLY_ARRAY && r->elements >= 2 &&
                strcasecmp(r->element[0]->str, "SCRIPT") == 0) {
                const char *sha = "$40\r\n0123456789012345678901234567890123456789\r\n";
                done = !tu_send_all(fc->fd, sha, strlen(sha));
            } else {
                fake_misbehave(fs, fc->fd);
                done = true;
            }
            freeReplyObject(r);
        }
        if (!done && fs->mode == FAKE_CLOSE && rd->len - rd->pos > 0) {
            /* a command is arriving: close under the writer */
            atomic_fetch_add(&fs->misbehaved, 1);
            done = true;
        }
    }
    redisReaderFree(rd);
    close(fc->fd);
    free(fc);
    return NULL;
}

static void *fake_main(void *arg)
{
    struct fake_server *fs = arg;
    while (!atomic_load(&fs->stop)) {
        struct pollfd p = {.fd = fs->listen_fd, .events = POLLIN};
        if (poll(&p, 1, 100) <= 0)
            continue;
        int fd = accept(fs->listen_fd, NULL, NULL);
        if (fd < 0)
            continue;
        struct fake_conn *fc = malloc(sizeof *fc);
        fc->fs = fs;
        fc->fd = fd;
        tu_thread_detached(fake_conn_main, fc);
    }
    return NULL;
}

static void fake_start(struct fake_server *fs, enum fake_mode mode)
{
    memset(fs, 0, sizeof *fs);
    fs->mode = mode;
    fs->listen_fd = listen_loopback(&fs->port);
    ck_assert_int_eq(pthread_create(&fs->thread, NULL, fake_main, fs), 0);
}

static void fake_stop(struct fake_server *fs)
{
    atomic_store(&fs->stop, 1);
    pthread_join(fs->thread, NULL);
    close(fs->listen_fd);
}

/* An acquire through the fake server in MODE with URL options QUERY: its
 * result code, the message kept in MSG. */
static int acquire_from_fake(struct fake_server *fs, enum fake_mode mode, const char *query,
                             char *msg, size_t msg_len)
{
    fake_start(fs, mode);
    char *url = tu_fmt("redis://127.0.0.1:%d?%s", fs->port, query);
    dlock_client *c = tu_open(url);
    dlock_lock *l = tu_lock(c, "fake");
    int rc = dlock_acquire(l, DLOCK_TRY);
    snprintf(msg, msg_len, "%s", dlock_errmsg());
    dlock_lock_free(l);
    dlock_client_close(c);
    fake_stop(fs);
    free(url);
    return rc;
}

/* A sentinel that names its master's port as "abc" (or 0, or past
 * 65535): an error naming what it said (EPROTO from that sentinel; the
 * open's code is the sentinels' together), not a dial to port 0 (before:
 * atoi made it 0, and the open failed with a refused connection). */
TU_TEST(sentinel_bad_master_port_is_an_error, 60)
{
    struct fake_server fs;
    fake_start(&fs, FAKE_SENTINEL_BAD_PORT);
    char *url = tu_fmt("redis+sentinel://127.0.0.1:%d/m?timeout=5s", fs.port);
    dlock_client *c = NULL;
    int rc = dlock_open(url, &c);
    ck_assert_msg(rc != DLOCK_OK && strstr(dlock_errmsg(), "port 'abc' is no port"),
                  "a sentinel naming port 'abc': %s (%s)", dlock_err_name(rc), dlock_errmsg());
    dlock_client_close(c);
    fake_stop(&fs);
    free(url);
}

/* A server that announces a 1 GiB bulk string and streams it: the reply
 * is cut at the cap with a message saying so, and the client's memory
 * stays far from the gigabyte (hiredis alone would buffer it all). The
 * generous timeout makes the cap, not the clock, end it. */
TU_TEST(huge_reply_is_capped, 60)
{
    struct rusage before, after;
    getrusage(RUSAGE_SELF, &before);
    struct fake_server fs;
    char msg[512];
    int rc = acquire_from_fake(&fs, FAKE_HUGE_BULK, "timeout=50s", msg, sizeof msg);
    getrusage(RUSAGE_SELF, &after);
    ck_assert_msg(rc == DLOCK_ECONN, "%s: %s", dlock_err_name(rc), msg);
    ck_assert_msg(strstr(msg, "a reply larger than") != NULL, "%s", msg);
    long grown_mib = (after.ru_maxrss - before.ru_maxrss) / 1024;
    /* half the announced gigabyte: the cap is 32 MiB, but a sanitizer's
     * quarantine and shadow memory keep what the reader's buffer freed
     * as it grew (~350 MiB under ASan); without the cap the whole
     * gigabyte is buffered */
    ck_assert_msg(grown_mib < 512, "the client's memory grew by %ld MiB on a 1 GiB reply", grown_mib);
}

/* A server that trickles its reply one byte per 100 ms: each byte comes
 * well within the timeout, but the request as a whole does not, and that
 * is what the timeout bounds (hiredis alone would wait forever). */
TU_TEST(trickled_reply_times_out, 60)
{
    struct fake_server fs;
    char msg[512];
    int rc = acquire_from_fake(&fs, FAKE_TRICKLE, "timeout=1s", msg, sizeof msg);
    ck_assert_msg(rc == DLOCK_ECONN, "%s: %s", dlock_err_name(rc), msg);
    ck_assert_msg(strstr(msg, "no reply within") != NULL, "%s", msg);
    ck_assert_int_ge(atomic_load(&fs.misbehaved), 1);
}

/* A server that answers the acquire's script with 0: the script answers
 * a grant with its token, which is never 0 (the counter starts at 1, or
 * from the server's clock), so 0 is a reply dlock's script never gives,
 * not a grant. */
TU_TEST(zero_token_is_no_grant, 60)
{
    struct fake_server fs;
    char msg[512];
    int rc = acquire_from_fake(&fs, FAKE_ZERO_TOKEN, "timeout=5s", msg, sizeof msg);
    ck_assert_msg(rc == DLOCK_EPROTO, "%s: %s", dlock_err_name(rc), msg);
    ck_assert_msg(strstr(msg, "token 0") != NULL, "%s", msg);
    ck_assert_int_ge(atomic_load(&fs.misbehaved), 1);
}

/* A server that closes the connection while a large command is being
 * written to it (an 8 MiB password): in a program with SIGPIPE's default
 * action, the dial fails with DLOCK_ECONN and the program lives. */
TU_TEST(server_closing_mid_write_survived, 60)
{
    struct fake_server fs;
    fake_start(&fs, FAKE_CLOSE);
    pid_t pid = fork_default_sigpipe();
    if (pid == 0) {
        char *url = tu_fmt("redis://127.0.0.1:%d?timeout=10s", fs.port);
        size_t big = 8u << 20;
        char *password = malloc(big + 1);
        memset(password, 'p', big);
        password[big] = 0;
        dlock_client *c = NULL;
        if (dlock_client_new(url, &c) != DLOCK_OK ||
            dlock_client_setopt_str(c, DLOCK_OPT_PASSWORD, password) != DLOCK_OK)
            _exit(2);
        int rc = dlock_client_connect(c);
        if (rc != DLOCK_ECONN) {
            fprintf(stderr, "connect: %s: %s\n", dlock_err_name(rc), dlock_errmsg());
            _exit(3);
        }
        dlock_client_close(c);
        _exit(0);
    }
    assert_child_lived(pid);
    fake_stop(&fs);
    ck_assert_int_ge(atomic_load(&fs.misbehaved), 1);
}

/* A program that keeps SIGPIPE's default action survives a server that
 * closes a pooled connection (FIN, then a reset): the next request's
 * write fails with EPIPE, and the library must neither die of SIGPIPE nor
 * fail the request (it goes again on a fresh connection). In a forked
 * child, so the default action is really the one in force. */
TU_TEST(sigpipe_default_action_survives, 60)
{
    start_server(NULL);
    pid_t pid = fork_default_sigpipe();
    if (pid == 0) {
        struct proxy px;
        proxy_start(&px, srv.port, "pipe");
        char *url = tu_fmt("redis://127.0.0.1:%d", px.r.port);
        dlock_client *c = NULL;
        if (dlock_open(url, &c) != DLOCK_OK)
            _exit(2);
        dlock_lock *l = NULL;
        if (dlock_lock_new(c, "pipe", DLOCK_EXCLUSIVE, 0, &l) != DLOCK_OK)
            _exit(2);
        if (dlock_acquire(l, DLOCK_TRY) != DLOCK_OK || dlock_release(l) != DLOCK_OK)
            _exit(3);
        tu_relay_cut(&px.r, true);
        int rc = dlock_acquire(l, DLOCK_TRY);
        if (rc != DLOCK_OK) {
            fprintf(stderr, "acquire after the reset: %s: %s\n", dlock_err_name(rc), dlock_errmsg());
            _exit(5);
        }
        dlock_release(l);
        dlock_lock_free(l);
        dlock_client_close(c);
        _exit(0);
    }
    assert_child_lived(pid);
    stop_server();
}

/* A busy reply whose TTL is absurd (a server or proxy answering
 * :-9223372036854775808): the waiter's safety-net sleep is clamped, not
 * overflowed into a past time that would make it spin. */
TU_TEST(absurd_busy_reply_is_clamped, 60)
{
    struct tu_solo s = served_open("lease=60s", "spin");
    TU_ACQUIRE_OK(s.l, DLOCK_TRY);
    struct proxy px;
    struct tu_solo via = proxied_open(&px, NULL, NULL, "spin");
    px.r.cf.forged = ":-9223372036854775808\r\n";
    atomic_store(&px.forge_acquire, 1);
    int rc = dlock_acquire(via.l, 500);
    ck_assert_msg(rc == DLOCK_ETIMEDOUT, "%s: %s", dlock_err_name(rc), dlock_errmsg());
    ck_assert_msg(atomic_load(&px.r.forged) <= 4, "%d acquire calls in one 500 ms wait: the sleep "
                  "until the holder's TTL overflowed", atomic_load(&px.r.forged));
    tu_solo_close(&via);
    dlock_release(s.l);
    served_close(&s);
}

/* Fencing tokens keep growing across a restart that loses the data (no
 * persistence): an absent counter starts from the server's clock in
 * microseconds, so the next token is greater than every earlier one. A
 * Redisson-style INCR on the same counter goes on from there. */
TU_TEST(tokens_survive_a_data_losing_restart, 60)
{
    struct tu_solo s = served_open(NULL, "fenced");
    TU_ACQUIRE_OK(s.l, DLOCK_TRY);
    uint64_t t1 = tu_token(s.l);
    ck_assert_int_eq(dlock_release(s.l), DLOCK_OK);
    TU_ACQUIRE_OK(s.l, DLOCK_TRY);
    ck_assert_uint_eq(tu_token(s.l), t1 + 1);
    ck_assert_int_eq(dlock_release(s.l), DLOCK_OK);
    ck_assert(fx_redis_restart(&srv));
    TU_ACQUIRE_OK(s.l, 10000);
    uint64_t t2 = tu_token(s.l);
    ck_assert_msg(t2 > t1 + 1, "token %llu after the restart, %llu before",
                  (unsigned long long)t2, (unsigned long long)t1 + 1);
    ck_assert_msg(t2 < (1ull << 53), "token %llu is past 2^53", (unsigned long long)t2);
    ck_assert_int_eq(dlock_release(s.l), DLOCK_OK);
    redisContext *ctx = raw();
    ck_assert_int_eq(cmd_int(ctx, "INCR %s", "redisson_lock_token:{fenced}"), (long long)t2 + 1);
    redisFree(ctx);
    served_close(&s);
}

/* Every counter dlock keeps on Redis follows the lock's rule: absent (a
 * new name, data lost in a restart) or below 10^15, it goes on from the
 * server's clock in microseconds. Semaphore tokens: 1 2 3, then after a
 * restart without persistence 1 2 again, before the rule reached
 * sem_acquire.lua; and a new name's first token was 1. */
/* K=1 of S within 10 s; a try on a connection the restart closed fails
 * DLOCK_ECONN (a semaphore acquire whose reply is lost is not sent
 * again: its ids go to the cleanup queue), so such a try is made again. */
static dlock_permit *permit_after_restart(dlock_semaphore *s)
{
    dlock_permit *p = NULL;
    int rc = DLOCK_ECONN;
    for (int tries = 0; tries < 20 && rc == DLOCK_ECONN; tries++)
        rc = dlock_semaphore_acquire(s, 1, 10000, NULL, &p);
    ck_assert_msg(rc == DLOCK_OK, "semaphore acquire: %s: %s", dlock_err_name(rc), dlock_errmsg());
    return p;
}

/* A semaphore's token counter that is no number ("<T>abc") is
 * DLOCK_EPROTO naming the key when inspected (status), not read as T
 * (before: strtoull took the digits in front). */
TU_TEST(garbled_semaphore_token_counter_is_an_error, 60)
{
    start_server(NULL);
    dlock_client *c = open_with(NULL);
    dlock_semaphore *s = tu_semaphore(c, "sgar", 2);
    dlock_permit *p = tu_permit(s, 1, DLOCK_TRY);
    redisContext *ctx = raw();
    freeReplyObject(cmd(ctx, "SET %s 7abc", "dlock_sem_token:{sgar}"));
    dlock_info *info = NULL;
    int rc = dlock_semaphore_inspect(c, "sgar", 2, &info);
    ck_assert_msg(rc == DLOCK_EPROTO && strstr(dlock_errmsg(), "dlock_sem_token:{sgar}"),
                  "inspect with a garbled token counter: %s (%s)", dlock_err_name(rc),
                  dlock_errmsg());
    dlock_info_free(info);
    redisFree(ctx);
    dlock_permit_release(p);
    dlock_semaphore_free(s);
    dlock_client_close(c);
}

TU_TEST(semaphore_tokens_survive_a_data_losing_restart, 60)
{
    start_server(NULL);
    dlock_client *c = open_with(NULL);
    dlock_semaphore *s = tu_semaphore(c, "stok", 3);
    uint64_t last = 0;
    for (int round = 0; round < 2; round++) {
        dlock_permit *p[3];
        for (int i = 0; i < 3; i++) {
            p[i] = permit_after_restart(s);
            uint64_t t = 0;
            ck_assert_int_eq(dlock_permit_token(p[i], &t), DLOCK_OK);
            ck_assert_msg(t > last, "round %d permit %d: token %llu after %llu", round, i,
                          (unsigned long long)t, (unsigned long long)last);
            ck_assert_msg(t < (1ull << 53), "token %llu is past 2^53", (unsigned long long)t);
            last = t;
        }
        for (int i = 0; i < 3; i++)
            ck_assert_int_eq(dlock_permit_release(p[i]), DLOCK_OK);
        if (round == 0)
            ck_assert(fx_redis_restart(&srv));
    }
    /* a new name starts above what the other names issued */
    dlock_semaphore *fresh = tu_semaphore(c, "snew", 2);
    dlock_permit *p = tu_permit(fresh, 1, DLOCK_TRY);
    uint64_t t = 0;
    ck_assert_int_eq(dlock_permit_token(p, &t), DLOCK_OK);
    ck_assert_msg(t > last, "new semaphore: first token %llu, %llu issued before",
                  (unsigned long long)t, (unsigned long long)last);
    ck_assert_int_eq(dlock_permit_release(p), DLOCK_OK);
    dlock_semaphore_free(fresh);
    dlock_semaphore_free(s);
    dlock_client_close(c);
    stop_server();
}

/* The leader's token is the lock's token counter; the value hash keeps
 * the token and version its writer had. A counter or hash field that is
 * no number ("<T>abc", left by a broken server or another writer of the
 * keys) is DLOCK_EPROTO naming the election and the field, not read as T (before: strtoull
 * took the digits in front, and the leader was reported with token T). */
TU_TEST(garbled_leader_numbers_are_an_error, 60)
{
    start_server(NULL);
    dlock_client *c = open_with(NULL);
    dlock_election *e = NULL;
    ck_assert_int_eq(dlock_election_new(c, "gled", 0, &e), DLOCK_OK);
    ck_assert_int_eq(dlock_election_campaign(e, "v", 10000, NULL), DLOCK_OK);
    uint64_t t = 0;
    ck_assert_int_eq(dlock_election_token(e, &t), DLOCK_OK);
    redisContext *ctx = raw();
    const char *garble[][3] = {
        {"SET", "redisson_lock_token:{gled}", "abc"},
        {"HSET", "dlock_leader:{gled}", "token"},
        {"HSET", "dlock_leader:{gled}", "version"},
    };
    for (size_t i = 0; i < sizeof garble / sizeof *garble; i++) {
        char *keep = NULL;
        if (!strcmp(garble[i][0], "SET")) {
            freeReplyObject(cmd(ctx, "SET %s %llu%s", garble[i][1], (unsigned long long)t,
                                garble[i][2]));
        } else {
            redisReply *old = cmd(ctx, "HGET %s %s", garble[i][1], garble[i][2]);
            keep = old->type == REDIS_REPLY_STRING ? strdup(old->str) : NULL;
            freeReplyObject(old);
            ck_assert_msg(keep, "no field %s in %s", garble[i][2], garble[i][1]);
            freeReplyObject(cmd(ctx, "HSET %s %s %sabc", garble[i][1], garble[i][2], keep));
        }
        dlock_leader *l = NULL;
        int rc = dlock_election_leader(c, "gled", &l);
        ck_assert_msg(rc == DLOCK_EPROTO && strstr(dlock_errmsg(), "'gled'") &&
                          strstr(dlock_errmsg(), "not a number"),
                      "leader with %s %s garbled: %s (%s)", garble[i][1],
                      garble[i][2] ? garble[i][2] : "", dlock_err_name(rc), dlock_errmsg());
        dlock_leader_free(l);
        if (keep) /* mended for the next round */
            freeReplyObject(cmd(ctx, "HSET %s %s %s", garble[i][1], garble[i][2], keep));
        else
            freeReplyObject(cmd(ctx, "SET %s %llu", garble[i][1], (unsigned long long)t));
        free(keep);
    }
    redisFree(ctx);
    dlock_election_resign(e);
    dlock_election_free(e);
    dlock_client_close(c);
}

/* The version of an election's value, the same rule: it went on from 1
 * after a data-losing restart (and began at 1), so a reader that kept a
 * version saw the same number again for another value. */
TU_TEST(election_versions_survive_a_data_losing_restart, 60)
{
    start_server(NULL);
    dlock_client *c = open_with(NULL);
    uint64_t last = 0;
    for (int round = 0; round < 2; round++) {
        dlock_election *e = NULL;
        ck_assert_int_eq(dlock_election_new(c, "ever", 0, &e), DLOCK_OK);
        ck_assert_int_eq(dlock_election_campaign(e, "a", 10000, NULL), DLOCK_OK);
        for (int i = 0; i < 2; i++) {
            if (i)
                ck_assert_int_eq(dlock_election_proclaim(e, "b"), DLOCK_OK);
            dlock_leader *l = NULL;
            ck_assert_int_eq(dlock_election_leader(c, "ever", &l), DLOCK_OK);
            uint64_t v = dlock_leader_version(l);
            ck_assert_msg(v > last, "round %d write %d: version %llu after %llu", round, i,
                          (unsigned long long)v, (unsigned long long)last);
            ck_assert_msg(v < (1ull << 53), "version %llu is past 2^53", (unsigned long long)v);
            last = v;
            dlock_leader_free(l);
        }
        if (round == 0) {
            ck_assert(fx_redis_restart(&srv));
            dlock_election_resign(e); /* its lock went with the data */
        } else {
            ck_assert_int_eq(dlock_election_resign(e), DLOCK_OK);
        }
        dlock_election_free(e);
    }
    dlock_client_close(c);
    stop_server();
}

/* Token arithmetic at the edges of the counter, in both layouts: tokens
 * of 15 digits and more are written exactly (Lua formats 1e14 as
 * "1e+14"); a counter past 2^53 (where Lua numbers stop being exact and
 * tokens would repeat) is a clear error with nothing written; a negative
 * counter never leaves a hold written but reported as busy. */
static void token_edges(const char *layout)
{
    start_server(NULL);
    char *q = tu_fmt("layout=%s", layout);
    dlock_client *c = open_with(q);
    redisContext *ctx = raw();
    bool simple = strcmp(layout, "simple") == 0;

    freeReplyObject(cmd(ctx, "SET %s 99999999999999", "redisson_lock_token:{big}"));
    dlock_lock *l = tu_lock(c, "big");
    TU_ACQUIRE_OK(l, DLOCK_TRY);
    uint64_t t = tu_token(l);
    ck_assert_uint_ge(t, 100000000000000ull);
    if (simple) {
        char *v = reply_str(cmd(ctx, "GET big"));
        char *suffix = tu_fmt(":%llu", (unsigned long long)t);
        ck_assert_msg(v && strlen(v) > strlen(suffix) && strcmp(v + strlen(v) - strlen(suffix), suffix) == 0,
                      "value '%s' does not end in '%s'", v ? v : "(nil)", suffix);
        free(v);
        free(suffix);
    }
    ck_assert_int_eq(dlock_release(l), DLOCK_OK);
    dlock_lock_free(l);

    freeReplyObject(cmd(ctx, "SET %s 9007199254740993", "redisson_lock_token:{huge}"));
    l = tu_lock(c, "huge");
    int rc = dlock_acquire(l, DLOCK_TRY);
    ck_assert_msg(rc == DLOCK_EBACKEND, "counter past 2^53: %s: %s", dlock_err_name(rc), dlock_errmsg());
    ck_assert_msg(strstr(dlock_errmsg(), "2^53") && strstr(dlock_errmsg(), "redisson_lock_token:{huge}"),
                  "%s", dlock_errmsg());
    ck_assert_int_eq(cmd_int(ctx, "EXISTS huge"), 0);
    dlock_lock_free(l);

    freeReplyObject(cmd(ctx, "SET %s -5", "redisson_lock_token:{neg}"));
    l = tu_lock(c, "neg");
    rc = dlock_acquire(l, DLOCK_TRY);
    if (rc == DLOCK_OK) {
        ck_assert_uint_gt(tu_token(l), 0);
        ck_assert_int_eq(dlock_release(l), DLOCK_OK);
    }
    ck_assert_msg(cmd_int(ctx, "EXISTS neg") == 0, "a hold was left written (acquire said %s)",
                  dlock_err_name(rc));
    dlock_lock_free(l);
    redisFree(ctx);
    dlock_client_close(c);
    free(q);
    stop_server();
}

TU_TEST(token_edges_redisson_layout, 60)
{
    token_edges("redisson");
}

TU_TEST(token_edges_simple_layout, 60)
{
    token_edges("simple");
}

/* force release, status and list act only on keys of a lock's shape:
 * every hash field "<uuid>:<digits>" (redisson), a value
 * "<uuid>:<tid>:<token>" (simple). An application's hash or string is
 * left alone and its value never shown as a holder. */
TU_TEST(force_status_list_touch_only_locks, 60)
{
    redisContext *ctx = served_raw();
    freeReplyObject(cmd(ctx, "HSET user:1000 name alice age 30"));
    freeReplyObject(cmd(ctx, "SET app:config secret-value"));
    freeReplyObject(cmd(ctx, "SET app:cache secret-cached PX 60000"));
    for (int simple = 0; simple < 2; simple++) {
        dlock_client *c = open_with(simple ? "layout=simple" : "");
        const char *name = simple ? "app:config" : "user:1000";
        int rc = dlock_force_release(c, name);
        ck_assert_msg(rc == DLOCK_EWRONGTYPE, "force on %s: %s: %s", name, dlock_err_name(rc),
                      dlock_errmsg());
        ck_assert_int_eq(cmd_int(ctx, "EXISTS %s", name), 1);
        dlock_info *info = NULL;
        rc = dlock_inspect(c, name, &info);
        if (rc == DLOCK_OK) {
            for (size_t i = 0; i < dlock_info_holder_count(info); i++) {
                const char *who = dlock_info_holder(info, i, NULL);
                ck_assert_msg(!strstr(who, "secret") && !strstr(who, "alice") && strcmp(who, "name") != 0,
                              "status shows '%s' as a holder", who);
            }
            dlock_info_free(info);
        } else {
            ck_assert_int_eq(rc, DLOCK_EWRONGTYPE);
        }
        char *all = tu_list_text(c, NULL, ",");
        ck_assert_msg(!strstr(all, "app:") && !strstr(all, "user:"), "list shows '%s'", all);
        /* a real lock is still forced, listed and shown */
        dlock_lock *l = tu_lock(c, "real");
        TU_ACQUIRE_OK(l, DLOCK_TRY);
        free(all);
        all = tu_list_text(c, NULL, ",");
        ck_assert_str_eq(all, "real,");
        free(all);
        ck_assert_int_eq(dlock_force_release(c, "real"), DLOCK_OK);
        ck_assert_int_eq(cmd_int(ctx, "EXISTS real"), 0);
        dlock_lock_free(l);
        dlock_client_close(c);
    }
    served_raw_close(ctx);
}

/* Names that fall in dlock's own key space (another lock's token counter,
 * channel or cancellation record) are refused, naming the space. */
TU_TEST(own_key_space_names_refused, 60)
{
    struct tu_solo s = served_open(NULL, "x");
    TU_ACQUIRE_OK(s.l, DLOCK_TRY);
    uint64_t t = tu_token(s.l);
    redisContext *ctx = raw();
    const char *names[] = {"redisson_lock_token:{x}", "redisson_lock__channel:{x}", "dlock_canceled:{x}"};
    for (size_t i = 0; i < 3; i++) {
        int rc = dlock_force_release(s.c, names[i]);
        ck_assert_msg(rc == DLOCK_EINVAL, "force %s: %s: %s", names[i], dlock_err_name(rc), dlock_errmsg());
        ck_assert_msg(strstr(dlock_errmsg(), names[i]) != NULL, "%s", dlock_errmsg());
        dlock_info *info = NULL;
        ck_assert_int_eq(dlock_inspect(s.c, names[i], &info), DLOCK_EINVAL);
        dlock_lock *l = tu_lock(s.c, names[i]);
        ck_assert_int_eq(dlock_acquire(l, DLOCK_TRY), DLOCK_EINVAL);
        dlock_lock_free(l);
    }
    ck_assert_int_eq(cmd_int(ctx, "GET %s", "redisson_lock_token:{x}"), (long long)t);
    /* with a prefix, the key is prefix + name */
    dlock_client *p = open_with("prefix=redisson_lock_token:");
    ck_assert_int_eq(dlock_force_release(p, "{x}"), DLOCK_EINVAL);
    ck_assert_int_eq(cmd_int(ctx, "GET %s", "redisson_lock_token:{x}"), (long long)t);
    dlock_client_close(p);
    ck_assert_int_eq(dlock_release(s.l), DLOCK_OK);
    redisFree(ctx);
    served_close(&s);
}

/* Names that would be, or share, the keys dlock derives from another
 * name are refused by every primitive, naming the name and why, with
 * nothing written: a lock named dlock_sem_token:{smz} was semaphore smz's
 * counter (whose acquire then failed after it had taken a permit), a lock
 * named dlock_leader:{elz} shared one hash with election elz, and
 * semaphores x and {x} shared {x}:timeout (as locks x and {x} shared
 * redisson_lock_token:{x}), and a lock named dlock_guarded:{g}:k would
 * be guarded key k of lock g. Names merely like them are taken. */
TU_TEST(names_aliasing_derived_keys_refused, 60)
{
    start_server(NULL);
    dlock_client *c = open_with(NULL);
    redisContext *ctx = raw();
    const char *refused[] = {
        "dlock_sem_token:{smz}", "dlock_sem_released:{smz}", "redisson_sc:{smz}",
        "{smz}:timeout", "a{b}:timeout", "dlock_leader:{elz}", "dlock_leader__channel:{elz}",
        "dlock_fair_queue:{f}", "dlock_fair_waiters:{f}", "dlock_fair__channel:u",
        "dlock_client:u",
        "{rw}:0b7e5d64-6f1c-4c6a-9d41-1d7f3f3c8a21:1:rwlock_timeout:1", "{x}", "{x}}",
        "{x}y}", "redisson_lock_token:{x}", "dlock_name:{x}", "dlock_guarded:{g}:k"};
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        const char *n = refused[i];
        dlock_lock *l = tu_lock(c, n);
        int rc = dlock_acquire(l, DLOCK_TRY);
        ck_assert_msg(rc == DLOCK_EINVAL && strstr(dlock_errmsg(), n), "lock '%s': %s: %s", n,
                      dlock_err_name(rc), dlock_errmsg());
        dlock_lock_free(l);
        dlock_semaphore *sem = tu_semaphore(c, n, 2);
        dlock_permit *p = NULL;
        rc = dlock_semaphore_acquire(sem, 1, DLOCK_TRY, NULL, &p);
        ck_assert_msg(rc == DLOCK_EINVAL && strstr(dlock_errmsg(), n), "semaphore '%s': %s: %s",
                      n, dlock_err_name(rc), dlock_errmsg());
        dlock_info *info = NULL;
        ck_assert_int_eq(dlock_semaphore_inspect(c, n, 2, &info), DLOCK_EINVAL);
        dlock_semaphore_free(sem);
        dlock_election *e = NULL;
        ck_assert_int_eq(dlock_election_new(c, n, 0, &e), DLOCK_OK);
        rc = dlock_election_campaign(e, "v", DLOCK_TRY, NULL);
        ck_assert_msg(rc == DLOCK_EINVAL, "election '%s': %s: %s", n, dlock_err_name(rc),
                      dlock_errmsg());
        dlock_election_free(e);
        ck_assert_msg(cmd_int(ctx, "DBSIZE") == 0, "'%s' wrote a key", n);
    }
    const char *taken[] = {"job:timeout", "a{b}", "{a}b", "x", "x}", "dlock_semx", "x:{y}z"};
    for (size_t i = 0; i < sizeof taken / sizeof taken[0]; i++) {
        dlock_lock *l = tu_lock(c, taken[i]);
        TU_ACQUIRE_OK(l, DLOCK_TRY);
        ck_assert_int_eq(dlock_release(l), DLOCK_OK);
        dlock_lock_free(l);
        dlock_semaphore *sem = tu_semaphore(c, taken[i], 2);
        dlock_permit *p = tu_permit(sem, 1, DLOCK_TRY);
        ck_assert_int_eq(dlock_permit_release(p), DLOCK_OK);
        dlock_semaphore_free(sem);
    }
    /* a token counter that cannot count fails the acquire before any
     * permit is taken */
    freeReplyObject(cmd(ctx, "HSET %s a 1", "dlock_sem_token:{smz}"));
    dlock_semaphore *sem = tu_semaphore(c, "smz", 2);
    dlock_permit *p = NULL;
    int rc = dlock_semaphore_acquire(sem, 1, DLOCK_TRY, NULL, &p);
    ck_assert_msg(rc != DLOCK_OK, "acquire took a permit");
    dlock_info *info = NULL;
    ck_assert_int_eq(dlock_semaphore_inspect(c, "smz", 2, &info), DLOCK_OK);
    ck_assert_int_eq(dlock_info_free_permits(info), 2);
    dlock_info_free(info);
    dlock_semaphore_free(sem);
    redisFree(ctx);
    dlock_client_close(c);
    stop_server();
}

/* A semaphore and a lock of one name share its key, as in Redisson (one
 * name, one object): each refuses the other as the wrong type, with
 * nothing written. The simple layout's lock value is a string too, which
 * the semaphore took for its count (a Lua error, DLOCK_EBACKEND). */
TU_TEST(semaphore_refuses_a_simple_lock_of_its_name, 60)
{
    start_server(NULL);
    dlock_client *c = open_with("layout=simple");
    dlock_lock *l = tu_lock(c, "shared");
    TU_ACQUIRE_OK(l, DLOCK_TRY);
    redisContext *ctx = raw();
    char *before = reply_str(cmd(ctx, "GET shared"));
    dlock_semaphore *sem = tu_semaphore(c, "shared", 2);
    dlock_permit *p = NULL;
    int rc = dlock_semaphore_acquire(sem, 1, DLOCK_TRY, NULL, &p);
    ck_assert_msg(rc == DLOCK_EWRONGTYPE, "%s: %s", dlock_err_name(rc), dlock_errmsg());
    char *after = reply_str(cmd(ctx, "GET shared"));
    ck_assert_str_eq(after, before);
    ck_assert_int_eq(cmd_int(ctx, "EXISTS %s", "{shared}:timeout"), 0);
    dlock_info *info = NULL;
    rc = dlock_semaphore_inspect(c, "shared", 2, &info);
    ck_assert_msg(rc == DLOCK_EWRONGTYPE, "inspect: %s: %s", dlock_err_name(rc), dlock_errmsg());
    free(before);
    free(after);
    dlock_semaphore_free(sem);
    TU_RELEASE_OK(l);
    dlock_lock_free(l);
    redisFree(ctx);
    dlock_client_close(c);
    stop_server();
}

/* The reply of an acquire or release lost to a timeout (CLIENT PAUSE
 * holds the scripts on the server longer than the client's operation
 * timeout): the first attempt spent the call's budget, so the call fails
 * DLOCK_ECONN rather than trying again past its timeout, and nothing is
 * double-counted: the owner's next acquire sends the cancel it owes
 * first and then holds the name once, with the token the counter shows. */
TU_TEST(timed_out_replies_fail_cleanly, 60)
{
    struct tu_solo s = served_open("timeout=500ms&lease=10s", "amb");
    redisContext *ctx = raw();
    freeReplyObject(cmd(ctx, "CLIENT PAUSE 650 WRITE"));
    int rc = dlock_acquire(s.l, DLOCK_TRY);
    ck_assert_msg(rc == DLOCK_ECONN, "acquire: %s: %s", dlock_err_name(rc), dlock_errmsg());
    TU_ACQUIRE_OK(s.l, 10000);
    uint64_t t = tu_token(s.l);
    tu_sleep_ms(300); /* let any duplicate run */
    ck_assert_int_eq(cmd_int(ctx, "GET %s", "redisson_lock_token:{amb}"), (long long)t);
    ck_assert_int_eq(owner_count(ctx, "amb"), 1);

    freeReplyObject(cmd(ctx, "CLIENT PAUSE 650 WRITE"));
    rc = dlock_release(s.l);
    ck_assert_msg(rc == DLOCK_ECONN, "release: %s: %s", dlock_err_name(rc), dlock_errmsg());
    redisFree(ctx);
    served_close(&s);
}

/* Connections the server accepted so far (INFO stats), asked on a fresh
 * connection of its own: it is accepted after every connection the
 * kernel queued before it, so those are counted too. */
static long long connections_received(void)
{
    redisContext *ctx = raw();
    long long n = info_number(ctx, "stats", "total_connections_received");
    ck_assert_msg(n >= 0, "INFO stats has no total_connections_received");
    redisFree(ctx);
    return n;
}

/* A server that stops answering (SIGSTOP, every thread stopped) under a
 * call with no deadline of its own (a release): the call gets one op
 * timeout in all. Its lost reply is not sent again on a fresh connection
 * with a fresh timeout (which made a call take twice its timeout): the
 * retry shares the call's budget, which the first attempt spent. Seen
 * without timing: the stopped server's kernel accepts a retry's connect,
 * so the server counts it once continued; here it counts only the
 * connection that asks. */
TU_TEST(stalled_server_costs_one_op_timeout, 60)
{
    struct tu_solo s = served_open("timeout=1s&lease=60s", "stall");
    TU_ACQUIRE_OK(s.l, DLOCK_TRY); /* an idle pooled connection for the release */
    long long before = connections_received();
    tu_pause(srv.pid);
    int64_t t0 = tu_mono_ms();
    int rc = dlock_release(s.l);
    int64_t took = tu_mono_ms() - t0;
    char msg[512];
    snprintf(msg, sizeof msg, "%s", dlock_errmsg());
    kill(srv.pid, SIGCONT);
    fprintf(stderr, "stalled_server_costs_one_op_timeout: the release returned after %lld ms "
                    "(timeout 1 s)\n", (long long)took); /* informational */
    ck_assert_msg(rc == DLOCK_ECONN, "release: %s: %s", dlock_err_name(rc), msg);
    ck_assert_msg(strstr(msg, "no reply within") != NULL, "%s", msg);
    long long dialed = connections_received() - before - 1; /* (the asking one) */
    ck_assert_msg(dialed == 0, "the stalled release dialed %lld more connection(s): a retry "
                               "with a timeout of its own", dialed);
    served_close(&s);
}

/* Keep the server busy MS ms in a script sent on a connection of its
 * own (returned, to free), and wait until it runs: a PING on a fresh
 * connection gets no answer within 100 ms. */
static redisContext *server_busy(int ms)
{
    redisContext *busy = raw();
    redisAppendCommand(busy, "EVAL %s 0 %d",
                       "local t = redis.call('time') local t0 = t[1] * 1000000 + t[2] "
                       "repeat t = redis.call('time') until t[1] * 1000000 + t[2] - t0 > ARGV[1] * 1000 "
                       "return 1", ms);
    int done = 0;
    while (!done)
        ck_assert_int_eq(redisBufferWrite(busy, &done), REDIS_OK);
    for (int i = 0; i < 200; i++) {
        redisContext *p = raw();
        struct timeval tv = {0, 100000};
        redisSetTimeout(p, tv);
        redisReply *r = redisCommand(p, "PING");
        bool answered = r != NULL;
        freeReplyObject(r);
        redisFree(p);
        if (!answered)
            return busy;
    }
    ck_abort_msg("the server never got busy");
    return busy;
}

/* A writer's wait (default layout) that ends while the server is stalled
 * returns at its end, not when the server answers: its "unwait" (its
 * record in the writers key goes, readers behind it come in) is sent
 * within what is left of the wait, here nothing, and owed to the keeper,
 * which sends it once the server is back. With CANCEL the wait (forever)
 * is canceled once the server stalls, and nothing is left either: the
 * caller asked to stop now. */
static void writer_gives_up_on_a_stalled_server(bool cancel)
{
    struct tu_solo s = served_open("timeout=20s&lease=60s", "uw");
    TU_ACQUIRE_OK(s.l, DLOCK_TRY);
    dlock_client *b = open_with("timeout=20s&lease=60s");
    dlock_lock *lb = tu_lock(b, "uw");
    redisContext *ctx = raw();
    struct tu_waiter wb;
    tu_waiter_start(&wb, lb, cancel ? DLOCK_FOREVER : 1500);
    ck_assert_msg(writers_become(ctx, "uw", 1), "the waiting writer was never recorded");
    ck_assert(tu_wait_thread_asleep(&wb.tid, 60000)); /* its next try is at the wait's end */
    redisContext *busy = server_busy(4500);
    if (cancel)
        ck_assert_int_eq(dlock_lock_cancel(lb), DLOCK_OK);
    int rc = tu_waiter_join(&wb);
    redisContext *p = raw();
    struct timeval tv = {0, 200000};
    redisSetTimeout(p, tv);
    redisReply *r = redisCommand(p, "PING");
    bool stalled = r == NULL;
    freeReplyObject(r);
    redisFree(p);
    ck_assert_int_eq(rc, cancel ? DLOCK_ECANCELED : DLOCK_ETIMEDOUT);
    ck_assert_msg(stalled, "the %s returned only once the stalled server answered",
                  cancel ? "canceled wait" : "1.5 s wait");
    redisReply *done = NULL;
    ck_assert_int_eq(redisGetReply(busy, (void **)&done), REDIS_OK); /* the server is back */
    freeReplyObject(done);
    redisFree(busy);
    ck_assert_msg(writers_become(ctx, "uw", 0), "the keeper never sent the owed unwait");
    redisFree(ctx);
    dlock_lock_free(lb);
    dlock_client_close(b);
    served_close(&s);
}

/* (The unwait was sent in the caller's thread with the op timeout: a
 * 1.5 s wait returned once the stalled server answered.) */
TU_TEST(writer_wait_ends_on_time_on_a_stalled_server, 60)
{
    writer_gives_up_on_a_stalled_server(false);
}

/* (The unwait of a canceled wait was sent in the caller's thread within
 * what was left of a wait forever, the op timeout: the cancel returned
 * once the stalled server answered, 4.5 s later.) */
TU_TEST(canceled_writer_wait_ends_on_a_stalled_server, 60)
{
    writer_gives_up_on_a_stalled_server(true);
}

/* The reply of a downgrade lost after the script ran (the proxy drops it
 * and closes the connection): the script ran (mode "read", readers
 * woken), so the hold is shared now, whatever the retry finds; reporting
 * it lost, or keeping it exclusive, would leave a holder believing the
 * wrong thing while readers come in. */
TU_TEST(lost_downgrade_reply, 60)
{
    struct proxy px;
    struct tu_solo s = layout_proxied(&px, "redisson", "dg");
    dlock_lock *r = tu_lock_mode(s.c, "dg", DLOCK_SHARED, 0);
    TU_ACQUIRE_OK(s.l, DLOCK_TRY);
    TU_ACQUIRE_OK(r, DLOCK_TRY);
    uint64_t t = tu_token(s.l);
    redisContext *ctx = raw();
    atomic_store(&px.drop_downgrade, 1);
    int rc = dlock_release(s.l); /* the last write level: a downgrade */
    ck_assert_msg(rc == DLOCK_OK, "downgrade: %s: %s", dlock_err_name(rc), dlock_errmsg());
    ck_assert_int_eq(atomic_load(&px.drop_downgrade), 0); /* the fault did happen */
    ck_assert_uint_eq(dlock_hold_count(r), 1);
    ck_assert_uint_eq(tu_token(r), t);
    char *mode = reply_str(cmd(ctx, "HGET %s mode", "dg"));
    ck_assert_str_eq(mode, "read");
    free(mode);
    dlock_client *b = open_with(NULL);
    dlock_lock *rb = tu_lock_mode(b, "dg", DLOCK_SHARED, 0);
    tu_acquire_release(rb, DLOCK_TRY); /* a reader comes in beside us */
    ck_assert_int_eq(dlock_release(r), DLOCK_OK);
    ck_assert_int_eq(cmd_int(ctx, "EXISTS dg"), 0);
    dlock_lock_free(rb);
    dlock_client_close(b);
    dlock_lock_free(r);
    redisFree(ctx);
    tu_solo_close(&s);
    stop_server();
}

/* A downgrade with no reply at all (the server busy past the call's budget)
 * may have run: the hold is given up (DLOCK_ELOST), never kept as an
 * exclusive hold while readers come in; and its release, exclusive, keeps
 * the readers that did come in (a hash in read mode with another reader's
 * field, as such a downgrade leaves it). */
TU_TEST(unanswered_downgrade_gives_up, 60)
{
    struct tu_solo s = served_open("timeout=500ms&lease=10s", "dg");
    dlock_lock *r = tu_lock_mode(s.c, "dg", DLOCK_SHARED, 0);
    TU_ACQUIRE_OK(s.l, DLOCK_TRY);
    TU_ACQUIRE_OK(r, DLOCK_TRY);
    redisContext *ctx = raw(), *busy = server_busy(1500);
    int rc = dlock_release(s.l);
    ck_assert_msg(rc == DLOCK_ELOST, "downgrade: %s: %s", dlock_err_name(rc), dlock_errmsg());
    ck_assert_uint_eq(dlock_hold_count(r), 0);
    ck_assert_uint_eq(dlock_hold_count(s.l), 0);
    redisFree(busy);
    freeReplyObject(cmd(ctx, "PING")); /* answered once the server is free again */
    /* What a downgrade whose reply was lost leaves, a reader joined. */
    dlock_lock *w = tu_lock_mode(s.c, "dg2", DLOCK_EXCLUSIVE, 0);
    TU_ACQUIRE_OK(w, DLOCK_TRY);
    freeReplyObject(cmd(ctx, "HSET dg2 mode read other:1 1"));
    ck_assert_int_eq(dlock_release(w), DLOCK_OK);
    ck_assert_int_eq(cmd_int(ctx, "HEXISTS dg2 other:1"), 1);
    TU_FREE_LOCKS(w, r);
    redisFree(ctx);
    served_close(&s);
}

/* A multi-lock's release whose first reply is lost (the proxy drops it
 * after the server ran it, and closes the connection) is sent once more,
 * as a single release is: every member then found free with our token
 * still its last counts as released by the first attempt, DLOCK_OK, and
 * nothing of the set is left. */
TU_TEST(multi_release_lost_reply_retried, 60)
{
    struct proxy px;
    struct tu_solo via = layout_proxied(&px, "redisson", "mr-a");
    px.needle = "redisson_lock__channel:{mr-b}"; /* only the set's release names it */
    redisContext *ctx = raw();
    const char *names[] = {"mr-a", "mr-b", "mr-c"};
    dlock_multi *m = NULL;
    ck_assert_int_eq(dlock_multi_new(via.c, names, 3, DLOCK_EXCLUSIVE, 0, &m), DLOCK_OK);
    ck_assert_msg(dlock_multi_acquire(m, DLOCK_TRY, NULL) == DLOCK_OK, "%s", dlock_errmsg());
    atomic_store(&px.drop_named, 1);
    int rc = dlock_multi_release(m);
    ck_assert_int_eq(atomic_load(&px.drop_named), 0); /* the fault did happen */
    ck_assert_msg(rc == DLOCK_OK, "release: %s: %s", dlock_err_name(rc), dlock_errmsg());
    for (size_t k = 0; k < 3; k++)
        ck_assert_int_eq(cmd_int(ctx, "EXISTS %s", names[k]), 0);
    dlock_multi_free(m);
    redisFree(ctx);
    tu_solo_close(&via);
    stop_server();
}

struct busy_later {
    int after_ms, busy_ms;
};

static void *busy_later_main(void *arg)
{
    struct busy_later *b = arg;
    tu_sleep_ms(b->after_ms);
    redisFree(server_busy(b->busy_ms));
    return NULL;
}

/* A permit release whose first reply is lost (the proxy drops it after
 * the server ran it, and closes the connection) is sent once more; a retry
 * that removes nothing must tell why. Its own first attempt gave the ids
 * back: the server remembers that release (dlock_sem_released:{NAME}),
 * DLOCK_OK. The ids were removed by another hand while the permit was
 * valid: nothing remembered, DLOCK_ELOST (it was DLOCK_OK for any retry
 * that removed nothing). */
TU_TEST(sem_release_retry_tells_lost, 60)
{
    struct proxy px;
    struct tu_solo via = layout_proxied(&px, "redisson", "rr");
    px.needle = "redisson_sc:{rr}"; /* set just before a release: its call */
    redisContext *ctx = raw();
    dlock_semaphore *s = NULL;
    ck_assert_int_eq(dlock_semaphore_new(via.c, "rr", 2, 0, &s), DLOCK_OK);
    /* 0: nothing removed; 1: the permit's id; 2: one of a 2-permit's ids
     * (the first attempt gave the other back: that partial release is
     * not remembered, it was taken for ours, DLOCK_OK) */
    for (int removed_by_another = 0; removed_by_another < 3; removed_by_another++) {
        dlock_permit *p = NULL;
        unsigned k = removed_by_another == 2 ? 2 : 1;
        ck_assert_int_eq(dlock_semaphore_acquire(s, k, DLOCK_TRY, NULL, &p), DLOCK_OK);
        if (removed_by_another)
            ck_assert_int_eq(cmd_int(ctx, "ZREMRANGEBYRANK {rr}:timeout 0 0"), 1);
        atomic_store(&px.drop_named, 1);
        int rc = dlock_permit_release(p);
        ck_assert_int_eq(atomic_load(&px.drop_named), 0); /* the fault did happen */
        ck_assert_msg(rc == (removed_by_another ? DLOCK_ELOST : DLOCK_OK), "release%s: %s: %s",
                      removed_by_another ? " of removed ids" : "", dlock_err_name(rc),
                      dlock_errmsg());
        ck_assert_int_eq(cmd_int(ctx, "ZCARD {rr}:timeout"), 0);
        if (removed_by_another) /* the removed id's permit, back in the count */
            ck_assert_int_eq(cmd_int(ctx, "INCRBY rr 1"), 2);
    }
    dlock_semaphore_free(s);
    redisFree(ctx);
    tu_solo_close(&via);
    stop_server();
}

/* A waiting semaphore acquire whose try reached the server but got no
 * reply (server busy past the timeout) tries again with new permit ids:
 * reusing the ids would take the permits twice under one id set (the
 * free count off for good: every acquire then refused as another count)
 * and the cleanup queued for the lost try would give back the permit
 * this acquire returned. Checked on what the server ran (MONITOR): no
 * two acquire scripts with the same ids; then the count still adds up. */
TU_TEST(sem_wait_lost_reply_new_ids, 60)
{
    char *url = served_url("timeout=500ms");
    dlock_client *a = tu_open(url), *b = tu_open(url);
    dlock_semaphore *sa = NULL, *sb = NULL;
    ck_assert_int_eq(dlock_semaphore_new(a, "lr", 2, 0, &sa), DLOCK_OK);
    ck_assert_int_eq(dlock_semaphore_new(b, "lr", 2, 0, &sb), DLOCK_OK);
    ck_assert_int_eq(dlock_semaphore_set_lease(sb, 2000, DLOCK_LEASE_FIXED), DLOCK_OK);
    dlock_permit *pb = NULL, *pa = NULL;
    ck_assert_int_eq(dlock_semaphore_acquire(sb, 2, DLOCK_TRY, NULL, &pb), DLOCK_OK);
    /* A's wait tries again when B's permits expire (2 s): the server is
     * busy from 250 ms before that until 650 ms after. */
    struct busy_later bl = {1750, 900};
    pthread_t th;
    redisContext *mon = raw();
    freeReplyObject(cmd(mon, "MONITOR"));
    pthread_create(&th, NULL, busy_later_main, &bl);
    int rc = dlock_semaphore_acquire(sa, 1, 20000, NULL, &pa);
    pthread_join(th, NULL);
    ck_assert_msg(rc == DLOCK_OK, "acquire: %s: %s", dlock_err_name(rc), dlock_errmsg());
    /* Every acquire script the server ran had ids of its own: the last
     * argument (the id prefix) of those that name the token key. */
    redisContext *marker = raw();
    freeReplyObject(cmd(marker, "PING")); /* a marker: all before it are in */
    redisFree(marker);
    char *prefixes[64];
    size_t np = 0;
    for (;;) {
        redisReply *r = NULL;
        ck_assert_int_eq(redisGetReply(mon, (void **)&r), REDIS_OK);
        bool end = r->type == REDIS_REPLY_STATUS && strstr(r->str, "\"PING\"");
        const char *last = r->type == REDIS_REPLY_STATUS && strstr(r->str, "dlock_sem_token:{lr}") &&
                                   strstr(r->str, "\"EVALSHA\"")
                               ? strrchr(r->str, ' ')
                               : NULL;
        if (last && np < 64)
            prefixes[np++] = strdup(last);
        freeReplyObject(r);
        if (end)
            break;
    }
    for (size_t i = 0; i < np; i++)
        for (size_t j = i + 1; j < np; j++)
            ck_assert_msg(strcmp(prefixes[i], prefixes[j]) != 0,
                          "two acquire scripts ran with the ids %s", prefixes[i]);
    for (size_t i = 0; i < np; i++)
        free(prefixes[i]);
    redisFree(mon);
    /* Once the lost try's ids are given back: one of two permits held. */
    long free_permits = -2;
    for (int i = 0; i < 200 && free_permits != 1; i++) {
        dlock_info *info = NULL;
        rc = dlock_semaphore_inspect(b, "lr", 2, &info);
        ck_assert_msg(rc == DLOCK_OK, "inspect: %s: %s", dlock_err_name(rc), dlock_errmsg());
        free_permits = dlock_info_free_permits(info);
        dlock_info_free(info);
        if (free_permits != 1)
            tu_sleep_ms(50);
    }
    ck_assert_int_eq(free_permits, 1);
    ck_assert_int_eq(dlock_permit_release(pa), DLOCK_OK);
    ck_assert_int_eq(dlock_permit_release(pb), DLOCK_ELOST);
    dlock_semaphore_free(sa);
    dlock_semaphore_free(sb);
    TU_CLOSE_CLIENTS(a, b);
    free(url);
}

/* Redisson's prefixName(): a name that has a hash tag keeps it. */
TU_TEST(hash_tag_names, 60)
{
    struct tu_solo s = served_open(NULL, "{user1}:cart");
    TU_ACQUIRE_OK(s.l, DLOCK_TRY);
    redisContext *ctx = raw();
    ck_assert_int_eq(cmd_int(ctx, "EXISTS %s", "{user1}:cart"), 1);
    ck_assert_int_eq(cmd_int(ctx, "GET %s", "redisson_lock_token:{user1}:cart"), (long long)tu_token(s.l));
    ck_assert_int_eq(dlock_release(s.l), DLOCK_OK);
    redisFree(ctx);
    served_close(&s);
}

/* Connections dropped by the server (CLIENT KILL) while holding and
 * waiting: renewals resume on new connections, no hold is lost, and the
 * waiter is still woken by the release. */
TU_TEST(connections_killed_renewals_resume, 60)
{
    char *url = served_url("lease=1500ms");
    dlock_client *c = tu_open(url), *c2 = tu_open(url);
    dlock_lock *l = tu_lock(c, "ck"), *l2 = tu_lock(c2, "ck");
    struct tu_lost lost = {0};
    dlock_lock_on_lost(l, tu_on_lost, &lost);
    TU_ACQUIRE_OK(l, DLOCK_TRY);
    struct waiter_arg a = {.l = l2, .wait_ms = 30000, .rc = -99, .release = true};
    pthread_t th;
    pthread_create(&th, NULL, waiter_main, &a);
    redisContext *ctx = raw();
    wait_numsub(ctx, "redisson_lock__channel:{ck}", 1);
    for (int i = 0; i < 3; i++) {
        freeReplyObject(cmd(ctx, "CLIENT KILL TYPE normal SKIPME yes"));
        freeReplyObject(cmd(ctx, "CLIENT KILL TYPE pubsub"));
        tu_sleep_ms(1000);
    }
    ck_assert_int_eq(atomic_load(&lost.fired), 0);
    ck_assert_int_gt(dlock_validity_ms(l), 0);
    wait_numsub(ctx, "redisson_lock__channel:{ck}", 1); /* resubscribed */
    ck_assert_int_eq(dlock_release(l), DLOCK_OK);
    pthread_join(th, NULL);
    ck_assert_msg(a.rc == DLOCK_OK, "waiter: %s", dlock_err_name(a.rc));
    redisFree(ctx);
    TU_FREE_LOCKS(l, l2);
    TU_CLOSE_CLIENTS(c, c2);
    free(url);
    stop_server();
}

/* The server restarts while a thread waits: the subscriber connection is
 * redialed, the waiter is woken to try again, and gets the lock (the
 * restarted server lost the foreign holder's key). */
TU_TEST(server_restart_while_waiting, 60)
{
    redisContext *ctx = served_raw();
    freeReplyObject(cmd(ctx, "HSET w 6f0b9c2e-1d1a-4c55-8a0e-2b8f3c9d7e11:1 1"));
    freeReplyObject(cmd(ctx, "PEXPIRE w 600000"));
    dlock_client *c = tu_open(srv.url);
    dlock_lock *l = tu_lock(c, "w");
    struct waiter_arg a = {.l = l, .wait_ms = 30000, .rc = -99, .release = true};
    pthread_t th;
    pthread_create(&th, NULL, waiter_main, &a);
    wait_numsub(ctx, "redisson_lock__channel:{w}", 1);
    ck_assert_msg(fx_redis_restart(&srv), "restart failed");
    pthread_join(th, NULL);
    ck_assert_msg(a.rc == DLOCK_OK, "waiter after restart: %s", dlock_err_name(a.rc));
    ck_assert_int_eq(a.release_rc, DLOCK_OK);
    ck_assert_uint_gt(a.token, 1000000000000000ull); /* from the clock: the data was lost */
    dlock_lock_free(l);
    dlock_client_close(c);
    served_raw_close(ctx);
}

int main(void)
{
    return tu_main("redis", NULL, NULL);
}
