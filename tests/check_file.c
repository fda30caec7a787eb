/* check_file.c -- the core API on the embedded file backend: exclusion
 * between processes and threads, shared mode, reentrancy, tokens, waits,
 * cancel, kill -9 of a holder, hostile names, bad URLs and directories,
 * fork misuse, inspect, list and force-release. Each test runs in its own
 * process (Check's fork mode) with a time limit.
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <dirent.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "dlock.h"
#include "testutil.h"

static char *dir, *url;

static void setup(void)
{
    tu_file_fixture("file", &dir, &url);
}

static void teardown(void)
{
    tu_file_fixture_end(&dir, &url);
}

/* ------------------------------------------------------------- errors */

TU_TEST(errors, 60)
{
    int codes[] = {
#define CODE(name, code, text) DLOCK_##name,
        DLOCK_ERRNO_MAP(CODE)
#undef CODE
    };
    for (size_t i = 0; i < sizeof codes / sizeof *codes; i++) {
        ck_assert_int_lt(codes[i], 0);
        ck_assert_str_ne(dlock_strerror(codes[i]), "unknown error");
        ck_assert_str_ne(dlock_err_name(codes[i]), "DLOCK_E?");
        for (size_t j = 0; j < i; j++)
            ck_assert_int_ne(codes[i], codes[j]);
    }
    ck_assert_str_eq(dlock_err_name(DLOCK_EBUSY), "DLOCK_EBUSY");
    ck_assert_str_eq(dlock_strerror(12345), "unknown error");
    ck_assert_uint_eq(dlock_version_number(), DLOCK_VERSION_NUMBER);
    ck_assert_ptr_nonnull(strchr(dlock_version(), '.'));
}

/* ---------------------------------------------------------------- URLs */

static void expect_bad_url(const char *u, int code, const char *needle)
{
    dlock_client *c = (dlock_client *)1;
    int rc = dlock_open(u, &c);
    ck_assert_msg(rc == code, "%s: got %s (%s), want %s", u, dlock_err_name(rc), dlock_errmsg(),
                  dlock_err_name(code));
    ck_assert_ptr_null(c);
    ck_assert_msg(strstr(dlock_errmsg(), needle), "%s: message '%s' lacks '%s'", u,
                  dlock_errmsg(), needle);
}

/* Options the file backend has no use for (no server, no layouts) are
 * refused naming the option and the backend, as redis, etcd and zk
 * refuse theirs: file:///dir?layout=fair is not quietly a plain lock. */
TU_TEST(urls_unused_options_refused, 60)
{
    static const char *const unused[] = {"layout=fair", "tls_ca=/etc/ssl/ca.pem",
                                         "tls_cert=/c.pem", "tls_key=/k.pem", "user=u",
                                         "password=p"};
    for (size_t i = 0; i < sizeof unused / sizeof *unused; i++) {
        char bad[128], key[32];
        snprintf(bad, sizeof bad, "file:///tmp?%s", unused[i]);
        snprintf(key, sizeof key, "'%.*s'", (int)strcspn(unused[i], "="), unused[i]);
        expect_bad_url(bad, DLOCK_EBADURL, key);
        ck_assert_msg(strstr(dlock_errmsg(), "file backend"), "%s: '%s' names no backend", bad,
                      dlock_errmsg());
    }
}

TU_TEST(urls, 60)
{
    expect_bad_url("nosuch://x", DLOCK_EBADURL, "nosuch");
    expect_bad_url("just-a-word", DLOCK_EBADURL, "scheme");
    expect_bad_url("redis://host:0", DLOCK_EBADURL, "port");
    expect_bad_url("redis://host:99999", DLOCK_EBADURL, "99999");
    expect_bad_url("redis://host:12ab", DLOCK_EBADURL, "12ab");
    expect_bad_url("redis://[::1", DLOCK_EBADURL, "]");
    expect_bad_url("redis://a,,b", DLOCK_EBADURL, "empty host");
    expect_bad_url("file://", DLOCK_EBADURL, "directory");
    expect_bad_url("file:///", DLOCK_EBADURL, "directory");
    expect_bad_url("file://otherhost/tmp", DLOCK_EBADURL, "otherhost");
    expect_bad_url("file:///tmp?lease=soon", DLOCK_EBADURL, "lease=soon");
    expect_bad_url("file:///tmp?color=blue", DLOCK_EBADURL, "color");
    expect_bad_url("file:///tmp?novalue", DLOCK_EBADURL, "option 1 is not key=value");
    expect_bad_url("file:///tm%zzp", DLOCK_EBADURL, "escape");
    expect_bad_url("file:///definitely/not/here", DLOCK_ENOENT, "/definitely/not/here");
}

TU_TEST(url_options, 60)
{
    dlock_client *c;
    ck_assert_int_eq(dlock_client_new("file:///tmp?lease=10s&timeout=250ms", &c), DLOCK_OK);
    ck_assert_str_eq(dlock_client_backend(c), "file");
    ck_assert_int_eq(dlock_client_setopt_int(c, DLOCK_OPT_LEASE_MS, -5), DLOCK_EINVAL);
    ck_assert_int_eq(dlock_client_setopt_str(c, DLOCK_OPT_LEASE_MS, "x"), DLOCK_EINVAL);
    ck_assert_int_eq(dlock_client_setopt_str(c, DLOCK_OPT_KEY_PREFIX, "app/"), DLOCK_OK);
    dlock_client_close(c);
#ifdef DLOCK_HAVE_REDIS
    ck_assert_int_eq(dlock_client_new("redis://bob:s3cret@h1:7000/2?password=also", &c), DLOCK_OK);
    ck_assert_ptr_null(strstr(dlock_client_url(c), "s3cret"));
    ck_assert_ptr_null(strstr(dlock_client_url(c), "also"));
    ck_assert_ptr_nonnull(strstr(dlock_client_url(c), "bob@h1:7000/2"));
    dlock_client_close(c);
#endif
    dlock_client_close(NULL); /* harmless */
}

static char *default_url(void)
{
    dlock_client *c;
    ck_assert_msg(dlock_client_new(NULL, &c) == DLOCK_OK, "%s", dlock_errmsg());
    char *u = strdup(dlock_client_url(c));
    dlock_client_close(c);
    return u;
}

static void write_proc(const char *path, const char *text)
{
    int fd = open(path, O_WRONLY);
    ck_assert_msg(fd >= 0 && write(fd, text, strlen(text)) == (ssize_t)strlen(text), "%s: %s",
                  path, strerror(errno));
    close(fd);
}

