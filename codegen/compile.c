/* compile.c — writing the generated files and compiling them into a shared object.
 *
 * `-o PATH.c` writes PATH.c and PATH.h. `-o PATH.so` writes the same two files as temporaries
 * (kept next to the shared object with sbpc --keep-c: the readable form of what it runs) and
 * runs the C compiler on them:
 * $CC if set, else clang, else cc, with the include folders of sbp_step.h and sbprt.h and the
 * runtime library plus its dependencies (OpenBLAS, OpenMP, libm) as found when sbpc was built
 * (SBP_RT_* below, set by codegen/CMakeLists.txt). The compiler runs without a shell
 * (posix_spawnp), so paths with spaces or quotes need no escaping.
 *
 * The outputs are written as a set, all or none (sbp_codegen_write below): temporaries
 * in a private folder next to the targets, compiled and fsynced there, then renamed; a failure
 * anywhere leaves the previous outputs untouched and no temporary behind (ir/files.h).
 *
 * An installed sbpc (cmake --install) takes the headers and archives from its prefix instead
 * (installed_runtime below).
 *
 * A cuda step (--target cuda) links SBP_RT_CUDA_LINK instead (codegen/cuda.cmake: the whole
 * of libsbprt_cuda.a, so that the step exports every runtime function sbp-train calls on its
 * device memory, then -lcudart -lcublas and the C++ runtime); it is empty when sbpc was
 * configured without a CUDA compiler.
 */
#include "codegen.h"

#include <errno.h>
#include <fcntl.h>
#include <spawn.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

#ifndef SBP_RT_INCLUDE_DIRS
#define SBP_RT_INCLUDE_DIRS ""
#endif
#ifndef SBP_RT_LINK
#define SBP_RT_LINK ""
#endif
#ifndef SBP_RT_CFLAGS
#define SBP_RT_CFLAGS ""
#endif
#ifndef SBP_RT_CUDA_LINK
#define SBP_RT_CUDA_LINK ""
#endif
/* The build tree's archives as they appear in the link lines above ("" when unknown). */
#ifndef SBP_RT_ARCHIVE
#define SBP_RT_ARCHIVE ""
#endif
#ifndef SBP_RT_CUDA_ARCHIVE
#define SBP_RT_CUDA_ARCHIVE ""
#endif

/* Where the runtime is for an installed sbpc (`cmake --install`): PREFIX/bin/sbpc next to
 * PREFIX/include/sbpc (sbp_step.h, sbprt.h) and PREFIX/lib/sbpc (libsbprt.a, libsbprt_cuda.a).
 * The layout is found from the running executable (/proc/self/exe), so a prefix can be moved
 * or the build tree removed; an sbpc run from its build tree has no such neighbours and uses
 * the paths recorded when it was built. Fills inc and lib (the two folders) and returns true
 * when the installed layout is there. */
static bool installed_runtime(char *inc, size_t inc_len, char *lib, size_t lib_len)
{
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0 || (size_t)n >= sizeof exe - 1)
        return false;
    exe[n] = 0;
    char *slash = strrchr(exe, '/');
    if (!slash)
        return false;
    *slash = 0; /* PREFIX/bin */
    char step_h[4200], archive[4200];
    if ((size_t)snprintf(inc, inc_len, "%s/../include/sbpc", exe) >= inc_len ||
        (size_t)snprintf(lib, lib_len, "%s/../lib/sbpc", exe) >= lib_len ||
        (size_t)snprintf(step_h, sizeof step_h, "%s/sbp_step.h", inc) >= sizeof step_h ||
        (size_t)snprintf(archive, sizeof archive, "%s/libsbprt.a", lib) >= sizeof archive)
        return false;
    return access(step_h, R_OK) == 0 && access(archive, R_OK) == 0;
}

bool sbp_codegen_target_available(const char *target)
{
    if (!target || strcmp(target, "cpu") == 0)
        return true;
    return strcmp(target, "cuda") == 0 && SBP_RT_CUDA_LINK[0] != 0;
}

static bool ends_with(const char *s, const char *suf)
{
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && strcmp(s + a - b, suf) == 0;
}

