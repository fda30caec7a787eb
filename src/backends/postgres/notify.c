/* notify.c -- LISTEN/NOTIFY for the waits the server does not queue:
 * a semaphore's waiters (no advisory call waits for "any of N keys") and
 * an election's observers (nothing waits for a row to change).
 *
 * Each semaphore and election has a channel, named after its key (a
 * channel is an identifier of at most 63 bytes; a name is not). A waiter
 * LISTENs on a session of its own before it looks, so whatever changes
 * after the look sends a notification it receives: a release, a proclaim,
 * a new leader each NOTIFY in the transaction that makes the change, and
 * PostgreSQL delivers a notification only once that transaction has
 * committed. A session receives its own notifications too: they are
 * dropped (be_pid is the session's own).
 */
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>

#include "pg.h"

void dlock__pg_channel(const char *kind, uint64_t key, char buf[PG_CHANNEL_MAX])
{
    snprintf(buf, PG_CHANNEL_MAX, "dlock_%s_%016" PRIx64, kind, key);
}

bool dlock__pg_notified(struct pg_conn *pc, bool read)
{
    if (read && !dlock__pq.consumeInput(pc->pq))
        return true; /* the session ended: the caller's next statement says so */
    bool seen = false;
    int self = dlock__pq.backendPID(pc->pq);
    PGnotify *n;
    while ((n = dlock__pq.notifies(pc->pq))) {
        seen |= n->be_pid != self;
        dlock__pq.freemem(n);
    }
    return seen;
}

int dlock__pg_wait_readable(struct pg_conn *const *pcs, int n, struct dlock__wait *w, int64_t until)
{
    int cancel_fd = -1;
    if (dlock__wait_cancel_fd(w, &cancel_fd) == DLOCK_ECANCELED)
        return DLOCK_ECANCELED;
    int64_t deadline = dlock__wait_deadline(w);
    struct pollfd p[3];
    if (n > 2)
        n = 2;
    for (;;) {
        int64_t now = dlock__now_ms();
        if (deadline != DLOCK__NEVER && now >= deadline)
            return DLOCK_ETIMEDOUT;
        if (until != DLOCK__NEVER && now >= until)
            return n;
        int64_t end = until < deadline ? until : deadline;
        int64_t left = end == DLOCK__NEVER ? 1000000 : end - now;
        int np = 0;
        for (int i = 0; i < n; i++)
            p[np++] = (struct pollfd){.fd = dlock__pq.socket(pcs[i]->pq), .events = POLLIN};
        if (cancel_fd >= 0)
            p[np++] = (struct pollfd){.fd = cancel_fd, .events = POLLIN};
        int got = poll(p, (nfds_t)np, left > 1000000 ? 1000000 : (int)left);
        if (got < 0 && errno != EINTR)
            return n; /* look again: the statement that follows says what is wrong */
        if (got <= 0)
            continue;
        if (cancel_fd >= 0 && p[n].revents)
            return DLOCK_ECANCELED;
        for (int i = 0; i < n; i++)
            if (p[i].revents)
                return i;
    }
}
