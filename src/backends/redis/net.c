/* net.c -- the Redis backend's sockets: dialing, sending and receiving
 * within one bound per request, over any number of connections at once.
 *
 * hiredis 0.14's blocking contexts time out each read(2) and write(2) on
 * its own: a reply that trickles in one byte at a time, or a bulk string
 * that announces a gigabyte, keeps a bounded call busy far past its
 * bound, and its writes raise SIGPIPE on a closed connection. So the
 * backend owns its sockets: non-blocking, dialed within the connect time
 * left, written with send(MSG_NOSIGNAL), and every request (everything
 * appended to one or more connections, then every reply they owe) is one
 * poll loop that ends at one absolute time, the caller's time left
 * (dlock__time_left). A reply is capped (REDIS_MAX_REPLY): past that the
 * connection is closed with a message saying so. hiredis stays for what
 * it does well: formatting commands (redisFormatCommandArgv) and parsing
 * replies (redisReader). The same loop serves one node (commands,
 * scripts), the subscriber hub (dlock__redis_conn_events/dlock__redis_conn_pump) and
 * several nodes in parallel (Sentinel, Redlock). Names are resolved
 * within the same bound: an address is parsed on the spot, a name goes to
 * getaddrinfo() in a thread of its own that the dial leaves behind when
 * its time is up (getaddrinfo() itself takes as long as the resolver's
 * own timeouts and retries, 5 s per name server and try by default).
 */
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "redis.h"

#define READ_CHUNK (64 * 1024)

/* ============================================================ the socket */

void dlock__redis_conn_fail(struct rconn *k, const char *fmt, ...)
{
    if (k->broken)
        return;
    k->broken = true;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(k->err, sizeof k->err, fmt, ap);
    va_end(ap);
}

void dlock__redis_conn_free(struct rconn *k)
{
    if (!k)
        return;
    if (k->tls)
        dlock__redis_tls_free(k);
    if (k->fd >= 0)
        close(k->fd);
    if (k->reader)
        redisReaderFree(k->reader);
    for (size_t i = k->taken; i < k->ngot; i++)
        freeReplyObject(k->got[i]);
    free(k->got);
    free(k->out);
    free(k);
}

/* Milliseconds left until UNTIL (monotonic ms), at least 0. */
static int64_t ms_until(int64_t until)
{
    int64_t left = until - dlock__now_ms();
    return left < 0 ? 0 : left;
}

/* ============================================================ resolving */

/* Test hook: the names that went to the resolver thread (an address
 * never does). */
unsigned long dlock__redis_resolver_calls;

/* One name being resolved: shared by the dial and the resolver thread;
 * the last of the two to let go frees it (a dial that ran out of time
 * leaves first). */
struct resolve_job {
    int refs; /* atomic */
    int efd;  /* eventfd: readable once the thread is done */
    int gai, err;
    struct addrinfo *res;
    char port[16];
    char host[];
};

static void resolve_unref(struct resolve_job *j)
{
    if (__atomic_sub_fetch(&j->refs, 1, __ATOMIC_ACQ_REL) > 0)
        return;
    if (j->res)
        freeaddrinfo(j->res);
    close(j->efd);
    free(j);
}

static void *resolve_main(void *arg)
{
    struct resolve_job *j = arg;
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_NUMERICSERV};
    j->gai = getaddrinfo(j->host, j->port, &hints, &j->res);
    j->err = errno;
    eventfd_write(j->efd, 1); /* (the write orders what came before) */
    resolve_unref(j);
    return NULL;
}

/* HOST:PORT's addresses into *RES within UNTIL: an address at once
 * (AI_NUMERICHOST: no resolver), a name by getaddrinfo() in a thread of
 * its own, given up (and left to finish alone) at UNTIL. 0, an EAI_*
 * code (EAI_SYSTEM: errno), or EAI_AGAIN with *TIMED_OUT set. */
