/* file.h -- what the file backend's files share: the lock directory's
 * state, the header every lock and semaphore file starts with, and the
 * helpers that open such files safely, lock their bytes and watch them.
 * mutex.c is the lock (and the backend's table); semaphore.c the
 * counting semaphore, one .sem file per name; election.c the leader
 * election, a value file beside the lock; value.c the value files (an
 * election's, a lock's value); delay.c the lock-delay, a record after the
 * lock file's name; contend.c the contended signal, a file of waiters
 * beside the lock; dir.c the default directory. */
#ifndef DLOCK_FILE_H
#define DLOCK_FILE_H

#include <limits.h>
#include <sys/stat.h>
#include <sys/types.h>

#include "backend.h"

#define MAGIC "DLOCKv1\n"
#define HOST_MAX 64
#define MAX_ENCODED 200
/* How long a try-once acquire retries the metadata byte, which another
 * acquirer holds for a pread and a pwrite. */
#define META_TRY_MS 100

/* The header at offset 0 of every lock and semaphore file (host byte
 * order: the file never leaves this machine). */
struct header {
    char magic[8];
    uint64_t token;     /* last fencing token handed out */
    uint32_t mode;      /* mode of the last acquisition */
    uint32_t pid;       /* last acquirer */
    int64_t since_ms;   /* wall clock of the last acquisition */
    char host[HOST_MAX];
    uint32_t name_len;  /* full name (prefix included) follows */
    uint32_t permits;   /* .sem files: the permit count; lock files: 0 */
};

#define INOTIFY_POOL 16

struct file_state {
    dlock_client *c;
    /* Idle inotify instances: closing one waits for an RCU grace period
     * (milliseconds), so waiters borrow and return them instead. */
    pthread_mutex_t pool_mu;
    int pool[INOTIFY_POOL];
    int pool_wd[INOTIFY_POOL]; /* its last watch, removed when borrowed */
    int npool;
    char *dir;
    int dirfd;
    /* From the directory at open: who owns it, whether others may write
     * in it, and the mode (and group) new lock files get. */
    uid_t dir_uid;
    gid_t dir_gid;
    bool dir_public;   /* writable by others: adopt only trusted files */
    bool group_shared; /* group-writable only: files 0660, its group */
    mode_t file_mode;
    char host[HOST_MAX];
    const char *prefix;
    char boot_id[40]; /* this boot's (delay.c) */
    struct file_contend *contend; /* holders watched for waiters (contend.c) */
    struct file_parker *parker; /* park.c; made under pool_mu when first needed */
};

struct file_hold {
    int fd;
    int waiting_fd; /* its wait's NAME.waiting, slot zeroed, closed after FD (contend.c); -1 */
    bool inherited; /* file_inherit_fd gave children a copy */
    off_t delay_at; /* where its lock-delay record is; 0: it wrote none */
};

enum { LOCK_BYTE = 0, META_BYTE = 1, GATE_BYTE = 2 };

/* Prefix + NAME (caller frees; NULL when out of memory). */
char *dlock__file_full_name(struct file_state *s, const char *name);
/* Open the file of FULL with SUFFIX (".lock", ".sem"), creating it when
 * FLAGS has O_CREAT, its file name into FNAME (NAME_MAX + 1). Refuses
 * what is not a regular file and, in a directory others may write to, a
 * file of an untrusted owner. DLOCK_ENOENT (no message) when absent. */
int dlock__file_open_named(struct file_state *s, const char *full, const char *suffix, int flags,
                           char *fname, int *fd);
/* The same, with the open file's fstat (taken for the checks) in
 * *OPENED. */
int dlock__file_open_named_st(struct file_state *s, const char *full, const char *suffix,
                              int flags, char *fname, int *fd, struct stat *opened);
/* The start of an inspect of FULL's file with SUFFIX: opened read-only
 * (closing it raises no IN_CLOSE_WRITE for the waiters), INFO's key its
 * path and its ttl DLOCK_VALID_FOREVER; returns dlock__file_open_named()'s
 * result. */
int dlock__file_inspect_open(struct file_state *s, const char *full, const char *suffix,
                             struct dlock_info *info, char *fname, int *fd);
/* Whether FNAME in the directory still is the file FD has open. */
bool dlock__file_still_linked(struct file_state *s, int fd, const char *fname);
/* Try (never wait for) an OFD lock of TYPE on byte START. */
int dlock__file_range_lock(int fd, short type, off_t start);
/* A byte of an open file to take with dlock__file_byte_lock(), and
 * what to call it in messages. */
