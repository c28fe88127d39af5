/* files.c — opening inputs without blocking, checking outputs against inputs and special files,
 * and atomic writes whose temporaries are removed on every exit path (see files.h).
 *
 * The signal registry is a fixed table of path buffers with a sig_atomic_t state per slot: a slot
 * is filled while its state is FREE, then published by setting its state, so the handler only
 * ever reads complete paths, and it calls nothing but unlink, rmdir, sigaction, raise, gettid
 * and tgkill (all async-signal-safe). Handlers are installed only for signals whose action is still the default:
 * a signal the user ignored (nohup's SIGHUP, a test's SIGXFSZ) stays ignored. The cleanup runs
 * on the main thread, the one that makes temporaries, and a temporary is registered before it is
 * created: no window in which a signal can leave one behind (a worker thread that receives the
 * signal passes it on to the main thread).
 */
#define _GNU_SOURCE /* O_NOFOLLOW, dirfd */
#include "files.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static int errf(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int errf(char *err, size_t errlen, const char *fmt, ...)
{
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return SBP_FILE_ERR;
}

const char *sbp_file_kind(mode_t mode)
{
    return S_ISREG(mode)    ? "a regular file"
           : S_ISDIR(mode)  ? "a directory"
           : S_ISFIFO(mode) ? "a FIFO"
           : S_ISSOCK(mode) ? "a socket"
           : S_ISBLK(mode)  ? "a block device"
           : S_ISCHR(mode)  ? "a character device"
           : S_ISLNK(mode)  ? "a symbolic link"
                            : "not a regular file";
}

/* ---------------------------------------------------------------- inputs */

int sbp_file_open_input(const char *path, struct stat *st, char *err, size_t errlen)
{
    struct stat local;
    if (!st)
        st = &local;
    /* O_NONBLOCK: opening a FIFO for reading waits for a writer; this returns at once instead. */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
    if (fd < 0)
        return errf(err, errlen, "%s: %s", path, strerror(errno));
    if (fstat(fd, st) != 0) {
        int e = errno;
        close(fd);
        return errf(err, errlen, "%s: %s", path, strerror(e));
    }
    if (!S_ISREG(st->st_mode)) {
        close(fd);
        return errf(err, errlen, "%s: is %s, not a regular file", path,
                    sbp_file_kind(st->st_mode));
    }
    /* A regular file never blocks, but stdio and mmap users expect a plain descriptor. */
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0) {
        int e = errno;
        close(fd);
        return errf(err, errlen, "%s: %s", path, strerror(e));
    }
    return fd;
}

FILE *sbp_file_fopen_input(const char *path, struct stat *st, char *err, size_t errlen)
{
    int fd = sbp_file_open_input(path, st, err, errlen);
    if (fd < 0)
        return NULL;
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        errf(err, errlen, "%s: %s", path, strerror(errno));
        close(fd);
    }
    return f;
}

/* ---------------------------------------------------------------- identities */

char *sbp_path_dir(const char *path)
{
    const char *slash = strrchr(path, '/');
    if (!slash)
        return strdup(".");
    if (slash == path)
        return strdup("/");
    return strndup(path, (size_t)(slash - path));
}

const char *sbp_path_base(const char *path)
{
    const char *slash = strrchr(path, '/');
    return slash ? slash + 1 : path;
}

static int set_push(sbp_file_set *s, dev_t dev, ino_t ino, const char *name, const char *path,
                    const char *role)
{
    if (s->n == s->cap) {
        int nc = s->cap ? 2 * s->cap : 8;
        sbp_file_id *nv = realloc(s->v, (size_t)nc * sizeof *nv);
        if (!nv)
            return SBP_FILE_ERR;
        s->v = nv;
        s->cap = nc;
    }
    sbp_file_id *e = &s->v[s->n];
    *e = (sbp_file_id){.dev = dev, .ino = ino};
    e->name = name ? strdup(name) : NULL;
    e->path = strdup(path);
    e->role = strdup(role ? role : "an input");
    if ((name && !e->name) || !e->path || !e->role) {
        free(e->name);
        free(e->path);
        free(e->role);
        return SBP_FILE_ERR;
    }
    s->n++;
    return SBP_FILE_OK;
}

