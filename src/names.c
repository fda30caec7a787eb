/* names.c -- how a lock name becomes a file name, a node name or a key
 * segment, once for every backend.
 *
 * A lock name is any byte string; where a backend puts it (a directory
 * entry, a ZooKeeper node under a base path) has bytes that must not
 * appear raw ('/', '%', control and non-ASCII bytes, the names "." and
 * ".."). Each backend says which punctuation it keeps; everything else is
 * %XX, so a name can never escape its directory or base path and two
 * names never share an encoding. ASCII only: isalnum() follows the
 * caller's locale, and a Latin-1 byte sent raw is not UTF-8 to a server.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "toolbox.h"

int dlock__hexval(int ch)
{
    if (ch >= '0' && ch <= '9')
        return ch - '0';
    if (ch >= 'A' && ch <= 'F')
        return ch - 'A' + 10;
    if (ch >= 'a' && ch <= 'f')
        return ch - 'a' + 10;
    return -1;
}

static bool plain_byte(unsigned char ch, const char *keep)
{
    return (ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') ||
           ch == '-' || ch == '_' || (ch && keep && strchr(keep, ch));
}

char *dlock__name_encode(const char *name, const char *keep, unsigned flags)
{
    static const char hex[] = "0123456789ABCDEF";
    size_t n = strlen(name);
    char *out = malloc(n * 3 + 1), *p = out;
    if (!out)
        return NULL;
    bool dots = strcmp(name, ".") == 0 || strcmp(name, "..") == 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)name[i];
        bool plain = plain_byte(ch, keep) && !(ch == '.' && dots) &&
                     !(ch == '.' && i == 0 && (flags & DLOCK__ENC_NO_LEADING_DOT));
        if (plain) {
            *p++ = (char)ch;
        } else {
            *p++ = '%';
            *p++ = hex[ch >> 4];
            *p++ = hex[ch & 15];
        }
    }
    *p = 0;
    return out;
}

char *dlock__name_decode(const char *enc)
{
    size_t n = strlen(enc);
    char *out = malloc(n + 1), *p = out;
    if (!out)
        return NULL;
    for (size_t i = 0; i < n; i++) {
        int hi, lo;
        if (enc[i] == '%' && i + 2 < n && (hi = dlock__hexval(enc[i + 1])) >= 0 &&
            (lo = dlock__hexval(enc[i + 2])) >= 0) {
            *p++ = (char)(hi * 16 + lo);
            i += 2;
        } else {
            *p++ = enc[i];
        }
    }
    *p = 0;
    return out;
}

/* The host name, read once per process: an acquire names its owner
 * without a system call (a host renamed while the process runs keeps
 * the old name in its owner strings). */
static char identity_host[65] = "localhost";
static pthread_once_t identity_host_once = PTHREAD_ONCE_INIT;

static void read_identity_host(void)
{
    char host[sizeof identity_host];
    if (gethostname(host, sizeof host - 1) == 0) {
        host[sizeof host - 1] = 0;
        memcpy(identity_host, host, sizeof host);
    }
}

void dlock__identity(char *buf, size_t size)
{
    pthread_once(&identity_host_once, read_identity_host);
    snprintf(buf, size, "%ld@%s", (long)dlock__pid(), identity_host);
}
