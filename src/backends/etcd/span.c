/* span.c -- the renewal's key check (lease.c) reads the reply of its
 * keys-only range as text, without a JSON tree: with 10,000 holds, the
 * jansson objects of ten replies of 1,000 kvs each were half of the
 * keeper's CPU every third of the lease. The scan checks the JSON's
 * syntax, and the reply as reply.c checks a range (the same rules, the
 * same messages), and keeps per kv where its key is in the text and its
 * create revision: all the check needs.
 */
#include "etcd.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DEPTH 512 /* nesting of a value skipped (jansson allows 2048) */

/* The text being scanned: the next byte at P, the end at END. */
struct scan {
    const char *p, *end;
};

/* One JSON value as scanned: its kind and, for a string, its text between
 * the quotes (escapes kept; ESC when there is one), for a number its
 * text. */
enum kind { V_STRING, V_INT, V_REAL, V_TRUE, V_FALSE, V_NULL, V_OBJECT, V_ARRAY };
struct value {
    enum kind kind;
    const char *s;
    size_t n;
    bool esc;
};

static void skip_space(struct scan *sc)
{
    while (sc->p < sc->end && (*sc->p == ' ' || *sc->p == '\t' || *sc->p == '\n' || *sc->p == '\r'))
        sc->p++;
}

/* Is the next byte (after space) CH? Taken if so. */
static bool take(struct scan *sc, char ch)
{
    skip_space(sc);
    if (sc->p < sc->end && *sc->p == ch) {
        sc->p++;
        return true;
    }
    return false;
}

