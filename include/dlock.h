/* dlock.h -- the whole public API of libdlock, distributed locks for C.
 *
 * This header is the specification: what is not written here is not API.
 * One client talks to one backend, chosen by URL (file://; redis://,
 * rediss://, redis+unix://, redis+sentinel://, redis+cluster:// and their
 * TLS forms, redlock://, redlocks://; etcd://, etcd+https://; zk://;
 * postgres://, postgresql://).
 * Every backend keeps the same contract: exclusion, leases renewed by a
 * background keeper thread, callbacks when a hold is at risk and when it
 * is lost, a fencing token per acquisition, per-thread reentrancy, waits
 * that sleep until the backend reports a release, and errors that say
 * what failed in the backend's own words.
 *
 * Conventions used at every function below:
 *  - Functions returning int return DLOCK_OK (0) or a negative DLOCK_E*
 *    code. After a failure, dlock_errmsg() on the same thread returns a
 *    sentence naming the thing that failed (URL, path, key, name).
 *  - Handles are opaque. Free functions accept NULL as a harmless no-op.
 *  - A client and its lock handles may be used from many threads at once.
 *    A child process after fork() must not use its parent's client: every
 *    call there returns DLOCK_EMISUSE (a child made by fork(), which
 *    runs the library's pthread_atfork handler; not by a raw clone() or
 *    _Fork()). Freeing its handles and closing it
 *    there is harmless and returns at once: nothing is sent, released or
 *    stopped, and the memory is left as it is (shared copy-on-write with
 *    the parent), since the parent's threads may have held its mutexes
 *    at the fork.
 *  - Strings passed in are copied; strings returned stay owned by the
 *    library and live as long as the object they came from.
 *  - Flag bits not defined here are reserved and must be 0.
 *  - No header of any dependency is included, so building against dlock
 *    needs nothing but this file and the library.
 *
 * Each function below says which codes it returns, the state left after
 * each failure, the threads it may be called from and where backends
 * differ. "Backend failures" stands for the codes a server or the kernel
 * can cause: DLOCK_ECONN (unreachable, connection lost), DLOCK_EAUTH,
 * DLOCK_EACCES, DLOCK_EIO, DLOCK_EPROTO (a reply that is not the
 * backend's), DLOCK_EWRONGTYPE (the name holds something else),
 * DLOCK_EBACKEND (the server refused, in its words), DLOCK_EUNAVAIL (no
 * leader or quorum: etcd, zk) and DLOCK_ENOENT (a missing directory or
 * chroot). Every call on a client after fork() in the child, or after
 * dlock_client_close(), returns DLOCK_EMISUSE and changes nothing.
 * docs/backends.md has the capability table this header summarises.
 * Installed, every function has a manual page made from this header
 * (man dlock_acquire; docs/man3/, kept equal to it by a test).
 */
#ifndef DLOCK_H
#define DLOCK_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__) && !defined(DLOCK_STATIC)
#define DLOCK_EXTERN __attribute__((visibility("default")))
#else
#define DLOCK_EXTERN
#endif

/* ---------------------------------------------------------------- version */

/* The one place the version lives; the Makefile reads the soname from it. */
#define DLOCK_VERSION_MAJOR 0
#define DLOCK_VERSION_MINOR 1
#define DLOCK_VERSION_PATCH 0
#define DLOCK_VERSION_NUMBER \
    ((DLOCK_VERSION_MAJOR << 16) | (DLOCK_VERSION_MINOR << 8) | DLOCK_VERSION_PATCH)

/* The library's version as "MAJOR.MINOR.PATCH" and as a number built like
 * DLOCK_VERSION_NUMBER: compare them to the macros to detect a header and
 * library mismatch. Thread-safe. */
DLOCK_EXTERN const char *dlock_version(void);
DLOCK_EXTERN unsigned dlock_version_number(void);

/* ----------------------------------------------------------------- errors */

/* One table generates the error enum, dlock_strerror() and dlock_err_name().
 * Codes are only ever appended; none is ever removed or renumbered.
 * Contention (BUSY, TIMEDOUT, CANCELED) is kept apart from failure. */
#define DLOCK_ERRNO_MAP(XX)                                                   \
    XX(EBUSY, -1, "lock is held by another owner")                            \
    XX(ETIMEDOUT, -2, "timed out waiting for the lock")                       \
    XX(ECANCELED, -3, "wait was canceled")                                    \
    XX(EINVAL, -4, "invalid argument")                                        \
    XX(EBADURL, -5, "malformed or unsupported URL")                           \
    XX(ENOMEM, -6, "out of memory")                                           \
    XX(ENOTSUP, -7, "not supported by this backend")                          \
    XX(ENOTBUILT, -8, "backend not built into this library")                  \
    XX(ECONN, -9, "cannot reach the backend")                                 \
    XX(EAUTH, -10, "authentication failed or access denied by the backend")   \
    XX(EACCES, -11, "permission denied")                                      \
    XX(EIO, -12, "I/O error")                                                 \
    XX(EPROTO, -13, "unexpected reply from the backend")                      \
    XX(EWRONGTYPE, -14, "the name holds something that is not a dlock lock")  \
    XX(ELOST, -15, "the lock was lost")                                       \
    XX(ENOTOWNER, -16, "the lock is not held by the caller")                  \
    XX(EMISUSE, -17, "API misuse")                                            \
    XX(EBACKEND, -18, "the backend refused the request")                      \
    XX(EUNAVAIL, -19, "the backend has no leader or quorum")                  \
    XX(ENOENT, -20, "no such directory, path or node")

typedef enum dlock_err {
    DLOCK_OK = 0,
#define DLOCK__ERR_ENUM(name, code, text) DLOCK_##name = (code),
    DLOCK_ERRNO_MAP(DLOCK__ERR_ENUM)
#undef DLOCK__ERR_ENUM
} dlock_err;

/* A fixed sentence for a code ("lock is held by another owner"), and the
 * code's name ("DLOCK_EBUSY"). Unknown codes give "unknown error" and
 * "DLOCK_E?". Never NULL, thread-safe. */
DLOCK_EXTERN const char *dlock_strerror(int err);
DLOCK_EXTERN const char *dlock_err_name(int err);

/* The message of the last failure on the calling thread: what failed and
 * why, with the OS's or server's own words, e.g. "redis 127.0.0.1:6379:
 * WRONGTYPE key 'jobs' holds a string, not a dlock lock". Valid until the
 * next dlock call on this thread. Every call that returns a code clears
 * it first, so it never describes an earlier call; the free and close
 * functions leave it alone (read it after cleaning up). "" when the last
 * such call did not fail. Control characters in it (C0, DEL, C1: from a
 * server's words or a name) are written as \xHH, so a message can go to
 * a terminal as it is. */
DLOCK_EXTERN const char *dlock_errmsg(void);

/* ---------------------------------------------------------------- clients */

typedef struct dlock_client dlock_client;

/* Options, set one at a time before dlock_client_connect(). Most also have
 * a URL query form (?lease=10s&timeout=2s). Durations are milliseconds. */
typedef enum dlock_option {
    DLOCK_OPT_LEASE_MS = 1,       /* int: lease of each hold, default 30000 */
    DLOCK_OPT_CONNECT_TIMEOUT_MS, /* int: connect timeout, default 5000 */
    DLOCK_OPT_OP_TIMEOUT_MS,      /* int: one request's timeout, default 5000 (redis: one
                                     call's, a lost reply's retry included) */
    DLOCK_OPT_KEY_PREFIX,         /* str: prepended to every lock name */
    DLOCK_OPT_USER,               /* str: user name (ACL, etcd, digest) */
    DLOCK_OPT_PASSWORD,           /* str: password */
    DLOCK_OPT_LAYOUT,             /* str: wire layout, e.g. "redisson", "simple", "fair" */
    DLOCK_OPT_TLS_CA,             /* str: CA bundle path */
    DLOCK_OPT_TLS_CERT,           /* str: client certificate path */
    DLOCK_OPT_TLS_KEY,            /* str: client key path */
    DLOCK_OPT_DRIFT_MS,           /* int: clock drift margin taken off each
                                     validity, default 2 + lease/100 */
    DLOCK_OPT_LOCK_DELAY_MS       /* int: lock-delay, default 0 (off): an
                                     exclusive hold taken by this client that
                                     ends without a clean release (lease
                                     expiry, session loss, the holder killed)
                                     keeps the name from every acquirer for
                                     this long, timed by the backend; a clean
                                     release frees it at once. file, redis
                                     (redisson and simple layouts, one master
                                     or a cluster), etcd, zk; any other:
                                     DLOCK_ENOTSUP at connect
                                     (docs/choosing-a-backend.md) */
} dlock_option;

/* Parse URL (NULL or "" = the file backend in the default directory, one
 * per user whatever the environment: /run/lock/dlock-<uid>, or the highest
 * of dlock-<uid>.1 ... .7 that is the user's when another user took that
 * name, or /var/tmp/dlock-<uid> where /run/lock is not open to the user;
 * DLOCK_EACCES when every name is taken) and make a client that is not yet
 * connected. Nothing is dialed, opened or created (the default directory
 * is made at the connect). On success
 * *out owns a client to give to dlock_client_close(). On failure *out is
 * NULL and dlock_errmsg() says what is wrong with the URL.
 *
 * URL: scheme://[user[:password]@]host[:port][,host[:port]...][/path]
 * [?key=value&...]. Every query option must be one the core reads (lease,
 * connect_timeout, timeout, drift, lock_delay, prefix, layout, user, password,
 * password_file, tls_ca, tls_cert, tls_key) or one the scheme's backend
 * reads (redis: db, sentinel_password[_file]; zk: base, acl;
 * docs/backends.md): any other is refused here, before a backend dials.
 * password_file=PATH is read here: the password is the file's first line,
 * and the file is refused as ssh refuses a key -- not a regular file owned
 * by the effective user, or any group or other permission set
 * (DLOCK_EACCES, naming it); missing (DLOCK_ENOENT), empty (DLOCK_EINVAL);
 * beside another password, DLOCK_EBADURL. At connect a backend with no
 * password in the URL reads DLOCK_REDIS_PASSWORD or
 * DLOCK_REDIS_PASSWORD_FILE (etcd: DLOCK_ETCD_PASSWORD[_FILE], with a
 * user), checked alike; both set is DLOCK_EINVAL. Durations are DIGITS[.DIGITS][ms|s|m|h] (a plain number
 * is ms), from 1 ms (drift, lock_delay: 0) to a year, as with setopt.
 * Passwords: percent-encode '/', '?' and '@' (%2F, %3F, %40) to be sure;
 * raw ones are read as the password when the URL allows no other reading
 * (redis://admin:hun/ter2@host, etcd://root:pa?ss@host), and a URL that
 * reads two ways (an '@' in the path after a host list:
 * redis://admin:12/ter2@host) is refused. No message and no
 * dlock_client_url() ever shows a secret: the userinfo's password, an
 * option whose key names one (password, sentinel_password, any key
 * holding "pass", "pwd", "secret", "token", "cred" or "auth", in any case)
 * or the value of an option no backend knows (a misspelled ?Password=).
 * Returns DLOCK_OK; DLOCK_EBADURL (malformed URL, unknown scheme or
 * option, bad duration); DLOCK_ENOTBUILT (the scheme's backend is not in
 * this build); DLOCK_ENOMEM; DLOCK_EINVAL (OUT is NULL); password_file's
 * DLOCK_EACCES, DLOCK_ENOENT, DLOCK_EINVAL, DLOCK_EIO. Any thread. */
DLOCK_EXTERN int dlock_client_new(const char *url, dlock_client **out);

/* Set an option of a client not yet connected; it overrides the URL's.
 * The _str form copies VALUE; NULL resets the option. Integer options are
 * milliseconds from 1 to a year (DLOCK_OPT_DRIFT_MS, DLOCK_OPT_LOCK_DELAY_MS:
 * from 0).
 * Returns DLOCK_OK; DLOCK_EINVAL (C NULL, an option of the other type, a
 * value out of range); DLOCK_EMISUSE (connected, or after fork);
 * DLOCK_ENOMEM. After a failure the option keeps its value.
 * Threads: not against other calls on the same client.
 * Backends: each reads the options it needs when connecting and ignores
 * the others (file: only KEY_PREFIX; TLS: etcd+https and rediss only --
 * redis:// and etcd:// answer DLOCK_EBADURL, zk DLOCK_ENOTSUP at connect;
 * LAYOUT: redis "redisson", "simple" or "fair" (not on redlock://), etcd
 * "concurrency" or "etcdctl", zk "curator" or "curator-rw"; LEASE_MS: zk
 * asks it as the session timeout, etcd rounds it up to whole seconds). */
DLOCK_EXTERN int dlock_client_setopt_int(dlock_client *c, dlock_option opt, int64_t value);
DLOCK_EXTERN int dlock_client_setopt_str(dlock_client *c, dlock_option opt, const char *value);

