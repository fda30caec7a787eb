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
