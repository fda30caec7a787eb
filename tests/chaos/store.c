/* store.c -- the fenced store of the fault harness: the one process whose
 * records say what really happened, trusting nothing dlock reports.
 *
 * Workers talk to it over a unix socket (a path, so it crosses network
 * namespaces and no network fault reaches it), one line per request and
 * one line back. For each lock name it keeps a counter and a fence: the
 * highest token it has accepted. A critical section opens with BEGIN
 * (name, token), reads and writes the counter with READ/WRITE, and closes
 * with END, or when its worker is killed (KILL, from the orchestrator)
 * or its connection closes.
 * BEGIN, READ and WRITE with a token below the fence are refused (STALE):
 * that is what a fenced service does, and it makes the read-modify-write
 * safe even when two holders overlap. Every time is the store's own
 * monotonic clock at receipt.
 *
 * On DUMP it counts, per phase (PHASE k marks when each began), what
 * struct chaos_counts lists, writes the array to a file and exits.
 */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "chaos.h"

/* ------------------------------------- what every process of the harness uses */

int64_t chaos_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

uint64_t chaos_rand(uint64_t *state)
{
    /* splitmix64: small, and the same sequence for the same seed everywhere */
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

int64_t chaos_between(uint64_t *state, int64_t lo, int64_t hi)
{
    return hi <= lo ? lo : lo + (int64_t)(chaos_rand(state) % (uint64_t)(hi - lo + 1));
}

/* ------------------------------------------------------------ client side */

int chaos_store_connect(const char *path)
{
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof a.sun_path, "%s", path);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

bool chaos_store_call(int fd, char *reply, size_t len, const char *fmt, ...)
{
    char line[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line - 1, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof line - 1)
        return false;
    line[n++] = '\n';
    for (int off = 0; off < n;) {
        ssize_t w = write(fd, line + off, (size_t)(n - off));
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return false;
        off += (int)w;
    }
    /* the answer is one short line; read it byte-wise up to '\n' */
    size_t got = 0;
    for (;;) {
        char c;
        ssize_t r = read(fd, &c, 1);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return false;
        if (c == '\n')
            break;
        if (got + 1 < len)
            reply[got++] = c;
    }
    reply[got] = '\0';
    return true;
}

/* ------------------------------------------------------------ the records */

struct section {
    int name;
    int conn;             /* the connection that began it */
    int phase;            /* current phase at BEGIN */
    uint64_t token;
    int64_t begin, end;   /* end 0: still open */
    int64_t last_ok;      /* last accepted op (BEGIN included) */
    bool begin_ok;        /* BEGIN accepted */
    bool regression;      /* its token was not above every earlier one */
    uint64_t name_max;    /* the highest token of the name's sections up to this one */
    size_t name_max_sec;  /* the section that carried it */
    bool repeat;          /* the same owner given its own last token again */
    long stale;           /* its ops refused */
    int64_t lost_at;      /* lost callback receipt (0: none) */
    int lost_phase;
};

struct name_state {
    uint64_t fence;       /* highest token accepted */
    uint64_t max_begin;   /* highest token any BEGIN carried */
    size_t max_sec;       /* the section that carried it */
    long value;
};

#define MAX_PHASES FAULT_COUNT
#define MAX_CONNS 256

struct store {
    char who[MAX_CONNS][24]; /* each connection's HELLO: "worker.thread" */
    struct section *sec;
    size_t nsec, cap;
    struct name_state *names;
    int nnames;
    int phase;
    int64_t phase_start[MAX_PHASES + 1];
    int64_t last_write;
    struct chaos_counts c[MAX_PHASES];
};

static struct chaos_counts *cur(struct store *s)
{
    return &s->c[s->phase];
}

/* The gap since the last accepted write (or the phase start) up to NOW,
 * kept as the phase's longest. */
static void note_gap(struct store *s, int64_t now)
{
    int64_t from = s->last_write > s->phase_start[s->phase] ? s->last_write : s->phase_start[s->phase];
    if (now - from > cur(s)->max_gap_ms)
        cur(s)->max_gap_ms = now - from;
}

static struct section *find(struct store *s, long sid)
{
    return sid >= 0 && (size_t)sid < s->nsec ? &s->sec[sid] : NULL;
}

/* Whether two "worker.thread" names are of one worker process. */
static bool same_worker(const char *a, const char *b)
{
    size_t la = strcspn(a, "."), lb = strcspn(b, ".");
    return la == lb && strncmp(a, b, la) == 0;
}

static long begin(struct store *s, int conn, int name, uint64_t token, int64_t asked, int64_t now)
{
    if (s->nsec == s->cap) {
        s->cap = s->cap ? s->cap * 2 : 1024;
        s->sec = realloc(s->sec, s->cap * sizeof *s->sec);
        if (!s->sec)
            abort();
    }
    struct name_state *n = &s->names[name];
    struct section *x = &s->sec[s->nsec];
    memset(x, 0, sizeof *x);
    x->name = name;
    x->conn = conn;
    x->phase = s->phase;
    x->token = token;
    x->begin = now;
    /* A regression: a section that had begun before this holder even
     * asked (ASKED, the worker's clock = ours) carried this token or a
     * higher one. A holder that learns of its grant late (a reply held up
     * by a paused server) is no regression: its BEGIN is merely stale.
     * The same worker process (the owner etcd and ZooKeeper see; a Redis
     * owner is one of its threads) given its own last token again is a
     * repeat, counted apart (docs/safety.md, "Findings"). */
    for (size_t i = s->nsec; i-- > 0;) {
        struct section *p = &s->sec[i];
        if (p->name != name || p->begin >= asked)
            continue;
        if (p->name_max >= token) {
            struct section *top = &s->sec[p->name_max_sec];
            x->repeat = top->token == token && same_worker(s->who[top->conn], s->who[conn]);
            x->regression = !x->repeat;
            fprintf(stderr, "chaos store: token %s on name %d: %s asked at %lld, began with %llu "
                    "at %lld; %s had begun with %llu at %lld (ended %lld)\n",
                    x->repeat ? "repeat" : "regression", name, s->who[conn], (long long)asked,
                    (unsigned long long)token, (long long)now, s->who[top->conn],
                    (unsigned long long)top->token, (long long)top->begin, (long long)top->end);
        }
        break;
    }
    if (token > n->max_begin) {
        n->max_begin = token;
        n->max_sec = s->nsec;
    }
    x->name_max = n->max_begin;
    x->name_max_sec = n->max_sec;
    cur(s)->acquisitions++;
    if (x->regression)
        cur(s)->token_regressions++;
    if (x->repeat)
        cur(s)->token_repeats++;
    if (token < n->fence) {
        x->stale++;
        cur(s)->stale_rejected++;
    } else {
        n->fence = token;
        x->begin_ok = true;
        x->last_ok = now;
    }
    return (long)s->nsec++;
}

/* A fenced op of section X: false (STALE) when its token is below the fence. */
static bool fenced(struct store *s, struct section *x, int64_t now)
{
    struct name_state *n = &s->names[x->name];
    if (x->token < n->fence) {
        x->stale++;
        cur(s)->stale_rejected++;
        return false;
    }
    n->fence = x->token;
    x->last_ok = now;
    return true;
}

static void handle(struct store *s, int conn, char *line, char *out, size_t len)
{
    int64_t now = chaos_now_ms();
    char name[64];
    unsigned long long token;
    long long asked;
    long sid, value;
    int k;
    struct section *x;
    snprintf(out, len, "OK");
    if (sscanf(line, "PHASE %d", &k) == 1 && k >= 0 && k < MAX_PHASES) {
        note_gap(s, now);
        s->phase = k;
        s->phase_start[k] = now;
    } else if (sscanf(line, "BEGIN %63s %llu %lld", name, &token, &asked) == 3) {
        int i = atoi(name);
        if (i < 0 || i >= s->nnames) {
            snprintf(out, len, "ERR name");
            return;
        }
        sid = begin(s, conn, i, token, (int64_t)asked, now);
        snprintf(out, len, "%s %ld", s->sec[sid].begin_ok ? "OK" : "STALE", sid);
    } else if (sscanf(line, "READ %ld", &sid) == 1 && (x = find(s, sid))) {
        if (fenced(s, x, now))
            snprintf(out, len, "OK %ld", s->names[x->name].value);
        else
            snprintf(out, len, "STALE");
    } else if (sscanf(line, "WRITE %ld %ld", &sid, &value) == 2 && (x = find(s, sid))) {
        if (fenced(s, x, now)) {
            struct name_state *n = &s->names[x->name];
            if (value != n->value + 1)
                cur(s)->lost_updates++;
            n->value = value;
            cur(s)->writes++;
            note_gap(s, now);
            s->last_write = now;
        } else {
            snprintf(out, len, "STALE");
        }
    } else if (sscanf(line, "END %ld", &sid) == 1 && (x = find(s, sid))) {
        if (!x->end)
            x->end = now;
    } else if (sscanf(line, "CUT %ld", &sid) == 1 && find(s, sid)) {
        cur(s)->stopped_on_lost++;
    } else if (sscanf(line, "LOST %ld", &sid) == 1 && (x = find(s, sid))) {
        if (!x->lost_at) {
            x->lost_at = now;
            x->lost_phase = s->phase;
        }
    } else if (sscanf(line, "LOSTREL %ld", &sid) == 1 && (x = find(s, sid))) {
        if (!x->lost_at)
            cur(s)->lost_at_release++;
    } else if (sscanf(line, "KILL %d", &k) == 1) {
        /* the orchestrator is about to kill -9 worker K: its sections end
         * now (the kernel may free a file lock before we see it die) */
        char prefix[24];
        int pl = snprintf(prefix, sizeof prefix, "%d.", k);
        for (size_t i = 0; i < s->nsec; i++)
            if (!s->sec[i].end && strncmp(s->who[s->sec[i].conn], prefix, (size_t)pl) == 0)
                s->sec[i].end = now;
    } else if (strncmp(line, "ERR", 3) == 0) {
        cur(s)->errors++;
    } else if (strncmp(line, "BUSY", 4) == 0) {
        cur(s)->contention++;
    } else if (strncmp(line, "HUNG", 4) == 0) {
        cur(s)->hangs++; /* a call past its own bound, seen by the worker */
    } else if (strncmp(line, "HELLO ", 6) == 0) {
        snprintf(s->who[conn], sizeof s->who[conn], "%s", line + 6);
    } else {
        snprintf(out, len, "ERR what");
    }
}

/* A closed connection ends the sections its worker still had open. */
static void closed(struct store *s, int conn)
{
    int64_t now = chaos_now_ms();
    for (size_t i = 0; i < s->nsec; i++)
        if (s->sec[i].conn == conn && !s->sec[i].end)
            s->sec[i].end = now;
}

static void analyse(struct store *s, int64_t now)
{
    note_gap(s, now);
    for (size_t i = 0; i < s->nsec; i++)
        if (!s->sec[i].end)
            s->sec[i].end = now;
    for (size_t i = 0; i < s->nsec; i++) {
        struct section *a = &s->sec[i];
        /* sections are in BEGIN order: a later one on the name that began
         * before A ended overlaps it. One overlap per section overlapped,
         * however many began inside it; accepted when the store took an
         * op of A after one of them had begun. */
        struct section *first = NULL;
        bool accepted = false;
        for (size_t j = i + 1; j < s->nsec && s->sec[j].begin < a->end; j++) {
            struct section *b = &s->sec[j];
            if (b->name != a->name)
                continue;
            if (!first)
                first = b;
            accepted = accepted || (b->begin_ok && a->last_ok > b->begin);
        }
        if (first) {
            s->c[first->phase].overlaps++;
            s->c[first->phase].overlaps_accepted += accepted;
            if (getenv("CHAOS_DEBUG"))
                fprintf(stderr, "chaos store: overlap on name %d: %s token %llu [%lld, %lld] last op %lld "
                        "stale %ld lost %lld; then %s token %llu began at %lld%s\n", a->name,
                        s->who[a->conn], (unsigned long long)a->token, (long long)a->begin,
                        (long long)a->end, (long long)a->last_ok, a->stale, (long long)a->lost_at,
                        s->who[first->conn], (unsigned long long)first->token, (long long)first->begin,
                        accepted ? " (accepted)" : "");
        }
        if (a->lost_at) {
            bool after = false;
            for (size_t j = i + 1; j < s->nsec && s->sec[j].begin <= a->lost_at && !after; j++)
                after = s->sec[j].name == a->name && s->sec[j].begin_ok;
            if (after)
                s->c[a->lost_phase].lost_after++;
            else
                s->c[a->lost_phase].lost_before++;
        }
    }
}

#define BUFSZ 4096
struct conn {
    int fd;
    size_t used;
    char buf[BUFSZ];
};

void chaos_store_main(const char *path, const char *dump_path, int names)
{
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    signal(SIGPIPE, SIG_IGN);
    static struct store s;
    s.nnames = names;
    s.names = calloc((size_t)names, sizeof *s.names);
    s.phase_start[0] = chaos_now_ms();
    s.last_write = 0;
    int lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof a.sun_path, "%s", path);
    unlink(path);
    if (lfd < 0 || bind(lfd, (struct sockaddr *)&a, sizeof a) != 0 || listen(lfd, 64) != 0) {
        perror("chaos store: listen");
        _exit(2);
    }
    static struct conn conns[MAX_CONNS];
    /* CHAOS_DEBUG=2: every request and its answer on stderr */
    const char *debug = getenv("CHAOS_DEBUG");
    bool trace = debug && atoi(debug) >= 2;
    struct pollfd pfd[MAX_CONNS + 1];
    for (int i = 0; i < MAX_CONNS; i++)
        conns[i].fd = -1;
    for (;;) {
        int n = 0;
        pfd[n++] = (struct pollfd){.fd = lfd, .events = POLLIN};
        int map[MAX_CONNS + 1];
        for (int i = 0; i < MAX_CONNS; i++)
            if (conns[i].fd >= 0) {
                map[n] = i;
                pfd[n++] = (struct pollfd){.fd = conns[i].fd, .events = POLLIN};
            }
        if (poll(pfd, (nfds_t)n, -1) < 0) {
            if (errno == EINTR)
                continue;
            _exit(2);
        }
        if (pfd[0].revents & POLLIN) {
            int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
            int slot = -1;
            for (int i = 0; i < MAX_CONNS && slot < 0; i++)
                if (conns[i].fd < 0)
                    slot = i;
            if (fd >= 0 && slot >= 0) {
                conns[slot].fd = fd;
                snprintf(s.who[slot], sizeof s.who[slot], "?");
                conns[slot].used = 0;
            } else if (fd >= 0) {
                close(fd);
            }
        }
        for (int p = 1; p < n; p++) {
            if (!pfd[p].revents)
                continue;
            struct conn *c = &conns[map[p]];
            ssize_t r = read(c->fd, c->buf + c->used, BUFSZ - 1 - c->used);
            if (r <= 0) {
                if (r < 0 && errno == EINTR)
                    continue;
                close(c->fd);
                c->fd = -1;
                closed(&s, map[p]);
                continue;
            }
            c->used += (size_t)r;
            char *start = c->buf, *nl;
            while ((nl = memchr(start, '\n', c->used - (size_t)(start - c->buf)))) {
                *nl = '\0';
                char out[128];
                if (strcmp(start, "DUMP") == 0) {
                    analyse(&s, chaos_now_ms());
                    FILE *f = fopen(dump_path, "w");
                    bool ok = f && fwrite(s.c, sizeof s.c, 1, f) == 1;
                    if (f)
                        ok = fclose(f) == 0 && ok;
                    (void)!write(c->fd, ok ? "OK\n" : "ERR\n", ok ? 3 : 4);
                    _exit(ok ? 0 : 2);
                }
                handle(&s, map[p], start, out, sizeof out - 1);
                if (trace)
                    fprintf(stderr, "chaos store: %lld %s: %s -> %s\n", (long long)chaos_now_ms(),
                            s.who[map[p]], start, out);
                size_t l = strlen(out);
                out[l++] = '\n';
                (void)!write(c->fd, out, l);
                start = nl + 1;
            }
            c->used -= (size_t)(start - c->buf);
            memmove(c->buf, start, c->used);
            if (c->used == BUFSZ - 1)
                c->used = 0; /* a line that long is not ours */
        }
    }
}

bool chaos_store_analyse(const char *dump_path, int nphases, struct chaos_result *res)
{
    struct chaos_counts c[MAX_PHASES];
    FILE *f = fopen(dump_path, "r");
    bool ok = f && fread(c, sizeof c, 1, f) == 1;
    if (f)
        fclose(f);
    if (!ok)
        return false;
    for (int k = 0; k < nphases && k < MAX_PHASES; k++) {
        long faults = res->phase[k].faults, hangs = res->phase[k].hangs;
        res->phase[k] = c[k];
        res->phase[k].faults = faults;
        res->phase[k].hangs = hangs + c[k].hangs; /* the orchestrator's and the workers' */
    }
    return true;
}
