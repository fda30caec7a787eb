/* client.c -- a client: one URL, one backend connection, one registry of
 * names, one keeper thread. Options are set one at a time before
 * connecting, from the URL's query first and setopt calls after, so a
 * program can override what an operator wrote in DLOCK_URL.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"

#define DEFAULT_LEASE_MS 30000
#define DEFAULT_TIMEOUT_MS 5000

bool dlock__forked(const dlock_client *c)
{
    return c->fork_gen != dlock__fork_gen(); /* a load: no getpid() per request */
}

int dlock__check_fork(const dlock_client *c)
{
    if (dlock__forked(c))
        return dlock__err(DLOCK_EMISUSE,
                          "client for %s was made by process %d; a child after fork() must "
                          "open its own client",
                          c->url.redacted, (int)c->pid);
    return DLOCK_OK;
}

int dlock__check_client(const struct dlock_client *c)
{
    if (!c)
        return dlock__err(DLOCK_EINVAL, "client is NULL");
    int rc = dlock__check_fork(c);
    if (rc)
        return rc;
    if (__atomic_load_n(&c->closed, __ATOMIC_ACQUIRE)) /* a callback may ask as it closes */
        return dlock__err(DLOCK_EMISUSE, "client for %s was closed: only dlock_lock_free() "
                                         "may still be called on its handles",
                          c->url.redacted);
    return DLOCK_OK;
}

static int default_url(char **out)
{
    char *dir;
    int rc = dlock__file_default_dir(&dir);
    if (rc)
        return rc;
    *out = dlock__sprintf("file://%s", dir);
    free(dir);
    return *out ? DLOCK_OK : dlock__err(DLOCK_ENOMEM, "out of memory");
}

static int set_str(char **slot, const char *value)
{
    char *copy = NULL;
    if (value && !(copy = strdup(value)))
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    free(*slot);
    *slot = copy;
    return DLOCK_OK;
}

/* Where each option lives in struct dlock__opts: one table for both
 * kinds, so adding an option is one line. */
static const struct {
    dlock_option opt;
    bool is_str;
    size_t off;
} slots[] = {
    {DLOCK_OPT_KEY_PREFIX, true, offsetof(struct dlock__opts, key_prefix)},
    {DLOCK_OPT_USER, true, offsetof(struct dlock__opts, user)},
    {DLOCK_OPT_PASSWORD, true, offsetof(struct dlock__opts, password)},
    {DLOCK_OPT_LAYOUT, true, offsetof(struct dlock__opts, layout)},
    {DLOCK_OPT_TLS_CA, true, offsetof(struct dlock__opts, tls_ca)},
    {DLOCK_OPT_TLS_CERT, true, offsetof(struct dlock__opts, tls_cert)},
    {DLOCK_OPT_TLS_KEY, true, offsetof(struct dlock__opts, tls_key)},
    {DLOCK_OPT_LEASE_MS, false, offsetof(struct dlock__opts, lease_ms)},
    {DLOCK_OPT_CONNECT_TIMEOUT_MS, false, offsetof(struct dlock__opts, connect_timeout_ms)},
    {DLOCK_OPT_OP_TIMEOUT_MS, false, offsetof(struct dlock__opts, op_timeout_ms)},
    {DLOCK_OPT_DRIFT_MS, false, offsetof(struct dlock__opts, drift_ms)},
    {DLOCK_OPT_LOCK_DELAY_MS, false, offsetof(struct dlock__opts, lock_delay_ms)},
};

static void *slot_of(dlock_client *c, dlock_option opt, bool is_str)
{
    for (size_t i = 0; i < sizeof slots / sizeof *slots; i++)
        if (slots[i].opt == opt && slots[i].is_str == is_str)
            return (char *)&c->opts + slots[i].off;
    return NULL;
}

static char **str_slot(dlock_client *c, dlock_option opt)
{
    return slot_of(c, opt, true);
}

static int64_t *int_slot(dlock_client *c, dlock_option opt)
{
    return slot_of(c, opt, false);
}

/* Whether an integer option may be 0: the drift margin, and the
 * lock-delay (0 is off). */
static bool int_opt_zero_ok(dlock_option opt)
{
    return opt == DLOCK_OPT_DRIFT_MS || opt == DLOCK_OPT_LOCK_DELAY_MS;
}

/* The range of an integer option, the same from setopt and from the URL:
 * 1 ms to a year (or 0 where int_opt_zero_ok). */
static bool int_opt_in_range(dlock_option opt, int64_t ms)
{
    return ms >= (int_opt_zero_ok(opt) ? 0 : 1) && ms <= DLOCK__MAX_DURATION_MS;
}