int sbp_file_set_add(sbp_file_set *s, const char *path, const char *role, const struct stat *st)
{
    struct stat here;
    if (!st) {
        if (stat(path, &here) != 0)
            return SBP_FILE_OK; /* not there: its reader says so */
        st = &here;
    }
    for (int i = 0; i < s->n; i++)
        if (!s->v[i].name && s->v[i].dev == st->st_dev && s->v[i].ino == st->st_ino)
            return SBP_FILE_OK;
    return set_push(s, st->st_dev, st->st_ino, NULL, path, role);
}

void sbp_file_set_free(sbp_file_set *s)
{
    if (!s)
        return;
    for (int i = 0; i < s->n; i++) {
        free(s->v[i].name);
        free(s->v[i].path);
        free(s->v[i].role);
    }
    free(s->v);
    memset(s, 0, sizeof *s);
}

int sbp_file_check_output(const char *path, const char *role, const sbp_file_set *inputs,
                          sbp_file_set *outputs, char *err, size_t errlen)
{
    struct stat st;
    dev_t dev;
    ino_t ino;
    const char *name = NULL;
    if (stat(path, &st) == 0) {
        for (int i = 0; inputs && i < inputs->n; i++)
            if (!inputs->v[i].name && inputs->v[i].dev == st.st_dev &&
                inputs->v[i].ino == st.st_ino)
                return errf(err, errlen, "%s: %s would overwrite %s (%s), which this run reads",
                            role, path, inputs->v[i].role, inputs->v[i].path);
        if (!S_ISREG(st.st_mode) && !S_ISCHR(st.st_mode))
            return errf(err, errlen, "%s: %s is %s, not a regular file: refusing to replace it",
                        role, path, sbp_file_kind(st.st_mode));
        dev = st.st_dev;
        ino = st.st_ino;
    } else {
        /* Not there yet: known by its directory and name (two flags naming one new file). */
        char *dir = sbp_path_dir(path);
        struct stat ds;
        bool ok = dir && stat(dir, &ds) == 0;
        free(dir);
        if (!ok)
            return SBP_FILE_OK; /* the writer reports the missing directory */
        dev = ds.st_dev;
        ino = ds.st_ino;
        name = sbp_path_base(path);
    }
    for (int i = 0; outputs && i < outputs->n; i++) {
        const sbp_file_id *o = &outputs->v[i];
        bool same = o->dev == dev && o->ino == ino &&
                    (name ? o->name && strcmp(o->name, name) == 0 : !o->name);
        if (same)
            return errf(err, errlen, "%s: %s is also the output of %s", role, path, o->role);
    }
    if (outputs && set_push(outputs, dev, ino, name, path, role) != SBP_FILE_OK)
        return errf(err, errlen, "%s: out of memory", path);
    return SBP_FILE_OK;
}

/* ---------------------------------------------------------------- the signal registry */

enum { TMP_SLOTS = 64, TMP_FREE = 0, TMP_FILE = 1, TMP_DIR = 2, TMP_BUSY = 3 };

static char tmp_paths[TMP_SLOTS][PATH_MAX];
static volatile sig_atomic_t tmp_state[TMP_SLOTS];
static const int tmp_signals[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGXFSZ};
static int tmp_installed;

bool sbp_signal_to_main_thread(int sig)
{
    pid_t pid = getpid();
    if ((pid_t)syscall(SYS_gettid) == pid)
        return false;
    syscall(SYS_tgkill, pid, pid, sig);
    return true;
}

static void tmp_on_signal(int sig)
{
    int saved = errno;
    if (sbp_signal_to_main_thread(sig)) {
        errno = saved;
        return;
    }
    for (int i = TMP_SLOTS - 1; i >= 0; i--)
        if (tmp_state[i] == TMP_FILE)
            unlink(tmp_paths[i]);
    for (int i = TMP_SLOTS - 1; i >= 0; i--)
        if (tmp_state[i] == TMP_DIR)
            rmdir(tmp_paths[i]);
    /* Die of the same signal, as if there had been no handler: the parent sees the cause. */
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    sigaction(sig, &dfl, NULL);
    raise(sig); /* pending until the handler returns and the signal is unblocked */
    errno = saved;
}

