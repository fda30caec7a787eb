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
 * own timeouts and retries, 5 s per name server and try by default); the
 * names of several nodes resolve side by side, each thread's end polled
 * with the other nodes' connects, so one silent name costs only its node.
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
    int done; /* atomic: set (release) once gai, err and res are written */
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
    __atomic_store_n(&j->done, 1, __ATOMIC_RELEASE); /* what came before is the dial's */
    eventfd_write(j->efd, 1);
    resolve_unref(j);
    return NULL;
}

/* HOST:PORT's addresses: an address at once into *RES (AI_NUMERICHOST:
 * no resolver), a name by getaddrinfo() in a thread of its own, *JOB,
 * whose eventfd is readable once it is done (resolve_take()); the caller
 * polls it beside its other dials and, when out of time, lets go of it
 * (resolve_unref(): the thread finishes alone). 0, or an EAI_* code
 * (EAI_SYSTEM: errno). */
static int resolve_start(const char *host, int port, struct addrinfo **res,
                         struct resolve_job **job)
{
    *res = NULL;
    *job = NULL;
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
    *job = j;
    return 0;
}

/* Whether JOB's thread is done (its eventfd became readable). */
static bool resolve_done(struct resolve_job *j)
{
    return __atomic_load_n(&j->done, __ATOMIC_ACQUIRE); /* its writes are ours then */
}

/* The outcome of JOB, done: its addresses into *RES, 0 or an EAI_* code
 * (EAI_SYSTEM: errno); JOB is let go of. */
static int resolve_take(struct resolve_job *j, struct addrinfo **res)
{
    int gai = j->gai, err = j->err;
    *res = j->res;
    j->res = NULL;
    resolve_unref(j);
    errno = err;
    return gai;
}

/* ========================================================= a wait's cancel */

/* A dial or request that serves an acquire's wait (a connection's WAIT,
 * set by dlock__redis_eval from its request; the wait given to a dial) ends at that
 * wait's cancel too: a request as a lost reply (the caller owes what a
 * request that was sent may still do, as after a timeout), a dial as a
 * dial that failed. The wait's eventfd is asked for only once a request
 * or dial has taken CANCEL_WATCH_AFTER_MS: nearly every reply comes
 * sooner and costs no eventfd (a system call pair, ~10% of an acquire);
 * a cancel in those first milliseconds is seen when they end. */
#define CANCEL_WATCH_AFTER_MS 10

struct cancel_watch {
    struct dlock__wait *w; /* NULL: not in a wait */
    int fd;                /* its eventfd once asked for, else -1 */
    int64_t arm_at;        /* when to ask for it (DLOCK__NEVER: done) */
    bool canceled;
};

static void cancel_watch_start(struct cancel_watch *cw, struct dlock__wait *w, int64_t now)
{
    cw->w = w;
    cw->fd = -1;
    cw->canceled = false;
    cw->arm_at = w ? now + CANCEL_WATCH_AFTER_MS : DLOCK__NEVER;
}

/* Ask for CW's eventfd once it is time (CW->canceled set when the wait
 * was canceled meanwhile); the poll's timeout, LEFT ms at most, ends
 * when it is time. */
static int cancel_watch_timeout(struct cancel_watch *cw, int64_t left)
{
    int64_t now = dlock__now_ms();
    if (cw->arm_at != DLOCK__NEVER && now >= cw->arm_at) {
        char msg[DLOCK__MSG_MAX];
        dlock__errmsg_save(msg);
        cw->canceled = dlock__wait_cancel_fd(cw->w, &cw->fd) == DLOCK_ECANCELED;
        dlock__errmsg_restore(DLOCK_OK, msg);
        cw->arm_at = DLOCK__NEVER;
    }
    if (cw->arm_at != DLOCK__NEVER && cw->arm_at - now < left)
        left = cw->arm_at - now;
    return (int)(left > 1000000 ? 1000000 : left);
}

/* ================================================================ dialing */

/* One dial of dlock__redis_conn_dial_many(): its connection, the
 * addresses of its name still to try, and where it stands. */