struct file_byte {
    int fd;
    const char *fname; /* the file's name in the directory */
    const char *what;  /* "lock file", "value file" */
    const char *role;  /* "metadata byte (byte 1)" */
    off_t byte;
    short type;        /* F_RDLCK, F_WRLCK */
};
/* Take B's byte by tries on a backoff, never a wait in the kernel: within
 * W's deadline and cancel (W NULL: the op timeout, then DLOCK_ETIMEDOUT;
 * try-once: META_TRY_MS, then DLOCK_EBUSY). Every byte lock that may
 * have to wait goes through here. */
int dlock__file_byte_lock(struct file_state *s, const struct file_byte *b, struct dlock__wait *w);
/* The metadata byte (byte 1) of lock file FD in TYPE, as above. */
int dlock__file_meta_lock(struct file_state *s, int fd, const char *fname, short type, struct dlock__wait *w);
/* Read the header (checking the stored name against FULL when given);
 * all zero for a new empty file; DLOCK_EWRONGTYPE for another file. */
int dlock__file_read_header(struct file_state *s, int fd, const char *path, const char *full,
                            struct header *h);
/* The same pread going on past the name, 8-aligned, for AFTER_LEN (at
 * most FILE_AFTER_MAX) bytes more into AFTER (delay.c's record, read
 * with the header it belongs to); *GOT: how many of them the file had. */
#define FILE_AFTER_MAX 128
int dlock__file_read_header_after(struct file_state *s, int fd, const char *path,
                                  const char *full, struct header *h, void *after,
                                  size_t after_len, size_t *got);
/* An inotify instance with no watch and no pending event, and giving it
 * back with its watch WD. */
int dlock__file_inotify_borrow(struct file_state *s);
void dlock__file_inotify_return(struct file_state *s, int fd, int wd);

/* One try's frame in dlock__file_wait_take(). FRESH: the first try on
 * this descriptor (the file was opened again). RETRY_AT: DLOCK__NEVER
 * before each try; a try answering DLOCK_EBUSY for a reason no close of
 * the file ends (a lock-delay) sets when to try again at the latest
 * (monotonic ms). */
struct file_turn {
    bool fresh;
    int64_t retry_at;
};
/* One try at taking what the caller wants of the file FD has open (FULL:
 * the prefixed name it is the file of): DLOCK_OK (taken), DLOCK_EBUSY
 * (not now), or a failure. */
typedef int (*file_try_fn)(struct file_state *s, int fd, const char *fname, const char *full,
                           struct dlock__wait *w, struct file_turn *turn, void *arg);
/* One acquire's file between its tries, for the blocking wait
 * (dlock__file_acquire_by) and a parked asynchronous one (park.c): what
 * it takes and how, the descriptor it keeps open across tries (its own
 * close would wake the other waiters, and it holds a waiting writer's
 * gate), and the watch that tells it the file was closed. The caller
 * sets the first six members, then dlock__file_take_begin(). */
struct file_take;
/* How a take watches its file: watch() arms T->wd on T->fd's file for
 * what may end the wait (dlock__file_watch_add) on an instance it keeps
 * in T->ifd, and DLOCK_OK (T->degraded set when the user is out of
 * inotify instances or watches: tries on a backoff of 1 to 100 ms
 * instead); unwatch() undoes what watch() did, if anything. */
struct file_watch_ops {
    int (*watch)(struct file_take *t);
    void (*unwatch)(struct file_take *t);
};
struct file_take {
    struct file_state *s;
    const char *full, *suffix; /* the prefixed name; ".lock", ".sem" */
    file_try_fn try_take;
    void *arg; /* TRY_TAKE's */
    const struct file_watch_ops *ops;
    char fname[NAME_MAX + 1];
    int fd;      /* the file; -1 when not open */
    int ifd, wd; /* the watch's inotify instance and watch; -1: none */
    bool degraded;
    bool known;         /* OPENED is FD's identity (an open file's never changes) */
    struct stat opened;
    bool undrained;     /* a blocking wake's inotify events are still queued */
    struct dlock__backoff backoff;
    struct file_turn turn;
};
/* Open T's file for writing (creating it). On a failure T->fd is -1. */
int dlock__file_take_begin(struct file_take *t);
/* Tries at T's file until one answers DLOCK_OK (taken: T->fd holds it),
 * a failure, or DLOCK_EBUSY once the file is watched (the first busy try
 * arms the watch and tries again, so a release in between is seen; a
 * try-once W: after one try, no watch). Then the waiter sleeps until the
 * watch fires, T->turn.retry_at, or with T->degraded a backoff. A file
 * deleted or replaced meanwhile is closed (giving back what was taken)
 * and the name opened and watched again. */
int dlock__file_take_step(struct file_take *t, struct dlock__wait *w);
/* The end of T: its watch undone, its descriptor (if still T's) closed,
 * which gives back whatever it locked. */
