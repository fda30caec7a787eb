/* help.c -- the text of `dlock --help` and `dlock help COMMAND`.
 *
 * docs/dlock.1 says the same in man form; tests/check_cli.c checks that
 * every option named here is documented there and the other way round,
 * so the two cannot drift apart.
 */
#include <stdio.h>
#include <string.h>

#include "bench.h"
#include "cli.h"

static const struct {
    const char *name, *usage, *text;
} commands[] = {
    {"run",
     "dlock [-u URL] run [-n | -w SECONDS] [-E CODE] [-s] [--lease SECONDS]\n"
     "                  [--on-lost term|kill|ignore] [--kill-after SECONDS]\n"
     "                  [--lost-grace SECONDS] [--on-contended term|ignore]\n"
     "                  [--strict-release] [--permits N] [--min-hold SECONDS]\n"
     "                  [-o | --no-wait-children] [--value] [--put KEY=VALUE]... [-v]\n"
     "                  NAME [--] COMMAND [ARG...]\n"
     "dlock [-u URL] run [options] NAME -c 'SHELL COMMAND'\n"
     "dlock [-u URL] run [options] -m NAME... -- COMMAND [ARG...]   (or -c)",
     "Hold lock NAME while COMMAND runs, then release it.\n"
     "  -n, --nonblock        fail at once if NAME is held (exit CODE)\n"
     "  -w, --wait, --timeout SECONDS  give up after SECONDS (2, 2.5, .5; 0 = -n),\n"
     "                        connecting included\n"
     "  -E, --conflict-exit-code CODE  exit code when busy or timed out (default 1);\n"
     "                        busy or timed out is silent unless -v, as with flock(1)\n"
     "  -s, --shared          shared mode: many holders, no exclusive one\n"
     "  -x, -e, --exclusive   exclusive mode (the default)\n"
     "  -o, --close           as flock(1): release and return when COMMAND exits,\n"
     "                        leaving what it started alone, without the lock\n"
     "  --no-wait-children    return when COMMAND exits, leaving what it started\n"
     "                        alone, as flock(1) without -o: on the file backend and\n"
     "                        for a path it keeps the lock's descriptor and the lock\n"
     "                        (elsewhere the lock is released, as with -o)\n"
     "  -F, --no-fork         refused: dlock must stay above COMMAND to renew the lock\n"
     "                        and stop the job when it is lost\n"
     "  --lease SECONDS       lease on backends with leases, renewed while COMMAND runs\n"
     "                        (at least 1, as the URL's lease=, which it overrides)\n"
     "  --on-lost ACTION      when the lock is lost: term (SIGTERM, then SIGKILL\n"
     "                        after --kill-after; the default), kill, or ignore\n"
     "  --kill-after SECONDS  grace between SIGTERM and SIGKILL (default 10), cut to\n"
     "                        half the --lost-grace when renewals fail\n"
     "  --lost-grace SECONDS  when renewals fail, act on --on-lost once only SECONDS\n"
     "                        of the lease are left (default a sixth of the lease),\n"
     "                        so COMMAND is stopped before the lease can pass on\n"
     "  --on-contended ACTION when another owner starts waiting for NAME: term sends\n"
     "                        COMMAND's job SIGTERM once and holds NAME until the job\n"
     "                        ends (a leader stepping down); ignore (the default).\n"
     "                        One exclusive NAME; file, redis, etcd, zk (others: 69)\n"
     "  -c, --command CMD     run CMD with $SHELL -c (/bin/sh when unset), as flock(1)\n"
     "  --min-hold SECONDS    keep the lock at least SECONDS after it was taken, even\n"
     "                        when COMMAND ends sooner (SIGTERM ends it early): copies\n"
     "                        of a short job that other hosts start a little later find\n"
     "                        it busy -- once per period, not just one at a time\n"
     "  --strict-release      a failed release fails the run (default: reported on\n"
     "                        stderr, COMMAND's status kept)\n"
     "  --permits N           take one of N permits of the semaphore NAME instead of\n"
     "                        the lock: at most N commands at once (file, redis,\n"
     "                        etcd, zk)\n"
     "  --value               hand COMMAND the lock's value (DLOCK_VALUE, its writer's\n"
     "                        DLOCK_VALUE_TOKEN, 0 for none) and a file holding it\n"
     "                        (DLOCK_VALUE_FILE); what the file holds when COMMAND\n"
     "                        ends, if changed, becomes the value before the release\n"
     "                        (at most 4096 bytes; file, redis, etcd, zk; not with -m)\n"
     "  --put KEY=VALUE       once COMMAND exits 0, put VALUE as KEY of NAME's store,\n"
     "                        guarded by the hold: a lock lost by then writes nothing\n"
     "                        (exit 75); read it with dlock get (redis, etcd, zk; up\n"
     "                        to 16; not with -m, -s, --permits)\n"
     "  -m, --multi           take every NAME up to -- (or -c) all or nothing: a set\n"
     "                        of locks (at most 64), taken in one order (bytewise\n"
     "                        sorted) so that sets overlapping in any order never\n"
     "                        deadlock; -n, -w, -s, --lease and --on-lost act on the\n"
     "                        set: busy if any member is, lost if any member is\n"
     "  -v, --verbose         report, with times, who holds NAME when the wait starts,\n"
     "                        the acquisition (token, time waited) and the release,\n"
     "                        a loss, the lock at risk (renewals failing, only the\n"
     "                        --lost-grace left), another owner waiting for it\n"
     "                        (where the backend can tell), renewal trouble,\n"
     "                        reconnects; -vv: every renewal\n"
     "NAME starting with /, ./ or ../ (file backend or no URL) is a file locked with\n"
     "flock(2), as flock(1) locks it: the two exclude each other; no lease, no token.\n"
     "COMMAND sees DLOCK_NAME, DLOCK_TOKEN (the fencing token) and DLOCK_URL; on etcd\n"
     "also ETCD_LOCK_KEY and ETCD_LOCK_REV, as etcdctl lock sets them. With -m:\n"
     "DLOCK_COUNT, DLOCK_NAME_i and DLOCK_TOKEN_i (i = 1.. in the order given),\n"
     "DLOCK_TOKENS (the tokens, space-separated, same order); DLOCK_NAME and\n"
     "DLOCK_TOKEN are the first NAME's; no ETCD_LOCK_KEY.\n"
     "COMMAND runs in a process group of its own; signals and --on-lost reach every\n"
     "process it started, the lock is held until the last of them exits, and if dlock\n"
     "is killed they are all killed (file backend: they keep the lock until then).\n"
     "Exit status: COMMAND's; 128+N if it died of signal N; CODE when busy or\n"
     "timed out; 75 if the lock was lost (or at risk) while it ran; 130/143 if interrupted\n"
     "while waiting."},
    {"hold",
     "dlock [-u URL] hold [-n | -w SECONDS] [-E CODE] [-s] [--lease SECONDS] [--pid PID]\n"
     "                   [-v] NAME",
     "Take lock NAME and hold it until standard input ends or a signal comes\n"
     "(SIGTERM, SIGINT, SIGHUP), as etcdctl lock without a command does.\n"
     "Prints one line once held: token=N mode=MODE [key=KEY (etcd)] name=NAME.\n"
     "  --pid PID             hold for process PID (a script: --pid $$): until it\n"
     "                        exits or closes its end of the pipe hold prints to,\n"
     "                        not stdin's end; a loss sends --on-lost's signal\n"
     "                        (SIGTERM by default) to PID's process group when PID\n"
     "                        leads one, else to PID; so does --on-contended term\n"
     "                        (SIGTERM) when another owner starts waiting\n"
     "The other options are run's (dlock help run). In a script:\n"
     "  exec {lock}< <(exec dlock hold --pid $$ -w 60 deploy)\n"
     "  read -r held <&\"$lock\" || { wait $!; exit; }   # busy, timed out, failed\n"
     "  ./step1; ./step2                  # a loss stops the script (SIGTERM)\n"
     "  exec {lock}<&-; wait $!           # release now (exiting does too)\n"
     "Exit status: 0 once released; CODE when busy or timed out; 75 if the lock\n"
     "was lost while held."},
    {"elect",
     "dlock [-u URL] elect [--value VALUE] [run's options] NAME [[--] COMMAND [ARG...]]",
     "Campaign in election NAME with VALUE (default empty) and run COMMAND once\n"
     "elected, only while leading: one active instance across hosts. A leader that\n"
     "dies or stops renewing is replaced (file: at once; others: when its lease or\n"
     "session ends). Without COMMAND (etcdctl elect NAME VALUE): once leading, print\n"
     "token=T name=NAME value=VALUE and lead until stdin ends or a signal comes, as\n"
     "hold holds a lock (--pid PID too); 75 if leadership is lost.\n"
     "  --value VALUE         the leader's value others read with dlock leader (its\n"
     "                        address, say); etcd: the proposal etcdctl elect -l shows\n"
     "run's options apply (-n, -w, --lease, --on-lost, --kill-after, ...; not -s\n"
     "nor --permits). COMMAND sees DLOCK_NAME and DLOCK_TOKEN (the leadership's\n"
     "fencing token). Elections: file, redis, etcd (Go's concurrency.Election,\n"
     "shared with etcdctl elect), zk (Curator's LeaderLatch) and redlock (over a\n"
     "majority). Exit\n"
     "status as run's; 75 if leadership was lost."},
    {"leader", "dlock [-u URL] leader NAME [--watch] [--json]",
     "Print election NAME's leader: token=T id=ID value=VALUE, or none.\n"
     "  --watch               then one more line at each change (new leader, no\n"
     "                        leader, a new value) until SIGINT, SIGTERM or SIGHUP\n"
     "  --json                one JSON object per line: name, leader (true/false),\n"
     "                        token, version, id, value\n"
     "Exit status: 0 when someone leads, 1 when nobody does (--watch: 0 at a signal)."},
    {"status", "dlock [-u URL] status [--permits N] NAME [--json]",
     "Show whether NAME is held, in which mode, by whom, with which token,\n"
     "the remaining lease and the waiters where the backend knows them, and the\n"
     "lock's value when it has one.\n"
     "  --permits N           NAME is a semaphore of N permits (0: its stored count):\n"
     "                        its permit holders and free permits\n"
     "  --json                one JSON object on stdout\n"
     "Exit status: 0 when NAME is held, 1 when it is free."},
    {"check", "dlock [-u URL] check NAME TOKEN",
     "Whether TOKEN (a holder's DLOCK_TOKEN) is still the newest hold on NAME\n"
     "and that hold alive: a service given a token refuses a stale holder.\n"
     "Prints \"current\", or \"stale: \" and why. Alive means: file, the holder's\n"
     "process lives; redis, etcd, its lease has not ended; zk, its session.\n"
     "Exit status: 0 when current, 1 when stale or NAME is free."},
    {"value", "dlock [-u URL] value NAME",
     "Print lock NAME's value as it is, without a newline: what its holders wrote\n"
     "with run --value (or dlock_value_set), the last one's; anyone may read it.\n"
     "Exit status: 0 when printed, 1 when NAME has no value."},
    {"get", "dlock [-u URL] get NAME KEY",
     "Print key KEY of lock NAME's store as it is, without a newline: what its\n"
     "holders put with run --put KEY=VALUE (or dlock_guarded_put), only while\n"
     "they held NAME; anyone may read it.\n"
     "Exit status: 0 when printed, 1 when there is no such key."},
    {"release", "dlock [-u URL] release --force NAME",
     "Operator's tool: free NAME whoever holds it (backends with leases).\n"
     "  --force               required: says you mean it"},
    {"list", "dlock [-u URL] list [PATTERN] [--json]",
     "List the names held now that match the glob PATTERN (all by default).\n"
     "  --json                a JSON array of status objects on stdout"},
    {"bench", "dlock [-u URL] bench [MODE] [OPTIONS]", NULL /* from cli/bench.c */},
};