/* A private mount namespace with empty tmpfs on /run and /var/tmp,
 * where the default directory's cases are made.
 * Not as root, the test is a user namespace's root: the mounts are the
 * user's (the real root's directories show as the overflow uid there). */
static void private_run(void)
{
    unsigned uid = (unsigned)getuid();
    gid_t gid = getgid();
    if (uid == 0) {
        ck_assert_msg(unshare(CLONE_NEWNS) == 0, "unshare: %s", strerror(errno));
    } else {
        ck_assert_msg(unshare(CLONE_NEWUSER | CLONE_NEWNS) == 0, "unshare: %s", strerror(errno));
        char map[64];
        snprintf(map, sizeof map, "%u %u 1", uid, uid);
        write_proc("/proc/self/uid_map", map);
        write_proc("/proc/self/setgroups", "deny");
        snprintf(map, sizeof map, "%u %u 1", (unsigned)gid, (unsigned)gid);
        write_proc("/proc/self/gid_map", map);
    }
    ck_assert_int_eq(mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL), 0);
    ck_assert_msg(mount("tmpfs", "/run", "tmpfs", 0, "mode=0755") == 0, "mount: %s",
                  strerror(errno));
    ck_assert_msg(mount("tmpfs", "/var/tmp", "tmpfs", 0, "mode=1777") == 0, "mount: %s",
                  strerror(errno));
}

/* The default directory is one place per user whatever the session: a
 * login shell's XDG_RUNTIME_DIR and logind's /run/user/<uid> (deleted at
 * the last logout) change nothing, so a cron job and the same job from a
 * shell exclude each other. /run/lock/dlock-<uid> when /run/lock is a
 * sticky world-writable directory (or one only we may write, as root);
 * else /var/tmp/dlock-<uid>. */
TU_TEST(default_dir_choice, 60)
{
    unsigned uid = (unsigned)geteuid();
    private_run();
    unsetenv("DLOCK_URL");
    char *var_tmp = tu_fmt("file:///var/tmp/dlock-%u", uid);
    char *run_lock = tu_fmt("file:///run/lock/dlock-%u", uid);
    unsetenv("XDG_RUNTIME_DIR");
    char *u = default_url();
    ck_assert_str_eq(u, var_tmp); /* no /run/lock */
    free(u);
    ck_assert_int_eq(mkdir("/run/lock", 0777), 0);
    chmod("/run/lock", 0777);
    u = default_url();
    ck_assert_str_eq(u, var_tmp); /* not sticky: anyone could swap our directory */
    free(u);
    chmod("/run/lock", 01777);
    u = default_url();
    ck_assert_str_eq(u, run_lock);
    free(u);
    /* The session's directories change nothing. */
    char *xdg = tu_fmt("%s/xdg", dir);
    ck_assert_int_eq(mkdir(xdg, 0700), 0);
    setenv("XDG_RUNTIME_DIR", xdg, 1);
    u = default_url();
    ck_assert_str_eq(u, run_lock);
    free(u);
    char *rundir = tu_fmt("/run/user/%u", uid);
    ck_assert_int_eq(mkdir("/run/user", 0755), 0);
    ck_assert_int_eq(mkdir(rundir, 0700), 0);
    unsetenv("XDG_RUNTIME_DIR");
    u = default_url();
    ck_assert_str_eq(u, run_lock);
    free(u);
    /* It is made on first use, private to us, with private lock files. */
    dlock_client *c;
    ck_assert_msg(dlock_open(NULL, &c) == DLOCK_OK, "%s", dlock_errmsg());
    dlock_lock *l = tu_lock_mode(c, "x", DLOCK_EXCLUSIVE, 0);
    ck_assert_int_eq(dlock_acquire(l, DLOCK_TRY), DLOCK_OK);
    dlock_lock_free(l);
    dlock_client_close(c);
    struct stat st;
    char *made = tu_fmt("/run/lock/dlock-%u/x.lock", uid);
    ck_assert_int_eq(stat(made, &st), 0);
    ck_assert_uint_eq(st.st_mode & 0777, 0600);
    free(made);
    made = tu_fmt("/run/lock/dlock-%u", uid);
    ck_assert_int_eq(stat(made, &st), 0);
    ck_assert_uint_eq(st.st_mode & 0777, 0700);
    /* The command line: a holder started with XDG_RUNTIME_DIR set keeps a
     * run without it out (issue 22's reproduction). */
    char *marker = tu_fmt("%s/held", dir), *cmd = tu_fmt("touch %s; exec sleep 60", marker);
    setenv("XDG_RUNTIME_DIR", xdg, 1);
    const char *hold[] = {tu_dlock_bin(), "run", "nightly", "-c", cmd, NULL};
    pid_t h = tu_spawn(hold, NULL);
    unsetenv("XDG_RUNTIME_DIR");
    ck_assert_msg(tu_wait_file(marker, 30000), "the holder never ran");
    const char *again[] = {"run", "-n", "nightly", "true", NULL};
    ck_assert_int_eq(tu_dlock(NULL, NULL, NULL, again), 1);
    tu_stop(h, 2000);
    /* As root, a /run/lock only root may write (Fedora, Arch: 0755) is
     * root's to use. */
    if (uid == 0) {
        ck_assert_int_eq(rename(made, "/run/old-lock-dir"), 0);
        chmod("/run/lock", 0755);
        u = default_url();
        ck_assert_str_eq(u, run_lock);
        free(u);
    }
    free(cmd);
    free(marker);
    free(made);
    free(rundir);
    free(xdg);
    free(run_lock);
    free(var_tmp);
}

/* A directory of ours in PARENT named NAME, as another user (65534) made
 * it to squat the name. */
static void squat(const char *parent, const char *name)
{
    char *path = tu_fmt("%s/%s", parent, name);
    ck_assert_int_eq(mkdir(path, 0755), 0);
    ck_assert_int_eq(chown(path, 65534, 65534), 0);
    free(path);
}

/* Another local user who makes /run/lock/dlock-<uid> first (anyone may
 * write in /run/lock) does not lock that user out: the default moves to
 * the first free fallback name, dlock-<uid>.1 (.2, ... .7), and stays on
 * the highest one of ours even once the squatter removes its directory
 * (or the user's processes would part ways). With every name squatted,
 * the message names them and says how to recover. Needs root (to make a
 * directory owned by another user). */
