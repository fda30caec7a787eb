/* hostile_http.c -- an HTTP proxy in front of etcd whose replies a test
 * rewrites (see hostile_http.h for why). Each request of a client goes to
 * etcd as HTTP/1.0 on a connection of its own, so etcd answers with the
 * whole body and closes (no chunks to decode); the client gets it back,
 * rewritten or not, as HTTP/1.1 with its length, on its kept-alive
 * connection. A watch's stream comes back a message (line) at a time,
 * each through the rewrite, as chunks.
 */
#include "hostile_http.h"

#include <check.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include "testutil.h"

#define POLL_MS 100

struct conn {
    struct tu_hostile_http *h;
    int fd;
};

/* Read from FD into *BUF (*LEN used, grown as needed) once; false at EOF,
 * on an error or when the proxy stops. */
static bool read_some(struct tu_hostile_http *h, int fd, char **buf, size_t *len, size_t *cap)
{
    for (;;) {
        if (atomic_load(&h->stop))
            return false;
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, POLL_MS) == 0)
            continue;
        if (*cap - *len < 65536) {
            *cap = *cap * 2 + 65536;
            *buf = realloc(*buf, *cap + 1);
            ck_assert_ptr_nonnull(*buf);
        }
        ssize_t n = recv(fd, *buf + *len, *cap - *len, 0);
        if (n <= 0)
            return false;
        *len += (size_t)n;
        (*buf)[*len] = 0;
        return true;
    }
}

/* The value of header NAME in the header block HDRS (NULL if none). */
static const char *header(const char *hdrs, const char *name)
{
    size_t n = strlen(name);
    for (const char *l = strstr(hdrs, "\r\n"); l; l = strstr(l + 2, "\r\n"))
        if (strncasecmp(l + 2, name, n) == 0 && l[2 + n] == ':')
            return l + 3 + n + strspn(l + 3 + n, " ");
    return NULL;
}

/* Send etcd a request on a connection of its own: METHOD and PATH, HDRS'
 * auth token, BODY, as HTTP/1.0. The connection, or -1. */
static int send_etcd(struct tu_hostile_http *h, const char *method, const char *path,
                     const char *hdrs, const char *body, size_t body_len)
{
    int fd = tu_dial_loopback(h->target);
    if (fd < 0)
        return -1;
    const char *auth = header(hdrs, "Authorization");
    char *head =
        tu_fmt("%s %s HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
               "%s%.*s%sContent-Length: %zu\r\n\r\n",
               method, path, auth ? "Authorization: " : "", auth ? (int)strcspn(auth, "\r") : 0,
               auth ? auth : "", auth ? "\r\n" : "", body_len);
    bool ok = tu_send_all(fd, head, strlen(head)) && tu_send_all(fd, body, body_len);
    free(head);
    if (!ok) {
        close(fd);
        return -1;
    }
    return fd;
}

/* Ask etcd: REQ's method and path, HDRS' auth token, BODY; the reply's
 * status and body into *STATUS and *REPLY (malloc'd). False when etcd
 * could not be asked. */
static bool ask_etcd(struct tu_hostile_http *h, const char *method, const char *path,
                     const char *hdrs, const char *body, size_t body_len, int *status, char **reply)
{
    int fd = send_etcd(h, method, path, hdrs, body, body_len);
    if (fd < 0)
        return false;
    bool ok = true;
    char *buf = NULL;
    size_t len = 0, cap = 0;
    while (ok && read_some(h, fd, &buf, &len, &cap))
        ;
    close(fd);
    char *end = buf ? strstr(buf, "\r\n\r\n") : NULL;
    if (!ok || !end || sscanf(buf, "HTTP/%*s %d", status) != 1) {
        free(buf);
        return false;
    }
    *reply = strdup(end + 4);
    free(buf);
    return true;
}

/* Send the client on FD one chunk: LINE and its newline. */
static bool send_line(int fd, const char *line, size_t len)
{
    char *head = tu_fmt("%zx\r\n", len + 1);
    bool ok = tu_send_all(fd, head, strlen(head)) && tu_send_all(fd, line, len) &&
              tu_send_all(fd, "\n\r\n", 3);
    free(head);
    return ok;
}

/* A watch: its request (HDRS, BODY) to etcd, etcd's stream back to the
 * client on FD one message (line) at a time, each through the rewrite
 * (path "/v3/watch", REQUEST the watch's body), as chunks, until either
 * side closes. */
