/* election.c -- leader election, built on the lock machinery.
 *
 * A campaign is an exclusive hold. Each dlock_election owns a private
 * handle-owned lock handle on the election's name whose holds carry a
 * struct dlock__elect_req (the value to lead with), so the registry, the
 * keeper's renewals, validity, cancel objects and the lost callback
 * (through the handle's lost_fn) serve elections with no code of their
 * own: the dispatch (dispatch.c) calls the backend's election ops for
 * such holds. What is new here is the value: proclaimed while leading,
 * and read or followed by anyone through the election ops' observe.
 *
 * The asynchronous campaign and resign (at the end) are jobs on the
 * client's pool, as a semaphore's are: the campaign is the private
 * handle's acquire through async.c with a continuation, so its wait
 * parks wherever the backend gives its election ops try_armed()
 * (backend.h), and the job's completion hands the outcome to the loop.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

struct dlock_election {
    dlock_client *c;
    dlock_lock *l; /* handle-owned: leadership belongs to the handle */
    struct dlock__elect_req req;
    struct dlock__user_lost lost; /* dlock_election_lost_fn */
    bool calling; /* an asynchronous call through it has not had its
                     callback yet (client mutex) */
};

static bool has_elections(const dlock_client *c)
{
    const struct dlock__elect_ops *ops = c->be->elections;
    return ops && ops->acquire && ops->release && ops->proclaim && ops->observe;
}

static int no_elections(const dlock_client *c, const char *name)
{
    return dlock__err(DLOCK_ENOTSUP, "election '%s': the %s backend has no leader election yet",
                      name, c->be->name);
}

/* An election's checks of a campaign handle (dlock__handle_new): FLAGS
 * and the backend (no count). */
static int check_election(const dlock_client *c, const char *name, unsigned count, unsigned flags)
{
    (void)count;
    if (flags)
        return dlock__err(DLOCK_EINVAL, "election '%s': unknown flags 0x%x (reserved, must be 0)",
                          name, flags);
    return has_elections(c) ? DLOCK_OK : no_elections(c, name);
}

int dlock_lock_new_campaign(dlock_client *c, const char *name, const char *value, unsigned flags,
                            dlock_lock **out)
{
    dlock__msg_clear();
    if (!out || !value)
        return dlock__err(DLOCK_EINVAL, "dlock_lock_new_campaign: NULL argument");
    *out = NULL;
    dlock_lock *l = NULL;
    /* Handle-owned: the campaign belongs to the handle; the caller makes
     * its holds campaigns (l->elect). */
    int rc = dlock__handle_new(c, name, DLOCK_LOCK_HANDLE_OWNED, check_election, 0, flags, &l);
    if (rc)
        return rc;
    if (!(l->elect_req.value = dlock__strdup(value)))
        rc = dlock__err(DLOCK_ENOMEM, "out of memory");
    if (rc) {
        dlock_lock_free(l);
        return rc;
    }
    l->elect = &l->elect_req;
    *out = l;
    return DLOCK_OK;
}

/* The handle's lost callback: the election's. */
static void election_lost(dlock_lock *l, const char *why, void *arg)
{
    (void)l;
    dlock_election *e = arg;
    struct dlock__user_lost u = dlock__user_lost_get(e->c, &e->lost);
    if (u.fn)
        ((dlock_election_lost_fn)u.fn)(e, why, u.arg);
}

int dlock_election_new(dlock_client *c, const char *name, unsigned flags, dlock_election **out)
{
    dlock__msg_clear();
    if (!out)
        return dlock__err(DLOCK_EINVAL, "dlock_election_new: out is NULL");
    *out = NULL;
    /* Handle-owned: the campaign belongs to the handle; the caller makes
     * its holds campaigns (l->elect). */
    struct dlock__handle_request rq = {.name = name,
                                       .lock_flags = DLOCK_LOCK_HANDLE_OWNED,
                                       .check = check_election,
                                       .flags = flags,
                                       .size = sizeof(dlock_election)};
    dlock_election *e = dlock__handle_wrap(c, &rq);
    if (!e)
        return rq.out.rc;
    dlock_lock *l = rq.out.base;
    e->c = c;
    e->l = l;
    pthread_mutex_lock(&c->mu);
    l->elect = &e->req;
    l->lost_fn = election_lost;
    l->lost_arg = e;
    pthread_mutex_unlock(&c->mu);
    *out = e;
    return DLOCK_OK;
}

