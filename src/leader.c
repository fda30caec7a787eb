/* leader.c -- an election's leader as an observer sees it, and the rules
 * every backend's election observe loop shares: when a look is done
 * (dlock__observe_done) and when a failed look is tried again
 * (dlock__observe_retry). Below the election primitive (election.c),
 * beside the other tools a backend uses. */
#include <string.h>

#include "backend.h"

bool dlock__leader_same(const struct dlock_leader *a, const struct dlock_leader *b)
{
    if (a->held != b->held)
        return false;
    if (!a->held)
        return true;
    return a->token == b->token && a->version == b->version &&
           strcmp(a->value ? a->value : "", b->value ? b->value : "") == 0;
}

bool dlock__observe_done(const struct dlock_leader *known, const struct dlock_leader *out,
                         bool consistent, const struct dlock__wait *w, int *rc)
{
    if (!consistent)
        return false;
    if (!known || !dlock__leader_same(known, out))
        *rc = DLOCK_OK;
    else if (dlock__wait_try_once(w))
        *rc = DLOCK_ETIMEDOUT;
    else
        return false;
    return true;
}

bool dlock__observe_retry(const struct dlock_leader *known, struct dlock__wait *w,
                          struct dlock__backoff *b, int *rc)
{
    if (*rc == DLOCK_OK) {
        dlock__backoff_reset(b);
        return false;
    }
    if ((*rc != DLOCK_ECONN && *rc != DLOCK_EUNAVAIL) || !known || dlock__wait_try_once(w))
        return false;
    char msg[DLOCK__MSG_MAX];
    dlock__errmsg_save(msg);
    int pause = dlock__wait_retry(w, b, DLOCK__NEVER);
    if (pause == DLOCK_OK)
        return true;
    if (pause == DLOCK_ECANCELED)
        *rc = DLOCK_ECANCELED;
    else
        dlock__errmsg_restore(*rc, msg);
    return false;
}
