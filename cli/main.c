/* main.c -- the dlock command: global options, dispatch, and the small
 * commands (status, check, value, release, list). `run` lives in run.c. Every failure
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
#include "internal.h" /* the library's URL parser: a file URL's options */

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
bool cli_reports_losses;

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
    if (level == DLOCK_LOG_ERROR && cli_reports_losses)
        return; /* the loss: said by run, hold or elect */
    char when[32];
    cli_time_of_day(when, sizeof when);
    fprintf(stderr, "%s dlock: %s: %s\n", when, level_names[level <= DLOCK_LOG_DEBUG ? level : 0],
            msg);
}

/* The first of the options the file backend has no use for that the
 * file URL U sets, or NULL. The library takes them on every backend, so
 * that a program's one option string opens any URL (its contract tests
 * do); a URL an operator writes for the file backend with a lease= or a
 * timeout= believes in a lease or a server that is not there. */
static const char *file_unused_option(const char *u)
{
    static const char *const unused[] = {"lease", "timeout", "connect_timeout"};
    struct dlock__url parsed;
    const char *found = NULL;
    if (!u || dlock__url_parse(u, &parsed) != DLOCK_OK)
        return NULL; /* the library has said what is wrong */
    for (size_t i = 0; i < sizeof unused / sizeof *unused && !found; i++)
        if (dlock__url_param(&parsed, unused[i]))
            found = unused[i];
    dlock__url_free(&parsed);
    return found;
}

int cli_client_new(const char *url, int64_t lease_ms, dlock_client **out)
{
    struct cli_url from;
    *out = NULL;
    int code = cli_choose_url(url, false, &from);
    if (code)
        return code;
    dlock_client *c;
    int rc = dlock_client_new(from.url, &c);
    if (rc)
        return cli_fail(rc, from.from_config ? from.from : NULL);
    /* The library leaves a URL as it was given but for its secrets: one it
     * changed holds a password. */
    bool secret = from.url && strcmp(dlock_client_url(c), from.url) != 0;
    if (secret && from.from_config) {
        fprintf(stderr, "dlock: %s: holds a password, which every user it serves can read: keep "
                        "it in a file of its own (mode 600) named by password_file = FILE\n",
                from.from);
        dlock_client_close(c);
        return EXIT_CONFIG;
    }
    const char *unused = strcmp(dlock_client_backend(c), "file") == 0
                             ? file_unused_option(from.url)
                             : NULL;
    if (unused) {
        fprintf(stderr, "dlock: bad URL '%s' (from %s): option '%s' is not used by the file "
                        "backend (no lease: a lock lasts until its holder releases it or exits; no "
                        "server to time out)\n",
                dlock_client_url(c), from.from, unused);
        dlock_client_close(c);
        return EXIT_CONFIG;
    }
    if (secret && from.from_argv)
        fprintf(stderr, "dlock: warning: the -u URL holds a password, which every user can read "
                        "in ps: give it with password_file=FILE (in the URL or a configuration "
                        "file) or a DLOCK_*_PASSWORD_FILE variable\n");
    if (cli_verbosity) {
        char when[32];
        cli_time_of_day(when, sizeof when);
        fprintf(stderr, "%s dlock: info: URL %s (from %s)\n", when, dlock_client_url(c),
                from.from);
    }
    if (lease_ms > 0)
        rc = dlock_client_setopt_int(c, DLOCK_OPT_LEASE_MS, lease_ms);
    if (!rc && cli_verbosity)
        rc = dlock_client_set_log(c, log_to_stderr, NULL,
                                  cli_verbosity > 1 ? DLOCK_LOG_DEBUG : DLOCK_LOG_INFO);
    if (rc) {
        code = cli_fail(rc, NULL);
        dlock_client_close(c);
        return code;
    }
    *out = c;
    return 0;
}

int cli_open(const char *url, int64_t lease_ms, dlock_client **out)
{
    dlock_client *c = NULL;
    int code = cli_client_new(url, lease_ms, &c);
    if (code)
        return code;
    int rc = dlock_client_connect(c);
    if (rc) {
        code = cli_fail(rc, NULL);
        dlock_client_close(c);
        *out = NULL;
        return code;
    }
    *out = c;
    return 0;
}

/* ------------------------------------------------------------- JSON */