struct dialing {
    const struct redis_addr *a;
    struct rconn *k;
    struct addrinfo *res, *next;
    struct resolve_job *job; /* D_RESOLVING: its name's resolver */
    enum { D_RESOLVING, D_CONNECTING, D_HANDSHAKE, D_DONE, D_FAILED } state;
    short events; /* what it waits for */
    int err;      /* the last address's failure (errno) */
    int rc;
    char *msg;    /* DLOCK__MSG_MAX bytes: why it failed */
};

static void dial_failed(struct dialing *d, int rc)
{
    d->state = D_FAILED;
    d->rc = rc;
    snprintf(d->msg, DLOCK__MSG_MAX, "%s", dlock_errmsg());
    dlock__redis_conn_free(d->k);
    d->k = NULL;
}

/* D's name could not be resolved (GAI, an EAI_* code; errno for
 * EAI_SYSTEM). */
static void resolve_failed(struct dialing *d, int gai)
{
    dial_failed(d, dlock__err(DLOCK_ECONN, "%s: cannot resolve '%s': %s", d->k->where, d->a->host,
                              gai == EAI_SYSTEM ? strerror(errno) : gai_strerror(gai)));
}

/* D's socket is connected: options, then TLS when asked. */
static void dial_connected(struct dialing *d)
{
    if (!d->a->sock) {
        int one = 1;
        setsockopt(d->k->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        setsockopt(d->k->fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
    }
    if (!d->a->tls) {
        d->state = D_DONE;
        return;
    }
    int rc = dlock__redis_tls_start(d->k, d->a->tls, d->a->host);
    if (rc) {
        dial_failed(d, rc);
        return;
    }
    d->state = D_HANDSHAKE;
    rc = dlock__redis_tls_step(d->k, &d->events);
    if (rc)
        dial_failed(d, rc);
    else if (!d->events)
        d->state = D_DONE;
}

/* Start connecting D to its next address (a unix socket has one): at
 * once, or under way (POLLOUT), or failed when none is left. */
static void dial_next(struct dialing *d)
{
    for (;;) {
        struct rconn *k = d->k;
        if (k->fd >= 0)
            close(k->fd);
        k->fd = -1;
        int r;
        if (d->a->sock) {
            if (d->err) /* tried */
                break;
            struct sockaddr_un un = {.sun_family = AF_UNIX};
            strcpy(un.sun_path, d->a->sock);
            k->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
            r = k->fd < 0 ? -1 : connect(k->fd, (struct sockaddr *)&un, sizeof un);
        } else {
            if (!d->next)
                break;
            struct addrinfo *ai = d->next;
            d->next = ai->ai_next;
            k->fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
                           ai->ai_protocol);
            r = k->fd < 0 ? -1 : connect(k->fd, ai->ai_addr, ai->ai_addrlen);
        }
        if (r == 0) {
            dial_connected(d);
            return;
        }
        if (errno == EINPROGRESS || errno == EINTR) {
            d->state = D_CONNECTING;
            d->events = POLLOUT;
            return;
        }
        d->err = errno;
    }
    dial_failed(d, dlock__err(DLOCK_ECONN, "%s: cannot connect: %s", d->k->where,
                              strerror(d->err ? d->err : ENOENT)));
}

/* D's socket is ready for what it waited for. */
static void dial_ready(struct dialing *d)
{
    if (d->state == D_RESOLVING) {
        if (!resolve_done(d->job))
            return;
        int gai = resolve_take(d->job, &d->res);
        d->job = NULL;
        if (gai) {
            resolve_failed(d, gai);
            return;
        }
        d->next = d->res;
        dial_next(d);
        return;
    }
    if (d->state == D_CONNECTING) {
        int err = 0;
        socklen_t el = sizeof err;
        if (getsockopt(d->k->fd, SOL_SOCKET, SO_ERROR, &err, &el) < 0)
            err = errno;
        if (err) {
            d->err = err;
            dial_next(d);
        } else {
            dial_connected(d);
        }
        return;
    }
    int rc = dlock__redis_tls_step(d->k, &d->events);
    if (rc)
        dial_failed(d, rc);
    else if (!d->events)
        d->state = D_DONE;
}

/* hiredis's reply functions, but an array header over REDIS_MAX_ELEMENTS
 * breaks the connection (the reader's privdata) before anything is
 * allocated. */
static redisReplyObjectFunctions capped_fn;
static void *(*hiredis_create_array)(const redisReadTask *, int);
static pthread_once_t capped_once = PTHREAD_ONCE_INIT;

static void *create_array_capped(const redisReadTask *task, int elements)
{
    if (elements > REDIS_MAX_ELEMENTS) {
        dlock__redis_conn_fail(task->privdata, "a reply array of %d elements (dlock's cap: %d); "
                                               "connection closed",
                               elements, REDIS_MAX_ELEMENTS);
        return NULL;
    }
    return hiredis_create_array(task, elements);
}

static void capped_fn_make(void)
{
    redisReader *r = redisReaderCreate(); /* for hiredis's own functions */
    if (!r)
        return;
    capped_fn = *r->fn;
    hiredis_create_array = capped_fn.createArray;
    capped_fn.createArray = create_array_capped;
    redisReaderFree(r);
}

struct rconn *dlock__redis_conn_new(void)
{
    pthread_once(&capped_once, capped_fn_make);
    struct rconn *k = calloc(1, sizeof *k);
    if (!k)
        return NULL;
    k->fd = -1;
    k->reader = hiredis_create_array ? redisReaderCreateWithFunctions(&capped_fn) : NULL;
    if (!k->reader) {
        free(k);
        return NULL;
    }
    k->reader->privdata = k;
    return k;
}

/* Set D up for A: the connection (its name for messages, its reader) and
 * A's addresses -- at once, or D_RESOLVING until its resolver is done --
 * then the first connect. */
static void dial_start(struct dialing *d, const struct redis_addr *a, char *msg)
{
    memset(d, 0, sizeof *d);
    d->a = a;
    d->msg = msg;
    struct rconn *k = d->k = dlock__redis_conn_new();
    if (!k) {
        dial_failed(d, dlock__err(DLOCK_ENOMEM, "out of memory"));
        return;
    }
    if (a->sock)
        snprintf(k->where, sizeof k->where, "redis unix:%s", a->sock);
    else
        snprintf(k->where, sizeof k->where, strchr(a->host, ':') ? "%s [%s]:%d" : "%s %s:%d",
                 a->tls ? "rediss" : "redis", a->host, a->port);
    if (a->sock && strlen(a->sock) >= sizeof ((struct sockaddr_un *)0)->sun_path) {
        dial_failed(d, dlock__err(DLOCK_EBADURL, "%s: the socket path is too long", k->where));
        return;
    }
    if (!a->sock) {
        int gai = resolve_start(a->host, a->port, &d->res, &d->job);
        if (gai) {
            resolve_failed(d, gai);
            return;
        }
        if (d->job) {
            d->state = D_RESOLVING;
            d->events = POLLIN;
            return;
        }
        d->next = d->res;
    }
    dial_next(d);
}

/* Fail every dial of D[0..N) still under way: its wait was canceled. */
static void dials_canceled(struct dialing *d, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (d[i].state == D_RESOLVING) {
            resolve_unref(d[i].job); /* the thread frees it when it is done */
            d[i].job = NULL;
        }
        if (d[i].state == D_RESOLVING || d[i].state == D_CONNECTING || d[i].state == D_HANDSHAKE)
            dial_failed(&d[i], dlock__err(DLOCK_ECANCELED, "%s: the wait was canceled while "
                                                           "connecting",
                                          d[i].k->where));
    }
}

