/* multi.c -- the Redis backend's multi-lock op: a whole set of exclusive
 * locks in one script call (scripts/acquire_multi.lua), so an uncontended
 * dlock_multi_acquire() costs one round trip instead of one per member.
 *
 * Why it is shaped so. The script is the single acquire's logic run over
 * every member of the set in one atomic call: each member's keys and
 * owner field are those of the layout (Redisson's or the simple one),
 * each gets its own token from its own counter, and nothing is written
 * unless every member is free, so a Redisson RLock or a plain dlock_lock
 * on any member excludes the set, and a busy set leaves no trace. It
 * never waits: a busy member is reported (which one, and its lease), and
 * the core then takes the set member by member, each waiting on the hub
 * as a single acquire does. A reply lost to a timeout or a reconnect is
 * handled as the single acquire handles it (mutex.c): the request is
 * sent once more with the next request number, which cancels the first
 * on the server, and when that reply is lost too every member owes a
 * cancel (cancel.c). Shared sets are not taken at once (a reader's
 * layout has more keys and a writers' queue to respect), nor fair locks
 * (their queue hands the lock on): DLOCK_ENOTSUP, and the core takes
 * them one by one.
 *
 * The set's release is one script call too (scripts/release_multi.lua):
 * the single release script's checks and unlock messages run over every
 * member, so each member is checked against its own owner and token, a
 * member no longer ours is DLOCK_ELOST as its own release would say
 * while the others are still released, and every member's waiters are
 * woken. A lost reply is handled as the single release handles it: sent
 * once more, and a member found free with our token still its last is
 * taken as released by the first attempt.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "redis.h"

/* Argument strings of one member: its owner (field or simple prefix), its
 * lease (acquire) and its token (release). */
struct member_args {
    char owner[160], lease[24], token[24];
};

/* Whether one script can cover HS[0..N): on a cluster, only names whose
 * keys share one slot (a common {hash tag}); cluster.c refuses the rest
 * before sending, and the core then goes member by member. */
static bool one_slot(const struct redis_state *s, struct dlock__hold **hs, size_t n)
{
    if (!s->cluster)
        return true;
    unsigned slot = dlock__redis_cluster_name_slot(s, hs[0]->name);
    for (size_t i = 1; i < n; i++)
        if (dlock__redis_cluster_name_slot(s, hs[i]->name) != slot)
            return false;
    return true;
}

/* Undo an acquisition of the set (request numbers up to LAST) that too
 * few replicas acknowledged (?sync=N), as mutex.c's undo_unsynced() does
 * for one hold: within DEADLINE, the call's budget, or owed to the
 * cleanup queue. */
static int undo_unsynced(struct redis_state *s, struct dlock__hold **hs, size_t n, int acked,
                         int64_t deadline, uint64_t last)
{
    int undo = DLOCK_OK;
    for (size_t i = 0; i < n; i++) {
        int rc = dlock__redis_undo_acquire(s, hs[i], last, deadline);
        undo = undo ? undo : rc;
    }
    return dlock__err(DLOCK_EUNAVAIL,
                      "%s: a multi-lock of %zu names was acquired on the master "
                      "but only %d of %d replicas acknowledged it within %lld ms (sync=%d); %s",
                      s->where, n, acked, s->sync_replicas, (long long)s->sync_timeout_ms,
                      s->sync_replicas,
                      undo ? "the undo did not fit in the call's bound and is queued, the keeper "
                             "sends it"
                           : "undone");
}

/* The script's reply R for HS[0..N) (KEYS[i] their keys): tokens set and
 * holds confirmed from SENT, or why not. */
static int take_reply(struct redis_state *s, const redisReply *r, struct dlock__hold **hs, size_t n,
                      const struct lock_keys *keys, int64_t sent, size_t *busy)
{
    if (r->type != REDIS_REPLY_ARRAY || r->elements < 1 ||
        r->element[0]->type != REDIS_REPLY_INTEGER)
        return dlock__err(DLOCK_EPROTO, "%s: unexpected reply to the multi-lock script (type %d)",
                          s->where, r->type);
    long long status = r->element[0]->integer;
    size_t at = r->elements >= 2 && r->element[1]->type == REDIS_REPLY_INTEGER &&
                        r->element[1]->integer >= 1 && (size_t)r->element[1]->integer <= n
                    ? (size_t)r->element[1]->integer - 1
                    : n;
    if (status == 1 && r->elements == n + 1) {
        for (size_t i = 0; i < n; i++) {
            if (r->element[i + 1]->type != REDIS_REPLY_INTEGER || r->element[i + 1]->integer < 0)
                return dlock__err(DLOCK_EPROTO, "%s: a multi-lock token that is not a number",
                                  s->where);
            hs[i]->token = (uint64_t)r->element[i + 1]->integer;
            dlock__hold_confirmed(s->c, hs[i], sent);
        }
        return DLOCK_OK;
    }
    if (status == 0 && at < n && r->elements == 3) {
        *busy = at;
        return dlock__err(DLOCK_EBUSY,
                          "%s: lock '%s' is held by another owner (%lld ms of lease left)",
                          s->where, keys[at].lock, r->element[2]->integer);
    }
    if (status == 2 && at < n && r->elements == 3 &&
        (r->element[2]->type == REDIS_REPLY_STATUS || r->element[2]->type == REDIS_REPLY_STRING))
        return dlock__redis_wrongtype(s, &keys[at], r->element[2]->str);
    if (status == -1) /* only a request canceled before it ran gets this */
        return dlock__err(DLOCK_EPROTO,
                          "%s: multi-lock acquire: the server found the request canceled",
                          s->where);
    return dlock__err(DLOCK_EPROTO, "%s: unexpected reply to the multi-lock script", s->where);
}