/* Connect the client to its backend: check (file) or create (the default
 * directory only) the lock directory; dial, authenticate and ask the
 * server once (redis, etcd, zk), within DLOCK_OPT_CONNECT_TIMEOUT_MS.
 * Returns DLOCK_OK; DLOCK_EBADURL (what the backend finds wrong in the URL
 * or its options: a file URL with a host, redis with two hosts or a bad
 * db, an unknown layout, a zk base or chroot that is not a path or lies
 * in the server's reserved /zookeeper);
 * DLOCK_ENOTSUP (TLS on zk; a lock-delay on a backend or layout without
 * one, naming it); DLOCK_EINVAL (a drift margin not
 * shorter than the lease, a TLS file that does not load); DLOCK_ECONN
 * (unreachable -- a refused connection at once; zk: once every server,
 * given by address, refused -- else after the connect timeout; a TLS
 * handshake or certificate refused, the verification error named);
 * DLOCK_EMISUSE (already connected, after fork);
 * DLOCK_ENOMEM; backend failures (DLOCK_ENOENT: the file directory is
 * missing; a missing zk chroot is DLOCK_EBADURL). The message names what was tried (path, host:port).
 * After a failure the client is still unconnected and keeps its options:
 * fix them and connect again, or close it.
 * Threads: not against other calls on the same client. */
DLOCK_EXTERN int dlock_client_connect(dlock_client *c);

/* dlock_client_new() + dlock_client_connect(), returning the codes of
 * both. On failure *OUT is NULL and the client is freed. Any thread. */
DLOCK_EXTERN int dlock_open(const char *url, dlock_client **out);

/* The client's URL with its secrets removed (the ":password" part, and
 * password=, sentinel_password= and every option dlock_client_new() says
 * is a secret); the rest as given, byte for byte, so a URL without a
 * secret comes back unchanged. Owned by the client. NULL for NULL. Any
 * thread. */
DLOCK_EXTERN const char *dlock_client_url(const dlock_client *c);

/* The backend's name: "file", "redis", "etcd", "zk". NULL for NULL. Any
 * thread. */
DLOCK_EXTERN const char *dlock_client_backend(const dlock_client *c);

/* The master C talks to now, "host:port" ("[v6addr]:port") into BUF of
 * SIZE bytes: on redis+sentinel:// the master the sentinels name (asked
 * again when a failover made the known one stale). Returns DLOCK_OK;
 * DLOCK_ENOTSUP (a URL without a master: every other one); DLOCK_EINVAL
 * (BUF NULL or too small); DLOCK_EMISUSE (not connected); DLOCK_ECONN
 * and other failures when no sentinel answers. BUF is "" on failure.
 * Threads: any. */
DLOCK_EXTERN int dlock_client_master(dlock_client *c, char *buf, size_t size);

/* Release every hold of the client (best effort), stop its threads
 * (keeper, callbacks: a lost callback still queued runs first), close the
 * connection and free the client. What it sends the server (releases,
 * cleanups owed by ambiguous replies, etcd's lease revokes, ZooKeeper's
 * session close) shares one deadline, DLOCK_OPT_OP_TIMEOUT_MS from the
 * call: against a stalled server it returns after about one op timeout,
 * leaving what was not sent to the lease (zk: the session's timeout).
 * Not within it: a renewal in flight (up to the hold's validity) and the
 * release of a permit, a leadership or a re-entered or shared-level hold
 * (an op timeout each). Handles left over stay valid for
 * dlock_lock_free() alone (every other call on them returns
 * DLOCK_EMISUSE); the client's memory goes with the last of them, as
 * sqlite3_close_v2() does with statements. A lost callback may close its
 * client. In a child after fork() it only marks the parent's client
 * closed there (no release, no thread, no connection touched; the memory
 * stays, shared with the parent). NULL is a no-op. No other thread may use c or its handles
 * meanwhile; calling it twice is an error. */
DLOCK_EXTERN void dlock_client_close(dlock_client *c);

/* ------------------------------------------------------------------ locks */

typedef struct dlock_lock dlock_lock;

typedef enum dlock_mode {
    DLOCK_EXCLUSIVE = 0, /* one holder */
    DLOCK_SHARED = 1     /* any number of shared holders, no exclusive one */
} dlock_mode;

/* Wait arguments of dlock_acquire(). */
#define DLOCK_TRY 0           /* try once: DLOCK_EBUSY when held */
#define DLOCK_FOREVER (-1)    /* wait until acquired or canceled */

/* dlock_lock_set_lease() flag: a fixed lease that the keeper never
 * renews; the hold simply ends when it expires. */
#define DLOCK_LEASE_FIXED 1u

/* dlock_validity_ms() of a hold that has no lease (the file backend). */
#define DLOCK_VALID_FOREVER INT64_MAX

/* dlock_lock_new() flags.
 *
 * DLOCK_LOCK_HANDLE_OWNED: holds taken through the handle belong to the
 * handle, not to the calling thread, so a hold taken in one thread can be
 * released in another (event loops, thread pools, Curator's
 * InterProcessSemaphoreMutex, Redisson's lock(threadId)). The handle is one
 * owner: dlock_acquire() through it from any thread while the handle holds
 * the lock re-enters (the count goes up: one rule for every owner, a
 * thread or a handle, as Redisson counts per owner id), and
 * dlock_release(), dlock_hold_count(), dlock_token() and
 * dlock_validity_ms() answer for the handle from any thread. For
 * Curator's non-reentrant semantics give each task its own handle: two
 * handles, handle-owned or not, are two owners and exclude each other,
 * even in one thread. An acquire through the handle while another thread
 * is acquiring through it waits for that outcome (then re-enters or
 * tries itself) within its own wait and cancel. The backend sees one
 * owner per handle (Redis: the field <uuid>:<id>, an id above every
 * thread id); on etcd and ZooKeeper, whose servers see one owner per
 * client, the handle queues locally with the client's threads as they do.
 * Freeing the handle releases its holds. Every backend.
 *
 * DLOCK_LOCK_FAIR: waiters are served first come, first served. Refused
 * with DLOCK_ENOTSUP where the backend cannot keep that order (file,
 * redlock; etcd and zk queue in arrival order). Redis: the lock is taken
 * through the fair layout (a queue beside Redisson's hash, the release
 * handing the lock to the next waiter; docs/protocol-redis.md, "Layout
 * fair"), exclusive holds only, and not under layout=simple (both
 * DLOCK_ENOTSUP at the acquire); ?layout=fair makes every lock of the
 * client fair. A lock handed over is granted for the waiter's queue lease
 * (?queue_lease) and the keeper extends it to the hold's lease a third of
 * the way in -- once for a DLOCK_LEASE_FIXED lease too, whose lease then
 * runs from that extension. */
#define DLOCK_LOCK_HANDLE_OWNED 1u
#define DLOCK_LOCK_FAIR 2u

/* Make a handle for lock NAME in MODE. Nothing is acquired and nothing is
 * sent. The name is any non-empty byte string up to DLOCK_NAME_MAX bytes
 * (each backend maps it safely: it can never escape its directory, key
 * space or base path). FLAGS: 0 or DLOCK_LOCK_* bits above; every other
 * bit is reserved and must be 0, so later behaviours (per-lock layouts)
 * need no second constructor.
 * Returns DLOCK_OK; DLOCK_EINVAL (OUT NULL, an empty or too long name, an
 * unknown mode, a reserved flag); DLOCK_ENOTSUP (DLOCK_SHARED where the
 * backend has no shared mode -- docs/backends.md: file, redis, redlock
 * (readers on a majority), etcd and zk have it; DLOCK_LOCK_FAIR on file
 * or redlock);
 * DLOCK_EMISUSE (the client is not connected, closed, or the parent's);
 * DLOCK_ENOMEM. On failure *OUT is NULL.
 * Threads: any. Without DLOCK_LOCK_HANDLE_OWNED the handle may be used
 * from many threads and each thread holds on its own. Free it with
 * dlock_lock_free(). */
#define DLOCK_NAME_MAX 1024
DLOCK_EXTERN int dlock_lock_new(dlock_client *c, const char *name, dlock_mode mode,
                                unsigned flags, dlock_lock **out);

/* Free a handle. Holds still taken through it by any thread are released
 * first (best effort: a failed release is not reported; a server-side key
 * then ends with its lease) when it is the last handle on the name, and
 * always for a handle-owned handle's holds. NULL is a no-op. No other
 * thread may use L then.
 * Also after dlock_client_close() (the holds are gone already): it frees
 * the handle, and the client's memory with the last handle. In a child
 * after fork() it releases nothing: the parent keeps its holds. See
 * dlock_lock_on_lost() for handles whose lost callback runs. */
DLOCK_EXTERN void dlock_lock_free(dlock_lock *l);

/* Lease of holds taken through this handle from now on: LEASE_MS > 0
 * overrides the client's DLOCK_OPT_LEASE_MS, 0 goes back to it; flags
 * DLOCK_LEASE_FIXED = never renewed (the hold ends when the lease does and
 * is reported lost). Holds already taken keep theirs.
 * Returns DLOCK_OK; DLOCK_EINVAL (L NULL, an unknown flag, a lease not
 * longer than the drift margin or over a year); DLOCK_ENOTSUP
 * (DLOCK_LEASE_FIXED where the backend cannot: zk, whose holds last as
 * long as the session). After a failure the handle keeps its lease.
 * Threads: any. Backends: file has no leases (accepted, unused: validity
 * is DLOCK_VALID_FOREVER); redis: PEXPIRE, in ms; etcd: a handle whose
 * lease differs from the client's, or is fixed, gets an etcd lease of its
 * own, rounded up to whole seconds; zk: a lease other than the client's
 * is not used (the session timeout, DLOCK_OPT_LEASE_MS, is every hold's). */
DLOCK_EXTERN int dlock_lock_set_lease(dlock_lock *l, int64_t lease_ms, unsigned flags);

/* Acquire for the calling thread (for the handle when it is
 * handle-owned). WAIT_MS: DLOCK_TRY (0) tries once and returns
 * DLOCK_EBUSY (held by another owner; a try whose request the server
 * did not answer in time is a failure naming the server instead, never
 * DLOCK_EBUSY); > 0 waits up to that many milliseconds and returns
 * DLOCK_ETIMEDOUT; DLOCK_FOREVER waits until acquired. A wait sleeps until
 * the backend reports a release; dlock_lock_cancel() from another thread
 * ends it with DLOCK_ECANCELED (see also dlock_acquire_ex()). If the owner
 * already holds the lock, the hold count goes up (reentrancy) and nothing
 * is sent -- see "Modes and owners" below for a different mode.
 * Returns DLOCK_OK (held; dlock_token() has its token); contention:
 * DLOCK_EBUSY, DLOCK_ETIMEDOUT (the message keeps the backend's reason
 * when it had one, e.g. disconnected; also a wait whose request its own
 * end cut short -- "no reply within 1 ms", a quorum not reached in time
 * -- on every backend), DLOCK_ECANCELED; DLOCK_ELOST (the
 * owner's hold was lost and not yet released: release it first);
 * DLOCK_EMISUSE (an upgrade from shared, after fork or close); DLOCK_EINVAL
 * (L NULL, hold count overflow, a negative WAIT_MS other than
 * DLOCK_FOREVER); DLOCK_ENOTSUP (DLOCK_SHARED on redis with
 * layout=simple); DLOCK_ENOMEM; backend failures.
 * After any failure nothing is held that was not held before: a re-entry
 * that fails leaves the count as it was, and a first acquire leaves
 * nothing on the server (a request whose reply was lost is cleaned up).
 * Threads: any; a thread-owned hold belongs to the calling thread.
 * Backends: on etcd and zk the server sees one owner per client, so the
 * client's threads (and handle-owned handles) on one name queue locally,
 * first come first served, and one at a time goes to the server (shared
 * acquires on etcd side by side, none past a waiting writer); redis
 * waiters wake on Redisson's channel (one per client per release), file
 * waiters on inotify, in no fixed order; etcd and zk serve waiters across
 * clients in arrival order (the key's create revision, the node's
 * sequence number). zk: a DLOCK_TRY while the session is not connected
 * (reconnecting) returns DLOCK_ECONN at once instead of waiting for it. */
DLOCK_EXTERN int dlock_acquire(dlock_lock *l, int64_t wait_ms);

/* Modes and owners (read-write locks). Any number of SHARED holders, or
 * one EXCLUSIVE holder. Holding EXCLUSIVE, an owner that acquires SHARED
 * on the same name (through any handle) re-enters its exclusive hold:
 * the count goes up and nothing is sent -- a write lock includes reading,
 * as Redisson's and Curator's read-write locks let a writer take the read
 * lock. dlock_release() through a SHARED handle gives back one of those
 * read levels, through an EXCLUSIVE handle one write level. Downgrade:
 * when the owner's last write level goes while read levels remain, the
 * hold becomes SHARED with those levels, on the server too, with no
 * moment unlocked (write, read, release the write handle = a read hold
 * with the same token); readers waiting may then come in. Released the
 * other way round (read levels first) the hold stays exclusive to the
 * end. A downgrade that fails at the backend returns its error and
 * leaves the hold exclusive with every level (release again); a hold
 * found lost, or one whose downgrade may have reached the server
 * unanswered (etcd, redis: readers may be in), is dropped (DLOCK_ELOST). Holding SHARED, an acquire of
 * EXCLUSIVE is an upgrade and is refused with DLOCK_EMISUSE (two readers
 * upgrading would wait for each other forever; Curator and Redisson
 * refuse or deadlock).
 * Writers are not starved: once a writer waits, new readers of other
 * owners wait behind it (a re-entry of a reader already holding does
 * not), so a stream of readers cannot keep it out. Readers are not
 * protected the same way everywhere: etcd and ZooKeeper queue readers and
 * writers in arrival order, so a waiting reader gets in once the writers
 * queued before it are done; the file backend, redis and Redlock let any
 * waiting writer keep new readers out, so under a stream of writers with
 * one always waiting a reader waits as long as the stream lasts (measured:
 * 7 reader sections beside 337 writer ones in 15 s). Mind the cost of that
 * order: a reader that waits for another thread which needs a new read
 * hold of the same name deadlocks behind a waiting writer, as with
 * Java's fair ReentrantReadWriteLock. docs/protocol-<backend>.md says how
 * each layout keeps the order, and where clients of other libraries on
 * the same name do not. */