static int resolve_until(const char *host, int port, int64_t until, struct addrinfo **res,
                         bool *timed_out)
{
    *res = NULL;
    *timed_out = false;
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_NUMERICSERV | AI_NUMERICHOST};
    int gai = getaddrinfo(host, ps, &hints, res);
    if (gai != EAI_NONAME)
        return gai; /* an address (or a failure that is not about names) */
    size_t hl = strlen(host);
    struct resolve_job *j = calloc(1, sizeof *j + hl + 1);
    if (!j)
        return EAI_MEMORY;
    memcpy(j->host, host, hl + 1);
    memcpy(j->port, ps, sizeof ps);
    j->refs = 2;
    j->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (j->efd < 0) {
        int e = errno;
        free(j);
        errno = e;
        return EAI_SYSTEM;
    }
    __atomic_add_fetch(&dlock__redis_resolver_calls, 1, __ATOMIC_RELAXED);
    /* the thread takes no signal of the application's */
    sigset_t all, old;
    sigfillset(&all);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    pthread_t th;
    int perr = pthread_create(&th, &attr, resolve_main, j);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    pthread_attr_destroy(&attr);
    if (perr) {
        close(j->efd);
        free(j);
        errno = perr;
        return EAI_SYSTEM;
    }
    for (;;) {
        struct pollfd p = {.fd = j->efd, .events = POLLIN};
        int64_t left = ms_until(until);
        int n = poll(&p, 1, (int)(left > 1000000 ? 1000000 : left));
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            int e = errno;
            resolve_unref(j);
            errno = e;
            return EAI_SYSTEM;
        }
        if (n > 0) {
            __atomic_thread_fence(__ATOMIC_ACQUIRE);
            gai = j->gai;
            errno = j->err;
            *res = j->res;
            j->res = NULL;
            resolve_unref(j);
            return gai;
        }
        if (ms_until(until) == 0) {
            resolve_unref(j); /* the thread frees it when it is done */
            *timed_out = true;
            return EAI_AGAIN;
        }
    }
}

/* Connect FD to ADDR within UNTIL: 0, or an errno (ETIMEDOUT). */
static int connect_until(int fd, const struct sockaddr *addr, socklen_t len, int64_t until)
{
    if (connect(fd, addr, len) == 0)
        return 0;
    if (errno != EINPROGRESS && errno != EINTR)
        return errno;
    for (;;) {
        struct pollfd p = {.fd = fd, .events = POLLOUT};
        int64_t left = ms_until(until);
        int n = poll(&p, 1, (int)(left > 1000000 ? 1000000 : left));
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return errno;
        if (n == 0) {
            if (ms_until(until) > 0)
                continue;
            return ETIMEDOUT;
        }
        int err = 0;
        socklen_t el = sizeof err;
        if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) < 0)
            return errno;
        return err;
    }
}

