/* config.c -- where the dlock command finds its URL: -u, else $DLOCK_URL,
 * else a configuration file, else the library's default (the file backend
 * in the user's directory), so that a crontab line needs no -u.
 *
 * Which file (one is read; they are not merged):
 *   $DLOCK_CONFIG when set (empty: none; a file it names must exist), else
 *   $XDG_CONFIG_HOME/dlock/dlock.conf (~/.config/dlock/dlock.conf when
 *   XDG_CONFIG_HOME is unset, empty or not absolute) when it exists, else
 *   /etc/dlock/dlock.conf when it exists.
 *
 * Format: "key = value" lines (blanks around both ignored), blank lines,
 * and comment lines whose first non-blank is '#'. `url` is the URL; every
 * other key is one of its options (lease, timeout, password_file, db...),
 * appended as ?key=value (percent-encoded), so the library checks it as it
 * checks any URL's. A configuration file is read by everyone it serves,
 * so it holds no password (cli_open() refuses one): password_file = names
 * a file the library checks as ssh checks a key.
 *
 * The CLI reads it, not the library: a program using libdlock chooses its
 * URL itself, and a library reading files it was not told about would
 * surprise it.
 */
#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"

#define SYSTEM_CONFIG "/etc/dlock/dlock.conf"

/* The file read (once per process) and what it gave. */
static struct {
    bool loaded;
    char *path;  /* NULL: no file */
    char *url;   /* NULL: the file gives none */
    char *error; /* what is wrong with it, "PATH[:LINE]: ..." */
} conf;

/* printf into a fresh string; NULL without memory. */
static char *fmt(const char *format, ...) __attribute__((format(printf, 1, 2)));
static char *fmt(const char *format, ...)
{
    va_list ap;
    va_start(ap, format);
    char *s;
    int n = vasprintf(&s, format, ap);
    va_end(ap);
    return n < 0 ? NULL : s;
}

/* The file to read: a fresh path, or NULL for none (*MUST_EXIST: it was
 * named by DLOCK_CONFIG). */
static char *config_path(bool *must_exist)
{
    const char *named = getenv("DLOCK_CONFIG");
    *must_exist = named != NULL;
    if (named)
        return *named ? strdup(named) : NULL;
    const char *xdg = getenv("XDG_CONFIG_HOME"), *home = getenv("HOME");
    char *user = NULL;
    if (xdg && xdg[0] == '/')
        user = fmt("%s/dlock/dlock.conf", xdg);
    else if (home && *home)
        user = fmt("%s/.config/dlock/dlock.conf", home);
    if (user && access(user, F_OK) == 0)
        return user;
    free(user);
    return access(SYSTEM_CONFIG, F_OK) == 0 ? strdup(SYSTEM_CONFIG) : NULL;
}

/* Append VALUE to the string at *OUT (of *LEN bytes), percent-encoding
 * what a URL's query would read otherwise. Returns false without memory. */
static bool append_encoded(char **out, size_t *len, const char *value, bool encode)
{
    char *grown = realloc(*out, *len + 3 * strlen(value) + 1);
    if (!grown)
        return false;
    *out = grown;
    for (const unsigned char *p = (const unsigned char *)value; *p; p++)
        if (!encode || isalnum(*p) || strchr("-._~/:", *p))
            grown[(*len)++] = (char)*p;
        else
            *len += (size_t)sprintf(grown + *len, "%%%02X", *p);
    grown[*len] = 0;
    return true;
}

/* Trim blanks off both ends of S, in place. */
static char *trim(char *s)
{
    while (isspace((unsigned char)*s))
        s++;
    size_t n = strlen(s);
    while (n && isspace((unsigned char)s[n - 1]))
        s[--n] = 0;
    return s;
}

/* Read conf.path into conf.url, or set conf.error. */
static void config_read(void)
{
    FILE *f = fopen(conf.path, "re");
    if (!f) {
        conf.error = fmt("%s: %s", conf.path, strerror(errno));
        return;
    }
    char *line = NULL, *url = NULL, *options = NULL, *seen = strdup("\n");
    size_t cap = 0, olen = 0, lineno = 0;
    while (!conf.error && seen && getline(&line, &cap, f) >= 0) {
        lineno++;
        char *text = trim(line), *eq = strchr(text, '=');
        if (!*text || *text == '#')
            continue;
        if (!eq) {
            conf.error = fmt("%s:%zu: not key = value", conf.path, lineno);
            break;
        }
        *eq = 0;
        char *key = trim(text), *value = trim(eq + 1);
        size_t klen = strspn(key, "abcdefghijklmnopqrstuvwxyz0123456789_");
        char *mark = fmt("\n%s\n", key);
        if (!*key || key[klen])
            conf.error =
                fmt("%s:%zu: '%s' is not a key (lower case, digits, '_')", conf.path, lineno, key);
        else if (mark && strstr(seen, mark))
            conf.error = fmt("%s:%zu: %s given twice", conf.path, lineno, key);
        else if (!*value)
            conf.error = fmt("%s:%zu: %s has no value", conf.path, lineno, key);
        free(mark);
        if (conf.error)
            break;
        size_t slen = strlen(seen);
        bool ok =
            append_encoded(&seen, &slen, key, false) && append_encoded(&seen, &slen, "\n", false);
        if (ok && strcmp(key, "url") == 0)
            ok = (url = strdup(value)) != NULL;
        else if (ok) /* ?key=value, '&' between: the library says what it makes of it */
            ok = append_encoded(&options, &olen, olen ? "&" : "", false) &&
                 append_encoded(&options, &olen, key, true) &&
                 append_encoded(&options, &olen, "=", false) &&
                 append_encoded(&options, &olen, value, true);
        if (!ok)
            conf.error = fmt("%s: out of memory", conf.path);
    }
    if (!conf.error && ferror(f))
        conf.error = fmt("%s: %s", conf.path, strerror(errno));
    fclose(f);
    free(line);
    free(seen);
    if (!conf.error && options && !url)
        conf.error = fmt("%s: options without a url = line", conf.path);
    if (!conf.error && url)
        conf.url =
            options ? fmt("%s%c%s", url, strchr(url, '?') ? '&' : '?', options) : strdup(url);
    free(options);
    free(url);
}

static void config_load(void)
{
    if (conf.loaded)
        return;
    conf.loaded = true;
    bool must_exist;
    conf.path = config_path(&must_exist);
    if (!conf.path)
        return;
    if (!must_exist && access(conf.path, F_OK) != 0) {
        free(conf.path);
        conf.path = NULL;
        return;
    }
    config_read();
}

int cli_choose_url(const char *given, bool quiet, struct cli_url *out)
{
    *out = (struct cli_url){given, "-u", true, false};
    if (given)
        return 0;
    const char *env = getenv("DLOCK_URL");
    if (env && *env) {
        *out = (struct cli_url){env, "DLOCK_URL", false, false};
        return 0;
    }
    config_load();
    if (conf.error) {
        if (!quiet)
            fprintf(stderr, "dlock: %s\n", conf.error);
        return EXIT_CONFIG;
    }
    if (conf.url)
        *out = (struct cli_url){conf.url, conf.path, false, true};
    else
        *out = (struct cli_url){NULL, "the default: no -u, DLOCK_URL or configuration file", false,
                                false};
    return 0;
}