/* The JSON shape of status and list (docs/dlock.1, JSON OUTPUT) is the
 * same on every backend: the backends' holder strings ("pid@host",
 * Redisson's "<uuid>:<thread>", etcd keys ".../<lease>", ZooKeeper nodes
 * with their "dlock pid@host" data) are parsed here into owner, host, pid
 * and thread, null where the backend does not store them. */

/* Length of the valid UTF-8 sequence at S (2-4), 1 for ASCII, 0 when the
 * bytes there are not one (overlong, surrogate, past U+10FFFF, cut). */
static size_t utf8_seq(const unsigned char *s)
{
    unsigned c = s[0], cp, min;
    size_t n;
    if (c < 0x80)
        return 1;
    if ((c & 0xe0) == 0xc0)
        n = 2, min = 0x80, cp = c & 0x1f;
    else if ((c & 0xf0) == 0xe0)
        n = 3, min = 0x800, cp = c & 0x0f;
    else if ((c & 0xf8) == 0xf0)
        n = 4, min = 0x10000, cp = c & 0x07;
    else
        return 0;
    for (size_t k = 1; k < n; k++) {
        if ((s[k] & 0xc0) != 0x80) /* the NUL too */
            return 0;
        cp = cp << 6 | (s[k] & 0x3f);
    }
    return cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff) ? 0 : n;
}

/* Write S with valid UTF-8 sequences as they are and each other byte
 * through PUT_BYTE (n 0: not part of valid UTF-8, 1: ASCII); with
 * C1_BYTES, a C1 control (U+0080..U+009F: CSI is one) goes through
 * PUT_BYTE too, byte by byte (n 0). */
static void put_text(const char *s, void (*put_byte)(unsigned ch, size_t n), bool c1_bytes)
{
    const unsigned char *p = (const unsigned char *)s;
    while (*p) {
        size_t n = utf8_seq(p);
        if (c1_bytes && n == 2 && p[0] == 0xc2 && p[1] < 0xa0) {
            put_byte(p[0], 0);
            put_byte(p[1], 0);
        } else if (n > 1)
            fwrite(p, 1, n, stdout);
        else
            put_byte(*p, n);
        p += n ? n : 1;
    }
}

static void json_byte(unsigned ch, size_t n)
{
    if (ch == '"' || ch == '\\')
        printf("\\%c", ch);
    else if (n == 0 || ch < 0x20 || ch == 0x7f)
        printf("\\u%04x", ch);
    else
        putchar((int)ch);
}

/* S as a JSON string: valid UTF-8 as it is, control characters and each
 * byte that is not part of valid UTF-8 as \u00XX (names are bytes: the
 * exact ones are in name_hex). */
static void json_string(const char *s)
{
    putchar('"');
    put_text(s, json_byte, false);
    putchar('"');
}

static void json_string_or_null(const char *s)
{
    if (s)
        json_string(s);
    else
        printf("null");
}

/* ,"KEY":V, or null for V < 0. */
static void json_int_or_null(const char *key, long long v)
{
    if (v < 0)
        printf(",\"%s\":null", key);
    else
        printf(",\"%s\":%lld", key, v);
}

/* "name":...,"name_hex":...: the name as text and its exact bytes. */
static void json_name(const char *name)
{
    printf("\"name\":");
    json_string(name);
    printf(",\"name_hex\":\"");
    for (const char *p = name; *p; p++)
        printf("%02x", (unsigned char)*p);
    putchar('"');
}

/* What a holder string tells: OWNER (the file backend's "pid@host", a
 * Redisson client's UUID, an etcd lease id, a ZooKeeper node), HOST and
 * PID where stored (-1 unknown), a Redisson THREAD id (-1 none). */
struct holder_fields {
    char *owner, *host;
    long pid;
    long long thread;
};

/* "<pid>@<host>[#slot]" in the LEN bytes at S: *PID and *HOST (malloc'd). */
static bool parse_pid_at_host(const char *s, size_t len, long *pid, char **host)
{
    size_t d = 0;
    while (d < len && s[d] >= '0' && s[d] <= '9')
        d++;
    if (!d || d > 9 || d + 1 >= len || s[d] != '@')
        return false;
    const char *h = s + d + 1, *slot = memchr(h, '#', len - d - 1);
    size_t hl = slot ? (size_t)(slot - h) : len - d - 1;
    if (!hl || !(*host = strndup(h, hl)))
        return false;
    *pid = strtol(s, NULL, 10);
    return true;
}