/* ------------------------------------------------------------ cancelling */

/* A cancel object: fired once, it stays fired. Every acquire given it
 * returns DLOCK_ECANCELED -- at once when it starts after the fire (before
 * anything is sent or queued, re-entries included), or as soon as it
 * waits when the fire comes during the acquire (on redis also while its
 * acquire request is in flight or its connection is being dialed and
 * authenticated: what a request sent may still do is undone later by the
 * client's keeper thread) -- and holds nothing. An
 * acquire that had already succeeded when the fire came keeps its hold
 * (DLOCK_OK). There is no race to lose: fire it whenever the caller gives
 * up (a signal, a shutdown), whether or not the acquire has begun.
 * dlock_lock_cancel() stays for reaching the waits of one handle. */
typedef struct dlock_cancel dlock_cancel;

/* Make a cancel object, not fired. *OUT owns it; free it with
 * dlock_cancel_free() once no acquire uses it. When an acquire using an
 * object first has to sleep, the process starts a small canceler thread
 * (all signals blocked) that delivers fires to waits; it stops when the
 * last such object is freed. An acquire that never waits costs no thread.
 * DLOCK_ENOMEM, DLOCK_EIO (no eventfd), DLOCK_EINVAL (OUT NULL). Any
 * thread. (A wait that cannot start the canceler thread fails with
 * DLOCK_EIO and holds nothing.) */
DLOCK_EXTERN int dlock_cancel_new(dlock_cancel **out);

/* Fire K: sticky, idempotent. Async-signal-safe (it stores a flag and
 * writes to an eventfd; errno is preserved), so it may be called from a
 * signal handler, a lost callback or any thread. Waits already sleeping
 * are woken by the canceler thread a moment later. In a child after
 * fork(), an object made in the parent is fired in the child only (the
 * parent's stays unfired; no wait of the child can use it). DLOCK_OK, or
 * DLOCK_EINVAL for NULL (no message is set: not signal-safe). */
DLOCK_EXTERN int dlock_cancel_fire(dlock_cancel *k);

/* 1 once K was fired, else 0 (also for NULL). Any thread. */
DLOCK_EXTERN int dlock_cancel_fired(const dlock_cancel *k);

/* Free K. No acquire may be using it, and nothing may fire it any more:
 * ignore or reset the signals whose handler fires it first (a kill to a
 * process group and to the pid is two signals; the second may come while
 * the program ends). NULL is a no-op. */
DLOCK_EXTERN void dlock_cancel_free(dlock_cancel *k);

/* dlock_acquire() with a cancel object (NULL: none, = dlock_acquire()).
 * Adds DLOCK_ECANCELED when CANCEL is or becomes fired, and DLOCK_EMISUSE
 * for a cancel object made before fork() in the parent. */
DLOCK_EXTERN int dlock_acquire_ex(dlock_lock *l, int64_t wait_ms, dlock_cancel *cancel);

/* Release one level of the owner's hold (the calling thread's, or the
 * handle's when handle-owned); the lock is freed when the count reaches 0.
 * Returns DLOCK_OK; DLOCK_ENOTOWNER (the owner holds nothing here);
 * DLOCK_ELOST (the hold had been lost: it is dropped all the same, at any
 * count); DLOCK_EMISUSE (after fork or close); DLOCK_EINVAL (L NULL);
 * backend failures on the last level (the hold is dropped locally all the
 * same; what the server keeps ends with its lease, or at once on file).
 * Threads: the holding thread; any thread for a handle-owned hold. */
DLOCK_EXTERN int dlock_release(dlock_lock *l);

/* The owner's hold count on this lock (0 = not held, or L NULL). Any
 * thread (it answers for the calling thread, or for the handle when it is
 * handle-owned). */
DLOCK_EXTERN unsigned dlock_hold_count(dlock_lock *l);

/* The fencing token of the owner's hold: strictly greater than every token
 * issued before for this name on this backend. Re-entries keep the token
 * of the first acquisition. Returns DLOCK_OK; DLOCK_ENOTOWNER (not held;
 * *TOKEN untouched); DLOCK_EINVAL (a NULL argument). Any thread, answering
 * as dlock_hold_count() does. Backends: file, a counter in the lock file;
 * redis, INCR of redisson_lock_token:{name} (shared with Redisson's
 * RFencedLock); etcd, the key's create revision; zk, the node's czxid. */
DLOCK_EXTERN int dlock_token(dlock_lock *l, uint64_t *token);

/* File backend: the owner's hold as a descriptor a child process can
 * inherit, as flock(1) hands its lock to COMMAND. *FD is a new descriptor
 * (without close-on-exec; the caller owns it) of the open file carrying
 * the kernel lock, which lasts while any copy of it is open -- here or in
 * the children that inherit it: if this process dies, even by SIGKILL,
 * the name stays locked until the last of them exits. From then on
 * dlock_release() only closes the library's own copy (an unlock would end
 * the lock for every copy). Returns DLOCK_OK; DLOCK_ENOTOWNER (not held);
 * DLOCK_ENOTSUP (other backends: their holds are no kernel lock);
 * DLOCK_EINVAL (a NULL argument); DLOCK_EIO (out of descriptors). Any
 * thread, answering as dlock_hold_count() does. */
DLOCK_EXTERN int dlock_lock_inherit_fd(dlock_lock *l, int *fd);

/* Milliseconds the owner's hold is still guaranteed (monotonic clock;
 * send time of the last confirmed acquire/renewal + lease - drift):
 * DLOCK_VALID_FOREVER without a lease (file), 0 once lost or expired,
 * DLOCK_ENOTOWNER (negative) when not held, DLOCK_EINVAL for NULL. Any
 * thread, answering as dlock_hold_count() does. Backends: zk's lease is
 * the session timeout the server granted (it may clamp the one asked);
 * etcd's is a whole number of seconds. */
DLOCK_EXTERN int64_t dlock_validity_ms(dlock_lock *l);

/* Called once when a hold taken through this handle is lost (renewal
 * found another owner or none, the session or lease expired, the validity
 * deadline passed unconfirmed). WHY is a message for humans, valid during
 * the call. Callbacks run on the client's callback thread (one per client,
 * started with the first callback), never on the keeper: a callback that
 * blocks delays the client's later callbacks, never a renewal. They run
 * one at a time, in the order the losses were found.
 * A callback may free any handle of the client, its own included; a
 * callback still queued for a handle that is freed is dropped, and
 * dlock_lock_free() from any other thread waits for a running callback of
 * that handle to return. The callback may close the client. Holds
 * belong to threads: release the lost hold later from the thread that
 * took it, or from any thread for a handle-owned hold (dlock_release()
 * returns DLOCK_ELOST). */
/* dlock_lock_on_lost() sets FN (NULL: none) and ARG for holds lost from
 * now on. Returns DLOCK_OK or DLOCK_EINVAL (L NULL). Any thread. The file
 * backend never loses a hold (the kernel keeps it while the process
 * lives). */
typedef void (*dlock_lost_fn)(dlock_lock *l, const char *why, void *arg);
DLOCK_EXTERN int dlock_lock_on_lost(dlock_lock *l, dlock_lost_fn fn, void *arg);

/* At risk: FN(L, VALIDITY_MS, WHY, ARG) is called when a hold taken
 * through L has gone unrenewed until only MARGIN_MS of its validity
 * (dlock_validity_ms()) are left -- its renewals failed, or the one sent
 * is still unanswered (a stalled server, a cut network, a ZooKeeper
 * session disconnected) -- so the application can stop using what the
 * lock guards before the lease can end on the server, not after (the
 * DynamoDB lock client's session monitor, client-go's renew deadline).
 * VALIDITY_MS is what was left when it was found (> 0 and <= the
 * margin); WHY, valid during the call, says what the renewals met
 * ("renewal failing: <the backend's words>", "a renewal is unanswered").
 * The margin is watched on a timer, not on a renewal's outcome, so the
 * call comes on time while a renewal hangs. It runs on the client's
 * callback thread with the rules of the lost callback
 * (dlock_lock_on_lost()): one at a time, in the order found, never on
 * the keeper. Once per hold until a confirmed renewal lifts its validity
 * above the margin again; falling to it after that calls FN again (a
 * renewal confirmed too late to do so calls nothing). Never for a hold
 * already lost (its lost callback, which follows an at-risk call when no
 * renewal comes in time) or released (a call still queued for a hold
 * that is released or lost meanwhile is dropped); freeing L drops its
 * queued calls as with the lost callback.
 * A margin counts as at most half the validity the hold was last
 * granted (renewals go out a third into the lease, so a larger margin
 * would report a hold before its renewal was even due); a
 * DLOCK_LEASE_FIXED hold, which nothing renews, is reported once
 * MARGIN_MS of its lease are left. FN and the margin apply to L's holds
 * at once, those already taken included; FN NULL turns it off (MARGIN_MS
 * then ignored). Starts the client's callback thread if it is not
 * running.
 * Returns DLOCK_OK; DLOCK_EINVAL (L NULL, a MARGIN_MS under 1 ms or over
 * a year with FN set); DLOCK_ENOTSUP (the file backend: its holds have
 * no lease and are never at risk); DLOCK_EMISUSE (after fork or close);
 * DLOCK_ENOMEM (no callback thread). Any thread.
 * Backends (what "renewals failed" is there): redis (every URL form):
 * the PEXPIRE script unanswered or refused; redlock: no majority of
 * nodes renewed; etcd: the lease's keep-alive; zk: the check of the
 * hold's node in its session -- there the validity is the session
 * timeout reckoned from the last confirmed check, and a session
 * disconnected (reconnecting) is at risk once that much is left. Any
 * handle made by dlock_lock_new(), dlock_lock_new_permits(),
 * dlock_lock_new_campaign() or dlock_multi_lock() works. */
typedef void (*dlock_at_risk_fn)(dlock_lock *l, int64_t validity_ms, const char *why, void *arg);
DLOCK_EXTERN int dlock_lock_on_at_risk(dlock_lock *l, int64_t margin_ms, dlock_at_risk_fn fn,
                                       void *arg);

/* Contended: FN(L, WHO, ARG) is called when another owner starts waiting
 * for a hold taken through L -- Chubby's conflicting-lock event, libdlm's
 * blocking notice -- so that a coarse lock held for long (a leader, a
 * migration) can be given up gracefully. WHO, valid during the call, is
 * the waiter as the backend names it (its ZooKeeper node, its etcd key
 * and revision, its Redis owner field "<client uuid>:<thread>"). Once
 * per waiter the backend sees while the hold lasts, those already
 * waiting when it was taken included: a waiter that gave up
 * and waits again, or another one, is told again; one that keeps waiting
 * is not (at most the last 64 waiters are remembered per hold). Nothing is
 * said when a waiter leaves, and the call is a hint, never a promise: a
 * waiter may have gone by the time FN runs, and one the backend could not
 * see (a connection lost while it came) goes untold. It runs on the
 * client's callback thread with the rules of the lost callback
 * (dlock_lock_on_lost()): one at a time, in the order found, never on the
 * keeper; a call still queued for a hold that is released or lost
 * meanwhile is dropped, as are the queued calls of a handle freed.
 * FN (NULL: none) applies to holds taken through L after this call, by
 * dlock_acquire(), dlock_acquire_ex() and dlock_acquire_async(); set it
 * before acquiring. The backend starts watching as the acquire returns
 * (one request, on the acquiring thread or the asynchronous pool's) and
 * stops with the release; a watch it could not set up is logged
 * (DLOCK_LOG_WARN) and leaves the hold untold, the acquire
 * still DLOCK_OK. Another thread of the same client waiting its turn in
 * the client's own queue (etcd, zk: one owner per client) is not seen.
 * Exclusive plain locks only.
 * Returns DLOCK_OK; DLOCK_EINVAL (L NULL); DLOCK_ENOTSUP with the reason
 * (a backend or URL form that cannot see its waiters, a shared handle, a
 * semaphore's permit or a campaign); DLOCK_EMISUSE (after fork or close);
 * DLOCK_ENOMEM (no callback thread). Any thread.
 * How soon it is told (docs/backends.md): pushed, at once, on file
 * (waiters write their id in a slot of NAME.waiting, which the holder's
 * client watches with inotify; the first 64 waiters of a name), zk (a
 * child watch on the lock node), etcd (a watch of the lock's prefix from
 * the hold's revision on, so those already waiting are replayed) and
 * redis in every layout (redis://, rediss://, Sentinel, Cluster: dlock
 * waiters announce themselves on the lock's channel, which the holder's
 * client subscribes to -- a fair lock's script does it as it queues one;
 * those already waiting are read from the waiting writers' record or the
 * fair queue; Redisson's own waiters announce nothing); others --
 * postgres, mysql, redlock:// -- DLOCK_ENOTSUP. */
typedef void (*dlock_contended_fn)(dlock_lock *l, const char *who, void *arg);
DLOCK_EXTERN int dlock_lock_on_contended(dlock_lock *l, dlock_contended_fn fn, void *arg);