void dlock__redis_conn_dial_many(const struct redis_addr *a, size_t n, int64_t until, size_t need,
                                 struct dlock__wait *w, struct rconn **out, int *rc,
                                 char (*msg)[DLOCK__MSG_MAX])
{
    int64_t budget = ms_until(until), start = dlock__now_ms();
    bool quorum = false; /* NEED connected: UNTIL is now the grace's end */
    struct cancel_watch cw;
    cancel_watch_start(&cw, w, start);
    struct dialing stack[8], *d = n <= 8 ? stack : calloc(n, sizeof *d);
    struct pollfd pstack[9], *p = n < 9 ? pstack : calloc(n + 1, sizeof *p);
    if (!d || !p) {
        for (size_t i = 0; i < n; i++) {
            out[i] = NULL;
            rc[i] = dlock__err(DLOCK_ENOMEM, "out of memory");
            snprintf(msg[i], DLOCK__MSG_MAX, "out of memory");
        }
        if (d != stack)
            free(d);
        if (p != pstack)
            free(p);
        return;
    }
    for (size_t i = 0; i < n; i++)
        dial_start(&d[i], &a[i], msg[i]); /* names resolved side by side */
    for (;;) {
        size_t busy = 0, done = 0;
        for (size_t i = 0; i < n; i++) {
            bool waiting = d[i].state == D_RESOLVING || d[i].state == D_CONNECTING ||
                           d[i].state == D_HANDSHAKE;
            p[i].fd = !waiting ? -1 : d[i].state == D_RESOLVING ? d[i].job->efd : d[i].k->fd;
            p[i].events = waiting ? d[i].events : 0;
            p[i].revents = 0;
            busy += waiting;
            done += d[i].state == D_DONE;
        }
        if (!busy)
            break;
        if (!quorum && done >= need) {
            /* the others get a grace: four times what those took, at
             * least 25 ms and a quarter of the bound (a node further
             * away than the rest still gets in), not the whole bound */
            quorum = true;
            int64_t took = dlock__now_ms() - start, grace = 4 * took;
            if (grace < 25)
                grace = 25;
            if (grace < budget / 4)
                grace = budget / 4;
            if (dlock__now_ms() + grace < until)
                until = dlock__now_ms() + grace;
        }
        int64_t left = ms_until(until);
        if (left == 0) {
            for (size_t i = 0; i < n; i++) {
                if (d[i].state == D_RESOLVING) {
                    resolve_unref(d[i].job); /* the thread frees it when it is done */
                    d[i].job = NULL;
                    dial_failed(&d[i], dlock__err(DLOCK_ECONN, "%s: cannot resolve '%s': no "
                                                               "answer within %lld ms",
                                                  d[i].k->where, d[i].a->host,
                                                  (long long)budget));
                } else if (d[i].state == D_CONNECTING && quorum)
                    dial_failed(&d[i], dlock__err(DLOCK_ECONN, "%s: cannot connect: no answer "
                                                               "within %lld ms, while the others "
                                                               "answered",
                                                  d[i].k->where,
                                                  (long long)(dlock__now_ms() - start)));
                else if (d[i].state == D_CONNECTING)
                    dial_failed(&d[i], dlock__err(DLOCK_ECONN, "%s: cannot connect: no answer "
                                                               "within %lld ms",
                                                  d[i].k->where, (long long)budget));
                else if (d[i].state == D_HANDSHAKE)
                    dial_failed(&d[i], dlock__err(DLOCK_ECONN, "%s: TLS handshake: no answer "
                                                               "within %lld ms (is it a plain, "
                                                               "non-TLS port? then use redis://)",
                                                  d[i].k->where, (long long)budget));
            }
            break;
        }
        int timeout = cancel_watch_timeout(&cw, left);
        if (cw.canceled) {
            dials_canceled(d, n);
            break;
        }
        p[n] = (struct pollfd){.fd = cw.fd, .events = POLLIN};
        int got = poll(p, (nfds_t)(n + (cw.fd >= 0)), timeout);
        if (got < 0 && errno != EINTR) {
            int e = errno;
            for (size_t i = 0; i < n; i++) {
                if (d[i].state == D_RESOLVING) {
                    resolve_unref(d[i].job);
                    d[i].job = NULL;
                }
                if (p[i].fd >= 0)
                    dial_failed(&d[i], dlock__errno(DLOCK_ECONN, e, "%s: poll", d[i].k->where));
            }
            break;
        }
        for (size_t i = 0; got > 0 && i < n; i++)
            if (p[i].fd >= 0 && p[i].revents)
                dial_ready(&d[i]);
        if (got > 0 && cw.fd >= 0 && p[n].revents) {
            dials_canceled(d, n); /* a dial done with it is kept */
            break;
        }
    }
    for (size_t i = 0; i < n; i++) {
        if (d[i].res)
            freeaddrinfo(d[i].res);
        out[i] = d[i].state == D_DONE ? d[i].k : NULL;
        rc[i] = d[i].state == D_DONE ? DLOCK_OK : d[i].rc;
    }
    if (d != stack)
        free(d);
    if (p != pstack)
        free(p);
}

