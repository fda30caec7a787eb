/* relay.c -- the delaying relay of the fault harness: a fixed latency on a
 * worker's connections, which this kernel cannot give (no netem; a token
 * bucket delays only a busy flow). It is the tests' one fault relay
 * (tests/lib/relay.h) with two callbacks: where a connection goes, and
 * how long its chunks wait.
 *
 * One process per run, in the servers' namespace, listening on one port.
 * A packet-delay event redirects a worker's new connections to it
 * (nftables `redirect`, so SO_ORIGINAL_DST still names the server it
 * meant) and breaks the worker's existing ones (`ss -K`), so that its
 * client reconnects through the relay. The relay connects to that server
 * on the loopback and passes the bytes on both ways, each chunk held
 * DELAY_MS[y] milliseconds from its arrival, where y is the third byte of
 * the worker's address 10.X.y.2 (its slot in chaos_shared), read at the
 * chunk's arrival: setting it to 0 ends the delay on connections already
 * relayed. Order is kept per direction. A worker that closes takes its
 * server side along; a server that closes or fails closes both, as a
 * broken connection does.
 */
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include "chaos.h"
#include "relay.h"

#ifndef SO_ORIGINAL_DST
#define SO_ORIGINAL_DST 80 /* <linux/netfilter_ipv4.h>, which clashes with <netinet/in.h> */
#endif

/* The port of the server CLI_FD's worker meant (the servers listen on
 * every address: the loopback reaches them). */
static int original_port(struct tu_relay *r, int cli_fd)
{
    (void)r;
    struct sockaddr_in orig;
    socklen_t olen = sizeof orig;
    if (getsockopt(cli_fd, SOL_IP, SO_ORIGINAL_DST, &orig, &olen) != 0)
        return -1;
    if (getenv("CHAOS_DEBUG"))
        fprintf(stderr, "chaos relay: a worker to port %d\n", ntohs(orig.sin_port));
    return ntohs(orig.sin_port);
}

/* DELAY_MS of the worker C comes from, now. */
static int worker_delay(struct tu_relay *r, const struct tu_relay_conn *c)
{
    const struct chaos_shared *sh = r->cf.arg;
    unsigned y = (c->peer >> 8) & 0xff;
    return sh->delay_ms[y < CHAOS_MAX_SPAWNS ? y : 0];
}

void chaos_relay_main(int lfd, const struct chaos_shared *sh)
{
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    signal(SIGPIPE, SIG_IGN);
    struct tu_relay r;
    tu_relay_serve(&r, &(struct tu_relay_config){.listen_fd = lfd,
                                                 .close_with_client = true,
                                                 .target_of = original_port,
                                                 .delay_of = worker_delay,
                                                 .arg = (void *)sh});
    _exit(2);
}