/* Cancel every wait in progress on this handle, from any thread: those
 * dlock_acquire() calls return DLOCK_ECANCELED and hold nothing. Waits
 * that start after this call are not affected: to cancel an acquire that
 * may not have begun, use a cancel object (dlock_acquire_ex()). Returns
 * DLOCK_OK or DLOCK_EINVAL (L NULL). Any thread; not async-signal-safe. */
DLOCK_EXTERN int dlock_lock_cancel(dlock_lock *l);

/* The handle's name and mode (NULL and DLOCK_EXCLUSIVE for NULL). Any
 * thread. */
DLOCK_EXTERN const char *dlock_lock_name(const dlock_lock *l);
DLOCK_EXTERN dlock_mode dlock_lock_mode(const dlock_lock *l);

/* ------------------------------------------------------ asynchronous calls */

/* For event loops (libuv, libevent, epoll): an acquire that waits holds no
 * thread, and its outcome comes to the loop's thread as a callback. The
 * shape is libpq's and hiredis's: dlock_client_fd() is a descriptor the
 * loop watches for reading; when it is readable, dlock_dispatch() runs the
 * callbacks of the calls that ended, in the calling thread. Nothing runs
 * user code on a library thread. include/dlock/adapters/libuv.h and
 * libevent.h wire the descriptor into those loops (header-only).
 *
 * Asynchronous calls go through handles made with DLOCK_LOCK_HANDLE_OWNED:
 * the hold belongs to the handle, so dlock_release(), dlock_token() and
 * dlock_validity_ms() work from any thread, the callback's included. One
 * asynchronous call per handle at a time: the next starts once the
 * previous one's callback runs (from that callback too).
 *
 * A start call that returns DLOCK_OK has started the call: its callback
 * runs exactly once, from dlock_dispatch() (or from dlock_client_close(),
 * which runs the callbacks still owed before it returns: none runs after).
 * A start call that fails started nothing and no callback runs.
 *
 * What parks: while an acquire waits it holds no thread (the library's
 * small pool -- two threads per client, more, up to 16, while a slow
 * server keeps them all inside requests -- resumes it when the backend's
 * push says the lock may be free: a Redis release message, a ZooKeeper
 * watch on the node ahead, an etcd watch on the key queued ahead, the
 * close of a lock file (inotify: a release or a holder's death, read by
 * one thread per client); or at the holder's lease end, a lease
 * keepalive (etcd), a lock-delay's end, at the wait's end, or on a
 * cancel). Backends: a waiting acquire parks on redis (redis://,
 * sentinel, cluster), zk and etcd (its node or key kept: its place in
 * line too) and file (file://) for plain locks, exclusive and shared;
 * DLOCK_LOCK_FAIR handles on redis, and every other backend (postgres,
 * mysql, redlock), answer a waiting acquire with DLOCK_ENOTSUP naming the
 * backend -- DLOCK_TRY is asynchronous on every backend (a pool thread
 * makes the one attempt). */

/* The completion of an asynchronous call through handle L: RC is what the
 * blocking call would have returned (its message is dlock_errmsg() in the
 * callback). L is NULL when the handle was freed before the completion
 * was dispatched (RC then DLOCK_ECANCELED; a hold taken ended with the
 * handle); free a handle with a call in flight in the dispatching thread
 * (or from a callback), not while another thread dispatches. Runs in the
 * thread calling dlock_dispatch(), or the one calling
 * dlock_client_close(). It may call anything on the client:
 * start another asynchronous call (its own callback comes from a later
 * dispatch), release, free L -- but not dlock_dispatch() or
 * dlock_client_close(). */
typedef void (*dlock_done_fn)(dlock_lock *l, int rc, void *arg);

/* dlock_acquire_ex() without blocking: start acquiring L, waiting up to
 * WAIT_MS (DLOCK_TRY, a number of ms, DLOCK_FOREVER), cancelable by
 * CANCEL (may be NULL) and by dlock_lock_cancel(L); DONE(L, rc, ARG) comes
 * with its outcome -- every code of dlock_acquire_ex(): DLOCK_OK (held
 * through the handle; dlock_token() has its token), DLOCK_EBUSY (a try),
 * DLOCK_ETIMEDOUT, DLOCK_ECANCELED (also: the client closed, the handle
 * freed), failures. Re-entry: a handle that holds L already re-enters
 * (the count goes up) and DONE comes with DLOCK_OK.
 * Returns DLOCK_OK (started); DLOCK_EINVAL (L or DONE NULL, a bad
 * WAIT_MS, a handle made without DLOCK_LOCK_HANDLE_OWNED); DLOCK_EBUSY
 * (an asynchronous call through L whose callback has not run yet, or an
 * acquire or release through L in progress); DLOCK_ECANCELED
 * (CANCEL fired already); DLOCK_ENOTSUP (a wait, WAIT_MS != 0, on a
 * backend whose waits cannot park yet: the message names it; a fair
 * lock on redis is refused by its first attempt, so DONE gets that
 * DLOCK_ENOTSUP); DLOCK_EMISUSE (after close or fork; a cancel object of the
 * parent); DLOCK_ENOMEM; DLOCK_EIO (no eventfd, no pool thread). On
 * failure nothing was started and L's state is unchanged.
 * Threads: any; DONE runs as dlock_done_fn says. */
DLOCK_EXTERN int dlock_acquire_async(dlock_lock *l, int64_t wait_ms, dlock_cancel *cancel,
                                     dlock_done_fn done, void *arg);

/* dlock_release() without blocking the caller on the server's reply:
 * release one level of L's hold on a pool thread; DONE(L, rc, ARG) comes
 * with dlock_release()'s code. Returns DLOCK_OK (started); DLOCK_EINVAL
 * (L or DONE NULL, a handle made without DLOCK_LOCK_HANDLE_OWNED);
 * DLOCK_ENOTOWNER (L holds nothing); DLOCK_EBUSY (as for
 * dlock_acquire_async()); DLOCK_EMISUSE (after close or fork);
 * DLOCK_ENOMEM; DLOCK_EIO. On failure nothing was started. Threads: any.
 * (The blocking dlock_release() works on such holds too.) */
DLOCK_EXTERN int dlock_release_async(dlock_lock *l, dlock_done_fn done, void *arg);

/* The descriptor of C's completions: readable while completions wait for
 * dlock_dispatch(). Watch it for reading only; never read, write or close
 * it (dlock_client_close() closes it: stop watching first). The first
 * call binds C's completions to the calling thread, the loop's: from
 * then on dlock_dispatch() from another thread is DLOCK_EMISUSE. Returns
 * the descriptor (>= 0), or DLOCK_EINVAL (C NULL), DLOCK_EMISUSE (after
 * close or fork, not connected), DLOCK_ENOMEM, DLOCK_EIO (no eventfd). */
DLOCK_EXTERN int dlock_client_fd(dlock_client *c);

/* Run the callbacks of C's asynchronous calls that ended (those queued
 * when it starts; one a callback starts comes later), in the calling
 * thread, in the order they ended. Returns how many ran (>= 0), or
 * DLOCK_EINVAL (C NULL), DLOCK_EMISUSE (after close or fork, from a
 * thread other than the one dlock_client_fd() bound -- without it the
 * first dispatching thread binds --, or from inside a callback). */
DLOCK_EXTERN int dlock_dispatch(dlock_client *c);

/* ------------------------------------------------------- a lock's value */

/* A lock's value: each lock name may carry a small value (up to
 * DLOCK_VALUE_MAX bytes, any bytes: a leader's endpoint, a job's
 * checkpoint, "last run at"), stored in the backend beside the lock. Only
 * the holder writes it, and the write is atomic with the check, in the
 * backend itself, that the hold is still the writer's: a write after the
 * hold was lost (its lease ended, a force release) fails with
 * DLOCK_ELOST and changes nothing. Anyone reads it, with the token of the
 * hold that wrote it, so the next holder reads what the last one left. A
 * release keeps it; dlock_release_ex() with DLOCK_RELEASE_CLEAR_VALUE
 * clears it. The value of a name is the lock's only: a semaphore or an
 * election of the same name has none. Where it is stored: file, NAME.value
 * beside NAME.lock; redis (every URL form but redlock), the HASH
 * dlock_value:{NAME}; etcd, the key <prefix>dlock_value:NAME, outside the
 * lock's prefix; zk, the child _dlock_value of the lock node
 * (docs/protocol-*.md per backend). */
#define DLOCK_VALUE_MAX 4096

/* Write LEN bytes at VALUE (NULL with LEN 0: the empty value, which is a
 * value, unlike a cleared one) as the value of L's name, with the token of
 * the owner's hold, in one request checked in the backend against that
 * hold (file: under its kernel lock; redis: a script that finds the
 * hold's field; etcd: a transaction comparing the hold's key's create
 * revision; zk: a multi checking the hold's node).
 * Returns DLOCK_OK; DLOCK_ENOTOWNER (the owner holds nothing here);
 * DLOCK_ELOST (the hold was lost, before or as the backend checked it:
 * nothing was written; release it); DLOCK_EMISUSE (a shared hold: only an
 * exclusive holder writes; after fork or close); DLOCK_EINVAL (L NULL,
 * VALUE NULL with LEN > 0, LEN above DLOCK_VALUE_MAX); DLOCK_ENOTSUP (the
 * backend or URL form keeps no value -- redlock: no one request checks a
 * majority; the message names it -- or L is a permit's or a campaign's
 * handle); DLOCK_ENOMEM; backend failures (the value may or may not
 * have been written; the hold is unchanged). Threads: the holding thread,
 * any thread for a handle-owned hold; not while the owner releases it. */
DLOCK_EXTERN int dlock_value_set(dlock_lock *l, const void *value, size_t len);

/* Read the value of lock NAME into BUF: *LEN in, BUF's size (a buffer of
 * DLOCK_VALUE_MAX bytes is always enough); out, the value's length.
 * *TOKEN (TOKEN may be NULL) is the token of the hold that wrote it, or 0
 * when NAME has no value (never written, or cleared), *LEN then 0. Any
 * client may read any name, held or not; nothing is taken. One request.
 * Returns DLOCK_OK; DLOCK_EINVAL (C, NAME, LEN NULL, BUF NULL with *LEN
 * > 0, a bad name, a value longer than *LEN: *LEN is then its length and
 * BUF untouched); DLOCK_ENOTSUP, DLOCK_EMISUSE as dlock_value_set();
 * DLOCK_ENOMEM; backend failures (*LEN 0, *TOKEN 0). Threads: any. */
DLOCK_EXTERN int dlock_value_get(dlock_client *c, const char *name, void *buf, size_t *len,
                                 uint64_t *token);

/* dlock_release_ex() flag: the release that ends the hold first clears
 * the name's value, guarded by the hold as dlock_value_set() is. */
#define DLOCK_RELEASE_CLEAR_VALUE 1u

/* dlock_release() with FLAGS (0: the same as dlock_release()). With
 * DLOCK_RELEASE_CLEAR_VALUE, when this release ends the hold (its last
 * level) the value is cleared first, in the backend's guarded request,
 * then the hold released; a release of an inner level clears nothing.
 * Returns dlock_release()'s codes, and DLOCK_EINVAL for an unknown flag
 * (nothing released); a clear that fails (DLOCK_ENOTSUP, a backend
 * failure; DLOCK_ELOST: the hold was lost and nothing was cleared) is
 * returned with its message, and the hold is released all the same.
 * Threads: as dlock_release(). */
DLOCK_EXTERN int dlock_release_ex(dlock_lock *l, unsigned flags);

/* ------------------------------------------------------ guarded writes */

/* Guarded writes: beside its value, each lock name has a store of keys
 * the user names, kept in the lock's own backend, in a namespace of the
 * name's own (two names never share a key, and no key is a lock key).
 * Only the name's exclusive holder puts or deletes a key, each write in
 * one request atomic with the backend's check that the hold is still the
 * writer's -- "write this only if I still hold the lock", what etcd's
 * IsOwner() transaction and Consul's check-session do: a write after the
 * hold was lost (its lease ended while the holder was paused, a force
 * release, a takeover) fails with DLOCK_ELOST and writes nothing, so
 * data kept here needs no fencing token. Anyone reads a key, with the
 * token of the hold that wrote it. Keys outlive holds; nothing expires
 * them. A key is 1 to DLOCK_GUARDED_KEY_MAX bytes of letters, digits,
 * '.', '_' and '-' ("." and ".." excluded); its data any bytes, at most
 * DLOCK_GUARDED_MAX. Where keys live (docs/protocol-*.md): redis (every
 * URL form but redlock; a cluster too, the name's hash tag keeping each
 * key in the lock's slot), the HASH dlock_guarded:{NAME}:KEY; etcd, the
 * key <prefix>dlock_guarded:NAME:KEY, outside the lock's prefix; zk, the
 * node KEY under the child _dlock_keys of the lock node. DLOCK_ENOTSUP,
 * the message saying why: file (the file backend has no store), redlock
 * (no one request checks a majority), postgres and mysql (not yet). */
#define DLOCK_GUARDED_KEY_MAX 128
#define DLOCK_GUARDED_MAX 65536

