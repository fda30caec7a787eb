/* url.c -- parses the URLs that choose and configure a backend.
 *
 *   scheme://[user[:password]@]host[:port][,host[:port]...][/path][?k=v&...]
 *
 * One grammar serves every backend: a list of hosts (IPv6 in brackets),
 * an optional path (file directory, redis db, etcd prefix, zk chroot) and
 * query options. User, password, path and option values are
 * percent-decoded. What a backend makes of the parts is its own business;
 * this file only rejects what no backend could mean, with a message that
 * quotes the offending part -- never the password.
 *
 * Where the userinfo ends. RFC 3986 ends the authority at the first '/'
 * or '?', so a password holding either (common in base64) must be
 * percent-encoded there. Operators write them raw all the same
 * (redis://admin:hun/ter2@host, etcd://root:pa?ss@host), and reading those
 * the RFC way puts the password into the host, path or query -- and from
 * there into error messages. So find_userinfo() reads it this way:
 *  1. an '@' before the first '/' or '?': the RFC reading, the userinfo
 *     ends at the last such '@';
 *  2. otherwise, when the text before the first '/' or '?' has the shape
 *     user:password (a ':' there) and an '@' follows that is not part of a
 *     known query option's value (?user=me@corp stays an option), the
 *     last such '@' ends the userinfo if the RFC reading cannot be right:
 *     its authority is not a host list ("admin:hun": no port), or the '@'
 *     sits in its query (an option that no backend knows);
 *  3. when the RFC authority is a valid host list and the '@' sits in its
 *     path (redis://admin:12/ter2@host, or zk://h:2181/chroot@x) both
 *     readings are possible: the URL is refused as ambiguous (write a '/'
 *     in a password as %2F, an '@' in a path as %40).
 * The redacted form (messages, dlock_client_url()) is made from the same
 * reading, so no message ever quotes what lies between "//" and that '@'.
 *
 * What else is a secret: url_value_secret() is the one list redact()
 * reads -- an option whose key names one, and any option no backend
 * knows (a misspelled ?Password= or passw0rd= is a password all the
 * same). No message of this file quotes an option's value either.
 */
#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

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
            if (!eq || eq == q) /* not quoted: it may be a password pasted there */
                return dlock__err(DLOCK_EBADURL, "bad URL '%s': option %zu is not key=value", text,
                                  u->nparams + 1);
            struct dlock__param *p = &u->params[u->nparams++];
            p->key = decode(q, (size_t)(eq - q));
            p->value = decode(eq + 1, len - (size_t)(eq + 1 - q));
            if (!p->key || !p->value)
                return dlock__err(DLOCK_EBADURL, "bad URL '%s': bad %%-escape in option '%.*s'",
                                  text, (int)(eq - q), q);
            for (size_t i = 0; i + 1 < u->nparams; i++)
                if (strcmp(u->params[i].key, p->key) == 0)
                    return dlock__err(DLOCK_EBADURL, "bad URL '%s': option '%s' given twice", text,
                                      p->key);
        }
        q += len + (q[len] == '&');
    }
    return DLOCK_OK;
}

/* A host list as parse_host() accepts it: name[:port] or [v6][:port],
 * comma-separated, ports of 1 to 5 digits. */
static bool host_list_valid(const char *s, size_t n)
{
    if (!n)
        return false;
    while (n) {
        size_t len = 0;
        while (len < n && s[len] != ',')
            len++;
        size_t i = 0;
        if (len && s[0] == '[') {
            while (i < len && s[i] != ']')
                i++;
            if (i == len || i == 1)
                return false;
            i++;
        } else {
            while (i < len && (isalnum((unsigned char)s[i]) || strchr(".-_", s[i])))
                i++;
            if (i == 0)
                return false;
        }
        if (i < len) {
            size_t digits = len - i - 1;
            if (s[i] != ':' || digits < 1 || digits > 5)
                return false;
            for (i++; i < len; i++)
                if (!isdigit((unsigned char)s[i]))
                    return false;
        }
        if (len == n)
            break;
        s += len + 1;
        n -= len + 1;
        if (!n)
            return false;
    }
    return true;
}

/* Whether the '@' at REST[AT] is inside a query option "key=value" whose
 * key the core or SCHEME's backend knows (?user=me@corp.com), reading the
 * query as starting at REST[Q]. */
static bool in_known_option(const char *scheme, const char *rest, size_t q, size_t at)
{
    size_t seg = at;
    while (seg > q + 1 && rest[seg - 1] != '&' && rest[seg - 1] != '?')
        seg--;
    const char *eq = memchr(rest + seg, '=', at - seg);
    if (!eq || eq == rest + seg)
        return false;
    char *key = decode(rest + seg, (size_t)(eq - (rest + seg)));
    bool known = key && dlock__option_known(scheme, key);
    free(key);
    return known;
}

struct userinfo {
    bool found;
    size_t len;     /* bytes of REST before the '@' ending it */
    size_t colon;   /* index of the ':' before the password; len = none */
    bool ambiguous; /* rule 3 of the file comment: refuse */
};

/* Where the userinfo of REST (the text after "://") ends: the rules at the
 * top of this file. SCHEME (lower case) tells which options are known. */