/* An executable named `name` on $PATH (or a path to one). */
static bool on_path(const char *name)
{
    if (strchr(name, '/'))
        return access(name, X_OK) == 0;
    const char *path = getenv("PATH");
    if (!path)
        return false;
    char buf[4096];
    while (*path) {
        const char *end = strchr(path, ':');
        size_t len = end ? (size_t)(end - path) : strlen(path);
        if (len > 0 && len + strlen(name) + 2 < sizeof buf) {
            memcpy(buf, path, len);
            buf[len] = '/';
            strcpy(buf + len + 1, name);
            if (access(buf, X_OK) == 0)
                return true;
        }
        if (!end)
            break;
        path = end + 1;
    }
    return false;
}

/* argv builder: words split at spaces (';' too, CMake's list separator) */
typedef struct argvec {
    char **v;
    int n, cap;
} argvec;

static int av_push(argvec *a, const char *s)
{
    if (a->n + 2 > a->cap) {
        int nc = a->cap ? a->cap * 2 : 32;
        char **nv = realloc(a->v, (size_t)nc * sizeof *nv);
        if (!nv)
            return -1;
        a->v = nv;
        a->cap = nc;
    }
    a->v[a->n] = strdup(s);
    if (!a->v[a->n])
        return -1;
    a->n++;
    a->v[a->n] = NULL;
    return 0;
}

static int av_split(argvec *a, const char *s, const char *prefix)
{
    const char *p = s;
    while (p && *p) {
        while (*p == ' ' || *p == ';')
            p++;
        size_t len = strcspn(p, " ;");
        if (len) {
            char w[4096];
            int k = snprintf(w, sizeof w, "%s%.*s", prefix, (int)len, p);
            if (k < 0 || (size_t)k >= sizeof w || av_push(a, w))
                return -1;
        }
        p += len;
    }
    return 0;
}

/* av_split of a link line, with the word `from` (a build-tree archive) replaced by `to`. */
static int av_split_sub(argvec *a, const char *s, const char *from, const char *to)
{
    int first = a->n;
    if (av_split(a, s, ""))
        return -1;
    for (int i = first; from[0] && i < a->n; i++)
        if (strcmp(a->v[i], from) == 0) {
            char *w = strdup(to);
            if (!w)
                return -1;
            free(a->v[i]);
            a->v[i] = w;
        }
    return 0;
}

static void av_free(argvec *a)
{
    for (int i = 0; i < a->n; i++)
        free(a->v[i]);
    free(a->v);
}

/* sbp_codegen_compile_so_target with one more argument for the compiler, `define` (a -D
 * flag kept whole, whatever its characters; NULL: none). */