TU_TEST(default_dir_squatted, 60)
{
    ck_assert_msg(getuid() == 0, "this test needs root (to squat a directory as nobody)");
    private_run();
    unsetenv("XDG_RUNTIME_DIR");
    unsetenv("DLOCK_URL");
    ck_assert_int_eq(mkdir("/run/lock", 01777), 0);
    chmod("/run/lock", 01777);
    squat("/run/lock", "dlock-0");
    char *u = default_url();
    ck_assert_str_eq(u, "file:///run/lock/dlock-0.1");
    free(u);
    dlock_client *c;
    ck_assert_msg(dlock_open(NULL, &c) == DLOCK_OK, "%s", dlock_errmsg());
    dlock_lock *l = tu_lock_mode(c, "x", DLOCK_EXCLUSIVE, 0);
    tu_acquire_release(l, DLOCK_TRY);
    dlock_lock_free(l);
    dlock_client_close(c);
    struct stat st;
    ck_assert_int_eq(stat("/run/lock/dlock-0.1/x.lock", &st), 0);
    ck_assert_int_eq(lstat("/run/lock/dlock-0.1", &st), 0);
    ck_assert_uint_eq(st.st_uid, 0);
    ck_assert_uint_eq(st.st_mode & 0777, 0700);
    /* The squatter gives up its name: we stay where our locks are. */
    ck_assert_int_eq(rmdir("/run/lock/dlock-0"), 0);
    u = default_url();
    ck_assert_str_eq(u, "file:///run/lock/dlock-0.1");
    free(u);
    /* A symlink squatting a name is skipped too, never followed. */
    ck_assert_int_eq(rename("/run/lock/dlock-0.1", "/run/old-0.1"), 0);
    ck_assert_int_eq(symlink("/run/old-0.1", "/run/lock/dlock-0"), 0);
    ck_assert_int_eq(lchown("/run/lock/dlock-0", 65534, 65534), 0);
    u = default_url();
    ck_assert_str_eq(u, "file:///run/lock/dlock-0.1");
    free(u);
    /* Every name squatted: refused, naming them and the way out. */
    for (int i = 1; i <= 7; i++) {
        char *name = tu_fmt("dlock-0.%d", i);
        squat("/run/lock", name);
        free(name);
    }
    c = (dlock_client *)1;
    ck_assert_int_eq(dlock_open(NULL, &c), DLOCK_EACCES);
    ck_assert_ptr_null(c);
    const char *msg = dlock_errmsg();
    ck_assert_msg(strstr(msg, "/run/lock/dlock-0") && strstr(msg, "dlock-0.7") &&
                      strstr(msg, "uid 65534") && strstr(msg, "DLOCK_URL"),
                  "%s", msg);
    char *err = NULL;
    const char *run[] = {"run", "x", "true", NULL};
    ck_assert_int_eq(tu_dlock(NULL, &err, NULL, run), 77);
    ck_assert_msg(strstr(err, "/run/lock/dlock-0"), "%s", err);
    free(err);
}

TU_TEST(unwritable_dir, 60)
{
    /* Root writes anywhere, so drop to nobody in this (forked) test. */
    chmod(dir, 0755);
    char *ro = tu_fmt("%s/ro", dir);
    mkdir(ro, 0555);
    if (getuid() == 0)
        ck_assert_int_eq(setuid(65534), 0);
    char *u = tu_fmt("file://%s", ro);
    dlock_client *c;
    int rc = dlock_open(u, &c);
    ck_assert_msg(rc == DLOCK_EACCES, "got %s: %s", dlock_err_name(rc), dlock_errmsg());
    ck_assert_ptr_nonnull(strstr(dlock_errmsg(), ro));
    free(u);
    free(ro);
}

/* ----------------------------------------------------- basic contract */

/* 8 processes x 200 increments of a counter file under the lock. */
TU_TEST(exclusion_8x200, 60)
{
    char *counter = tu_fmt("%s/counter", dir);
    tu_write_file(counter, "0\n");
    pid_t kids[8];
    for (int k = 0; k < 8; k++) {
        if ((kids[k] = fork()) == 0) {
            dlock_client *c = tu_open(url);
            dlock_lock *l = tu_lock_mode(c, "counter", DLOCK_EXCLUSIVE, 0);
            uint64_t last = 0;
            for (int i = 0; i < 200; i++) {
                if (dlock_acquire(l, DLOCK_FOREVER))
                    _exit(3);
                uint64_t tok;
                dlock_token(l, &tok);
                if (tok <= last)
                    _exit(4); /* tokens must grow */
                last = tok;
                FILE *g = fopen(counter, "r+");
                long n = 0;
                if (fscanf(g, "%ld", &n) != 1)
                    _exit(5);
                rewind(g);
                fprintf(g, "%ld\n", n + 1);
                fclose(g);
                dlock_release(l);
            }
            dlock_lock_free(l);
            dlock_client_close(c);
            _exit(0);
        }
    }
    for (int k = 0; k < 8; k++) {
        int st;
        waitpid(kids[k], &st, 0);
        ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "worker %d failed: %d", k, st);
    }
    char *text = tu_read_file(counter);
    ck_assert_str_eq(text, "1600\n");
    /* Every acquisition issued one token: the next is 1601. */
    dlock_client *c = tu_open(url);
    dlock_lock *l = tu_lock_mode(c, "counter", DLOCK_EXCLUSIVE, 0);
    uint64_t tok;
    ck_assert_int_eq(dlock_acquire(l, DLOCK_TRY), DLOCK_OK);
    dlock_token(l, &tok);
    ck_assert_uint_eq(tok, 1601);
    dlock_release(l);
    dlock_lock_free(l);
    dlock_client_close(c);
    free(text);
    free(counter);
}

/* ------------------------------------------------------------ names */

static size_t count_entries(const char *path)
{
    DIR *d = opendir(path);
    size_t n = 0;
    struct dirent *de;
    while ((de = readdir(d)))
        if (strcmp(de->d_name, ".") && strcmp(de->d_name, ".."))
            n++;
    closedir(d);
    return n;
}

