/* elect.c -- `dlock elect` and `dlock leader`: one active instance of a
 * command across hosts, and who that is.
 *
 * `dlock elect NAME [--value V] [run's options] -- COMMAND` is `dlock run`
 * whose hold is a campaign in election NAME (dlock_lock_new_campaign):
 * COMMAND starts once elected and runs only while leading, with run's
 * job, guardian, signals, DLOCK_TOKEN and --on-lost (run.c does it all;
 * this file only takes --value out of the arguments). Without COMMAND it
 * is `dlock hold` for the leadership, as `etcdctl elect NAME VALUE`:
 * one line once leading, then led until stdin ends or a signal comes. `dlock leader NAME
 * [--watch] [--json]` prints the leader, and with --watch every change
 * until a signal ends it.
 */
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

/* Whether A is one of run's options whose value is the next argument. */
static bool takes_value(const char *a)
{
    static const char *const with_value[] =
        {"-w",        "--wait",     "--timeout",    "-E",           "--conflict-exit-code",
         "--lease",   "--on-lost",  "--kill-after", "--lost-grace", "-c",
         "--command", "--min-hold", "--pid",        "-u",           "--url",
         NULL};
    for (size_t i = 0; with_value[i]; i++)
        if (strcmp(a, with_value[i]) == 0)
            return true;
    return false;
}

int cmd_elect(const char *url, int argc, char **argv)
{
    /* run's arguments without --value V (before NAME); run parses them. */
    char **args = calloc((size_t)argc + 1, sizeof *args);
    if (!args)
        return EXIT_SOFTWARE;
    const char *value = "";
    int n = 0;
    bool options = true; /* before NAME */
    args[n++] = argv[0];
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (options && strcmp(a, "--value") == 0) {
            if (i + 1 >= argc) {
                fprintf(stderr, "dlock elect: option '--value' needs a value\n");
                cli_print_usage_line("elect");
                free(args);
                return EXIT_USAGE;
            }
            value = argv[++i];
            continue;
        }
        if (options && strncmp(a, "--value=", 8) == 0) {
            value = a + 8;
            continue;
        }
        if (options && (strcmp(a, "-s") == 0 || strcmp(a, "--shared") == 0 ||
                        strncmp(a, "--permits", 9) == 0)) {
            fprintf(stderr, "dlock elect: %s has no meaning for an election (one leader)\n", a);
            cli_print_usage_line("elect");
            free(args);
            return EXIT_USAGE;
        }
        if (options && takes_value(a) && i + 1 < argc) {
            args[n++] = argv[i++]; /* the option; its value below */
        } else if (options && (a[0] != '-' || strcmp(a, "--") == 0)) {
            options = false;
            if (a[0] == '/' || strncmp(a, "./", 2) == 0 || strncmp(a, "../", 3) == 0) {
                fprintf(stderr, "dlock elect: '%s' is a path; an election has a name\n", a);
                free(args);
                return EXIT_USAGE;
            }
        }
        args[n++] = argv[i];
    }
    int code = cmd_run_campaign(url, value, n, args);
    free(args);
    return code;
}

/* ---------------------------------------------------------------- leader */

static void json_str(const char *s)
{
    putchar('"');
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\')
            printf("\\%c", ch);
        else if (ch < 0x20)
            printf("\\u%04x", ch);
        else
            putchar(ch);
    }
    putchar('"');
}

/* One line for L: "token=T id=ID value=V" (value last: it may hold
 * spaces), "none" when nobody leads; or one JSON object. */
static void print_leader(const char *name, const dlock_leader *l, int json)
{
    if (json) {
        printf("{\"name\":");
        json_str(name);
        printf(",\"leader\":%s", dlock_leader_held(l) ? "true" : "false");
        if (dlock_leader_held(l)) {
            printf(",\"token\":%" PRIu64 ",\"version\":%" PRIu64 ",\"id\":", dlock_leader_token(l),
                   dlock_leader_version(l));
            json_str(dlock_leader_id(l));
            printf(",\"value\":");
            json_str(dlock_leader_value(l));
        }
        printf("}\n");
    } else if (dlock_leader_held(l)) {
        printf("token=%" PRIu64 " id=", dlock_leader_token(l));
        cli_print_text(dlock_leader_id(l));
        printf(" value=");
        cli_print_text(dlock_leader_value(l));
        putchar('\n');
    } else {
        printf("none\n");
    }
    fflush(stdout);
}

