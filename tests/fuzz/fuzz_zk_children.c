/* fuzz_zk_children.c -- libFuzzer target for the ZooKeeper backend's
 * reading of a lock node's children (src/backends/zk/mutex.c): Curator's
 * shapes "<mark><10 digits>" and "_c_<uuid>-<mark><10 digits>", where
 * <mark> is InterProcessMutex's "lock-" or InterProcessReadWriteLock's
 * "__WRIT__" / "__READ__" or LeaderLatch's "latch-", among foreign names. Each input line is a
 * child name. After dlock__zk_sort_lock_nodes() the kept children are exactly the inputs of those
 * shapes (checked against a matcher written here, independently), sorted
 * by sequence number, the owner first; dlock__zk_node_has_guid() with the first
 * line as the guid never reads past a name. Corpus:
 * tests/fuzz/corpus/zk_children/.
 */
#include <ctype.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "backends/zk/zk.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The sequence digits of a lock child, NULL for any other name. */
static const char *reference_sequence(const char *s)
{
    if (strncmp(s, "_c_", 3) == 0) {
        static const char shape[] = "xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx-";
        for (size_t i = 0; i < sizeof shape - 1; i++) {
            char c = s[3 + i];
            if (shape[i] == '-' ? c != '-' : !isxdigit((unsigned char)c))
                return NULL;
        }
        s += 3 + sizeof shape - 1;
    }
    static const char *const marks[] = {"lock-", "__WRIT__", "__READ__", "latch-"};
    for (size_t m = 0; m < sizeof marks / sizeof marks[0]; m++) {
        size_t ml = strlen(marks[m]);
        if (strncmp(s, marks[m], ml) != 0 || strlen(s + ml) != 10)
            continue;
        for (int i = 0; i < 10; i++)
            if (!isdigit((unsigned char)s[ml + i]))
                return NULL;
        return s + ml;
    }
    return NULL;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = strndup((const char *)data, size);
    if (!text)
        return 0;
    struct String_vector kids = {0, calloc(64, sizeof(char *))};
    int expected = 0;
    char *guid = NULL;
    for (char *line = text, *next; line && kids.count < 64; line = next) {
        next = strchr(line, '\n');
        if (next)
            *next++ = '\0';
        if (!guid) {
            guid = line;
            continue;
        }
        kids.data[kids.count++] = strdup(line);
        expected += reference_sequence(line) != NULL;
        (void)dlock__zk_node_has_guid(line, guid);
    }
    dlock__zk_sort_lock_nodes(&kids);
    if (kids.count != expected)
        abort();
    for (int32_t i = 0; i < kids.count; i++) {
        const char *seq = reference_sequence(kids.data[i]);
        if (!seq || (i > 0 && strcmp(reference_sequence(kids.data[i - 1]), seq) > 0))
            abort();
    }
    for (int32_t i = 0; i < kids.count; i++)
        free(kids.data[i]);
    free(kids.data);
    free(text);
    return 0;
}