void dlock__file_take_end(struct file_take *t);
/* inotify_add_watch() of T->fd's file on T->ifd (-1: none to be had)
 * into T->wd, for IN_CLOSE_WRITE (a release, a holder's death), a
 * downgrade's IN_ATTRIB and the file's deletion or move. DLOCK_OK, with
 * T->degraded set when the user is out of inotify instances or watches
 * (per-user limits); else a failure. */
int dlock__file_watch_add(struct file_take *t);

/* park.c: the parked waits' watch. One inotify instance per client and
 * one thread reading it wake the parked asynchronous acquires (P->w)
 * whose file was closed: every waiter of a shared hold and the
 * longest-waiting exclusive one, which passes the wake on if it leaves
 * without using it; every waiter on any other event of the file. */
struct file_park {
    struct file_take t; /* first: the watch ops find the park from it */
    struct dlock__wait *w;
    bool shared;              /* woken by every close (a shared hold's
                                 waiter, a permit's), not one at a time */
    struct park_watch *watch; /* its file's, while watched */
    bool begun;               /* T made (dlock__file_park_take) */
};
/* What a parked take takes: the file of the hold's name with SUFFIX,
 * by TRY_TAKE with ARG; SHARED as in struct file_park. */
struct file_park_req {
    const char *suffix;
    file_try_fn try_take;
    void *arg;
    bool shared;
};
/* One attempt of the parked take P (zeroed before the first, which makes
 * its take as RQ says, watched by the client's parked-wait watch) at
 * hold H within W: dlock__file_take_step() once, W's retry time set when
 * busy; on DLOCK_OK H keeps the descriptor (h->bdata), as a blocking
 * acquire's hold does. The try_armed() of every file hold (mutex.c). */
int dlock__file_park_take(struct file_state *s, struct dlock__hold *h, struct dlock__wait *w,
                          struct file_park *p, const struct file_park_req *rq);
/* The end of P (its watch undone, its descriptor closed unless H kept
 * it, its name freed); P itself is the caller's. */
void dlock__file_park_end(struct file_park *p);
/* The disarm() of a try_armed() whose PARK is a bare struct file_park
 * (a campaign's, a permit's): its end, and PARK freed. */
int dlock__file_park_disarm(void *state, struct dlock__hold *h, struct dlock__wait *w, void *park,
                            int rc);
extern const struct file_watch_ops dlock__file_parked_watch;
/* P is about to try: a wake it was given is used now. */
void dlock__file_park_ack(struct file_park *p);
/* The retry time of a parked take's busy try (backend.h: try_armed):
 * a lock-delay's end, a degraded take's backoff. */
void dlock__file_park_busy(struct file_park *p);
/* Stop the client's watch thread (every park ended before). */
void dlock__file_parker_free(struct file_state *s);

/* The frame of every acquire: the file of HOLD's name (prefixed) with
 * SUFFIX taken by TRY_TAKE with ARG, waiting as dlock__file_wait_take()
 * does, and its descriptor kept by HOLD (h->bdata) until the release.
 * TRY_TAKE does all the taking, the token included; on a failure the
 * descriptor (if any) is closed, which gives back what it locked. */
int dlock__file_acquire_by(struct file_state *s, struct dlock__hold *hold, const char *suffix,
                           struct dlock__wait *w, file_try_fn try_take, void *arg);

/* mutex.c: the lock, for the election built on it. dlock__file_stamp(): issue the
 * next token into *TOKEN and record the holder in FD's header (the
 * metadata byte taken inside for a shared MODE; an exclusive caller that
 * holds it already keeps it). */
int dlock__file_stamp(struct file_state *s, int fd, const char *fname, const char *full, dlock_mode mode,
          struct dlock__wait *w, uint64_t *token);
/* The header write every acquire ends with: H (as read) stamped with
 * the next token, MODE, PERMITS (0 for a lock file) and us, written to
 * FD at offset 0 with FULL after it when the file is new. */
int dlock__file_write_stamp(struct file_state *s, int fd, const char *fname, const char *full,
                            struct header *h, dlock_mode mode, uint32_t permits);
int dlock__file_release(void *state, struct dlock__hold *hold);
int dlock__file_inspect(void *state, const char *name, struct dlock_info *info);
/* dlock__file_inspect() within W's bound (the metadata byte's wait; NULL:
 * the op timeout). */
int dlock__file_inspect_within(struct file_state *s, const char *name, struct dlock_info *info,
                               struct dlock__wait *w);

/* value.c: value files, a small file beside a lock file its holder
 * writes and anyone reads (a lock's NAME.value, an election's
 * NAME.leader), and the lock value ops. */