static void holder_parse(const char *id, struct holder_fields *f)
{
    *f = (struct holder_fields){NULL, NULL, -1, -1};
    size_t len = strlen(id), head = len;
    /* etcd and zk: "<key or node> (<data>)", data "dlock [shared ]pid@host" */
    const char *open = NULL;
    for (const char *p = id; (p = strstr(p, " (")); p++)
        open = p;
    if (open && open > id && id[len - 1] == ')') {
        head = (size_t)(open - id);
        const char *d = open + 2;
        size_t dl = len - head - 3;
        static const char *const marks[] = {"dlock shared ", "dlock "};
        for (size_t k = 0; k < 2; k++)
            if (dl >= strlen(marks[k]) && strncmp(d, marks[k], strlen(marks[k])) == 0) {
                d += strlen(marks[k]), dl -= strlen(marks[k]);
                break;
            }
        parse_pid_at_host(d, dl, &f->pid, &f->host);
    }
    char *host;
    long pid;
    const char *colon = memchr(id, ':', head), *slash = memrchr(id, '/', head);
    if (parse_pid_at_host(id, head, &pid, &host)) { /* file: "pid@host[#slot]" */
        free(f->host);
        f->host = host, f->pid = pid;
        f->owner = strndup(id, strcspn(id, "#"));
    } else if (colon && colon - id == 36) { /* Redisson: "<uuid>:<thread>[:...]" */
        f->owner = strndup(id, 36);
        f->thread = strtoll(colon + 1, NULL, 10);
    } else { /* etcd: the key's last part, its lease; zk: the node */
        const char *o = slash ? slash + 1 : id;
        f->owner = strndup(o, (size_t)(id + head - o));
    }
}

/* One holder: {"id","owner","host","pid","thread","count"}. COUNT 0 is
 * unknown (null). */
static void json_holder(const char *id, unsigned count)
{
    struct holder_fields f;
    holder_parse(id, &f);
    printf("{\"id\":");
    json_string(id);
    printf(",\"owner\":");
    json_string_or_null(f.owner);
    printf(",\"host\":");
    json_string_or_null(f.host);
    json_int_or_null("pid", f.pid);
    json_int_or_null("thread", f.thread);
    json_int_or_null("count", count ? (long long)count : -1);
    putchar('}');
    free(f.owner);
    free(f.host);
}

static void terminal_byte(unsigned ch, size_t n)
{
    if (n == 0 || ch < 0x20 || ch == 0x7f || ch == '\\')
        printf("\\x%02x", ch);
    else
        putchar((int)ch);
}

void cli_print_text(const char *s)
{
    put_text(s, terminal_byte, true);
}

/* Options after the command: -u URL and --json. Returns the index of the
 * first operand, or -1 after printing a usage error. */
struct sub_opts {
    const char *url;
    int json, force;
    unsigned permits; /* status --permits N: a semaphore of N permits (0 = stored) */
    bool semaphore;
};

/* --json may also follow the operand, any number of times: the count of
 * arguments left once the trailing ones from FIRST on are taken off. */
static int trailing_json(int first, int argc, char **argv, struct sub_opts *o)
{
    while (argc > first && strcmp(argv[argc - 1], "--json") == 0)
        o->json = 1, argc--;
    return argc;
}

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
        putchar('{');
        json_name(path);
        printf(",\"backend\":\"flock\",\"key\":");
        json_string(path);
        printf(",\"held\":%s,\"mode\":%s%s%s,\"token\":null,\"ttl_ms\":null,\"delay_ms\":0,"
               "\"holders\":[",
               held ? "true" : "false", held ? "\"" : "", held ? mode : "null", held ? "\"" : "");
        char *save, *tok, *copy = strdup(holders);
        for (tok = copy ? strtok_r(copy, " ", &save) : NULL; tok; tok = strtok_r(NULL, " ", &save))
            printf("%s{\"id\":\"pid %s\",\"owner\":\"%s\",\"host\":null,\"pid\":%s,"
                   "\"thread\":null,\"count\":null}",
                   tok == copy ? "" : ",", tok, tok, tok);
        free(copy);
        printf("],\"waiters\":null,\"waiter_count\":%ld}\n", waiters);
    } else {
        printf("name:     ");
        cli_print_text(path);
        printf("\nbackend:  flock(2) on the file itself\nstate:    %s%s%s\n",
               held ? "held (" : "free", held ? mode : "", held ? ")" : "");
        if (held)
            printf("holders:  pid %s\n", holders);
        printf("waiters:  %ld\n", waiters);
    }
    return held ? 0 : EXIT_FREE;
}