TU_TEST(hostile_names, 60)
{
    char *lockdir = tu_fmt("%s/locks", dir);
    mkdir(lockdir, 0700);
    char *u = tu_fmt("file://%s", lockdir);
    dlock_client *c;
    ck_assert_int_eq(dlock_open(u, &c), DLOCK_OK);
    char longa[DLOCK_NAME_MAX + 1], longb[DLOCK_NAME_MAX + 1], toolong[DLOCK_NAME_MAX + 2];
    memset(longa, 'a', DLOCK_NAME_MAX);
    longa[DLOCK_NAME_MAX] = 0;
    memcpy(longb, longa, sizeof longa);
    longb[DLOCK_NAME_MAX - 1] = 'b'; /* differs only at the very end */
    memset(toolong, 'x', sizeof toolong - 1);
    toolong[sizeof toolong - 1] = 0;
    const char *names[] = {"../escape", "/", "..", ".", "a/b", "a%2Fb", "%", "\xff\xfe\x01",
                           "sp ace", ".hidden", "x.lock", "x", longa, longb, "\n", "~"};
    size_t n = sizeof names / sizeof *names;
    dlock_lock *locks[sizeof names / sizeof *names];
    for (size_t i = 0; i < n; i++) {
        locks[i] = tu_lock_mode(c, names[i], DLOCK_EXCLUSIVE, 0);
        /* All held at once by one thread: distinct names never collide. */
        int rc = dlock_acquire(locks[i], DLOCK_TRY);
        ck_assert_msg(rc == DLOCK_OK, "name %zu: %s", i, dlock_errmsg());
    }
    /* Exactly one regular file per name, all inside the directory. */
    ck_assert_uint_eq(count_entries(lockdir), n);
    ck_assert_uint_eq(count_entries(dir), 1); /* only locks/: nothing escaped */
    DIR *d = opendir(lockdir);
    struct dirent *de;
    while ((de = readdir(d)))
        if (de->d_name[0] != '.' || de->d_name[1] == 0 || strcmp(de->d_name, "..") == 0)
            continue;
        else
            ck_abort_msg("hidden file %s", de->d_name);
    closedir(d);
    /* A second client sees each as busy, and list() gives names back. */
    dlock_client *c2;
    ck_assert_int_eq(dlock_open(u, &c2), DLOCK_OK);
    for (size_t i = 0; i < n; i++) {
        dlock_lock *o = tu_lock_mode(c2, names[i], DLOCK_EXCLUSIVE, 0);
        ck_assert_int_eq(dlock_acquire(o, DLOCK_TRY), DLOCK_EBUSY);
        dlock_lock_free(o);
    }
    dlock_lock *bad;
    ck_assert_int_eq(dlock_lock_new(c, "", DLOCK_EXCLUSIVE, 0, &bad), DLOCK_EINVAL);
    ck_assert_int_eq(dlock_lock_new(c, toolong, DLOCK_EXCLUSIVE, 0, &bad), DLOCK_EINVAL);
    ck_assert_ptr_nonnull(strstr(dlock_errmsg(), "longer than"));
    ck_assert_int_eq(dlock_lock_new(c, NULL, DLOCK_EXCLUSIVE, 0, &bad), DLOCK_EINVAL);
    tu_release_free_all(locks, n);
    TU_CLOSE_CLIENTS(c2, c);
    free(u);
    free(lockdir);
}

/* The file names of existing lock files must never change (a renamed
 * file is a new lock with a new token counter): a few encodings pinned,
 * including the hashed form and where it cuts an escape. */
TU_TEST(pinned_names, 60)
{
    char a198[199], a199[200], a99s[230], a98s[230];
    memset(a198, 'a', 198);
    a198[198] = 0;
    memset(a199, 'a', 199);
    a199[199] = 0;
    memset(a99s, 'a', 99);
    a99s[99] = '/';
    memset(a99s + 100, 'b', 120);
    a99s[220] = 0;
    memcpy(a98s, a99s + 1, sizeof a98s - 1); /* 98 a's, '/', 120 b's */
    char *a198f = tu_fmt("%s.lock", a198);
    char *hashed99 = tu_fmt("#%.99s~", a99s);
    char *hashed100 = tu_fmt("#%.100s~", a199);
    char *hashed98 = tu_fmt("#%.98s~", a98s);
    struct {
        const char *name, *file; /* file: the whole name, or a prefix of a hashed one */
    } pins[] = {
        {"../escape", "%2E.%2Fescape.lock"},
        {"..", "%2E..lock"},
        {".", "%2E.lock"},
        {".hidden", "%2Ehidden.lock"},
        {"a.b..c", "a.b..c.lock"},
        {"/", "%2F.lock"},
        {"sp ace~#", "sp%20ace%7E%23.lock"},
        {"\xff\n", "%FF%0A.lock"},
        {"Az09_-", "Az09_-.lock"},
        {a198, a198f},
        {a199, hashed100},
        {a99s, hashed99},  /* "%2F" would straddle byte 100: cut before it */
        {a98s, hashed98},
    };
    char *lockdir = tu_fmt("%s/pins", dir);
    mkdir(lockdir, 0700);
    char *u = tu_fmt("file://%s", lockdir);
    dlock_client *c;
    ck_assert_int_eq(dlock_open(u, &c), DLOCK_OK);
    for (size_t i = 0; i < sizeof pins / sizeof *pins; i++) {
        dlock_lock *l = tu_lock_mode(c, pins[i].name, DLOCK_EXCLUSIVE, 0);
        tu_acquire_release(l, DLOCK_TRY);
        dlock_lock_free(l);
        bool hashed = pins[i].file[0] == '#';
        size_t found = 0;
        DIR *d = opendir(lockdir);
        struct dirent *de;
        while ((de = readdir(d))) {
            if (de->d_name[0] == '.' &&
                (de->d_name[1] == 0 || strcmp(de->d_name, "..") == 0))
                continue;
            found++;
            if (hashed)
                ck_assert_msg(strncmp(de->d_name, pins[i].file, strlen(pins[i].file)) == 0 &&
                                  strlen(de->d_name) ==
                                      strlen(pins[i].file) + 32 + strlen(".lock"),
                              "pin %zu: %s is not %s<hash>.lock", i, de->d_name, pins[i].file);
            else
                ck_assert_msg(strcmp(de->d_name, pins[i].file) == 0, "pin %zu: %s, want %s", i,
                              de->d_name, pins[i].file);
            unlinkat(dirfd(d), de->d_name, 0);
        }
        closedir(d);
        ck_assert_uint_eq(found, 1);
    }
    /* With a key prefix, the prefix is part of the encoded name. */
    dlock_client *cp;
    ck_assert_int_eq(dlock_client_new(u, &cp), DLOCK_OK);
    ck_assert_int_eq(dlock_client_setopt_str(cp, DLOCK_OPT_KEY_PREFIX, "app/"), DLOCK_OK);
    ck_assert_int_eq(dlock_client_connect(cp), DLOCK_OK);
    dlock_lock *l = tu_lock_mode(cp, ".x", DLOCK_EXCLUSIVE, 0);
    ck_assert_int_eq(dlock_acquire(l, DLOCK_TRY), DLOCK_OK);
    dlock_lock_free(l);
    char *want = tu_fmt("%s/app%%2F.x.lock", lockdir);
    struct stat st;
    ck_assert_msg(stat(want, &st) == 0, "%s missing", want);
    TU_CLOSE_CLIENTS(cp, c);
    free(want);
    free(u);
    free(lockdir);
    free(hashed100);
    free(hashed99);
    free(hashed98);
    free(a198f);
}