int dlock__redis_conn_dial(const struct redis_addr *a, int64_t until, struct rconn **out)
{
    int rc;
    char msg[1][DLOCK__MSG_MAX];
    dlock__redis_conn_dial_many(a, 1, until, 1, NULL, out, &rc, msg);
    return rc ? dlock__errmsg_restore(rc, msg[0]) : DLOCK_OK;
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

void dlock__redis_conn_feed(struct rconn *k, const char *buf, size_t n)
{
    if (k->broken)
        return;
    if (redisReaderFeed(k->reader, buf, n) != REDIS_OK) {
        dlock__redis_conn_fail(k, "out of memory");
        return;
    }
    k->partial += n;
    parse_replies(k);
}

/* ====================================================== the one poll loop */

short dlock__redis_conn_events(const struct rconn *k)
{
    if (k->broken || k->fd < 0)
        return 0;
    bool out = k->out_off < k->out_len && !k->tls_write_wants_read;
    return (short)(POLLIN | (out || k->tls_want_write ? POLLOUT : 0));
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
        dlock__redis_conn_feed(k, buf, (size_t)n);
        if (k->broken)
            return;
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
    if (k->tls_write_wants_read)
        pump_out(k); /* what it waited for may have come in just now */
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

/* Fail every connection of KS[0..N) that still owes something: the wait
 * was canceled (the reply of what was sent is lost to the caller). */
static void fail_canceled(struct rconn **ks, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (conn_busy(ks[i]))
            dlock__redis_conn_fail(ks[i], ks[i]->out_off < ks[i]->out_len
                                              ? "the wait was canceled before it was sent"
                                              : "the wait was canceled before the reply came");
}

int dlock__redis_exchange_quorum(struct rconn **ks, size_t n, int64_t until, const char *what,
                                 size_t need)
{
    int64_t budget = ms_until(until), start = dlock__now_ms();
    bool quorum = false; /* NEED answered: UNTIL is now the grace's end */
    struct cancel_watch cw;
    struct dlock__wait *w = NULL;
    for (size_t i = 0; i < n && !w; i++)
        w = ks[i]->wait;
    cancel_watch_start(&cw, w, start);
    struct pollfd stack[9], *p = n < 9 ? stack : calloc(n + 1, sizeof *p);
    if (!p)
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    /* Send at once: the common case needs no poll to send. Plain TCP only
     * sends here: a reply is not back before a round trip, so a recv now
     * would cost one EAGAIN per request (strace: send, recv EAGAIN, poll,
     * recv); the poll below says when it is there. TLS pumps both ways
     * (a write may need a read first). */
    for (size_t i = 0; i < n; i++)
        if (ks[i]->fd >= 0 && ks[i]->tls)
            dlock__redis_conn_pump(ks[i], 0);
        else if (ks[i]->fd >= 0 && !ks[i]->broken)
            pump_out(ks[i]);
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
        int timeout = cancel_watch_timeout(&cw, left);
        if (cw.canceled) {
            fail_canceled(ks, n);
            break;
        }
        p[n] = (struct pollfd){.fd = cw.fd, .events = POLLIN};
        int got = poll(p, (nfds_t)(n + (cw.fd >= 0)), timeout);
        if (got < 0 && errno != EINTR) {
            for (size_t i = 0; i < n; i++)
                if (p[i].fd >= 0)
                    dlock__redis_conn_fail(ks[i], "poll: %s", strerror(errno));
            break;
        }
        for (size_t i = 0; got > 0 && i < n; i++)
            if (p[i].fd >= 0 && p[i].revents)
                dlock__redis_conn_pump(ks[i], p[i].revents);
        if (got > 0 && cw.fd >= 0 && p[n].revents) {
            fail_canceled(ks, n); /* a reply that came with it is kept */
            break;
        }
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
