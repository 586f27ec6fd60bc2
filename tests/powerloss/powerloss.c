/*
 * Simulated power loss for tests: an LD_PRELOAD library that keeps, beside
 * every file under $WHARF_POWERLOSS_DIR, the content the file would have
 * after a power cut, i.e. what was made durable with fsync or fdatasync.
 *
 * Model (the one LazyFS uses): a write only reaches the page cache; fsync or
 * fdatasync of a file (through any of its descriptors) makes everything
 * written to it so far durable; syncfs and sync make every file durable.
 * Nothing else does: not close, not sync_file_range, not time passing.
 *
 * The durable image of <dir>/<path> is <shadow>/<path>, where <shadow> is
 * $WHARF_POWERLOSS_SHADOW. A sync copies the byte ranges written since the
 * previous sync from the file into its shadow and gives the shadow the
 * file's length. The test harness simulates the power cut after SIGKILL:
 * every file under <dir> is replaced by its shadow, and a file without one
 * (never synced) is deleted (tests/src/powerloss.rs).
 *
 * Across processes: the page cache outlives a killed process, so the
 * first sync of a file by a process copies the whole file (what an earlier
 * process wrote and never synced becomes durable with it, as on a real
 * system); later syncs copy the ranges this process wrote. An ftruncate
 * since the last sync cuts the shadow first, so space the file grows into
 * again without being written reads as zeros, not as stale bytes.
 *
 * Simplifications (documented in docs/RELIABILITY.md): renames and unlinks
 * are durable at once (they are applied to the shadow too); a directory
 * fsync is not needed for a new file to survive; writes through mmap are
 * not seen (sled does not write through mmap).
 *
 * Without $WHARF_POWERLOSS_DIR and $WHARF_POWERLOSS_SHADOW it only passes
 * calls through.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

#define MAX_FDS 65536
#define MAX_FILES 4096

struct range {
    off_t off;
    size_t len;
};

struct tracked_file {
    int used;
    char rel[PATH_MAX];
    struct range *ranges;
    size_t n_ranges, cap_ranges;
    /* ftruncate since the last sync: the shortest length it set. A sync
     * cuts the shadow there first, so a region the file later grows into
     * without writing it reads as zeros, as on a real file system, not as
     * the bytes it held before the truncation. */
    int truncated;
    off_t min_len;
    /* Synced at least once by this process. The first sync copies the
     * whole file: the page cache outlives a killed process, so what an
     * earlier process wrote and never synced is still in the file, and
     * this sync makes it durable as well (it is not in `ranges`). */
    int synced_once;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct tracked_file files[MAX_FILES];
/* fd -> index into files + 1 (0: not tracked) */
static int fd_file[MAX_FDS];
static char dir[PATH_MAX];
static char shadow[PATH_MAX];
static size_t dir_len;
static int state; /* 0 unknown, 1 active, -1 off */

static int (*real_open)(const char *, int, ...);
static int (*real_openat)(int, const char *, int, ...);
static ssize_t (*real_write)(int, const void *, size_t);
static ssize_t (*real_pwrite)(int, const void *, size_t, off_t);
static ssize_t (*real_writev)(int, const struct iovec *, int);
static ssize_t (*real_pwritev)(int, const struct iovec *, int, off_t);
static int (*real_fsync)(int);
static int (*real_fdatasync)(int);
static int (*real_ftruncate)(int, off_t);
static int (*real_close)(int);
static int (*real_dup)(int);
static int (*real_dup2)(int, int);
static int (*real_dup3)(int, int, int);
static int (*real_fcntl)(int, int, ...);
static int (*real_rename)(const char *, const char *);
static int (*real_renameat)(int, const char *, int, const char *);
static int (*real_unlink)(const char *);
static int (*real_unlinkat)(int, const char *, int);
static int (*real_syncfs)(int);
static void (*real_sync)(void);

#define LOAD(name) real_##name = dlsym(RTLD_NEXT, #name)

static void init(void) {
    if (state != 0)
        return;
    LOAD(open);
    LOAD(openat);
    LOAD(write);
    LOAD(pwrite);
    LOAD(writev);
    LOAD(pwritev);
    LOAD(fsync);
    LOAD(fdatasync);
    LOAD(ftruncate);
    LOAD(close);
    LOAD(dup);
    LOAD(dup2);
    LOAD(dup3);
    LOAD(fcntl);
    LOAD(rename);
    LOAD(renameat);
    LOAD(unlink);
    LOAD(unlinkat);
    LOAD(syncfs);
    LOAD(sync);
    const char *d = getenv("WHARF_POWERLOSS_DIR");
    const char *s = getenv("WHARF_POWERLOSS_SHADOW");
    if (!d || !s || !realpath(d, dir) || strlen(s) >= sizeof(shadow)) {
        state = -1;
        return;
    }
    strcpy(shadow, s);
    dir_len = strlen(dir);
    state = 1;
}