TU_TEST(foreign_file, 60)
{
    char *path = tu_fmt("%s/config.lock", dir);
    tu_write_file(path, "this is somebody's data, not a lock\n");
    dlock_client *c = tu_open(url);
    dlock_lock *l = tu_lock_mode(c, "config", DLOCK_EXCLUSIVE, 0);
    ck_assert_int_eq(dlock_acquire(l, DLOCK_TRY), DLOCK_EWRONGTYPE);
    ck_assert_ptr_nonnull(strstr(dlock_errmsg(), "config.lock"));
    ck_assert_uint_eq(dlock_hold_count(l), 0);
    char *text = tu_read_file(path);
    ck_assert_str_eq(text, "this is somebody's data, not a lock\n");
    /* And it was not left locked either. */
    dlock_client *c2 = tu_open(url);
    dlock_lock *l2 = tu_lock_mode(c2, "config", DLOCK_EXCLUSIVE, 0);
    ck_assert_int_eq(dlock_acquire(l2, DLOCK_TRY), DLOCK_EWRONGTYPE);
    dlock_lock_free(l2);
    dlock_client_close(c2);
    free(text);
    dlock_lock_free(l);
    dlock_client_close(c);
    free(path);
}

TU_TEST(fifo_replaced, 60)
{
    /* A FIFO where a lock file would be: refused, never hangs, and never
     * disturbs another lock's descriptor. */
    char *fifo = tu_fmt("%s/pipe.lock", dir);
    ck_assert_int_eq(mkfifo(fifo, 0600), 0);
    dlock_client *c = tu_open(url);
    dlock_lock *a = tu_lock_mode(c, "a", DLOCK_EXCLUSIVE, 0);
    dlock_lock *p = tu_lock_mode(c, "pipe", DLOCK_EXCLUSIVE, 0);
    ck_assert_int_eq(dlock_acquire(a, DLOCK_TRY), DLOCK_OK);
    for (int i = 0; i < 50; i++)
        ck_assert_int_eq(dlock_acquire(p, DLOCK_TRY), DLOCK_EWRONGTYPE);
    ck_assert_ptr_nonnull(strstr(dlock_errmsg(), "pipe.lock"));
    char *names = tu_list_text(c, NULL, "|");
    ck_assert_str_eq(names, "a|");
    free(names);
    dlock_client *c2 = tu_open(url);
    dlock_lock *a2 = tu_lock_mode(c2, "a", DLOCK_EXCLUSIVE, 0);
    ck_assert_int_eq(dlock_acquire(a2, DLOCK_TRY), DLOCK_EBUSY); /* still ours */
    ck_assert_int_eq(dlock_release(a), DLOCK_OK);
    /* A lock file moved away while held: the name maps to a fresh file,
     * which a new owner can take (why docs say never to move or delete
     * lock files in use); the old holder still releases cleanly. */
    char *path = tu_fmt("%s/a.lock", dir), *moved = tu_fmt("%s/old-a", dir);
    ck_assert_int_eq(dlock_acquire(a, DLOCK_TRY), DLOCK_OK);
    ck_assert_int_eq(rename(path, moved), 0);
    tu_acquire_release(a2, DLOCK_TRY);
    ck_assert_int_eq(dlock_release(a), DLOCK_OK);
    dlock_lock_free(a2);
    dlock_client_close(c2);
    TU_FREE_LOCKS(p, a);
    dlock_client_close(c);
    free(moved);
    free(path);
    free(fifo);
}

TU_TEST(lease_two_handles, 60)
{
    dlock_client *c = tu_open(url);
    dlock_lock *l1 = tu_lock_mode(c, "two", DLOCK_EXCLUSIVE, 0);
    dlock_lock *l2 = tu_lock_mode(c, "two", DLOCK_EXCLUSIVE, 0);
    /* At or under the drift margin, or over a year: refused. */
    ck_assert_int_eq(dlock_lock_set_lease(l1, 250, 0), DLOCK_EINVAL);
    ck_assert_ptr_nonnull(strstr(dlock_errmsg(), "drift"));
    ck_assert_int_eq(dlock_lock_set_lease(l1, INT64_MAX, 0), DLOCK_EINVAL);
    ck_assert_int_eq(dlock_lock_set_lease(l1, 5000, 8), DLOCK_EINVAL);
    ck_assert_int_eq(dlock_lock_set_lease(l1, 5000, DLOCK_LEASE_FIXED), DLOCK_OK);
    /* Freeing one of two handles keeps a hold re-entered through the other. */
    ck_assert_int_eq(dlock_acquire(l1, DLOCK_TRY), DLOCK_OK);
    ck_assert_int_eq(dlock_acquire(l2, DLOCK_TRY), DLOCK_OK);
    dlock_lock_free(l1);
    ck_assert_uint_eq(dlock_hold_count(l2), 2);
    dlock_client *c2 = tu_open(url);
    dlock_lock *o = tu_lock_mode(c2, "two", DLOCK_EXCLUSIVE, 0);
    ck_assert_int_eq(dlock_acquire(o, DLOCK_TRY), DLOCK_EBUSY);
    ck_assert_int_eq(dlock_release(l2), DLOCK_OK);
    ck_assert_int_eq(dlock_release(l2), DLOCK_OK);
    ck_assert_int_eq(dlock_acquire(o, DLOCK_TRY), DLOCK_OK);
    dlock_lock_free(o);
    dlock_client_close(c2);
    dlock_lock_free(l2);
    dlock_client_close(c);
}

/* A child after fork() does not use the idle cancel eventfds it
 * inherited (copies share the parent's counter): the child's canceled
 * wait leaves the parent's wait, made meanwhile on such an eventfd, to
 * time out. */
