/* main.c -- the dlock command: global options, dispatch, and the small
 * commands (status, release, list). `run` lives in run.c. Every failure
 * prints one line to stderr saying what failed and why, and exits with a
 * code from cli.h's table.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"

#include "bench.h"

int cli_exit_code(int err)
{
    switch (err) {
    case DLOCK_OK:
        return 0;
    case DLOCK_EBADURL:
    case DLOCK_EINVAL:
    case DLOCK_ENOENT:
        return EXIT_CONFIG;
    case DLOCK_EAUTH:
    case DLOCK_EACCES:
        return EXIT_NOPERM;
    case DLOCK_ECONN:
    case DLOCK_EUNAVAIL:
    case DLOCK_ENOTBUILT:
    case DLOCK_ENOTSUP:
    case DLOCK_EIO:
    case DLOCK_EBACKEND:
        return EXIT_UNAVAILABLE;
    case DLOCK_ELOST:
        return EXIT_LOST;
    case DLOCK_EWRONGTYPE:
        return EXIT_DATAERR;
    default:
        return EXIT_SOFTWARE;
    }
}

int cli_fail(int err, const char *what)
{
    const char *msg = dlock_errmsg();
    fprintf(stderr, "dlock: %s%s%s\n", what ? what : "", what ? ": " : "",
            *msg ? msg : dlock_strerror(err));
    return cli_exit_code(err);
}

int64_t cli_seconds(const char *s)
{
    /* Digits with an optional fraction, nothing else: strtod alone would
     * take " 1", "0x10", "1e3", "inf" and "nan". */
    size_t digits = strspn(s, "0123456789"), frac = 0;
    if (s[digits] == '.')
        frac = strspn(s + digits + 1, "0123456789");
    size_t len = digits + (s[digits] == '.' ? 1 + frac : 0);
    if (s[len] || digits + frac == 0 || digits > 9)
        return -1;
    return (int64_t)(strtod(s, NULL) * 1000 + 0.5);
}

int cli_check_name(const char *cmd, const char *name)
{
    size_t len = strlen(name);
    if (len && len <= DLOCK_NAME_MAX)
        return 0;
    fprintf(stderr, "dlock %s: %s\n", cmd,
            len ? "NAME is longer than " DLOCK__CLI_STR(DLOCK_NAME_MAX) " bytes"
                : "NAME is empty");
    cli_print_usage_line(cmd);
    return EXIT_USAGE;
}

int cli_verbosity;

void cli_time_of_day(char *buf, size_t size)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    localtime_r(&ts.tv_sec, &tm);
    size_t n = strftime(buf, size, "%H:%M:%S", &tm);
    snprintf(buf + n, size - n, ".%03ld", ts.tv_nsec / 1000000);
}

/* The library's log hook under -v: one stderr line per event. */
static void log_to_stderr(dlock_client *c, dlock_log_level level, const char *msg, void *arg)
{
    static const char *const level_names[] = {"", "error", "warning", "info", "debug"};
    (void)c;
    (void)arg;
    char when[32];
    cli_time_of_day(when, sizeof when);
    fprintf(stderr, "%s dlock: %s: %s\n", when, level_names[level <= DLOCK_LOG_DEBUG ? level : 0],
            msg);
}

int cli_open(const char *url, int64_t lease_ms, dlock_client **out)
{
    if (!url)
        url = getenv("DLOCK_URL");
    dlock_client *c;
    int rc = dlock_client_new(url, &c);
    if (!rc && lease_ms > 0)
        rc = dlock_client_setopt_int(c, DLOCK_OPT_LEASE_MS, lease_ms);
    if (!rc && cli_verbosity)
        rc = dlock_client_set_log(c, log_to_stderr, NULL,
                                  cli_verbosity > 1 ? DLOCK_LOG_DEBUG : DLOCK_LOG_INFO);
    if (!rc)
        rc = dlock_client_connect(c);
    if (rc) {
        int code = cli_fail(rc, NULL);
        if (c)
            dlock_client_close(c);
        *out = NULL;
        return code;
    }
    *out = c;
    return 0;
}

/* ------------------------------------------------------------- JSON */

static void json_string(const char *s)
{
    putchar('"');
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\')
            printf("\\%c", ch);
        else if (ch < 0x20 || ch >= 0x7f)
            printf("\\u%04x", ch); /* bytes, not code points: names are bytes */
        else
            putchar(ch);
    }
    putchar('"');
}

/* A name for the terminal: non-printable bytes as \xHH. */
static void print_name(const char *s)
{
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch < 0x20 || ch >= 0x7f || ch == '\\')
            printf("\\x%02x", ch);
        else
            putchar(ch);
    }
}