void dlock_election_free(dlock_election *e)
{
    if (!e)
        return;
    char msg[DLOCK__MSG_MAX];
    dlock__errmsg_save(msg); /* freeing leaves the message alone */
    dlock_lock_free(e->l);   /* releases what the handle holds */
    free(e->req.value);
    free(e);
    dlock__errmsg_restore(DLOCK_OK, msg);
}

int dlock_election_set_lease(dlock_election *e, int64_t lease_ms, unsigned flags)
{
    if (!e) {
        dlock__msg_clear();
        return dlock__err(DLOCK_EINVAL, "election is NULL");
    }
    return dlock_lock_set_lease(e->l, lease_ms, flags);
}

int dlock_election_on_lost(dlock_election *e, dlock_election_lost_fn fn, void *arg)
{
    return dlock__user_lost_set(e ? e->c : NULL, e ? &e->lost : NULL, "election",
                                (void (*)(void))fn, arg);
}

/* E's hold, if it leads or has lost its leadership (client mutex held). */
static struct dlock__hold *leadership(dlock_election *e)
{
    for (struct dlock__hold *h = e->l->e->holds; h; h = h->next)
        if (h->tid == e->l->owner)
            return h;
    return NULL;
}

/* The start of a call with a value (FN, for messages): E and VALUE not
 * NULL, the client usable, *COPY a copy of VALUE (the caller's to free).
 * Returns with the client's mutex held when it worked, for the caller to
 * look at E's leadership. */
static int value_call(dlock_election *e, const char *value, const char *fn, char **copy)
{
    dlock__msg_clear();
    if (!e || !value)
        return dlock__err(DLOCK_EINVAL, "%s: NULL argument", fn);
    int rc = dlock__check_client(e->c);
    if (rc)
        return rc;
    *copy = dlock__strdup(value);
    if (!*copy)
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    pthread_mutex_lock(&e->c->mu);
    return DLOCK_OK;
}

/* The lock words of a campaign's outcome RC (a wait of WAIT_MS), said of
 * E's election. */
static int campaign_outcome(dlock_election *e, int rc, int64_t wait_ms)
{
    if (!rc)
        return DLOCK_OK;
    const char *name = dlock_lock_name(e->l);
    char why[DLOCK__MSG_MAX];
    dlock__errmsg_save(why);
    if (rc == DLOCK_EBUSY)
        return dlock__err(rc, "election '%s': another campaigner leads", name);
    if (rc == DLOCK_ETIMEDOUT)
        return dlock__err(rc, "election '%s': not elected within %lld ms (%s)", name,
                          (long long)wait_ms, why);
    if (rc == DLOCK_ECANCELED)
        return dlock__err(rc, "election '%s': campaign canceled", name);
    return dlock__errmsg_restore(rc, why);
}

int dlock_election_campaign(dlock_election *e, const char *value, int64_t wait_ms,
                            dlock_cancel *cancel)
{
    char *copy = NULL;
    int rc = value_call(e, value, "dlock_election_campaign", &copy);
    if (rc)
        return rc;
    const char *name = dlock_lock_name(e->l);
    bool busy = leadership(e) || e->l->acquiring || e->calling;
    if (!busy) {
        free(e->req.value);
        e->req.value = copy;
        copy = NULL;
    }
    pthread_mutex_unlock(&e->c->mu);
    if (busy) {
        free(copy);
        return dlock__err(DLOCK_EMISUSE,
                          "election '%s': this handle already leads or campaigns (proclaim a "
                          "new value, or resign first)",
                          name);
    }
    return campaign_outcome(e, dlock_acquire_ex(e->l, wait_ms, cancel), wait_ms);
}

