/* check_api.c -- the core's own promises, tested on the file backend where
 * a server is not needed: duration and URL parsing (a password never
 * reaches a message, an unknown option is refused before any dial, URL
 * options keep setopt's ranges), out-of-memory paths, handle-owned holds,
 * the cancel object and the mode rules (downgrade, upgrade) and the
 * capability checks made before a backend is called.
 *
 * White-box where a promise is internal (dlock__parse_duration, the
 * parsed URL): the test includes src/core.h for those. Each test runs in
 * its own process (Check's fork mode) with a time limit.
 */
#include <check.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "core.h"
#include "dlock.h"
#include "testutil.h"

static char *dir, *url;

static void setup(void)
{
    dir = tu_tmpdir("api");
    url = tu_fmt("file://%s", dir);
}

static void teardown(void)
{
    tu_rmrf(dir);
    free(dir);
    free(url);
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

START_TEST(test_duration_parse)
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
END_TEST

/* URL durations keep the range setopt keeps (at most a year). */
START_TEST(test_url_duration_range)
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
END_TEST

/* Every strndup() of dlock_client_new failing in turn: ENOMEM, never a
 * crash (the scheme's copy was used unchecked). */
START_TEST(test_url_out_of_memory)
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
END_TEST

/* ----------------------------------------------------- unknown options */

/* An unknown option is refused by dlock_client_new(), before the backend
 * dials: against a port where nothing listens the answer is EBADURL, not
 * ECONN after a connect timeout. */
START_TEST(test_unknown_option_before_dial)
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
END_TEST

/* ------------------------------------------------- passwords in URLs */

/* A password holding '/' or '?' (base64) is read as the password. */
START_TEST(test_password_with_slash_or_question_mark)
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
END_TEST

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

/* Every error path of dlock_client_new() (and dlock_open()) with a
 * password holding '/' or '?': the message never shows it, nor does
 * dlock_client_url() of a client that was made. */
START_TEST(test_no_password_in_any_error)
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
END_TEST

/* A '@' after a '/' where the text before it is a valid host list can be
 * read both ways: refused, quoting nothing before the '@'. */
START_TEST(test_ambiguous_at_refused)
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
END_TEST

/* ------------------------------------------------------------- suite */

static Suite *api_suite(void)
{
    Suite *s = suite_create("api");
    struct {
        const char *name;
        const TTest *test;
    } tests[] = {
        {"duration_parse", test_duration_parse},
        {"url_duration_range", test_url_duration_range},
        {"url_out_of_memory", test_url_out_of_memory},
        {"unknown_option_before_dial", test_unknown_option_before_dial},
        {"password_slash_question", test_password_with_slash_or_question_mark},
        {"no_password_in_any_error", test_no_password_in_any_error},
        {"ambiguous_at", test_ambiguous_at_refused},
    };
    for (size_t i = 0; i < sizeof tests / sizeof *tests; i++) {
        TCase *tc = tcase_create(tests[i].name);
        tcase_add_checked_fixture(tc, setup, teardown);
        tcase_set_timeout(tc, 60);
        tcase_add_test(tc, tests[i].test);
        suite_add_tcase(s, tc);
    }
    return s;
}

int main(void)
{
    return tu_run_suite(api_suite());
}