/* Options after the command: -u URL and --json. Returns the index of the
 * first operand, or -1 after printing a usage error. */
struct sub_opts {
    const char *url;
    int json, force;
    unsigned permits; /* status --permits N: a semaphore of N permits (0 = stored) */
    bool semaphore;
};

static int sub_parse(const char *cmd, int argc, char **argv, struct sub_opts *o, bool force_ok)
{
    static const struct option longs[] = {{"json", no_argument, NULL, 'j'},
                                          {"force", no_argument, NULL, 'f'},
                                          {"url", required_argument, NULL, 'u'},
                                          {"help", no_argument, NULL, 'h'},
                                          {"permits", required_argument, NULL, 'P'},
                                          {0, 0, 0, 0}};
    optind = 1;
    opterr = 0;
    int ch;
    while ((ch = getopt_long(argc, argv, "+u:h", longs, NULL)) != -1) {
        switch (ch) {
        case 'j':
            o->json = 1;
            break;
        case 'f':
            if (!force_ok)
                goto bad;
            o->force = 1;
            break;
        case 'u':
            o->url = optarg;
            break;
        case 'P': { /* status only: NAME is a semaphore (0: its stored count) */
            char *end;
            long v = strtol(optarg, &end, 10);
            if (strcmp(cmd, "status") || end == optarg || *end || v < 0 || v > DLOCK_PERMITS_MAX)
                goto bad;
            o->permits = (unsigned)v;
            o->semaphore = true;
            break;
        }
        case 'h':
            cli_help(cmd, 0);
            exit(0);
        default:
        bad:
            fprintf(stderr, "dlock %s: unknown option '%s'\n", cmd, argv[optind - 1]);
            cli_print_usage_line(cmd);
            return -1;
        }
    }
    return optind;
}

/* status of a path (the flock(2) form of run), read from /proc/locks
 * without touching the lock: the FLOCK entries on the file's device and
 * inode give the mode, the holders' pids and the waiters ("->" lines). */
static int path_status(const char *path, int json)
{
    struct cli_flock_info fi;
    int e = cli_flock_info(path, &fi);
    if (e) {
        fprintf(stderr, "dlock status: %s: %s\n", path, strerror(e));
        return e == EACCES ? EXIT_NOPERM : EXIT_UNAVAILABLE;
    }
    bool held = fi.held;
    const char *mode = fi.shared ? "shared" : "exclusive", *holders = fi.pids;
    long waiters = fi.waiters;
    if (json) {
        printf("{\"name\":");
        json_string(path);
        printf(",\"backend\":\"flock\",\"key\":");
        json_string(path);
        printf(",\"held\":%s,\"mode\":%s%s%s,\"token\":null,\"ttl_ms\":null,\"holders\":[",
               held ? "true" : "false", held ? "\"" : "", held ? mode : "null", held ? "\"" : "");
        char *save, *tok, *copy = strdup(holders);
        for (tok = copy ? strtok_r(copy, " ", &save) : NULL; tok; tok = strtok_r(NULL, " ", &save))
            printf("%s{\"id\":\"pid %s\",\"count\":null}", tok == copy ? "" : ",", tok);
        free(copy);
        printf("],\"waiters\":%ld}\n", waiters);
    } else {
        printf("name:     ");
        print_name(path);
        printf("\nbackend:  flock(2) on the file itself\nstate:    %s%s%s\n",
               held ? "held (" : "free", held ? mode : "", held ? ")" : "");
        if (held)
            printf("holders:  pid %s\n", holders);
        printf("waiters:  %ld\n", waiters);
    }
    return held ? 0 : EXIT_FREE;
}

/* ,"client":{...}: the counters of the client that made the request
 * (dlock_client_stats), the shape a service exports to its metrics. */
static void json_client_stats(dlock_client *c)
{
    dlock_stats st = {.size = sizeof st};
    if (dlock_client_stats(c, &st))
        return;
    printf(",\"client\":{\"acquisitions\":%" PRIu64 ",\"waits\":%" PRIu64 ",\"wait_ms\":%" PRIu64
           ",\"renewals\":%" PRIu64 ",\"renewal_ms\":%" PRIu64 ",\"renewal_max_ms\":%" PRIu64
           ",\"renewal_failures\":%" PRIu64 ",\"losses\":%" PRIu64 ",\"reconnects\":%" PRIu64 "}",
           st.acquisitions, st.waits, st.wait_ms, st.renewals, st.renewal_ms, st.renewal_max_ms,
           st.renewal_failures, st.losses, st.reconnects);
}