int dlock_election_cancel(dlock_election *e)
{
    dlock__msg_clear();
    if (!e)
        return dlock__err(DLOCK_EINVAL, "election is NULL");
    return dlock_lock_cancel(e->l);
}

int dlock_election_resign(dlock_election *e)
{
    dlock__msg_clear();
    if (!e)
        return dlock__err(DLOCK_EINVAL, "election is NULL");
    const char *name = dlock_lock_name(e->l);
    int rc = dlock__check_fork(e->c);
    if (rc)
        return rc;
    pthread_mutex_lock(&e->c->mu);
    bool leads = leadership(e) != NULL;
    pthread_mutex_unlock(&e->c->mu);
    if (!leads) {
        rc = dlock__check_client(e->c);
        return rc ? rc : dlock__err(DLOCK_ENOTOWNER, "election '%s': this handle does not lead",
                                    name);
    }
    rc = dlock_release(e->l);
    if (rc == DLOCK_ELOST) {
        /* "lock 'NAME' was lost before this release: WHY" */
        const char *was = strstr(dlock_errmsg(), " was lost");
        return dlock__err(rc, "election '%s': leadership%s", name, was ? was : " was lost");
    }
    return rc;
}

int dlock_election_proclaim(dlock_election *e, const char *value)
{
    char *copy = NULL;
    int rc = value_call(e, value, "dlock_election_proclaim", &copy);
    if (rc)
        return rc;
    dlock_client *c = e->c;
    const char *name = dlock_lock_name(e->l);
    struct dlock__hold *h = leadership(e);
    if (!h)
        rc = dlock__err(DLOCK_ENOTOWNER, "election '%s': this handle does not lead", name);
    else if (h->state == DLOCK__LOST)
        rc = dlock__err(DLOCK_ELOST, "election '%s': leadership was lost: %s", name,
                        h->lost_why ? h->lost_why : "no reason known");
    pthread_mutex_unlock(&c->mu);
    if (rc) {
        free(copy);
        return rc;
    }
    /* The caller does not resign meanwhile (one call at a time per
     * handle), so H stays ours while the backend writes. */
    rc = c->be->elections->proclaim(c->bstate, h, copy);
    if (rc) {
        free(copy);
        return rc;
    }
    pthread_mutex_lock(&c->mu);
    while (h->renewing) /* the keeper may read the value (etcd: a lease move) */
        pthread_cond_wait(&c->renew_cv, &c->mu);
    free(e->req.value);
    e->req.value = copy;
    pthread_mutex_unlock(&c->mu);
    return DLOCK_OK;
}

int dlock_election_token(dlock_election *e, uint64_t *token)
{
    if (!e || !token) {
        dlock__msg_clear();
        return dlock__err(DLOCK_EINVAL, "dlock_election_token: NULL argument");
    }
    int rc = dlock_token(e->l, token);
    if (!rc && dlock_validity_ms(e->l) == 0)
        rc = dlock__err(DLOCK_ELOST, "election '%s': leadership was lost",
                        dlock_lock_name(e->l));
    return rc;
}

int64_t dlock_election_validity_ms(dlock_election *e)
{
    if (!e) {
        dlock__msg_clear();
        return dlock__err(DLOCK_EINVAL, "election is NULL");
    }
    int64_t v = dlock_validity_ms(e->l);
    return v == DLOCK_ENOTOWNER ? 0 : v;
}

/* ------------------------------------------------------ asynchronous calls */

/* One asynchronous call through an election: a job on the client's pool. */
struct elect_call {
    struct dlock__job job;
    dlock_election *e;
    dlock_election_done_fn done;
    void *arg;
    int64_t wait_ms;
    dlock_cancel *cancel;
};

/* The campaign's acquire ended (its continuation, a pool thread). */
static void campaign_ended(dlock_lock *l, int rc, void *arg)
{
    (void)l;
    struct elect_call *ec = arg;
    dlock__job_end(&ec->job, campaign_outcome(ec->e, rc, ec->wait_ms));
}

