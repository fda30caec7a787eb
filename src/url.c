/* url.c -- parses the URLs that choose and configure a backend.
 *
 *   scheme://[user[:password]@]host[:port][,host[:port]...][/path][?k=v&...]
 *
 * One grammar serves every backend: a list of hosts (IPv6 in brackets),
 * an optional path (file directory, redis db, etcd prefix, zk chroot) and
 * query options. User, password, path and option values are
 * percent-decoded. What a backend makes of the parts is its own business;
 * this file only rejects what no backend could mean, with a message that
 * quotes the offending part.
 */
#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"

static int hexval(int ch)
{
    if (ch >= '0' && ch <= '9')
        return ch - '0';
    ch = tolower(ch);
    if (ch >= 'a' && ch <= 'f')
        return ch - 'a' + 10;
    return -1;
}

/* Percent-decode LEN bytes of S into a fresh string; NULL on a bad
 * escape or an escaped NUL. */
static char *decode(const char *s, size_t len)
{
    char *out = malloc(len + 1), *o = out;
    if (!out)
        return NULL;
    for (size_t i = 0; i < len; i++) {
        if (s[i] == '%') {
            if (i + 2 >= len) {
                free(out);
                return NULL;
            }
            int a = hexval((unsigned char)s[i + 1]), b = hexval((unsigned char)s[i + 2]);
            if (a < 0 || b < 0 || (a == 0 && b == 0)) {
                free(out);
                return NULL;
            }
            *o++ = (char)(a * 16 + b);
            i += 2;
        } else {
            *o++ = s[i];
        }
    }
    *o = 0;
    return out;
}

static int bad(const char *text, const char *what)
{
    return dlock__err(DLOCK_EBADURL, "bad URL '%s': %s", text, what);
}

static int parse_host(const char *text, const char *h, size_t len, struct dlock__host *out)
{
    const char *port = NULL;
    if (len && h[0] == '[') {
        const char *close = memchr(h, ']', len);
        if (!close)
            return bad(text, "IPv6 address without closing ']'");
        out->host = strndup(h + 1, (size_t)(close - h - 1));
        if (close + 1 < h + len) {
            if (close[1] != ':')
                return bad(text, "junk after ']' in host");
            port = close + 2;
        }
    } else {
        const char *colon = memchr(h, ':', len);
        out->host = strndup(h, colon ? (size_t)(colon - h) : len);
        if (colon)
            port = colon + 1;
    }
    if (!out->host)
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    if (!*out->host)
        return bad(text, "empty host name");
    for (const char *p = out->host; *p; p++)
        if (!isalnum((unsigned char)*p) && !strchr(".-_:", *p))
            return dlock__err(DLOCK_EBADURL, "bad URL '%s': bad character '%c' in host '%s'", text,
                              *p, out->host);
    out->port = 0;
    if (port) {
        size_t plen = len - (size_t)(port - h);
        if (plen == 0 || plen > 5)
            return dlock__err(DLOCK_EBADURL, "bad URL '%s': bad port '%.*s' (1-65535)", text,
                              (int)plen, port);
        int v = 0;
        for (size_t i = 0; i < plen; i++) {
            if (!isdigit((unsigned char)port[i]))
                return dlock__err(DLOCK_EBADURL, "bad URL '%s': bad port '%.*s' (1-65535)", text,
                                  (int)plen, port);
            v = v * 10 + port[i] - '0';
        }
        if (v < 1 || v > 65535)
            return dlock__err(DLOCK_EBADURL, "bad URL '%s': bad port '%.*s' (1-65535)", text,
                              (int)plen, port);
        out->port = v;
    }
    return DLOCK_OK;
}

static int parse_query(const char *text, const char *q, struct dlock__url *u)
{
    while (*q) {
        size_t len = strcspn(q, "&");
        if (len) {
            if (u->nparams == DLOCK__MAX_PARAMS)
                return bad(text, "too many options");
            const char *eq = memchr(q, '=', len);
            if (!eq || eq == q)
                return dlock__err(DLOCK_EBADURL, "bad URL '%s': option '%.*s' is not key=value",
                                  text, (int)len, q);
            struct dlock__param *p = &u->params[u->nparams++];
            p->key = decode(q, (size_t)(eq - q));
            p->value = decode(eq + 1, len - (size_t)(eq + 1 - q));
            if (!p->key || !p->value)
                return dlock__err(DLOCK_EBADURL, "bad URL '%s': bad %%-escape in option '%.*s'",
                                  text, (int)len, q);
            for (size_t i = 0; i + 1 < u->nparams; i++)
                if (strcmp(u->params[i].key, p->key) == 0)
                    return dlock__err(DLOCK_EBADURL, "bad URL '%s': option '%s' given twice",
                                      text, p->key);
        }
        q += len + (q[len] == '&');
    }
    return DLOCK_OK;
}

/* The URL with the password left out: the ":password" of the userinfo
 * (up to the last '@' before the path, as the parser reads it) and every
 * query option whose decoded key is "password". Error messages quote
 * this, never the text as given. */
