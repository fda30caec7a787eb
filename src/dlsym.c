/* dlsym.c -- loads a backend's client library on first use, with dlopen().
 *
 * Linking a library into libdlock makes every process that links libdlock
 * load it at start-up, used or not: libcurl's thirty dependencies for etcd,
 * libssl and libcrypto for rediss:// (docs/benchmarks.md: each costs more
 * than `dlock run` on the file backend). So the backends that need one
 * fill a table of function pointers through this file when their first
 * client opens, and say plainly which library is missing when it is.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>

#include "toolbox.h"

static pthread_mutex_t load_lock = PTHREAD_MUTEX_INITIALIZER;

/* fork() while another thread loads a library would leave the child's
 * copy of load_lock locked for good: it is held across fork (a load in
 * progress finishes first), then released on both sides. */
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;
static void lock_for_fork(void)
{
    pthread_mutex_lock(&load_lock);
}
static void unlock_after_fork(void)
{
    pthread_mutex_unlock(&load_lock);
}
static void register_atfork(void)
{
    pthread_atfork(lock_for_fork, unlock_after_fork, unlock_after_fork);
}

static void load(struct dlock__dl_lib *lib)
{
    void *h = dlopen(lib->soname, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(lib->error, sizeof lib->error, "%s", dlerror());
        return;
    }
    for (size_t i = 0; i < lib->nsyms; i++)
        if (!(*lib->syms[i].slot = dlsym(h, lib->syms[i].name))) {
            snprintf(lib->error, sizeof lib->error, "%s lacks %s", lib->soname, lib->syms[i].name);
            return; /* (the handle stays open: the slots filled so far point into it) */
        }
    if (lib->init)
        lib->init();
}

int dlock__dl_load(struct dlock__dl_lib *lib)
{
    pthread_once(&atfork_once, register_atfork);
    pthread_mutex_lock(&load_lock);
    if (!lib->tried) {
        lib->tried = true;
        load(lib);
    }
    pthread_mutex_unlock(&load_lock);
    if (lib->error[0])
        return dlock__err(DLOCK_ENOTBUILT, "%s needs %s at run time: %s (install %s)", lib->user,
                          lib->soname, lib->error, lib->package);
    return DLOCK_OK;
}
