/* errors.c -- the error table's functions and the per-thread message.
 *
 * The enum, dlock_strerror() and dlock_err_name() all come from
 * DLOCK_ERRNO_MAP in dlock.h, so they cannot drift apart. The message of
 * the last failure lives in thread-local storage: a client is shared by
 * threads, so a per-client message would be overwritten by another
 * thread's failure before the first one read it.
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

static void vset(const char *fmt, va_list ap)
{
    vsnprintf(last_msg, sizeof last_msg, fmt, ap);
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