static bool is_hex(char ch)
{
    return (ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f') || (ch >= 'A' && ch <= 'F');
}

/* A string (the opening quote next): into V. */
static bool string(struct scan *sc, struct value *v)
{
    const char *start = ++sc->p;
    v->kind = V_STRING;
    v->esc = false;
    while (sc->p < sc->end && *sc->p != '"') {
        unsigned char ch = (unsigned char)*sc->p++;
        if (ch < 0x20)
            return false;
        if (ch != '\\')
            continue;
        v->esc = true;
        if (sc->p >= sc->end)
            return false;
        ch = (unsigned char)*sc->p++;
        if (ch == 'u') {
            for (int i = 0; i < 4; i++)
                if (sc->p >= sc->end || !is_hex(*sc->p++))
                    return false;
        } else if (!strchr("\"\\/bfnrt", ch) || !ch) {
            return false;
        }
    }
    if (sc->p >= sc->end)
        return false;
    v->s = start;
    v->n = (size_t)(sc->p++ - start);
    return true;
}

static bool digits(struct scan *sc)
{
    const char *start = sc->p;
    while (sc->p < sc->end && *sc->p >= '0' && *sc->p <= '9')
        sc->p++;
    return sc->p > start;
}

/* A number (JSON's grammar): into V, V_INT when it has neither a fraction
 * nor an exponent. */
static bool number(struct scan *sc, struct value *v)
{
    const char *start = sc->p;
    if (*sc->p == '-')
        sc->p++;
    if (sc->p < sc->end && *sc->p == '0')
        sc->p++;
    else if (!digits(sc))
        return false;
    v->kind = V_INT;
    if (sc->p < sc->end && *sc->p == '.') {
        sc->p++;
        v->kind = V_REAL;
        if (!digits(sc))
            return false;
    }
    if (sc->p < sc->end && (*sc->p == 'e' || *sc->p == 'E')) {
        sc->p++;
        v->kind = V_REAL;
        if (sc->p < sc->end && (*sc->p == '+' || *sc->p == '-'))
            sc->p++;
        if (!digits(sc))
            return false;
    }
    v->s = start;
    v->n = (size_t)(sc->p - start);
    return true;
}

static bool word(struct scan *sc, const char *w, enum kind kind, struct value *v)
{
    size_t n = strlen(w);
    if ((size_t)(sc->end - sc->p) < n || memcmp(sc->p, w, n) != 0)
        return false;
    sc->p += n;
    v->kind = kind;
    return true;
}

static bool skip_value(struct scan *sc, int depth);

/* A member's name: a string next (after space), into V. */
static bool name_string(struct scan *sc, struct value *v)
{
    skip_space(sc);
    return sc->p < sc->end && *sc->p == '"' && string(sc, v);
}

/* The value that starts next. An object or an array is left open (its
 * opening byte taken): the caller reads or skips what is inside. */
static bool value_start(struct scan *sc, struct value *v)
{
    skip_space(sc);
    if (sc->p >= sc->end)
        return false;
    switch (*sc->p) {
    case '"': return string(sc, v);
    case '{':
        sc->p++;
        v->kind = V_OBJECT;
        return true;
    case '[':
        sc->p++;
        v->kind = V_ARRAY;
        return true;
    case 't': return word(sc, "true", V_TRUE, v);
    case 'f': return word(sc, "false", V_FALSE, v);
    case 'n': return word(sc, "null", V_NULL, v);
    default: return (*sc->p == '-' || (*sc->p >= '0' && *sc->p <= '9')) && number(sc, v);
    }
}

/* The members of an open object, or the elements of an open array, up to
 * its closing byte, each skipped. */
static bool skip_inside(struct scan *sc, enum kind kind, int depth)
{
    char close = kind == V_OBJECT ? '}' : ']';
    if (take(sc, close))
        return true;
    do {
        struct value name;
        if (kind == V_OBJECT && !(name_string(sc, &name) && take(sc, ':')))
            return false;
        if (!skip_value(sc, depth + 1))
            return false;
    } while (take(sc, ','));
    return take(sc, close);
}

static bool skip_value(struct scan *sc, int depth)
{
    struct value v;
    if (depth > MAX_DEPTH || !value_start(sc, &v))
        return false;
    return (v.kind != V_OBJECT && v.kind != V_ARRAY) || skip_inside(sc, v.kind, depth);
}

/* The next member's name of an open object (its quote next, after
 * space): into NAME; false at its end or on bad syntax (*BAD). */
static bool member(struct scan *sc, struct value *name, bool first, bool *bad)
{
    if (take(sc, '}'))
        return false;
    if ((!first && !take(sc, ',')) || !name_string(sc, name) || !take(sc, ':')) {
        *bad = true;
        return false;
    }
    return true;
}

static bool named(const struct value *name, const char *s)
{
    size_t n = strlen(s);
    return !name->esc && name->n == n && memcmp(name->s, s, n) == 0;
}

/* An int64 field's value V (PRESENT false: absent, 0), as
 * dlock__etcd_int_of() reads one: a JSON integer, or a string of at most
 * 19 digits with an optional '-'. */
static bool int_of(const struct value *v, bool present, int64_t *out)
{
    *out = 0;
    if (!present)
        return true;
    if (v->kind != V_INT && (v->kind != V_STRING || v->esc))
        return false;
    size_t sign = v->n && v->s[0] == '-', i = sign;
    while (i < v->n && v->s[i] >= '0' && v->s[i] <= '9')
        i++;
    if (i == sign || i != v->n || i - sign > 19)
        return false;
    char text[24];
    memcpy(text, v->s, v->n);
    text[v->n] = 0;
    errno = 0;
    long long n = strtoll(text, NULL, 10);
    if (errno == ERANGE)
        return false;
    *out = n;
    return true;
}

/* One kv (an open object): its key, create revision, and whether its
 * fields are as reply.c wants them (*WHY: which rule failed, 0: none). */
static bool scan_kv(struct scan *sc, struct etcd_span_kv *kv, int *why)
{
    struct value name, v, fields[5];
    static const char *const names[5] = {"key", "create_revision", "mod_revision", "version",
                                         "lease"};
    bool have[5] = {false}, bad = false, value_ok = true;
    for (bool first = true; member(sc, &name, first, &bad); first = false) {
        if (!value_start(sc, &v))
            return false;
        int f = 0;
        while (f < 5 && !named(&name, names[f]))
            f++;
        if (f < 5) {
            fields[f] = v;
            have[f] = true;
        } else if (named(&name, "value")) {
            value_ok = v.kind == V_STRING;
        }
        if ((v.kind == V_OBJECT || v.kind == V_ARRAY) && !skip_inside(sc, v.kind, 2))
            return false;
    }
    if (bad)
        return false;
    int64_t create, mod, version, lease;
    *why = 0;
    if (!have[0] || fields[0].kind != V_STRING || fields[0].n == 0)
        *why = 1;
    else if (!int_of(&fields[1], have[1], &create) || create < 1 ||
             !int_of(&fields[2], have[2], &mod) || mod < create)
        *why = 2;
    else if (!int_of(&fields[3], have[3], &version) || version < 0 ||
             !int_of(&fields[4], have[4], &lease) || lease < 0 || !value_ok)
        *why = 3;
    if (!*why)
        *kv = (struct etcd_span_kv){fields[0].s, fields[0].n, fields[0].esc, create};
    return true;
}

/* The open kvs array into R (grown as needed); *WHY, *AT: the first kv
 * that broke a rule, as scan_kv says. */
static bool scan_kvs(struct scan *sc, struct etcd_span_reply *r, int *why, size_t *at)
{
    size_t cap = 0, i = 0;
    if (take(sc, ']'))
        return true;
    do {
        struct value v;
        if (!value_start(sc, &v))
            return false;
        if (v.kind != V_OBJECT) { /* (reply.c: no key) */
            if (!*why) {
                *why = 1;
                *at = i;
            }
            if (v.kind == V_ARRAY && !skip_inside(sc, v.kind, 2))
                return false;
            i++;
            continue;
        }
        if (r->n == cap) {
            size_t ncap = cap ? 2 * cap : 1024;
            struct etcd_span_kv *n = realloc(r->kvs, ncap * sizeof *n);
            if (!n)
                return false;
            r->kvs = n;
            cap = ncap;
        }
        int w = 0;
        if (!scan_kv(sc, &r->kvs[r->n], &w))
            return false;
        if (w && !*why) {
            *why = w;
            *at = i;
        }
        r->n += !w;
        i++;
    } while (take(sc, ','));
    r->listed = i;
    return take(sc, ']');
}

/* What the top object of a range reply said. */
struct top {
    bool header_ok, kvs_list, more_bool;
    int64_t count;
    bool count_ok;
    int why; /* a kv's broken rule (scan_kv), 0: none */
    size_t at;
};

static bool scan_top(struct scan *sc, struct etcd_span_reply *r, struct top *t)
{
    struct value name, v;
    bool bad = false, have_count = false;
    struct value count = {0};
    if (!take(sc, '{'))
        return false;
    for (bool first = true; member(sc, &name, first, &bad); first = false) {
        if (!value_start(sc, &v))
            return false;
        if (named(&name, "header") && v.kind == V_OBJECT) {
            bool hb = false;
            for (bool hf = true; member(sc, &name, hf, &hb); hf = false) {
                struct value hv;
                int64_t rev;
                if (!value_start(sc, &hv))
                    return false;
                if (named(&name, "revision"))
                    t->header_ok = int_of(&hv, true, &rev) && rev >= 1;
                if ((hv.kind == V_OBJECT || hv.kind == V_ARRAY) && !skip_inside(sc, hv.kind, 2))
                    return false;
            }
            if (hb)
                return false;
            continue;
        }
        if (named(&name, "header"))
            t->header_ok = false;
        if (named(&name, "kvs")) {
            r->n = r->listed = 0;
            t->why = 0;
            t->kvs_list = v.kind == V_ARRAY;
            if (v.kind == V_ARRAY) {
                if (!scan_kvs(sc, r, &t->why, &t->at))
                    return false;
                continue;
            }
        } else if (named(&name, "more")) {
            t->more_bool = v.kind == V_TRUE || v.kind == V_FALSE;
            r->more = v.kind == V_TRUE;
        } else if (named(&name, "count")) {
            count = v;
            have_count = true;
        }
        if ((v.kind == V_OBJECT || v.kind == V_ARRAY) && !skip_inside(sc, v.kind, 1))
            return false;
    }
    t->count_ok = !bad && int_of(&count, have_count, &t->count);
    return !bad;
}

int dlock__etcd_span_scan(const char *body, size_t len, const char *label, const char *what,
                          struct etcd_span_reply *r)
{
    const char *path = "/v3/kv/range";
    struct scan sc = {body, body + len};
    struct top t = {.kvs_list = true, .more_bool = true};
    memset(r, 0, sizeof *r);
    bool ok = scan_top(&sc, r, &t);
    skip_space(&sc);
    if (!ok || sc.p != sc.end)
        return dlock__err(DLOCK_EPROTO, "%s: %s: %s replied with something not JSON (at byte %zu)",
                          label, what, path, (size_t)(sc.p - body));
    if (!t.header_ok)
        return dlock__etcd_bad_reply(label, what, path, "no valid header.revision");
    if (!t.kvs_list)
        return dlock__etcd_bad_reply(label, what, path, "the range.kvs not a list");
    if (!t.more_bool)
        return dlock__etcd_bad_reply(label, what, path, "the range.more not a boolean");
    if (t.why == 1)
        return dlock__etcd_bad_reply(label, what, path, "the range.kvs[%zu] without a key", t.at);
    if (t.why == 2)
        return dlock__etcd_bad_reply(label, what, path,
                                     "the range.kvs[%zu] without valid revisions", t.at);
    if (t.why == 3)
        return dlock__etcd_bad_reply(label, what, path,
                                     "the range.kvs[%zu] with a bad version, lease or value", t.at);
    if (!t.count_ok || t.count < (int64_t)r->listed)
        return dlock__etcd_bad_reply(label, what, path, "the range.count missing or below its kvs");
    return DLOCK_OK;
}