static dlock_cancel *stop_watch;

static void on_signal(int sig)
{
    (void)sig;
    dlock_cancel_fire(stop_watch); /* async-signal-safe */
}

int cmd_leader(const char *url, int argc, char **argv)
{
    static const struct option longs[] = {{"watch", no_argument, NULL, 'W'},
                                          {"json", no_argument, NULL, 'j'},
                                          {0, 0, 0, 0}};
    int watch = 0, json = 0, ch;
    optind = 1;
    opterr = 0;
    while ((ch = getopt_long(argc, argv, "+", longs, NULL)) != -1) {
        if (ch == 'W')
            watch = 1;
        else if (ch == 'j')
            json = 1;
        else {
            fprintf(stderr, "dlock leader: unknown option '%s'\n", argv[optind - 1]);
            cli_print_usage_line("leader");
            return EXIT_USAGE;
        }
    }
    /* --json and --watch may also follow NAME. */
    const char *name = NULL;
    for (int i = optind; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0)
            json = 1;
        else if (strcmp(argv[i], "--watch") == 0)
            watch = 1;
        else if (!name)
            name = argv[i];
        else {
            fprintf(stderr, "dlock leader: unexpected '%s'\n", argv[i]);
            cli_print_usage_line("leader");
            return EXIT_USAGE;
        }
    }
    if (!name) {
        fprintf(stderr, "dlock leader: missing NAME\n");
        cli_print_usage_line("leader");
        return EXIT_USAGE;
    }
    int code = cli_check_name("leader", name);
    if (code)
        return code;
    dlock_client *c;
    if ((code = cli_open(url, 0, &c)))
        return code;
    dlock_leader *l = NULL;
    int rc = dlock_election_leader(c, name, &l);
    if (rc) {
        code = cli_fail(rc, "leader");
        dlock_client_close(c);
        return code;
    }
    print_leader(name, l, json);
    if (watch) {
        /* Until SIGINT, SIGTERM or SIGHUP: each change, one line. */
        if ((rc = dlock_cancel_new(&stop_watch))) {
            code = cli_fail(rc, "leader");
        } else {
            struct sigaction sa = {.sa_handler = on_signal};
            sigemptyset(&sa.sa_mask);
            sigaction(SIGINT, &sa, NULL);
            sigaction(SIGTERM, &sa, NULL);
            sigaction(SIGHUP, &sa, NULL);
            signal(SIGPIPE, SIG_IGN);
            for (;;) {
                dlock_leader *next = NULL;
                rc = dlock_election_observe(c, name, l, DLOCK_FOREVER, stop_watch, &next);
                if (rc)
                    break;
                dlock_leader_free(l);
                l = next;
                print_leader(name, l, json);
            }
            code = rc == DLOCK_ECANCELED ? 0 : cli_fail(rc, "leader");
            /* The watch is over, and stop_watch is freed below: a signal
             * from now on (the second of a kill to the group and to the
             * pid) has nothing to stop and must not fire it. A handler
             * running on another thread meanwhile (the client's) ends
             * before dlock_client_close() has joined that thread. */
            sa.sa_handler = SIG_IGN;
            sigaction(SIGINT, &sa, NULL);
            sigaction(SIGTERM, &sa, NULL);
            sigaction(SIGHUP, &sa, NULL);
        }
    } else {
        code = dlock_leader_held(l) ? 0 : EXIT_FREE;
    }
    dlock_leader_free(l);
    dlock_client_close(c);
    dlock_cancel_free(stop_watch);
    return code;
}
