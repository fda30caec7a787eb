/* relay.c -- the delaying relay of the fault harness: a fixed latency on a
 * worker's connections, which this kernel cannot give (no netem; a token
 * bucket delays only a busy flow).
 *
 * One process per run, in the servers' namespace, listening on one port.
 * A packet-delay event redirects a worker's new connections to it
 * (nftables `redirect`, so SO_ORIGINAL_DST still names the server it
 * meant) and breaks the worker's existing ones (`ss -K`), so that its
 * client reconnects through the relay. The relay connects to that server
 * on the loopback and passes the bytes on both ways, each chunk held
 * DELAY_MS[y] milliseconds from its arrival, where y is the third byte of
 * the worker's address 10.X.y.2 (its slot in chaos_shared), read at the
 * chunk's arrival: setting it to 0 ends the delay on connections already
 * relayed. Order is kept per direction. A side that closes or fails
 * closes both, as a broken connection does.
 */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include "chaos.h"

#ifndef SO_ORIGINAL_DST
#define SO_ORIGINAL_DST 80 /* <linux/netfilter_ipv4.h>, which clashes with <netinet/in.h> */
#endif

#define RELAY_MAX 128     /* connection pairs */
#define CHUNK 16384

struct chunk {
    int64_t due;
    size_t len, off;
    struct chunk *next;
    char data[];
};

struct side {
    int fd;
    struct chunk *head, *tail; /* bytes read here, waiting to go to the other side */
};

struct pair {
    bool used;
    int y;                /* the worker's slot: DELAY_MS[y] */
    struct side s[2];     /* 0: the worker, 1: the server */
};

static void pair_close(struct pair *p)
{
    for (int i = 0; i < 2; i++) {
        close(p->s[i].fd);
        for (struct chunk *c = p->s[i].head, *n; c; c = n) {
            n = c->next;
            free(c);
        }
    }
    memset(p, 0, sizeof *p);
}

/* Accept one connection and connect it to the server it was meant for. */
static void relay_accept(int lfd, struct pair *pairs)
{
    struct sockaddr_in peer, orig;
    socklen_t plen = sizeof peer, olen = sizeof orig;
    int c = accept4(lfd, (struct sockaddr *)&peer, &plen, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (c < 0)
        return;
    struct pair *p = NULL;
    for (int i = 0; i < RELAY_MAX && !p; i++)
        if (!pairs[i].used)
            p = &pairs[i];
    int s = -1;
    if (p && getsockopt(c, SOL_IP, SO_ORIGINAL_DST, &orig, &olen) == 0) {
        /* the servers listen on every address: the loopback reaches them */
        struct sockaddr_in to = {.sin_family = AF_INET, .sin_port = orig.sin_port,
                                 .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (s >= 0 && connect(s, (struct sockaddr *)&to, sizeof to) != 0) {
            close(s);
            s = -1;
        }
    }
    if (s < 0) {
        close(c);
        return;
    }
    fcntl(s, F_SETFL, fcntl(s, F_GETFL) | O_NONBLOCK);
    p->used = true;
    p->y = (int)((ntohl(peer.sin_addr.s_addr) >> 8) & 0xff);
    p->s[0].fd = c;
    p->s[1].fd = s;
    if (getenv("CHAOS_DEBUG"))
        fprintf(stderr, "chaos relay: worker slot %d to port %d\n", p->y, ntohs(orig.sin_port));
}

/* Read what side I of P has, queued for the other side; false: closed. */
static bool relay_read(struct pair *p, int i, const struct chaos_shared *sh)
{
    struct chunk *c = malloc(sizeof *c + CHUNK);
    if (!c)
        return false;
    ssize_t n = read(p->s[i].fd, c->data, CHUNK);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
        free(c);
        return true;
    }
    if (n <= 0) {
        free(c);
        return false;
    }
    int y = p->y >= 0 && p->y < CHAOS_MAX_SPAWNS ? p->y : 0;
    c->due = chaos_now_ms() + sh->delay_ms[y];
    if (p->s[i].tail && c->due < p->s[i].tail->due)
        c->due = p->s[i].tail->due; /* in order */
    c->len = (size_t)n;
    c->off = 0;
    c->next = NULL;
    if (p->s[i].tail)
        p->s[i].tail->next = c;
    else
        p->s[i].head = c;
    p->s[i].tail = c;
    return true;
}

/* Write what is due from side I to the other side; false: it failed. */
static bool relay_flush(struct pair *p, int i, int64_t now)
{
    struct side *from = &p->s[i];
    while (from->head && from->head->due <= now) {
        struct chunk *c = from->head;
        ssize_t n = write(p->s[1 - i].fd, c->data + c->off, c->len - c->off);
        if (n < 0 && (errno == EAGAIN || errno == EINTR))
            return true;
        if (n <= 0)
            return false;
        c->off += (size_t)n;
        if (c->off < c->len)
            return true;
        from->head = c->next;
        if (!from->head)
            from->tail = NULL;
        free(c);
    }
    return true;
}

void chaos_relay_main(int lfd, const struct chaos_shared *sh)
{
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    signal(SIGPIPE, SIG_IGN);
    static struct pair pairs[RELAY_MAX];
    struct pollfd pfd[1 + 2 * RELAY_MAX];
    int owner[1 + 2 * RELAY_MAX];
    for (;;) {
        int64_t now = chaos_now_ms(), next = now + 1000;
        int n = 0;
        pfd[n++] = (struct pollfd){.fd = lfd, .events = POLLIN};
        for (int k = 0; k < RELAY_MAX; k++) {
            if (!pairs[k].used)
                continue;
            for (int i = 0; i < 2; i++) {
                struct chunk *due = pairs[k].s[1 - i].head; /* what waits to be written to side i */
                short ev = POLLIN;
                if (due && due->due <= now)
                    ev |= POLLOUT;
                else if (due && due->due < next)
                    next = due->due;
                owner[n] = k * 2 + i;
                pfd[n++] = (struct pollfd){.fd = pairs[k].s[i].fd, .events = ev};
            }
        }
        if (poll(pfd, (nfds_t)n, (int)(next - now)) < 0 && errno != EINTR)
            _exit(2);
        if (pfd[0].revents & POLLIN)
            relay_accept(lfd, pairs);
        for (int q = 1; q < n; q++) {
            struct pair *p = &pairs[owner[q] / 2];
            if (p->used && (pfd[q].revents & (POLLIN | POLLHUP | POLLERR)) && !relay_read(p, owner[q] % 2, sh))
                pair_close(p);
        }
        /* whatever is due, both ways, whether or not poll woke for it */
        now = chaos_now_ms();
        for (int k = 0; k < RELAY_MAX; k++)
            if (pairs[k].used && !(relay_flush(&pairs[k], 0, now) && relay_flush(&pairs[k], 1, now)))
                pair_close(&pairs[k]);
    }
}
