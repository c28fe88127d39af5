/* compile.c — writing the generated files and compiling them into a shared object.
 *
 * `-o PATH.c` writes PATH.c and PATH.h. `-o PATH.so` writes the same two files next to the
 * shared object (they are the readable form of what it runs) and then runs the C compiler:
 * $CC if set, else clang, else cc, with the include folders of sbp_step.h and sbprt.h and the
 * runtime library plus its dependencies (OpenBLAS, OpenMP, libm) as found when sbpc was built
 * (SBP_RT_* below, set by codegen/CMakeLists.txt). The compiler runs without a shell
 * (posix_spawnp), so paths with spaces or quotes need no escaping.
 *
 * A cuda step (--target cuda) links SBP_RT_CUDA_LINK instead (codegen/cuda.cmake: the whole
 * of libsbprt_cuda.a, so that the step exports every runtime function sbp-train calls on its
 * device memory, then -lcudart -lcublas and the C++ runtime); it is empty when sbpc was
 * configured without a CUDA compiler.
 */
#include "codegen.h"

#include <errno.h>
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

static void av_free(argvec *a)
{
    for (int i = 0; i < a->n; i++)
        free(a->v[i]);
    free(a->v);
}

int sbp_codegen_compile_so_target(const char *c_path, const char *so_path,
                                  const char *extra_cflags, const char *target, ir_diag *d)
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
    char inc[4200];
    snprintf(inc, sizeof inc, "-I%s", dir);
    rc |= av_push(&a, inc);
    rc |= av_split(&a, SBP_RT_INCLUDE_DIRS, "-I");
    rc |= av_push(&a, "-o");
    rc |= av_push(&a, so_path);
    rc |= av_push(&a, c_path);
    rc |= av_split(&a, cuda ? SBP_RT_CUDA_LINK : SBP_RT_LINK, "");
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

int sbp_codegen_compile_so(const char *c_path, const char *so_path, const char *extra_cflags,
                           ir_diag *d)
{
    return sbp_codegen_compile_so_target(c_path, so_path, extra_cflags, NULL, d);
}

int sbp_codegen_write(const sbp_train_program *p, const char *out_path, const char *model_path,
                      const char *extra_cflags, ir_diag *d)
{
    return sbp_codegen_write_target(p, out_path, model_path, extra_cflags, NULL, d);
}

int sbp_codegen_write_target(const sbp_train_program *p, const char *out_path,
                             const char *model_path, const char *extra_cflags,
                             const char *target, ir_diag *d)
{
    bool so = ends_with(out_path, ".so");
    if (!so && !ends_with(out_path, ".c"))
        return ir_diag_error(d, "-o %s: the output must end in .c (C source and header) or .so "
                                "(compiled shared object)", out_path);
    size_t stem = strlen(out_path) - (so ? 3 : 2);
    char *c_path = malloc(stem + 3), *h_path = malloc(stem + 3);
    if (!c_path || !h_path) {
        free(c_path);
        free(h_path);
        return ir_diag_error(d, "out of memory");
    }
    snprintf(c_path, stem + 3, "%.*s.c", (int)stem, out_path);
    snprintf(h_path, stem + 3, "%.*s.h", (int)stem, out_path);
    const char *hbase = strrchr(h_path, '/');
    hbase = hbase ? hbase + 1 : h_path;

    int rc = IR_OK;
    FILE *c = fopen(c_path, "w"), *h = c ? fopen(h_path, "w") : NULL;
    if (!c || !h) {
        rc = ir_diag_error(d, "cannot write %s: %s", c ? h_path : c_path, strerror(errno));
    } else {
        /* PATH.consts.bin holds the large constants; the .c names it by absolute path. */
        sbp_codegen_options o = {.header_name = hbase, .model_path = model_path,
                                 .target = target};
        char blob_path[4096], *dir = NULL;
        int n = snprintf(blob_path, sizeof blob_path, "%.*s.consts.bin", (int)stem, out_path);
        FILE *blob = n > 0 && (size_t)n < sizeof blob_path ? fopen(blob_path, "wb") : NULL;
        if (blob) {
            char *slash = strrchr(blob_path, '/');
            char *d_only = slash ? strndup(blob_path, (size_t)(slash - blob_path)) : strdup(".");
            dir = d_only ? realpath(d_only, NULL) : NULL;
            free(d_only);
        }
        char abs_blob[8192];
        const char *bbase = strrchr(blob_path, '/');
        bbase = bbase ? bbase + 1 : blob_path;
        if (blob && dir && !strpbrk(dir, "\"\\\n") && !strpbrk(bbase, "\"\\\n") &&
            (size_t)snprintf(abs_blob, sizeof abs_blob, "%s/%s", dir, bbase) < sizeof abs_blob) {
            o.blob = blob;
            o.blob_path = abs_blob;
        }
        rc = sbp_codegen_emit(p, &o, c, h, d);
        if (blob && fclose(blob) != 0 && rc == IR_OK)
            rc = ir_diag_error(d, "cannot write %s: %s", blob_path, strerror(errno));
        if (blob && !o.blob)
            remove(blob_path); /* unusable path: everything was emitted inline */
        free(dir);
    }
    if (c && fclose(c) != 0 && rc == IR_OK)
        rc = ir_diag_error(d, "cannot write %s: %s", c_path, strerror(errno));
    if (h && fclose(h) != 0 && rc == IR_OK)
        rc = ir_diag_error(d, "cannot write %s: %s", h_path, strerror(errno));
    if (rc == IR_OK && so)
        rc = sbp_codegen_compile_so_target(c_path, out_path, extra_cflags, target, d);
    free(c_path);
    free(h_path);
    return rc;
}
