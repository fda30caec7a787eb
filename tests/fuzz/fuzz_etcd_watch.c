/* fuzz_etcd_watch.c -- libFuzzer target for the etcd backend's reading of
 * what etcd's JSON gateway sends (src/backends/etcd/): a watch stream's
 * bytes, cut by the network anywhere, through dlock__etcd_stream_feed()
 * (lines) and dlock__etcd_watch_message() (what each line means to a
 * watch); an error body through dlock__etcd_refusal(); base64 through
 * dlock__etcd_b64()/dlock__etcd_unb64(). Promised: no crash, leak or
 * undefined behaviour (ASan + UBSan); the stream fed in one chunk, one
 * byte at a time and in two chunks cut where the input says gives the
 * same lines, the same meaning for each and the same bytes left over; a
 * refusal's text is one line; base64 decodes back to its bytes.
 * Input: first byte the watch's kind (bit 0 a prefix watch of "lock/", else
 * of that key; bit 1 to_shared; the rest its start revision), second the
 * cut, then the stream. A message etcd never sends says why. Corpus: tests/fuzz/corpus/etcd_watch/.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backends/etcd/etcd.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* What a feed saw: the lines, each with its meaning, as one record. */
struct seen {
    char *text; /* each line, then a NUL and its meaning as a digit */
    size_t len, cap;
    struct etcd_watch_state st;
};

static void on_line(void *arg, const char *line, size_t len)
{
    struct seen *s = arg;
    char why[200];
    unsigned what = dlock__etcd_watch_message(&s->st, line, len, why, sizeof why);
    if (what & ~(unsigned)(ETCD_WATCH_CREATED | ETCD_WATCH_FIRE | ETCD_WATCH_BAD))
        abort();
    if ((what & ETCD_WATCH_BAD) && (!(what & ETCD_WATCH_FIRE) || !memchr(why, '\0', sizeof why)))
        abort(); /* a bad message fires, and says why */
    if (s->len + len + 2 > s->cap) {
        s->cap = 2 * (s->len + len + 2);
        s->text = realloc(s->text, s->cap);
        if (!s->text)
            abort();
    }
    memcpy(s->text + s->len, line, len);
    s->text[s->len + len] = '\0';
    s->text[s->len + len + 1] = (char)('0' + what);
    s->len += len + 2;
}

/* Feed P (N bytes) in chunks of at most STEP bytes, the first cut at
 * FIRST (0: none); what was seen in *S, the bytes left in *REST. */
static void feed(const char *p, size_t n, size_t first, size_t step, struct seen *s,
                 struct etcd_stream *rest)
{
    memset(rest, 0, sizeof *rest);
    size_t at = 0;
    if (first && first < n) {
        if (!dlock__etcd_stream_feed(rest, p, first, on_line, s))
            abort(); /* 16 MiB is out of reach */
        at = first;
    }
    while (at < n) {
        size_t m = n - at < step ? n - at : step;
        if (!dlock__etcd_stream_feed(rest, p + at, m, on_line, s))
            abort();
        at += m;
    }
}

static void same(const struct seen *a, const struct etcd_stream *ra, const struct seen *b,
                 const struct etcd_stream *rb)
{
    if (a->len != b->len || (a->len && memcmp(a->text, b->text, a->len) != 0))
        abort(); /* other lines, or another meaning */
    if (ra->len != rb->len || (ra->len && memcmp(ra->line, rb->line, ra->len) != 0))
        abort(); /* other bytes left over */
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2)
        return 0;
    bool any = data[0] & 1, to_shared = data[0] & 2;
    char key[] = "lock/";
    size_t cut = data[1];
    const char *p = (const char *)data + 2;
    size_t n = size - 2;

    struct seen whole = {.st = {.key = key,
                                .prefix = any,
                                .any = any,
                                .to_shared = to_shared,
                                .noput = !any && !to_shared,
                                .start_rev = data[0] >> 2}};
    struct seen bytes = whole, two = whole;
    struct etcd_stream rest_whole, rest_bytes, rest_two;
    feed(p, n, 0, n ? n : 1, &whole, &rest_whole);
    feed(p, n, 0, 1, &bytes, &rest_bytes);
    feed(p, n, cut % (n + 1), n ? n : 1, &two, &rest_two);
    same(&whole, &rest_whole, &bytes, &rest_bytes);
    same(&whole, &rest_whole, &two, &rest_two);
    free(whole.text);
    free(bytes.text);
    free(two.text);
    free(rest_whole.line);
    free(rest_bytes.line);
    free(rest_two.line);

    /* the same bytes as an error reply's body */
    char *body = malloc(n + 1);
    if (!body)
        return 0;
    memcpy(body, p, n);
    body[n] = '\0';
    char text[256];
    int code = 0;
    dlock__etcd_refusal(body, n, 400 + (long)(data[0] >> 2), text, sizeof text, &code);
    if (!memchr(text, '\0', sizeof text) || strpbrk(text, "\n\r\t"))
        abort(); /* a refusal's text is one line */

    /* base64 both ways */
    char *b64 = dlock__etcd_b64(p, n);
    if (b64) {
        size_t len = 0;
        char *back = dlock__etcd_unb64(b64, &len);
        if (!back || len != n || (n && memcmp(back, p, n) != 0))
            abort();
        free(back);
        free(b64);
    }
    size_t len = 0;
    free(dlock__etcd_unb64(body, &len)); /* any text: decoded or refused */
    free(body);
    return 0;
}