static int compile_so(const char *c_path, const char *so_path, const char *extra_cflags,
                      const char *target, const char *define, ir_diag *d)
{
    const bool cuda = target && strcmp(target, "cuda") == 0;
    if (target && !cuda && strcmp(target, "cpu") != 0)
        return ir_diag_error(d, "unknown target '%s' (cpu or cuda)", target);
    if (!sbp_codegen_target_available(target))
        return ir_diag_error(d, "cannot build %s: this sbpc was configured without a CUDA compiler "
                                "(nvcc), so it has no CUDA runtime library to link a cuda step "
                                "against; write the C with -o %.*s.c, or reconfigure with nvcc on "
                                "PATH", so_path, (int)(strlen(so_path) > 3 ? strlen(so_path) - 3 : 0),
                             so_path);
    const char *cc = getenv("CC");
    if (!cc || !*cc)
        cc = on_path("clang") ? "clang" : "cc";
    /* the folder of the .c, for its header */
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", c_path);
    char *slash = strrchr(dir, '/');
    if (slash)
        *slash = 0;
    else
        strcpy(dir, ".");

    argvec a = {0};
    int rc = 0;
    rc |= av_split(&a, cc, ""); /* CC may carry flags ("ccache gcc", "gcc -m64") */
    rc |= av_push(&a, "-std=c11");
    rc |= av_push(&a, "-O2");
    rc |= av_push(&a, "-fPIC");
    rc |= av_push(&a, "-shared");
    rc |= av_push(&a, "-Wall");
    rc |= av_push(&a, "-Wextra");
    rc |= av_split(&a, SBP_RT_CFLAGS, "");
    if (extra_cflags)
        rc |= av_split(&a, extra_cflags, "");
    char inc[4400];
    snprintf(inc, sizeof inc, "-I%s", dir);
    rc |= av_push(&a, inc);
    char inst_inc[4200], inst_lib[4200], inst_archive[4300];
    if (installed_runtime(inst_inc, sizeof inst_inc, inst_lib, sizeof inst_lib)) {
        snprintf(inc, sizeof inc, "-I%s", inst_inc);
        rc |= av_push(&a, inc);
        snprintf(inst_archive, sizeof inst_archive, "%s/%s", inst_lib,
                 cuda ? "libsbprt_cuda.a" : "libsbprt.a");
    } else {
        rc |= av_split(&a, SBP_RT_INCLUDE_DIRS, "-I");
        snprintf(inst_archive, sizeof inst_archive, "%s", cuda ? SBP_RT_CUDA_ARCHIVE : SBP_RT_ARCHIVE);
    }
    if (define)
        rc |= av_push(&a, define);
    rc |= av_push(&a, "-o");
    rc |= av_push(&a, so_path);
    rc |= av_push(&a, c_path);
    rc |= av_split_sub(&a, cuda ? SBP_RT_CUDA_LINK : SBP_RT_LINK,
                       cuda ? SBP_RT_CUDA_ARCHIVE : SBP_RT_ARCHIVE, inst_archive);
    rc |= av_push(&a, "-lm");
    if (rc) {
        av_free(&a);
        return ir_diag_error(d, "out of memory");
    }
    pid_t pid;
    int err = posix_spawnp(&pid, a.v[0], NULL, NULL, a.v, environ);
    if (err) {
        ir_diag_error(d, "cannot run the C compiler '%s': %s (set $CC)", a.v[0], strerror(err));
        av_free(&a);
        return IR_ERR;
    }
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        /* the command, for the user to rerun */
        size_t len = 1;
        for (int i = 0; i < a.n; i++)
            len += strlen(a.v[i]) + 1;
        char *cmd = malloc(len);
        if (cmd) {
            cmd[0] = 0;
            for (int i = 0; i < a.n; i++) {
                strcat(cmd, a.v[i]);
                if (i + 1 < a.n)
                    strcat(cmd, " ");
            }
        }
        ir_diag_error(d, "the C compiler failed (%s %d): %s",
                      WIFEXITED(status) ? "exit status" : "signal",
                      WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status),
                      cmd ? cmd : a.v[0]);
        free(cmd);
        av_free(&a);
        return IR_ERR;
    }
    av_free(&a);
    return IR_OK;
}

int sbp_codegen_compile_so_target(const char *c_path, const char *so_path,
                                  const char *extra_cflags, const char *target, ir_diag *d)
{
    return compile_so(c_path, so_path, extra_cflags, target, NULL, d);
}

int sbp_codegen_compile_so(const char *c_path, const char *so_path, const char *extra_cflags,
                           ir_diag *d)
{
    return sbp_codegen_compile_so_target(c_path, so_path, extra_cflags, NULL, d);
}

int sbp_codegen_write_target(const sbp_train_program *p, const char *out_path,
                             const char *model_path, const char *extra_cflags,
                             const char *target, ir_diag *d)
{
    const sbp_codegen_options o = {.model_path = model_path, .target = target};
    return sbp_codegen_write(p, out_path, &o, extra_cflags, d);
}

/* The files -o PATH.c / PATH.so stands for: [0] PATH.c, [1] PATH.h, [2] PATH.consts.bin and,
 * for .so, [3] PATH.so (malloc'd, NULL where absent). Returns the count, or -1 for a bad name. */