/* One lock as JSON, without its closing brace (status adds "master"):
 * name, name_hex, backend, kind, key, held, mode, token, ttl_ms, holders,
 * [permits, free_permits,] waiters, waiter_count. */
static void json_lock(const char *name, const char *backend, const dlock_info *info,
                      bool semaphore)
{
    int held = dlock_info_held(info);
    int64_t ttl = dlock_info_ttl_ms(info);
    long nw = dlock_info_waiter_count(info);
    putchar('{');
    json_name(name);
    printf(",\"backend\":");
    json_string(backend);
    printf(",\"kind\":\"%s\",\"key\":", semaphore ? "semaphore" : "lock");
    json_string(dlock_info_key(info));
    printf(",\"held\":%s,\"mode\":", held ? "true" : "false");
    if (held && !semaphore) /* a permit has no mode */
        json_string(dlock_info_mode(info) == DLOCK_SHARED ? "shared" : "exclusive");
    else
        printf("null");
    json_int_or_null("token", dlock_info_token(info) ? (long long)dlock_info_token(info) : -1);
    json_int_or_null("ttl_ms", ttl == DLOCK_VALID_FOREVER ? -1 : ttl);
    printf(",\"delay_ms\":%lld", (long long)dlock_info_delay_ms(info)); /* 0: none */
    printf(",\"holders\":[");
    for (size_t k = 0; k < dlock_info_holder_count(info); k++) {
        unsigned count;
        const char *who = dlock_info_holder(info, k, &count);
        printf(k ? "," : "");
        json_holder(who, count);
    }
    printf("]");
    if (semaphore) { /* 0 permits, -1 free: not stored (zk), unknown: null */
        unsigned permits = dlock_info_permits(info);
        json_int_or_null("permits", permits ? (long long)permits : -1);
        json_int_or_null("free_permits", dlock_info_free_permits(info));
    }
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
    json_int_or_null("waiter_count", nw);
}

/* status's "permits:" line: the count and the free permits, each
 * "unknown" where the backend cannot tell (zk stores no count: 0 permits,
 * -1 free). */
static void print_permit_count(const dlock_info *info)
{
    printf("permits:  ");
    if (dlock_info_permits(info))
        printf("%u, ", dlock_info_permits(info));
    else
        printf("unknown (count not stored), ");
    long free_now = dlock_info_free_permits(info);
    if (free_now >= 0)
        printf("%ld free\n", free_now);
    else
        printf("free unknown\n");
}

/* status's "delay:" line, for a name in its lock-delay (a hold ended
 * without a clean release): how long is left, as the backend times it,
 * and until when by this host's clock. */
static void print_delay(const dlock_info *info)
{
    int64_t left = dlock_info_delay_ms(info);
    if (left <= 0)
        return;
    time_t until = time(NULL) + (time_t)((left + 999) / 1000);
    struct tm tm;
    char when[32] = "";
    if (localtime_r(&until, &tm))
        strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S", &tm);
    printf("delay:    %" PRId64 " ms left, until %s (lock-delay: the last hold ended without "
           "a clean release)\n", left, when);
}

/* status: lock NAME's value, if the backend keeps values and NAME has
 * one: a line of text, or (JSON) ,"value":...,"value_token":... (null
 * both without one). */
static void print_value(dlock_client *c, const char *name, int json)
{
    char buf[DLOCK_VALUE_MAX + 1];
    size_t len = DLOCK_VALUE_MAX;
    uint64_t token = 0;
    if (dlock_value_get(c, name, buf, &len, &token))
        token = 0; /* no value to show: a backend without values, a failure */
    buf[len] = 0;
    bool text = memchr(buf, 0, len) == NULL;
    if (json) {
        printf(",\"value\":");
        json_string_or_null(token && text ? buf : NULL);
        json_int_or_null("value_token", token ? (long long)token : -1);
    } else if (token) {
        printf("value:    ");
        if (text)
            cli_print_text(buf);
        else
            printf("(%zu bytes, not text)", len);
        printf(" (written by token %" PRIu64 ")\n", token);
    }
}

