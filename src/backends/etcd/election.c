/* election.c -- the etcd backend's leader election, on the key layout of
 * Go's concurrency.Election, so `etcdctl elect NAME PROPOSAL` and dlock
 * campaign in one election and `etcdctl elect -l NAME` observes dlock's
 * leader.
 *
 * Go's Election and Mutex share one layout: key "<prefix>NAME/<lease id
 * hex>" on the session lease, created if absent; the key with the lowest
 * create revision leads (is the lock's owner); a campaigner waits for
 * every older key to go. The only difference is the value: a campaign's
 * key holds its proposal. So a campaign is the mutex's acquire and
 * release (mutex.c) with dlock__etcd_hold_value() answering the proposal,
 * and this file adds the rest of Go's Election:
 *
 * - Proclaim: a put on the leader's own key guarded by its create
 *   revision (Go's "If(CreateRevision(leaderKey) = leaderRev)"); a key
 *   gone or recreated means leadership is lost.
 * - Observe: the first contender under the prefix by create revision,
 *   its value, create revision (the token) and mod revision (the
 *   version), followed through a watch on the whole prefix (Go's Observe
 *   watches the prefix for a leader and then the leader's key). A put
 *   that keeps the leader's value is not reported (as_observed).
 */
#include "etcd.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int dlock__etcd_elect_proclaim(void *state, struct dlock__hold *h, const char *value)
{
    struct etcd_backend *s = state;
    struct etcd_limits lim = {dlock__now_ms() + s->k->op_timeout_ms, NULL};
    int code = 0;
    int rc = dlock__etcd_hold_put_again(s, h, value, "proclaim in", &code, &lim);
    if (rc == ETCD_KEY_GONE) {
        const struct etcd_hold *eh = h->bdata;
        char why[1400];
        snprintf(why, sizeof why, "%s: key %s (create revision %lld) is gone", s->label, eh->key,
                 (long long)eh->rev);
        dlock__hold_lost(s->c, h, why);
        return dlock__err(DLOCK_ELOST, "election '%s': leadership was lost: %s", h->name, why);
    }
    return rc;
}

/* Read election NAME's leader (the first writer contender under PFX)
 * into OUT. */
static int read_leader(struct etcd_backend *s, const char *name, const char *pfx,
                       struct dlock_leader *out, const struct etcd_limits *lim)
{
    char what[1200];
    snprintf(what, sizeof what, "leader of election '%s'", name);
    struct etcd_queue_search leader = {.pfx = pfx,
                                       .ascending = true,
                                       .writers = true,
                                       .what = what,
                                       .lim = lim};
    int rc = dlock__etcd_queue_find(s, &leader);
    json_t *kv = leader.out.kv;
    free(out->value);
    memset(out, 0, sizeof *out);
    if (rc || !kv)
        return rc;
    size_t len = 0;
    const char *vb = json_string_value(json_object_get(kv, "value"));
    char *value = vb ? dlock__etcd_unb64(vb, &len) : dlock__strdup("");
    char *key = dlock__etcd_kv_key(kv);
    if (!value || !key) {
        free(value);
        free(key);
        json_decref(kv);
        return dlock__etcd_nomem(s);
    }
    out->held = true;
    out->token = (uint64_t)dlock__etcd_int(kv, "create_revision");
    out->version = (uint64_t)dlock__etcd_int(kv, "mod_revision");
    out->value = value;
    snprintf(out->id, sizeof out->id, "%s", key);
    free(key);
    json_decref(kv);
    return DLOCK_OK;
}

/* OUT as an observer compares it with KNOWN: a put of the leader's key
 * that kept its value is no change, so a leader with KNOWN's token and
 * value counts as KNOWN's version. Such a put is mutex.c's move_key: a
 * campaigner that waited hangs its key on the session lease once it
 * leads, and an observer that read the leader before that put would
 * report the same leader twice. A proclaim of the value already there is
 * one too, and goes unreported. Returns OUT, or SEEN filled. */
static const struct dlock_leader *as_observed(const struct dlock_leader *known,
                                              const struct dlock_leader *out,
                                              struct dlock_leader *seen)
{
    if (!known || !known->held || !out->held || known->token != out->token ||
        strcmp(known->value ? known->value : "", out->value ? out->value : "") != 0)
        return out;
    *seen = *out;
    seen->version = known->version;
    return seen;
}

/* How long an observer sleeps before it looks again without news: a
 * safety net for a watch etcd never confirms (an auth token that expired
 * on the way), not the way changes are learned. */
#define OBSERVE_SAFETY_MS 5000

int dlock__etcd_elect_observe(void *state, const char *name, const struct dlock_leader *known,
                              struct dlock__wait *w, struct dlock_leader *out)
{
    struct etcd_backend *s = state;
    char *pfx = dlock__etcd_lock_prefix(s, name);
    if (!pfx)
        return dlock__etcd_nomem(s);
    struct etcd_limits lim = {dlock__wait_deadline(w), w};
    struct etcd_watch *wt = NULL;
    struct dlock__backoff backoff = DLOCK__OBSERVE_BACKOFF;
    struct dlock_leader seen;
    int rc;
    for (;;) {
        unsigned seq = dlock__wait_seq(w);
        /* A watch confirmed before this look sees every change after it. */
        bool covered = wt && dlock__etcd_watch_live(wt);
        rc = read_leader(s, name, pfx, out, &lim);
        if (dlock__observe_retry(known, w, &backoff, &rc))
            continue; /* a member restarting, no leader for now */
        if (rc || dlock__observe_done(known, as_observed(known, out, &seen), true, w, &rc))
            break;
        if ((rc = dlock__etcd_watch_error(wt)))
            break;
        if (!covered) {
            /* A new watch from now on (one that fired, or that etcd has
             * not confirmed since last turn, is replaced): its
             * confirmation wakes us, then we look again. */
            dlock__etcd_watch_stop(wt);
            wt = NULL;
            rc = dlock__etcd_watch_prefix(s->k, pfx, w, &wt);
            if (dlock__observe_retry(known, w, &backoff, &rc))
                continue;
            if (rc)
                break;
        }
        rc = dlock__wait_sleep(w, seq, dlock__now_ms() + OBSERVE_SAFETY_MS);
        if (rc || (rc = dlock__etcd_watch_error(wt)))
            break;
    }
    dlock__etcd_watch_stop(wt);
    free(pfx);
    return rc;
}