static const char *general =
    "dlock -- run commands under a distributed lock.\n"
    "\n"
    "Global options (before the command):\n"
    "  -u, --url URL         backend URL; default $DLOCK_URL, else the configuration\n"
    "                        file's ($DLOCK_CONFIG, ~/.config/dlock/dlock.conf or\n"
    "                        /etc/dlock/dlock.conf: url = ..., option = ... lines),\n"
    "                        else the file backend in /run/lock/dlock-UID (or\n"
    "                        /var/tmp/dlock-UID where /run/lock is not open to you),\n"
    "                        whatever the session\n"
    "  -v, --verbose         say which URL is used and whence; the library's events\n"
    "  -h, --help            this text\n"
    "  -V, --version         print the version and the backends built\n"
    "\n"
    "URLs: file:///DIR  redis://[USER[:PASS]@]HOST[:PORT][/DB]  redis+unix:///SOCKET\n"
    "      redis+sentinel://S1:PORT[,...]/MASTER  redis+cluster://H1:PORT[,H2:PORT...]\n"
    "      redlock://H1:PORT,H2:PORT,H3:PORT[,...]\n"
    "      etcd://HOST:PORT[,HOST:PORT...][/PREFIX]  zk://HOST:PORT[,...][/CHROOT]\n"
    "\n"
    "Environment: DLOCK_URL; DLOCK_CONFIG; DLOCK_REDIS_PASSWORD, DLOCK_ETCD_PASSWORD,\n"
    "             DLOCK_REDIS_SENTINEL_PASSWORD (keep passwords off the command line;\n"
    "             not passed on to COMMAND), each also as ..._FILE naming a file of\n"
    "             mode 600 (or ?password_file=FILE in the URL); DLOCK_ZK_LOG\n"
    "             (ZooKeeper client log file).\n"
    "\n"
    "Exit codes: 1 busy (run, hold), free (status), stale (check) or no value\n"
    "            (value), 64 usage (also an empty or over-long NAME), 65 NAME\n"
    "            holds something that is not a lock, or a value too long,\n"
    "            69 backend unavailable, 70 internal error, 75 lock lost,\n"
    "            77 permission or authentication, 78 bad URL or configuration,\n"
    "            126/127 COMMAND not executable / not found.\n";

