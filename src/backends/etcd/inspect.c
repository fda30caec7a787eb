/* inspect.c -- looking at the etcd backend's locks from outside: status
 * (inspect), force-release and list. Each reads only keys of a
 * contender's shape (queue.c), so an application's keys beside a lock are
 * neither shown nor deleted.
 */
#include "etcd.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* NAME's keys in one range, into INFO; *NEWEST the greatest create
 * revision among the holders (the newest reader of a shared hold); with
 * WANT_TTL the holder's lease's time to live too (a second request). */
static int inspect_range(struct etcd_backend *s, const char *name, struct dlock_info *info,
                         uint64_t *newest, bool want_ttl)
{
    char *pfx = dlock__etcd_lock_prefix(s, name);
    json_t *req = pfx ? dlock__etcd_range(pfx, true) : NULL;
    if (!req) {
        free(pfx);
        return dlock__etcd_nomem(s);
    }
    json_object_set_new(req, "sort_order", json_string("ASCEND"));
    json_object_set_new(req, "sort_target", json_string("CREATE"));
    json_object_set_new(req, "limit", json_string("10000"));
    json_t *reply = NULL;
    char what[1200];
    snprintf(what, sizeof what, "inspect '%s' (keys %s*)", name, pfx);
    int rc = dlock__etcd_call(s->k, "/v3/kv/range", req, &reply, what, NULL);
    json_decref(req);
    info->mode = DLOCK_EXCLUSIVE;
    info->ttl_ms = -1;
    info->nwaiters = 0;
    info->held = 0;
    json_t *kvs = rc ? NULL : json_object_get(reply, "kvs");
    size_t i;
    json_t *kv;
    int64_t holder_lease = 0;
    bool holding = true; /* the contenders so far hold: the first, and the
                            shared ones right behind a shared first */
    json_array_foreach(kvs, i, kv)
    {
        if (rc)
            break;
        if (!dlock__etcd_is_contender(pfx, kv))
            continue; /* a key of a lock below, an application's key */
        char *key = dlock__etcd_kv_key(kv);
        const char *vb = json_string_value(json_object_get(kv, "value"));
        char *value = vb ? dlock__etcd_unb64(vb, NULL) : NULL;
        char *text = key ? dlock__sprintf("%s%s%s%s", key, value && *value ? " (" : "",
                                          value && *value ? value : "", value && *value ? ")" : "")
                         : NULL;
        if (!text) {
            rc = dlock__etcd_nomem(s);
        } else if (!info->held) {
            info->held = 1;
            info->mode = dlock__etcd_is_shared(kv) ? DLOCK_SHARED : DLOCK_EXCLUSIVE;
            info->token = (uint64_t)dlock__etcd_int(kv, "create_revision");
            holder_lease = dlock__etcd_int(kv, "lease");
            *newest = info->token;
            rc = dlock__info_set_key(info, key);
            if (!rc)
                rc = dlock__info_add_holder(info, text, 1);
        } else if (holding && info->mode == DLOCK_SHARED && dlock__etcd_is_shared(kv)) {
            uint64_t rev = (uint64_t)dlock__etcd_int(kv, "create_revision");
            *newest = rev > *newest ? rev : *newest;
            rc = dlock__info_add_holder(info, text, 1); /* another reader */
        } else {
            holding = false;
            rc = dlock__info_add_waiter(info, text);
        }
        free(text);
        free(key);
        free(value);
    }
    json_decref(reply);
    if (!rc && !info->held)
        rc = dlock__info_set_key(info, pfx);
    if (!rc && holder_lease && want_ttl) {
        char *ids = dlock__etcd_i64s(holder_lease);
        json_t *treq = ids ? json_pack("{s:s}", "ID", ids) : NULL, *treply = NULL;
        free(ids);
        if (treq &&
            dlock__etcd_call(s->k, "/v3/lease/timetolive", treq, &treply, what, NULL) == 0) {
            int64_t ttl = dlock__etcd_int(treply, "TTL");
            info->ttl_ms = ttl >= 0 ? ttl * 1000 : -1;
        }
        json_decref(treq);
        json_decref(treply);
    }
    free(pfx);
    return rc;
}

int dlock__etcd_inspect(void *state, const char *name, struct dlock_info *info)
{
    uint64_t newest = 0;
    int rc = inspect_range(state, name, info, &newest, true);
    if (!rc && !info->held) /* free: in a lock-delay? (delay.c) */
        rc = dlock__etcd_delay_look(state, name, ETCD_DELAY_SHOW, &info->delay_ms, NULL);
    return rc;
}

/* The range alone: a key lives as long as its lease (etcd deletes it when
 * the lease ends), so a holder whose key is there is alive as etcd sees it. */
int dlock__etcd_check(void *state, const char *name, struct dlock__check_view *view)
{
    struct dlock_info *info = calloc(1, sizeof *info);
    if (!info)
        return dlock__etcd_nomem(state);
    uint64_t newest = 0;
    int rc = inspect_range(state, name, info, &newest, false);
    if (!rc)
        *view = (struct dlock__check_view){.held = info->held, .token = newest};
    dlock_info_free(info);
    return rc;
}

/* Delete contender KV (a key of a range reply), only if it is still the
 * one that reply saw (not a newer owner that came meanwhile). */
static int force_delete(struct etcd_backend *s, json_t *kv, const char *what)
{
    char *key = dlock__etcd_kv_key(kv);
    int rc =
        key ? dlock__etcd_delete_if_rev(s, key, dlock__etcd_int(kv, "create_revision"), what, NULL)
            : dlock__etcd_nomem(s);
    free(key);
    return rc;
}

