/* names.c -- a lock name as a GET_LOCK name.
 *
 * GET_LOCK takes a string of at most 64 characters (MySQL 5.7+; MariaDB
 * takes more), in the connection's character set, server-wide -- not per
 * database. A dlock name is any bytes. So the key prefix and the name are
 * percent-encoded (ASCII only, one meaning per name: no quoting, no
 * character set in the way), and an encoded name longer than 64
 * characters becomes "%h" and the first 62 hex digits of its SHA-256,
 * computed by the server (SHA2()): no "%h" starts an encoded name, since
 * '%' there is always followed by two hex digits. Two long names collide
 * with odds of 2^-124 per pair (docs/protocol-mysql.md).
 */
#include <stdlib.h>
#include <string.h>

#include "mysql.h"

/* The bytes kept as they are besides letters, digits, '-' and '_'. */
#define KEEP "/.:@+=,~"

char *dlock__my_name_sql(const struct my_backend *s, const char *name, char **enc)
{
    char *full = dlock__sprintf("%s%s", s->prefix, name);
    char *e = full ? dlock__name_encode(full, KEEP, 0) : NULL;
    free(full);
    if (!e)
        return NULL;
    char *sql = strlen(e) <= MYSQL_LOCK_NAME_MAX
                    ? dlock__sprintf("'%s'", e)
                    : dlock__sprintf("CONCAT('%%h', LEFT(SHA2('%s', 256), 62))", e);
    if (!sql) {
        free(e);
        return NULL;
    }
    *enc = e;
    return sql;
}

char *dlock__my_name_of(const struct my_backend *s, const char *lock)
{
    /* '#' is encoded in every name: one there marks a semaphore's permit
     * (semaphore.c) */
    if (strncmp(lock, "%h", 2) == 0 || strchr(lock, '#'))
        return NULL;
    char *full = dlock__name_decode(lock);
    size_t plen = strlen(s->prefix);
    if (!full || strncmp(full, s->prefix, plen) != 0) {
        free(full);
        return NULL;
    }
    memmove(full, full + plen, strlen(full + plen) + 1);
    return full;
}