/* Put LEN bytes at DATA (NULL with LEN 0: empty data, which is a key
 * unlike a deleted one) as KEY of L's name's store, with the token of the
 * owner's hold, in one request the backend checks against that hold
 * (redis: a script that finds the hold; etcd: a transaction comparing the
 * hold's key's create revision; zk: a multi checking the hold's node).
 * Returns DLOCK_OK; DLOCK_ENOTOWNER (the owner holds nothing here);
 * DLOCK_ELOST (the hold was lost, before or as the backend checked it:
 * nothing was written and the hold is lost; release it); DLOCK_EMISUSE
 * (a shared hold: only an exclusive holder writes; after fork or close);
 * DLOCK_EINVAL (L or KEY NULL, a bad key, DATA NULL with LEN > 0, LEN
 * above DLOCK_GUARDED_MAX); DLOCK_ENOTSUP (the backend or URL form keeps
 * no store, the message says why; or L is a permit's or a campaign's
 * handle); DLOCK_ENOMEM; backend failures (the key may or may not have
 * been written; the hold is unchanged). Threads: the holding thread, any
 * thread for a handle-owned hold; not while the owner releases it. */
DLOCK_EXTERN int dlock_guarded_put(dlock_lock *l, const char *key, const void *data, size_t len);

/* Delete KEY of L's name's store, guarded as dlock_guarded_put() is (a
 * key that is not there is deleted already: DLOCK_OK). Returns
 * dlock_guarded_put()'s codes. */
DLOCK_EXTERN int dlock_guarded_delete(dlock_lock *l, const char *key);

/* A read of one key of a name's store: NAME, KEY and BUF of SIZE bytes
 * in (a buffer of DLOCK_GUARDED_MAX bytes is always enough); LEN, the
 * data's length, and TOKEN, the token of the hold that wrote it (0: no
 * such key, LEN then 0), out. */
typedef struct dlock_guarded_read {
    const char *name;
    const char *key;
    void *buf;
    size_t size;
    size_t len;
    uint64_t token;
} dlock_guarded_read;

/* Read R->key of lock R->name's store as R says, unguarded: any client
 * reads any name's keys, held or not; nothing is taken. One request.
 * Returns DLOCK_OK; DLOCK_EINVAL (C or R NULL, a bad name or key, BUF
 * NULL with SIZE > 0, data longer than SIZE: R->len is then its length
 * and BUF untouched); DLOCK_ENOTSUP, DLOCK_EMISUSE as dlock_guarded_put();
 * DLOCK_ENOMEM; backend failures (R->len 0, R->token 0). Threads: any. */
DLOCK_EXTERN int dlock_guarded_get(dlock_client *c, dlock_guarded_read *r);

/* ------------------------------------------------------ inspecting names */

typedef struct dlock_info dlock_info;

/* Look at NAME without taking it. On success *OUT owns a snapshot to give
 * to dlock_info_free(); read it with the getters below (any thread; a
 * NULL snapshot reads as free, 0, NULL). Returns DLOCK_OK; DLOCK_EINVAL (a NULL
 * argument, a bad name); DLOCK_EMISUSE (not connected, after fork or
 * close); DLOCK_ENOMEM; backend failures. On failure *OUT is NULL.
 * Threads: any. Backends: TTL is DLOCK_VALID_FOREVER on file, the key's
 * PTTL on redis, the lease's on etcd, unknown (-1) on zk; waiters are
 * known in order on etcd and zk, unknown (-1) on file and redis; holder
 * identities: "pid@host" (file), "<uuid>:<id>" fields (redis; with
 * " (dlock pid@host)" from a dlock holder's client record), the holder's
 * key or node name (etcd, zk). */
DLOCK_EXTERN int dlock_inspect(dlock_client *c, const char *name, dlock_info **out);
DLOCK_EXTERN void dlock_info_free(dlock_info *i);

DLOCK_EXTERN int dlock_info_held(const dlock_info *i);          /* 1 held, 0 free */
DLOCK_EXTERN dlock_mode dlock_info_mode(const dlock_info *i);
/* The holder's token, or a free name's last one where the backend keeps a
 * counter (file, redis); 0 none known (never issued; etcd, zk: free). */
DLOCK_EXTERN uint64_t dlock_info_token(const dlock_info *i);
/* Remaining lease in ms: DLOCK_VALID_FOREVER without lease, -1 unknown. */
DLOCK_EXTERN int64_t dlock_info_ttl_ms(const dlock_info *i);
/* Where the lock lives in the backend: file path, key, node path. */
DLOCK_EXTERN const char *dlock_info_key(const dlock_info *i);
/* Holders: identity ("pid@host", "<uuid>:<thread>", a node name) and hold
 * count (0 when the backend does not know it). */
DLOCK_EXTERN size_t dlock_info_holder_count(const dlock_info *i);
DLOCK_EXTERN const char *dlock_info_holder(const dlock_info *i, size_t k, unsigned *count);
/* Waiters in order, where the backend knows them; -1 = unknown. */
DLOCK_EXTERN long dlock_info_waiter_count(const dlock_info *i);
DLOCK_EXTERN const char *dlock_info_waiter(const dlock_info *i, size_t k);
/* The name's lock-delay (DLOCK_OPT_LOCK_DELAY_MS): ms left before it may
 * be granted again after a hold that ended without a clean release, as the
 * backend times it; 0 when it is in no delay. File: a holder that died and
 * that no acquirer has found yet shows its whole delay (it starts at the
 * next acquire's look). */
DLOCK_EXTERN int64_t dlock_info_delay_ms(const dlock_info *i);

/* Operator's tool: free NAME whoever holds it. The old holder is not told
 * until its next renewal or release (then DLOCK_ELOST and its lost
 * callback). Returns DLOCK_OK (also when nothing held it); DLOCK_ENOTSUP
 * where the backend cannot take a lock from a live holder (file: the
 * kernel owns it; a file nobody holds is fine); DLOCK_EINVAL,
 * DLOCK_EMISUSE as dlock_inspect(); backend failures (nothing was freed
 * unless the message says so). Threads: any. */
DLOCK_EXTERN int dlock_force_release(dlock_client *c, const char *name);

/* Check a fencing token a request carries (Chubby's CheckSequencer): is
 * TOKEN still the token of the newest hold on NAME, and is that hold
 * alive now? For a service that receives requests carrying a holder's
 * token (dlock_token()) and wants to refuse a stale holder without a
 * fenced store of its own. Returns DLOCK_OK: NAME is held and TOKEN is
 * its holder's (held shared: the newest reader's; an earlier reader's
 * token is stale on every backend); DLOCK_ELOST: stale -- NAME is free,
 * or held with another token (the message says which); a token never
 * issued (0, UINT64_MAX) is stale too, never an error; DLOCK_ENOTSUP for
 * the newest reader's token on file, redis and redlock, which keep one
 * counter and no token per reader, so cannot tell whether that reader
 * still holds (an exclusive hold is always told); DLOCK_EINVAL,
 * DLOCK_EMISUSE as dlock_inspect(); backend failures (then nothing is
 * known: refuse the request, or ask again). Nothing is taken or changed;
 * any client may check any name. The answer is a snapshot: a hold may
 * end just after it, so a service that must never act for a stale holder
 * also checks the token in the store it writes. Threads: any. Backends
 * (what a check sends, and what "alive" means there): file, the kernel
 * lock and the lock file's counter (F_OFD_GETLK and a read: alive = the
 * holder's process holds its descriptor, so a killed holder is stale at
 * once); redis and every Redis URL form, one script
 * reading the lock key and the token counter (alive = the key's lease has
 * not ended: a holder killed -9 reads as current until its lease runs
 * out; a Redisson RLock that takes no token leaves the counter of the
 * last fenced hold); redlock, every node in turn, current when a majority
 * hold NAME with TOKEN; etcd, one range of NAME's keys (alive = the
 * holder's lease, as etcd counts it); zk, the children of NAME's node and
 * the stat of each holder (two requests for an exclusive hold; alive = the
 * holder's session, until ZooKeeper expires it). */
DLOCK_EXTERN int dlock_check(dlock_client *c, const char *name, uint64_t token);

/* Call FN for each lock name known to the backend that matches PATTERN
 * (fnmatch glob; NULL = all), on the calling thread. FN returning
 * non-zero stops the walk (DLOCK_OK). Returns DLOCK_OK; DLOCK_EINVAL (FN
 * NULL); DLOCK_EMISUSE as dlock_inspect(); DLOCK_ENOMEM; backend failures
 * (names already given stay given). Threads: any. Backends: file lists
 * the lock files of the directory, redis SCANs the key space,
 * etcd reads the prefix, zk the children of the base node: file and zk
 * also give names nobody holds now (their files and nodes stay); `dlock
 * list` inspects each and shows the held ones only. */
typedef int (*dlock_list_fn)(const char *name, void *arg);
DLOCK_EXTERN int dlock_list(dlock_client *c, const char *pattern, dlock_list_fn fn, void *arg);

/* ------------------------------------------------------------- semaphores */

/* A counting semaphore: at most PERMITS permits of NAME are held at once
 * across every process and machine using the backend ("at most 4 jobs
 * at once"). One acquire takes K permits as one dlock_permit: an object,
 * not a thread's hold, so any thread may release it (as Redisson's permit
 * ids and Curator's Lease objects), and one thread may hold many. A
 * permit is a hold as a lock's is: it has a lease the keeper renews (the
 * semaphore's lease, else the client's), a validity, a lost callback,
 * and a fencing token where the backend gives one. A permit of a process
 * that died comes back: file at once (the kernel), redis when its lease
 * ends (etcd too), zk when its session does. There is no reentrancy: every acquire takes new permits.
 *
 * Names: a semaphore and a lock of the same name are two things (file:
 * two files; redis: a semaphore's keys are a STRING and a ZSET, a
 * lock's a HASH, so one of them on the other's name is DLOCK_EWRONGTYPE).
 *
 * The permit count is stored with the semaphore where the layout keeps
 * one (file: the file's header; redis: free + held, as Redisson counts;
 * etcd: the key NAME/sem-count; mysql: a row of the table dlock_semaphore;
 * zk: none, Curator's layout keeps no count, so there each client's own
 * count rules its acquires): a semaphore made with another count than the one stored is
 * refused with DLOCK_EINVAL and a message naming both counts, never
 * mixed. To change the count, delete the semaphore while nobody holds
 * it (file: its .sem file; redis: DEL NAME {NAME}:timeout).
 *
 * Backends: file (one file NAME.sem, one OFD byte lock per permit;
 * docs/protocol-file.md), redis in either layout (Redisson's
 * RPermitExpirableSemaphore keys, shared with Redisson clients;
 * docs/protocol-redis.md), zk (Curator's InterProcessSemaphoreV2 nodes,
 * shared with Curator clients; a permit lasts as long as the session, no
 * fixed lease; docs/protocol-zookeeper.md), etcd (a layout of our own:
 * a lease-bound key per permit object under NAME/sem/, queued by create
 * revision; docs/protocol-etcd.md), mysql (permit i the user lock
 * ENC#i, a permit object one session holding K of them; a waiter sleeps
 * in GET_LOCK on one permit at most 500 ms, then tries them all again:
 * not in arrival order; docs/protocol-mysql.md); all five take K > 1 all
 * at once. */
typedef struct dlock_semaphore dlock_semaphore;
typedef struct dlock_permit dlock_permit;

/* The largest permit count of a semaphore. */
#define DLOCK_PERMITS_MAX 1024

/* Make a handle for semaphore NAME with PERMITS permits (1 to
 * DLOCK_PERMITS_MAX). Nothing is acquired and nothing is sent: the count
 * is checked against the stored one by the first acquire or inspect.
 * FLAGS: reserved, must be 0. NAME: as dlock_lock_new().
 * Returns DLOCK_OK; DLOCK_EINVAL (OUT NULL, a bad name, PERMITS out of
 * range, a reserved flag); DLOCK_ENOTSUP (the backend has no semaphores:
 * redlock, where permits counted over majorities would let more than
 * PERMITS hold -- the message says why; every other built-in one has
 * them); DLOCK_EMISUSE (not connected, closed, after fork);
 * DLOCK_ENOMEM. On failure *OUT is NULL. Threads: any; the handle may be
 * used from many threads at once. Free it with dlock_semaphore_free(). */
DLOCK_EXTERN int dlock_semaphore_new(dlock_client *c, const char *name, unsigned permits,
                                     unsigned flags, dlock_semaphore **out);

/* Free a handle. Its asynchronous calls still in flight end first, as
 * dlock_lock_free() ends a handle's: a waiting acquire is canceled, and
 * each completion comes with a NULL S and P and DLOCK_ECANCELED (free S
 * with calls in flight in the dispatching thread or from a callback, not
 * while another thread dispatches). Permits still held through it are
 * then released (best effort; a failed release is not reported and the
 * server's record ends with its lease) and freed: their pointers are
 * invalid afterwards. A running lost callback of one of them is waited
 * for (unless this is called from it). NULL is a no-op. No other thread
 * may use S or its permits then. Also after dlock_client_close() (the
 * permits are gone already). */
DLOCK_EXTERN void dlock_semaphore_free(dlock_semaphore *s);

/* Lease of permits acquired through S from now on, with the rules and
 * codes of dlock_lock_set_lease() (LEASE_MS 0 = the client's;
 * DLOCK_LEASE_FIXED = never renewed). Permits already held keep theirs.
 * Any thread. */
DLOCK_EXTERN int dlock_semaphore_set_lease(dlock_semaphore *s, int64_t lease_ms, unsigned flags);

