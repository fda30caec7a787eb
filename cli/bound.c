/* bound.c -- what keeps `dlock run -w` within its bound, connection and
 * close included. The library's connect has no cancel and may take the
 * whole connect timeout (a stalled server, a ZooKeeper client retrying a
 * refused one), and a close spends up to an op timeout on what a stalled
 * server is owed. So a run's client connects, and closes after a wait
 * that failed, in a thread of its own that dlock waits for only until
 * the run's deadline or a signal: past it, dlock exits without it. That
 * is safe because nothing is held then, and what the client leaves on
 * the server (an owed cancel or delete, a session) ends with its lease.
 */
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"

/* Even a run whose bound is spent gives a close this long: a healthy
 * server answers a session's close in a round trip. */
#define CLOSE_GRACE_MS 250

int64_t cli_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void cli_exit_now(int code)
{
    fflush(stdout);
    fflush(stderr);
    _exit(code);
}

/* One call on a client in a thread of its own: connect or close. Heap
 * memory, never freed once the thread is left behind (dlock exits). */
struct client_step {
    dlock_client *c;
    bool close;
    int rc;
    char msg[1024]; /* dlock_errmsg() of the thread that connected */
    int done_fd;    /* eventfd: the step is over */
};

static void *step_main(void *arg)
{
    struct client_step *s = arg;
    if (s->close) {
        dlock_client_close(s->c);
    } else {
        s->rc = dlock_client_connect(s->c);
        snprintf(s->msg, sizeof s->msg, "%s", s->rc ? dlock_errmsg() : "");
    }
    uint64_t one = 1;
    if (s->done_fd >= 0 && write(s->done_fd, &one, sizeof one) < 0) {
        /* an eventfd write fails only on overflow: the waiter sees it ready */
    }
    return NULL;
}

/* Run S in a thread and wait until it is over (1), WAKE_FD is readable
 * (0, WAKE_FD may be -1) or DEADLINE passes (-1; CLI_NEVER: no bound).
 * Runs it in this thread when no thread can start. */
static int step_within(struct client_step *s, int64_t deadline, int wake_fd)
{
    pthread_t t;
    s->done_fd = eventfd(0, EFD_CLOEXEC);
    if (s->done_fd < 0 || pthread_create(&t, NULL, step_main, s) != 0) {
        if (s->done_fd >= 0)
            close(s->done_fd);
        s->done_fd = -1;
        step_main(s); /* done_fd -1: no word to send */
        return 1;
    }
    for (;;) {
        struct pollfd fds[2] = {{.fd = s->done_fd, .events = POLLIN},
                                {.fd = wake_fd, .events = POLLIN}};
        int64_t left = deadline == CLI_NEVER ? -1 : deadline - cli_now_ms();
        if (left < 0 && deadline != CLI_NEVER)
            left = 0;
        int n = poll(fds, 2, left < 0 ? -1 : left > 1000000 ? 1000000 : (int)left);
        if (n < 0 && errno != EINTR)
            n = 0;
        if (n > 0 && (fds[0].revents & POLLIN)) {
            pthread_join(t, NULL);
            close(s->done_fd);
            return 1;
        }
        if (n > 0 && (fds[1].revents & POLLIN))
            return 0;
        if (n == 0 && deadline != CLI_NEVER && cli_now_ms() >= deadline)
            return -1;
    }
}

int cli_open_within(const char *url, int64_t lease_ms, int64_t deadline, int wake_fd,
                    dlock_client **out)
{
    *out = NULL;
    dlock_client *c;
    int rc, code = cli_client_new(url, lease_ms, &c);
    if (code)
        return code;
    struct client_step *s = calloc(1, sizeof *s);
    if (!s) {
        dlock_client_close(c);
        fprintf(stderr, "dlock: out of memory\n");
        return EXIT_SOFTWARE;
    }
    s->c = c;
    s->done_fd = -1;
    /* The file backend only looks at a directory: no thread for that. */
    bool local = strcmp(dlock_client_backend(c), "file") == 0;
    int over = local ? (step_main(s), 1) : step_within(s, deadline, wake_fd);
    if (over == 0)
        return CLI_WOKEN;
    if (over < 0) {
        fprintf(stderr, "dlock: %s: no connection within the bound of -w\n", dlock_client_url(c));
        return CLI_OUT_OF_TIME;
    }
    rc = s->rc;
    if (rc) {
        fprintf(stderr, "dlock: %s\n", *s->msg ? s->msg : dlock_strerror(rc));
        free(s);
        dlock_client_close(c);
        return cli_exit_code(rc);
    }
    free(s);
    *out = c;
    return 0;
}

void cli_close_within(dlock_client *c, int64_t deadline, int code)
{
    int64_t least = cli_now_ms() + CLOSE_GRACE_MS;
    struct client_step *s = calloc(1, sizeof *s);
    if (!s) {
        dlock_client_close(c);
        return;
    }
    s->c = c;
    s->close = true;
    if (strcmp(dlock_client_backend(c), "file") == 0) {
        free(s);
        dlock_client_close(c); /* nothing to wait for on a server */
        return;
    }
    if (step_within(s, deadline == CLI_NEVER || deadline > least ? deadline : least, -1) < 0)
        cli_exit_now(code); /* the close goes on past the bound: leave it */
    free(s);
}