int cmd_status(const char *url, int argc, char **argv)
{
    struct sub_opts o = {url, 0, 0, 0, false};
    int i = sub_parse("status", argc, argv, &o, false);
    if (i < 0)
        return EXIT_USAGE;
    argc = trailing_json(i + 1, argc, argv, &o);
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
    char master[300]; /* redis+sentinel://: the master now ("" elsewhere) */
    dlock_client_master(c, master, sizeof master);
    if (o.json) {
        json_lock(name, dlock_client_backend(c), info, o.semaphore);
        if (!o.semaphore)
            print_value(c, name, 1);
        printf(",\"master\":");
        json_string_or_null(*master ? master : NULL);
        printf("}\n");
    } else {
        printf("name:     ");
        cli_print_text(name);
        printf("\nbackend:  %s\n", dlock_client_backend(c));
        if (*master) {
            printf("master:   ");
            cli_print_text(master);
            putchar('\n');
        }
        printf("key:      ");
        cli_print_text(dlock_info_key(info));
        putchar('\n');
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
            printf("holder:   "); /* the server's words, like names */
            cli_print_text(who);
            if (count)
                printf(" (%s %u)", o.semaphore ? "permits" : "hold count", count);
            putchar('\n');
        }
        if (o.semaphore)
            print_permit_count(info);
        if (dlock_info_token(info)) /* 0: none kept (never issued; etcd, zk: free) */
            printf("token:    %" PRIu64 "%s\n", dlock_info_token(info),
                   held ? "" : " (last issued)");
        if (ttl == DLOCK_VALID_FOREVER)
            printf("ttl:      none (held until released or its process exits)\n");
        else if (ttl >= 0)
            printf("ttl:      %" PRId64 " ms\n", ttl);
        print_delay(info);
        if (!o.semaphore)
            print_value(c, name, 0);
        if (nw < 0)
            printf("waiters:  unknown to this backend\n");
        else {
            printf("waiters:  %ld\n", nw);
            for (long k = 0; k < nw; k++) {
                printf("  %ld. ", k + 1);
                cli_print_text(dlock_info_waiter(info, (size_t)k));
                putchar('\n');
            }
        }
    }
    dlock_info_free(info);
    dlock_client_close(c);
    return held ? 0 : EXIT_FREE;
}

/* value NAME, get NAME KEY (CMD says which): lock NAME's value, or key
 * KEY of its store (dlock_guarded_get), on stdout as it is (no newline
 * added): exit 0, or 1 and nothing when there is none; errors as every
 * command's. */
static int print_stored(const char *cmd, const char *url, int argc, char **argv)
{
    bool get = strcmp(cmd, "get") == 0;
    struct sub_opts o = {url, 0, 0, 0, false};
    int i = sub_parse(cmd, argc, argv, &o, false);
    if (i < 0)
        return EXIT_USAGE;
    if (i + (get ? 2 : 1) != argc || o.json) {
        fprintf(stderr, "dlock %s: %s\n", cmd,
                o.json ? "--json is not an option here"
                : get  ? "expected a NAME and a KEY"
                       : "expected exactly one NAME");
        cli_print_usage_line(cmd);
        return EXIT_USAGE;
    }
    const char *name = argv[i];
    int code = cli_check_name(cmd, name);
    if (code)
        return code;
    if (cli_is_path(o.url, name)) {
        fprintf(stderr, "dlock %s: %s is a file locked with flock(2), which has no %s\n", cmd,
                name, get ? "store" : "value");
        return EXIT_UNAVAILABLE;
    }
    dlock_client *c;
    if ((code = cli_open(o.url, 0, &c)))
        return code;
    char *buf = malloc(DLOCK_GUARDED_MAX);
    dlock_guarded_read r = {.name = name, .key = get ? argv[i + 1] : NULL, .buf = buf,
                            .size = get ? DLOCK_GUARDED_MAX : DLOCK_VALUE_MAX};
    int rc = !buf    ? DLOCK_ENOMEM
             : get ? dlock_guarded_get(c, &r)
                   : dlock_value_get(c, name, buf, &r.size, &r.token);
    r.len = get ? r.len : r.size;
    if (rc)
        code = cli_fail(rc, cmd);
    else if (!r.token)
        code = EXIT_NOVALUE;
    else if (fwrite(buf, 1, r.len, stdout) != r.len || fflush(stdout))
        code = EXIT_SOFTWARE;
    free(buf);
    dlock_client_close(c);
    return code;
}