/* Called once when a permit of S is lost (renewal found it gone, its
 * lease ended unrenewed): on the client's callback thread, with the rules
 * of dlock_lock_on_lost(). P stays valid during the call; the callback
 * may release it (dlock_permit_release() returns DLOCK_ELOST and frees
 * it). dlock_semaphore_on_lost() sets FN (NULL: none) and ARG for permits
 * lost from now on: DLOCK_OK or DLOCK_EINVAL (S NULL). Any thread. The
 * file backend never loses a permit. */
typedef void (*dlock_permit_lost_fn)(dlock_semaphore *s, dlock_permit *p, const char *why,
                                     void *arg);
DLOCK_EXTERN int dlock_semaphore_on_lost(dlock_semaphore *s, dlock_permit_lost_fn fn, void *arg);

/* Take K permits of S at once (1 to the semaphore's count), waiting as
 * dlock_acquire() does: WAIT_MS DLOCK_TRY (0) tries once, > 0 waits up
 * to that many ms, DLOCK_FOREVER until taken; CANCEL (NULL: none) as in
 * dlock_acquire_ex(), and dlock_semaphore_cancel() ends the waits in
 * progress. A wait sleeps until the backend reports a release (file:
 * inotify; redis: Redisson's channel redisson_sc:{NAME}, or the nearest
 * expiry of a permit, which the next try takes back; zk: a child watch on
 * P/leases, while holding Curator's mutex P/locks, so zk waiters are
 * served in arrival order; etcd: a watch of the NAME/sem/ keys, served
 * in arrival order too: a key holds when it and the older keys fit in
 * the count), never on a timer. Elsewhere a waiter for K
 * permits does not hold up a later one that wants fewer: when fewer than
 * K came back, the later one gets them.
 * Returns DLOCK_OK (*OUT owns the permit: give it to
 * dlock_permit_release()); contention: DLOCK_EBUSY (fewer than K free),
 * DLOCK_ETIMEDOUT, DLOCK_ECANCELED; DLOCK_EINVAL (S or OUT NULL, K 0 or
 * above the count, the stored count differs: the message names both);
 * DLOCK_EMISUSE (after fork or close, a cancel object of the parent);
 * DLOCK_ENOMEM; backend failures (DLOCK_EWRONGTYPE: the name holds
 * something that is not a semaphore of this layout).
 * After any failure *OUT is NULL and nothing is held on the server (a
 * request whose reply was lost is undone: redis releases its ids through
 * the keeper, and their lease bounds the harm).
 * Threads: any, many at once. */
DLOCK_EXTERN int dlock_semaphore_acquire(dlock_semaphore *s, unsigned k, int64_t wait_ms,
                                         dlock_cancel *cancel, dlock_permit **out);

/* A lock handle on semaphore NAME of PERMITS permits: every hold taken
 * through it is one permit. For code written against dlock_lock (the
 * CLI's `dlock run --permits N`): dlock_acquire(), dlock_acquire_ex(),
 * dlock_release(), dlock_token(), dlock_validity_ms(),
 * dlock_lock_set_lease(), dlock_lock_on_lost(), dlock_lock_cancel(),
 * dlock_lock_inherit_fd() (file) and dlock_lock_free() work on it with
 * their codes, plus dlock_semaphore_acquire()'s (DLOCK_EINVAL: another
 * stored count). Its holds belong to the handle, as with
 * DLOCK_LOCK_HANDLE_OWNED: one permit per handle (an acquire while the
 * handle holds one re-enters it); make a handle per concurrent holder.
 * FLAGS: reserved, must be 0. Codes and state after failure as
 * dlock_semaphore_new(). Threads: any. */
DLOCK_EXTERN int dlock_lock_new_permits(dlock_client *c, const char *name, unsigned permits,
                                        unsigned flags, dlock_lock **out);

/* Cancel every acquire in progress on S (they return DLOCK_ECANCELED and
 * take nothing), an asynchronous one from its call's return on; acquires
 * that start later are not affected (use a cancel object for those). DLOCK_OK or DLOCK_EINVAL (S NULL). Any
 * thread; not async-signal-safe. */
DLOCK_EXTERN int dlock_semaphore_cancel(dlock_semaphore *s);

/* The semaphore's name and permit count (NULL and 0 for NULL). Any
 * thread. */
DLOCK_EXTERN const char *dlock_semaphore_name(const dlock_semaphore *s);
DLOCK_EXTERN unsigned dlock_semaphore_permits(const dlock_semaphore *s);

/* Give P's permits back and free P, whatever the outcome. Returns
 * DLOCK_OK; DLOCK_ELOST (P had been lost: its lease ended or the server
 * no longer had it; nothing was given back twice. Redis: a release whose
 * reply was lost is sent once more, and a retry that finds nothing to
 * give back is DLOCK_OK only when the server remembers our own first
 * attempt giving the permits back, DLOCK_ELOST otherwise); DLOCK_EINVAL (P
 * NULL); DLOCK_EMISUSE (after fork or close: P is freed, the permits end
 * with the process or their lease); backend failures (the server's
 * record ends with its lease; file never fails). Threads: any, but not
 * twice for one permit nor while another call uses P. */
DLOCK_EXTERN int dlock_permit_release(dlock_permit *p);

/* Asynchronous semaphores (the rules of "asynchronous calls" above): the
 * completion of an asynchronous call on S. RC is what the blocking call
 * would have returned, its message dlock_errmsg() in the callback. P is
 * the permit an acquire took (DLOCK_OK; its id, token and validity
 * readable there, and it is the caller's to release), else NULL: after a
 * failed acquire, and after every release (P was freed, whatever the
 * outcome). S and P are NULL when S was freed before the completion was
 * dispatched (RC then DLOCK_ECANCELED; a permit taken went back with S).
 * Runs in the thread calling dlock_dispatch() on S's client, or in
 * dlock_client_close()'s; it may start the next call, release P. */
typedef void (*dlock_permit_done_fn)(dlock_semaphore *s, dlock_permit *p, int rc, void *arg);

/* dlock_semaphore_acquire() without blocking: start taking K permits of
 * S, waiting as WAIT_MS says, cancelable by CANCEL and by
 * dlock_semaphore_cancel(S). While it waits it holds no thread where the
 * backend parks a permit's wait -- redis (every URL form but redlock,
 * which has no semaphores): Redisson's channel and the nearest permit
 * expiry resume it, as they wake the blocking wait; file: every close of
 * the semaphore file (inotify, one watch per client) resumes the parked
 * permit waits; zk: the wait keeps its place in the queue of Curator's
 * mutex (a watch on the node ahead), then a child watch on the leases
 * resumes it. Elsewhere (etcd, postgres, mysql) DLOCK_TRY works (the
 * blocking call's one try on a pool thread) and a wait is refused with
 * DLOCK_ENOTSUP naming the backend. DONE(S, P, rc, ARG) comes once with
 * dlock_semaphore_acquire()'s codes (DLOCK_ECANCELED also when the
 * client closes meanwhile); after a failure nothing is held. Returns
 * DLOCK_OK (started); DLOCK_EINVAL (S or DONE NULL, K 0 or above the
 * count, a bad WAIT_MS); DLOCK_ENOTSUP (a wait where waits cannot park);
 * DLOCK_ECANCELED (CANCEL fired already); DLOCK_EMISUSE (after close or
 * fork); DLOCK_ENOMEM; DLOCK_EIO (no eventfd, no pool thread). On
 * failure nothing was started and no callback runs. Many calls on one S
 * at once are fine; freeing S ends them (dlock_semaphore_free()).
 * Threads: any; DONE as dlock_permit_done_fn says. */
DLOCK_EXTERN int dlock_semaphore_acquire_async(dlock_semaphore *s, unsigned k, int64_t wait_ms,
                                               dlock_cancel *cancel, dlock_permit_done_fn done,
                                               void *arg);

/* dlock_permit_release() on a pool thread: DONE(S, NULL, rc, ARG) comes
 * with its code, and P is freed whatever it is. Returns DLOCK_OK
 * (started; P is the call's: do not use it again); DLOCK_EINVAL (P or
 * DONE NULL); DLOCK_EMISUSE (after close or fork); DLOCK_ENOMEM;
 * DLOCK_EIO. On failure nothing was started and P is still the
 * caller's. Threads: any, not while another call uses P. */
DLOCK_EXTERN int dlock_permit_release_async(dlock_permit *p, dlock_permit_done_fn done, void *arg);

/* How many permits P holds (K of its acquire; 0 for NULL). Any thread. */
DLOCK_EXTERN unsigned dlock_permit_count(const dlock_permit *p);

/* P's identity at the backend, as dlock_info_holder() shows it: file
 * "pid@host#slot" (the first of K slots), redis the hex of the first of
 * K Redisson permit ids (32 digits), zk the first lease node's name.
 * NULL for NULL. Lives as long as P. Any thread. */
DLOCK_EXTERN const char *dlock_permit_id(const dlock_permit *p);

/* The fencing token of P's acquisition: strictly greater than every
 * token issued before for this semaphore on this backend (file: a counter
 * in the .sem file; redis: INCR of dlock_sem_token:{NAME}, a key
 * Redisson does not use or need; zk: the first lease node's czxid).
 * Returns DLOCK_OK; DLOCK_EINVAL (a NULL
 * argument). Any thread. */
DLOCK_EXTERN int dlock_permit_token(dlock_permit *p, uint64_t *token);

/* Milliseconds P is still guaranteed, as dlock_validity_ms():
 * DLOCK_VALID_FOREVER without a lease (file), 0 once lost or expired,
 * DLOCK_EINVAL for NULL. Any thread. */
DLOCK_EXTERN int64_t dlock_permit_validity_ms(dlock_permit *p);

/* Look at semaphore NAME without taking a permit: a snapshot read with
 * the dlock_info_* getters (held: some permit is held; holders: one per
 * permit object, the id of dlock_permit_id() and its count K; ttl: the
 * longest remaining lease (-1 none held), DLOCK_VALID_FOREVER on file;
 * token: the last
 * one issued; waiters: unknown, -1, but on etcd the queue and on zk the
 * acquirers queued on the semaphore's mutex, in order: the first of them
 * waits with lease nodes made, not counted as held; zk tells those apart
 * only with PERMITS, as it stores no count) and the two below. PERMITS is the
 * count to check against the stored one (0: take the stored count, or
 * report 0 permits when the semaphore was never used).
 * Returns DLOCK_OK; DLOCK_EINVAL (NULL argument, bad name, a stored count
 * other than PERMITS); DLOCK_ENOTSUP (no semaphores on this backend);
 * DLOCK_EMISUSE; DLOCK_ENOMEM; backend failures. On failure *OUT is NULL.
 * Threads: any. Redis: permits whose lease ended count as free; nothing
 * is written (the next acquire takes them back). */
DLOCK_EXTERN int dlock_semaphore_inspect(dlock_client *c, const char *name, unsigned permits,
                                         dlock_info **out);
/* Call FN for each semaphore name known to the backend that matches
 * PATTERN (fnmatch glob; NULL = all), on the calling thread, as
 * dlock_list() does for locks: every semaphore with a permit held, and
 * maybe names nobody holds now (file: every NAME.sem; zk: every node of
 * the base, lock or semaphore), so inspect each (dlock_semaphore_inspect
 * with PERMITS 0) as `dlock list` does. FN returning non-zero stops the
 * walk. Returns DLOCK_OK; DLOCK_EINVAL (FN NULL); DLOCK_ENOTSUP (a
 * backend without semaphores or that cannot enumerate them: redlock);
 * DLOCK_EMISUSE; DLOCK_ENOMEM; backend failures. Threads: any. Backends:
 * file lists the .sem files, redis SCANs for the ZSETs of held permits
 * ({NAME}:timeout), etcd reads the permit keys (NAME/sem/...), zk lists
 * the children of the base node, mysql reads the held permit locks
 * (performance_schema.metadata_locks, as dlock_list()). */
DLOCK_EXTERN int dlock_semaphore_list(dlock_client *c, const char *pattern, dlock_list_fn fn,
                                      void *arg);
/* The semaphore's permit count (0 for a lock's snapshot or an unused
 * semaphore), and how many of them are free now (-1 unknown). */
DLOCK_EXTERN unsigned dlock_info_permits(const dlock_info *i);
DLOCK_EXTERN long dlock_info_free_permits(const dlock_info *i);

/* -------------------------------------------------------------- elections */

