/* files.h — file safety shared by the importer, the code generator and the tools: opening inputs
 * without blocking, keeping outputs off inputs and special files, and writing outputs atomically
 * with temporaries that disappear on every exit path.
 *
 * Inputs: sbp_file_open_input opens O_RDONLY | O_NONBLOCK | O_CLOEXEC, so that a FIFO (or a
 * device that waits for a peer) cannot hang the open, then fstat()s and refuses anything but a
 * regular file before a byte is read; O_NONBLOCK is cleared again for the reads.
 *
 * Outputs: a run collects the identity (st_dev, st_ino) of every file it reads in an
 * sbp_file_set (the model, its external data, .npy inputs, shards, the step .so) and checks each
 * output path against it before doing any work (sbp_file_check_output): writing over an input
 * is refused, and so is an existing output that is not a regular file, except a character device
 * (/dev/null, a terminal), which is a sink written in place. Outputs are also checked against
 * each other (two flags naming one file).
 *
 * Temporaries: sbp_atomic writes "<dir>/.<name>.tmp.<pid>.<n>" next to the target, keeps the
 * permissions of the file it replaces, fsyncs and renames. Every temporary is listed in a small
 * async-signal-safe registry; on SIGINT, SIGTERM, SIGHUP, SIGQUIT or SIGXFSZ (when they had their
 * default action) the handler unlinks them and re-raises the signal, so a killed run leaves
 * nothing. A run killed by SIGKILL still can: the next write of the same target removes
 * ".<name>.tmp.<pid>.*" siblings whose process no longer exists (kill(pid, 0) == ESRCH).
 *
 * Errors: functions return SBP_FILE_OK or SBP_FILE_ERR and write one line into err (size errlen;
 * either may be NULL/0) naming the path and the problem. Nothing here prints or exits; the signal
 * handler is the one exception that ends the process, by re-raising the signal it caught.
 */
#ifndef SBP_FILES_H
#define SBP_FILES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <sys/stat.h>
#include <sys/types.h>

#define SBP_FILE_OK 0
#define SBP_FILE_ERR (-1)

/* ---------------------------------------------------------------- inputs */

/* Opens path for reading without blocking; a file descriptor (O_CLOEXEC, blocking again) on
 * success, -1 on error with err = "PATH: <why>" ("No such file or directory", "is a FIFO, not a
 * regular file", ...). st (may be NULL) receives the fstat of the opened file. */
int sbp_file_open_input(const char *path, struct stat *st, char *err, size_t errlen);
/* The same as a stdio stream ("rb"); NULL on error. */
FILE *sbp_file_fopen_input(const char *path, struct stat *st, char *err, size_t errlen);
/* "a FIFO", "a directory", "a socket", "a block device", "a character device", "a symbolic
 * link", "a regular file" for a st_mode. */
const char *sbp_file_kind(mode_t mode);

/* ---------------------------------------------------------------- paths */

/* The directory part of path, malloc'd: "." for a bare name, "/" for "/x"; NULL when out of
 * memory. */
char *sbp_path_dir(const char *path);
/* The last component of path (a pointer into it). */
const char *sbp_path_base(const char *path);

/* ---------------------------------------------------------------- identities */

/* One file of a run: an existing file is known by (dev, ino); an output that does not exist yet
 * by its directory's (dev, ino) and its name. */
typedef struct sbp_file_id {
    dev_t dev;
    ino_t ino;
    char *name; /* NULL for an existing file; else the last component (malloc'd) */
    char *path; /* as the user gave it, for messages (malloc'd) */
    char *role; /* "the model", "--input-ids", ... (malloc'd) */
} sbp_file_id;

typedef struct sbp_file_set {
    sbp_file_id *v; /* [n] */
    int n, cap;
} sbp_file_set;

/* Adds the file at path (its fstat in st, or NULL to stat() path now). A path that does not
 * exist is skipped (its reader reports it). SBP_FILE_ERR only when out of memory. */
int sbp_file_set_add(sbp_file_set *s, const char *path, const char *role, const struct stat *st);
void sbp_file_set_free(sbp_file_set *s); /* NULL-safe; zeroes *s */

/* Checks that writing the output `path` (flag or purpose in `role`, e.g. "--save") can neither
 * destroy an input nor be blocked or misdirected by a special file:
 *   - path is the same file (st_dev, st_ino) as an input: refused, naming the input's role;
 *   - path exists and is not a regular file: refused, unless it is a character device (a sink);
 *   - path is the same file as an output already in `outputs`: refused;
 * otherwise path is added to `outputs` (may be NULL: no output-vs-output check). */
int sbp_file_check_output(const char *path, const char *role, const sbp_file_set *inputs,
                          sbp_file_set *outputs, char *err, size_t errlen);

/* ---------------------------------------------------------------- temporaries */

/* Lists path in the signal-safe registry (is_dir: removed with rmdir, after the files); returns
 * a handle for sbp_tmp_unregister, or 0 when the registry is full or the path too long (the
 * temporary then is not removed by a signal, only by the code that made it). 0 is never a
 * handle, so a zeroed struct holding one is safe to release. The first call installs the
 * handlers. */
int sbp_tmp_register(const char *path, bool is_dir);
void sbp_tmp_unregister(int handle); /* 0 is ignored */
/* For a signal handler: when the calling thread is not the process's main thread (an OpenMP or
 * MPI worker that the kernel picked because the main one already had a signal pending), sends
 * sig to the main thread and returns true; the handler then returns without acting. The cleanup
 * must run on the thread that creates the temporaries, or that thread can make a new one between
 * the cleanup and the process's death. Async-signal-safe (gettid, tgkill). */
bool sbp_signal_to_main_thread(int sig);
/* Removes the stale temporaries of target: siblings ".<name>.tmp.<pid>.*" whose process is gone
 * (a directory with its files). Best effort, silent. */
void sbp_tmp_clean_stale(const char *target);
/* A fresh temporary name for target, "<dir>/.<name>.tmp.<pid>.<n>" (malloc'd), not yet created. */
char *sbp_tmp_name(const char *target);

/* ---------------------------------------------------------------- atomic files */

typedef struct sbp_atomic {
    FILE *f;    /* write here */
    char *path; /* the target */
    char *tmp;  /* the temporary, same directory; NULL when writing a sink in place */
    int slot;   /* sbp_tmp_register handle of tmp, 0 if none */
    bool sink;  /* the target is a character device, written in place */
} sbp_atomic;

/* Opens the target for writing: a temporary next to it (with the permissions of the file it
 * will replace, else 0666 & ~umask), or the target itself when it is a character device. An
 * existing target that is neither a regular file nor a character device is refused. Stale
 * temporaries of the target are removed first. */
int sbp_atomic_begin(sbp_atomic *a, const char *path, char *err, size_t errlen);
/* Flushes, fsyncs, closes and renames the temporary over the target; on any failure the
 * temporary is removed. *a is released either way. */
int sbp_atomic_commit(sbp_atomic *a, char *err, size_t errlen);
/* Closes and removes the temporary; NULL-safe and safe after commit. */
void sbp_atomic_abort(sbp_atomic *a);

#endif /* SBP_FILES_H */