int dlock__etcd_force_release(void *state, const char *name)
{
    struct etcd_backend *s = state;
    char *pfx = dlock__etcd_lock_prefix(s, name);
    if (!pfx)
        return dlock__etcd_nomem(s);
    char what[1200];
    snprintf(what, sizeof what, "force-release '%s' (keys %s*)", name, pfx);
    /* The holders: the first contender, and when it is shared, every
     * shared one after it up to the first writer. */
    struct etcd_queue_search writer = {.pfx = pfx,
                                       .ascending = true,
                                       .writers = true,
                                       .what = what};
    int rc = dlock__etcd_queue_find(s, &writer);
    json_t *holder = writer.out.kv;
    struct etcd_queue_search oldest = {.pfx = pfx, .ascending = true, .what = what};
    if (!rc)
        rc = dlock__etcd_queue_find(s, &oldest);
    json_t *first = oldest.out.kv;
    if (!rc && first &&
        (!holder ||
         dlock__etcd_int(first, "create_revision") < dlock__etcd_int(holder, "create_revision"))) {
        /* Readers hold (before the first writer, if any): each goes. */
        int64_t from = 0, upto = holder ? dlock__etcd_int(holder, "create_revision") : INT64_MAX;
        json_t *kv = NULL;
        while (!rc) {
            struct etcd_queue_search next = {.pfx = pfx,
                                             .ascending = true,
                                             .bound_rev = from,
                                             .what = what};
            rc = dlock__etcd_queue_find(s, &next);
            kv = next.out.kv;
            if (rc || !kv || dlock__etcd_int(kv, "create_revision") >= upto)
                break;
            from = dlock__etcd_int(kv, "create_revision");
            rc = force_delete(s, kv, what);
            json_decref(kv);
            kv = NULL;
        }
        json_decref(kv);
    } else if (!rc && first) {
        rc = force_delete(s, first, what); /* a writer holds */
    }
    json_decref(first);
    json_decref(holder);
    free(pfx);
    return rc;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* FN for each name NAME_OF finds in a key under the client's prefix
 * (NULL: not a key of that kind), once each, sorted. */
static int list_names(struct etcd_backend *s, const char *pattern, dlock_list_fn fn, void *arg,
                      char *(*name_of)(struct etcd_backend *s, const json_t *kv))
{
    char **names = NULL;
    size_t n = 0, cap = 0;
    int rc = DLOCK_OK;
    char *from = strdup(s->prefix);
    char *end = dlock__etcd_prefix_end_b64(s->prefix);
    while (!rc && from && end) {
        char *fb = *from ? dlock__etcd_b64(from, strlen(from)) : dlock__etcd_b64("", 1);
        json_t *req = fb ? json_pack("{s:s, s:s, s:s, s:b}", "key", fb, "range_end", end, "limit",
                                     "1000", "keys_only", 1)
                         : NULL;
        free(fb);
        json_t *reply = NULL;
        rc = req ? dlock__etcd_call(s->k, "/v3/kv/range", req, &reply, "list locks", NULL)
                 : dlock__etcd_nomem(s);
        json_decref(req);
        if (rc)
            break;
        json_t *kvs = json_object_get(reply, "kvs");
        size_t i;
        json_t *kv;
        char *last = NULL;
        json_array_foreach(kvs, i, kv)
        {
            free(last);
            last = dlock__etcd_kv_key(kv);
            char *name = last ? name_of(s, kv) : NULL;
            if (!name)
                continue;
            if (!dlock__glob(pattern, name) || (n && strcmp(names[n - 1], name) == 0)) {
                free(name);
                continue;
            }
            if (n == cap) {
                cap = cap ? cap * 2 : 64;
                char **grown = realloc(names, cap * sizeof *names);
                if (!grown) {
                    free(name);
                    rc = dlock__etcd_nomem(s);
                    break;
                }
                names = grown;
            }
            names[n++] = name;
        }
        bool more = json_is_true(json_object_get(reply, "more"));
        json_decref(reply);
        free(from);
        from = NULL;
        if (!rc && more && last) { /* next page: from the key right after LAST */
            size_t len = strlen(last);
            from = malloc(len + 2);
            if (from) {
                memcpy(from, last, len);
                from[len] = '\x01'; /* keys hold no NUL here: the next key is > last */
                from[len + 1] = 0;
            }
        }
        free(last);
        if (!more)
            break;
    }
    if (!rc && (!end))
        rc = dlock__etcd_nomem(s);
    free(from);
    free(end);
    if (n > 1)
        qsort(names, n, sizeof *names, cmp_str);
    for (size_t i = 0; i < n; i++) {
        bool dup = i + 1 < n && strcmp(names[i], names[i + 1]) == 0; /* report the last */
        if (!rc && !dup && fn(names[i], arg))
            rc = 1;
    }
    for (size_t i = 0; i < n; i++)
        free(names[i]);
    free(names);
    return rc == 1 ? DLOCK_OK : rc;
}

int dlock__etcd_list(void *state, const char *pattern, dlock_list_fn fn, void *arg)
{
    return list_names(state, pattern, fn, arg, dlock__etcd_contender_name);
}

int dlock__etcd_sem_list(void *state, const char *pattern, dlock_list_fn fn, void *arg)
{
    return list_names(state, pattern, fn, arg, dlock__etcd_sem_name);
}