int cmd_value(const char *url, int argc, char **argv)
{
    return print_stored("value", url, argc, argv);
}

int cmd_get(const char *url, int argc, char **argv)
{
    return print_stored("get", url, argc, argv);
}

/* check NAME TOKEN: whether TOKEN (decimal, as DLOCK_TOKEN and status
 * print it) is still the newest hold on NAME and that hold alive
 * (dlock_check): exit 0 and "current", or 1 and "stale: why"; errors as
 * every command's. */
int cmd_check(const char *url, int argc, char **argv)
{
    struct sub_opts o = {url, 0, 0, 0, false};
    int i = sub_parse("check", argc, argv, &o, false);
    if (i < 0)
        return EXIT_USAGE;
    if (i + 2 != argc || o.json) {
        fprintf(stderr, "dlock check: %s\n",
                o.json ? "--json is not an option of check" : "expected NAME and TOKEN");
        cli_print_usage_line("check");
        return EXIT_USAGE;
    }
    const char *name = argv[i], *text = argv[i + 1];
    int code = cli_check_name("check", name);
    if (code)
        return code;
    char *end;
    errno = 0;
    unsigned long long token = strtoull(text, &end, 10);
    if (!*text || *end || errno || strspn(text, "0123456789") != strlen(text)) {
        fprintf(stderr, "dlock check: TOKEN '%s' is not a decimal number below 2^64\n", text);
        cli_print_usage_line("check");
        return EXIT_USAGE;
    }
    if (cli_is_path(o.url, name)) {
        fprintf(stderr, "dlock check: %s is a file locked with flock(2), which has no token\n",
                name);
        return EXIT_UNAVAILABLE;
    }
    dlock_client *c;
    code = cli_open(o.url, 0, &c);
    if (code)
        return code;
    int rc = dlock_check(c, name, (uint64_t)token);
    if (rc == DLOCK_OK)
        printf("current\n");
    else if (rc == DLOCK_ELOST)
        printf("stale: %s\n", dlock_errmsg());
    code = rc == DLOCK_OK ? 0 : rc == DLOCK_ELOST ? EXIT_STALE : cli_fail(rc, "check");
    dlock_client_close(c);
    return code;
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

/* list: the names the backend knows that match, collected first (a
 * backend's walk may hold a connection), then each inspected: only the
 * names held now are shown, so that list means the same on every backend
 * (file and ZooKeeper keep the files and nodes of released locks). */
struct name_list {
    char **v;
    size_t n, cap;
};

static int collect_name(const char *name, void *arg)
{
    struct name_list *l = arg;
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 64;
        char **v = realloc(l->v, cap * sizeof *v);
        if (!v)
            return 1;
        l->v = v, l->cap = cap;
    }
    return !(l->v[l->n] = strdup(name)) ? 1 : (l->n++, 0);
}

/* " (semaphore: H holders, F of N permits free)" for semaphore INFO; a
 * layout that stores no count (zk) tells the permits held instead. */
static void print_permits(const dlock_info *info)
{
    size_t nh = dlock_info_holder_count(info);
    printf(" (semaphore: %zu holder%s, ", nh, nh == 1 ? "" : "s");
    if (dlock_info_permits(info)) {
        printf("%ld of %u permits free)", dlock_info_free_permits(info), dlock_info_permits(info));
        return;
    }
    unsigned held = 0;
    for (size_t k = 0; k < nh; k++) {
        unsigned count = 0;
        dlock_info_holder(info, k, &count);
        held += count;
    }
    printf("%u permit%s held, count not stored)", held, held == 1 ? "" : "s");
}

