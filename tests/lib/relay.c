/* relay.c -- a TCP relay a test can hold, so that a request its client
 * gave up on reaches the server late (see relay.h for why).
 */
#include "relay.h"

#include <arpa/inet.h>
#include <check.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "testutil.h"

#define RELAY_MAX 128

/* One relayed connection: CLI from the client (-1 once the client has
 * gone: the server side stays open, so the server never takes what came
 * from it for a canceled request), SRV to the server; AWAITING while what
 * passed to the server has had no reply since. */
struct relayed {
    int cli, srv;
    bool awaiting;
    char *held; /* what came with tu_relay_hold_at()'s marker (malloc'd) */
    ssize_t held_len;
};

/* Move what is ready on C (POLLED: the revents of its client and server
 * sides); false once the server side is gone (C is to be dropped). */
static bool relay_move(struct tu_relay *r, struct relayed *c, short cli_ev, short srv_ev)
{
    char buf[65536];
    if (c->cli >= 0 && (cli_ev & (POLLIN | POLLHUP | POLLERR))) {
        ssize_t got = read(c->cli, buf, sizeof buf);
        const char *marker = atomic_load(&r->hold_at);
        if (got > 0 && marker && memmem(buf, (size_t)got, marker, strlen(marker)) &&
            (c->held = malloc((size_t)got))) {
            memcpy(c->held, buf, (size_t)got); /* kept until PASS */
            c->held_len = got;
            if (atomic_load(&r->keeping))
                atomic_fetch_add(&r->kept, 1); /* this one alone, until let */
            else
                atomic_store(&r->mode, TU_RELAY_HOLD);
            atomic_store(&r->hold_at, NULL);
        } else if (got > 0) {
            if (!tu_send_all(c->srv, buf, (size_t)got))
                return false;
            c->awaiting = true;
        } else {
            close(c->cli); /* gone: what it sent is with the server now */
            c->cli = -1;
        }
    }
    if (srv_ev & (POLLIN | POLLHUP | POLLERR)) {
        ssize_t got = read(c->srv, buf, sizeof buf);
        if (got <= 0)
            return false;
        if (c->awaiting && c->cli >= 0)
            atomic_fetch_add(&r->replies, 1);
        c->awaiting = false;
        if (c->cli >= 0 && !tu_send_all(c->cli, buf, (size_t)got)) {
            close(c->cli);
            c->cli = -1;
        }
    }
    return true;
}

static void *relay_main(void *arg)
{
    struct tu_relay *r = arg;
    struct relayed c[RELAY_MAX];
    int n = 0;
    while (!atomic_load(&r->stop)) {
        unsigned pass = atomic_fetch_add(&r->passes, 1) + 1;
        int mode = atomic_load(&r->mode);
        bool from_clients = mode != TU_RELAY_HOLD;
        bool keeping = atomic_load(&r->keeping);
        /* what tu_relay_hold_at() held, tu_relay_keep_at() kept */
        for (int i = 0; i < n && from_clients && !keeping; i++)
            if (c[i].held) {
                c[i].awaiting = tu_send_all(c[i].srv, c[i].held, (size_t)c[i].held_len);
                free(c[i].held);
                c[i].held = NULL;
            }
        struct pollfd pf[1 + 2 * RELAY_MAX];
        pf[0] = (struct pollfd){.fd = from_clients ? r->listen_fd : -1, .events = POLLIN};
        bool awaiting = false;
        for (int i = 0; i < n; i++) {
            /* (a connection whose request is kept sends nothing after it) */
            pf[1 + 2 * i] = (struct pollfd){.fd = from_clients && !c[i].held ? c[i].cli : -1,
                                            .events = POLLIN};
            pf[2 + 2 * i] = (struct pollfd){.fd = c[i].srv, .events = POLLIN};
            awaiting |= c[i].awaiting;
        }
        int polled = n;
        int ready = poll(pf, (nfds_t)(1 + 2 * n), 20);
        if (ready == 0 && mode == TU_RELAY_PASS && !awaiting)
            atomic_store(&r->settled_at, pass);
        if (ready <= 0)
            continue;
        if (pf[0].revents & POLLIN) {
            int fd = accept4(r->listen_fd, NULL, NULL, SOCK_CLOEXEC);
            int srv = fd >= 0 && mode == TU_RELAY_PASS && n < RELAY_MAX ? tu_dial_loopback(r->target)
                                                                        : -1;
            if (srv >= 0)
                c[n++] = (struct relayed){.cli = fd, .srv = srv};
            else if (fd >= 0)
                close(fd);
        }
        /* (last first: a dropped one's place takes one already moved, or
         * one accepted just now) */
        for (int i = polled - 1; i >= 0; i--) {
            if (relay_move(r, &c[i], pf[1 + 2 * i].revents, pf[2 + 2 * i].revents))
                continue;
            if (c[i].cli >= 0)
                close(c[i].cli);
            close(c[i].srv);
            free(c[i].held);
            c[i] = c[--n];
        }
    }
    for (int i = 0; i < n; i++) {
        if (c[i].cli >= 0)
            close(c[i].cli);
        close(c[i].srv);
        free(c[i].held);
    }
    return NULL;
}

void tu_relay_start(struct tu_relay *r, int target, enum tu_relay_mode mode)
{
    memset(r, 0, sizeof *r);
    r->target = target;
    atomic_store(&r->mode, mode);
    r->listen_fd = tu_listen_loopback(&r->port, RELAY_MAX);
    ck_assert_int_ge(r->listen_fd, 0);
    ck_assert_int_eq(pthread_create(&r->thread, NULL, relay_main, r), 0);
}

void tu_relay_set(struct tu_relay *r, enum tu_relay_mode mode)
{
    atomic_store(&r->mode, mode);
    /* In force once the loop that may have read the old mode is over: the
     * next one reads the new one. */
    unsigned now = atomic_load(&r->passes);
    while (atomic_load(&r->passes) <= now)
        tu_sleep_ms(1);
}

void tu_relay_hold_at(struct tu_relay *r, const char *marker)
{
    atomic_store(&r->hold_at, marker);
    tu_relay_set(r, TU_RELAY_PASS);
}

void tu_relay_keep_at(struct tu_relay *r, const char *marker)
{
    atomic_store(&r->keeping, 1);
    tu_relay_hold_at(r, marker);
}

void tu_relay_let_kept(struct tu_relay *r)
{
    atomic_store(&r->keeping, 0);
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

void tu_relay_stop(struct tu_relay *r)
{
    atomic_store(&r->stop, 1);
    pthread_join(r->thread, NULL);
    close(r->listen_fd);
}