/* The path relative to dir of an absolute path, or NULL. */
static const char *relative(const char *abs) {
    if (strncmp(abs, dir, dir_len) == 0 && abs[dir_len] == '/')
        return abs + dir_len + 1;
    return NULL;
}

static void mkdirs(const char *path) {
    char buf[PATH_MAX];
    snprintf(buf, sizeof(buf), "%s", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p == '/') {
            *p = 0;
            mkdir(buf, 0755);
            *p = '/';
        }
    }
}

static void shadow_path(char *out, const char *rel) {
    snprintf(out, PATH_MAX, "%s/%s", shadow, rel);
}

static void copy_range(int src, int dst, off_t off, size_t left) {
    static char buf[1 << 16];
    while (left > 0) {
        size_t n = left < sizeof(buf) ? left : sizeof(buf);
        ssize_t got = pread(src, buf, n, off);
        if (got <= 0)
            break;
        real_pwrite(dst, buf, (size_t)got, off);
        off += got;
        left -= (size_t)got;
    }
}

/* Copy what was written to files[i] since its last sync into its shadow. */
static void sync_file(int i) {
    struct tracked_file *f = &files[i];
    char real_path[PATH_MAX], sh[PATH_MAX];
    snprintf(real_path, sizeof(real_path), "%s/%s", dir, f->rel);
    shadow_path(sh, f->rel);
    mkdirs(sh);
    int src = real_open(real_path, O_RDONLY | O_CLOEXEC);
    if (src < 0)
        return;
    int dst = real_open(sh, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    if (dst < 0) {
        real_close(src);
        return;
    }
    struct stat st;
    if (f->truncated)
        real_ftruncate(dst, f->min_len);
    f->truncated = 0;
    if (!f->synced_once) {
        if (fstat(src, &st) == 0)
            copy_range(src, dst, 0, (size_t)st.st_size);
    } else {
        for (size_t r = 0; r < f->n_ranges; r++)
            copy_range(src, dst, f->ranges[r].off, f->ranges[r].len);
    }
    f->synced_once = 1;
    if (fstat(src, &st) == 0)
        real_ftruncate(dst, st.st_size);
    real_close(dst);
    real_close(src);
    f->n_ranges = 0;
}

/* Cheap check before the extra syscalls of write(): racy but only ever
 * stale for a descriptor being opened or closed concurrently. */
static int is_tracked(int fd) {
    return state == 1 && fd >= 0 && fd < MAX_FDS && fd_file[fd] != 0;
}

static void record(int fd, off_t off, ssize_t len) {
    if (state != 1 || fd < 0 || fd >= MAX_FDS || len <= 0)
        return;
    pthread_mutex_lock(&lock);
    int i = fd_file[fd] - 1;
    if (i >= 0) {
        struct tracked_file *f = &files[i];
        if (f->n_ranges > 0) {
            struct range *last = &f->ranges[f->n_ranges - 1];
            if (last->off + (off_t)last->len == off) {
                last->len += (size_t)len;
                pthread_mutex_unlock(&lock);
                return;
            }
        }
        if (f->n_ranges == f->cap_ranges) {
            size_t cap = f->cap_ranges ? f->cap_ranges * 2 : 16;
            struct range *r = realloc(f->ranges, cap * sizeof(*r));
            if (!r) {
                pthread_mutex_unlock(&lock);
                return;
            }
            f->ranges = r;
            f->cap_ranges = cap;
        }
        f->ranges[f->n_ranges].off = off;
        f->ranges[f->n_ranges].len = (size_t)len;
        f->n_ranges++;
    }
    pthread_mutex_unlock(&lock);
}

/* Start tracking a new descriptor if it is a regular file under dir. */
static void track(int fd) {
    if (state != 1 || fd < 0 || fd >= MAX_FDS)
        return;
    char link[64], abs[PATH_MAX];
    snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, abs, sizeof(abs) - 1);
    if (n <= 0)
        return;
    abs[n] = 0;
    const char *rel = relative(abs);
    struct stat st;
    if (!rel || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
        return;
    pthread_mutex_lock(&lock);
    int free_slot = -1, found = -1;
    for (int i = 0; i < MAX_FILES; i++) {
        if (files[i].used && strcmp(files[i].rel, rel) == 0) {
            found = i;
            break;
        }
        if (!files[i].used && free_slot < 0)
            free_slot = i;
    }
    if (found < 0 && free_slot >= 0) {
        found = free_slot;
        files[found].used = 1;
        snprintf(files[found].rel, PATH_MAX, "%s", rel);
        files[found].n_ranges = 0;
        files[found].truncated = 0;
        files[found].synced_once = 0;
    }
    fd_file[fd] = found + 1;
    pthread_mutex_unlock(&lock);
}

static void untrack(int fd) {
    if (state != 1 || fd < 0 || fd >= MAX_FDS)
        return;
    pthread_mutex_lock(&lock);
    fd_file[fd] = 0;
    pthread_mutex_unlock(&lock);
}

static void copy_tracking(int from, int to) {
    if (state != 1 || from < 0 || from >= MAX_FDS || to < 0 || to >= MAX_FDS)
        return;
    pthread_mutex_lock(&lock);
    fd_file[to] = fd_file[from];
    pthread_mutex_unlock(&lock);
}

static void sync_fd(int fd) {
    if (state != 1 || fd < 0 || fd >= MAX_FDS)
        return;
    pthread_mutex_lock(&lock);
    int i = fd_file[fd] - 1;
    if (i >= 0)
        sync_file(i);
    pthread_mutex_unlock(&lock);
}

static void sync_all_files(void) {
    if (state != 1)
        return;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < MAX_FILES; i++)
        if (files[i].used)
            sync_file(i);
    pthread_mutex_unlock(&lock);
}

