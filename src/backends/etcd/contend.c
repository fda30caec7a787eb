/* contend.c -- the etcd backend's contended signal: a holder told when
 * another owner queues a key behind its own (dlock_lock_on_contended()).
 *
 * A contender waits by putting its key under the lock's prefix
 * "<prefix>NAME/" (Go's concurrency.Mutex), so a watch of that prefix
 * from the revision after the hold's own key's creation (its token) sees
 * every contender that came since -- those that were waiting when the
 * hold was taken included, replayed by etcd -- and every later one, as it
 * comes: each key created there other than the hold's is a waiter (the
 * core tells each once; WHO is the key and its create revision, so a
 * client that gave up and waits again is a new waiter). Pushed, then: one
 * watch stream per watched hold, opened as the acquire returns, on the
 * transport's watch thread (watch.c, a tapped watch); no request per
 * renewal. The watch ends when the core answers that the hold is gone
 * (the hold's own key deleted by the release is such an event), when
 * etcd cancels it (a compaction past its revision) or when its stream
 * ends (the member gone): the hold is then told nothing more (logged).
 */
#include "etcd.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct etcd_contend {
    struct etcd_backend *s;
    const struct dlock__hold *h; /* identity only: the core matches it */
    uint64_t token;
    char *own_key;
    bool held; /* the core's last answer */
};

/* One event of the prefix's stream: a key created other than ours is a
 * waiter. False once the hold is gone. */
static bool contend_event(void *arg, const json_t *ev)
{
    struct etcd_contend *k = arg;
    const json_t *kv = json_object_get(ev, "kv"), *type = json_object_get(ev, "type");
    int64_t create = 0, mod = 0;
    char *key = NULL, who[512];
    bool put = !type || (json_is_string(type) && strcmp(json_string_value(type), "PUT") == 0);
    if (put && dlock__etcd_int_of(kv, "create_revision", &create) &&
        dlock__etcd_int_of(kv, "mod_revision", &mod) && create == mod &&
        (key = dlock__etcd_kv_key((json_t *)kv)) && strcmp(key, k->own_key) != 0) {
        snprintf(who, sizeof who, "%s (revision %" PRId64 ")", key, create);
        k->held = dlock__hold_contended(k->s->c, k->h, k->token, who);
    } else {
        k->held = dlock__hold_contended(k->s->c, k->h, k->token, NULL);
    }
    free(key);
    return k->held;
}

/* The watch is over: say so when the hold still stands. */
static void contend_free(void *arg)
{
    struct etcd_contend *k = arg;
    if (k->held && dlock__hold_contended(k->s->c, k->h, k->token, NULL))
        dlock__log(k->s->c, DLOCK_LOG_WARN,
                   "%s: key %s: its waiters are no longer watched (the watch ended)", k->s->label,
                   k->own_key);
    free(k->own_key);
    free(k);
}

/* The backend's contend op: watch H's prefix for keys put behind H's. */
static int etcd_contend_watch(void *state, struct dlock__hold *h)
{
    struct etcd_backend *s = state;
    const struct etcd_hold *eh = h->bdata;
    struct etcd_contend *k = calloc(1, sizeof *k);
    char *pfx = dlock__etcd_lock_prefix(s, h->name);
    if (!k || !pfx || !(k->own_key = strdup(eh->key))) {
        free(k);
        free(pfx);
        return dlock__etcd_nomem(s);
    }
    k->s = s;
    k->h = h;
    k->token = h->token;
    k->held = true;
    struct etcd_tap tap = {.fn = contend_event, .free = contend_free, .arg = k};
    int rc = dlock__etcd_watch_tap(s->k, pfx, eh->rev + 1, &tap);
    free(pfx);
    return rc;
}

const struct dlock__contend_ops dlock__etcd_contend_ops = {
    .watch = etcd_contend_watch,
};