enum { OUT_C, OUT_H, OUT_BLOB, OUT_SO, OUT_N };
static int output_names(const char *out_path, char *names[OUT_N])
{
    bool so = ends_with(out_path, ".so");
    if (!so && !ends_with(out_path, ".c"))
        return -1;
    size_t stem = strlen(out_path) - (so ? 3 : 2);
    static const char *const suffix[OUT_N] = {".c", ".h", ".consts.bin", ".so"};
    int n = so ? OUT_N : OUT_SO;
    for (int k = 0; k < OUT_N; k++) {
        names[k] = NULL;
        if (k >= n)
            continue;
        size_t len = stem + strlen(suffix[k]) + 1;
        if ((names[k] = malloc(len)))
            snprintf(names[k], len, "%.*s%s", (int)stem, out_path, suffix[k]);
    }
    return n;
}

static void free_names(char *names[OUT_N])
{
    for (int k = 0; k < OUT_N; k++)
        free(names[k]);
}

int sbp_codegen_check_outputs(const char *out_path, bool keep_c, const sbp_file_set *inputs,
                              sbp_file_set *outputs, ir_diag *d)
{
    char *names[OUT_N];
    int n = output_names(out_path, names);
    if (n < 0)
        return ir_diag_error(d, "-o %s: the output must end in .c (C source and header) or .so "
                                "(compiled shared object)", out_path);
    int rc = IR_OK;
    char err[1024];
    for (int k = 0; k < n && rc == IR_OK; k++)
        if (n == OUT_N && !keep_c && k != OUT_SO)
            continue; /* the .so's temporaries only */
        else if (!names[k])
            rc = ir_diag_error(d, "out of memory");
        else if (sbp_file_check_output(names[k], "-o", inputs, outputs, err, sizeof err) !=
                 SBP_FILE_OK)
            rc = ir_diag_error(d, "%s", err);
    free_names(names);
    return rc;
}

/* The generated files, written as a set: every file goes to a private temporary folder next to
 * the targets (".<name>.tmp.<pid>.<n>/", listed for the signal handler, so an interrupted sbpc
 * leaves nothing), the .so is compiled there from the temporary .c and constants file, every
 * file is fsynced, and only then are they renamed over the targets, keeping the permissions of
 * the files they replace. Any failure before the renames (a full disk, a header that cannot be
 * written, the C compiler failing) removes the folder and leaves the previous outputs as they
 * were. A target that is a character device (/dev/null) gets the bytes written into it in
 * place; any other special file is refused before anything is written. */
typedef struct out_set {
    char *final[OUT_N]; /* the targets */
    char *tmp[OUT_N];   /* the temporaries, in dir */
    int slot[OUT_N];    /* their sbp_tmp_register handles */
    char *dir;          /* the temporary folder */
    int dir_slot;
    int n;
    bool so_only; /* a .so without --keep-c: the C files stay temporaries */
} out_set;

static void out_set_remove(out_set *s)
{
    for (int k = 0; k < OUT_N; k++) {
        if (s->tmp[k])
            unlink(s->tmp[k]);
        sbp_tmp_unregister(s->slot[k]);
        free(s->tmp[k]);
        s->tmp[k] = NULL;
        s->slot[k] = 0;
    }
    if (s->dir)
        rmdir(s->dir);
    sbp_tmp_unregister(s->dir_slot);
    free(s->dir);
    s->dir = NULL;
    s->dir_slot = 0;
    free_names(s->final);
}