static void tmp_install(void)
{
    if (__atomic_exchange_n(&tmp_installed, 1, __ATOMIC_ACQ_REL))
        return;
    for (size_t k = 0; k < sizeof tmp_signals / sizeof tmp_signals[0]; k++) {
        struct sigaction old;
        if (sigaction(tmp_signals[k], NULL, &old) != 0 || old.sa_handler != SIG_DFL ||
            (old.sa_flags & SA_SIGINFO))
            continue;
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = tmp_on_signal;
        sigemptyset(&sa.sa_mask);
        for (size_t j = 0; j < sizeof tmp_signals / sizeof tmp_signals[0]; j++)
            sigaddset(&sa.sa_mask, tmp_signals[j]); /* one cleanup at a time */
        sigaction(tmp_signals[k], &sa, NULL);
    }
}

int sbp_tmp_register(const char *path, bool is_dir)
{
    tmp_install();
    size_t n = strlen(path);
    if (n >= PATH_MAX)
        return 0;
    for (int i = 0; i < TMP_SLOTS; i++) {
        sig_atomic_t expect = TMP_FREE;
        if (!__atomic_compare_exchange_n(&tmp_state[i], &expect, TMP_BUSY, false,
                                         __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
            continue;
        memcpy(tmp_paths[i], path, n + 1);
        __atomic_signal_fence(__ATOMIC_SEQ_CST); /* the path is complete before it is published */
        tmp_state[i] = is_dir ? TMP_DIR : TMP_FILE;
        return i + 1;
    }
    return 0;
}

void sbp_tmp_unregister(int handle)
{
    if (handle > 0 && handle <= TMP_SLOTS)
        tmp_state[handle - 1] = TMP_FREE;
}

/* ---------------------------------------------------------------- stale temporaries */

/* Removes dir/name: a file, or a directory with the files in it. */
static void remove_entry(int dfd, const char *name)
{
    if (unlinkat(dfd, name, 0) == 0 || (errno != EISDIR && errno != EPERM))
        return;
    int sub = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (sub < 0)
        return;
    DIR *d = fdopendir(sub);
    if (!d) {
        close(sub);
        return;
    }
    for (struct dirent *e; (e = readdir(d));)
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0)
            unlinkat(dirfd(d), e->d_name, 0);
    closedir(d);
    unlinkat(dfd, name, AT_REMOVEDIR);
}

void sbp_tmp_clean_stale(const char *target)
{
    char *dir = sbp_path_dir(target);
    const char *base = sbp_path_base(target);
    size_t pl = strlen(base) + 6;
    char *prefix = malloc(pl + 1);
    DIR *d = dir && prefix ? opendir(dir) : NULL;
    if (d) {
        snprintf(prefix, pl + 1, ".%s.tmp.", base);
        for (struct dirent *e; (e = readdir(d));) {
            if (strncmp(e->d_name, prefix, pl) != 0)
                continue;
            /* ".<name>.tmp.<pid>.<anything>": only a pid that names no process is stale */
            const char *p = e->d_name + pl;
            char *end;
            errno = 0;
            long pid = strtol(p, &end, 10);
            if (end == p || *end != '.' || errno || pid <= 0 || pid > INT32_MAX ||
                pid == (long)getpid())
                continue;
            if (kill((pid_t)pid, 0) == 0 || errno != ESRCH)
                continue;
            remove_entry(dirfd(d), e->d_name);
        }
        closedir(d);
    }
    free(dir);
    free(prefix);
}

static unsigned tmp_counter;

char *sbp_tmp_name(const char *target)
{
    char *dir = sbp_path_dir(target);
    size_t cap = strlen(target) + 64;
    char *tmp = dir ? malloc(cap) : NULL;
    if (tmp) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        unsigned n = __atomic_fetch_add(&tmp_counter, 1, __ATOMIC_RELAXED);
        snprintf(tmp, cap, "%s/.%s.tmp.%ld.%u%05ld", dir, sbp_path_base(target), (long)getpid(), n,
                 (long)(ts.tv_nsec % 100000));
    }
    free(dir);
    return tmp;
}

/* ---------------------------------------------------------------- atomic files */

