/* chaos.c -- `make chaos`: the fault harness by hand, for the long
 * schedules whose numbers docs/safety.md publishes.
 *
 *   build/tests/chaos/chaos [-s SEED] [-d SECONDS] [-l LEASE_MS] [-D LOCK_DELAY_MS]
 *                           [-w WORKERS] [-f FAULT,...] [-j FILE.json] [-v] BACKEND...
 *
 * BACKEND: file, redis (layout=redisson), redis-simple, redis-fair,
 * redis-sem (a semaphore of one permit a name, Redisson's layout, through
 * lock handles; no repeated token is part of what it must keep), sentinel
 * (redis+sentinel://: a master, two replicas, three sentinels),
 * sentinel-sync (the same with ?sync=1), sentinel-sync2 (?sync=2: both
 * replicas), redlock (three masters; a server restart is one of them),
 * etcd, etcd3 (a 3-member cluster, with leader kills; -f leader-partition
 * puts each member in a namespace of its own and cuts the leader off),
 * zk, zk3, postgres, mysql (one server each; a server restart is kill -9
 * of every process of it, started again on its data). Each
 * backend runs for
 * SECONDS split among its phases (-f: only those faults, e.g.
 * -f none,partition); the table goes to stdout, one JSON
 * object per backend to FILE. Exit 1 when a backend broke what the CI
 * short run asserts (chaos_safe), 2 when a run could not be made. Needs
 * root (network namespaces). -D: every worker's URL gets ?lock_delay=,
 * to compare the overlaps of the workers that do not fence with and
 * without a lock-delay (docs/safety.md).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "chaos.h"

int main(int argc, char **argv)
{
    struct chaos_config cfg = {.seed = 1, .duration_s = 60, .log = stderr};
    const char *json = NULL;
    int opt;
    while ((opt = getopt(argc, argv, "s:d:l:D:w:f:j:v")) != -1) {
        switch (opt) {
        case 's': cfg.seed = strtoull(optarg, NULL, 0); break;
        case 'd': cfg.duration_s = atoi(optarg); break;
        case 'l': cfg.lease_ms = atoi(optarg); break;
        case 'D': cfg.lock_delay_ms = atoi(optarg); break;
        case 'w': cfg.workers = atoi(optarg); break;
        case 'f': cfg.only = optarg; break;
        case 'j': json = optarg; break;
        case 'v': cfg.verbose = true; break;
        default:
            fprintf(stderr,
                    "usage: %s [-s SEED] [-d SECONDS] [-l LEASE_MS] [-D LOCK_DELAY_MS] "
                    "[-w WORKERS] [-f FAULT,...] [-j FILE.json] [-v] BACKEND...\n",
                    argv[0]);
            return 2;
        }
    }
    if (optind == argc) {
        fprintf(
            stderr,
            "%s: name the backends (file file-election redis redis-simple redis-fair "
            "redis-sem sentinel sentinel-sync sentinel-sync2 redlock etcd etcd3 zk zk3 postgres "
            "mysql)\n",
            argv[0]);
        return 2;
    }
    FILE *jf = json ? fopen(json, "w") : NULL;
    if (json && !jf) {
        perror(json);
        return 2;
    }
    int status = 0;
    for (int i = optind; i < argc; i++) {
        struct chaos_result res;
        cfg.backend = argv[i];
        /* each backend in a child: the harness moves into a network
         * namespace of its own, and the next backend wants a fresh one */
        fflush(NULL);
        int p[2];
        if (pipe(p) != 0)
            return 2;
        pid_t pid = fork();
        if (pid == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL); /* and its servers and workers with it */
            if (getppid() == 1)
                _exit(2);
            close(p[0]);
            chaos_run(&cfg, &res);
            (void)!write(p[1], &res, sizeof res);
            _exit(0);
        }
        close(p[1]);
        ssize_t got = read(p[0], &res, sizeof res);
        close(p[0]);
        waitpid(pid, NULL, 0);
        if (got != (ssize_t)sizeof res) {
            fprintf(stderr, "chaos %s: the run died\n", cfg.backend);
            status = 2;
            continue;
        }
        chaos_print_table(stdout, &res);
        if (jf)
            chaos_print_json(jf, &res);
        char why[256];
        if (!chaos_safe(&res, why, sizeof why)) {
            printf("UNSAFE %s seed %llu: %s\n", res.backend, (unsigned long long)res.seed, why);
            if (status == 0)
                status = res.error[0] ? 2 : 1;
        }
        printf("\n");
        fflush(stdout);
    }
    if (jf)
        fclose(jf);
    return status;
}
