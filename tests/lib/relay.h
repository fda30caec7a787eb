/* relay.h -- a TCP relay on a loopback port in front of a server, whose
 * client-to-server direction a test can hold: the requests of a late
 * network. A request sent while the relay holds reaches the server only
 * once the test lets it pass -- even after its client gave up on it and
 * closed the connection, which the relay keeps from the server: the
 * server serves it as if it had come late, not as a canceled request.
 * That is the request whose reply a client never saw and which still
 * lands afterwards (a member that was slow to apply it), made on demand.
 *
 * One thread of the test runs each relay. Every accepted connection gets
 * a connection of its own to the server.
 */
#ifndef DLOCK_TEST_RELAY_H
#define DLOCK_TEST_RELAY_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

enum tu_relay_mode {
    TU_RELAY_PASS,   /* both directions flow */
    TU_RELAY_HOLD,   /* nothing is accepted or read from clients: what they
                        send waits in the kernel's queues until PASS; the
                        server's replies to what passed before still flow */
    TU_RELAY_REFUSE, /* every new connection is closed at once (a server
                        that is down) */
};

struct tu_relay {
    int listen_fd, port, target;
    atomic_int mode, stop;
    atomic_uint passes; /* loops of the relay's thread so far */
    atomic_uint settled_at; /* the last loop that found nothing to move and
                               every request that passed answered */
    atomic_uint replies;    /* replies that reached a client still waiting */
    const char *_Atomic hold_at; /* tu_relay_hold_at()'s marker, NULL once met */
    atomic_int keeping; /* tu_relay_keep_at(): the marked request alone waits */
    atomic_uint kept;   /* requests kept back by tu_relay_keep_at() so far */
    pthread_t thread;
};

/* A relay on a free port of 127.0.0.1 (R->port) to 127.0.0.1:TARGET,
 * in MODE. */
void tu_relay_start(struct tu_relay *r, int target, enum tu_relay_mode mode);
/* Switch R to MODE; returns once it is in force. */
void tu_relay_set(struct tu_relay *r, enum tu_relay_mode mode);
/* Pass until a client sends MARKER (a string in its request, such as
 * the path "/v3/lease/revoke"), then HOLD from that request on: it waits
 * at the relay, whatever its client sent before it having passed, until
 * tu_relay_set(PASS). One marker at a time; returns once in force. */
void tu_relay_hold_at(struct tu_relay *r, const char *marker);
/* Pass, but keep back the first request a client sends with MARKER (and
 * whatever its connection sends after it) until tu_relay_let_kept(),
 * while every other connection flows: one request of a node that is late,
 * the node answering the others. R->kept counts the requests kept. One
 * marker at a time; returns once in force. */
void tu_relay_keep_at(struct tu_relay *r, const char *marker);
/* Send what tu_relay_keep_at() kept on to the server; returns once in
 * force (tu_relay_wait_served() says when it was served). */
void tu_relay_let_kept(struct tu_relay *r);
/* Wait (up to TIMEOUT_MS) until the relay, passing, has moved everything
 * its clients sent (even those that have gone since) and the server has
 * answered every request it passed: what was held has been served. */
bool tu_relay_wait_served(struct tu_relay *r, int timeout_ms);
/* Stop the thread and close every connection. */
void tu_relay_stop(struct tu_relay *r);

#endif