static char *redact(const char *text)
{
    size_t len = strlen(text);
    char *r = malloc(len + 1), *o = r;
    if (!r)
        return NULL;
    const char *p = text, *sep = strstr(text, "://");
    if (sep) {
        const char *auth = sep + 3;
        size_t alen = strcspn(auth, "/?");
        const char *at = NULL;
        for (size_t i = 0; i < alen; i++)
            if (auth[i] == '@')
                at = auth + i;
        const char *colon = at ? memchr(auth, ':', (size_t)(at - auth)) : NULL;
        size_t keep = colon ? (size_t)(colon - text) : (size_t)(auth + alen - text);
        memcpy(o, text, keep);
        o += keep;
        p = colon ? at : text + keep;
    }
    const char *q = strchr(p, '?');
    size_t before = q ? (size_t)(q - p) : strlen(p);
    memcpy(o, p, before);
    o += before;
    if (q) {
        char lead = '?';
        for (q++; *q;) {
            size_t seg = strcspn(q, "&");
            size_t klen = strcspn(q, "=&");
            char *key = decode(q, klen);
            bool secret = !key || strcmp(key, "password") == 0;
            free(key);
            if (seg && !secret) {
                *o++ = lead;
                memcpy(o, q, seg);
                o += seg;
                lead = '&';
            }
            q += seg + (q[seg] == '&');
        }
    }
    *o = 0;
    return r;
}

int dlock__url_parse(const char *text, struct dlock__url *u)
{
    memset(u, 0, sizeof *u);
    /* Messages quote the redacted form: a password never reaches a log. */
    u->redacted = redact(text);
    if (!u->redacted)
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    const char *shown = u->redacted; /* for messages; TEXT is parsed */
    const char *sep = strstr(text, "://");
    if (!sep) {
        if (strchr(text, ':'))
            return bad(shown, "expected scheme://... (e.g. file:///run/locks)");
        return bad(shown, "no scheme (e.g. file:///dir, redis://host:6379)");
    }
    if (sep == text)
        return bad(shown, "empty scheme");
    for (const char *p = text; p < sep; p++)
        if (!isalnum((unsigned char)*p) && !strchr("+-.", *p))
            return bad(shown, "bad character in scheme");
    u->scheme = strndup(text, (size_t)(sep - text));
    if (!u->scheme)
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    for (char *p = u->scheme; *p; p++)
        *p = (char)tolower((unsigned char)*p);

    const char *rest = sep + 3;
    const char *query = strchr(rest, '?');
    size_t before_query = query ? (size_t)(query - rest) : strlen(rest);
    const char *slash = memchr(rest, '/', before_query);
    size_t auth_len = slash ? (size_t)(slash - rest) : before_query;

    /* userinfo */
    const char *at = NULL;
    for (size_t i = 0; i < auth_len; i++)
        if (rest[i] == '@')
            at = rest + i;
    const char *hosts = rest;
    if (at) {
        const char *colon = memchr(rest, ':', (size_t)(at - rest));
        u->user = decode(rest, colon ? (size_t)(colon - rest) : (size_t)(at - rest));
        if (colon)
            u->password = decode(colon + 1, (size_t)(at - colon - 1));
        if (!u->user || (colon && !u->password))
            return bad(shown, "bad %-escape in user or password");
        if (!*u->user) {
            free(u->user);
            u->user = NULL;
        }
        hosts = at + 1;
    }

    /* hosts */
    const char *hend = rest + auth_len;
    while (hosts < hend) {
        const char *comma = memchr(hosts, ',', (size_t)(hend - hosts));
        size_t len = comma ? (size_t)(comma - hosts) : (size_t)(hend - hosts);
        if (u->nhosts == DLOCK__MAX_HOSTS)
            return bad(shown, "too many hosts");
        if (len == 0)
            return bad(shown, "empty host in host list");
        int rc = parse_host(shown, hosts, len, &u->hosts[u->nhosts++]);
        if (rc)
            return rc;
        hosts += len + (comma ? 1 : 0);
        if (comma && hosts == hend)
            return bad(shown, "empty host in host list");
    }

    /* path */
    if (slash) {
        size_t plen = before_query - (size_t)(slash - rest);
        u->path = decode(slash, plen);
        if (!u->path)
            return bad(shown, "bad %-escape in path");
    }
    if (query) {
        int rc = parse_query(shown, query + 1, u);
        if (rc)
            return rc;
    }
    return DLOCK_OK;
}

void dlock__url_free(struct dlock__url *u)
{
    free(u->scheme);
    free(u->user);
    free(u->password);
    for (size_t i = 0; i < DLOCK__MAX_HOSTS; i++)
        free(u->hosts[i].host);
    free(u->path);
    for (size_t i = 0; i < u->nparams; i++) {
        free(u->params[i].key);
        free(u->params[i].value);
    }
    free(u->redacted);
    memset(u, 0, sizeof *u);
}

const char *dlock__url_param(struct dlock__url *u, const char *key)
{
    for (size_t i = 0; i < u->nparams; i++)
        if (strcmp(u->params[i].key, key) == 0) {
            u->params[i].used = true;
            return u->params[i].value;
        }
    return NULL;
}