static mode_t mode_arg(int flags, va_list ap) {
    return (flags & (O_CREAT | O_TMPFILE)) ? (mode_t)va_arg(ap, int) : 0;
}

/* The four open calls: take the optional mode, open, follow the result. */
#define DEFINE_OPEN(name, real_call, ...)                  \
    int name(__VA_ARGS__, int flags, ...) {                 \
        init();                                             \
        va_list ap;                                         \
        va_start(ap, flags);                                \
        mode_t mode = mode_arg(flags, ap);                  \
        va_end(ap);                                         \
        int fd = real_call;                                 \
        track(fd);                                          \
        return fd;                                          \
    }

DEFINE_OPEN(open, real_open(path, flags, mode), const char *path)
DEFINE_OPEN(open64, real_open(path, flags, mode), const char *path)
DEFINE_OPEN(openat, real_openat(dirfd, path, flags, mode), int dirfd, const char *path)
DEFINE_OPEN(openat64, real_openat(dirfd, path, flags, mode), int dirfd, const char *path)

int creat(const char *path, mode_t mode) {
    return open(path, O_CREAT | O_WRONLY | O_TRUNC, mode);
}

int creat64(const char *path, mode_t mode) {
    return open(path, O_CREAT | O_WRONLY | O_TRUNC, mode);
}

ssize_t write(int fd, const void *buf, size_t n) {
    init();
    off_t off = is_tracked(fd) ? lseek(fd, 0, SEEK_CUR) : -1;
    if (off >= 0 && (real_fcntl(fd, F_GETFL) & O_APPEND))
        off = lseek(fd, 0, SEEK_END);
    ssize_t r = real_write(fd, buf, n);
    if (off >= 0)
        record(fd, off, r);
    return r;
}

int ftruncate(int fd, off_t len) {
    init();
    int r = real_ftruncate(fd, len);
    if (r == 0 && is_tracked(fd)) {
        pthread_mutex_lock(&lock);
        int i = fd_file[fd] - 1;
        if (i >= 0) {
            struct tracked_file *f = &files[i];
            if (!f->truncated || len < f->min_len)
                f->min_len = len;
            f->truncated = 1;
        }
        pthread_mutex_unlock(&lock);
    }
    return r;
}

int ftruncate64(int fd, off_t len) {
    return ftruncate(fd, len);
}

ssize_t pwrite(int fd, const void *buf, size_t n, off_t off) {
    init();
    ssize_t r = real_pwrite(fd, buf, n, off);
    record(fd, off, r);
    return r;
}

ssize_t pwrite64(int fd, const void *buf, size_t n, off_t off) {
    return pwrite(fd, buf, n, off);
}

ssize_t writev(int fd, const struct iovec *iov, int cnt) {
    init();
    off_t off = is_tracked(fd) ? lseek(fd, 0, SEEK_CUR) : -1;
    ssize_t r = real_writev(fd, iov, cnt);
    if (off >= 0)
        record(fd, off, r);
    return r;
}

ssize_t pwritev(int fd, const struct iovec *iov, int cnt, off_t off) {
    init();
    ssize_t r = real_pwritev(fd, iov, cnt, off);
    record(fd, off, r);
    return r;
}

ssize_t pwritev64(int fd, const struct iovec *iov, int cnt, off_t off) {
    return pwritev(fd, iov, cnt, off);
}

int fsync(int fd) {
    init();
    int r = real_fsync(fd);
    if (r == 0)
        sync_fd(fd);
    return r;
}