/* What both setopt functions check first: a usable, unconnected client. */
static int setopt_check(dlock_client *c)
{
    dlock__msg_clear();
    int rc = dlock__check_client(c);
    if (rc)
        return rc;
    if (c->connected)
        return dlock__err(DLOCK_EMISUSE, "%s: options must be set before connecting",
                          c->url.redacted);
    return DLOCK_OK;
}

int dlock_client_setopt_int(dlock_client *c, dlock_option opt, int64_t value)
{
    int rc = setopt_check(c);
    if (rc)
        return rc;
    int64_t *slot = int_slot(c, opt);
    if (!slot)
        return dlock__err(DLOCK_EINVAL, "option %d is not an integer option", (int)opt);
    if (!int_opt_in_range(opt, value))
        return dlock__err(DLOCK_EINVAL, "option %d: %lld ms is out of range", (int)opt,
                          (long long)value);
    *slot = value;
    return DLOCK_OK;
}

int dlock_client_setopt_str(dlock_client *c, dlock_option opt, const char *value)
{
    int rc = setopt_check(c);
    if (rc)
        return rc;
    char **slot = str_slot(c, opt);
    if (!slot)
        return dlock__err(DLOCK_EINVAL, "option %d is not a string option", (int)opt);
    return set_str(slot, value);
}

/* The generic URL options, consumed here; backends consume their own
 * (listed per scheme in backends/registry.c). */
static const struct {
    const char *key;
    dlock_option opt;
} url_durations[] = {{"lease", DLOCK_OPT_LEASE_MS},
                     {"connect_timeout", DLOCK_OPT_CONNECT_TIMEOUT_MS},
                     {"timeout", DLOCK_OPT_OP_TIMEOUT_MS},
                     {"drift", DLOCK_OPT_DRIFT_MS},
                     {"lock_delay", DLOCK_OPT_LOCK_DELAY_MS}},
  url_strings[] = {{"prefix", DLOCK_OPT_KEY_PREFIX}, {"layout", DLOCK_OPT_LAYOUT},
                   {"user", DLOCK_OPT_USER},         {"password", DLOCK_OPT_PASSWORD},
                   {"tls_ca", DLOCK_OPT_TLS_CA},     {"tls_cert", DLOCK_OPT_TLS_CERT},
                   {"tls_key", DLOCK_OPT_TLS_KEY}};

bool dlock__option_known(const char *scheme, const char *key)
{
    for (size_t i = 0; i < sizeof url_durations / sizeof *url_durations; i++)
        if (strcmp(url_durations[i].key, key) == 0)
            return true;
    for (size_t i = 0; i < sizeof url_strings / sizeof *url_strings; i++)
        if (strcmp(url_strings[i].key, key) == 0)
            return true;
    if (strcmp(key, "password_file") == 0) /* read by apply_url_options() */
        return true;
    for (const char *const *p = dlock__backend_params(scheme); *p; p++)
        if (strcmp(*p, key) == 0)
            return true;
    return false;
}

static int apply_url_options(dlock_client *c)
{
    if (c->url.user && set_str(&c->opts.user, c->url.user))
        return DLOCK_ENOMEM;
    if (c->url.password && set_str(&c->opts.password, c->url.password))
        return DLOCK_ENOMEM;
    for (size_t i = 0; i < sizeof url_durations / sizeof *url_durations; i++) {
        const char *v = dlock__url_param(&c->url, url_durations[i].key);
        if (!v)
            continue;
        int64_t ms = dlock__parse_duration(v);
        if (ms < 0)
            return dlock__err(DLOCK_EBADURL,
                              "bad URL '%s': %s=%s is not a duration (e.g. 500ms, 10s, 1m)",
                              c->url.redacted, url_durations[i].key, v);
        if (!int_opt_in_range(url_durations[i].opt, ms))
            return dlock__err(DLOCK_EBADURL,
                              "bad URL '%s': %s=%s is out of range (%s to a year)",
                              c->url.redacted, url_durations[i].key, v,
                              int_opt_zero_ok(url_durations[i].opt) ? "0" : "1ms");
        *int_slot(c, url_durations[i].opt) = ms;
    }
    for (size_t i = 0; i < sizeof url_strings / sizeof *url_strings; i++) {
        const char *v = dlock__url_param(&c->url, url_strings[i].key);
        if (v && set_str(str_slot(c, url_strings[i].opt), v))
            return DLOCK_ENOMEM;
    }
    /* password_file=: read here, so that every user of the library has it
     * (secret.c says how a password file is checked) */
    const char *password_file = dlock__url_param(&c->url, "password_file");
    if (password_file) {
        if (c->opts.password)
            return dlock__err(DLOCK_EBADURL, "bad URL '%s': password_file and a password both "
                                             "given: give one",
                              c->url.redacted);
        int rc = dlock__password_file(password_file, "password_file", &c->opts.password);
        if (rc)
            return rc;
    }
    /* Before any network I/O: an option neither the core nor this
     * backend reads is a typo or a URL meant for another backend. */
    for (size_t i = 0; i < c->url.nparams; i++)
        if (!dlock__option_known(c->url.scheme, c->url.params[i].key))
            return dlock__err(DLOCK_EBADURL, "bad URL '%s': unknown option '%s' for the %s backend",
                              c->url.redacted, c->url.params[i].key, c->be->name);
    return DLOCK_OK;
}