int dlock__redis_multi_acquire(void *state, struct dlock__hold **hs, size_t n,
                               struct dlock__wait *w, size_t *busy)
{
    struct redis_state *s = state;
    /* with a lock-delay, member by member: each arms its marker */
    if (hs[0]->mode != DLOCK_EXCLUSIVE || !one_slot(s, hs, n) || s->c->opts.lock_delay_ms)
        return DLOCK_ENOTSUP;
    for (size_t i = 0; i < n; i++)
        if (dlock__redis_fair(s, hs[i]))
            return DLOCK_ENOTSUP; /* a fair lock's queue decides (fair.c) */
    int64_t deadline = dlock__wait_deadline(w);
    /* an undo owed (sync=N) stays within the budget */
    int64_t budget = dlock__time_budget(deadline, s->op_timeout_ms);
    size_t nargs = 3 * n + 4 + 2 * n;
    struct lock_keys *keys = calloc(n, sizeof *keys);
    struct member_args *ma = calloc(n, sizeof *ma);
    const char **args = calloc(2 * nargs, sizeof *args);
    size_t *lens = calloc(2 * nargs, sizeof *lens);
    int rc = keys && ma && args && lens ? DLOCK_OK : dlock__err(DLOCK_ENOMEM, "out of memory");
    size_t made = 0;
    for (; !rc && made < n; made++) {
        struct dlock__hold *h = hs[made];
        if ((rc = dlock__redis_keys_make(s, h->name, &keys[made])))
            break;
        snprintf(h->owner, sizeof h->owner, "%s:%ld", s->uuid, h->tid);
        snprintf(ma[made].owner, sizeof ma[made].owner, s->simple ? "%s:" : "%s", h->owner);
        snprintf(ma[made].lease, sizeof ma[made].lease, "%lld", (long long)h->lease_ms);
        rc = dlock__redis_cancel_owed(s, h, deadline, w);
    }
    uint64_t num = __atomic_add_fetch(&s->requests, 2, __ATOMIC_RELAXED) - 1; /* num, num + 1 */
    char first[24], second[24], life[24];
    snprintf(first, sizeof first, "%llu", (unsigned long long)num);
    snprintf(second, sizeof second, "%llu", (unsigned long long)num + 1);
    snprintf(life, sizeof life, "%lld", (long long)dlock__redis_cancel_life_ms(hs[0]->lease_ms));
    if (!rc) {
        /* ARGS: the first attempt's; ARGS + NARGS: the retry's, which
         * cancels the first on the server. */
        for (int attempt = 0; attempt < 2; attempt++) {
            const char **a = args + attempt * nargs;
            size_t *l = lens + attempt * nargs, j = 0;
            for (size_t i = 0; i < n; i++) {
                a[j] = keys[i].lock, l[j++] = keys[i].lock_len;
                a[j] = keys[i].token, l[j++] = keys[i].token_len;
                a[j] = keys[i].canceled, l[j++] = keys[i].canceled_len;
            }
            a[j++] = attempt ? second : first;
            a[j++] = attempt ? first : "0";
            a[j++] = life;
            a[j++] = s->simple ? "simple" : "redisson";
            for (size_t i = 0; i < n; i++) {
                a[j++] = ma[i].owner;
                a[j++] = ma[i].lease;
            }
            for (size_t i = 3 * n; i < nargs; i++)
                l[i] = strlen(a[i]);
        }
        struct redis_request rq = {.script = S_ACQUIRE_MULTI,
                                   .nkeys = (int)(3 * n),
                                   .nargs = (int)nargs,
                                   .args = args,
                                   .lens = lens,
                                   .retry_args = args + nargs,
                                   .retry_lens = lens + nargs,
                                   .what = "acquire (multi-lock)",
                                   .wait = w,
                                   .deadline = deadline};
        rc = dlock__redis_eval(s, &rq);
        redisReply *r = rq.out.reply;
        int64_t sent = rq.out.sent_ms;
        int acked = rq.out.acked;
        if ((rc == DLOCK_ECONN || rc == DLOCK_ECANCELED) && rq.out.reached)
            for (size_t i = 0; i < n; i++)
                dlock__redis_cancel_lost_acquire(s, hs[i], num + 1, hs[i]->lease_ms);
        /* keys in several slots of a cluster: nothing ran; one by one */
        if (rc && strstr(dlock_errmsg(), "CROSSSLOT"))
            rc = DLOCK_ENOTSUP;
        if (!rc) {
            rc = take_reply(s, r, hs, n, keys, sent, busy);
            if (!rc && acked >= 0 && acked < s->sync_replicas)
                rc = undo_unsynced(s, hs, n, acked, budget, num + 1);
        }
        freeReplyObject(r);
    }
    if (rc == DLOCK_OK) /* where the new holder runs, for inspect (record.c) */
        dlock__redis_record_touch(s, hs[0]->lease_ms, DLOCK__NEVER);
    for (size_t i = 0; i < made && keys; i++)
        dlock__redis_keys_free(&keys[i]);
    free(keys);
    free(ma);
    free(args);
    free(lens);
    return rc;
}