struct file_value_kind {
    const char *suffix; /* ".value", ".leader" */
    const char *magic;  /* 8 bytes */
    size_t max;         /* the longest value */
    const char *what;   /* "lock", "election": in messages */
};
extern const struct file_value_kind dlock__file_lock_value;
/* A write of a value file: NAME's file of KIND gets DATA (LEN bytes)
 * with TOKEN, within W's bound (NULL: the op timeout); GUARD (NULL:
 * none), called with the file's byte held, refuses the write when it
 * returns a failure. */
struct file_value_req {
    const struct file_value_kind *kind;
    const char *name;
    uint64_t token;
    const void *data;
    size_t len;
    struct dlock__wait *w;
    int (*guard)(struct file_state *s, const char *full, void *arg);
    void *guard_arg;
};
int dlock__file_value_write(struct file_state *s, const struct file_value_req *r);
/* What a value file holds: DATA malloc'd (LEN bytes and a NUL), the
 * writer's TOKEN and the VERSION; an absent or foreign file reads as
 * token 0 and "". */
struct file_value {
    char *data;
    size_t len;
    uint64_t token, version;
};
int dlock__file_value_read(struct file_state *s, const struct file_value_kind *k, const char *full,
                           struct file_value *out, struct dlock__wait *w);
extern const struct dlock__value_ops dlock__file_value_ops;

/* contend.c: the contended signal. A wait's slot in NAME.waiting: FD -1
 * until announced; TRIED once it tried (one announcement per wait). */
struct file_waiting {
    int fd;
    int slot;
    bool tried;
};
#define FILE_WAITING_INIT {.fd = -1}
/* A waiter of the lock FULL (prefixed name) whose try was busy says so,
 * once per wait W, for a holder that listens; best effort (logged). */
void dlock__file_wait_announce(struct file_state *s, const char *full, struct file_waiting *wt);
/* The wait is over (taken, given up): its slot is freed. */
void dlock__file_wait_leave(struct file_waiting *wt);
/* The wait is over, the lock taken into FH: its slot is zeroed now and
 * the file (the slot's lock with it) kept by FH until the release. */
void dlock__file_wait_settle(struct file_waiting *wt, struct file_hold *fh);
extern const struct dlock__contend_ops dlock__file_contend_ops;
/* The watching thread stopped and every watch freed (the client's close). */
void dlock__file_contend_stop(struct file_state *s);

/* delay.c: the lock-delay record of the lock file FD has open (FNAME,
 * FULL as for dlock__file_read_header). */
struct file_delay_req {
    int fd;
    const char *fname, *full;
    bool start; /* an acquirer holding byte 0: a hold found ended without
                   its clean release starts its delay now (inspect: false,
                   nothing written) */
    struct header *header; /* not NULL: the file's header, as read, for an
                              exclusive acquirer's stamp (no second read) */
};
/* *LEFT: the ms left of the name's lock-delay (0: none), from the record
 * of the file's last hold. */
int dlock__file_delay_look(struct file_state *s, const struct file_delay_req *q, int64_t *left);
/* Record that the exclusive hold of TOKEN (just stamped) has a delay of
 * DELAY_MS should it end without a clean release; *AT: where, for
 * dlock__file_delay_release(). */
int dlock__file_delay_arm(struct file_state *s, const struct file_delay_req *q, uint64_t token,
                          int64_t delay_ms, off_t *at);
/* The clean end of the hold whose record is at AT in FD (its holder still
 * holds byte 0 exclusively). */
void dlock__file_delay_release(int fd, off_t at);
/* This boot's id (/proc/sys/kernel/random/boot_id; "" without /proc). */
void dlock__file_boot_id(char out[40]);

/* election.c */
int dlock__file_elect_acquire(void *state, struct dlock__hold *h, struct dlock__wait *w);
int dlock__file_elect_try_armed(void *state, struct dlock__hold *h, struct dlock__wait *w,
                                void **park);

int dlock__file_elect_proclaim(void *state, struct dlock__hold *h, const char *value);
int dlock__file_elect_observe(void *state, const char *name, const struct dlock_leader *known,
                              struct dlock__wait *w, struct dlock_leader *out);

/* dir.c: whether DIR is (one of the names of) our default directory,
 * which is made when missing and held to stricter checks; and making it
 * (mode 0700) at the connect, checking that it still is the one
 * dlock__file_default_dir() picks. */
bool dlock__file_is_default_dir(const char *dir);
int dlock__file_make_default_dir(const char *dir);

/* semaphore.c */
int dlock__file_sem_acquire(void *state, struct dlock__hold *h, struct dlock__wait *w);
int dlock__file_sem_release(void *state, struct dlock__hold *h);
int dlock__file_sem_try_armed(void *state, struct dlock__hold *h, struct dlock__wait *w,
                              void **park);
int dlock__file_sem_inspect(void *state, const char *name, unsigned permits, struct dlock_info *info);

#endif