int cmd_status(const char *url, int argc, char **argv)
{
    struct sub_opts o = {url, 0, 0, 0, false};
    int i = sub_parse("status", argc, argv, &o, false);
    if (i < 0)
        return EXIT_USAGE;
    /* --json may also follow the name */
    if (i < argc && i + 2 == argc && strcmp(argv[i + 1], "--json") == 0)
        o.json = 1, argc--;
    if (i + 1 != argc) {
        fprintf(stderr, "dlock status: expected exactly one NAME\n");
        cli_print_usage_line("status");
        return EXIT_USAGE;
    }
    const char *name = argv[i];
    int code = cli_check_name("status", name);
    if (code)
        return code;
    if (cli_is_path(o.url, name))
        return path_status(name, o.json);
    dlock_client *c;
    code = cli_open(o.url, 0, &c);
    if (code)
        return code;
    dlock_info *info;
    int rc = o.semaphore ? dlock_semaphore_inspect(c, name, o.permits, &info)
                         : dlock_inspect(c, name, &info);
    if (rc) {
        code = cli_fail(rc, "status");
        dlock_client_close(c);
        return code;
    }
    int held = dlock_info_held(info);
    const char *mode = dlock_info_mode(info) == DLOCK_SHARED ? "shared" : "exclusive";
    int64_t ttl = dlock_info_ttl_ms(info);
    long nw = dlock_info_waiter_count(info);
    if (o.json) {
        printf("{\"name\":");
        json_string(name);
        printf(",\"backend\":");
        json_string(dlock_client_backend(c));
        printf(",\"key\":");
        json_string(dlock_info_key(info));
        printf(",\"held\":%s,\"mode\":", held ? "true" : "false");
        if (held && !o.semaphore) /* a permit has no mode */
            json_string(mode);
        else
            printf("null");
        printf(",\"token\":%" PRIu64 ",\"ttl_ms\":", dlock_info_token(info));
        if (ttl == DLOCK_VALID_FOREVER || ttl < 0)
            printf("null");
        else
            printf("%" PRId64, ttl);
        printf(",\"holders\":[");
        for (size_t k = 0; k < dlock_info_holder_count(info); k++) {
            unsigned count;
            const char *who = dlock_info_holder(info, k, &count);
            printf("%s{\"id\":", k ? "," : "");
            json_string(who);
            printf(",\"count\":%u}", count);
        }
        printf("]");
        if (o.semaphore)
            printf(",\"permits\":%u,\"free_permits\":%ld", dlock_info_permits(info),
                   dlock_info_free_permits(info));
        printf(",\"waiters\":");
        if (nw < 0)
            printf("null");
        else {
            printf("[");
            for (long k = 0; k < nw; k++) {
                printf(k ? "," : "");
                json_string(dlock_info_waiter(info, (size_t)k));
            }
            printf("]");
        }
        json_client_stats(c);
        printf("}\n");
    } else {
        printf("name:     ");
        print_name(name);
        printf("\nbackend:  %s\nkey:      %s\n", dlock_client_backend(c), dlock_info_key(info));
        if (o.semaphore)
            held = held && dlock_info_free_permits(info) == 0 ? 2 : held; /* 2: all held */
        printf("state:    %s%s%s%s\n",
               o.semaphore ? (held == 2 ? "all permits held" : held ? "permits held" : "free")
               : held      ? "held ("
                           : "free",
               held && !o.semaphore ? mode : "", held && !o.semaphore ? ")" : "",
               "");
        for (size_t k = 0; k < dlock_info_holder_count(info); k++) {
            unsigned count;
            const char *who = dlock_info_holder(info, k, &count);
            if (count)
                printf("holder:   %s (%s %u)\n", who, o.semaphore ? "permits" : "hold count",
                       count);
            else
                printf("holder:   %s\n", who);
        }
        if (o.semaphore)
            printf("permits:  %u, %ld free\n", dlock_info_permits(info),
                   dlock_info_free_permits(info));
        printf("token:    %" PRIu64 "%s\n", dlock_info_token(info),
               held ? "" : " (last issued)");
        if (ttl == DLOCK_VALID_FOREVER)
            printf("ttl:      none (held until released or its process exits)\n");
        else if (ttl >= 0)
            printf("ttl:      %" PRId64 " ms\n", ttl);
        if (nw < 0)
            printf("waiters:  unknown to this backend\n");
        else {
            printf("waiters:  %ld\n", nw);
            for (long k = 0; k < nw; k++)
                printf("  %ld. %s\n", k + 1, dlock_info_waiter(info, (size_t)k));
        }
    }
    dlock_info_free(info);
    dlock_client_close(c);
    return held ? 0 : EXIT_FREE;
}