int dlock__redis_multi_release(void *state, struct dlock__hold **hs, size_t n, int *rcs)
{
    struct redis_state *s = state;
    if (!one_slot(s, hs, n) || s->c->opts.lock_delay_ms) /* each deletes its marker */
        return DLOCK_ENOTSUP;
    for (size_t i = 0; i < n; i++)
        if (hs[i]->mode != DLOCK_EXCLUSIVE || dlock__redis_fair(s, hs[i]))
            return DLOCK_ENOTSUP; /* rwlock.c's and fair.c's own releases */
    size_t nargs = 4 * n + 1 + 2 * n;
    struct lock_keys *keys = calloc(n, sizeof *keys);
    struct member_args *ma = calloc(n, sizeof *ma);
    const char **args = calloc(nargs, sizeof *args);
    size_t *lens = calloc(nargs, sizeof *lens);
    if (!keys || !ma || !args || !lens) {
        free(keys);
        free(ma);
        free(args);
        free(lens);
        return DLOCK_ENOTSUP; /* member by member */
    }
    int rc = DLOCK_OK;
    size_t made = 0, j = 0;
    for (; !rc && made < n; made++) {
        struct dlock__hold *h = hs[made];
        if ((rc = dlock__redis_keys_make(s, h->name, &keys[made])))
            break;
        struct lock_keys *k = &keys[made];
        args[j] = k->lock, lens[j++] = k->lock_len;
        args[j] = k->chan, lens[j++] = k->chan_len;
        args[j] = k->token, lens[j++] = k->token_len;
        args[j] = k->rwchan, lens[j++] = k->rwchan_len;
    }
    args[j++] = s->simple ? "simple" : "redisson";
    for (size_t i = 0; !rc && i < n; i++) {
        struct dlock__hold *h = hs[i];
        if (s->simple) /* the simple layout's value carries the token */
            snprintf(ma[i].owner, sizeof ma[i].owner, "%s:%llu", h->owner,
                     (unsigned long long)h->token);
        else
            snprintf(ma[i].owner, sizeof ma[i].owner, "%s", h->owner);
        snprintf(ma[i].token, sizeof ma[i].token, "%llu", (unsigned long long)h->token);
        args[j++] = ma[i].owner;
        args[j++] = ma[i].token;
    }
    for (size_t i = 4 * n; i < nargs; i++)
        lens[i] = args[i] ? strlen(args[i]) : 0;
    struct redis_request rq = {.script = S_RELEASE_MULTI,
                               .nkeys = (int)(4 * n),
                               .nargs = (int)nargs,
                               .args = args,
                               .lens = lens,
                               .what = "release (multi-lock)",
                               .deadline = DLOCK__NEVER};
    if (!rc)
        rc = dlock__redis_eval(s, &rq);
    redisReply *r = rq.out.reply;
    bool retried = rq.out.retried, reached = rq.out.reached;
    /* keys in several slots of a cluster, or out of memory before the
     * script was sent: nothing ran; one by one. Out of memory once it was
     * sent (by either attempt), it may have run: member by member would
     * then find each hold gone and report it lost */
    if (rc && ((rc == DLOCK_ENOMEM && !reached && !retried) || strstr(dlock_errmsg(), "CROSSSLOT")))
        rc = DLOCK_ENOTSUP;
    if (!rc && (r->type != REDIS_REPLY_ARRAY || r->elements != n))
        rc = dlock__err(DLOCK_EPROTO,
                        "%s: unexpected reply to the multi-lock release script (type %d)", s->where,
                        r->type);
    char msg[DLOCK__MSG_MAX] = "";
    for (size_t i = 0; i < n; i++) {
        if (!rc && (rcs[i] = dlock__redis_release_reply(s, r->element[i], hs[i]->name, &keys[i],
                                                        hs[i]->token, retried)))
            dlock__errmsg_save(msg); /* the last member that failed says */
        else if (rc)
            rcs[i] = rc;
    }
    freeReplyObject(r);
    if (rc != DLOCK_ENOTSUP)
        for (size_t i = 0; i < n; i++) {
            free(hs[i]->bdata);
            hs[i]->bdata = NULL;
        }
    for (size_t i = 0; i < made; i++)
        dlock__redis_keys_free(&keys[i]);
    free(keys);
    free(ma);
    free(args);
    free(lens);
    if (!rc && msg[0])
        dlock__errmsg_restore(DLOCK_OK, msg);
    return rc == DLOCK_ENOTSUP ? rc : DLOCK_OK;
}