TU_TEST(fork_child_cancel_not_the_parents, 60)
{
    dlock_client *c = tu_open(url), *c2 = tu_open(url);
    dlock_lock *held = tu_lock(c, "forkcancel"), *l = tu_lock(c2, "forkcancel");
    ck_assert_int_eq(dlock_acquire(held, DLOCK_TRY), DLOCK_OK);
    ck_assert_int_eq(dlock_acquire(l, 50), DLOCK_ETIMEDOUT); /* its eventfd now idle */
    pid_t pid = tu_fork();
    if (pid == 0) {
        tu_sleep_ms(300); /* the parent's wait below has begun */
        dlock_client *cc = tu_open(url);
        dlock_lock *cl = tu_lock(cc, "forkcancel");
        struct tu_waiter w;
        tu_waiter_start(&w, cl, DLOCK_FOREVER);
        tu_waiter_cancel_until_returned(&w);
        _exit(w.rc == DLOCK_ECANCELED ? 0 : 1);
    }
    int rc = dlock_acquire(l, 3000);
    ck_assert_int_eq(tu_wait_exit(pid), 0);
    ck_assert_msg(rc == DLOCK_ETIMEDOUT, "the parent's wait: %s (%s)", dlock_err_name(rc),
                  dlock_errmsg());
    ck_assert_int_eq(dlock_release(held), DLOCK_OK);
    dlock_lock_free(l);
    dlock_lock_free(held);
    dlock_client_close(c2);
    dlock_client_close(c);
}

/* Whether NAME.waiting in the lock directory names a waiter: any slot
 * with an id (a byte not zero). */
static bool waiting_file_names_one(const char *name)
{
    char *path = tu_fmt("%s/%s.waiting", dir, name), buf[64 * 128];
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    free(path);
    ssize_t n = fd >= 0 ? pread(fd, buf, sizeof buf, 0) : 0;
    if (fd >= 0)
        close(fd);
    for (ssize_t i = 0; i < n; i++)
        if (buf[i])
            return true;
    return false;
}

static void contended_count(dlock_lock *l, const char *who, void *arg)
{
    (void)l, (void)who;
    atomic_fetch_add((atomic_int *)arg, 1);
}

/* A hold taken after a wait keeps its wait's slot in NAME.waiting until
 * the release, emptied as the acquire returns: no holder is told of a
 * waiter that holds, this one not of itself; the next waiter is told. */
TU_TEST(contended_after_waiting, 60)
{
    dlock_client *a = tu_open(url), *b = tu_open(url), *c = tu_open(url);
    dlock_lock *la = tu_lock(a, "cw"), *lb = NULL, *lc = tu_lock(c, "cw");
    ck_assert_int_eq(dlock_lock_new(b, "cw", DLOCK_EXCLUSIVE, DLOCK_LOCK_HANDLE_OWNED, &lb),
                     DLOCK_OK); /* taken in a thread, released here */
    atomic_int calls = 0;
    ck_assert_int_eq(dlock_lock_on_contended(lb, contended_count, &calls), DLOCK_OK);
    ck_assert_int_eq(dlock_acquire(la, DLOCK_TRY), DLOCK_OK);
    struct tu_waiter wb, wc;
    tu_waiter_start_ex(&wb, lb, DLOCK_FOREVER, NULL, true);
    for (int k = 0; k < 3000 && !waiting_file_names_one("cw"); k++)
        tu_sleep_ms(10);
    ck_assert_msg(waiting_file_names_one("cw"), "the waiter never announced itself");
    ck_assert_int_eq(dlock_release(la), DLOCK_OK);
    ck_assert_int_eq(tu_waiter_join(&wb), DLOCK_OK);
    ck_assert_msg(!waiting_file_names_one("cw"), "a slot still names the waiter that holds");
    tu_waiter_start(&wc, lc, DLOCK_FOREVER);
    for (int k = 0; k < 3000 && atomic_load(&calls) < 1; k++)
        tu_sleep_ms(10);
    ck_assert_int_eq(dlock_release(lb), DLOCK_OK);
    ck_assert_int_eq(tu_waiter_join(&wc), DLOCK_OK);
    ck_assert_int_eq(atomic_load(&calls), 1);
    dlock_lock_free(lc);
    dlock_lock_free(lb);
    dlock_lock_free(la);
    dlock_client_close(c);
    dlock_client_close(b);
    dlock_client_close(a);
}

TU_TEST(no_password, 60)
{
    dlock_client *c;
    const char *urls[] = {"redis://admin:s3cret@host:99999", "file://u:s3cret@x@localhost/tmp",
                          "file:///nowhere?pass%77ord=s3cret", "file:///tmp?password=s3cret&k=v"};
    for (size_t i = 0; i < sizeof urls / sizeof *urls; i++) {
        int rc = dlock_open(urls[i], &c);
        if (rc == DLOCK_OK) {
            ck_assert_ptr_null(strstr(dlock_client_url(c), "s3cret"));
            dlock_client_close(c);
        } else {
            ck_assert_msg(!strstr(dlock_errmsg(), "s3cret"), "%s", dlock_errmsg());
        }
    }
}

TU_TEST(no_inotify, 60)
{
    /* A user out of inotify instances still waits and wakes (backoff
     * retries) instead of failing. The limit is per user: become one
     * that nothing else on the machine runs as. */
    chmod(dir, 0777);
    if (getuid() == 0)
        ck_assert_int_eq(setuid(65534), 0);
    char *marker = tu_fmt("%s/held", dir);
    pid_t holder = fork();
    if (holder == 0) {
        dlock_client *c = tu_open(url);
        dlock_lock *l = tu_lock_mode(c, "noinotify", DLOCK_EXCLUSIVE, 0);
        if (dlock_acquire(l, DLOCK_TRY))
            _exit(2);
        close(open(marker, O_CREAT | O_WRONLY, 0644));
        pause();
        _exit(0);
    }
    ck_assert(tu_wait_file(marker, 10000));
    int n = 0;
    while (n < 100000 && inotify_init1(IN_CLOEXEC) >= 0)
        n++;
    ck_assert_msg(errno == EMFILE || errno == ENFILE, "inotify_init1: %s", strerror(errno));
    dlock_client *c = tu_open(url);
    dlock_lock *l = tu_lock_mode(c, "noinotify", DLOCK_EXCLUSIVE, 0);
    ck_assert_int_eq(dlock_acquire(l, 150), DLOCK_ETIMEDOUT);
    kill(holder, SIGKILL);
    waitpid(holder, NULL, 0);
    tu_acquire_release(l, DLOCK_FOREVER);
    dlock_lock_free(l);
    dlock_client_close(c);
    free(marker);
}

/* ------------------------------------------------------ permissions */

static mode_t file_mode_of(const char *path)
{
    struct stat st;
    ck_assert_msg(stat(path, &st) == 0, "%s: %s", path, strerror(errno));
    return st.st_mode & 07777;
}