static void relay_watch(struct tu_hostile_http *h, int fd, const char *hdrs, const char *body,
                        size_t body_len)
{
    int up = send_etcd(h, "POST", "/v3/watch", hdrs, body, body_len);
    char *buf = NULL, *end = NULL;
    size_t len = 0, cap = 0;
    int status = 0;
    while (up >= 0 && !(end = buf ? strstr(buf, "\r\n\r\n") : NULL))
        if (!read_some(h, up, &buf, &len, &cap))
            break;
    if (!end || sscanf(buf, "HTTP/%*s %d", &status) != 1)
        goto done;
    char *head = tu_fmt("HTTP/1.1 %d X\r\nContent-Type: application/json\r\n"
                        "Transfer-Encoding: chunked\r\n\r\n",
                        status);
    bool ok = tu_send_all(fd, head, strlen(head));
    free(head);
    len -= (size_t)(end + 4 - buf);
    memmove(buf, end + 4, len + 1);
    while (ok && !atomic_load(&h->stop)) {
        char *nl;
        while (ok && (nl = memchr(buf, '\n', len))) {
            *nl = 0;
            pthread_mutex_lock(&h->mu);
            char *instead = h->rewrite(h->arg, "/v3/watch", body, &status, buf);
            pthread_mutex_unlock(&h->mu);
            if (instead)
                atomic_fetch_add(&h->rewritten, 1);
            ok = send_line(fd, instead ? instead : buf, strlen(instead ? instead : buf));
            free(instead);
            len -= (size_t)(nl + 1 - buf);
            memmove(buf, nl + 1, len + 1);
        }
        struct pollfd p[2] = {{.fd = fd, .events = POLLIN}, {.fd = up, .events = POLLIN}};
        if (!ok || poll(p, 2, POLL_MS) < 0)
            break;
        char scrap[256];
        if ((p[0].revents & (POLLIN | POLLHUP | POLLERR)) && recv(fd, scrap, sizeof scrap, 0) <= 0)
            break; /* the client stopped watching */
        if ((p[1].revents & (POLLIN | POLLHUP | POLLERR)) && !read_some(h, up, &buf, &len, &cap)) {
            tu_send_all(fd, "0\r\n\r\n", 5); /* etcd ended the stream */
            break;
        }
    }
done:
    free(buf);
    if (up >= 0)
        close(up);
}

/* Serve one client connection's requests, one after the other. */
static void *serve(void *arg)
{
    struct conn *c = arg;
    struct tu_hostile_http *h = c->h;
    char *buf = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        char *end;
        while (!(end = buf ? strstr(buf, "\r\n\r\n") : NULL))
            if (!read_some(h, c->fd, &buf, &len, &cap))
                goto done;
        char method[16], path[256];
        if (sscanf(buf, "%15s %255s", method, path) != 2)
            goto done;
        size_t hdr_len = (size_t)(end + 4 - buf);
        char *hdrs = strndup(buf, hdr_len);
        const char *cl = header(hdrs, "Content-Length"), *expect = header(hdrs, "Expect");
        size_t body_len = cl ? strtoul(cl, NULL, 10) : 0;
        if (expect && strncasecmp(expect, "100-continue", 12) == 0 &&
            !tu_send_all(c->fd, "HTTP/1.1 100 Continue\r\n\r\n", 25)) {
            free(hdrs);
            goto done;
        }
        while (len < hdr_len + body_len)
            if (!read_some(h, c->fd, &buf, &len, &cap)) {
                free(hdrs);
                goto done;
            }
        char *body = strndup(buf + hdr_len, body_len);
        memmove(buf, buf + hdr_len + body_len, len - hdr_len - body_len + 1);
        len -= hdr_len + body_len;
        if (strcmp(path, "/v3/watch") == 0) { /* a stream, to its end */
            relay_watch(h, c->fd, hdrs, body, body_len);
            free(hdrs);
            free(body);
            goto done;
        }
        int status = 0;
        char *reply = NULL;
        bool asked = ask_etcd(h, method, path, hdrs, body, body_len, &status, &reply);
        free(hdrs);
        if (!asked) {
            free(body);
            goto done;
        }
        pthread_mutex_lock(&h->mu);
        char *instead = h->rewrite(h->arg, path, body, &status, reply);
        pthread_mutex_unlock(&h->mu);
        free(body);
        if (instead) {
            atomic_fetch_add(&h->rewritten, 1);
            free(reply);
            reply = instead;
        }
        char *head = tu_fmt("HTTP/1.1 %d X\r\nContent-Type: application/json\r\n"
                            "Content-Length: %zu\r\n\r\n",
                            status, strlen(reply));
        bool sent =
            tu_send_all(c->fd, head, strlen(head)) && tu_send_all(c->fd, reply, strlen(reply));
        free(head);
        free(reply);
        if (!sent)
            goto done;
    }
done:
    free(buf);
    close(c->fd);
    free(c);
    return NULL;
}

static void *accept_loop(void *arg)
{
    struct tu_hostile_http *h = arg;
    while (!atomic_load(&h->stop)) {
        struct pollfd p = {.fd = h->listen_fd, .events = POLLIN};
        if (poll(&p, 1, POLL_MS) <= 0)
            continue;
        int fd = accept4(h->listen_fd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0)
            continue;
        struct conn *c = malloc(sizeof *c);
        ck_assert_ptr_nonnull(c);
        *c = (struct conn){h, fd};
        pthread_t t;
        ck_assert_int_eq(pthread_create(&t, NULL, serve, c), 0);
        pthread_detach(t);
    }
    return NULL;
}

void tu_hostile_http_start(struct tu_hostile_http *h, int target, tu_http_rewrite_fn rewrite,
                           void *arg)
{
    *h = (struct tu_hostile_http){.target = target, .rewrite = rewrite, .arg = arg};
    pthread_mutex_init(&h->mu, NULL);
    h->listen_fd = tu_listen_loopback(&h->port, 64);
    ck_assert_int_eq(pthread_create(&h->thread, NULL, accept_loop, h), 0);
}

void tu_hostile_http_stop(struct tu_hostile_http *h)
{
    atomic_store(&h->stop, 1);
    pthread_join(h->thread, NULL);
    close(h->listen_fd);
}
