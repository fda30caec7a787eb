/* relay.h -- the one fault relay of the tests: a TCP relay on a loopback
 * port in front of a server, which a test turns into the network it
 * needs -- one that forwards, holds, drops, stalls, refuses, swallows or
 * delays -- without mocking the server. Every suite and the fault
 * harness use it.
 *
 * Its faults:
 * - a mode for the whole relay (enum tu_relay_mode): hold the clients'
 *   requests, refuse connections, throw replies (or everything) away,
 *   freeze the server's stream;
 * - a late request: one held while its client gives up and goes, then
 *   served as if it had come late (tu_relay_hold_at(), tu_relay_keep_at()
 *   and the KEEP actions). The relay keeps the server's side of a client
 *   that went open (unless told to close it) so the server never takes
 *   it for a canceled request. That is the request whose reply a client
 *   never saw and which still lands afterwards, made on demand;
 * - by a callback that reads each request (protocol-aware): keep that
 *   one back, lose its reply, forge its reply, mark its connection;
 * - a delay on every chunk, both ways, chosen per connection;
 * - cutting every connection, with a reset if asked.
 *
 * One thread runs each relay (tu_relay_start()), or the caller's own
 * (tu_relay_serve(), for a relay process). Every accepted connection gets
 * a connection of its own to the server. A read is taken for one request
 * and the next read from the server for its reply, which holds for the
 * request-reply protocols the tests drive one call at a time.
 */
#ifndef DLOCK_TEST_RELAY_H
#define DLOCK_TEST_RELAY_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>

enum tu_relay_mode {
    TU_RELAY_PASS,      /* both directions flow */
    TU_RELAY_HOLD,      /* nothing is accepted or read from clients: what they
                           send waits in the kernel's queues until PASS; the
                           server's replies to what passed before still flow */
    TU_RELAY_REFUSE,    /* a server that is down: entering it cuts every live
                           connection, and each new one is closed at once */
    TU_RELAY_DROP,      /* requests pass, the server's replies are thrown away
                           (they ran; their replies are lost) */
    TU_RELAY_BLACKHOLE, /* both directions are thrown away */
    TU_RELAY_FREEZE,    /* the server's bytes wait in the kernel, unread, on
                           the frozen connections (every one, or those marked
                           when the relay freezes marked ones only); requests
                           flow: a stream held up on the way */
};
/* Leaving DROP or BLACKHOLE for PASS cuts every live connection, before
 * anything moves in the new mode: a reply passed on after lost ones
 * would reach its client out of order, and the client reconnects. */

/* What tu_relay_config.on_request says to do with one request. */
enum tu_relay_action {
    TU_RELAY_FORWARD,    /* pass it on */
    TU_RELAY_DROP_REPLY, /* pass it on, throw its reply away, then cut the
                            connection: it ran, the client sees a reset */
    TU_RELAY_FORGE,      /* pass it on, and answer with tu_relay_config.forged
                            instead of the server's reply */
    TU_RELAY_KEEP,       /* keep it (and what its connection sends after it)
                            at gate 0, the connection open, until the gate
                            opens: then it is sent and its reply passed on */
    TU_RELAY_KEEP_CUT,   /* keep it at gate 1 and close the client's side now
                            (it saw the connection closed): it is sent once
                            the gate opens, a late request */
};

struct tu_relay;

/* One relayed connection, as the callbacks see it. CLI is -1 once the
 * client has gone. MARKED is the callbacks' to set. */
struct tu_relay_conn {
    int cli, srv;
    unsigned peer; /* the client's IPv4 address (host order) */
    bool marked;
    /* the relay's own */
    bool awaiting;      /* what passed has had no reply since */
    int reply_fate;     /* what the next reply meets (relay.c) */
    char *kept;         /* a kept request (malloc'd) */
    size_t kept_len;
    int kept_gate;
    struct tu_relay_chunk *q[2], *q_tail[2]; /* to the server, to the client */
};

struct tu_relay_config {
    int target;    /* the server's port on 127.0.0.1 */
    int listen_fd; /* a socket already listening, else 0: one on a free port */
    enum tu_relay_mode mode;
    bool close_with_client; /* a client that goes takes its server side along
                               once nothing it sent awaits a reply */
    bool freeze_marked;     /* FREEZE holds up marked connections only */
    bool gates_shut;        /* the KEEP actions' gates start shut */
    /* Called with every request a client sends (in PASS, FREEZE, DROP):
     * the action. NULL: forward them all. */
    enum tu_relay_action (*on_request)(struct tu_relay *r, struct tu_relay_conn *c,
                                       const char *req, size_t len);
    /* The port a new connection goes to (-1: close it). NULL: target. */
    int (*target_of)(struct tu_relay *r, int cli_fd);
    /* Milliseconds each chunk that arrives on C waits before it goes on
     * (read at its arrival; order is kept). NULL: none. */
    int (*delay_of)(struct tu_relay *r, const struct tu_relay_conn *c);
    const char *forged; /* TU_RELAY_FORGE's reply */
    void *arg;          /* the callbacks' */
};

struct tu_relay {
    struct tu_relay_config cf;
    int listen_fd, port;
    atomic_int mode, stop;
    atomic_int cut; /* asked of the loop: 1 cut, 2 cut with a reset */
    atomic_int gate_shut[2]; /* a kept request waits while its gate is shut */
    atomic_uint passes;      /* loops of the relay's thread so far */
    atomic_uint settled_at;  /* the last loop that found nothing to move and
                                every request that passed answered */
    atomic_uint replies;     /* replies that reached a client still waiting */
    atomic_int accepts;      /* connections accepted (refused ones too) */
    atomic_int open;         /* connections whose client is still there */
    atomic_int frozen;       /* connections frozen in the last loop */
    atomic_int kept;         /* requests kept back so far */
    atomic_int served[2];    /* kept requests of each gate the server answered */
    atomic_int dropped;      /* replies thrown away by DROP_REPLY */
    atomic_int forged;       /* replies forged by FORGE */
    const char *_Atomic hold_at; /* tu_relay_hold_at()'s marker, NULL once met */
    pthread_t thread;
};

/* A relay on a free port of 127.0.0.1 (R->port) to 127.0.0.1:TARGET,
 * in MODE, run by a thread of its own. */
void tu_relay_start(struct tu_relay *r, int target, enum tu_relay_mode mode);
/* The same, configured by CF. */
void tu_relay_start_with(struct tu_relay *r, const struct tu_relay_config *cf);
/* Run R configured by CF in the calling thread until tu_relay_stop()'s
 * flag (a relay process). */
void tu_relay_serve(struct tu_relay *r, const struct tu_relay_config *cf);
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
/* Send what tu_relay_keep_at() (gate 0) kept on to the server; returns
 * once in force (tu_relay_wait_served() says when it was served). */
void tu_relay_let_kept(struct tu_relay *r);
/* Shut (SHUT) or open GATE (0, 1) of the KEEP actions; returns once in
 * force. */
void tu_relay_gate(struct tu_relay *r, int gate, bool shut);
/* Wait (up to TIMEOUT_MS) until the relay, passing, has moved everything
 * its clients sent (even those that have gone since) and the server has
 * answered every request it passed: what was held has been served. */
bool tu_relay_wait_served(struct tu_relay *r, int timeout_ms);
/* Close every connection whose client is still there (its server side
 * too); with RESET the client's side is reset, as by a server killed
 * mid-conversation. Returns once done. */
void tu_relay_cut(struct tu_relay *r, bool reset);
/* Stop the thread and close every connection. */
void tu_relay_stop(struct tu_relay *r);

#endif