static int campaign_run(struct dlock__job *j)
{
    struct elect_call *ec = (struct elect_call *)j;
    int rc = dlock__acquire_then(ec->e->l, ec->wait_ms, ec->cancel, campaign_ended, ec);
    return rc ? campaign_outcome(ec->e, rc, ec->wait_ms) : DLOCK__LATER;
}

static int resign_run(struct dlock__job *j)
{
    return dlock_election_resign(((struct elect_call *)j)->e);
}

static void elect_deliver(struct dlock__job *j, int rc)
{
    struct elect_call copy = *(struct elect_call *)j;
    free(j); /* before the callback, which may start the next call */
    pthread_mutex_lock(&copy.e->c->mu);
    copy.e->calling = false;
    pthread_mutex_unlock(&copy.e->c->mu);
    copy.done(copy.e, rc, copy.arg);
}

/* Start EC (its run set) through its election, which the caller marked
 * calling; frees EC and unmarks it when it does not start. */
static int elect_call_start(struct elect_call *ec, const char *fn)
{
    dlock_election *e = ec->e;
    ec->job.deliver = elect_deliver;
    int rc = dlock__job_start(e->c, &ec->job);
    if (rc) {
        free(ec);
        char why[DLOCK__MSG_MAX];
        dlock__errmsg_save(why);
        pthread_mutex_lock(&e->c->mu);
        e->calling = false;
        pthread_mutex_unlock(&e->c->mu);
        return dlock__err(rc, "%s: %s", fn, why);
    }
    return DLOCK_OK;
}

/* A new asynchronous call through E with DONE and ARG into *OUT (not
 * started: the caller marks E calling, sets its run and starts it). */
static int elect_call_new(dlock_election *e, dlock_election_done_fn done, void *arg,
                          struct elect_call **out)
{
    struct elect_call *ec = calloc(1, sizeof *ec);
    if (!ec)
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    ec->e = e;
    ec->done = done;
    ec->arg = arg;
    *out = ec;
    return DLOCK_OK;
}

int dlock_election_campaign_async(dlock_election *e, const char *value, int64_t wait_ms,
                                  dlock_cancel *cancel, dlock_election_done_fn done, void *arg)
{
    dlock__msg_clear();
    if (!e || !value || !done)
        return dlock__err(DLOCK_EINVAL, "dlock_election_campaign_async: NULL argument");
    const char *name = dlock_lock_name(e->l);
    char what[DLOCK__MSG_MAX];
    snprintf(what, sizeof what, "election '%s'", name);
    int rc = dlock__check_client(e->c);
    if (!rc)
        rc = dlock__async_can_wait(e->l, wait_ms, what);
    if (!rc && dlock_cancel_fired(cancel))
        rc = dlock__err(DLOCK_ECANCELED, "%s: canceled before the campaign began", what);
    char *copy = NULL;
    if (!rc && !(copy = dlock__strdup(value)))
        rc = dlock__err(DLOCK_ENOMEM, "out of memory");
    struct elect_call *ec = NULL;
    if (!rc)
        rc = elect_call_new(e, done, arg, &ec);
    if (rc) {
        free(copy);
        return rc;
    }
    pthread_mutex_lock(&e->c->mu);
    if (e->calling)
        rc = dlock__err(DLOCK_EBUSY,
                        "%s: an asynchronous call through this handle has not had its "
                        "callback yet",
                        what);
    else if (leadership(e) || e->l->acquiring)
        rc = dlock__err(DLOCK_EMISUSE,
                        "%s: this handle already leads or campaigns (proclaim a new value, or "
                        "resign first)",
                        what);
    if (!rc) {
        e->calling = true;
        dlock__lock_job_ahead(e->l); /* dlock_election_cancel() from now on ends it */
        free(e->req.value);
        e->req.value = copy;
        copy = NULL;
    }
    pthread_mutex_unlock(&e->c->mu);
    if (rc) {
        free(copy);
        free(ec);
        return rc;
    }
    ec->job.run = campaign_run;
    ec->wait_ms = wait_ms;
    ec->cancel = cancel;
    return elect_call_start(ec, "dlock_election_campaign_async");
}

