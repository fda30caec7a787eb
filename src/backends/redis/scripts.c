/* scripts.c -- the Redis backend's Lua scripts, and how they run.
 *
 * Every lock operation is one Lua script, so acquire, release and a whole
 * batch of renewals each cost one round trip. The scripts live in
 * scripts/NAME.lua, readable and runnable with `redis-cli --eval`, and are
 * embedded here at build time (.incbin: no copy to keep in step), each
 * with its SHA-1 digest computed by the Makefile; the acquire scripts get
 * lib_acquire.lua, what they share, in front. They are SCRIPT LOADed once
 * per client and sent by EVALSHA, with EVAL when the server answers
 * NOSCRIPT after a restart or SCRIPT FLUSH; Redlock, which cannot ask a
 * node that is down at open, takes the digests as built.
 *
 * Every lock script returns one integer, or a string naming the type of a
 * key that is not a lock of this layout (WRONGTYPE; nothing written).
 * acquire: token >= 0 = acquired; -3 - PTTL < 0 = held by another owner.
 * release: 1 = released, 2 = already released by us (a retry), 0 = not
 * ours. force: 1 = deleted, 0 = nothing there. An integer rather than a
 * {status, value} table: the table costs the server ~0.5 us per call.
 *
 * The hot paths (acquire, release) use as few redis.call()s as they can:
 * on Redis 7 each costs about as much as a whole SET, and the server's
 * time per script is most of a lock's cost beside the raw recipe. A key
 * of the wrong type shows up as an error table from redis.pcall() and
 * only then is TYPE asked for the message.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "redis.h"

/* ================================================================ scripts */

/* Embed the files INCBINS (each SCRIPT_FILE(...)) one after the other as
 * the NUL-terminated string SYM, a symbol local to this object. The paths
 * are relative to the top of the tree, where make runs the compiler; the
 * Makefile rebuilds this file when a script changes. */
#define SCRIPT_FILE(file) ".incbin \"src/backends/redis/scripts/" file "\"\n"
#define EMBED_FILES(sym, incbins)                                                 \
    __asm__(".pushsection .rodata\n"                                              \
            #sym ":\n" incbins ".byte 0\n"                                        \
            ".popsection\n");                                                     \
    extern const char sym[] __attribute__((visibility("hidden")))

/* scripts/NAME.lua as redis_lua_NAME. */
#define EMBED_SCRIPT(name) EMBED_FILES(redis_lua_##name, SCRIPT_FILE(#name ".lua"))

/* scripts/NAME.lua with lib_acquire.lua (the token counter and the
 * canceled key, which every acquire script uses) in front: EVAL takes one
 * script, so the two become one here rather than two copies in the
 * sources. The Makefile reads these lines to digest the same text. */