static int out_set_begin(out_set *s, const char *out_path, bool keep_c, ir_diag *d)
{
    memset(s, 0, sizeof *s);
    s->n = output_names(out_path, s->final);
    if (s->n < 0)
        return ir_diag_error(d, "-o %s: the output must end in .c (C source and header) or .so "
                                "(compiled shared object)", out_path);
    s->so_only = s->n == OUT_N && !keep_c;
    char err[1024];
    for (int k = 0; k < s->n; k++) {
        struct stat st;
        if (!s->final[k]) {
            out_set_remove(s);
            return ir_diag_error(d, "out of memory");
        }
        if ((!s->so_only || k == OUT_SO) && stat(s->final[k], &st) == 0 && !S_ISREG(st.st_mode) && !S_ISCHR(st.st_mode)) {
            ir_diag_error(d, "-o: %s is %s, not a regular file: refusing to replace it",
                          s->final[k], sbp_file_kind(st.st_mode));
            out_set_remove(s);
            return IR_ERR;
        }
    }
    sbp_tmp_clean_stale(out_path);
    s->dir = sbp_tmp_name(out_path);
    if (!s->dir) {
        out_set_remove(s);
        return ir_diag_error(d, "out of memory");
    }
    /* registered before it exists, as sbp_atomic_open does: no window for a signal to leave it */
    s->dir_slot = sbp_tmp_register(s->dir, true);
    if (mkdir(s->dir, 0700) != 0) {
        snprintf(err, sizeof err, "%s", strerror(errno));
        sbp_tmp_unregister(s->dir_slot);
        s->dir_slot = 0;
        free(s->dir);
        s->dir = NULL;
        ir_diag_error(d, "cannot write %s: cannot create a temporary folder next to it: %s",
                      out_path, err);
        out_set_remove(s);
        return IR_ERR;
    }
    for (int k = 0; k < s->n; k++) {
        const char *base = strrchr(s->final[k], '/');
        base = base ? base + 1 : s->final[k];
        size_t len = strlen(s->dir) + strlen(base) + 2;
        if (!(s->tmp[k] = malloc(len))) {
            out_set_remove(s);
            return ir_diag_error(d, "out of memory");
        }
        snprintf(s->tmp[k], len, "%s/%s", s->dir, base);
        s->slot[k] = sbp_tmp_register(s->tmp[k], false); /* before the file exists */
    }
    return IR_OK;
}

/* fsync of a finished temporary (the .so, written by the linker, is opened for it). */
static int sync_file(const char *path, ir_diag *d)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return IR_OK; /* not written (no constants file): nothing to sync */
    int rc = fsync(fd) != 0 && errno != EINVAL && errno != EROFS
                 ? ir_diag_error(d, "cannot write %s: fsync: %s", path, strerror(errno))
                 : IR_OK;
    close(fd);
    return rc;
}

/* Copies the temporary into a character device target (a sink written in place). */
static int copy_into_sink(const char *from, const char *to, ir_diag *d)
{
    int in = open(from, O_RDONLY | O_CLOEXEC), out = open(to, O_WRONLY | O_NOCTTY | O_CLOEXEC);
    int rc = in < 0 || out < 0 ? ir_diag_error(d, "cannot write %s: %s", to, strerror(errno))
                               : IR_OK;
    char buf[1 << 16];
    for (ssize_t r; rc == IR_OK && (r = read(in, buf, sizeof buf)) != 0;) {
        if (r < 0 && errno == EINTR)
            continue;
        for (ssize_t off = 0; rc == IR_OK && r > 0 && off < r;) {
            ssize_t w = write(out, buf + off, (size_t)(r - off));
            if (w < 0 && errno == EINTR)
                continue;
            if (w <= 0)
                rc = ir_diag_error(d, "cannot write %s: %s", to, strerror(errno));
            else
                off += w;
        }
        if (r < 0)
            rc = ir_diag_error(d, "cannot write %s: %s", to, strerror(errno));
    }
    if (in >= 0)
        close(in);
    if (out >= 0)
        close(out);
    return rc;
}

/* Renames every temporary over its target, keeping the target's mode; removes the folder. */
static int out_set_commit(out_set *s, ir_diag *d)
{
    int rc = IR_OK;
    for (int k = 0; k < s->n && rc == IR_OK; k++)
        rc = sync_file(s->tmp[k], d);
    for (int k = 0; k < s->n && rc == IR_OK; k++) {
        struct stat st;
        if (s->so_only && k != OUT_SO)
            continue; /* removed with the folder */
        if (stat(s->tmp[k], &st) != 0)
            continue; /* never written (the constants file when every constant is inline) */
        if (k == OUT_BLOB && st.st_size == 0)
            continue; /* no constant went there: an empty file would only puzzle */
        bool exists = stat(s->final[k], &st) == 0;
        if (exists && S_ISCHR(st.st_mode)) {
            rc = copy_into_sink(s->tmp[k], s->final[k], d);
            continue;
        }
        if (exists && chmod(s->tmp[k], st.st_mode & 07777) != 0)
            rc = ir_diag_error(d, "cannot write %s: %s", s->final[k], strerror(errno));
        else if (rename(s->tmp[k], s->final[k]) != 0)
            rc = ir_diag_error(d, "cannot write %s: rename from %s: %s", s->final[k], s->tmp[k],
                               strerror(errno));
    }
    out_set_remove(s);
    return rc;
}

