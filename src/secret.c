/* secret.c -- passwords read from files, so that none need stand on a
 * command line (ps shows it to every user) or in an environment that a
 * job's children inherit.
 *
 * Where a password may come from, for each place the library needs one:
 *   - the URL: user:password@, ?password= or ?password_file=PATH (one of
 *     them; client.c), ?sentinel_password= or ?sentinel_password_file=
 *     (the Redis backend's sentinels);
 *   - else the environment: VAR (DLOCK_REDIS_PASSWORD, DLOCK_ETCD_PASSWORD,
 *     DLOCK_REDIS_SENTINEL_PASSWORD) or VAR_FILE naming a file (not both).
 * A password file is read as ssh reads a private key: refused, with a
 * message naming it, when it is not a regular file owned by this user
 * (the effective uid) or when group or others have any permission on it
 * -- a password others can read is not one any more. Its first line,
 * without the line end, is the password.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "internal.h"

/* The longest first line taken as a password. */
#define PASSWORD_MAX 4096

int dlock__password_file(const char *path, const char *from, char **out)
{
    *out = NULL;
    if (!*path)
        return dlock__err(DLOCK_EINVAL, "%s is empty: it names no password file", from);
    /* O_NONBLOCK: a FIFO planted there must not block the open */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    if (fd < 0)
        return dlock__errno(errno == ENOENT                     ? DLOCK_ENOENT
                            : errno == EACCES || errno == EPERM ? DLOCK_EACCES
                                                                : DLOCK_EIO,
                            errno, "password file '%s' (%s)", path, from);
    struct stat st;
    int rc = DLOCK_OK;
    if (fstat(fd, &st) < 0)
        rc = dlock__errno(DLOCK_EIO, errno, "password file '%s' (%s)", path, from);
    else if (!S_ISREG(st.st_mode))
        rc = dlock__err(DLOCK_EINVAL, "password file '%s' (%s) is not a regular file", path, from);
    else if (st.st_uid != geteuid())
        rc = dlock__err(DLOCK_EACCES,
                        "password file '%s' (%s) is owned by uid %ld, not by this user (uid %ld): "
                        "refused, as ssh refuses such a key",
                        path, from, (long)st.st_uid, (long)geteuid());
    else if (st.st_mode & 077)
        rc = dlock__err(DLOCK_EACCES,
                        "password file '%s' (%s) is readable or writable by group or others "
                        "(mode %04o): refused, as ssh refuses such a key; chmod 600 it",
                        path, from, (unsigned)(st.st_mode & 07777));
    char buf[PASSWORD_MAX + 1];
    ssize_t n = 0;
    while (!rc && (n = read(fd, buf, sizeof buf - 1)) < 0 && errno == EINTR)
        ;
    if (!rc && n < 0)
        rc = dlock__errno(DLOCK_EIO, errno, "password file '%s' (%s)", path, from);
    close(fd);
    if (rc)
        return rc;
    size_t got = n > 0 && n <= PASSWORD_MAX ? (size_t)n : 0;
    buf[got] = 0;
    size_t len = strcspn(buf, "\n");
    if (len == got && got == PASSWORD_MAX)
        return dlock__err(DLOCK_EINVAL,
                          "password file '%s' (%s): its first line is longer than %d bytes", path,
                          from, PASSWORD_MAX);
    if (len && buf[len - 1] == '\r')
        len--;
    if (memchr(buf, 0, len))
        return dlock__err(DLOCK_EINVAL, "password file '%s' (%s) holds a NUL byte", path, from);
    if (!len)
        return dlock__err(DLOCK_EINVAL,
                          "password file '%s' (%s) holds no password (its first line is empty)",
                          path, from);
    *out = strndup(buf, len);
    explicit_bzero(buf, sizeof buf);
    return *out ? DLOCK_OK : dlock__err(DLOCK_ENOMEM, "out of memory");
}

int dlock__password_env(const char *var, char **out)
{
    *out = NULL;
    char file_var[64];
    snprintf(file_var, sizeof file_var, "%s_FILE", var);
    const char *value = getenv(var), *path = getenv(file_var);
    if (value && !*value)
        value = NULL;
    if (path && !*path)
        path = NULL;
    if (value && path)
        return dlock__err(DLOCK_EINVAL, "both %s and %s are set: unset one", var, file_var);
    if (path)
        return dlock__password_file(path, file_var, out);
    if (value && !(*out = strdup(value)))
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    return DLOCK_OK;
}

int dlock__secret_option(struct dlock__url *u, const char *key, const char *var, char **out)
{
    *out = NULL;
    char file_key[64];
    snprintf(file_key, sizeof file_key, "%s_file", key);
    const char *value = dlock__url_param(u, key), *path = dlock__url_param(u, file_key);
    if (value && path)
        return dlock__err(DLOCK_EBADURL, "bad URL '%s': %s and %s both given: give one",
                          u->redacted, key, file_key);
    if (path)
        return dlock__password_file(path, file_key, out);
    if (value)
        return (*out = strdup(value)) ? DLOCK_OK : dlock__err(DLOCK_ENOMEM, "out of memory");
    return var ? dlock__password_env(var, out) : DLOCK_OK;
}
