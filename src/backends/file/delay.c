/* delay.c -- the file backend's lock-delay (?lock_delay=): a name whose
 * exclusive hold ended without a clean release is not granted again until
 * the delay has passed.
 *
 * The kernel frees a dead holder's lock at once and runs no code for it,
 * so the hold leaves its own mark: right after an exclusive acquire with a
 * delay the holder writes a record after the file's name -- "held, token
 * T, delay D" -- and a clean release (or a downgrade: the exclusive part
 * ended cleanly) turns it into "released". Whoever next takes byte 0 and
 * finds the record still "held" for the file's last token knows that hold
 * ended some other way (kill -9, a crash, a close without release): it
 * turns the record into "delay running since S", gives byte 0 back, and
 * waits until S + D; every later acquirer reads the same S. All of it is
 * read and written under byte 0 (held exclusively, or shared behind a
 * dead writer), never by a client clock alone:
 *
 * - S is CLOCK_BOOTTIME: one clock for every process of the host, that
 *   nobody sets (settimeofday, NTP steps leave it alone) and that counts
 *   a suspend. The "server" of a host-local lock is the kernel; this is
 *   its clock. With the boot id beside it, so a directory that outlived
 *   a reboot (not /run/lock, a tmpfs) never reads another boot's S: the
 *   delay then starts again, in full.
 * - The delay starts when the end is first seen, not at the death, which
 *   no one records: a waiter is woken by the dying holder's close
 *   (IN_CLOSE_WRITE) and sees it at once; with nobody waiting the delay
 *   starts at the next acquire, later than the death, never earlier.
 *   Inspect, which writes nothing, shows such a name's whole delay.
 *
 * Only exclusive lock holds leave a record (a shared hold's end starts no
 * delay; elections and semaphores have none); every lock acquire, shared
 * or not, with the option or not, honours a record it finds. Versions of
 * dlock before it ignore the record (a mixed fleet has no delay).
 */
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "backend.h"
#include "file.h"

#define DELAY_MAGIC "DLOCKdl\n"

enum { DELAY_HELD = 1, DELAY_RELEASED = 2, DELAY_RUNNING = 3 };

/* After the name, 8-aligned (host byte order, as the header). */
struct delay_record {
    char magic[8];
    uint64_t token;   /* the exclusive hold it is about */
    int64_t delay_ms; /* that hold's lock-delay */
    uint32_t state;   /* DELAY_* */
    uint32_t pad;
    int64_t since_ms; /* DELAY_RUNNING: CLOCK_BOOTTIME ms the end was seen */
    char boot_id[40]; /* the boot of SINCE_MS */
};

_Static_assert(sizeof(struct delay_record) <= FILE_AFTER_MAX, "read with the header");

static off_t record_offset(size_t name_len)
{
    return (off_t)((sizeof(struct header) + name_len + 7) & ~(size_t)7);
}

static int64_t boot_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_BOOTTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void dlock__file_boot_id(char out[40])
{
    memset(out, 0, 40);
    int fd = open("/proc/sys/kernel/random/boot_id", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return; /* no /proc: every look starts the delay again, in full */
    ssize_t n = read(fd, out, 39);
    close(fd);
    for (ssize_t i = 0; i < n; i++)
        if (out[i] == '\n')
            out[i] = 0;
}

/* Whether R (N bytes of it read) is the record of the hold of token
 * H->token, still to be looked at (a record about an older token is
 * another hold's: ignored). */
static bool record_found(const struct header *h, const struct delay_record *r, size_t n)
{
    return n == sizeof *r && memcmp(r->magic, DELAY_MAGIC, 8) == 0 && h->token &&
           r->token == h->token && r->delay_ms > 0 && r->state != DELAY_RELEASED;
}

/* What is left of a running delay R (a record of another boot: all of it,
 * from now). */
static int64_t delay_left(const struct file_state *s, const struct delay_record *r)
{
    if (r->state != DELAY_RUNNING || memcmp(r->boot_id, s->boot_id, sizeof r->boot_id) != 0)
        return r->delay_ms;
    int64_t left = r->since_ms + r->delay_ms - boot_ms();
    return left > r->delay_ms ? r->delay_ms : left > 0 ? left : 0;
}

int dlock__file_delay_look(struct file_state *s, const struct file_delay_req *q, int64_t *left)
{
    struct header h;
    struct delay_record r;
    size_t got = 0;
    *left = 0;
    /* One pread for both: the record is where dlock__file_delay_arm()
     * puts it, after FULL, which the header is checked against (a
     * hand-off's waiter makes this read on its way to the hold). */
    int rc = dlock__file_read_header_after(s, q->fd, q->fname, q->full, &h, &r, sizeof r, &got);
    if (rc)
        return rc;
    if (q->header)
        *q->header = h;
    if (!record_found(&h, &r, got))
        return DLOCK_OK;
    bool foreign_boot = memcmp(r.boot_id, s->boot_id, sizeof r.boot_id) != 0;
    if (q->start && (r.state == DELAY_HELD || foreign_boot)) {
        /* The hold ended without its clean release, seen now: the
         * delay runs from here, for every acquirer alike. */
        r.state = DELAY_RUNNING;
        r.since_ms = boot_ms();
        memcpy(r.boot_id, s->boot_id, sizeof r.boot_id);
        if (pwrite(q->fd, &r, sizeof r, record_offset(strlen(q->full))) != (ssize_t)sizeof r)
            return dlock__errno(dlock__errno_code(errno), errno,
                                "lock file %s/%s: write of its lock-delay record", s->dir,
                                q->fname);
    }
    *left = delay_left(s, &r);
    return DLOCK_OK;
}

int dlock__file_delay_arm(struct file_state *s, const struct file_delay_req *q, uint64_t token,
                          int64_t delay_ms, off_t *at)
{
    struct delay_record r = {.token = token, .delay_ms = delay_ms, .state = DELAY_HELD};
    memcpy(r.magic, DELAY_MAGIC, 8);
    *at = record_offset(strlen(q->full));
    if (pwrite(q->fd, &r, sizeof r, *at) != (ssize_t)sizeof r)
        return dlock__errno(dlock__errno_code(errno), errno,
                            "lock file %s/%s: write of its lock-delay record", s->dir, q->fname);
    return DLOCK_OK;
}

void dlock__file_delay_release(int fd, off_t at)
{
    uint32_t state = DELAY_RELEASED;
    /* A failure leaves "held": the next acquirer waits a delay it did not
     * need to, never the other way round. */
    ssize_t n = pwrite(fd, &state, sizeof state, at + (off_t)offsetof(struct delay_record, state));
    (void)n;
}
