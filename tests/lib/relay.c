/* relay.c -- the one fault relay of the tests (see relay.h for why and
 * what it does): one poll loop over every relayed connection, each
 * direction a queue of chunks due at their arrival plus a delay.
 */
#include "relay.h"

#include <arpa/inet.h>
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "testutil.h"

#define RELAY_MAX 128
#define TO_SERVER 0
#define TO_CLIENT 1

struct tu_relay_chunk {
    int64_t due;
    size_t len, off;
    struct tu_relay_chunk *next;
    char data[];
};

/* What the next reply on a connection meets (tu_relay_conn.reply_fate). */
enum reply_fate {
    FATE_PASS,
    FATE_DROP_CUT, /* thrown away, the connection cut (TU_RELAY_DROP_REPLY) */
    FATE_FORGE,    /* replaced by the forged one (TU_RELAY_FORGE) */
    FATE_SERVED,   /* counted in served[] of the kept request's gate */
};

/* MALLOC or abort: the relay's loop runs in a relay process too, where
 * Check's asserts cannot report (and even passing ones end it). */
static void *must_alloc(size_t size)
{
    void *p = malloc(size);
    if (!p)
        abort();
    return p;
}

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static bool is_frozen(const struct tu_relay *r, int mode, const struct tu_relay_conn *c)
{
    return mode == TU_RELAY_FREEZE && (!r->cf.freeze_marked || c->marked);
}

static void queue_free(struct tu_relay_conn *c, int dir)
{
    for (struct tu_relay_chunk *k = c->q[dir], *next; k; k = next) {
        next = k->next;
        free(k);
    }
    c->q[dir] = c->q_tail[dir] = NULL;
}

/* Queue LEN bytes of BUF for DIR, due after C's delay, in order. */
static void enqueue(struct tu_relay *r, struct tu_relay_conn *c, int dir, const char *buf,
                    size_t len)
{
    struct tu_relay_chunk *k = must_alloc(sizeof *k + len);
    k->due = now_ms() + (r->cf.delay_of ? r->cf.delay_of(r, c) : 0);
    if (c->q_tail[dir] && k->due < c->q_tail[dir]->due)
        k->due = c->q_tail[dir]->due;
    k->len = len;
    k->off = 0;
    k->next = NULL;
    memcpy(k->data, buf, len);
    if (c->q_tail[dir])
        c->q_tail[dir]->next = k;
    else
        c->q[dir] = k;
    c->q_tail[dir] = k;
}

static void client_gone(struct tu_relay *r, struct tu_relay_conn *c)
{
    if (c->cli < 0)
        return;
    close(c->cli);
    c->cli = -1;
    queue_free(c, TO_CLIENT);
    atomic_fetch_sub(&r->open, 1);
}

static void conn_close(struct tu_relay *r, struct tu_relay_conn *c)
{
    client_gone(r, c);
    close(c->srv);
    queue_free(c, TO_SERVER);
    free(c->kept);
    c->kept = NULL;
}

/* Close the connections whose client is still there; RESET resets the
 * client's side. */