static struct userinfo find_userinfo(const char *scheme, const char *rest)
{
    struct userinfo ui = {false, 0, 0, false};
    size_t std_end = strcspn(rest, "/?"), at = SIZE_MAX;
    for (size_t i = 0; i < std_end; i++)
        if (rest[i] == '@')
            at = i;
    if (at == SIZE_MAX) {
        const char *colon = memchr(rest, ':', std_end);
        if (!colon)
            return ui;
        size_t q = std_end + strcspn(rest + std_end, "?");
        for (size_t i = strlen(rest); i-- > std_end;)
            if (rest[i] == '@' && !(i > q && in_known_option(scheme, rest, q, i))) {
                at = i;
                break;
            }
        if (at == SIZE_MAX)
            return ui;
        if (host_list_valid(rest, std_end) && at < q)
            ui.ambiguous = true;
    }
    ui.found = true;
    ui.len = at;
    const char *colon = memchr(rest, ':', at);
    ui.colon = colon ? (size_t)(colon - rest) : at;
    return ui;
}

/* The words that make an option's key name a secret, in any case:
 * password=, sentinel_password= and whatever is added later (an
 * auth_token=, a client_secret=). */
static const char *const secret_words[] = {"pass", "pwd", "secret", "token", "cred", "auth"};

/* Whether the value of option KEY (decoded) of a SCHEME URL (lower case)
 * must never be shown: its key names a secret, or no backend knows it.
 * A known option that names a file (password_file=, tls_key=) is shown:
 * the path is not the secret, and COMMAND's DLOCK_URL keeps working. */
static bool url_value_secret(const char *scheme, const char *key)
{
    if (!dlock__option_known(scheme, key))
        return true;
    size_t len = strlen(key);
    if (len > 5 && strcmp(key + len - 5, "_file") == 0)
        return false;
    for (size_t i = 0; i < sizeof secret_words / sizeof *secret_words; i++)
        if (strcasestr(key, secret_words[i]))
            return true;
    return false;
}

/* The URL with its secrets left out: the ":password" of the userinfo
 * (found as the parser finds it) and every query option whose value
 * url_value_secret() hides; the rest is kept byte for byte, so a URL
 * without a secret comes back unchanged. Error messages quote this,
 * never the text as given. A text without "://" that holds an '@' shows only what precedes
 * its first ':' (it cannot be parsed, so where a password ends is
 * unknown); one without "://" shows no option. */
static char *redact(const char *text)
{
    size_t len = strlen(text);
    char *r = malloc(len + sizeof ":..."), *o = r;
    if (!r)
        return NULL;
    const char *p = text, *sep = strstr(text, "://");
    if (!sep && strchr(text, '@')) {
        size_t keep = strcspn(text, ":");
        memcpy(o, text, keep);
        strcpy(o + keep, ":...");
        return r;
    }
    char *scheme = strndup(text, sep ? (size_t)(sep - text) : 0);
    if (!scheme) {
        free(r);
        return NULL;
    }
    for (char *c = scheme; *c; c++)
        *c = (char)tolower((unsigned char)*c);
    if (sep) {
        const char *rest = sep + 3;
        struct userinfo ui = find_userinfo(scheme, rest);
        size_t keep = (size_t)(rest - text) + (ui.found ? ui.colon : 0);
        memcpy(o, text, keep);
        o += keep;
        p = ui.found ? rest + ui.len : text + keep;
    }
    size_t host_part = strcspn(p, "/?");
    const char *q = strchr(p + host_part, '?');
    size_t before = q ? (size_t)(q - p) : strlen(p);
    memcpy(o, p, before);
    o += before;
    if (q) { /* every '&'-separated piece, empty ones too: a URL without
              * a secret comes back as it was given */
        char lead = '?';
        for (q++;; q++) {
            size_t seg = strcspn(q, "&");
            bool secret = false;
            if (seg) {
                char *key = decode(q, strcspn(q, "=&"));
                secret = !key || url_value_secret(scheme, key);
                free(key);
            }
            if (!secret) {
                *o++ = lead;
                memcpy(o, q, seg);
                o += seg;
                lead = '&';
            }
            q += seg;
            if (!*q)
                break;
        }
    }
    *o = 0;
    free(scheme);
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

    /* userinfo: see the top of this file for where it ends */
    const char *rest = sep + 3;
    struct userinfo ui = find_userinfo(u->scheme, rest);
    if (ui.ambiguous)
        return bad(shown, "an '@' after a '/' makes the URL ambiguous (a password with '/', or a "
                          "path with '@'?): write a '/' in a password as %2F, an '@' in a path "
                          "as %40");
    const char *hosts = rest;
    if (ui.found) {
        u->user = decode(rest, ui.colon);
        if (ui.colon < ui.len)
            u->password = decode(rest + ui.colon + 1, ui.len - ui.colon - 1);
        if (!u->user || (ui.colon < ui.len && !u->password))
            return bad(shown, "bad %-escape in user or password");
        if (!*u->user) {
            free(u->user);
            u->user = NULL;
        }
        hosts = rest + ui.len + 1;
    }
    size_t auth_len = strcspn(hosts, "/?");
    const char *query = strchr(hosts + auth_len, '?');
    const char *slash = hosts[auth_len] == '/' ? hosts + auth_len : NULL;

    /* hosts */
    const char *hend = hosts + auth_len;
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
        size_t plen = query ? (size_t)(query - slash) : strlen(slash);
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
