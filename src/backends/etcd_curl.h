/* etcd_curl.h -- libcurl for the etcd backend, loaded on first use.
 *
 * Linking libcurl pulls some thirty libraries (TLS, Kerberos, LDAP, SSH,
 * HTTP/2...) into every process that links libdlock, and loading them
 * costs ~3.5 ms per process start on the reference machine -- more than
 * `dlock run` on the file backend costs in all. So the etcd backend
 * reaches libcurl through this table, filled by dlopen("libcurl.so.4")
 * when the first etcd client opens; the names below map the ordinary
 * curl_* calls onto it, so the backend's code reads as plain libcurl.
 * Include this instead of <curl/curl.h>.
 */
#ifndef DLOCK_ETCD_CURL_H
#define DLOCK_ETCD_CURL_H

#include <curl/curl.h>

struct dlock__curl_api {
    CURLcode (*global_init)(long flags);
    CURL *(*easy_init)(void);
    void (*easy_cleanup)(CURL *h);
    void (*easy_reset)(CURL *h);
    CURLcode (*easy_setopt)(CURL *h, CURLoption opt, ...);
    CURLcode (*easy_getinfo)(CURL *h, CURLINFO info, ...);
    CURLcode (*easy_perform)(CURL *h);
    const char *(*easy_strerror)(CURLcode code);
    CURLM *(*multi_init)(void);
    CURLMcode (*multi_cleanup)(CURLM *m);
    CURLMcode (*multi_add_handle)(CURLM *m, CURL *h);
    CURLMcode (*multi_remove_handle)(CURLM *m, CURL *h);
    CURLMcode (*multi_perform)(CURLM *m, int *running);
    CURLMcode (*multi_poll)(CURLM *m, struct curl_waitfd *extra, unsigned n, int timeout_ms,
                            int *numfds);
    CURLMcode (*multi_timeout)(CURLM *m, long *timeout_ms);
    CURLMcode (*multi_wakeup)(CURLM *m);
    CURLMsg *(*multi_info_read)(CURLM *m, int *msgs_in_queue);
    struct curl_slist *(*slist_append)(struct curl_slist *list, const char *s);
    void (*slist_free_all)(struct curl_slist *list);
};

extern struct dlock__curl_api dlock__curl;

/* Load libcurl once (thread-safe) and call curl_global_init. DLOCK_OK, or
 * DLOCK_ENOTBUILT with a message naming the library and the package. */
int dlock__curl_load(void);

#undef curl_easy_setopt
#undef curl_easy_getinfo
#define curl_global_init dlock__curl.global_init
#define curl_easy_init dlock__curl.easy_init
#define curl_easy_cleanup dlock__curl.easy_cleanup
#define curl_easy_reset dlock__curl.easy_reset
#define curl_easy_setopt dlock__curl.easy_setopt
#define curl_easy_getinfo dlock__curl.easy_getinfo
#define curl_easy_perform dlock__curl.easy_perform
#define curl_easy_strerror dlock__curl.easy_strerror
#define curl_multi_init dlock__curl.multi_init
#define curl_multi_cleanup dlock__curl.multi_cleanup
#define curl_multi_add_handle dlock__curl.multi_add_handle
#define curl_multi_remove_handle dlock__curl.multi_remove_handle
#define curl_multi_perform dlock__curl.multi_perform
#define curl_multi_poll dlock__curl.multi_poll
#define curl_multi_timeout dlock__curl.multi_timeout
#define curl_multi_wakeup dlock__curl.multi_wakeup
#define curl_multi_info_read dlock__curl.multi_info_read
#define curl_slist_append dlock__curl.slist_append
#define curl_slist_free_all dlock__curl.slist_free_all

#endif