int fdatasync(int fd) {
    init();
    int r = real_fdatasync(fd);
    if (r == 0)
        sync_fd(fd);
    return r;
}

int syncfs(int fd) {
    init();
    int r = real_syncfs(fd);
    if (r == 0)
        sync_all_files();
    return r;
}

void sync(void) {
    init();
    real_sync();
    sync_all_files();
}

int close(int fd) {
    init();
    untrack(fd);
    return real_close(fd);
}

int dup(int fd) {
    init();
    int r = real_dup(fd);
    copy_tracking(fd, r);
    return r;
}

int dup2(int fd, int to) {
    init();
    int r = real_dup2(fd, to);
    copy_tracking(fd, r);
    return r;
}

int dup3(int fd, int to, int flags) {
    init();
    int r = real_dup3(fd, to, flags);
    copy_tracking(fd, r);
    return r;
}

int fcntl(int fd, int cmd, ...) {
    init();
    va_list ap;
    va_start(ap, cmd);
    void *arg = va_arg(ap, void *);
    va_end(ap);
    int r = real_fcntl(fd, cmd, arg);
    if (cmd == F_DUPFD || cmd == F_DUPFD_CLOEXEC)
        copy_tracking(fd, r);
    return r;
}

int fcntl64(int fd, int cmd, ...) {
    va_list ap;
    va_start(ap, cmd);
    void *arg = va_arg(ap, void *);
    va_end(ap);
    return fcntl(fd, cmd, arg);
}

/* Absolute path of `path` relative to dirfd (AT_FDCWD or a directory). */
static int absolute(int dirfd, const char *path, char *out) {
    char base[PATH_MAX];
    if (path[0] == '/') {
        snprintf(out, PATH_MAX, "%s", path);
        return 0;
    }
    if (dirfd == AT_FDCWD) {
        if (!getcwd(base, sizeof(base)))
            return -1;
    } else {
        char link[64];
        snprintf(link, sizeof(link), "/proc/self/fd/%d", dirfd);
        ssize_t n = readlink(link, base, sizeof(base) - 1);
        if (n <= 0)
            return -1;
        base[n] = 0;
    }
    snprintf(out, PATH_MAX, "%s/%s", base, path);
    return 0;
}

static void rename_shadow(int olddirfd, const char *old, int newdirfd, const char *new) {
    char a[PATH_MAX], b[PATH_MAX], sa[PATH_MAX], sb[PATH_MAX];
    if (state != 1 || absolute(olddirfd, old, a) || absolute(newdirfd, new, b))
        return;
    const char *ra = relative(a), *rb = relative(b);
    if (!ra || !rb)
        return;
    shadow_path(sa, ra);
    shadow_path(sb, rb);
    mkdirs(sb);
    pthread_mutex_lock(&lock);
    if (real_rename(sa, sb) != 0)
        real_unlink(sb); /* the source was never synced: the target goes */
    for (int i = 0; i < MAX_FILES; i++)
        if (files[i].used && strcmp(files[i].rel, ra) == 0)
            snprintf(files[i].rel, PATH_MAX, "%s", rb);
    pthread_mutex_unlock(&lock);
}

static void unlink_shadow(int dirfd, const char *path) {
    char a[PATH_MAX], sa[PATH_MAX];
    if (state != 1 || absolute(dirfd, path, a))
        return;
    const char *ra = relative(a);
    if (!ra)
        return;
    shadow_path(sa, ra);
    real_unlink(sa);
    pthread_mutex_lock(&lock);
    for (int i = 0; i < MAX_FILES; i++)
        if (files[i].used && strcmp(files[i].rel, ra) == 0) {
            files[i].used = 0;
            files[i].n_ranges = 0;
            for (int fd = 0; fd < MAX_FDS; fd++)
                if (fd_file[fd] == i + 1)
                    fd_file[fd] = 0;
        }
    pthread_mutex_unlock(&lock);
}

int rename(const char *old, const char *new) {
    init();
    int r = real_rename(old, new);
    if (r == 0)
        rename_shadow(AT_FDCWD, old, AT_FDCWD, new);
    return r;
}

int renameat(int olddirfd, const char *old, int newdirfd, const char *new) {
    init();
    int r = real_renameat(olddirfd, old, newdirfd, new);
    if (r == 0)
        rename_shadow(olddirfd, old, newdirfd, new);
    return r;
}

int unlink(const char *path) {
    init();
    int r = real_unlink(path);
    if (r == 0)
        unlink_shadow(AT_FDCWD, path);
    return r;
}

int unlinkat(int dirfd, const char *path, int flags) {
    init();
    int r = real_unlinkat(dirfd, path, flags);
    if (r == 0 && !(flags & AT_REMOVEDIR))
        unlink_shadow(dirfd, path);
    return r;
}
