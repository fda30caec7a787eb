/* no_threads.c -- a preloaded library (LD_PRELOAD) for check_cli that
 * makes every pthread_create() fail with EAGAIN, as it does when a
 * process meets its memory or thread limit (RLIMIT_NPROC, a cgroup's
 * pids.max, no room for a stack).
 *
 * Why a preload and not a limit: RLIMIT_NPROC is not enforced for root
 * (the tests may run as root), and an address-space limit low enough to
 * refuse a thread's stack refuses dlock's own start-up first, at a size
 * that depends on the libraries loaded. A failure on demand lets the test
 * see what `dlock run` does when its signal thread cannot start.
 */
#include <errno.h>
#include <pthread.h>

int pthread_create(pthread_t *thread, const pthread_attr_t *attr, void *(*start)(void *), void *arg)
{
    (void)thread;
    (void)attr;
    (void)start;
    (void)arg;
    return EAGAIN;
}
