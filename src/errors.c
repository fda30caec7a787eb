/* errors.c -- the error table's functions and the per-thread message.
 *
 * The enum, dlock_strerror() and dlock_err_name() all come from
 * DLOCK_ERRNO_MAP in dlock.h, so they cannot drift apart. The message of
 * the last failure lives in thread-local storage: a client is shared by
 * threads, so a per-client message would be overwritten by another
 * thread's failure before the first one read it.
 *
 * Messages quote what servers say and the names callers gave, and end up
 * on terminals: every control character in them is escaped here, once
 * (dlock__escape_text), so no server text can carry an escape sequence
 * to whoever reads the message.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "toolbox.h"

static _Thread_local char last_msg[1024];

/* The name and text of every code, from the one map. */
static const struct code_row {
    int code;
    const char *name, *text;
} codes[] = {
    {DLOCK_OK, "DLOCK_OK", "success"},
#define DLOCK__ERR_ROW(name, code, text) {DLOCK_##name, "DLOCK_" #name, text},
             DLOCK_ERRNO_MAP(DLOCK__ERR_ROW)
#undef DLOCK__ERR_ROW
};

/* ERR's row, NULL for a code not in the map. */
static const struct code_row *row_of(int err)
{
    for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++)
        if (codes[i].code == err)
            return &codes[i];
    return NULL;
}

const char *dlock_strerror(int err)
{
    return row_of(err) ? row_of(err)->text : "unknown error";
}

const char *dlock_err_name(int err)
{
    return row_of(err) ? row_of(err)->name : "DLOCK_E?";
}

const char *dlock_errmsg(void)
{
    return last_msg;
}

size_t dlock__escape_text(char *dst, size_t size, const char *src)
{
    static const char hex[] = "0123456789abcdef";
    size_t w = 0;
    if (!size)
        return 0;
    for (const unsigned char *p = (const unsigned char *)src; *p; p++) {
        /* C0, DEL, and C1 (U+0080-U+009F, 0xc2 0x80-0x9f in UTF-8: 0x9b
         * is a CSI to some terminals) */
        size_t n = *p < 0x20 || *p == 0x7f ? 1 : p[0] == 0xc2 && p[1] >= 0x80 && p[1] < 0xa0 ? 2 : 0;
        if (!n) {
            if (w + 1 >= size)
                break;
            dst[w++] = (char)*p;
            continue;
        }
        if (w + 4 * n >= size)
            break;
        for (size_t k = 0; k < n; k++, w += 4) {
            dst[w] = '\\';
            dst[w + 1] = 'x';
            dst[w + 2] = hex[p[k] >> 4];
            dst[w + 3] = hex[p[k] & 15];
        }
        p += n - 1;
    }
    dst[w] = 0;
    return w;
}

static void vset(const char *fmt, va_list ap)
{
    char raw[sizeof last_msg]; /* (an argument may be last_msg itself) */
    vsnprintf(raw, sizeof raw, fmt, ap);
    dlock__escape_text(last_msg, sizeof last_msg, raw);
}

int dlock__err(int err, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vset(fmt, ap);
    va_end(ap);
    return err;
}

int dlock__errno(int err, int errnum, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vset(fmt, ap);
    va_end(ap);
    size_t len = strlen(last_msg);
    snprintf(last_msg + len, sizeof last_msg - len, ": %s", strerror(errnum));
    return err;
}

int dlock__errno_code(int errnum)
{
    switch (errnum) {
    case EACCES:
    case EPERM:
    case EROFS:
        return DLOCK_EACCES;
    case ENOENT:
    case ENOTDIR:
        return DLOCK_ENOENT;
    case ENOMEM:
        return DLOCK_ENOMEM;
    case ENAMETOOLONG:
    case EINVAL:
        return DLOCK_EINVAL;
    case ECONNREFUSED:
    case EHOSTUNREACH:
    case ENETUNREACH:
    case ETIMEDOUT:
        return DLOCK_ECONN;
    default:
        return DLOCK_EIO;
    }
}

void dlock__errmsg_save(char buf[DLOCK__MSG_MAX])
{
    snprintf(buf, DLOCK__MSG_MAX, "%s", last_msg);
}

int dlock__errmsg_restore(int err, const char buf[DLOCK__MSG_MAX])
{
    snprintf(last_msg, sizeof last_msg, "%s", buf);
    return err;
}
