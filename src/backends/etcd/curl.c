/* curl.c -- loads libcurl on first use; etcd.h says why. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>

#include "etcd.h"

struct dlock__curl_api dlock__curl;

static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static char load_error[512];

static void load(void)
{
    void *lib = dlopen("libcurl.so.4", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        snprintf(load_error, sizeof load_error, "%s", dlerror());
        return;
    }
    struct {
        void **slot;
        const char *name;
    } syms[] = {
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
    for (size_t i = 0; i < sizeof syms / sizeof *syms; i++)
        if (!(*syms[i].slot = dlsym(lib, syms[i].name))) {
            snprintf(load_error, sizeof load_error, "libcurl.so.4 lacks %s", syms[i].name);
            return;
        }
    dlock__curl.global_init(CURL_GLOBAL_DEFAULT);
}

int dlock__curl_load(void)
{
    pthread_once(&load_once, load);
    if (load_error[0])
        return dlock__err(DLOCK_ENOTBUILT,
                          "the etcd backend needs libcurl at run time: %s (install libcurl4)",
                          load_error);
    return DLOCK_OK;
}