int sbp_atomic_begin(sbp_atomic *a, const char *path, char *err, size_t errlen)
{
    memset(a, 0, sizeof *a);
    if (!*sbp_path_base(path))
        return errf(err, errlen, "%s: not a file name", path);
    struct stat st;
    bool exists = stat(path, &st) == 0;
    if (exists && S_ISCHR(st.st_mode)) {
        /* /dev/null, a terminal: a sink written in place; renaming over it would replace the
         * device node with a regular file. */
        int fd = open(path, O_WRONLY | O_NOCTTY | O_CLOEXEC);
        FILE *f = fd >= 0 ? fdopen(fd, "wb") : NULL;
        if (!f) {
            int e = errno;
            if (fd >= 0)
                close(fd);
            return errf(err, errlen, "%s: %s", path, strerror(e));
        }
        a->path = strdup(path);
        if (!a->path) {
            fclose(f);
            return errf(err, errlen, "%s: out of memory", path);
        }
        a->f = f;
        a->sink = true;
        return SBP_FILE_OK;
    }
    if (exists && !S_ISREG(st.st_mode))
        return errf(err, errlen, "%s: is %s, not a regular file: refusing to replace it", path,
                    sbp_file_kind(st.st_mode));
    sbp_tmp_clean_stale(path);
    a->path = strdup(path);
    if (!a->path)
        return errf(err, errlen, "%s: out of memory", path);
    int fd = -1, e = 0;
    char *tmp = NULL;
    for (int attempt = 0; attempt < 100 && fd < 0; attempt++) {
        free(tmp);
        tmp = sbp_tmp_name(path);
        if (!tmp) {
            e = ENOMEM;
            break;
        }
        /* Registered before it exists: a signal between the open and a later registration
         * would leave the file behind (seen under ASan in CI). Unlinking a name not yet
         * created, or one of our own pid's stale files that made the open fail, is harmless. */
        a->slot = sbp_tmp_register(tmp, false);
        /* 0666 & ~umask, like any newly created file; a replaced file's mode below. */
        fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        e = errno;
        if (fd < 0) {
            sbp_tmp_unregister(a->slot);
            a->slot = 0;
        }
        if (fd < 0 && e != EEXIST)
            break;
    }
    if (fd < 0) {
        free(tmp);
        free(a->path);
        a->path = NULL;
        return errf(err, errlen, "%s: cannot create a temporary file next to it: %s", path,
                    strerror(e));
    }
    a->tmp = tmp;
    /* The replacement keeps the permissions (and, where allowed, the owner) of the file it
     * replaces: a 0600 model must not become world-readable by being saved. */
    if (exists && (fchmod(fd, st.st_mode & 07777) != 0 ||
                   ((st.st_uid != geteuid() || st.st_gid != getegid()) &&
                    fchown(fd, st.st_uid, st.st_gid) != 0 && errno != EPERM))) {
        e = errno;
        close(fd);
        sbp_atomic_abort(a);
        return errf(err, errlen, "%s: cannot give the temporary the permissions of the file: %s",
                    path, strerror(e));
    }
    a->f = fdopen(fd, "wb");
    if (!a->f) {
        e = errno;
        close(fd);
        sbp_atomic_abort(a);
        return errf(err, errlen, "%s: fdopen: %s", path, strerror(e));
    }
    return SBP_FILE_OK;
}

int sbp_atomic_commit(sbp_atomic *a, char *err, size_t errlen)
{
    if (!a->f)
        return errf(err, errlen, "%s: atomic write not in progress", a->path ? a->path : "(null)");
    int rc = SBP_FILE_OK;
    if (fflush(a->f) != 0 || ferror(a->f))
        rc = errf(err, errlen, "%s: write error: %s", a->path, strerror(errno));
    else if (fsync(fileno(a->f)) != 0 && errno != EINVAL && errno != EROFS)
        rc = errf(err, errlen, "%s: fsync: %s", a->path, strerror(errno));
    if (fclose(a->f) != 0 && rc == SBP_FILE_OK)
        rc = errf(err, errlen, "%s: close: %s", a->path, strerror(errno));
    a->f = NULL;
    if (rc == SBP_FILE_OK && a->tmp && rename(a->tmp, a->path) != 0)
        rc = errf(err, errlen, "%s: rename from temporary %s: %s", a->path, a->tmp,
                  strerror(errno));
    if (rc != SBP_FILE_OK && a->tmp)
        unlink(a->tmp);
    sbp_tmp_unregister(a->slot);
    free(a->tmp);
    free(a->path);
    memset(a, 0, sizeof *a);
    return rc;
}

void sbp_atomic_abort(sbp_atomic *a)
{
    if (!a)
        return;
    if (a->f)
        fclose(a->f);
    if (a->tmp)
        unlink(a->tmp);
    sbp_tmp_unregister(a->slot);
    free(a->tmp);
    free(a->path);
    memset(a, 0, sizeof *a);
}
