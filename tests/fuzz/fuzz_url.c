/* fuzz_url.c -- libFuzzer target for the URL parser (src/url.c), the
 * option and duration parsing behind dlock_client_new(), and what they
 * promise: any bytes are refused or parsed without a crash, a leak or
 * undefined behaviour (built with ASan + UBSan by `make fuzz`); a parsed
 * URL's redacted form and the client's URL never show a password the URL
 * gave; a duration that parses lies within the documented range.
 * Corpus: tests/fuzz/corpus/url/ (one URL per file).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "dlock.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* A password the redaction must remove: at least 6 bytes, in a URL with
 * no percent escape (so the parsed password is also the text written),
 * and found exactly once in it (counting overlaps), so that it cannot
 * stand in the redacted text as a host or an option by chance. Nor may it
 * hold ':', '/' or '@': the redacted form joins scheme, user and host
 * with those, so "red4s://ma3://ma3@@jo" (password "//ma3@") is redacted
 * to "red4s://ma3@jo", which holds the password's bytes without showing
 * it (a false alarm of this oracle the CI run of 23360a5 found). */
static int must_hide(const char *text, const char *password)
{
    if (!password || strlen(password) < 6 || strchr(text, '%') || strpbrk(password, ":/@"))
        return 0;
    const char *first = strstr(text, password);
    return first && !strstr(first + 1, password);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = malloc(size + 1);
    if (!text)
        return 0;
    memcpy(text, data, size);
    text[size] = '\0';

    struct dlock__url u;
    memset(&u, 0, sizeof u);
    if (dlock__url_parse(text, &u) == 0) {
        if (must_hide(text, u.password) && u.redacted && strstr(u.redacted, u.password))
            abort();
        for (size_t i = 0; i < u.nparams; i++)
            (void)dlock__url_param(&u, u.params[i].key);
    }
    dlock__url_free(&u);

    int64_t d = dlock__parse_duration(text);
    if (d < -1)
        abort();

    dlock_client *c = NULL;
    if (dlock_client_new(text, &c) == DLOCK_OK) {
        if (!c || !dlock_client_url(c) || !dlock_client_backend(c))
            abort();
        memset(&u, 0, sizeof u);
        if (dlock__url_parse(text, &u) == 0 && must_hide(text, u.password) &&
            strstr(dlock_client_url(c), u.password))
            abort();
        dlock__url_free(&u);
    } else if (c) {
        abort();
    }
    dlock_client_close(c);
    free(text);
    return 0;
}