int dlock_election_resign_async(dlock_election *e, dlock_election_done_fn done, void *arg)
{
    dlock__msg_clear();
    if (!e || !done)
        return dlock__err(DLOCK_EINVAL, "dlock_election_resign_async: NULL argument");
    int rc = dlock__check_client(e->c);
    struct elect_call *ec = NULL;
    if (!rc)
        rc = elect_call_new(e, done, arg, &ec);
    if (rc)
        return rc;
    const char *name = dlock_lock_name(e->l);
    pthread_mutex_lock(&e->c->mu);
    if (e->calling)
        rc = dlock__err(DLOCK_EBUSY,
                        "election '%s': an asynchronous call through this handle has not had "
                        "its callback yet",
                        name);
    else if (!leadership(e))
        rc = dlock__err(DLOCK_ENOTOWNER, "election '%s': this handle does not lead", name);
    else
        e->calling = true;
    pthread_mutex_unlock(&e->c->mu);
    if (rc) {
        free(ec);
        return rc;
    }
    ec->job.run = resign_run;
    return elect_call_start(ec, "dlock_election_resign_async");
}

/* ------------------------------------------------------------ observing */

int dlock_election_observe(dlock_client *c, const char *name, const dlock_leader *known,
                           int64_t wait_ms, dlock_cancel *cancel, dlock_leader **out)
{
    dlock__msg_clear();
    if (!out || !name)
        return dlock__err(DLOCK_EINVAL, "dlock_election_observe: NULL argument");
    *out = NULL;
    int rc = dlock__handle_probe(c, name, check_election, 0, 0);
    if (rc)
        return rc;
    if (wait_ms < 0 && wait_ms != DLOCK_FOREVER)
        return dlock__err(DLOCK_EINVAL, "election '%s': wait of %lld ms", name,
                          (long long)wait_ms);
    dlock_leader *l = calloc(1, sizeof *l);
    if (!l)
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    /* A one-shot read still waits (up to the op timeout) for a leader
     * caught between winning and writing its value. */
    struct dlock__wait w;
    dlock__wait_init(&w, known ? dlock__deadline(wait_ms)
                               : dlock__now_ms() + c->opts.op_timeout_ms);
    struct dlock__waitref cref = {&w, NULL};
    if (cancel && (rc = dlock__cancel_attach(cancel, &cref))) {
        dlock__wait_destroy(&w);
        free(l);
        return rc == DLOCK_ECANCELED ? dlock__err(rc, "election '%s': canceled", name) : rc;
    }
    w.cancel = cancel;
    rc = c->be->elections->observe(c->bstate, name, known, &w, l);
    if (cancel)
        dlock__cancel_detach(cancel, &cref);
    dlock__wait_destroy(&w);
    if (rc == DLOCK_ETIMEDOUT && known)
        rc = dlock__err(rc, "election '%s': no change within %lld ms", name, (long long)wait_ms);
    else if (rc == DLOCK_ECANCELED)
        rc = dlock__err(rc, "election '%s': observing canceled", name);
    if (rc) {
        dlock_leader_free(l);
        return rc;
    }
    if (!l->value && !(l->value = dlock__strdup(""))) {
        dlock_leader_free(l);
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    }
    *out = l;
    return DLOCK_OK;
}

int dlock_election_leader(dlock_client *c, const char *name, dlock_leader **out)
{
    return dlock_election_observe(c, name, NULL, 0, NULL, out);
}

int dlock_leader_held(const dlock_leader *l)
{
    return l && l->held;
}

const char *dlock_leader_value(const dlock_leader *l)
{
    return l && l->held && l->value ? l->value : "";
}

uint64_t dlock_leader_token(const dlock_leader *l)
{
    return l && l->held ? l->token : 0;
}

const char *dlock_leader_id(const dlock_leader *l)
{
    return l && l->held ? l->id : "";
}

uint64_t dlock_leader_version(const dlock_leader *l)
{
    return l && l->held ? l->version : 0;
}

void dlock_leader_free(dlock_leader *l)
{
    if (!l)
        return;
    free(l->value);
    free(l);
}