static void lock_once(const char *u, const char *name)
{
    dlock_client *c;
    ck_assert_msg(dlock_open(u, &c) == DLOCK_OK, "%s", dlock_errmsg());
    dlock_lock *l = tu_lock_mode(c, name, DLOCK_EXCLUSIVE, 0);
    ck_assert_msg(dlock_acquire(l, DLOCK_TRY) == DLOCK_OK, "%s", dlock_errmsg());
    ck_assert_int_eq(dlock_release(l), DLOCK_OK);
    dlock_lock_free(l);
    dlock_client_close(c);
}

/* Whoever can open a lock file can lock it: lock files are 0600 whatever
 * the umask, 0660 with the directory's group in a group-shared directory,
 * and an old 0644 file of ours is narrowed. */
TU_TEST(file_modes, 60)
{
    umask(0);
    lock_once(url, "private");
    char *path = tu_fmt("%s/private.lock", dir);
    ck_assert_uint_eq(file_mode_of(path), 0600);
    chmod(path, 0644); /* as dlock made them before */
    lock_once(url, "private");
    ck_assert_uint_eq(file_mode_of(path), 0600);

    char *shared = tu_fmt("%s/team", dir);
    ck_assert_int_eq(mkdir(shared, 0770), 0);
    gid_t team = getgid() == 65534 ? 100 : 65534;
    if (getuid() == 0)
        ck_assert_int_eq(chown(shared, (uid_t)-1, team), 0);
    else
        team = getgid(); /* a user can only give its own groups */
    chmod(shared, 0770);
    char *su = tu_fmt("file://%s", shared);
    lock_once(su, "job");
    char *spath = tu_fmt("%s/job.lock", shared);
    struct stat st;
    ck_assert_int_eq(stat(spath, &st), 0);
    ck_assert_uint_eq(st.st_mode & 0777, 0660);
    ck_assert_uint_eq(st.st_gid, team);
    free(spath);
    free(su);
    free(shared);
    free(path);
}

/* As nobody: open DIR/NAME.lock read-only, take a read lock on BYTE,
 * create MARKER, and sleep until killed. */
static pid_t foreign_reader(const char *name, off_t byte, const char *marker)
{
    pid_t pid = fork();
    if (pid == 0) {
        if (getuid() == 0 && setuid(65534) < 0)
            _exit(2);
        char *path = tu_fmt("%s/%s.lock", dir, name);
        int fd = open(path, O_RDONLY);
        struct flock fl = {.l_type = F_RDLCK, .l_whence = SEEK_SET, .l_start = byte, .l_len = 1};
        if (fd < 0 || fcntl(fd, F_OFD_SETLK, &fl) < 0)
            _exit(3);
        close(open(marker, O_CREAT | O_WRONLY, 0666));
        pause();
        _exit(0);
    }
    return pid;
}

/* Another local user holding a read lock on the metadata byte of a file
 * it could read (made readable the way lock files were before): a shared
 * acquire is not hung by it -- a bounded one times out, a try-once one is
 * busy, an unbounded one is cancellable -- and inspect answers. */
TU_TEST(meta_byte_foreign, 60)
{
    chmod(dir, 0755);
    lock_once(url, "meta");
    char *path = tu_fmt("%s/meta.lock", dir), *marker = tu_fmt("%s/reading", dir);
    chmod(path, 0644);
    chmod(dir, 0777); /* for nobody's marker */
    pid_t reader = foreign_reader("meta", 1, marker);
    ck_assert_msg(tu_wait_file(marker, 10000), "the reader could not lock byte 1");
    dlock_client *c = tu_open(url);
    dlock_lock *l = tu_lock_mode(c, "meta", DLOCK_SHARED, 0);
    ck_assert_int_eq(dlock_acquire(l, 300), DLOCK_ETIMEDOUT);
    ck_assert_msg(strstr(dlock_errmsg(), "metadata"), "%s", dlock_errmsg());
    ck_assert_int_eq(dlock_acquire(l, DLOCK_TRY), DLOCK_EBUSY);
    struct tu_waiter t;
    tu_waiter_start(&t, l, DLOCK_FOREVER);
    tu_waiter_cancel_until_returned(&t);
    ck_assert_int_eq(t.rc, DLOCK_ECANCELED);
    ck_assert_uint_eq(dlock_hold_count(l), 0);
    /* inspect shares the byte with a reader; behind a writer it waits no
     * longer than the op timeout (an OFD lock of another open file
     * description of this process stands in for the writer). */
    char *short_url = tu_fmt("%s?timeout=200ms", url);
    dlock_client *ci;
    ck_assert_int_eq(dlock_open(short_url, &ci), DLOCK_OK);
    dlock_info *info;
    ck_assert_int_eq(dlock_inspect(ci, "meta", &info), DLOCK_OK);
    dlock_info_free(info);
    /* Nothing was left held: an exclusive acquire (which needs no
     * metadata lock) gets it. */
    dlock_lock *x = tu_lock_mode(c, "meta", DLOCK_EXCLUSIVE, 0);
    tu_acquire_release(x, DLOCK_TRY);
    dlock_lock_free(x);
    kill(reader, SIGKILL);
    waitpid(reader, NULL, 0);
    int wfd = open(path, O_RDWR);
    struct flock wl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 1, .l_len = 1};
    ck_assert_int_eq(fcntl(wfd, F_OFD_SETLK, &wl), 0);
    ck_assert_int_eq(dlock_inspect(ci, "meta", &info), DLOCK_ETIMEDOUT);
    ck_assert_msg(strstr(dlock_errmsg(), "metadata"), "%s", dlock_errmsg());
    close(wfd);
    dlock_client_close(ci);
    free(short_url);
    tu_acquire_release(l, DLOCK_FOREVER);
    dlock_lock_free(l);
    dlock_client_close(c);
    free(marker);
    free(path);
}

/* An observe of election NAME through C waiting forever with a cancel
 * object, in a thread of its own (value_file_foreign). */
struct observer {
    dlock_client *c;
    const char *name;
    dlock_cancel *cancel;
    atomic_int rc;
    atomic_long tid;
    pthread_t th;
};

static void *observer_main(void *arg)
{
    struct observer *o = arg;
    o->tid = syscall(SYS_gettid);
    dlock_leader *l = NULL;
    o->rc = dlock_election_observe(o->c, o->name, NULL, DLOCK_FOREVER, o->cancel, &l);
    dlock_leader_free(l);
    return NULL;
}

/* Anyone who can open an election's value file (NAME.leader) can hold
 * its lock byte: a campaign, a proclaim, a leader query and an observer
 * are not hung by it -- a bounded call ends at its bound, a try-once one
 * at once, an unbounded one at its cancel -- and the failed campaign
 * leaves nobody leading. An OFD lock of another open file description of
 * this process stands in for the other process. */