#define EMBED_ACQUIRE_SCRIPT(name)                                                \
    EMBED_FILES(redis_lua_##name, SCRIPT_FILE("lib_acquire.lua") SCRIPT_FILE(#name ".lua"))

/* redis_lua_NAME with its digest, REDIS_SHA_NAME from the generated
 * redis_script_digests.h (the Makefile: sha1sum of the same files). */
#define SCRIPT(name) {#name, redis_lua_##name, REDIS_SHA_##name}

#include "redis_script_digests.h"

EMBED_ACQUIRE_SCRIPT(acquire_redisson);
EMBED_SCRIPT(release_redisson);
EMBED_SCRIPT(renew_redisson);
EMBED_ACQUIRE_SCRIPT(acquire_simple);
EMBED_SCRIPT(release_simple);
EMBED_SCRIPT(renew_simple);
EMBED_SCRIPT(inspect);
EMBED_SCRIPT(force);
EMBED_SCRIPT(cancel_redisson);
EMBED_SCRIPT(cancel_simple);
EMBED_SCRIPT(rw_release_read);
EMBED_SCRIPT(rw_downgrade);
EMBED_SCRIPT(rw_unwait);
EMBED_ACQUIRE_SCRIPT(sem_acquire);
EMBED_SCRIPT(sem_release);
EMBED_SCRIPT(sem_renew);
EMBED_SCRIPT(sem_inspect);
EMBED_ACQUIRE_SCRIPT(fair_lock);
EMBED_ACQUIRE_SCRIPT(acquire_multi);
EMBED_SCRIPT(release_multi);
EMBED_SCRIPT(value_set);

/* scripts/redlock_raise.lua: raise a node's token counter to the
 * acquisition's token, only while the hold the node granted us is still
 * there (KEYS: the token key, the lock, our reader's timeout key; ARGV: the
 * token, our value -- the owner field in Redisson's layout, the whole
 * value in the simple one -- and the token the node gave us). A raise can
 * arrive late (its call timed out, the request in flight), and the
 * counter must then be left alone: after its acquisition was given back
 * and another client took the name (our field is gone), or the same owner
 * did (the same field, a later hold: release_redisson.lua frees our field
 * only while the counter holds the token the node gave that hold, and a
 * raise past it would make that release miss). So in Redisson's layout
 * the hold is the one we were granted while the node has granted nothing
 * since: a writer's counter still holds the token it gave us (nobody
 * acquires there while we hold it, a later hold of ours INCRs it), a
 * reader's timeout key holds it (other readers move the counter; a later
 * read hold of ours rewrites the key). The simple layout's value carries
 * the token already. Returns 1 = raised (or already there), 0 = not that
 * hold. (Redlock's and the election's scripts carry no comment of their
 * own: their text, and so their digests, stay as they were when they
 * were C strings.) */
EMBED_SCRIPT(redlock_raise);
/* scripts/leader_write.lua (election.c, redlock_election.c). KEYS: lock,
 * value hash, leader channel, token counter. ARGV: our hash field, our
 * token, the value, and the version (redlock_election.c: numbered by the
 * leader, the same on every node; absent: counted by the node, by the
 * token counter's rule -- below 10^15, as after a data-losing restart or for a
 * new name, it goes on from the server's clock in microseconds, so
 * versions keep growing; lib_acquire.lua's new_token). 1 written, 0 no
 * longer ours. */
EMBED_SCRIPT(leader_write);
/* scripts/leader_read.lua (election.c, redlock_election.c). KEYS: lock,
 * value hash, token counter. {held, holder, counter, value's token,
 * version, value, lock's PTTL}. */
EMBED_SCRIPT(leader_read);
/* scripts/leader_publish.lua: "1" on channel KEYS[1] (redlock_election.c). */
EMBED_SCRIPT(leader_publish);

/* Script ID in Redisson's layout ([0]) and the simple one ([1]). */
static const struct redis_script by_id[S_COUNT][2] = {
    [S_ACQUIRE] = {SCRIPT(acquire_redisson), SCRIPT(acquire_simple)},
    [S_RELEASE] = {SCRIPT(release_redisson), SCRIPT(release_simple)},
    [S_RENEW] = {SCRIPT(renew_redisson), SCRIPT(renew_simple)},
    [S_INSPECT] = {SCRIPT(inspect), SCRIPT(inspect)},
    [S_FORCE] = {SCRIPT(force), SCRIPT(force)},
    [S_CANCEL] = {SCRIPT(cancel_redisson), SCRIPT(cancel_simple)},
    /* shared holds: the Redisson layout only */
    [S_RW_RELEASE_READ] = {SCRIPT(rw_release_read), SCRIPT(rw_release_read)},
    [S_RW_DOWNGRADE] = {SCRIPT(rw_downgrade), SCRIPT(rw_downgrade)},
    [S_RW_UNWAIT] = {SCRIPT(rw_unwait), SCRIPT(rw_unwait)},
    [S_SEM_ACQUIRE] = {SCRIPT(sem_acquire), SCRIPT(sem_acquire)},
    [S_SEM_RELEASE] = {SCRIPT(sem_release), SCRIPT(sem_release)},
    [S_SEM_RENEW] = {SCRIPT(sem_renew), SCRIPT(sem_renew)},
    [S_SEM_INSPECT] = {SCRIPT(sem_inspect), SCRIPT(sem_inspect)},
    [S_FAIR] = {SCRIPT(fair_lock), SCRIPT(fair_lock)},
    /* both layouts: one script */
    [S_ACQUIRE_MULTI] = {SCRIPT(acquire_multi), SCRIPT(acquire_multi)},
    [S_RELEASE_MULTI] = {SCRIPT(release_multi), SCRIPT(release_multi)},
    [S_VALUE_SET] = {SCRIPT(value_set), SCRIPT(value_set)},
};

const struct redis_script dlock__redis_raise_script = SCRIPT(redlock_raise);
const struct redis_script dlock__redis_leader_write_script = SCRIPT(leader_write);
const struct redis_script dlock__redis_leader_read_script = SCRIPT(leader_read);
const struct redis_script dlock__redis_leader_publish_script = SCRIPT(leader_publish);

const struct redis_script *dlock__redis_script(enum script_id id, bool simple)
{
    return id < S_COUNT ? &by_id[id][simple] : NULL;
}

bool dlock__redis_script_nth(size_t i, const char **name, const char **src, const char **sha)
{
    static const struct redis_script *const others[] = {
        &dlock__redis_raise_script, &dlock__redis_leader_write_script,
        &dlock__redis_leader_read_script, &dlock__redis_leader_publish_script};
    size_t n_others = sizeof others / sizeof others[0];
    const struct redis_script *sc = i < 2 * S_COUNT ? &by_id[i / 2][i % 2]
                                    : i < 2 * S_COUNT + n_others ? others[i - 2 * S_COUNT]
                                                                 : NULL;
    if (!sc)
        return false;
    *name = sc->name;
    *src = sc->src;
    *sha = sc->sha;
    return true;
}

/* Append to K a SCRIPT LOAD of every script (pipelined: one round trip). */
int dlock__redis_scripts_append(struct redis_state *s, struct rconn *k)
{
    int rc = DLOCK_OK;
    for (int i = 0; i < S_COUNT && !rc; i++) {
        const char *argv[] = {"SCRIPT", "LOAD", s->src[i]};
        rc = dlock__redis_conn_append(k, 3, argv, NULL);
    }
    return rc;
}

int dlock__redis_scripts_take(struct redis_state *s, struct rconn *k, int rc)
{
    bool broken = rc != DLOCK_OK;
    for (int i = 0; i < S_COUNT && !broken; i++) {
        redisReply *r = dlock__redis_conn_take(k);
        /* keep the first failure, but read every reply */
        if (!rc && r->type == REDIS_REPLY_ERROR)
            rc = dlock__redis_server_error(s, r->str, "SCRIPT LOAD");
        else if (!rc && (r->type != REDIS_REPLY_STRING || r->len != 40))
            rc = dlock__err(DLOCK_EPROTO, "%s: SCRIPT LOAD: unexpected reply", s->where);
        else if (!rc)
            memcpy(s->sha[i], r->str, 41);
        freeReplyObject(r);
    }
    dlock__redis_pool_put(s, k, broken);
    return rc;
}

/* Load the scripts once so EVALSHA has their digests. */
int dlock__redis_load_scripts(struct redis_state *s)
{
    struct rconn *k;
    int rc = dlock__redis_pool_get(s, false, DLOCK__NEVER, &k);
    if (rc)
        return rc;
    rc = dlock__redis_scripts_append(s, k);
    if (!rc)
        rc = dlock__redis_exchange(&k, 1, k->until, "SCRIPT LOAD");
    return dlock__redis_scripts_take(s, k, rc);
}

/* ======================================================= renewal buffers */

int dlock__redis_renew_bufs_new(struct renew_bufs *r, size_t args, size_t vals, size_t holds)
{
    *r = (struct renew_bufs){
        .argv = calloc(args, sizeof *r->argv),
        .argl = calloc(args, sizeof *r->argl),
        .vals = calloc(vals, sizeof *r->vals),
        .leases = calloc(holds, sizeof *r->leases),
        .keys = calloc(holds, sizeof *r->keys),
        .holds = holds,
    };
    if (!r->argv || !r->argl || !r->vals || !r->leases || !r->keys)
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    return DLOCK_OK;
}

void dlock__redis_renew_bufs_free(struct renew_bufs *r)
{
    for (size_t i = 0; r->keys && i < r->holds; i++)
        dlock__redis_keys_free(&r->keys[i]);
    free(r->argv);
    free(r->argl);
    free(r->vals);
    free(r->leases);
    free(r->keys);
    memset(r, 0, sizeof *r);
}

/* ======================================================== running scripts */

#define MAX_SCRIPT_ARGS (5 * DLOCK_MULTI_MAX + 4) /* multi.c: 3 keys, 2 args a member */

/* ============================================================ replica sync */

bool dlock__redis_sync_append(struct redis_state *s, struct rconn *k)
{
    if (s->sync_replicas <= 0)
        return false;
    /* WAIT's own timeout ends before the request's bound, so its answer
     * (how many acknowledged) arrives rather than a timeout of ours; 0
     * would mean forever. */
    int64_t left = k->until - dlock__now_ms();
    int64_t ms = left - (left / 4 < 100 ? left / 4 : 100);
    if (ms > s->sync_timeout_ms)
        ms = s->sync_timeout_ms;
    if (ms < 1)
        ms = 1;
    char n[16], t[24];
    snprintf(n, sizeof n, "%d", s->sync_replicas);
    snprintf(t, sizeof t, "%lld", (long long)ms);
    const char *argv[] = {"WAIT", n, t};
    return dlock__redis_conn_append(k, 3, argv, NULL) == DLOCK_OK;
}

int dlock__redis_sync_acked(const redisReply *r)
{
    return r && r->type == REDIS_REPLY_INTEGER ? (int)r->integer : 0;
}

/* One attempt of a request on one connection (eval_on): the arguments
 * it sends (the request's, or its retry's), and what came of it. */
struct attempt {
    const char **args;
    const size_t *lens;
    redisReply *reply;
    bool written; /* as dlock__redis_command() says */
    int acked; /* as struct redis_request says */
};

/* Send RQ's script with A's arguments on K: EVALSHA, and EVAL when the
 * server has forgotten the script; with ?sync, a WAIT behind it in the
 * same round trip. */
static int eval_on(struct redis_state *s, struct rconn *k, const struct redis_request *rq,
                   struct attempt *a)
{
    const char *argv[MAX_SCRIPT_ARGS + 3];
    size_t argl[MAX_SCRIPT_ARGS + 3];
    char nk[16];
    enum script_id id = rq->script;
    int nargs = rq->nargs;
    if (nargs > MAX_SCRIPT_ARGS)
        return dlock__err(DLOCK_EINVAL, "%s: %s: %d script arguments (at most %d)", s->where,
                          rq->what, nargs, MAX_SCRIPT_ARGS);
    snprintf(nk, sizeof nk, "%d", rq->nkeys);
    argv[0] = "EVALSHA";
    argv[1] = s->sha[id];
    argv[2] = nk;
    argl[0] = 7;
    argl[1] = 40;
    argl[2] = strlen(nk);
    for (int i = 0; i < nargs; i++) {
        argv[3 + i] = a->args[i];
        argl[3 + i] = a->lens[i];
    }
    redisReply *r = NULL;
    a->acked = -1;
    for (int pass = 0; pass < 2; pass++) {
        if (pass) { /* the server forgot the script: EVAL reloads it */
            argv[0] = "EVAL";
            argl[0] = 4;
            argv[1] = s->src[id];
            argl[1] = strlen(s->src[id]);
        }
        /* a cluster node that ran EVALSHA after ASKING (a slot being
         * migrated to it) needs ASKING again for the EVAL; elsewhere it
         * changes nothing */
        const char *asking[] = {"ASKING"};
        bool ask = pass && s->cluster;
        int rc = ask ? dlock__redis_conn_append(k, 1, asking, NULL) : DLOCK_OK;
        if (!rc)
            rc = dlock__redis_conn_append(k, 3 + nargs, argv, argl);
        bool sync = !rc && id != S_INSPECT && id != S_SEM_INSPECT && dlock__redis_sync_append(s, k);
        if (!rc)
            rc = dlock__redis_exchange(&k, 1, k->until, rq->what);
        if (dlock__redis_conn_sent(k))
            a->written = true;
        if (rc)
            return rc;
        if (ask)
            freeReplyObject(dlock__redis_conn_take(k));
        r = dlock__redis_conn_take(k);
        redisReply *w = sync ? dlock__redis_conn_take(k) : NULL;
        if (sync)
            a->acked = dlock__redis_sync_acked(w);
        freeReplyObject(w);
        if (r->type == REDIS_REPLY_ERROR && strncmp(r->str, "NOSCRIPT", 8) == 0 && !pass) {
            freeReplyObject(r);
            continue;
        }
        break;
    }
    a->reply = r;
    return DLOCK_OK;
}

/* How a call ends whose first attempt lost its reply (LOST: that
 * message) when its retry gets no answer either (RC): DLOCK_ECANCELED
 * when the caller's wait was canceled in a pause, else DLOCK_ECONN --
 * the first attempt may have run all the same (out.reached says so). */
static int retry_unanswered(struct redis_state *s, int rc, const char *lost, const char *what)
{
    if (rc == DLOCK_ECANCELED)
        return dlock__err(rc, "%s: %s: canceled while retrying after a lost reply (%s)", s->where,
                          what, lost);
    return dlock__errmsg_restore(DLOCK_ECONN, lost);
}

/* The next attempt of RQ sends its retry arguments, when it has some. */
static void use_retry_args(const struct redis_request *rq, struct attempt *a)
{
    if (rq->retry_args) {
        a->args = rq->retry_args;
        a->lens = rq->retry_lens;
    }
}

int dlock__redis_eval(struct redis_state *s, struct redis_request *rq)
{
    rq->out.reply = NULL;
    rq->out.sent_ms = 0;
    rq->out.retried = false;
    rq->out.reached = false;
    rq->out.acked = -1;
    const char *what = rq->what;
    struct dlock__wait *w = rq->wait;
    /* the retry shares the budget: no second timeout */
    int64_t deadline = dlock__time_budget(rq->deadline, s->op_timeout_ms);
    bool written = false; /* an attempt the server may have run */
    char lost[DLOCK__MSG_MAX];
    struct dlock__redis_route route; /* a cluster's: the master of the keys' slot */
    dlock__redis_route_init(&route, w);
    struct attempt a = {.args = rq->args, .lens = rq->lens};
    for (int attempt = 0;; attempt++) {
        struct rconn *k;
        struct redis_state *ns = s; /* K's pool: S's, or a cluster master's */
        int rc = s->cluster ? dlock__redis_cluster_get(s, &route, rq->nkeys, a.args, a.lens,
                                                       deadline, &ns, &k)
                            : dlock__redis_pool_get_for(s, deadline, w, &k);
        if (rc && attempt > 0) /* the first attempt's lost reply is the story */
            return retry_unanswered(s, rc, lost, what);
        if (rc)
            return rc;
        rq->out.sent_ms = dlock__now_ms();
        a.reply = NULL;
        a.written = false;
        k->wait = w; /* its cancel ends the request (net.c) */
        rc = eval_on(s, k, rq, &a);
        k->wait = NULL;
        redisReply *r = a.reply;
        if (rc) /* lost: it may have run (an answer may say it did not: below) */
            written |= a.written;
        rq->out.reached = written;
        if (rc == DLOCK_ENOMEM) {
            dlock__redis_pool_put(ns, k, true);
            return rc;
        }
        if (rc && dlock__wait_canceled(w)) {
            /* cut short by the cancel (or lost as it came): no retry;
             * the caller owes what an attempt that was sent may do */
            char why[DLOCK__MSG_MAX];
            dlock__errmsg_save(why);
            dlock__redis_pool_put(ns, k, true);
            return dlock__err(DLOCK_ECANCELED, "%s: %s: wait canceled with the request in flight "
                                               "(%s)",
                              s->where, what, why);
        }
        if (rc) {
            dlock__redis_pool_put(ns, k, true);
            if (!rq->once && attempt == 0) {
                rq->out.retried = true;
                dlock__errmsg_save(lost);
                use_retry_args(rq, &a);
                continue;
            }
            return rc;
        }
        if (s->sentinel && attempt == 0 && r->type == REDIS_REPLY_ERROR &&
            strncmp(r->str, "READONLY", 8) == 0) {
            /* a master demoted by a failover: nothing was written; once
             * more on the master the sentinels name now */
            dlock__redis_server_error(s, r->str, what); /* marks the master stale */
            freeReplyObject(r);
            dlock__redis_pool_put(ns, k, true);
            dlock__errmsg_save(lost);
            use_retry_args(rq, &a);
            continue;
        }
        int redirected =
            s->cluster ? dlock__redis_cluster_redirect(s, &route, ns, r, deadline) : 0;
        if (redirected) {
            /* MOVED, ASK, TRYAGAIN, CLUSTERDOWN: nothing ran; not a retry,
             * unless not followed (canceled in the pause, no time left) */
            rc = redirected > 0 || redirected == DLOCK_ECANCELED
                     ? redirected
                     : dlock__redis_server_error(ns, r->str, what);
            freeReplyObject(r);
            dlock__redis_pool_put(ns, k, false);
            if (redirected > 0) {
                attempt--;
                continue;
            }
            /* after a lost reply, that first attempt may have run */
            return attempt > 0 ? retry_unanswered(s, rc, lost, what) : rc;
        }
        written |= a.written;
        rq->out.reached = written;
        dlock__redis_pool_put(ns, k, false);
        if (r->type == REDIS_REPLY_ERROR) {
            rc = dlock__redis_server_error(ns, r->str, what);
            freeReplyObject(r);
            return rc;
        }
        rq->out.acked = a.acked;
        rq->out.reply = r;
        return DLOCK_OK;
    }
}

/* Decode a lock script's reply: *VALUE, or *TYPE_NAME for a key of the
 * wrong type (see the scripts). */
int dlock__redis_script_reply(struct redis_state *s, const redisReply *r, long long *value,
                              const char **type_name)
{
    *value = 0;
    *type_name = NULL;
    if (r->type == REDIS_REPLY_INTEGER)
        *value = r->integer;
    else if (r->type == REDIS_REPLY_STRING || r->type == REDIS_REPLY_STATUS)
        *type_name = r->str;
    else
        return dlock__err(DLOCK_EPROTO, "%s: unexpected reply to a lock script (type %d)", s->where,
                          r->type);
    return DLOCK_OK;
}

int dlock__redis_status_reply(struct redis_state *s, const redisReply *r, const struct lock_keys *k,
                              long long *value)
{
    const char *type_name;
    int rc = dlock__redis_script_reply(s, r, value, &type_name);
    if (!rc && type_name)
        rc = dlock__redis_wrongtype(s, k, type_name);
    return rc;
}

int dlock__redis_wrongtype(struct redis_state *s, const struct lock_keys *k, const char *type_name)
{
    return dlock__err(DLOCK_EWRONGTYPE, "%s: WRONGTYPE key '%s' holds a %s, not a dlock lock "
                                        "(layout %s); left untouched",
                      s->where, k->lock, type_name ? type_name : "value of another type",
                      s->simple ? "simple" : "redisson");
}