/* Leader election: of the processes campaigning for election NAME, one
 * leads at a time, with a VALUE it publishes (its address, say) that
 * anyone can read and follow. A campaign is an exclusive hold of the
 * election, so it has what a lock's hold has: a lease the keeper renews
 * (the election's lease, else the client's), a validity, a callback when
 * leadership is lost, cancel objects, and a fencing token to guard the
 * leader's writes. Leadership belongs to the handle (not a thread): any
 * thread may resign it. A dead leader is replaced: file at once (the
 * kernel), etcd when its lease expires.
 *
 * Layouts. file: election NAME is lock NAME (NAME.lock in the lock
 * directory, the token its counter) plus NAME.leader beside it, the
 * leader's token, a version and its value, written under the lock.
 * etcd: Go's concurrency.Election, so `etcdctl elect NAME PROPOSAL` and
 * dlock campaign in one election and `etcdctl elect -l NAME` observes
 * dlock's leader: key NAME/<lease id hex> with the value as its proposal,
 * the leader is the key with the lowest create revision (the token);
 * election NAME and `etcdctl lock NAME` share those keys, as in Go.
 * zk: Curator's LeaderLatch, so Curator services and dlock share an
 * election: EPHEMERAL_SEQUENTIAL children _c_<uuid>-latch-<seq> of lock
 * node NAME with the value as data, the lowest sequence leads, token its
 * czxid, a dead leader replaced when its session expires (proclaim is a
 * setData on the leader's node, which LeaderLatch itself never does).
 * redis (both layouts, Sentinel, TLS): lock NAME plus the HASH
 * dlock_leader:{NAME} (token, version, value) written by the leader in a
 * script that checks the lock is still its own; the token is the lock's;
 * observers wake by pub/sub (dlock_leader__channel:{NAME}), a dead
 * leader is replaced when its lease expires. redlock: the lock taken on
 * a majority and the same hash on every node, written by the leader on
 * a majority (numbered by the leader) and read from a majority: the
 * leader is the holder a majority shows, with the newest value among
 * them; a proclaim that reaches fewer than a majority fails
 * (DLOCK_EUNAVAIL, or DLOCK_ELOST when too many nodes are no longer the
 * leader's), and so does a read (DLOCK_EUNAVAIL). As sound as Redlock's
 * lock, no more (docs/protocol-redis.md, "Redlock"). mysql: lock NAME
 * plus a row of the table dlock_leader (token, version, connection,
 * value) written by the leader's session in one statement that checks it
 * holds the lock; a dead leader is replaced when its session ends;
 * observers look again every 500 ms (MySQL has no notification;
 * docs/protocol-mysql.md). */
typedef struct dlock_election dlock_election;
typedef struct dlock_leader dlock_leader;

/* Make a handle for election NAME (a lock name). Makes no request.
 * FLAGS: reserved, must be 0. Returns DLOCK_OK (*OUT: free it with
 * dlock_election_free()); DLOCK_EINVAL (NULL argument, bad name, a
 * reserved flag); DLOCK_ENOTSUP (the backend has no elections: the
 * message names it); DLOCK_EMISUSE (after fork or close); DLOCK_ENOMEM.
 * On failure *OUT is NULL. Threads: any; the handle may be used from many
 * threads, but one campaign at a time. */
DLOCK_EXTERN int dlock_election_new(dlock_client *c, const char *name, unsigned flags,
                                    dlock_election **out);

/* Resign if leading (best effort) and free E. NULL is a no-op. Also after
 * dlock_client_close() and in a child after fork (nothing is sent then).
 * Not while another call uses E. */
DLOCK_EXTERN void dlock_election_free(dlock_election *e);

/* Lease of campaigns through E from now on, with dlock_lock_set_lease()'s
 * rules, codes and flags. Any thread. */
DLOCK_EXTERN int dlock_election_set_lease(dlock_election *e, int64_t lease_ms, unsigned flags);

/* Called once, from the client's callback thread, when E's leadership is
 * lost (renewal found its key or lease gone, or its validity passed with
 * no confirmation): stop acting as leader. dlock_election_resign() then
 * returns DLOCK_ELOST and E may campaign again. FN NULL: none. Returns
 * DLOCK_OK or DLOCK_EINVAL (E NULL). The file backend never loses
 * leadership while the process lives. Any thread. */
typedef void (*dlock_election_lost_fn)(dlock_election *e, const char *why, void *arg);
DLOCK_EXTERN int dlock_election_on_lost(dlock_election *e, dlock_election_lost_fn fn, void *arg);

/* Campaign for E's election with VALUE (any text, "" allowed; copied)
 * and return once E leads, waiting as dlock_acquire() does: WAIT_MS
 * DLOCK_TRY (0) tries once, > 0 waits up to that many ms, DLOCK_FOREVER
 * until elected, the write of VALUE included (Redis, Redlock: a lock
 * taken whose value could not be written by then is given back; Redlock
 * owes the nodes that did not answer to the keeper); CANCEL (NULL: none) as in
 * dlock_acquire_ex(). A waiting
 * campaign sleeps until the backend reports the leader gone, never on a
 * timer (etcd: a follower watches only the key before its own, in
 * arrival order). On success VALUE is the leader's value.
 * Returns DLOCK_OK; contention: DLOCK_EBUSY (another leads, try once),
 * DLOCK_ETIMEDOUT, DLOCK_ECANCELED; DLOCK_EINVAL (NULL argument);
 * DLOCK_EMISUSE (E already leads or campaigns: proclaim or resign
 * first; after fork or close; a cancel object of the parent);
 * DLOCK_ENOMEM; backend failures. After any failure E does not lead and
 * nothing of the campaign stays on the server (etcd: a key whose reply
 * was lost is deleted by the keeper; its lease bounds the harm).
 * Threads: any. */
DLOCK_EXTERN int dlock_election_campaign(dlock_election *e, const char *value, int64_t wait_ms,
                                         dlock_cancel *cancel);

/* Cancel a campaign in progress through E (it returns DLOCK_ECANCELED),
 * an asynchronous one from its call's return on. DLOCK_OK or DLOCK_EINVAL
 * (E NULL). Any thread. */
DLOCK_EXTERN int dlock_election_cancel(dlock_election *e);

/* Give up leadership: the next campaigner leads (etcd: its key is
 * deleted; file: the lock is released; the value stays behind but no
 * longer counts). Returns DLOCK_OK; DLOCK_ENOTOWNER (E does not lead);
 * DLOCK_ELOST (leadership had been lost already; E may campaign again);
 * DLOCK_EINVAL; DLOCK_EMISUSE; backend failures (E no longer leads
 * either way: what the server kept ends with its lease). Threads: any. */
DLOCK_EXTERN int dlock_election_resign(dlock_election *e);

/* Replace the leader's value with VALUE (copied) while E leads, in one
 * request guarded by E's token (etcd: a put on E's key only if its create
 * revision is still E's, as Go's Proclaim; file: NAME.leader rewritten
 * under the lock). Observers see the change. Returns DLOCK_OK;
 * DLOCK_ENOTOWNER (E does not lead); DLOCK_ELOST (E's leadership is gone:
 * nothing was written); DLOCK_EINVAL; DLOCK_EMISUSE; backend failures
 * (the value may or may not have changed; leadership is unchanged).
 * Threads: any, one at a time per handle. */
DLOCK_EXTERN int dlock_election_proclaim(dlock_election *e, const char *value);

/* The fencing token of E's leadership (etcd: its key's create revision;
 * file: the lock file's counter), strictly greater than every token
 * issued before for this name. DLOCK_OK; DLOCK_ENOTOWNER (E does not
 * lead); DLOCK_ELOST; DLOCK_EINVAL. Any thread. */
DLOCK_EXTERN int dlock_election_token(dlock_election *e, uint64_t *token);

/* Milliseconds E's leadership is still guaranteed, as dlock_validity_ms()
 * (DLOCK_VALID_FOREVER on file; 0 when not leading or lost). */
DLOCK_EXTERN int64_t dlock_election_validity_ms(dlock_election *e);

/* Asynchronous elections (the rules of "asynchronous calls" above): the
 * completion of an asynchronous call through E. RC is what the blocking
 * call would have returned, its message dlock_errmsg() in the callback;
 * after a won campaign E leads there (dlock_election_token(),
 * dlock_election_validity_ms() and dlock_election_proclaim() work in it).
 * Runs in the thread calling dlock_dispatch() on E's client, or in
 * dlock_client_close()'s; it may start the next call through E (a
 * resign, another campaign), or free E. */
typedef void (*dlock_election_done_fn)(dlock_election *e, int rc, void *arg);

/* dlock_election_campaign() without blocking: start campaigning for E's
 * election with VALUE (copied), waiting as WAIT_MS says, cancelable by
 * CANCEL and by dlock_election_cancel(E). While it waits it holds no
 * thread where the backend parks a campaign's wait -- redis (redis://,
 * sentinel, cluster: the lock's release channel and the leader's lease
 * end resume it), etcd (its key queued, a watch on the key before it),
 * zk (its latch node queued, a watch on the node before it), file
 * (inotify on the lock file) --; elsewhere (redlock, postgres, mysql)
 * DLOCK_TRY works (the blocking call's one try on a pool thread) and a
 * wait is refused with DLOCK_ENOTSUP naming the backend. DONE(E, rc,
 * ARG) comes once with dlock_election_campaign()'s codes (DLOCK_ECANCELED
 * also when the client closes meanwhile); after a failure E does not
 * lead and nothing of the campaign stays on the server, as there.
 * Returns DLOCK_OK (started); DLOCK_EINVAL (E, VALUE or DONE NULL, a bad
 * WAIT_MS); DLOCK_ENOTSUP (a wait where waits cannot park); DLOCK_EBUSY
 * (an asynchronous call through E has not had its callback yet);
 * DLOCK_EMISUSE (E leads or campaigns already; after close or fork);
 * DLOCK_ECANCELED (CANCEL fired already); DLOCK_ENOMEM; DLOCK_EIO (no
 * eventfd, no pool thread). On failure nothing was started, no callback
 * runs and E's value is unchanged. Free E only when no asynchronous call
 * through it waits for its callback (from the callback is fine).
 * Threads: any; DONE as dlock_election_done_fn says. */
DLOCK_EXTERN int dlock_election_campaign_async(dlock_election *e, const char *value,
                                               int64_t wait_ms, dlock_cancel *cancel,
                                               dlock_election_done_fn done, void *arg);

/* dlock_election_resign() on a pool thread: DONE(E, rc, ARG) comes with
 * its code (E no longer leads, whatever it is). Returns DLOCK_OK
 * (started); DLOCK_EINVAL (E or DONE NULL); DLOCK_ENOTOWNER (E does not
 * lead); DLOCK_EBUSY (as above); DLOCK_EMISUSE (after close or fork);
 * DLOCK_ENOMEM; DLOCK_EIO. On failure nothing was started. Threads:
 * any. */
DLOCK_EXTERN int dlock_election_resign_async(dlock_election *e, dlock_election_done_fn done,
                                             void *arg);

/* A lock handle on election NAME whose holds are campaigns with VALUE
 * (copied): for code written against dlock_lock (the CLI's `dlock
 * elect`). dlock_acquire() / dlock_acquire_ex() campaign (DLOCK_EBUSY /
 * DLOCK_ETIMEDOUT: another leads), dlock_release() resigns,
 * dlock_token(), dlock_validity_ms(), dlock_lock_set_lease(),
 * dlock_lock_on_lost(), dlock_lock_cancel(), dlock_lock_free() and the
 * asynchronous dlock_acquire_async() / dlock_release_async() (waits park
 * where dlock_election_campaign_async()'s do) work on it with their codes. Leadership belongs to the handle, as with
 * DLOCK_LOCK_HANDLE_OWNED. FLAGS: reserved, must be 0. Codes and state
 * after failure as dlock_election_new(). Threads: any. */
DLOCK_EXTERN int dlock_lock_new_campaign(dlock_client *c, const char *name, const char *value,
                                         unsigned flags, dlock_lock **out);

/* Read election NAME's leader now: *OUT is a snapshot to read with the
 * dlock_leader_* getters and free with dlock_leader_free(); when nobody
 * leads, dlock_leader_held() is 0. Makes one request (file: reads two
 * files, waiting up to the op timeout for a leader that is writing its
 * value). Returns DLOCK_OK; DLOCK_EINVAL (NULL argument, bad name);
 * DLOCK_ENOTSUP; DLOCK_EMISUSE; DLOCK_ENOMEM; backend failures. On
 * failure *OUT is NULL. Threads: any. */
DLOCK_EXTERN int dlock_election_leader(dlock_client *c, const char *name, dlock_leader **out);

/* Wait until election NAME's leader differs from KNOWN (another leader,
 * no leader, or a new value proclaimed; KNOWN NULL: return the current
 * one at once) and return it as dlock_election_leader() does. WAIT_MS and
 * CANCEL as in dlock_election_campaign(); the wait sleeps until the
 * backend reports a change (file: inotify on the lock and value files;
 * etcd: a watch on the election's prefix), never on a timer; on etcd a
 * proclaim of the value already there is not a change. A
 * transient failure (DLOCK_ECONN: the server restarting, a connection
 * refused or reset; DLOCK_EUNAVAIL: a server loading, no etcd leader) is
 * retried with a backoff (10 ms doubling up to 1 s) until WAIT_MS or
 * CANCEL ends the wait, which then returns that failure (or
 * DLOCK_ECANCELED); other failures (DLOCK_EAUTH...) end it at once.
 * Returns DLOCK_OK, DLOCK_ETIMEDOUT, DLOCK_ECANCELED, or
 * dlock_election_leader()'s codes. Loop on it to follow an election.
 * Threads: any. */
DLOCK_EXTERN int dlock_election_observe(dlock_client *c, const char *name, const dlock_leader *known,
                                        int64_t wait_ms, dlock_cancel *cancel, dlock_leader **out);

/* A leader snapshot's fields: whether anyone leads (1/0), the leader's
 * value ("" when nobody leads), token (0 when nobody leads), identity
 * (file: pid@host; etcd: its key), and a version that changes with every
 * proclaim. Strings live as long as L. NULL L: 0 / "". Any thread. */