int dlock_client_new(const char *url, dlock_client **out)
{
    dlock__msg_clear();
    if (!out)
        return dlock__err(DLOCK_EINVAL, "dlock_client_new: out is NULL");
    *out = NULL;
    char *def = NULL;
    if (!url || !*url) {
        int rc = default_url(&def);
        if (rc)
            return rc;
        url = def;
    }
    dlock_client *c = calloc(1, sizeof *c);
    if (!c) {
        free(def);
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    }
    c->pid = dlock__pid();
    c->fork_gen = dlock__fork_gen();
    c->refs = 1; /* dlock_client_close's */
    c->opts.lease_ms = DEFAULT_LEASE_MS;
    c->opts.connect_timeout_ms = DEFAULT_TIMEOUT_MS;
    c->opts.op_timeout_ms = DEFAULT_TIMEOUT_MS;
    c->opts.drift_ms = -1; /* derived from the lease unless set */
    pthread_mutex_init(&c->mu, NULL);
    pthread_mutex_init(&c->log_mu, NULL);
    dlock__cond_init_monotonic(&c->keeper_cv);
    dlock__cond_init_monotonic(&c->renew_cv);
    dlock__cond_init_monotonic(&c->cb.cv);
    c->buckets = calloc(DLOCK__BUCKETS, sizeof *c->buckets);
    int rc = c->buckets ? dlock__url_parse(url, &c->url) : dlock__err(DLOCK_ENOMEM, "out of memory");
    free(def);
    if (!rc)
        c->be = dlock__backend_find(c->url.scheme, &rc);
    if (!rc)
        rc = apply_url_options(c);
    if (rc) {
        dlock_client_close(c);
        return rc;
    }
    *out = c;
    return DLOCK_OK;
}

int dlock_client_connect(dlock_client *c)
{
    dlock__msg_clear();
    int rc = dlock__check_client(c);
    if (rc)
        return rc;
    if (c->connected)
        return dlock__err(DLOCK_EMISUSE, "%s: already connected", c->url.redacted);
    if (c->opts.drift_ms < 0)
        c->opts.drift_ms = 2 + c->opts.lease_ms / 100;
    if (c->opts.drift_ms >= c->opts.lease_ms)
        return dlock__err(DLOCK_EINVAL, "%s: drift margin %lld ms is not shorter than the lease",
                          c->url.redacted, (long long)c->opts.drift_ms);
    /* A core option, as every backend that keeps it keeps it the same
     * way (a marker the backend times); one without it refuses here,
     * before dialing. */
    if (c->opts.lock_delay_ms && !(c->be->caps & DLOCK__CAP_LOCK_DELAY))
        return dlock__err(DLOCK_ENOTSUP,
                          "%s: lock_delay: the %s backend has no lock-delay "
                          "(docs/backends.md says which do)",
                          c->url.redacted, c->be->name);
    for (size_t i = 0; i < c->url.nhosts; i++)
        if (!c->url.hosts[i].port)
            c->url.hosts[i].port = c->be->default_port;
    rc = c->be->open(c, &c->bstate);
    if (rc)
        return rc;
    for (size_t i = 0; i < c->url.nparams; i++)
        if (!c->url.params[i].used) {
            c->be->close(c->bstate);
            c->bstate = NULL;
            return dlock__err(DLOCK_EBADURL, "bad URL '%s': unknown option '%s' for the %s backend",
                              c->url.redacted, c->url.params[i].key, c->be->name);
        }
    c->connected = true;
    return DLOCK_OK;
}

int dlock_open(const char *url, dlock_client **out)
{
    dlock__msg_clear();
    int rc = dlock_client_new(url, out);
    if (rc)
        return rc;
    rc = dlock_client_connect(*out);
    if (rc) {
        char msg[1024];
        strncpy(msg, dlock_errmsg(), sizeof msg - 1);
        msg[sizeof msg - 1] = 0;
        dlock_client_close(*out);
        *out = NULL;
        dlock__err(rc, "%s", msg);
    }
    return rc;
}