int cmd_list(const char *url, int argc, char **argv)
{
    struct sub_opts o = {url, 0, 0, 0, false};
    int i = sub_parse("list", argc, argv, &o, false);
    if (i < 0)
        return EXIT_USAGE;
    argc = trailing_json(i, argc, argv, &o);
    if (argc - i > 1) {
        fprintf(stderr, "dlock list: expected at most one PATTERN\n");
        cli_print_usage_line("list");
        return EXIT_USAGE;
    }
    dlock_client *c;
    int code = cli_open(o.url, 0, &c);
    if (code)
        return code;
    /* locks, then semaphores (none where the backend has none or cannot
     * enumerate them) */
    const char *pattern = i < argc ? argv[i] : NULL;
    struct name_list names[2] = {{NULL, 0, 0}, {NULL, 0, 0}};
    int rc = dlock_list(c, pattern, collect_name, &names[0]);
    int src = rc ? DLOCK_OK : dlock_semaphore_list(c, pattern, collect_name, &names[1]);
    if (src != DLOCK_ENOTSUP)
        rc = src;
    if (o.json)
        printf("[");
    size_t shown = 0;
    for (int sem = 0; sem < 2; sem++) {
        for (size_t k = 0; k < names[sem].n && !rc; k++) {
            const char *name = names[sem].v[k];
            dlock_info *info;
            rc = sem ? dlock_semaphore_inspect(c, name, 0, &info) : dlock_inspect(c, name, &info);
            if (sem && (rc == DLOCK_EWRONGTYPE || rc == DLOCK_EINVAL))
                rc = DLOCK_OK; /* a name whose keys are not a semaphore's: not one */
            if (!rc && dlock_info_held(info)) {
                if (o.json) {
                    printf(shown ? "," : "");
                    json_lock(name, dlock_client_backend(c), info, sem);
                    putchar('}');
                } else {
                    cli_print_text(name);
                    if (sem)
                        print_permits(info);
                    putchar('\n');
                }
                shown++;
            }
            dlock_info_free(info);
        }
        for (size_t k = 0; k < names[sem].n; k++)
            free(names[sem].v[k]);
        free(names[sem].v);
    }
    if (o.json)
        printf("]\n");
    code = rc ? cli_fail(rc, "list") : 0;
    dlock_client_close(c);
    return code;
}

/* "dlock 0.1.0 (backends: file redis etcd zk postgres)": the backends are asked of
 * the library linked (a scheme it was built without is DLOCK_ENOTBUILT at
 * dlock_client_new(), which dials nothing), not of the CLI's own build. */
static int print_version(void)
{
    static const char *const probes[][2] = {
        {"file", "file:///"}, {"redis", "redis://127.0.0.1"}, {"etcd", "etcd://127.0.0.1"},
        {"zk", "zk://127.0.0.1"}, {"postgres", "postgres://127.0.0.1"}};
    printf("dlock %s (backends:", dlock_version());
    for (size_t i = 0; i < sizeof probes / sizeof *probes; i++) {
        dlock_client *c = NULL;
        if (dlock_client_new(probes[i][1], &c) != DLOCK_ENOTBUILT)
            printf(" %s", probes[i][0]);
        dlock_client_close(c);
    }
    printf(")\n");
    return 0;
}

int main(int argc, char **argv)
{
    static const struct option longs[] = {{"url", required_argument, NULL, 'u'},
                                          {"help", no_argument, NULL, 'h'},
                                          {"version", no_argument, NULL, 'V'},
                                          {"verbose", no_argument, NULL, 'v'},
                                          {0, 0, 0, 0}};
    const char *url = NULL;
    cli_job_note_args(argc, argv); /* the guardian renames itself there */
    int ch;
    opterr = 0;
    while ((ch = getopt_long(argc, argv, "+u:hVv", longs, NULL)) != -1) {
        switch (ch) {
        case 'u':
            url = optarg;
            break;
        case 'v': /* every command: the URL used and whence, the library's events */
            cli_verbosity++;
            break;
        case 'h':
            return cli_help(NULL, 0);
        case 'V':
            return print_version();
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
    static const struct {
        const char *name;
        int (*run)(const char *url, int argc, char **argv);
    } commands[] = {
        {"run", cmd_run},         {"hold", cmd_hold},   {"status", cmd_status},
        {"release", cmd_release}, {"list", cmd_list},   {"elect", cmd_elect},
        {"leader", cmd_leader},   {"check", cmd_check}, {"value", cmd_value},
        {"get", cmd_get},
    };
    for (size_t i = 0; i < sizeof commands / sizeof *commands; i++)
        if (strcmp(cmd, commands[i].name) == 0)
            return commands[i].run(url, sub_argc, sub_argv);
    if (strcmp(cmd, "bench") == 0)
        return dlock_cli_bench(url ? url : getenv("DLOCK_URL"), sub_argc, sub_argv);
    if (strcmp(cmd, "help") == 0)
        return cli_help(sub_argc > 1 ? sub_argv[1] : NULL, 0);
    fprintf(stderr, "dlock: unknown command '%s' (commands: run, hold, elect, leader, status, check, value, release, list, bench)\n",
            cmd);
    return EXIT_USAGE;
}