TU_TEST(value_file_foreign, 60)
{
    dlock_client *c = tu_open(url);
    dlock_election *e = NULL;
    ck_assert_int_eq(dlock_election_new(c, "el", 0, &e), DLOCK_OK);
    ck_assert_int_eq(dlock_election_campaign(e, "one", DLOCK_TRY, NULL), DLOCK_OK);
    ck_assert_int_eq(dlock_election_resign(e), DLOCK_OK);
    char *path = tu_fmt("%s/el.leader", dir);
    int fd = open(path, O_RDWR);
    ck_assert_msg(fd >= 0, "%s: %s", path, strerror(errno));
    /* A reader's lock keeps every writer out. */
    struct flock fl = {.l_type = F_RDLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 1};
    ck_assert_int_eq(fcntl(fd, F_OFD_SETLK, &fl), 0);
    ck_assert_int_eq(dlock_election_campaign(e, "two", 300, NULL), DLOCK_ETIMEDOUT);
    ck_assert_msg(strstr(dlock_errmsg(), "el.leader"), "%s", dlock_errmsg());
    ck_assert_int_eq(dlock_election_campaign(e, "two", DLOCK_TRY, NULL), DLOCK_EBUSY);
    dlock_lock *campaign = NULL;
    ck_assert_int_eq(dlock_lock_new_campaign(c, "el", "three", 0, &campaign), DLOCK_OK);
    struct tu_waiter t;
    tu_waiter_start(&t, campaign, DLOCK_FOREVER);
    tu_waiter_cancel_until_returned(&t);
    ck_assert_int_eq(t.rc, DLOCK_ECANCELED);
    ck_assert_uint_eq(dlock_hold_count(campaign), 0);
    dlock_leader *l = NULL;
    ck_assert_int_eq(dlock_election_leader(c, "el", &l), DLOCK_OK);
    ck_assert_int_eq(dlock_leader_held(l), 0); /* no campaign kept the lead */
    dlock_leader_free(l);
    /* A writer's lock keeps the readers out too. */
    fl.l_type = F_WRLCK;
    ck_assert_int_eq(fcntl(fd, F_OFD_SETLK, &fl), 0);
    /* A one-shot read waits up to the op timeout (for a leader caught
     * between winning and writing its value). */
    char *short_url = tu_fmt("%s?timeout=200ms", url);
    dlock_client *cs = tu_open(short_url);
    l = (dlock_leader *)1;
    ck_assert_int_eq(dlock_election_leader(cs, "el", &l), DLOCK_ETIMEDOUT);
    ck_assert_msg(strstr(dlock_errmsg(), "el.leader"), "%s", dlock_errmsg());
    ck_assert_ptr_null(l);
    struct observer o = {.c = c, .name = "el"};
    ck_assert_int_eq(dlock_cancel_new(&o.cancel), DLOCK_OK);
    ck_assert_int_eq(pthread_create(&o.th, NULL, observer_main, &o), 0);
    ck_assert(tu_wait_thread_asleep(&o.tid, 10000));
    ck_assert_int_eq(dlock_cancel_fire(o.cancel), DLOCK_OK);
    pthread_join(o.th, NULL);
    ck_assert_int_eq(o.rc, DLOCK_ECANCELED);
    dlock_cancel_free(o.cancel);
    /* The command line honours -w. */
    const char *elect[] = {"-u", url, "elect", "-w", "1", "el", "--", "true", NULL};
    ck_assert_int_eq(tu_dlock(NULL, NULL, NULL, elect), 1);
    /* A leader's proclaim is bounded by the op timeout. */
    close(fd);
    dlock_election *es = NULL;
    ck_assert_int_eq(dlock_election_new(cs, "el", 0, &es), DLOCK_OK);
    ck_assert_int_eq(dlock_election_campaign(es, "four", DLOCK_TRY, NULL), DLOCK_OK);
    fd = open(path, O_RDONLY);
    fl.l_type = F_RDLCK;
    ck_assert_int_eq(fcntl(fd, F_OFD_SETLK, &fl), 0);
    ck_assert_int_eq(dlock_election_proclaim(es, "five"), DLOCK_ETIMEDOUT);
    ck_assert_msg(strstr(dlock_errmsg(), "el.leader"), "%s", dlock_errmsg());
    close(fd);
    ck_assert_int_eq(dlock_election_proclaim(es, "five"), DLOCK_OK);
    l = NULL;
    ck_assert_int_eq(dlock_election_leader(c, "el", &l), DLOCK_OK);
    ck_assert_str_eq(dlock_leader_value(l), "five");
    dlock_leader_free(l);
    dlock_election_free(es);
    dlock_client_close(cs);
    free(short_url);
    dlock_lock_free(campaign);
    dlock_election_free(e);
    dlock_client_close(c);
    free(path);
}

/* In a directory others may write to (like /run/lock, 1777), a lock file
 * planted by another user is refused, not adopted; ours work. */
TU_TEST(planted_file, 60)
{
    /* Only root can become another user to plant the file. */
    ck_assert_msg(getuid() == 0, "this test needs root (to plant a file as nobody)");
    chmod(dir, 01777);
    char *path = tu_fmt("%s/planted.lock", dir);
    pid_t pid = fork();
    if (pid == 0) {
        if (setuid(65534) < 0)
            _exit(2);
        int fd = open(path, O_CREAT | O_EXCL | O_WRONLY, 0666);
        _exit(fd < 0 ? 3 : 0);
    }
    int st;
    waitpid(pid, &st, 0);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "nobody could not plant the file");
    dlock_client *c = tu_open(url);
    dlock_lock *l = tu_lock_mode(c, "planted", DLOCK_EXCLUSIVE, 0);
    ck_assert_int_eq(dlock_acquire(l, DLOCK_TRY), DLOCK_EACCES);
    ck_assert_msg(strstr(dlock_errmsg(), "planted.lock") && strstr(dlock_errmsg(), "uid 65534"),
                  "%s", dlock_errmsg());
    ck_assert_int_eq(dlock_acquire(l, 200), DLOCK_EACCES);
    dlock_info *info;
    ck_assert_int_eq(dlock_inspect(c, "planted", &info), DLOCK_EACCES);
    dlock_lock *mine = tu_lock_mode(c, "mine", DLOCK_EXCLUSIVE, 0);
    tu_acquire_release(mine, DLOCK_TRY);
    TU_FREE_LOCKS(mine, l);
    dlock_client_close(c);
    free(path);
}

int main(void)
{
    return tu_main("file", setup, teardown);
}