static void cut_live(struct tu_relay *r, struct tu_relay_conn *c, int *n, bool reset)
{
    for (int i = *n - 1; i >= 0; i--) {
        if (c[i].cli < 0)
            continue;
        if (reset) {
            struct linger lg = {.l_onoff = 1, .l_linger = 0};
            setsockopt(c[i].cli, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
            shutdown(c[i].cli, SHUT_RDWR);
        }
        conn_close(r, &c[i]);
        c[i] = c[--*n];
    }
}

/* What the rules say of a request: tu_relay_hold_at()'s marker first,
 * then the callback. */
static enum tu_relay_action judge(struct tu_relay *r, struct tu_relay_conn *c, const char *buf,
                                  size_t len)
{
    const char *marker = atomic_load(&r->hold_at);
    if (marker && memmem(buf, len, marker, strlen(marker))) {
        atomic_store(&r->hold_at, NULL);
        if (!atomic_load(&r->gate_shut[0]))
            atomic_store(&r->mode, TU_RELAY_HOLD); /* hold_at: all of it, until PASS */
        return TU_RELAY_KEEP;
    }
    return r->cf.on_request ? r->cf.on_request(r, c, buf, len) : TU_RELAY_FORWARD;
}

/* A request read from C's client in MODE. */
static void from_client(struct tu_relay *r, struct tu_relay_conn *c, int mode, const char *buf,
                        size_t len)
{
    if (mode == TU_RELAY_BLACKHOLE)
        return;
    enum tu_relay_action act = judge(r, c, buf, len);
    if (act == TU_RELAY_KEEP || act == TU_RELAY_KEEP_CUT) {
        c->kept = must_alloc(len);
        memcpy(c->kept, buf, len);
        c->kept_len = len;
        c->kept_gate = act == TU_RELAY_KEEP_CUT;
        atomic_fetch_add(&r->kept, 1);
        if (act == TU_RELAY_KEEP_CUT)
            client_gone(r, c);
        return;
    }
    enqueue(r, c, TO_SERVER, buf, len);
    c->awaiting = true;
    c->reply_fate = act == TU_RELAY_DROP_REPLY ? FATE_DROP_CUT
                    : act == TU_RELAY_FORGE    ? FATE_FORGE
                                               : FATE_PASS;
}

/* A reply read from C's server in MODE; false: C is to be closed. */
static bool from_server(struct tu_relay *r, struct tu_relay_conn *c, int mode, const char *buf,
                        size_t len)
{
    int fate = c->reply_fate;
    c->reply_fate = FATE_PASS;
    bool was_awaiting = c->awaiting;
    c->awaiting = false;
    if (mode == TU_RELAY_DROP || mode == TU_RELAY_BLACKHOLE)
        return true;
    if (fate == FATE_DROP_CUT) {
        atomic_fetch_add(&r->dropped, 1); /* it ran; the reply is lost */
        return false;
    }
    if (fate == FATE_SERVED)
        atomic_fetch_add(&r->served[c->kept_gate], 1);
    if (c->cli < 0)
        return true;
    if (was_awaiting)
        atomic_fetch_add(&r->replies, 1);
    if (fate == FATE_FORGE) {
        atomic_fetch_add(&r->forged, 1);
        enqueue(r, c, TO_CLIENT, r->cf.forged, strlen(r->cf.forged));
    } else {
        enqueue(r, c, TO_CLIENT, buf, len);
    }
    return true;
}

/* Write what is due on DIR of C; false when the server's side broke. */
static bool flush(struct tu_relay *r, struct tu_relay_conn *c, int dir, int64_t now)
{
    int fd = dir == TO_SERVER ? c->srv : c->cli;
    while (fd >= 0 && c->q[dir] && c->q[dir]->due <= now) {
        struct tu_relay_chunk *k = c->q[dir];
        ssize_t n = send(fd, k->data + k->off, k->len - k->off, MSG_NOSIGNAL);
        if (n < 0 && (errno == EAGAIN || errno == EINTR))
            return true;
        if (n <= 0) {
            if (dir == TO_SERVER)
                return false;
            client_gone(r, c);
            return true;
        }
        k->off += (size_t)n;
        if (k->off < k->len)
            return true;
        c->q[dir] = k->next;
        if (!c->q[dir])
            c->q_tail[dir] = NULL;
        free(k);
    }
    return true;
}

/* Move what is ready on C (CLI_EV, SRV_EV: the revents of its sides) in
 * MODE; false once C is to be closed. */
static bool conn_move(struct tu_relay *r, struct tu_relay_conn *c, int mode, short cli_ev,
                      short srv_ev)
{
    char buf[65536];
    if (c->cli >= 0 && !c->kept && mode != TU_RELAY_HOLD &&
        (cli_ev & (POLLIN | POLLHUP | POLLERR))) {
        ssize_t got = read(c->cli, buf, sizeof buf);
        if (got > 0)
            from_client(r, c, mode, buf, (size_t)got);
        else if (got == 0 || (errno != EAGAIN && errno != EINTR))
            client_gone(r, c); /* what it sent is with the server, or kept */
    }
    if (srv_ev & (POLLIN | POLLHUP | POLLERR)) {
        ssize_t got = read(c->srv, buf, sizeof buf);
        if (got == 0 || (got < 0 && errno != EAGAIN && errno != EINTR))
            return false;
        if (got > 0 && !from_server(r, c, mode, buf, (size_t)got))
            return false;
    }
    int64_t now = now_ms();
    if (!flush(r, c, TO_SERVER, now))
        return false;
    flush(r, c, TO_CLIENT, now);
    /* a client gone, nothing of it on the way: its server side too */
    return !(c->cli < 0 && r->cf.close_with_client && !c->awaiting && !c->q[TO_SERVER] && !c->kept);
}

static void relay_accept(struct tu_relay *r, struct tu_relay_conn *c, int *n, int mode)
{
    struct sockaddr_in peer = {0};
    socklen_t plen = sizeof peer;
    int fd = accept4(r->listen_fd, (struct sockaddr *)&peer, &plen, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0)
        return;
    atomic_fetch_add(&r->accepts, 1);
    int port = mode == TU_RELAY_REFUSE || *n >= RELAY_MAX ? -1
               : r->cf.target_of                          ? r->cf.target_of(r, fd)
                                                          : r->cf.target;
    int srv = port > 0 ? tu_dial_loopback(port) : -1;
    if (srv < 0) {
        close(fd);
        return;
    }
    fcntl(srv, F_SETFL, fcntl(srv, F_GETFL) | O_NONBLOCK);
    c[(*n)++] = (struct tu_relay_conn){.cli = fd, .srv = srv, .peer = ntohl(peer.sin_addr.s_addr)};
    atomic_fetch_add(&r->open, 1);
}

/* Send on what was kept whose gate is open (and the relay not holding). */
static void let_kept(struct tu_relay *r, struct tu_relay_conn *c, int n, int mode)
{
    for (int i = 0; i < n && mode != TU_RELAY_HOLD; i++) {
        if (!c[i].kept || atomic_load(&r->gate_shut[c[i].kept_gate]))
            continue;
        enqueue(r, &c[i], TO_SERVER, c[i].kept, c[i].kept_len);
        free(c[i].kept);
        c[i].kept = NULL;
        c[i].awaiting = true;
        c[i].reply_fate = FATE_SERVED;
    }
}

static void relay_loop(struct tu_relay *r)
{
    struct tu_relay_conn *c = must_alloc(RELAY_MAX * sizeof *c);
    int n = 0, last = atomic_load(&r->mode);
    while (!atomic_load(&r->stop)) {
        unsigned pass = atomic_fetch_add(&r->passes, 1) + 1;
        /* One mode per pass, and the cut a change of mode asks for comes
         * before anything moves in the new mode. */
        int mode = atomic_load(&r->mode);
        int cut = atomic_exchange(&r->cut, 0);
        if (cut || (mode != last && (mode == TU_RELAY_REFUSE ||
                                     (mode == TU_RELAY_PASS &&
                                      (last == TU_RELAY_DROP || last == TU_RELAY_BLACKHOLE)))))
            cut_live(r, c, &n, cut == 2);
        last = mode;
        let_kept(r, c, n, mode);

        int64_t now = now_ms(), next = now + 20;
        struct pollfd pf[1 + 2 * RELAY_MAX];
        pf[0] = (struct pollfd){.fd = mode != TU_RELAY_HOLD ? r->listen_fd : -1, .events = POLLIN};
        bool busy = false;
        int frozen_now = 0;
        for (int i = 0; i < n; i++) {
            struct tu_relay_conn *k = &c[i];
            short cli_ev = mode != TU_RELAY_HOLD && !k->kept ? POLLIN : 0;
            short srv_ev = is_frozen(r, mode, k) ? 0 : POLLIN;
            frozen_now += srv_ev == 0;
            for (int dir = 0; dir < 2; dir++)
                if (k->q[dir] && k->q[dir]->due <= now)
                    *(dir == TO_SERVER ? &srv_ev : &cli_ev) |= POLLOUT;
                else if (k->q[dir] && k->q[dir]->due < next)
                    next = k->q[dir]->due;
            /* (a connection whose request is kept reads nothing after it) */
            pf[1 + 2 * i] = (struct pollfd){.fd = cli_ev ? k->cli : -1, .events = cli_ev};
            pf[2 + 2 * i] = (struct pollfd){.fd = srv_ev ? k->srv : -1, .events = srv_ev};
            busy |= k->awaiting || k->kept || k->q[TO_SERVER] || k->q[TO_CLIENT];
        }
        atomic_store(&r->frozen, frozen_now);
        int polled = n;
        int ready = poll(pf, (nfds_t)(1 + 2 * n), (int)(next - now));
        if (ready == 0 && mode == TU_RELAY_PASS && !busy)
            atomic_store(&r->settled_at, pass);
        if (ready < 0 || atomic_load(&r->mode) != mode)
            continue; /* changed while we polled: the next pass, first */
        if (pf[0].revents & POLLIN)
            relay_accept(r, c, &n, mode);
        /* (last first: a dropped one's place takes one already moved, or
         * one accepted just now) */
        for (int i = polled - 1; i >= 0; i--) {
            if (conn_move(r, &c[i], mode, pf[1 + 2 * i].revents, pf[2 + 2 * i].revents))
                continue;
            conn_close(r, &c[i]);
            c[i] = c[--n];
        }
    }
    for (int i = 0; i < n; i++)
        conn_close(r, &c[i]);
    free(c);
}

static void relay_init(struct tu_relay *r, const struct tu_relay_config *cf)
{
    memset(r, 0, sizeof *r);
    r->cf = *cf;
    atomic_store(&r->mode, cf->mode);
    atomic_store(&r->gate_shut[0], cf->gates_shut);
    atomic_store(&r->gate_shut[1], cf->gates_shut);
    r->listen_fd = cf->listen_fd > 0 ? cf->listen_fd : tu_listen_loopback(&r->port, RELAY_MAX);
}

static void *relay_main(void *arg)
{
    relay_loop(arg);
    return NULL;
}

void tu_relay_start_with(struct tu_relay *r, const struct tu_relay_config *cf)
{
    relay_init(r, cf);
    ck_assert_int_ge(r->listen_fd, 0);
    ck_assert_int_eq(pthread_create(&r->thread, NULL, relay_main, r), 0);
}

void tu_relay_start(struct tu_relay *r, int target, enum tu_relay_mode mode)
{
    tu_relay_start_with(r, &(struct tu_relay_config){.target = target, .mode = mode});
}

void tu_relay_serve(struct tu_relay *r, const struct tu_relay_config *cf)
{
    relay_init(r, cf);
    if (r->listen_fd < 0)
        abort();
    relay_loop(r);
}

/* Returns once the loop that may have read the old settings is over: the
 * next one reads the new ones. */
static void in_force(struct tu_relay *r)
{
    unsigned now = atomic_load(&r->passes);
    while (atomic_load(&r->passes) <= now)
        tu_sleep_ms(1);
}

void tu_relay_set(struct tu_relay *r, enum tu_relay_mode mode)
{
    atomic_store(&r->mode, mode);
    in_force(r);
}

void tu_relay_hold_at(struct tu_relay *r, const char *marker)
{
    atomic_store(&r->hold_at, marker);
    tu_relay_set(r, TU_RELAY_PASS);
}

void tu_relay_keep_at(struct tu_relay *r, const char *marker)
{
    atomic_store(&r->gate_shut[0], 1);
    tu_relay_hold_at(r, marker);
}

void tu_relay_gate(struct tu_relay *r, int gate, bool shut)
{
    atomic_store(&r->gate_shut[gate], shut);
    in_force(r);
}

void tu_relay_let_kept(struct tu_relay *r)
{
    atomic_store(&r->gate_shut[0], 0);
    tu_relay_set(r, TU_RELAY_PASS);
}

bool tu_relay_wait_served(struct tu_relay *r, int timeout_ms)
{
    unsigned from = atomic_load(&r->passes);
    for (int waited = 0; waited < timeout_ms; waited += 10) {
        if (atomic_load(&r->settled_at) > from)
            return true;
        tu_sleep_ms(10);
    }
    return false;
}

void tu_relay_cut(struct tu_relay *r, bool reset)
{
    atomic_store(&r->cut, reset ? 2 : 1);
    while (atomic_load(&r->cut))
        tu_sleep_ms(1);
    in_force(r);
}

void tu_relay_stop(struct tu_relay *r)
{
    atomic_store(&r->stop, 1);
    pthread_join(r->thread, NULL);
    close(r->listen_fd);
}
