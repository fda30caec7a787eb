/* check_fuzz.c -- what the libFuzzer targets of tests/fuzz/ found, kept as
 * plain tests: each input that once crashed or misbehaved goes through the
 * same code as in its target (white-box: the backends' parsing functions,
 * which need no server), so `make check` holds every finding even where
 * clang or the fuzz build is missing, and under every sanitizer.
 * DLOCK_TEST=fuzz/NAME runs one.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dlock.h"
#include "internal.h"
#include "testutil.h"
#ifdef DLOCK_HAVE_REDIS
#include "backends/redis/redis.h"
#endif

#ifdef DLOCK_HAVE_REDIS
/* ------------------------------------------------------ fuzz_redis_replies */

static struct redis_state redis_fake = {.where = "redis fuzz:6379"};

/* The one reply RESP makes, parsed by the connection layer as bytes from
 * a server would be (the caller frees it). */
static redisReply *reply_of(const char *resp)
{
    struct rconn *k = dlock__redis_conn_new();
    ck_assert_ptr_nonnull(k);
    dlock__redis_conn_feed(k, resp, strlen(resp));
    ck_assert_msg(!k->broken, "'%s' broke the connection: %s", resp, k->err);
    redisReply *r = dlock__redis_conn_take(k);
    ck_assert_msg(r != NULL, "'%s' is not one whole reply", resp);
    dlock__redis_conn_free(k);
    return r;
}

/* "*555555557\r\n": twelve bytes had hiredis 0.14 allocate the element
 * pointers of 555,555,557 elements (4 GiB; the fuzzer's out-of-memory) on
 * the header alone. Now the connection breaks, saying why, and nothing is
 * allocated. */
TU_TEST(redis_huge_array_header, 0)
{
    struct rconn *k = dlock__redis_conn_new();
    ck_assert_ptr_nonnull(k);
    const char bytes[] = "*555555557\r\n:1\r\n";
    dlock__redis_conn_feed(k, bytes, sizeof bytes - 1);
    ck_assert_msg(k->broken, "an array of 555555557 elements was taken in");
    ck_assert_msg(strstr(k->err, "555555557 elements"), "%s", k->err);
    ck_assert_ptr_null(dlock__redis_conn_take(k));
    dlock__redis_conn_free(k);

    /* the cap itself is still a reply */
    char *at_cap = tu_fmt("*%d\r\n", REDIS_MAX_ELEMENTS);
    k = dlock__redis_conn_new();
    dlock__redis_conn_feed(k, at_cap, strlen(at_cap));
    ck_assert_msg(!k->broken, "%s", k->err);
    dlock__redis_conn_free(k);
    free(at_cap);
}

/* Semaphore inspect read every element of its script's reply as a
 * string: an array (or an integer) in their place was a NULL pointer
 * passed to strcmp() and strtoll(). Now: DLOCK_EPROTO, and the counts'
 * arithmetic cannot overflow. */
TU_TEST(redis_sem_inspect_odd_elements, 0)
{
    struct sem_keys k = {.name = "s", .timeout = "{s}:timeout", .name_len = 1, .timeout_len = 11};
    static const char *const replies[] = {
        /* the finding: an array where a type name stands */
        "*5\r\n*0\r\n$4\r\nzset\r\n$1\r\n1\r\n$1\r\n2\r\n$0\r\n\r\n",
        /* integers where the script sends strings */
        "*5\r\n$6\r\nstring\r\n$4\r\nzset\r\n:1\r\n:2\r\n:3\r\n",
        "*7\r\n$6\r\nstring\r\n$4\r\nzset\r\n$1\r\n1\r\n$1\r\n2\r\n$0\r\n\r\n:5\r\n$1\r\n9\r\n",
        /* counts past what a semaphore can have */
        "*7\r\n$6\r\nstring\r\n$4\r\nzset\r\n$19\r\n9223372036854775807\r\n$1\r\n2\r\n$0\r\n\r\n"
        "$2\r\nab\r\n$1\r\n9\r\n",
        "*5\r\n$6\r\nstring\r\n$4\r\nnone\r\n$2\r\n-1\r\n$1\r\n2\r\n$0\r\n\r\n",
    };
    for (size_t i = 0; i < TU_COUNT(replies); i++) {
        redisReply *r = reply_of(replies[i]);
        dlock_info *info = NULL;
        ck_assert_int_eq(dlock__info_new(&info), DLOCK_OK);
        int rc = dlock__redis_sem_inspect_reply(&redis_fake, &k, r, 0, info);
        ck_assert_msg(rc == DLOCK_EPROTO, "reply %zu: %s: %s", i, dlock_err_name(rc),
                      dlock_errmsg());
        dlock_info_free(info);
        freeReplyObject(r);
    }
    /* an expiry far past now is a long lease, not an overflow */
    redisReply *r = reply_of("*7\r\n$6\r\nstring\r\n$4\r\nzset\r\n$1\r\n1\r\n$20\r\n"
                             "-9223372036854775807\r\n$0\r\n\r\n$16\r\n0123456789abcdef\r\n"
                             "$19\r\n9223372036854775807\r\n");
    dlock_info *info = NULL;
    ck_assert_int_eq(dlock__info_new(&info), DLOCK_OK);
    ck_assert_int_eq(dlock__redis_sem_inspect_reply(&redis_fake, &k, r, 2, info), DLOCK_OK);
    ck_assert_int_eq(dlock_info_held(info), 1);
    ck_assert(dlock_info_ttl_ms(info) > 0);
    dlock_info_free(info);
    freeReplyObject(r);
}
#endif

int main(void)
{
    return tu_main("fuzz", NULL, NULL);
}