DLOCK_EXTERN int dlock_leader_held(const dlock_leader *l);
DLOCK_EXTERN const char *dlock_leader_value(const dlock_leader *l);
DLOCK_EXTERN uint64_t dlock_leader_token(const dlock_leader *l);
DLOCK_EXTERN const char *dlock_leader_id(const dlock_leader *l);
DLOCK_EXTERN uint64_t dlock_leader_version(const dlock_leader *l);
/* Free L; NULL is a no-op. */
DLOCK_EXTERN void dlock_leader_free(dlock_leader *l);

/* ----------------------------------------------------------- multi-locks */

/* A multi-lock: several lock names taken all or nothing, as Redisson's
 * RedissonMultiLock and Curator's InterProcessMultiLock. Its members are
 * ordinary lock handles (DLOCK_LOCK_HANDLE_OWNED) on each name, so every
 * member is a hold like any other: its own token, lease, validity and
 * lost callback, on every backend. Members are taken one by one in one
 * canonical order -- the names sorted bytewise (strcmp) -- whatever the
 * order given, so two multi-locks over overlapping sets, in any order and
 * in any processes, cannot deadlock each other. An acquire that fails
 * (busy, timeout, cancel, an error) releases the members it had taken
 * before returning: nothing of the set stays held. The holds belong to
 * the multi-lock, not to a thread: any thread may release them. There is
 * no reentrancy: acquire while held is DLOCK_EMISUSE. Where the backend
 * can, an exclusive set is first asked for in one request, all or
 * nothing: redis (both layouts; not redlock) one script call, etcd one
 * transaction (members on the client's lease). A set found busy that the
 * caller waits for, and every set elsewhere (file, zk, redlock, shared
 * sets), is taken member by member in the canonical order, one round
 * trip or more each, every member waiting the backend's own way. */
typedef struct dlock_multi dlock_multi;

/* Make a multi-lock over NAMES[0..N) (1 to DLOCK_MULTI_MAX names; each
 * as dlock_lock_new() takes it, copied; no name twice) in MODE, every
 * member in the same mode. Nothing is acquired and nothing is sent.
 * FLAGS: reserved, must be 0.
 * Returns DLOCK_OK; DLOCK_EINVAL (OUT or NAMES NULL, N 0 or above
 * DLOCK_MULTI_MAX, a bad name, a name given twice, a reserved flag);
 * dlock_lock_new()'s codes (DLOCK_ENOTSUP, DLOCK_EMISUSE, DLOCK_ENOMEM).
 * On failure *OUT is NULL. Threads: any; one call at a time on a
 * multi-lock (acquire, release and free are not made against each other).
 * Free it with dlock_multi_free(). */
#define DLOCK_MULTI_MAX 64
DLOCK_EXTERN int dlock_multi_new(dlock_client *c, const char *const *names, size_t n,
                                 dlock_mode mode, unsigned flags, dlock_multi **out);

/* Release what M holds (best effort; in one request where
 * dlock_multi_release() would be one) and free it; its member handles go
 * with it. An asynchronous call through M still in flight ends first, as
 * dlock_lock_free() ends a handle's: a waiting acquire is canceled (what
 * it took goes back), and the completion comes with a NULL M and
 * DLOCK_ECANCELED. Free M with a call in flight in the dispatching
 * thread (or from a callback), not while another thread dispatches.
 * NULL is a no-op. Also after dlock_client_close(). */
DLOCK_EXTERN void dlock_multi_free(dlock_multi *m);

/* Take every member, in the canonical order, within one wait bound:
 * WAIT_MS DLOCK_TRY (0) tries each once (DLOCK_EBUSY at the first one
 * held elsewhere); > 0 bounds the whole set, each member's acquire
 * getting the time left (DLOCK_ETIMEDOUT when it runs out, also when
 * the member that found it gone was tried once); DLOCK_FOREVER waits
 * until all are taken. CANCEL (NULL: none) as in dlock_acquire_ex(): a
 * fire ends the wait of whichever member is waiting.
 * A member taken before that is lost while the set waits for a later
 * one (its lease ran out unrenewed, a force release) is taken again,
 * with the members after it, within the same wait: DLOCK_OK is never
 * returned with a member known lost.
 * Returns DLOCK_OK (every member held); DLOCK_EBUSY, DLOCK_ETIMEDOUT,
 * DLOCK_ECANCELED; DLOCK_EMISUSE (M already holds: release first; after
 * fork or close; a cancel object of the parent); DLOCK_EINVAL (M NULL,
 * a negative WAIT_MS other than DLOCK_FOREVER); dlock_acquire()'s other
 * codes. The message names the member that failed. After any failure
 * nothing of the set is held by M: members already taken were given back
 * (a release that fails at the backend leaves that member's server record
 * to its lease, as dlock_release() does). After DLOCK_ETIMEDOUT and
 * DLOCK_ECANCELED the call still returns at the wait's end (at the
 * cancel) when a server stalls: the members go back within what was
 * left of the wait (nothing after a timeout or a cancel), and what the
 * server did not answer by then is owed to the client's keeper thread
 * (a member whose renewal the keeper has under way right then is given
 * back by the keeper once that renewal returns; a new acquire of M
 * waits for that member until then), so
 * another client may find a member held for a moment more; the same
 * owner taking a member again is never undone by that owed give-back
 * (docs/protocol-*.md, "Multi-locks"). The file backend (no server)
 * gives them back at once. Threads: any. */
DLOCK_EXTERN int dlock_multi_acquire(dlock_multi *m, int64_t wait_ms, dlock_cancel *cancel);

/* Release every member, all of them whatever one returns: in one request
 * where the backend allows it (one script on Redis, one transaction on
 * etcd, each member checked as its own dlock_release() checks it and its
 * waiters woken), else one by one in reverse order. Returns DLOCK_OK; DLOCK_ENOTOWNER (M holds nothing);
 * DLOCK_ELOST (a member had been lost; the others were released);
 * DLOCK_EINVAL (M NULL); the first backend failure of a member (the
 * others were released all the same). M holds nothing afterwards.
 * Threads: any. */
DLOCK_EXTERN int dlock_multi_release(dlock_multi *m);

/* 1 while M holds its members (after a successful acquire, until
 * release), else 0 (also for NULL). Any thread. */
DLOCK_EXTERN int dlock_multi_held(const dlock_multi *m);

/* The number of members (0 for NULL), and member K (0 <= K < count) in
 * the canonical order (NULL when out of range): a lock handle owned by M,
 * to read dlock_lock_name(), dlock_token(), dlock_validity_ms() of that
 * member, or set its dlock_lock_set_lease() before the acquire. Do not
 * acquire, release or free it: go through M. Any thread. */
DLOCK_EXTERN size_t dlock_multi_count(const dlock_multi *m);
DLOCK_EXTERN dlock_lock *dlock_multi_lock(dlock_multi *m, size_t k);

/* Called once for each member hold of M that is lost (the rules of
 * dlock_lock_on_lost(): the client's callback thread, WHY valid during
 * the call): the set is no longer whole; release M (DLOCK_ELOST). FN
 * NULL: none; ARG is passed on. Set it before the acquire. Returns
 * DLOCK_OK or DLOCK_EINVAL (M NULL). Any thread. */
typedef void (*dlock_multi_lost_fn)(dlock_multi *m, dlock_lock *member, const char *why,
                                    void *arg);
DLOCK_EXTERN int dlock_multi_on_lost(dlock_multi *m, dlock_multi_lost_fn fn, void *arg);

/* Asynchronous multi-locks (the rules of "asynchronous calls" above):
 * the completion of an asynchronous call through M. RC is what the
 * blocking call would have returned, its message (naming the member that
 * failed) dlock_errmsg() in the callback; dlock_multi_held(M) and the
 * members (dlock_multi_lock()) are readable there. Runs in the thread
 * calling dlock_dispatch() on M's client, or in dlock_client_close()'s;
 * it may start the next call through M, release, or free M. M is NULL
 * when it was freed before the completion was dispatched (RC then
 * DLOCK_ECANCELED; what the call took went back with M). */
typedef void (*dlock_multi_done_fn)(dlock_multi *m, int rc, void *arg);

/* dlock_multi_acquire() without blocking: start taking every member of
 * M, with its rules (the one request where the backend has it, then
 * member by member in the canonical order, all or nothing, WAIT_MS over
 * the whole set, CANCEL, a member lost meanwhile taken again). Each
 * member waits through its own asynchronous acquire, so the set holds no
 * thread while it waits wherever a lock's wait parks
 * (dlock_acquire_async()). DONE(M, rc, ARG) comes once with
 * dlock_multi_acquire()'s codes (DLOCK_ECANCELED also when the client
 * closes meanwhile); after any failure nothing of the set is held, as
 * there. Returns DLOCK_OK (started); DLOCK_EINVAL (M or DONE NULL, a bad
 * WAIT_MS); DLOCK_ENOTSUP (a wait, WAIT_MS != 0, on a backend whose
 * waits cannot park: the message names it); DLOCK_EMISUSE (M held
 * already; after close or fork); DLOCK_EBUSY (an asynchronous call
 * through M has not had its callback yet); DLOCK_ECANCELED (CANCEL fired
 * already); DLOCK_ENOMEM; DLOCK_EIO (no eventfd, no pool thread). On
 * failure nothing was started and no callback runs. One call through M
 * at a time, blocking or not (dlock_multi_acquire() and
 * dlock_multi_release() meanwhile: DLOCK_EBUSY); free M only when no
 * asynchronous call through it waits for its callback (from the
 * callback is fine). Threads: any; DONE as dlock_multi_done_fn says. */
DLOCK_EXTERN int dlock_multi_acquire_async(dlock_multi *m, int64_t wait_ms, dlock_cancel *cancel,
                                           dlock_multi_done_fn done, void *arg);

/* dlock_multi_release() on a pool thread: DONE(M, rc, ARG) comes with
 * its codes. Returns DLOCK_OK (started); DLOCK_EINVAL (M or DONE NULL);
 * DLOCK_ENOTOWNER (M holds nothing); DLOCK_EBUSY (as above);
 * DLOCK_EMISUSE (after close or fork); DLOCK_ENOMEM; DLOCK_EIO. On
 * failure nothing was started and M is unchanged. Threads: any. */
DLOCK_EXTERN int dlock_multi_release_async(dlock_multi *m, dlock_multi_done_fn done, void *arg);

/* ---------------------------------------------------- observing a client */

/* Levels of the log hook, most severe first. */
typedef enum dlock_log_level {
    DLOCK_LOG_ERROR = 1, /* a hold or permit was lost */
    DLOCK_LOG_WARN = 2,  /* a renewal failed (retried) or was confirmed with
                            less than a sixth of its lease left, a
                            connection or session broke, a failover */
    DLOCK_LOG_INFO = 3,  /* a connection or session came back */
    DLOCK_LOG_DEBUG = 4  /* every hold taken and renewal confirmed */
} dlock_log_level;

/* Log hook: FN(C, LEVEL, MSG, ARG) for each event of client C at LEVEL or
 * more severe than MAX_LEVEL, e.g. "lock 'jobs' lost: ...", "redis
 * 127.0.0.1:6379: reconnected". Off by default (FN NULL turns it off
 * again). MSG is one line without newline, its control characters
 * written as \xHH (as dlock_errmsg()'s), valid during the call.
 * FN runs on whichever thread found the event (the keeper, a backend's
 * own thread, a caller of dlock_acquire()), one call at a time per
 * client, possibly while the library holds the client's locks: it must
 * return soon and must not call dlock functions on C or its handles.
 * Returns DLOCK_OK; DLOCK_EINVAL (C NULL, MAX_LEVEL not a
 * dlock_log_level). Any thread, any time (before or after connecting). */
typedef void (*dlock_log_fn)(dlock_client *c, dlock_log_level level, const char *msg, void *arg);
DLOCK_EXTERN int dlock_client_set_log(dlock_client *c, dlock_log_fn fn, void *arg,
                                      dlock_log_level max_level);

/* Counters of one client since dlock_client_new(), for a metrics system.
 * Fields are only appended: set SIZE to sizeof(dlock_stats) as your
 * header knows it, and dlock_client_stats() fills that many bytes (a
 * program built against an older header gets the fields it knows). */
typedef struct dlock_stats {
    size_t size;               /* in: sizeof(dlock_stats) */
    uint64_t acquisitions;     /* holds and permits taken (re-entries not counted) */
    uint64_t waits;            /* acquires that slept at least once, whatever their outcome */
    uint64_t wait_ms;          /* total time those acquires took, ms */
    uint64_t renewals;         /* renewals the backend confirmed */
    uint64_t renewal_ms;       /* total time from sending those renewals to their confirmation, ms */
    uint64_t renewal_max_ms;   /* the slowest of them, ms */
    uint64_t renewal_failures; /* renewals that failed and were retried */
    uint64_t losses;           /* holds and permits lost */
    uint64_t reconnects;       /* connections or sessions that came back after breaking
                                  (redis: once the server answered on the new one, not
                                  at the connect; zk; etcd's HTTP/2 reconnects are
                                  libcurl's) */
} dlock_stats;

/* Fill ST's first ST->size bytes with C's counters (read one by one, not
 * as one snapshot); ST->size becomes the number of bytes filled (at most
 * this library's sizeof(dlock_stats)). Returns DLOCK_OK; DLOCK_EINVAL (a NULL argument, a
 * SIZE smaller than the first two fields). Any thread. */
DLOCK_EXTERN int dlock_client_stats(const dlock_client *c, dlock_stats *st);

#ifdef __cplusplus
}
#endif
#endif /* DLOCK_H */