int cmd_release(const char *url, int argc, char **argv)
{
    struct sub_opts o = {url, 0, 0, 0, false};
    int i = sub_parse("release", argc, argv, &o, true);
    if (i < 0)
        return EXIT_USAGE;
    if (i + 1 != argc || !o.force) {
        fprintf(stderr, "dlock release: %s\n",
                !o.force ? "--force is required (this frees a lock someone else may hold)"
                         : "expected exactly one NAME");
        cli_print_usage_line("release");
        return EXIT_USAGE;
    }
    int code = cli_check_name("release", argv[i]);
    if (code)
        return code;
    if (cli_is_path(o.url, argv[i])) {
        fprintf(stderr, "dlock release: %s is a file locked with flock(2): the kernel keeps "
                        "the lock for the processes holding it (dlock status %s shows their "
                        "pids); stop them to free it\n",
                argv[i], argv[i]);
        return EXIT_UNAVAILABLE;
    }
    dlock_client *c;
    code = cli_open(o.url, 0, &c);
    if (code)
        return code;
    int rc = dlock_force_release(c, argv[i]);
    code = rc ? cli_fail(rc, "release --force") : 0;
    dlock_client_close(c);
    return code;
}

struct list_ctx {
    int json, n;
};

static int list_one(const char *name, void *arg)
{
    struct list_ctx *ctx = arg;
    if (ctx->json) {
        printf("%s", ctx->n ? "," : "");
        json_string(name);
    } else {
        print_name(name);
        putchar('\n');
    }
    ctx->n++;
    return 0;
}

int cmd_list(const char *url, int argc, char **argv)
{
    struct sub_opts o = {url, 0, 0, 0, false};
    int i = sub_parse("list", argc, argv, &o, false);
    if (i < 0)
        return EXIT_USAGE;
    if (i < argc && strcmp(argv[argc - 1], "--json") == 0)
        o.json = 1, argc--;
    if (argc - i > 1) {
        fprintf(stderr, "dlock list: expected at most one PATTERN\n");
        cli_print_usage_line("list");
        return EXIT_USAGE;
    }
    dlock_client *c;
    int code = cli_open(o.url, 0, &c);
    if (code)
        return code;
    struct list_ctx ctx = {o.json, 0};
    if (o.json)
        printf("[");
    int rc = dlock_list(c, i < argc ? argv[i] : NULL, list_one, &ctx);
    if (o.json)
        printf("]\n");
    code = rc ? cli_fail(rc, "list") : 0;
    dlock_client_close(c);
    return code;
}

int main(int argc, char **argv)
{
    static const struct option longs[] = {{"url", required_argument, NULL, 'u'},
                                          {"help", no_argument, NULL, 'h'},
                                          {"version", no_argument, NULL, 'V'},
                                          {0, 0, 0, 0}};
    const char *url = NULL;
    int ch;
    opterr = 0;
    while ((ch = getopt_long(argc, argv, "+u:hV", longs, NULL)) != -1) {
        switch (ch) {
        case 'u':
            url = optarg;
            break;
        case 'h':
            return cli_help(NULL, 0);
        case 'V':
            printf("dlock %s\n", dlock_version());
            return 0;
        default:
            if (optopt == 'u')
                fprintf(stderr, "dlock: -u needs a URL\n");
            else
                fprintf(stderr, "dlock: unknown option '%s' (try dlock --help)\n",
                        argv[optind - 1]);
            return EXIT_USAGE;
        }
    }
    if (optind >= argc) {
        cli_help(NULL, 1);
        return EXIT_USAGE;
    }
    const char *cmd = argv[optind];
    int sub_argc = argc - optind;
    char **sub_argv = argv + optind;
    if (strcmp(cmd, "run") == 0)
        return cmd_run(url, sub_argc, sub_argv);
    if (strcmp(cmd, "hold") == 0)
        return cmd_hold(url, sub_argc, sub_argv);
    if (strcmp(cmd, "status") == 0)
        return cmd_status(url, sub_argc, sub_argv);
    if (strcmp(cmd, "release") == 0)
        return cmd_release(url, sub_argc, sub_argv);
    if (strcmp(cmd, "list") == 0)
        return cmd_list(url, sub_argc, sub_argv);
    if (strcmp(cmd, "elect") == 0)
        return cmd_elect(url, sub_argc, sub_argv);
    if (strcmp(cmd, "leader") == 0)
        return cmd_leader(url, sub_argc, sub_argv);
    if (strcmp(cmd, "bench") == 0)
        return dlock_cli_bench(url ? url : getenv("DLOCK_URL"), sub_argc, sub_argv);
    if (strcmp(cmd, "help") == 0)
        return cli_help(sub_argc > 1 ? sub_argv[1] : NULL, 0);
    fprintf(stderr, "dlock: unknown command '%s' (commands: run, hold, elect, leader, status, release, list, bench)\n",
            cmd);
    return EXIT_USAGE;
}
