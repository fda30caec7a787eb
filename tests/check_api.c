/* check_api.c -- the core's own promises, tested on the file backend where
 * a server is not needed: duration and URL parsing (a password never
 * reaches a message, an unknown option is refused before any dial, URL
 * options keep setopt's ranges), out-of-memory paths, handle-owned holds,
 * the cancel object and the mode rules (downgrade, upgrade) and the
 * capability checks made before a backend is called; and that docs/man3
 * documents every function of dlock.h with its prototype.
 *
 * White-box where a promise is internal (dlock__parse_duration, the
 * parsed URL): the test includes src/internal.h for those. Each test runs in
 * its own process (Check's fork mode) with a time limit.
 */
#include <check.h>
#include <errno.h>
#include <dirent.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "internal.h"
#include "dlock.h"
#include "fixture_etcd.h"
#include "fixture_redis.h"
#include "testutil.h"

static char *dir, *url;

static void setup(void)
{
    tu_file_fixture("api", &dir, &url);
}

static void teardown(void)
{
    tu_file_fixture_end(&dir, &url);
}

/* One call made in a thread of its own, and what it saw. */
struct in_thread {
    dlock_lock *l;
    int64_t wait_ms;
    dlock_cancel *cancel;
    enum { DO_ACQUIRE, DO_RELEASE, DO_TOKEN } what;
    int rc;
    uint64_t token;
    unsigned count; /* dlock_hold_count() after the call */
    atomic_long tid; /* the thread's id, set before the call */
};

static void *run_in_thread(void *arg)
{
    struct in_thread *t = arg;
    t->tid = (long)syscall(SYS_gettid);
    if (t->what == DO_ACQUIRE)
        t->rc = dlock_acquire_ex(t->l, t->wait_ms, t->cancel);
    else if (t->what == DO_RELEASE)
        t->rc = dlock_release(t->l);
    else
        t->rc = dlock_token(t->l, &t->token);
    t->count = dlock_hold_count(t->l);
    return NULL;
}

/* Run T in a new thread and wait for it. */
static void in_thread(struct in_thread *t)
{
    pthread_t th;
    ck_assert_int_eq(pthread_create(&th, NULL, run_in_thread, t), 0);
    pthread_join(th, NULL);
}

/* Wait until thread TID sleeps in poll() or ppoll() (the file backend's
 * wait for a release): a condition read from /proc, not a fixed sleep. */
static void wait_until_polling(const atomic_long *tid)
{
    for (;;) {
        if (*tid) {
            char *path = tu_fmt("/proc/self/task/%ld/syscall", *tid);
            char *text = tu_read_file(path);
            long nr = text ? strtol(text, NULL, 10) : -1;
            free(text);
            free(path);
#ifdef SYS_poll
            if (nr == SYS_poll)
                return;
#endif
            if (nr == SYS_ppoll)
                return;
        }
        tu_sleep_ms(2);
    }
}

/* ---------------------------------------------------- out of memory */

/* strndup() interposed: the library is linked statically into this
 * binary, so its calls come here. Fails the Nth call from now when
 * fail_strndup_at > 0. */
static int fail_strndup_at;
char *strndup(const char *s, size_t n)
{
    if (fail_strndup_at > 0 && --fail_strndup_at == 0) {
        errno = ENOMEM;
        return NULL;
    }
    size_t len = strnlen(s, n);
    char *d = malloc(len + 1);
    if (d) {
        memcpy(d, s, len);
        d[len] = 0;
    }
    return d;
}

/* --------------------------------------------------------- durations */