int sbp_codegen_write(const sbp_train_program *p, const char *out_path,
                      const sbp_codegen_options *opt, const char *extra_cflags, ir_diag *d)
{
    const char *target = opt->target;
    out_set s;
    if (out_set_begin(&s, out_path, opt->keep_c, d) != IR_OK)
        return IR_ERR;
    const bool so = s.n == OUT_N;
    const char *hbase = strrchr(s.final[OUT_H], '/');
    hbase = hbase ? hbase + 1 : s.final[OUT_H];

    int rc = IR_OK;
    FILE *c = fopen(s.tmp[OUT_C], "w"), *h = c ? fopen(s.tmp[OUT_H], "w") : NULL;
    FILE *blob = h ? fopen(s.tmp[OUT_BLOB], "wb") : NULL;
    /* PATH.consts.bin holds the large constants; the .c names it by absolute path, where it
     * will be once renamed; the .so is built from the temporary copy (-DSBP_CONSTS_FILE). */
    char abs_blob[8192], tmp_blob_def[8300] = "";
    const char *bbase = strrchr(s.final[OUT_BLOB], '/');
    bbase = bbase ? bbase + 1 : s.final[OUT_BLOB];
    char *dir = realpath(s.dir, NULL), *final_dir = dir ? strdup(dir) : NULL;
    char *slash = final_dir ? strrchr(final_dir, '/') : NULL;
    if (slash)
        *(slash == final_dir ? slash + 1 : slash) = 0; /* the temporary folder's parent */
    if (!c || !h || !blob) {
        rc = ir_diag_error(d, "cannot write %s: %s", !c ? s.final[OUT_C] : !h ? s.final[OUT_H]
                                                                               : s.final[OUT_BLOB],
                           strerror(errno));
    } else {
        sbp_codegen_options o = {.header_name = hbase, .model_path = opt->model_path,
                                 .target = target, .blob_min_bytes = opt->blob_min_bytes,
                                 .tf32 = opt->tf32};
        if (dir && final_dir && !strpbrk(dir, "\"\\\n") && !strpbrk(bbase, "\"\\\n") &&
            (size_t)snprintf(abs_blob, sizeof abs_blob, "%s%s%s", final_dir,
                             strcmp(final_dir, "/") ? "/" : "", bbase) < sizeof abs_blob &&
            (size_t)snprintf(tmp_blob_def, sizeof tmp_blob_def, "-DSBP_CONSTS_FILE=\"%s/%s\"",
                             dir, bbase) < sizeof tmp_blob_def) {
            o.blob = blob;
            o.blob_path = abs_blob;
        } else {
            tmp_blob_def[0] = 0;
        }
        rc = sbp_codegen_emit(p, &o, c, h, d);
    }
    if (blob && fclose(blob) != 0 && rc == IR_OK)
        rc = ir_diag_error(d, "cannot write %s: %s", s.final[OUT_BLOB], strerror(errno));
    if (!tmp_blob_def[0] || rc != IR_OK)
        unlink(s.tmp[OUT_BLOB]); /* unusable path: everything was emitted inline */
    if (c && fclose(c) != 0 && rc == IR_OK)
        rc = ir_diag_error(d, "cannot write %s: %s", s.final[OUT_C], strerror(errno));
    if (h && fclose(h) != 0 && rc == IR_OK)
        rc = ir_diag_error(d, "cannot write %s: %s", s.final[OUT_H], strerror(errno));
    if (rc == IR_OK && so)
        rc = compile_so(s.tmp[OUT_C], s.tmp[OUT_SO], extra_cflags, target,
                        tmp_blob_def[0] ? tmp_blob_def : NULL, d);
    free(dir);
    free(final_dir);
    if (rc == IR_OK)
        return out_set_commit(&s, d);
    out_set_remove(&s);
    return rc;
}
