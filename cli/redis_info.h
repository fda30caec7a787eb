/* redis_info.h -- numbers read from a Redis server's INFO reply, for
 * `dlock bench` (cli/bench_redis.c, cli/bench_redlock.c) and the tests'
 * Redis fixture (tests/lib/fixture_redis.c) alike: both count the lock
 * scripts a server ran, and read its other counters the same way.
 *
 * Header-only (static functions) so that each side compiles it in with
 * its own hiredis: cli/ takes nothing of the library but include/dlock.h,
 * and the tests link no CLI object.
 */
#ifndef DLOCK_CLI_REDIS_INFO_H
#define DLOCK_CLI_REDIS_INFO_H

#include <stdlib.h>
#include <string.h>

#include <hiredis/hiredis.h>

/* The number right after FIELD in INFO (an INFO reply's text): FIELD is
 * the name with its separator, "total_connections_received:" or
 * "cmdstat_eval:calls=". -1 when INFO (may be NULL) has no FIELD. */
static inline long long redis_info_number(const char *info, const char *field)
{
    const char *at = info ? strstr(info, field) : NULL;
    return at ? strtoll(at + strlen(field), NULL, 10) : -1;
}

/* The lock scripts (EVALSHA and EVAL calls) the server on CTX has run so
 * far, from INFO commandstats; -1 when it did not answer with them. */
static inline long long redis_info_script_calls(redisContext *ctx)
{
    redisReply *r = redisCommand(ctx, "INFO commandstats");
    long long total = -1;
    if (r && r->type == REDIS_REPLY_STRING) {
        long long evalsha = redis_info_number(r->str, "cmdstat_evalsha:calls=");
        long long eval = redis_info_number(r->str, "cmdstat_eval:calls=");
        total = (evalsha > 0 ? evalsha : 0) + (eval > 0 ? eval : 0);
    }
    if (r)
        freeReplyObject(r);
    return total;
}

#endif