TU_TEST(duration_parse, 60)
{
    ck_assert_int_eq(dlock__parse_duration("250"), 250);
    ck_assert_int_eq(dlock__parse_duration("250ms"), 250);
    ck_assert_int_eq(dlock__parse_duration("1.5s"), 1500);
    ck_assert_int_eq(dlock__parse_duration("2m"), 120000);
    ck_assert_int_eq(dlock__parse_duration("1h"), 3600000);
    ck_assert_int_eq(dlock__parse_duration("0.0005s"), 1); /* rounded */
    ck_assert_int_eq(dlock__parse_duration("0"), 0);
    const char *bad[] = {"nan", "NaN", "nanms", "nan(1)s", "inf", "infinity", "-1", "+1",
                         " 1", "1 ", "0x10", "1e3", "1.", ".5", "1.5.2", "", "s", "10d",
                         "99999999999999999999", "1000000000001"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        ck_assert_msg(dlock__parse_duration(bad[i]) == -1, "'%s' gave %lld", bad[i],
                      (long long)dlock__parse_duration(bad[i]));
    ck_assert_int_eq(dlock__parse_duration(NULL), -1);
}

/* URL durations keep the range setopt keeps (at most a year). */
TU_TEST(url_duration_range, 60)
{
    dlock_client *c = NULL;
    const char *opts[] = {"lease=9000h", "timeout=9000h", "connect_timeout=9000h",
                          "drift=9000h", "lease=nan", "lease=0", "timeout=1e3"};
    for (size_t i = 0; i < sizeof opts / sizeof *opts; i++) {
        char *u = tu_fmt("%s?%s", url, opts[i]);
        int rc = dlock_client_new(u, &c);
        ck_assert_msg(rc == DLOCK_EBADURL, "%s: got %s", u, dlock_err_name(rc));
        ck_assert_ptr_null(c);
        ck_assert_msg(strstr(dlock_errmsg(), opts[i]), "%s: '%s'", u, dlock_errmsg());
        free(u);
    }
    char *u = tu_fmt("%s?lease=8760h&drift=0", url);
    ck_assert_int_eq(dlock_client_new(u, &c), DLOCK_OK);
    ck_assert_int_eq(c->opts.lease_ms, (365LL * 86400000));
    ck_assert_int_eq(dlock_client_setopt_int(c, DLOCK_OPT_LEASE_MS, (365LL * 86400000) + 1),
                     DLOCK_EINVAL);
    dlock_client_close(c);
    free(u);
}

/* Every strndup() of dlock_client_new failing in turn: ENOMEM, never a
 * crash (the scheme's copy was used unchecked). */
TU_TEST(url_out_of_memory, 60)
{
    const char *urls[] = {"redis://admin:pw@h1:7000/2?timeout=1s", "file:///tmp",
                          "etcd://[::1]:2379,h2:2379"};
    for (size_t k = 0; k < sizeof urls / sizeof *urls; k++) {
        bool passed_all = false;
        for (int n = 1; n < 50 && !passed_all; n++) {
            dlock_client *c = NULL;
            fail_strndup_at = n;
            int rc = dlock_client_new(urls[k], &c);
            passed_all = fail_strndup_at > 0; /* the Nth call never came */
            fail_strndup_at = 0;
            if (rc == DLOCK_OK) {
                dlock_client_close(c);
                continue;
            }
            ck_assert_msg(rc == DLOCK_ENOMEM || rc == DLOCK_ENOTBUILT,
                          "%s, strndup #%d failing: %s (%s)", urls[k], n, dlock_err_name(rc),
                          dlock_errmsg());
            ck_assert_ptr_null(c);
        }
        ck_assert(passed_all);
    }
}

/* ----------------------------------------------------- unknown options */

/* An unknown option is refused by dlock_client_new(), before the backend
 * dials: against a port where nothing listens the answer is EBADURL, not
 * ECONN after a connect timeout. */
TU_TEST(unknown_option_before_dial, 60)
{
    int port = tu_free_port();
    const char *schemes[] = {
#ifdef DLOCK_HAVE_REDIS
        "redis",
#endif
#ifdef DLOCK_HAVE_ETCD
        "etcd",
#endif
#ifdef DLOCK_HAVE_ZK
        "zk",
#endif
#ifdef DLOCK_HAVE_POSTGRES
        "postgres",
#endif
    };
    for (size_t i = 0; i < sizeof schemes / sizeof *schemes; i++) {
        char *u = tu_fmt("%s://127.0.0.1:%d?connect_timeout=30s&colour=blue", schemes[i], port);
        dlock_client *c = (dlock_client *)1;
        int rc = dlock_client_new(u, &c);
        ck_assert_msg(rc == DLOCK_EBADURL, "%s: %s (%s)", u, dlock_err_name(rc), dlock_errmsg());
        ck_assert_ptr_null(c);
        ck_assert_ptr_nonnull(strstr(dlock_errmsg(), "colour"));
        rc = dlock_open(u, &c);
        ck_assert_msg(rc == DLOCK_EBADURL, "%s: %s (%s)", u, dlock_err_name(rc), dlock_errmsg());
        free(u);
    }
    /* A backend's own option is unknown to another backend. */
    char *u = tu_fmt("%s?db=2", url);
    dlock_client *c = NULL;
    ck_assert_int_eq(dlock_client_new(u, &c), DLOCK_EBADURL);
    ck_assert_ptr_nonnull(strstr(dlock_errmsg(), "'db'"));
    free(u);
#ifdef DLOCK_HAVE_REDIS
    u = tu_fmt("redis://127.0.0.1:%d?base=/x", port);
    ck_assert_int_eq(dlock_client_new(u, &c), DLOCK_EBADURL);
    free(u);
    u = tu_fmt("redis://127.0.0.1:%d?db=3&prefix=app:", port);
    ck_assert_int_eq(dlock_client_new(u, &c), DLOCK_OK); /* known: no dial yet */
    dlock_client_close(c);
    free(u);
#endif
}

/* ------------------------------------------------- passwords in URLs */

/* A password holding '/' or '?' (base64) is read as the password. */
TU_TEST(password_slash_question, 60)
{
    static const struct {
        const char *in, *user, *password, *host, *path, *shown;
        int port;
    } cases[] = {
        {"redis://admin:hun/ter2@host", "admin", "hun/ter2", "host", NULL, "redis://admin@host", 0},
        {"redis://admin:hun/ter2@host:7000/3?timeout=1s", "admin", "hun/ter2", "host", "/3",
         "redis://admin@host:7000/3?timeout=1s", 7000},
        {"etcd://root:pa?ss@host", "root", "pa?ss", "host", NULL, "etcd://root@host", 0},
        {"etcd://root:pa?s/s=@h1:2379,h2/app", "root", "pa?s/s=", "h1", "/app",
         "etcd://root@h1:2379,h2/app", 2379},
        {"etcd://root:12?ss@host", "root", "12?ss", "host", NULL, "etcd://root@host", 0},
        {"etcd://root:pa?ss@host?prefix=a@b", "root", "pa?ss", "host", NULL,
         "etcd://root@host?prefix=a@b", 0},
        {"redis://u:p@ss@host/1", "u", "p@ss", "host", "/1", "redis://u@host/1", 0},
        /* '@' in a known option's value or in a path without userinfo:
         * not a userinfo */
        {"etcd://host:2379?user=me@corp.com", "me@corp.com", NULL, "host", NULL,
         "etcd://host:2379?user=me@corp.com", 2379},
        {"file:///run/user@1000/locks", NULL, NULL, NULL, "/run/user@1000/locks",
         "file:///run/user@1000/locks", 0},
        {"file://localhost/a@b", NULL, NULL, "localhost", "/a@b", "file://localhost/a@b", 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        dlock_client *c = NULL;
        int rc = dlock_client_new(cases[i].in, &c);
        if (rc == DLOCK_ENOTBUILT)
            continue;
        ck_assert_msg(rc == DLOCK_OK, "%s: %s (%s)", cases[i].in, dlock_err_name(rc),
                      dlock_errmsg());
        ck_assert_str_eq(dlock_client_url(c), cases[i].shown);
        if (cases[i].user)
            ck_assert_str_eq(c->opts.user, cases[i].user);
        else
            ck_assert_ptr_null(c->opts.user);
        if (cases[i].password)
            ck_assert_str_eq(c->opts.password, cases[i].password);
        else
            ck_assert_ptr_null(c->opts.password);
        if (cases[i].host) {
            ck_assert_uint_ge(c->url.nhosts, 1);
            ck_assert_str_eq(c->url.hosts[0].host, cases[i].host);
            ck_assert_int_eq(c->url.hosts[0].port, cases[i].port);
        } else {
            ck_assert_uint_eq(c->url.nhosts, 0);
        }
        if (cases[i].path)
            ck_assert_str_eq(c->url.path, cases[i].path);
        else
            ck_assert_ptr_null(c->url.path);
        dlock_client_close(c);
    }
}

static void assert_no_secret(const char *u, const char *where, const char *text)
{
    const char *secrets[] = {"s3cr3t", "hun", "pa?"};
    for (size_t k = 0; k < sizeof secrets / sizeof *secrets; k++)
        ck_assert_msg(!strstr(text, secrets[k]), "%s: %s shows '%s': %s", u, where, secrets[k],
                      text);
}

/* TEMPLATE with "%s" replaced by PW, "%d" by PORT and "%%" by '%'. */
static char *expand(const char *template, const char *pw, int port)
{
    char *out = malloc(strlen(template) + strlen(pw) + 16), *o = out;
    for (const char *t = template; *t; t++) {
        if (t[0] == '%' && t[1] == 's')
            o += sprintf(o, "%s", pw), t++;
        else if (t[0] == '%' && t[1] == 'd')
            o += sprintf(o, "%d", port), t++;
        else if (t[0] == '%' && t[1] == '%')
            *o++ = '%', t++;
        else
            *o++ = *t;
    }
    *o = 0;
    return out;
}

/* A text without "://" holding an '@' but no ':' (DLOCK_URL=user@host):
 * the redacted copy for the message fits its buffer (it overflowed by
 * one ":..." under ASan). */
TU_TEST(bad_url_without_colon, 30)
{
    const char *texts[] = {"user@host", "@", "a@b@c", "x@"};
    for (size_t i = 0; i < sizeof texts / sizeof *texts; i++) {
        dlock_client *c = NULL;
        ck_assert_int_eq(dlock_client_new(texts[i], &c), DLOCK_EBADURL);
        ck_assert_ptr_null(c);
        ck_assert_msg(*dlock_errmsg(), "%s: no message", texts[i]);
    }
}

/* Every error path of dlock_client_new() (and dlock_open()) with a
 * password holding '/' or '?': the message never shows it, nor does
 * dlock_client_url() of a client that was made. */
TU_TEST(no_password_in_any_error, 60)
{
    const char *pw[] = {"hun/s3cr3t", "pa?s3cr3t", "hun/s3?cr3t=", "12?s3cr3t"};
    /* %s = the password; each template fails in its own way */
    const char *templates[] = {
        "re dis://admin:%s@host",          /* bad character in scheme */
        "://admin:%s@host",                /* empty scheme */
        "nosuch://admin:%s@host",          /* unknown scheme */
        "redis:admin:%s@host",             /* no :// */
        "redis:/admin:%s@host",            /* no :// */
        "redis://admin:%s@host:0",         /* bad port */
        "redis://admin:%s@host:99999",     /* bad port */
        "redis://admin:%s@host:12ab",      /* bad port */
        "redis://admin:%s@[::1",           /* IPv6 without ']' */
        "redis://admin:%s@[::1]x",         /* junk after ']' */
        "redis://admin:%s@ho st",          /* bad host character */
        "redis://admin:%s@a,,b",           /* empty host */
        "redis://admin:%s@a,",             /* empty host */
        "redis://admin:%s@h/%%zz",         /* bad escape in path */
        "redis://admin:%%zz%s@h",          /* bad escape in password */
        "redis://admin:%s@h?novalue",      /* option without value */
        "redis://admin:%s@h?=v",           /* option without key */
        "redis://admin:%s@h?x%%zz=1",      /* bad escape in an option */
        "redis://admin:%s@h?lease=soon",   /* not a duration */
        "redis://admin:%s@h?lease=9000h",  /* out of range */
        "redis://admin:%s@h?lease=1s&lease=2s", /* given twice */
        "redis://admin:%s@h?colour=blue",  /* unknown option */
        "redis://admin:%s@h?a=1&b=2&c=3&d=4&e=5&f=6&g=7&h=8&i=9&j=10&k=11&l=12&m=13&n=14&o=15"
        "&p=16&q=17", /* too many options */
        "redis://admin:%s@a,b,c,d,e,f,g,h,i,j,k,l,m,n,o,p,q", /* too many hosts */
        "redis://admin:%s@h1,h2",          /* redis takes one host (backend) */
        "redis://admin:%s@h/x",            /* bad db (backend) */
        "redis://admin:%s@h?layout=nope",  /* bad layout (backend) */
        "etcd://root:%s@h?layout=nope",    /* bad layout (backend) */
        "etcd://root:%s@",                 /* no endpoint (backend) */
        "zk://root:%s@h?acl=nope",         /* bad acl (backend) */
        "zk://root:%s@h/bad//chroot",      /* bad chroot (backend) */
        "file://u:%s@otherhost/tmp",       /* file URL with a host (backend) */
        "file://u:%s@localhost/definitely/not/here", /* no directory (backend) */
        "redis://admin:%s@127.0.0.1:%d?connect_timeout=300ms",   /* nothing listens */
        "etcd://root:%s@127.0.0.1:%d?connect_timeout=300ms",     /* nothing listens */
        "zk://root:%s@127.0.0.1:%d?connect_timeout=300ms",       /* nothing listens */
        "redis://admin:%s@h?password=s3cr3t%%zz",                /* escape in a password option */
    };
    int port = tu_free_port();
    for (size_t p = 0; p < sizeof pw / sizeof *pw; p++)
        for (size_t t = 0; t < sizeof templates / sizeof *templates; t++) {
            char *u = expand(templates[t], pw[p], port);
            dlock_client *c = NULL;
            int rc = dlock_client_new(u, &c);
            if (rc == DLOCK_OK) {
                assert_no_secret(u, "dlock_client_url()", dlock_client_url(c));
                rc = dlock_client_connect(c);
                ck_assert_msg(rc != DLOCK_OK, "%s: connected", u);
                assert_no_secret(u, "dlock_client_connect()", dlock_errmsg());
                assert_no_secret(u, "dlock_client_url()", dlock_client_url(c));
                dlock_client_close(c);
            } else {
                ck_assert_ptr_null(c);
                ck_assert_str_ne(dlock_errmsg(), "");
                assert_no_secret(u, "dlock_client_new()", dlock_errmsg());
            }
            rc = dlock_open(u, &c);
            ck_assert_msg(rc != DLOCK_OK, "%s: opened", u);
            assert_no_secret(u, "dlock_open()", dlock_errmsg());
            free(u);
        }
}

/* Every option that holds a secret is left out of dlock_client_url() and
 * of every message, not only password=: sentinel_password= (it reached
 * COMMAND's DLOCK_URL and every "bad URL" message), and the value of a key
 * no backend knows -- a misspelled or mis-cased password (?Password=,
 * passw0rd=) -- is never echoed: the message names the key alone. */
TU_TEST(no_secret_option_shown, 60)
{
    static const struct {
        const char *in;
        int rc;           /* of dlock_client_new() */
        const char *shown; /* dlock_client_url(), or a word the message names */
    } cases[] = {
        {"redis+sentinel://h:26379/m?sentinel_password=hunter2", DLOCK_OK,
         "redis+sentinel://h:26379/m"},
        {"redis+sentinel://h:26379/m?lease=10s&sentinel_password=hunter2&db=2", DLOCK_OK,
         "redis+sentinel://h:26379/m?lease=10s&db=2"},
        {"rediss+sentinel://h/m?sentinel_password=hun%74er2", DLOCK_OK, "rediss+sentinel://h/m"},
        {"redis+sentinel://h:0/m?sentinel_password=hunter2", DLOCK_EBADURL, "port"},
        {"redis+sentinel://h/m?sentinel_password=hunter2&lease=soon", DLOCK_EBADURL, "lease"},
        {"redis+sentinel://h/m?sentinel_password=hunter2&sentinel_password=hunter2",
         DLOCK_EBADURL, "twice"},
        {"redis://h?Password=hunter2", DLOCK_EBADURL, "'Password'"},
        {"redis://h?PASSWORD=hunter2", DLOCK_EBADURL, "'PASSWORD'"},
        {"redis://h?passw0rd=hunter2", DLOCK_EBADURL, "'passw0rd'"},
        {"redis://h?sentinel_pasword=hunter2", DLOCK_EBADURL, "'sentinel_pasword'"},
        {"etcd://h?api_token=hunter2", DLOCK_EBADURL, "'api_token'"},
        {"zk://h?secret=hunter2", DLOCK_EBADURL, "'secret'"},
        {"file:///tmp?Password=hunter2", DLOCK_EBADURL, "'Password'"},
        {"redis://h?hunter2", DLOCK_EBADURL, "key=value"},
        {"redis://h?lease=1s&hunter2&db=1", DLOCK_EBADURL, "key=value"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        dlock_client *c = NULL;
        int rc = dlock_client_new(cases[i].in, &c);
        if (rc == DLOCK_ENOTBUILT)
            continue;
        ck_assert_msg(rc == cases[i].rc, "%s: %s (%s)", cases[i].in, dlock_err_name(rc),
                      dlock_errmsg());
        if (rc == DLOCK_OK) {
            ck_assert_str_eq(dlock_client_url(c), cases[i].shown);
            dlock_client_close(c);
        } else {
            ck_assert_msg(strstr(dlock_errmsg(), cases[i].shown), "%s: %s", cases[i].in,
                          dlock_errmsg());
        }
        ck_assert_msg(!strstr(dlock_errmsg(), "hunter2") && !strstr(dlock_errmsg(), "hun%74"),
                      "%s: the message shows the secret: %s", cases[i].in, dlock_errmsg());
    }
}

/* PATH written with TEXT and MODE (chmod, past the umask). */
static void write_secret(const char *path, const char *text, mode_t mode)
{
    tu_write_file(path, text);
    ck_assert_int_eq(chmod(path, mode), 0);
}

/* dlock_client_new(URL) fails with WANT, its message naming WORD and never
 * the password hunter2. */
static void new_fails(const char *u, int want, const char *word)
{
    dlock_client *c = NULL;
    int rc = dlock_client_new(u, &c);
    ck_assert_msg(rc == want && strstr(dlock_errmsg(), word), "%s: %s, not %s naming '%s': %s", u,
                  dlock_err_name(rc), dlock_err_name(want), word, dlock_errmsg());
    ck_assert_ptr_null(c);
    ck_assert_msg(!strstr(dlock_errmsg(), "hunter2"), "%s", dlock_errmsg());
}

/* ?password_file=PATH: the password is the file's first line, read by
 * dlock_client_new() (so every API user has it, not only the CLI), and the
 * path stays in dlock_client_url() -- it is not the secret. The file is
 * refused as ssh refuses a key: readable or writable by group or others,
 * not owned by this user, not a regular file; the message names it. */
TU_TEST(password_file_option, 60)
{
    char *pw = tu_fmt("%s/redis.pass", dir), *crlf = tu_fmt("%s/crlf.pass", dir);
    write_secret(pw, "hunter2\nnot the password\n", 0600);
    write_secret(crlf, "hunter2\r\n", 0400);
    const char *schemes[] = {"file", "redis", "etcd", "zk", "postgres"};
    for (size_t i = 0; i < sizeof schemes / sizeof *schemes; i++) {
        char *u = tu_fmt(strcmp(schemes[i], "file") ? "%s://bob@h?password_file=%s"
                                                    : "%s:///tmp?password_file=%s",
                         schemes[i], i % 2 ? crlf : pw);
        dlock_client *c = NULL;
        int rc = dlock_client_new(u, &c);
        if (rc == DLOCK_ENOTBUILT) {
            free(u);
            continue;
        }
        ck_assert_msg(rc == DLOCK_OK, "%s: %s (%s)", u, dlock_err_name(rc), dlock_errmsg());
        ck_assert_str_eq(c->opts.password, "hunter2");
        ck_assert_str_eq(dlock_client_url(c), u);
        dlock_client_close(c);
        free(u);
    }
    char *u = tu_fmt("file:///tmp?password_file=%s", pw);
    static const mode_t lax[] = {0644, 0640, 0604, 0620, 0602, 0660};
    for (size_t m = 0; m < sizeof lax / sizeof *lax; m++) {
        ck_assert_int_eq(chmod(pw, lax[m]), 0);
        new_fails(u, DLOCK_EACCES, pw);
        ck_assert_msg(strstr(dlock_errmsg(), "group or others"), "%s", dlock_errmsg());
    }
    ck_assert_int_eq(chmod(pw, 0600), 0);
    if (geteuid() == 0) { /* another user's file, as ssh refuses it */
        ck_assert_int_eq(chown(pw, 65534, 65534), 0);
        new_fails(u, DLOCK_EACCES, pw);
        ck_assert_msg(strstr(dlock_errmsg(), "owned by"), "%s", dlock_errmsg());
        ck_assert_int_eq(chown(pw, 0, 0), 0);
    }
    free(u);
    char *missing = tu_fmt("file:///tmp?password_file=%s/none", dir);
    new_fails(missing, DLOCK_ENOENT, "/none");
    free(missing);
    char *empty = tu_fmt("%s/empty.pass", dir), *eu = tu_fmt("file:///tmp?password_file=%s", empty);
    write_secret(empty, "\nhunter2\n", 0600);
    new_fails(eu, DLOCK_EINVAL, empty);
    char *dir_url = tu_fmt("file:///tmp?password_file=%s", dir);
    new_fails(dir_url, DLOCK_EINVAL, dir);
    /* one password, from one place */
    char *both = tu_fmt("redis://:hunter2@h?password_file=%s", pw);
    new_fails(both, DLOCK_EBADURL, "password_file");
    free(both);
    both = tu_fmt("redis://h?password=hunter2&password_file=%s", pw);
    new_fails(both, DLOCK_EBADURL, "password_file");
    free(both);
    free(dir_url);
    free(eu);
    free(empty);
    free(crlf);
    free(pw);
}

/* A '@' after a '/' where the text before it is a valid host list can be
 * read both ways: refused, quoting nothing before the '@'. */
TU_TEST(ambiguous_at, 60)
{
    const char *urls[] = {"redis://admin:12/s3cr3t@host", "zk://h:2181/chroot@x",
                          "etcd://host:2379/app@v2?lease=10s"};
    for (size_t i = 0; i < sizeof urls / sizeof *urls; i++) {
        dlock_client *c = NULL;
        int rc = dlock_client_new(urls[i], &c);
        if (rc == DLOCK_ENOTBUILT)
            continue;
        ck_assert_msg(rc == DLOCK_EBADURL, "%s: %s", urls[i], dlock_err_name(rc));
        ck_assert_ptr_nonnull(strstr(dlock_errmsg(), "%40"));
        ck_assert_ptr_null(strstr(dlock_errmsg(), "s3cr3t"));
        ck_assert_ptr_null(strstr(dlock_errmsg(), "chroot"));
    }
    /* Percent-encoded, both readings are plain. */
    dlock_client *c = NULL;
    ck_assert_int_eq(dlock_client_new("zk://h:2181/chroot%40x", &c), DLOCK_OK);
    ck_assert_str_eq(c->url.path, "/chroot@x");
    dlock_client_close(c);
}


/* One client holding NAME through a handle-owned hold, and a second
 * handle of the same client on it (WAITER_FLAGS) that will have to wait:
 * the frame of the cancel tests. */
struct busy_name {
    dlock_client *c;
    dlock_lock *holder, *l;
};

static struct busy_name busy_open(const char *name, unsigned waiter_flags)
{
    struct busy_name b = {.c = tu_open(url)};
    b.holder = tu_lock_mode(b.c, name, DLOCK_EXCLUSIVE, DLOCK_LOCK_HANDLE_OWNED);
    b.l = tu_lock_mode(b.c, name, DLOCK_EXCLUSIVE, waiter_flags);
    ck_assert_int_eq(dlock_acquire(b.holder, DLOCK_TRY), DLOCK_OK);
    return b;
}

static void busy_close(struct busy_name *b)
{
    TU_FREE_LOCKS(b->l, b->holder);
    dlock_client_close(b->c);
}

/* ------------------------------------------------- handle-owned holds */

/* Taken in thread A, asked about and released in thread B. */
TU_TEST(handle_owned_threads, 60)
{
    dlock_client *c = tu_open(url);
    dlock_lock *h = tu_lock_mode(c, "job", DLOCK_EXCLUSIVE, DLOCK_LOCK_HANDLE_OWNED);
    dlock_lock *other = tu_lock_mode(c, "job", DLOCK_EXCLUSIVE, 0);
    struct in_thread a = {.l = h, .wait_ms = DLOCK_TRY, .what = DO_ACQUIRE};
    in_thread(&a);
    ck_assert_int_eq(a.rc, DLOCK_OK);
    ck_assert_uint_eq(a.count, 1);
    /* held by the handle: this thread sees it through the handle, and
     * contends through a thread-owned handle */
    ck_assert_uint_eq(dlock_hold_count(h), 1);
    ck_assert_int_eq(dlock_validity_ms(h), DLOCK_VALID_FOREVER);
    ck_assert_int_eq(dlock_acquire(other, DLOCK_TRY), DLOCK_EBUSY);
    ck_assert_uint_eq(dlock_hold_count(other), 0);
    struct in_thread b = {.l = h, .what = DO_TOKEN};
    in_thread(&b);
    ck_assert_int_eq(b.rc, DLOCK_OK);
    uint64_t t;
    ck_assert_int_eq(dlock_token(h, &t), DLOCK_OK);
    ck_assert_uint_eq(b.token, t);
    ck_assert_uint_gt(t, 0);
    /* re-entry from a third thread counts on the handle */
    struct in_thread again = {.l = h, .wait_ms = DLOCK_TRY, .what = DO_ACQUIRE};
    in_thread(&again);
    ck_assert_int_eq(again.rc, DLOCK_OK);
    ck_assert_uint_eq(again.count, 2);
    struct in_thread r1 = {.l = h, .what = DO_RELEASE}, r2 = r1, r3 = r1;
    in_thread(&r1);
    ck_assert_int_eq(r1.rc, DLOCK_OK);
    ck_assert_uint_eq(r1.count, 1);
    in_thread(&r2);
    ck_assert_int_eq(r2.rc, DLOCK_OK);
    ck_assert_uint_eq(r2.count, 0);
    in_thread(&r3);
    ck_assert_int_eq(r3.rc, DLOCK_ENOTOWNER);
    ck_assert_int_eq(dlock_release(h), DLOCK_ENOTOWNER);
    ck_assert_ptr_nonnull(strstr(dlock_errmsg(), "handle"));
    ck_assert_int_eq(dlock_acquire(other, DLOCK_TRY), DLOCK_OK);
    uint64_t t2;
    ck_assert_int_eq(dlock_token(other, &t2), DLOCK_OK);
    ck_assert_uint_gt(t2, t);
    ck_assert_int_eq(dlock_release(other), DLOCK_OK);
    TU_FREE_LOCKS(other, h);
    dlock_client_close(c);
}

/* Two handle-owned handles on one name are two owners, even in one
 * thread; freeing a handle releases its hold. */
TU_TEST(handle_owned_exclude, 60)
{
    dlock_client *c = tu_open(url);
    dlock_lock *h1 = tu_lock_mode(c, "pair", DLOCK_EXCLUSIVE, DLOCK_LOCK_HANDLE_OWNED);
    dlock_lock *h2 = tu_lock_mode(c, "pair", DLOCK_EXCLUSIVE, DLOCK_LOCK_HANDLE_OWNED);
    ck_assert_int_eq(dlock_acquire(h1, DLOCK_TRY), DLOCK_OK);
    ck_assert_int_eq(dlock_acquire(h2, DLOCK_TRY), DLOCK_EBUSY);
    ck_assert_uint_eq(dlock_hold_count(h2), 0);
    /* h2 waits in another thread until h1 lets go (released elsewhere) */
    struct in_thread w = {.l = h2, .wait_ms = DLOCK_FOREVER, .what = DO_ACQUIRE};
    pthread_t th;
    ck_assert_int_eq(pthread_create(&th, NULL, run_in_thread, &w), 0);
    wait_until_polling(&w.tid);
    struct in_thread r = {.l = h1, .what = DO_RELEASE};
    in_thread(&r);
    ck_assert_int_eq(r.rc, DLOCK_OK);
    pthread_join(th, NULL);
    ck_assert_int_eq(w.rc, DLOCK_OK);
    ck_assert_int_eq(dlock_acquire(h1, DLOCK_TRY), DLOCK_EBUSY);
    dlock_lock_free(h2); /* releases h2's hold */
    ck_assert_int_eq(dlock_acquire(h1, DLOCK_TRY), DLOCK_OK);
    dlock_lock_free(h1);
    dlock_lock *plain = tu_lock_mode(c, "pair", DLOCK_EXCLUSIVE, 0);
    ck_assert_int_eq(dlock_acquire(plain, DLOCK_TRY), DLOCK_OK);
    dlock_lock_free(plain);
    dlock_client_close(c);
}

/* Two threads acquiring through one handle-owned handle at once: one
 * acquires, the other waits for that outcome and re-enters. */
TU_TEST(handle_owned_concurrent, 60)
{
    struct busy_name busy = busy_open("busy", DLOCK_LOCK_HANDLE_OWNED);
    struct in_thread a = {.l = busy.l, .wait_ms = DLOCK_FOREVER, .what = DO_ACQUIRE}, b = a;
    pthread_t ta, tb;
    ck_assert_int_eq(pthread_create(&ta, NULL, run_in_thread, &a), 0);
    ck_assert_int_eq(pthread_create(&tb, NULL, run_in_thread, &b), 0);
    ck_assert_int_eq(dlock_release(busy.holder), DLOCK_OK);
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    ck_assert_int_eq(a.rc, DLOCK_OK);
    ck_assert_int_eq(b.rc, DLOCK_OK);
    ck_assert_uint_eq(dlock_hold_count(busy.l), 2);
    ck_assert_int_eq(dlock_acquire(busy.holder, DLOCK_TRY), DLOCK_EBUSY);
    ck_assert_int_eq(dlock_release(busy.l), DLOCK_OK);
    ck_assert_int_eq(dlock_release(busy.l), DLOCK_OK);
    ck_assert_int_eq(dlock_acquire(busy.holder, DLOCK_TRY), DLOCK_OK);
    busy_close(&busy);
}

/* The same promises on a network backend, one whose server sees an
 * owner per thread (Redis: <uuid>:<id> fields) and one whose server sees
 * one owner per client, with the core's local queue (etcd). */
static void handle_owned_contract(const char *u)
{
    dlock_client *c = NULL, *c2 = NULL;
    ck_assert_msg(dlock_open(u, &c) == DLOCK_OK, "%s: %s", u, dlock_errmsg());
    ck_assert_msg(dlock_open(u, &c2) == DLOCK_OK, "%s: %s", u, dlock_errmsg());
    dlock_lock *h = tu_lock_mode(c, "ho", DLOCK_EXCLUSIVE, DLOCK_LOCK_HANDLE_OWNED);
    dlock_lock *h2 = tu_lock_mode(c, "ho", DLOCK_EXCLUSIVE, DLOCK_LOCK_HANDLE_OWNED);
    dlock_lock *plain = tu_lock_mode(c, "ho", DLOCK_EXCLUSIVE, 0);
    dlock_lock *far = tu_lock_mode(c2, "ho", DLOCK_EXCLUSIVE, 0);
    struct in_thread a = {.l = h, .wait_ms = DLOCK_TRY, .what = DO_ACQUIRE};
    in_thread(&a);
    ck_assert_msg(a.rc == DLOCK_OK, "%s: %s", u, dlock_err_name(a.rc));
    ck_assert_uint_eq(dlock_hold_count(h), 1);
    ck_assert_int_gt(dlock_validity_ms(h), 0);
    ck_assert_int_eq(dlock_acquire(h2, DLOCK_TRY), DLOCK_EBUSY);
    ck_assert_int_eq(dlock_acquire(plain, DLOCK_TRY), DLOCK_EBUSY);
    ck_assert_int_eq(dlock_acquire(far, DLOCK_TRY), DLOCK_EBUSY);
    struct in_thread b = {.l = h, .what = DO_TOKEN};
    in_thread(&b);
    uint64_t t;
    ck_assert_int_eq(dlock_token(h, &t), DLOCK_OK);
    ck_assert_uint_eq(b.token, t);
    /* two threads through the handle at once: both end up holding */
    struct in_thread r1 = {.l = h, .what = DO_RELEASE};
    struct in_thread x = {.l = h, .wait_ms = DLOCK_FOREVER, .what = DO_ACQUIRE}, y = x;
    pthread_t tx, ty;
    ck_assert_int_eq(pthread_create(&tx, NULL, run_in_thread, &x), 0);
    ck_assert_int_eq(pthread_create(&ty, NULL, run_in_thread, &y), 0);
    pthread_join(tx, NULL);
    pthread_join(ty, NULL);
    ck_assert_int_eq(x.rc, DLOCK_OK);
    ck_assert_int_eq(y.rc, DLOCK_OK);
    ck_assert_uint_eq(dlock_hold_count(h), 3);
    for (unsigned left = 2; left != UINT32_MAX; left--) {
        in_thread(&r1);
        ck_assert_int_eq(r1.rc, DLOCK_OK);
        ck_assert_uint_eq(r1.count, left);
    }
    ck_assert_int_eq(dlock_acquire(h2, 10000), DLOCK_OK);
    uint64_t t2;
    ck_assert_int_eq(dlock_token(h2, &t2), DLOCK_OK);
    ck_assert_uint_gt(t2, t);
    dlock_lock_free(h2); /* releases */
    tu_acquire_release(far, 10000);
    TU_FREE_LOCKS(far, plain, h);
    TU_CLOSE_CLIENTS(c2, c);
}

#ifdef DLOCK_HAVE_REDIS
TU_TEST(handle_owned_redis, 60)
{
    struct fx_redis r = {0};
    ck_assert(fx_redis_start(&r, NULL));
    handle_owned_contract(r.url);
    fx_redis_stop(&r);
}
#endif

#ifdef DLOCK_HAVE_ETCD
TU_TEST(handle_owned_etcd, 90)
{
    struct etcdf f = {0};
    ck_assert_msg(etcdf_start(&f, 1), "%s", f.error);
    char *u = etcdf_url(&f, NULL, NULL);
    handle_owned_contract(u);
    free(u);
    etcdf_stop(&f);
}
#endif

/* ------------------------------------------------------ cancel object */

/* Fired before the acquire starts: DLOCK_ECANCELED, nothing taken, for
 * every acquire that uses it, re-entries included. */
TU_TEST(cancel_before_start, 60)
{
    dlock_client *c = tu_open(url);
    dlock_lock *l = tu_lock_mode(c, "c1", DLOCK_EXCLUSIVE, 0);
    dlock_cancel *k = NULL;
    ck_assert_int_eq(dlock_cancel_new(&k), DLOCK_OK);
    ck_assert_int_eq(dlock_cancel_fired(k), 0);
    ck_assert_int_eq(dlock_acquire_ex(l, DLOCK_TRY, k), DLOCK_OK); /* not fired: a plain acquire */
    ck_assert_int_eq(dlock_release(l), DLOCK_OK);
    ck_assert_int_eq(dlock_cancel_fire(k), DLOCK_OK);
    ck_assert_int_eq(dlock_cancel_fire(k), DLOCK_OK); /* idempotent */
    ck_assert_int_eq(dlock_cancel_fired(k), 1);
    ck_assert_int_eq(dlock_acquire_ex(l, DLOCK_TRY, k), DLOCK_ECANCELED);
    ck_assert_ptr_nonnull(strstr(dlock_errmsg(), "c1"));
    ck_assert_int_eq(dlock_acquire_ex(l, DLOCK_FOREVER, k), DLOCK_ECANCELED);
    ck_assert_int_eq(dlock_acquire_ex(l, 60000, k), DLOCK_ECANCELED);
    ck_assert_uint_eq(dlock_hold_count(l), 0);
    /* nothing was taken: another client takes it at once */
    dlock_client *c2 = tu_open(url);
    dlock_lock *l2 = tu_lock_mode(c2, "c1", DLOCK_EXCLUSIVE, 0);
    tu_acquire_release(l2, DLOCK_TRY);
    /* a re-entry too is canceled, and the hold is left as it was */
    ck_assert_int_eq(dlock_acquire(l, DLOCK_TRY), DLOCK_OK);
    ck_assert_int_eq(dlock_acquire_ex(l, DLOCK_TRY, k), DLOCK_ECANCELED);
    ck_assert_uint_eq(dlock_hold_count(l), 1);
    ck_assert_int_eq(dlock_release(l), DLOCK_OK);
    ck_assert_int_eq(dlock_cancel_fire(NULL), DLOCK_EINVAL);
    ck_assert_int_eq(dlock_cancel_fired(NULL), 0);
    dlock_cancel_free(k);
    dlock_cancel_free(NULL);
    dlock_lock_free(l2);
    dlock_client_close(c2);
    dlock_lock_free(l);
    dlock_client_close(c);
}

/* Fired while acquires wait (two threads, one object): both end with
 * DLOCK_ECANCELED and hold nothing; the holder keeps its hold. */
TU_TEST(cancel_during_wait, 60)
{
    struct busy_name busy = busy_open("c2", 0);
    dlock_cancel *k = NULL;
    ck_assert_int_eq(dlock_cancel_new(&k), DLOCK_OK);
    struct in_thread a = {.l = busy.l, .wait_ms = DLOCK_FOREVER, .cancel = k, .what = DO_ACQUIRE};
    struct in_thread b = a;
    pthread_t ta, tb;
    ck_assert_int_eq(pthread_create(&ta, NULL, run_in_thread, &a), 0);
    ck_assert_int_eq(pthread_create(&tb, NULL, run_in_thread, &b), 0);
    wait_until_polling(&a.tid);
    wait_until_polling(&b.tid);
    ck_assert_int_eq(dlock_cancel_fire(k), DLOCK_OK);
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    ck_assert_int_eq(a.rc, DLOCK_ECANCELED);
    ck_assert_int_eq(b.rc, DLOCK_ECANCELED);
    ck_assert_uint_eq(a.count, 0);
    ck_assert_uint_eq(b.count, 0);
    ck_assert_uint_eq(dlock_hold_count(busy.holder), 1);
    ck_assert_int_eq(dlock_release(busy.holder), DLOCK_OK);
    tu_acquire_release(busy.l, DLOCK_TRY); /* it was never taken */
    dlock_cancel_free(k);
    busy_close(&busy);
}

static dlock_cancel *signal_cancel;

static void fire_on_signal(int sig)
{
    (void)sig;
    dlock_cancel_fire(signal_cancel);
}

/* Fired from a signal handler (async-signal-safe) while a wait sleeps. */
TU_TEST(cancel_from_signal, 60)
{
    struct busy_name busy = busy_open("c3", 0);
    ck_assert_int_eq(dlock_cancel_new(&signal_cancel), DLOCK_OK);
    struct sigaction sa = {.sa_handler = fire_on_signal};
    sigemptyset(&sa.sa_mask);
    ck_assert_int_eq(sigaction(SIGUSR1, &sa, NULL), 0);
    struct in_thread a = {.l = busy.l, .wait_ms = DLOCK_FOREVER, .cancel = signal_cancel,
                          .what = DO_ACQUIRE};
    pthread_t ta;
    ck_assert_int_eq(pthread_create(&ta, NULL, run_in_thread, &a), 0);
    wait_until_polling(&a.tid);
    ck_assert_int_eq(kill(getpid(), SIGUSR1), 0);
    pthread_join(ta, NULL);
    ck_assert_int_eq(a.rc, DLOCK_ECANCELED);
    ck_assert_uint_eq(dlock_hold_count(busy.holder), 1);
    dlock_cancel_free(signal_cancel);
    busy_close(&busy);
}

static size_t thread_count(void)
{
    size_t n = 0;
    DIR *d = opendir("/proc/self/task");
    for (struct dirent *de; d && (de = readdir(d));)
        n += de->d_name[0] != '.';
    if (d)
        closedir(d);
    return n;
}

/* Wait until the process has N threads: a joined thread leaves
 * /proc/self/task a moment after pthread_join() returns. */
static void wait_thread_count(size_t n)
{
    while (thread_count() != n)
        tu_sleep_ms(1);
}

/* ThreadSanitizer's runtime starts a thread of its own at the first
 * pthread_create(): started here, by a thread made and joined, so that
 * the counts of a test see only the library's threads. Returns the count
 * afterwards. */
#if defined(__SANITIZE_THREAD__)
static void *no_op(void *arg)
{
    return arg;
}
#endif
static size_t thread_count_settled(void)
{
    size_t n = thread_count();
#if defined(__SANITIZE_THREAD__)
    pthread_t th;
    ck_assert_int_eq(pthread_create(&th, NULL, no_op, NULL), 0);
    pthread_join(th, NULL);
    wait_thread_count(n + 1); /* the runtime's thread, the joined one gone */
    n++;
#endif
    return n;
}

/* Make K armed: a timed acquire with it sleeps behind HOLDER (the file
 * backend polls), and a wait about to sleep puts K on the canceler. */
static void arm_by_waiting(dlock_cancel *k, const char *name)
{
    struct busy_name busy = busy_open(name, 0);
    ck_assert_int_eq(dlock_acquire_ex(busy.l, 20, k), DLOCK_ETIMEDOUT);
    busy_close(&busy);
}

/* The canceler thread runs while an armed cancel object lives: none for
 * an object whose acquires never waited (dlock run's common case). */
TU_TEST(cancel_thread_lifetime, 60)
{
    size_t before = thread_count_settled();
    dlock_cancel *k1 = NULL, *k2 = NULL;
    ck_assert_int_eq(dlock_cancel_new(&k1), DLOCK_OK);
    ck_assert_int_eq(dlock_cancel_new(&k2), DLOCK_OK);
    ck_assert_uint_eq(thread_count(), before); /* nothing waited yet */
    dlock_client *c = tu_open(url);
    dlock_lock *l = tu_lock_mode(c, "lt0", DLOCK_EXCLUSIVE, 0);
    ck_assert_int_eq(dlock_acquire_ex(l, DLOCK_FOREVER, k1), DLOCK_OK); /* free: no wait */
    ck_assert_int_eq(dlock_release(l), DLOCK_OK);
    dlock_lock_free(l);
    dlock_client_close(c);
    ck_assert_uint_eq(thread_count(), before);
    arm_by_waiting(k1, "lt1");
    arm_by_waiting(k2, "lt2");
    ck_assert_uint_eq(thread_count(), before + 1);
    dlock_cancel_fire(k1);
    dlock_cancel_free(k1);
    ck_assert_uint_eq(thread_count(), before + 1);
    dlock_cancel_free(k2);
    wait_thread_count(before);
    ck_assert_int_eq(dlock_cancel_new(&k1), DLOCK_OK); /* and starts again */
    arm_by_waiting(k1, "lt3");
    ck_assert_uint_eq(thread_count(), before + 1);
    dlock_cancel_free(k1);
    wait_thread_count(before);
    ck_assert_int_eq(dlock_cancel_new(NULL), DLOCK_EINVAL);
}

/* A child after fork() cannot use its parent's cancel object (its
 * canceler thread stayed in the parent) and makes its own, which works. */
TU_TEST(cancel_after_fork, 60)
{
    dlock_cancel *parent_k = NULL;
    ck_assert_int_eq(dlock_cancel_new(&parent_k), DLOCK_OK);
    pid_t pid = tu_fork();
    if (pid == 0) {
        dlock_client *c = NULL;
        if (dlock_open(url, &c) != DLOCK_OK)
            _exit(10);
        dlock_lock *holder = NULL, *l = NULL;
        if (dlock_lock_new(c, "fk", DLOCK_EXCLUSIVE, DLOCK_LOCK_HANDLE_OWNED, &holder) ||
            dlock_lock_new(c, "fk", DLOCK_EXCLUSIVE, 0, &l) || dlock_acquire(holder, DLOCK_TRY))
            _exit(11);
        if (dlock_acquire_ex(l, DLOCK_TRY, parent_k) != DLOCK_EMISUSE)
            _exit(12);
        dlock_cancel *k = NULL;
        if (dlock_cancel_new(&k) != DLOCK_OK)
            _exit(13);
        struct in_thread a = {.l = l, .wait_ms = DLOCK_FOREVER, .cancel = k, .what = DO_ACQUIRE};
        pthread_t ta;
        if (pthread_create(&ta, NULL, run_in_thread, &a))
            _exit(14);
        wait_until_polling(&a.tid);
        dlock_cancel_fire(k);
        pthread_join(ta, NULL);
        dlock_cancel_free(k); /* stops the child's canceler thread */
        _exit(a.rc == DLOCK_ECANCELED ? 0 : 15);
    }
    int status = 0;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child: status %#x", status);
    dlock_cancel_free(parent_k);
}

/* A child that frees its parent's cancel object (it never made one of
 * its own) must leave the parent's canceler thread and epoll set alone:
 * a fire in the parent still ends a wait there. */
TU_TEST(cancel_freed_by_child_keeps_parent_working, 60)
{
    dlock_cancel *k = NULL;
    ck_assert_int_eq(dlock_cancel_new(&k), DLOCK_OK);
    arm_by_waiting(k, "cf0"); /* the canceler thread runs, watching k */
    size_t threads = thread_count();
    pid_t pid = tu_fork();
    if (pid == 0) {
        dlock_cancel_free(k);
        _exit(0);
    }
    int status = 0;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child: status %#x", status);
    ck_assert_uint_eq(thread_count(), threads); /* the canceler still runs */
    struct busy_name busy = busy_open("cf", 0);
    struct in_thread a = {.l = busy.l, .wait_ms = DLOCK_FOREVER, .cancel = k, .what = DO_ACQUIRE};
    pthread_t ta;
    ck_assert_int_eq(pthread_create(&ta, NULL, run_in_thread, &a), 0);
    wait_until_polling(&a.tid);
    ck_assert_int_eq(dlock_cancel_fire(k), DLOCK_OK);
    pthread_join(ta, NULL);
    ck_assert_int_eq(a.rc, DLOCK_ECANCELED);
    dlock_cancel_free(k);
    busy_close(&busy);
}

/* A child that fires its parent's cancel object (a signal handler both
 * inherited) fires only its own copy: the parent's object is not fired,
 * and a later fire in the parent still ends a wait there (the child's
 * fire used to take the parent's one wake-up of the object, so that fire
 * never reached the wait). */
TU_TEST(cancel_fired_by_child_keeps_parent_working, 60)
{
    dlock_cancel *k = NULL;
    ck_assert_int_eq(dlock_cancel_new(&k), DLOCK_OK);
    arm_by_waiting(k, "cg0"); /* the canceler thread watches k */
    pid_t pid = tu_fork();
    if (pid == 0)
        _exit(dlock_cancel_fire(k) == DLOCK_OK && dlock_cancel_fired(k) ? 0 : 1);
    ck_assert_int_eq(tu_wait_exit(pid), 0);
    ck_assert_int_eq(dlock_cancel_fired(k), 0);
    struct busy_name busy = busy_open("cg", 0);
    struct in_thread a = {.l = busy.l, .wait_ms = 20000, .cancel = k, .what = DO_ACQUIRE};
    pthread_t ta;
    ck_assert_int_eq(pthread_create(&ta, NULL, run_in_thread, &a), 0);
    wait_until_polling(&a.tid);
    ck_assert_int_eq(dlock_cancel_fire(k), DLOCK_OK);
    pthread_join(ta, NULL);
    ck_assert_msg(a.rc == DLOCK_ECANCELED, "the parent's wait: %s", dlock_err_name(a.rc));
    dlock_cancel_free(k);
    busy_close(&busy);
}

/* -------------------------------------------------- modes, capabilities */

/* Holding exclusive, a shared acquire re-enters (the hold stays
 * exclusive until the exclusive level goes: then it is a shared hold, a
 * downgrade); holding shared, an exclusive acquire is refused. */
TU_TEST(downgrade_upgrade, 60)
{
    dlock_client *c = tu_open(url);
    dlock_lock *x = tu_lock_mode(c, "rw", DLOCK_EXCLUSIVE, 0);
    dlock_lock *s = tu_lock_mode(c, "rw", DLOCK_SHARED, 0);
    dlock_lock *reader = tu_lock_mode(c, "rw", DLOCK_SHARED, DLOCK_LOCK_HANDLE_OWNED);
    ck_assert_int_eq(dlock_acquire(x, DLOCK_TRY), DLOCK_OK);
    ck_assert_int_eq(dlock_acquire(s, DLOCK_TRY), DLOCK_OK);
    ck_assert_uint_eq(dlock_hold_count(s), 2);
    ck_assert_int_eq(dlock_acquire(reader, DLOCK_TRY), DLOCK_EBUSY); /* still exclusive */
    ck_assert_int_eq(dlock_release(x), DLOCK_OK); /* downgraded */
    ck_assert_uint_eq(dlock_hold_count(s), 1);
    tu_acquire_release(reader, DLOCK_TRY);
    ck_assert_int_eq(dlock_release(s), DLOCK_OK);
    /* upgrade */
    ck_assert_int_eq(dlock_acquire(s, DLOCK_TRY), DLOCK_OK);
    ck_assert_int_eq(dlock_acquire(x, DLOCK_TRY), DLOCK_EMISUSE);
    ck_assert_ptr_nonnull(strstr(dlock_errmsg(), "upgrade"));
    ck_assert_uint_eq(dlock_hold_count(s), 1);
    tu_acquire_release(reader, DLOCK_TRY); /* still shared */
    ck_assert_int_eq(dlock_release(s), DLOCK_OK);
    TU_FREE_LOCKS(reader, s, x);
    dlock_client_close(c);
}

/* What a backend cannot do is refused by the core before it is called. */
TU_TEST(capabilities, 60)
{
    dlock_client *c = tu_open(url);
    dlock_lock *l = NULL;
    ck_assert_int_eq(dlock_lock_new(c, "f", DLOCK_EXCLUSIVE, DLOCK_LOCK_FAIR, &l), DLOCK_ENOTSUP);
    ck_assert_ptr_null(l);
    ck_assert_ptr_nonnull(strstr(dlock_errmsg(), "arrival order"));
    ck_assert_int_eq(dlock_lock_new(c, "f", DLOCK_EXCLUSIVE, 4u, &l), DLOCK_EINVAL);
    ck_assert_int_eq(dlock_lock_new(c, "f", DLOCK_EXCLUSIVE, 1u << 31, &l), DLOCK_EINVAL);
    l = tu_lock_mode(c, "f", DLOCK_EXCLUSIVE, 0);
    /* the file backend has no leases: a fixed one is accepted and unused */
    ck_assert_int_eq(dlock_lock_set_lease(l, 5000, DLOCK_LEASE_FIXED), DLOCK_OK);
    ck_assert_int_eq(dlock_acquire(l, DLOCK_TRY), DLOCK_OK);
    ck_assert_int_eq(dlock_validity_ms(l), DLOCK_VALID_FOREVER);
    ck_assert_int_eq(dlock_release(l), DLOCK_OK);
    dlock_lock_free(l);
    dlock_client_close(c);
}

/* dlock_lock_inherit_fd() is a lock op only the file backend has: a
 * descriptor of the lock file there; elsewhere DLOCK_ENOTSUP, said by
 * the core before anything reaches the backend. */
TU_TEST(inherit_fd_only_where_a_kernel_lock, 60)
{
    dlock_client *c = tu_open(url);
    dlock_lock *l = tu_lock_mode(c, "inherit", DLOCK_EXCLUSIVE, 0);
    int fd = -1;
    ck_assert_int_eq(dlock_lock_inherit_fd(l, &fd), DLOCK_ENOTOWNER);
    ck_assert_int_eq(dlock_acquire(l, DLOCK_TRY), DLOCK_OK);
    ck_assert_int_eq(dlock_lock_inherit_fd(l, &fd), DLOCK_OK);
    ck_assert_int_ge(fd, 3);
    close(fd);
    ck_assert_int_eq(dlock_release(l), DLOCK_OK);
    dlock_lock_free(l);
    dlock_client_close(c);
#ifdef DLOCK_HAVE_REDIS
    struct fx_redis r = {0};
    ck_assert(fx_redis_start(&r, NULL));
    c = tu_open(r.url);
    l = tu_lock_mode(c, "inherit", DLOCK_EXCLUSIVE, 0);
    ck_assert_int_eq(dlock_acquire(l, DLOCK_TRY), DLOCK_OK);
    ck_assert_int_eq(dlock_lock_inherit_fd(l, &fd), DLOCK_ENOTSUP);
    ck_assert_str_eq(dlock_errmsg(), "lock 'inherit': a redis hold is no kernel lock a child "
                                     "could inherit (only the file backend's is)");
    ck_assert_int_eq(dlock_release(l), DLOCK_OK);
    dlock_lock_free(l);
    dlock_client_close(c);
    fx_redis_stop(&r);
#endif
}

/* The calls that look at names without a lock handle refuse a NULL
 * client with DLOCK_EINVAL, as dlock.h says, before reading its backend. */
static int list_nothing(const char *name, void *arg)
{
    (void)name;
    (void)arg;
    return 0;
}

TU_TEST(null_client_refused, 60)
{
    dlock_info *i = NULL;
    ck_assert_int_eq(dlock_inspect(NULL, "n", &i), DLOCK_EINVAL);
    ck_assert_int_eq(dlock_force_release(NULL, "n"), DLOCK_EINVAL);
    ck_assert_int_eq(dlock_check(NULL, "n", 1), DLOCK_EINVAL);
    size_t len = 0;
    ck_assert_int_eq(dlock_value_get(NULL, "n", NULL, &len, NULL), DLOCK_EINVAL);
    ck_assert_int_eq(dlock_value_set(NULL, "v", 1), DLOCK_EINVAL);
    ck_assert_int_eq(dlock_release_ex(NULL, 0), DLOCK_EINVAL);
    ck_assert_int_eq(dlock_list(NULL, NULL, list_nothing, NULL), DLOCK_EINVAL);
    ck_assert_int_eq(dlock_semaphore_list(NULL, NULL, list_nothing, NULL), DLOCK_EINVAL);
    ck_assert_ptr_nonnull(strstr(dlock_errmsg(), "client is NULL"));
}

/* ------------------------------------------------- log hook, counters */

/* What a client's log hook was told, for the tests to wait on. */
static struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    char text[16384]; /* "LEVEL message\n" lines, the oldest dropped when full */
} heard = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, ""};

static void hear(dlock_client *c, dlock_log_level level, const char *msg, void *arg)
{
    (void)c;
    (void)arg;
    pthread_mutex_lock(&heard.mu);
    size_t used = strlen(heard.text), add = strlen(msg) + 4;
    if (used + add >= sizeof heard.text)
        used = heard.text[0] = 0;
    snprintf(heard.text + used, sizeof heard.text - used, "%d %s\n", (int)level, msg);
    pthread_cond_broadcast(&heard.cv);
    pthread_mutex_unlock(&heard.mu);
}

/* Wait until the hook was told a line containing WHAT (the test's time
 * limit bounds the wait). */
static void wait_heard(const char *what)
{
    pthread_mutex_lock(&heard.mu);
    while (!strstr(heard.text, what))
        pthread_cond_wait(&heard.cv, &heard.mu);
    pthread_mutex_unlock(&heard.mu);
}

static dlock_stats stats_of(dlock_client *c)
{
    dlock_stats st = {.size = sizeof st};
    ck_assert_int_eq(dlock_client_stats(c, &st), DLOCK_OK);
    ck_assert_uint_eq(st.size, sizeof st);
    return st;
}

/* File backend: acquisitions and waits are counted (re-entries are not),
 * the hook hears acquisitions at DEBUG and nothing below its level, and
 * an older caller's smaller dlock_stats gets only the fields it knows. */
TU_TEST(stats_and_log_file, 60)
{
    dlock_client *c = tu_open(url), *other = tu_open(url);
    ck_assert_int_eq(dlock_client_set_log(NULL, hear, NULL, DLOCK_LOG_DEBUG), DLOCK_EINVAL);
    ck_assert_int_eq(dlock_client_set_log(c, hear, NULL, 0), DLOCK_EINVAL);
    ck_assert_int_eq(dlock_client_set_log(c, hear, NULL, DLOCK_LOG_INFO), DLOCK_OK);
    dlock_lock *l = tu_lock(c, "counted"), *busy = tu_lock(other, "counted");
    ck_assert_int_eq(dlock_acquire(l, DLOCK_TRY), DLOCK_OK);
    ck_assert_int_eq(dlock_acquire(l, DLOCK_TRY), DLOCK_OK); /* re-entry */
    dlock_stats st = stats_of(c);
    ck_assert_uint_eq(st.acquisitions, 1);
    ck_assert_uint_eq(st.waits, 0);
    ck_assert_uint_eq(st.losses, 0);
    ck_assert_str_eq(heard.text, ""); /* DEBUG lines not asked for */
    ck_assert_int_eq(dlock_client_set_log(c, hear, NULL, DLOCK_LOG_DEBUG), DLOCK_OK);
    TU_RELEASE_OK(l);
    TU_RELEASE_OK(l);
    ck_assert_int_eq(dlock_acquire(l, DLOCK_TRY), DLOCK_OK);
    wait_heard("lock 'counted' acquired");
    /* The other client waits and gives up: one wait, no acquisition. */
    ck_assert_int_eq(dlock_acquire(busy, 100), DLOCK_ETIMEDOUT);
    st = stats_of(other);
    ck_assert_uint_eq(st.acquisitions, 0);
    ck_assert_uint_eq(st.waits, 1);
    /* A try that finds it busy never slept. */
    ck_assert_int_eq(dlock_acquire(busy, DLOCK_TRY), DLOCK_EBUSY);
    ck_assert_uint_eq(stats_of(other).waits, 1);
    ck_assert_uint_eq(stats_of(c).acquisitions, 2);
    /* A caller built against a header that knew only acquisitions. */
    dlock_stats old;
    memset(&old, 0xab, sizeof old);
    old.size = offsetof(dlock_stats, waits);
    ck_assert_int_eq(dlock_client_stats(c, &old), DLOCK_OK);
    ck_assert_uint_eq(old.size, offsetof(dlock_stats, waits));
    ck_assert_uint_eq(old.acquisitions, 2);
    ck_assert_uint_eq(old.waits, 0xababababababababull);
    old.size = sizeof(size_t);
    ck_assert_int_eq(dlock_client_stats(c, &old), DLOCK_EINVAL);
    ck_assert_int_eq(dlock_client_set_log(c, NULL, NULL, DLOCK_LOG_DEBUG), DLOCK_OK);
    TU_RELEASE_OK(l);
    TU_FREE_LOCKS(l, busy);
    TU_CLOSE_CLIENTS(other, c);
}

#ifdef DLOCK_HAVE_REDIS
/* Redis: renewals counted with their latency, a force-release seen as a
 * loss (ERROR line, losses 1) and a server restart as a reconnect. */
TU_TEST(stats_and_log_redis, 90)
{
    struct fx_redis r = {0};
    ck_assert(fx_redis_start(&r, NULL));
    char *u = tu_fmt("%s?lease=600ms", r.url);
    dlock_client *c = tu_open(u);
    ck_assert_int_eq(dlock_client_set_log(c, hear, NULL, DLOCK_LOG_DEBUG), DLOCK_OK);
    dlock_lock *l = tu_lock(c, "watched");
    ck_assert_int_eq(dlock_acquire(l, DLOCK_TRY), DLOCK_OK);
    wait_heard("lock 'watched': renewed");
    dlock_stats st = stats_of(c);
    ck_assert_uint_eq(st.acquisitions, 1);
    ck_assert_uint_ge(st.renewals, 1);
    ck_assert_uint_ge(st.renewal_ms, st.renewal_max_ms);
    ck_assert_int_eq(dlock_force_release(c, "watched"), DLOCK_OK);
    wait_heard("1 lock 'watched' lost: ");
    ck_assert_uint_eq(stats_of(c).losses, 1);
    ck_assert_int_eq(dlock_release(l), DLOCK_ELOST);
    ck_assert_uint_eq(stats_of(c).reconnects, 0);
    /* The server restarts: the next acquire dials again. */
    fx_redis_kill(&r);
    ck_assert(fx_redis_restart(&r));
    int rc;
    while ((rc = dlock_acquire(l, 5000)) != DLOCK_OK)
        ck_assert_msg(rc == DLOCK_ECONN || rc == DLOCK_ETIMEDOUT || rc == DLOCK_EIO, "%s: %s",
                      dlock_err_name(rc), dlock_errmsg());
    wait_heard(": reconnected");
    st = stats_of(c);
    ck_assert_uint_ge(st.reconnects, 1);
    ck_assert_uint_eq(st.acquisitions, 2);
    TU_RELEASE_OK(l);
    dlock_lock_free(l);
    dlock_client_close(c);
    free(u);
    fx_redis_stop(&r);
}

/* The CLI: `run -v` reports the loss a force-release causes, found by the
 * next renewal, once and time-stamped -- run's own line; the library's
 * line of it (DLOCK_LOG_ERROR) is left out; `status --json` carries no
 * "client" counters (its fresh client's would all be zero). */
TU_TEST(cli_log_and_stats_redis, 60)
{
    struct fx_redis r = {0};
    ck_assert(fx_redis_start(&r, NULL));
    char *release = tu_fmt("'%s' -u \"$DLOCK_URL\" release --force \"$DLOCK_NAME\" && exec sleep 60",
                           tu_dlock_bin());
    char *err = NULL, *out = NULL;
    int code = TU_DLOCK(NULL, &err, NULL, "-u", r.url, "run", "-v", "--lease", "1", "cli-watched",
                        "--", "sh", "-c", release);
    ck_assert_msg(code == 75, "exit %d, stderr: %s", code, err);
    ck_assert_msg(strstr(err, " dlock run: lock 'cli-watched' lost while the command ran: ") &&
                      !strstr(err, " dlock: error: "),
                  "stderr: %s", err);
    free(err);
    ck_assert_int_eq(TU_DLOCK(&out, NULL, NULL, "-u", r.url, "status", "--json", "cli-watched"), 1);
    ck_assert_msg(!strstr(out, "\"client\"") && strstr(out, "\"master\":null}\n"), "%s", out);
    free(out);
    free(release);
    fx_redis_stop(&r);
}
#endif

/* ---------------------------------------------------------- man3 pages */

/* Collapse each run of white space in S to one space, in place. */
static void squeeze_spaces(char *s)
{
    char *w = s;
    for (char *r = s; *r; r++) {
        int space = *r == ' ' || *r == '\t' || *r == '\n';
        if (space && (w == s || w[-1] == ' '))
            continue;
        *w++ = space ? ' ' : *r;
    }
    *w = 0;
}

/* Append " WORD" to the growing list *LIST. */
static void list_add(char **list, const char *word, size_t n)
{
    char *old = *list;
    *list = tu_fmt("%s %.*s", old ? old : "", (int)n, word);
    free(old);
}

/* Whether the space-separated LIST names WORD. */
static int list_has(const char *list, const char *word)
{
    size_t n = strlen(word);
    for (const char *p = list ? strstr(list, word) : NULL; p; p = strstr(p + 1, word))
        if (p[-1] == ' ' && (p[n] == ' ' || p[n] == 0))
            return 1;
    return 0;
}

/* docs/man3 is kept equal to include/dlock.h, as dlock(1) is to --help:
 * every DLOCK_EXTERN function is on the NAME line of a page (make install
 * links the other names to it) with its prototype, word for word, in that
 * page's SYNOPSIS; no page names a function the header lacks. */
TU_TEST(man3_matches_header, 30)
{
    const char *src = getenv("DLOCK_SRCDIR") ? getenv("DLOCK_SRCDIR") : ".";
    char *hpath = tu_fmt("%s/include/dlock.h", src), *mdir = tu_fmt("%s/docs/man3", src);
    char *header = tu_read_file(hpath);
    ck_assert_msg(header, "cannot read %s", hpath);
    char *man_names = NULL, *synopses = tu_fmt("|"), *wrong = NULL;
    DIR *d = opendir(mdir);
    ck_assert_msg(d, "cannot open %s", mdir);
    for (struct dirent *e; (e = readdir(d));) {
        size_t len = strlen(e->d_name);
        if (len < 3 || strcmp(e->d_name + len - 2, ".3"))
            continue;
        char *path = tu_fmt("%s/%s", mdir, e->d_name), *page = tu_read_file(path);
        ck_assert_msg(page, "cannot read %s", path);
        char *name = strstr(page, "\n.SH NAME\n"), *syn = strstr(page, "\n.SH SYNOPSIS\n.nf\n");
        ck_assert_msg(name && syn, "%s: no NAME line or SYNOPSIS .nf block", path);
        name += strlen("\n.SH NAME\n");
        char *dash = strstr(name, " \\- ");
        ck_assert_msg(dash && !memchr(name, '\n', (size_t)(dash - name)), "%s: NAME is not 'a, b \\- what'", path);
        char *own = NULL;
        for (char *p = name; p < dash;) {
            size_t n = strcspn(p, ", ");
            if (n > (size_t)(dash - p))
                n = (size_t)(dash - p);
            if (n) {
                list_add(&man_names, p, n);
                list_add(&own, p, n);
            }
            p += n ? n : 1;
        }
        e->d_name[len - 2] = 0;
        if (!list_has(own, e->d_name))
            list_add(&wrong, path, strlen(path)); /* the page's own name is not on its NAME line */
        syn += strlen("\n.SH SYNOPSIS\n.nf\n");
        char *end = strstr(syn, "\n.fi");
        ck_assert_msg(end, "%s: SYNOPSIS .nf without .fi", path);
        *end = 0;
        squeeze_spaces(syn);
        char *all = tu_fmt("%s%s|", synopses, syn);
        free(synopses);
        synopses = all;
        free(own);
        free(page);
        free(path);
    }
    closedir(d);

    /* Each DLOCK_EXTERN declaration, squeezed, must stand in a synopsis. */
    char *missing = NULL, *header_names = NULL;
    for (char *p = strstr(header, "\nDLOCK_EXTERN "); p; p = strstr(p, "\nDLOCK_EXTERN ")) {
        p += strlen("\nDLOCK_EXTERN ");
        char *semi = strchr(p, ';'), *paren = strchr(p, '(');
        ck_assert(semi && paren && paren < semi);
        char *q = paren;
        while (q > p && (q[-1] == '_' || (q[-1] >= 'a' && q[-1] <= 'z') || (q[-1] >= '0' && q[-1] <= '9')))
            q--;
        char *fname = tu_fmt("%.*s", (int)(paren - q), q);
        char *proto = tu_fmt("%.*s", (int)(semi - p + 1), p);
        squeeze_spaces(proto);
        list_add(&header_names, fname, strlen(fname));
        if (!list_has(man_names, fname))
            list_add(&missing, fname, strlen(fname));
        else if (!strstr(synopses, proto))
            list_add(&missing, proto, strlen(proto)); /* on a NAME line, but its SYNOPSIS differs */
        free(proto);
        free(fname);
    }
    /* ... and no page documents a function that is gone. */
    for (char *save = NULL, *w = man_names ? strtok_r(man_names, " ", &save) : NULL; w;
         w = strtok_r(NULL, " ", &save))
        if (!list_has(header_names, w))
            list_add(&wrong, w, strlen(w));
    ck_assert_msg(!missing, "dlock.h functions without a man3 page (NAME line + SYNOPSIS) in %s:%s", mdir, missing);
    ck_assert_msg(!wrong, "man3 pages naming what dlock.h does not declare:%s", wrong);
    free(header_names);
    free(man_names);
    free(synopses);
    free(header);
    free(hpath);
    free(mdir);
}

/* ------------------------------------------------------------- suite */

int main(void)
{
    return tu_main("api", setup, teardown);
}