/* TEXT with every line indented by two spaces. */
static void print_indented(FILE *out, const char *text)
{
    for (const char *line = text; *line;) {
        size_t len = strcspn(line, "\n");
        fprintf(out, "  %.*s\n", (int)len, line);
        line += len + (line[len] == '\n');
    }
}

int cli_help(const char *command, int to_stderr)
{
    FILE *out = to_stderr ? stderr : stdout;
    for (size_t i = 0; i < sizeof commands / sizeof *commands; i++)
        if (command && strcmp(command, commands[i].name) == 0) {
            if (commands[i].text)
                fprintf(out, "Usage: %s\n\n%s\n", commands[i].usage, commands[i].text);
            else
                fputs(dlock_cli_bench_usage(), out);
            return 0;
        }
    if (command) {
        fprintf(stderr, "dlock: no command '%s' (commands: run, hold, elect, leader, status, check, value, release, list, bench)\n",
                command);
        return EXIT_USAGE;
    }
    fputs("Usage:\n", out);
    for (size_t i = 0; i < sizeof commands / sizeof *commands; i++)
        print_indented(out, commands[i].usage);
    fputs("  dlock --version | --help | help COMMAND\n\n", out);
    fputs(general, out);
    for (size_t i = 0; i < sizeof commands / sizeof *commands; i++)
        if (commands[i].text)
            fprintf(out, "\n%s: %s\n", commands[i].name, commands[i].text);
    fprintf(out, "\nbench: %s", dlock_cli_bench_usage());
    return 0;
}

void cli_print_usage_line(const char *command)
{
    fprintf(stderr, "try 'dlock help %s'\n", command);
}