int dlock__redis_conn_dial(const struct redis_addr *a, int64_t until, struct rconn **out)
{
    *out = NULL;
    struct rconn *k = calloc(1, sizeof *k);
    if (!k)
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    k->fd = -1;
    if (a->sock)
        snprintf(k->where, sizeof k->where, "redis unix:%s", a->sock);
    else
        snprintf(k->where, sizeof k->where, strchr(a->host, ':') ? "%s [%s]:%d" : "%s %s:%d",
                 a->tls ? "rediss" : "redis", a->host, a->port);
    k->reader = redisReaderCreate();
    if (!k->reader) {
        dlock__redis_conn_free(k);
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    }
    int64_t budget = ms_until(until);
    int err = 0;
    if (a->sock) {
        struct sockaddr_un un = {.sun_family = AF_UNIX};
        if (strlen(a->sock) >= sizeof un.sun_path) {
            dlock__redis_conn_free(k);
            return dlock__err(DLOCK_EBADURL, "%s: the socket path is too long", k->where);
        }
        strcpy(un.sun_path, a->sock);
        k->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        err = k->fd < 0 ? errno : connect_until(k->fd, (struct sockaddr *)&un, sizeof un, until);
    } else {
        struct addrinfo *res = NULL;
        bool late = false;
        int gai = resolve_until(a->host, a->port, until, &res, &late);
        if (gai) {
            int rc = late ? dlock__err(DLOCK_ECONN, "%s: cannot resolve '%s': no answer within "
                                                    "%lld ms",
                                       k->where, a->host, (long long)budget)
                          : dlock__err(DLOCK_ECONN, "%s: cannot resolve '%s': %s", k->where,
                                       a->host,
                                       gai == EAI_SYSTEM ? strerror(errno) : gai_strerror(gai));
            dlock__redis_conn_free(k);
            return rc;
        }
        err = ENOENT;
        for (struct addrinfo *ai = res; ai && err; ai = ai->ai_next) {
            if (k->fd >= 0)
                close(k->fd);
            k->fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
                           ai->ai_protocol);
            if (k->fd < 0) {
                err = errno;
                continue;
            }
            err = connect_until(k->fd, ai->ai_addr, ai->ai_addrlen, until);
            if (err == ETIMEDOUT)
                break;
        }
        freeaddrinfo(res);
        if (!err) {
            int one = 1;
            setsockopt(k->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
            setsockopt(k->fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
        }
    }
    if (err) {
        int rc = err == ETIMEDOUT
                     ? dlock__err(DLOCK_ECONN, "%s: cannot connect: no answer within %lld ms",
                                  k->where, (long long)budget)
                     : dlock__err(DLOCK_ECONN, "%s: cannot connect: %s", k->where, strerror(err));
        dlock__redis_conn_free(k);
        return rc;
    }
    if (a->tls) {
        int rc = dlock__redis_tls_handshake(k, a->tls, a->host, until);
        if (rc) {
            dlock__redis_conn_free(k);
            return rc;
        }
    }
    *out = k;
    return DLOCK_OK;
}

/* ====================================================== appending, replies */

int dlock__redis_conn_append(struct rconn *k, int argc, const char **argv, const size_t *argl)
{
    size_t lens[64];
    size_t *l = (size_t *)argl;
    if (!argl) {
        if (argc > 64)
            return dlock__err(DLOCK_EINVAL, "too many arguments");
        for (int i = 0; i < argc; i++)
            lens[i] = strlen(argv[i]);
        l = lens;
    }
    char *cmd = NULL;
    int len = redisFormatCommandArgv(&cmd, argc, argv, l);
    if (len < 0)
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    if (k->out_off == k->out_len)
        k->out_off = k->out_len = 0;
    if (k->out_len + (size_t)len > k->out_cap) {
        size_t cap = k->out_cap ? k->out_cap : 256;
        while (cap < k->out_len + (size_t)len)
            cap *= 2;
        char *p = realloc(k->out, cap);
        if (!p) {
            free(cmd);
            return dlock__err(DLOCK_ENOMEM, "out of memory");
        }
        k->out = p;
        k->out_cap = cap;
    }
    memcpy(k->out + k->out_len, cmd, (size_t)len);
    k->out_len += (size_t)len;
    free(cmd);
    k->want++;
    return DLOCK_OK;
}

redisReply *dlock__redis_conn_take(struct rconn *k)
{
    if (k->taken == k->ngot)
        return NULL;
    redisReply *r = k->got[k->taken++];
    if (k->taken == k->ngot)
        k->taken = k->ngot = 0;
    return r;
}

/* Parse every whole reply the reader holds into K's list; cap the one
 * still arriving. */
static void parse_replies(struct rconn *k)
{
    while (!k->broken) {
        void *reply = NULL;
        if (redisReaderGetReply(k->reader, &reply) != REDIS_OK) {
            dlock__redis_conn_fail(k, "protocol error: %s", k->reader->errstr);
            return;
        }
        if (!reply)
            break;
        if (k->ngot == k->got_cap) {
            size_t cap = k->got_cap ? 2 * k->got_cap : 8;
            redisReply **g = realloc(k->got, cap * sizeof *g);
            if (!g) {
                freeReplyObject(reply);
                dlock__redis_conn_fail(k, "out of memory");
                return;
            }
            k->got = g;
            k->got_cap = cap;
        }
        k->got[k->ngot++] = reply;
        k->nreplies++;
        if (k->want > 0)
            k->want--;
        /* what the reader holds beyond this reply belongs to the next */
        k->partial = k->reader->len - k->reader->pos;
    }
    if (!k->broken && k->partial > REDIS_MAX_REPLY)
        dlock__redis_conn_fail(k, "a reply larger than %u MiB (dlock's cap); connection closed",
                  REDIS_MAX_REPLY >> 20);
}

/* ====================================================== the one poll loop */

short dlock__redis_conn_events(const struct rconn *k)
{
    if (k->broken || k->fd < 0)
        return 0;
    return (short)(POLLIN | (k->out_off < k->out_len || k->tls_want_write ? POLLOUT : 0));
}

/* Write what K has to send, without blocking. */
static void pump_out(struct rconn *k)
{
    while (!k->broken && k->out_off < k->out_len) {
        ssize_t n = k->tls ? dlock__redis_tls_io(k, k->out + k->out_off, k->out_len - k->out_off, true)
                           : send(k->fd, k->out + k->out_off, k->out_len - k->out_off,
                                  MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return;
        if (n <= 0) {
            if (!k->broken)
                dlock__redis_conn_fail(k, "%s", n < 0 ? strerror(errno) : "short write");
            return;
        }
        k->out_off += (size_t)n;
    }
}

/* Read what K has received, without blocking, and parse it. */
static void pump_in(struct rconn *k)
{
    char buf[READ_CHUNK];
    while (!k->broken) {
        ssize_t n = k->tls ? dlock__redis_tls_io(k, buf, sizeof buf, false) : recv(k->fd, buf, sizeof buf, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return;
        if ((n == 0 || (n < 0 && errno == ECONNRESET)) && !k->tls && k->nreplies == 0)
            dlock__redis_conn_fail(k, "the server closed the connection before any reply (a TLS port? "
                               "then use rediss://)");
        if (n == 0) {
            dlock__redis_conn_fail(k, "the server closed the connection");
            return;
        }
        if (n < 0) {
            if (!k->broken)
                dlock__redis_conn_fail(k, "%s", strerror(errno));
            return;
        }
        if (redisReaderFeed(k->reader, buf, (size_t)n) != REDIS_OK) {
            dlock__redis_conn_fail(k, "out of memory");
            return;
        }
        k->partial += (size_t)n;
        parse_replies(k);
        if ((size_t)n < sizeof buf && !k->tls)
            return; /* drained: the next recv would say EAGAIN (TLS may hold more) */
    }
}

void dlock__redis_conn_pump(struct rconn *k, short revents)
{
    if (k->broken)
        return;
    (void)revents; /* non-blocking both ways: trying costs an EAGAIN at most */
    pump_out(k);
    pump_in(k);
}

/* Whether K still owes something within the current request. */
static bool conn_busy(const struct rconn *k)
{
    return !k->broken && (k->out_off < k->out_len || k->want > 0);
}

int dlock__redis_exchange(struct rconn **ks, size_t n, int64_t until, const char *what)
{
    return dlock__redis_exchange_quorum(ks, n, until, what, n);
}

int dlock__redis_exchange_quorum(struct rconn **ks, size_t n, int64_t until, const char *what,
                                 size_t need)
{
    int64_t budget = ms_until(until), start = dlock__now_ms();
    bool quorum = false; /* NEED answered: UNTIL is now the grace's end */
    struct pollfd stack[8], *p = n <= 8 ? stack : calloc(n, sizeof *p);
    if (!p)
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    for (size_t i = 0; i < n; i++)
        if (ks[i]->fd >= 0)
            dlock__redis_conn_pump(ks[i], 0); /* write at once: the common case needs no poll to send */
    for (;;) {
        size_t busy = 0, answered = 0;
        for (size_t i = 0; i < n; i++) {
            p[i].fd = conn_busy(ks[i]) ? ks[i]->fd : -1;
            p[i].events = p[i].fd >= 0 ? dlock__redis_conn_events(ks[i]) : 0;
            p[i].revents = 0;
            busy += p[i].fd >= 0;
            answered += p[i].fd < 0 && !ks[i]->broken;
        }
        if (!busy)
            break;
        if (!quorum && answered >= need) {
            /* the others get a grace of four times what the majority
             * took (at least 10 ms): a slow node is waited for, a stopped
             * one does not hold the request until UNTIL */
            quorum = true;
            int64_t took = dlock__now_ms() - start, grace = 4 * took > 25 ? 4 * took : 25;
            if (dlock__now_ms() + grace < until)
                until = dlock__now_ms() + grace;
        }
        int64_t left = ms_until(until);
        if (left == 0) {
            for (size_t i = 0; i < n; i++)
                if (p[i].fd >= 0)
                    dlock__redis_conn_fail(ks[i], quorum ? "no reply within %lld ms, while "
                                                           "the others answered"
                                           : ks[i]->out_off < ks[i]->out_len
                                               ? "could not send within %lld ms"
                                               : "no reply within %lld ms",
                                           (long long)(quorum ? dlock__now_ms() - start : budget));
            break;
        }
        int got = poll(p, (nfds_t)n, (int)(left > 1000000 ? 1000000 : left));
        if (got < 0 && errno != EINTR) {
            for (size_t i = 0; i < n; i++)
                if (p[i].fd >= 0)
                    dlock__redis_conn_fail(ks[i], "poll: %s", strerror(errno));
            break;
        }
        for (size_t i = 0; got > 0 && i < n; i++)
            if (p[i].fd >= 0 && p[i].revents)
                dlock__redis_conn_pump(ks[i], p[i].revents);
    }
    if (p != stack)
        free(p);
    int rc = DLOCK_OK;
    for (size_t i = 0; i < n; i++) {
        if (ks[i]->broken && !rc)
            rc = dlock__err(DLOCK_ECONN, "%s: %s: %s", ks[i]->where, what, ks[i]->err);
    }
    return rc;
}

bool dlock__redis_conn_sent(const struct rconn *k)
{
    return k->out_off == k->out_len;
}