const char *dlock_client_url(const dlock_client *c)
{
    return c ? c->url.redacted : NULL;
}

const char *dlock_client_backend(const dlock_client *c)
{
    return c && c->be ? c->be->name : NULL;
}

int dlock_client_master(dlock_client *c, char *buf, size_t size)
{
    dlock__msg_clear();
    if (!buf || !size)
        return dlock__err(DLOCK_EINVAL, "dlock_client_master: no buffer");
    *buf = 0;
    int rc = dlock__check_client(c);
    if (rc)
        return rc;
    if (!c->connected)
        return dlock__err(DLOCK_EMISUSE, "%s: connect the client first", c->url.redacted);
    if (!DLOCK__OP(c->be, admin, master))
        return dlock__err(DLOCK_ENOTSUP, "%s: the %s backend has no master to show",
                          c->url.redacted, c->be->name);
    return c->be->admin->master(c->bstate, buf, size);
}

/* Free C's memory: the last reference is gone (client_close and every
 * handle, and the callback thread when it outlived a close made from a
 * callback). In a child after fork() nothing is freed: the client's
 * mutexes and condition variables may have been held or waited on by
 * the parent's threads at the fork (glibc's pthread_cond_destroy() then
 * waits for a waiter the child does not have, forever), and what its
 * queued work frees may be too. Its memory stays, shared copy-on-write
 * with the parent, as its connection does. */
static void client_free(dlock_client *c)
{
    if (dlock__forked(c))
        return;
    dlock__cleanup_close(c, false, DLOCK__NEVER); /* no thread is left to race: free only */
    dlock__async_free(c);
    if (c->buckets) {
        for (size_t i = 0; i < DLOCK__BUCKETS; i++)
            while (c->buckets[i]) {
                struct dlock__entry *e = c->buckets[i];
                c->buckets[i] = e->next;
                dlock__entry_free(e);
            }
        free(c->buckets);
    }
    dlock__url_free(&c->url);
    char **strs[] = {&c->opts.key_prefix, &c->opts.user,    &c->opts.password, &c->opts.layout,
                     &c->opts.tls_ca,     &c->opts.tls_cert, &c->opts.tls_key};
    for (size_t i = 0; i < sizeof strs / sizeof *strs; i++)
        free(*strs[i]);
    pthread_cond_destroy(&c->keeper_cv);
    pthread_cond_destroy(&c->renew_cv);
    pthread_cond_destroy(&c->cb.cv);
    pthread_mutex_destroy(&c->mu);
    pthread_mutex_destroy(&c->log_mu);
    free(c);
}

void dlock__client_ref(dlock_client *c)
{
    __atomic_add_fetch(&c->refs, 1, __ATOMIC_RELAXED);
}

void dlock__client_unref(dlock_client *c)
{
    if (__atomic_sub_fetch(&c->refs, 1, __ATOMIC_ACQ_REL) == 0)
        client_free(c);
}

int64_t dlock__close_deadline(const struct dlock_client *c)
{
    int64_t deadline = __atomic_load_n(&c->close_deadline, __ATOMIC_ACQUIRE);
    return deadline && !dlock__forked(c) ? deadline : DLOCK__NEVER;
}

/* Closing ends what the client does -- holds, threads, connection -- but
 * its memory stays while handles remain (they may be freed later, as
 * sqlite3_close_v2 allows statements to be), so a dlock_lock_free() after
 * close is harmless: the last reference frees it. */
void dlock_client_close(dlock_client *c)
{
    if (!c)
        return;
    if (!dlock__forked(c)) {
        /* One deadline for all of it: at most one bounded attempt at what
         * is owed (a keeper's slice in flight counts as that attempt). */
        dlock__async_close(c); /* its completions run now, before anything ends */
        int64_t deadline = dlock__now_ms() + c->opts.op_timeout_ms;
        pthread_mutex_lock(&c->mu);
        __atomic_store_n(&c->close_deadline, deadline, __ATOMIC_RELEASE);
        __atomic_store_n(&c->closed, true, __ATOMIC_RELEASE);
        pthread_mutex_unlock(&c->mu);
        if (c->connected)
            dlock__release_all(c, deadline);
        dlock__keeper_stop(c);
        dlock__callbacks_stop(c);
        dlock__cleanup_close(c, true, deadline);
        if (c->bstate)
            c->be->close(c->bstate);
    }
    __atomic_store_n(&c->closed, true, __ATOMIC_RELEASE);
    c->bstate = NULL;
    dlock__client_unref(c);
}
