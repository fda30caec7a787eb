/* curl.c -- loads libcurl on first use (etcd.h says why), and makes the
 * descriptors libcurl opens for itself close-on-exec.
 *
 * Our connections are opened close-on-exec by the socket callback
 * (http.c). libcurl 7.88 also opens a socketpair per multi handle -- and
 * per easy handle, whose curl_easy_perform() runs a multi handle inside --
 * to wake itself up, with plain socketpair(): no option reaches it, and an
 * exec'd child would inherit it. So handles are made here: the sockets
 * that appear while one is made are marked close-on-exec. (Another
 * thread's socket opened in that instant would be marked too; nothing
 * else in a handle's making opens a socket.) One handle is made at a
 * time (making_mu): two of our threads making handles at once each saw
 * the other's socketpair appear and marked it while libcurl was still
 * making it (a race ThreadSanitizer reported on the descriptor).
 */
#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "etcd.h"

struct dlock__curl_api dlock__curl;

static void global_init(void)
{
    dlock__curl.global_init(CURL_GLOBAL_DEFAULT);
}

int dlock__curl_load(void)
{
    static const struct dlock__dl_sym syms[] = {
#define SYM(field, name) {(void **)&dlock__curl.field, name}
        SYM(global_init, "curl_global_init"),
        SYM(easy_init, "curl_easy_init"),
        SYM(easy_cleanup, "curl_easy_cleanup"),
        SYM(easy_reset, "curl_easy_reset"),
        SYM(easy_setopt, "curl_easy_setopt"),
        SYM(easy_getinfo, "curl_easy_getinfo"),
        SYM(easy_perform, "curl_easy_perform"),
        SYM(easy_strerror, "curl_easy_strerror"),
        SYM(multi_init, "curl_multi_init"),
        SYM(multi_cleanup, "curl_multi_cleanup"),
        SYM(multi_add_handle, "curl_multi_add_handle"),
        SYM(multi_remove_handle, "curl_multi_remove_handle"),
        SYM(multi_perform, "curl_multi_perform"),
        SYM(multi_poll, "curl_multi_poll"),
        SYM(multi_timeout, "curl_multi_timeout"),
        SYM(multi_wakeup, "curl_multi_wakeup"),
        SYM(multi_info_read, "curl_multi_info_read"),
        SYM(slist_append, "curl_slist_append"),
        SYM(slist_free_all, "curl_slist_free_all"),
#undef SYM
    };
    static struct dlock__dl_lib lib =
        DLOCK__DL_LIB("libcurl.so.4", "the etcd backend", "libcurl4", syms, global_init);
    return dlock__dl_load(&lib);
}

/* ------------------------------------------------- close-on-exec, all of it */

/* The descriptors open now, sorted (caller frees); *N gets how many. */
static int *open_fds(size_t *n)
{
    *n = 0;
    DIR *d = opendir("/proc/self/fd");
    int *v = NULL;
    size_t cap = 0;
    struct dirent *de;
    while (d && (de = readdir(d))) {
        if (de->d_name[0] < '0' || de->d_name[0] > '9' || atoi(de->d_name) == dirfd(d))
            continue; /* (the directory's own descriptor is free again after) */
        if (*n == cap) {
            cap = cap ? cap * 2 : 64;
            int *grown = realloc(v, cap * sizeof *v);
            if (!grown)
                break;
            v = grown;
        }
        v[(*n)++] = atoi(de->d_name);
    }
    if (d)
        closedir(d);
    return v;
}

static bool has_fd(const int *v, size_t n, int fd)
{
    for (size_t i = 0; i < n; i++)
        if (v[i] == fd)
            return true;
    return false;
}

/* Make every socket opened since BEFORE (what open_fds() said) and not
 * close-on-exec close-on-exec. */
static void cloexec_since(const int *before, size_t nbefore)
{
    size_t n = 0;
    int *now = open_fds(&n);
    for (size_t i = 0; i < n; i++) {
        struct stat st;
        int fl;
        if (has_fd(before, nbefore, now[i]) || fstat(now[i], &st) || !S_ISSOCK(st.st_mode) ||
            (fl = fcntl(now[i], F_GETFD)) < 0 || (fl & FD_CLOEXEC))
            continue;
        fcntl(now[i], F_SETFD, fl | FD_CLOEXEC);
    }
    free(now);
}

static pthread_mutex_t making_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t making_atfork_once = PTHREAD_ONCE_INIT;

/* Held across fork(), so a child never starts with it locked by a thread
 * it does not have. */
static void making_lock(void)
{
    pthread_mutex_lock(&making_mu);
}
static void making_unlock(void)
{
    pthread_mutex_unlock(&making_mu);
}
static void making_atfork(void)
{
    pthread_atfork(making_lock, making_unlock, making_unlock);
}

static void making_begin(void)
{
    pthread_once(&making_atfork_once, making_atfork);
    making_lock();
}

CURL *dlock__curl_easy_new(void)
{
    size_t n = 0;
    making_begin();
    int *before = open_fds(&n);
    CURL *e = dlock__curl.easy_init();
    /* A perform without a URL fails at once, after making the handle's
     * own multi handle -- and its wakeup socketpair. */
    if (e)
        dlock__curl.easy_perform(e);
    cloexec_since(before, n);
    making_unlock();
    free(before);
    return e;
}

CURLM *dlock__curl_multi_new(void)
{
    size_t n = 0;
    making_begin();
    int *before = open_fds(&n);
    CURLM *m = dlock__curl.multi_init();
    cloexec_since(before, n);
    making_unlock();
    free(before);
    return m;
}
