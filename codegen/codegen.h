/* codegen.h — the C code generator: a training program (passes/train/train.h) to train_step.c
 * + .h, and the compiler call that turns them into a shared object (train_step.so).
 *
 * The emitted C implements codegen/sbp_step.h exactly: sbp_step_get_info() describes the step
 * (dims, strategy, objective, parameter table, workspace size) and sbp_step_run() runs one
 * forward + backward on the caller's memory. It is meant to be read: named buffers with their
 * shapes, workspace offsets as named macros, one static function per program block (the
 * forward, then the backward of each segment, last first), and before each group of runtime
 * calls a comment naming the IR node and the ONNX nodes it came from. It compiles without
 * warnings under -Wall -Wextra with gcc and clang.
 *
 * Fingerprint (sbp_step_info.model_fingerprint): FNV-1a 64 over, for each parameter in table
 * order, its name's bytes, one 0 byte, the ONNX dtype code as one byte (1 = float), the rank as
 * one byte, and each dim as 8 bytes little-endian.
 *
 * Errors: functions return IR_OK / IR_ERR with a diagnostic; nothing exits.
 */
#ifndef SBP_CODEGEN_H
#define SBP_CODEGEN_H

#include <stdio.h>

#include "files.h"
#include "ir.h"
#include "train.h"

typedef struct sbp_codegen_options {
    const char *header_name; /* how the .c includes its header ("train_step.h") */
    const char *model_path;  /* recorded in the info struct and the file comment */
    /* Large constants (RoPE tables at long T: megabytes) go to this binary file instead of C
     * array literals, which would make a source of hundreds of MB and minutes of compiling; the
     * .c assembles them in with `.incbin` of blob_path (absolute, so the .c compiles from
     * anywhere while the file stays). NULL blob: everything inline. */
    FILE *blob;
    const char *blob_path;
    /* The size from which a constant goes to the blob, in bytes (0: 64 KiB; tests give 1 to
     * exercise the path on small models). */
    size_t blob_min_bytes;
    /* "cpu" (NULL means cpu) or "cuda": the backend the step runs on (emit_target.h). A cuda
     * step takes device pointers everywhere, keeps device copies of its constants, counts the
     * scored positions on a host copy of the labels and ends with sbprt_sync. */
    const char *target;
    /* For -o PATH.so: also keep PATH.c, PATH.h and PATH.consts.bin next to the shared object
     * (sbpc --keep-c). Without it they are only the compiler's temporaries: the .so assembles
     * the constants in and needs none of them at run time. */
    bool keep_c;
    /* cuda: every entry point asks its context for TF32 GEMMs (sbprt_ctx_set_tf32; sbpc
     * --tf32) before its first product */
    bool tf32;
} sbp_codegen_options;

uint64_t sbp_codegen_fingerprint(const sbp_train_program *p);

/* Writes the C file to c and its header to h. */
int sbp_codegen_emit(const sbp_train_program *p, const sbp_codegen_options *o, FILE *c, FILE *h,
                     ir_diag *d);

/* Writes PATH.c and PATH.h (and PATH.consts.bin) for out_path "PATH.c"; for "PATH.so" compiles
 * them (sbp_codegen_compile_so_target) and writes the .so alone, or the .so and the three
 * (o->keep_c). All or none: the files are
 * made as temporaries in the target's folder and renamed only when every one is written,
 * compiled and fsynced; on any failure the previous files are left as they were. From o: the
 * model path, the target, keep_c and blob_min_bytes (the header and the constants file are the
 * writer's own: o's header_name, blob and blob_path are not read). extra_cflags may be NULL. */
int sbp_codegen_write(const sbp_train_program *p, const char *out_path,
                      const sbp_codegen_options *o, const char *extra_cflags, ir_diag *d);

/* Checks the files -o out_path will write (PATH.c, PATH.h, PATH.consts.bin; PATH.so alone for a
 * .so unless keep_c) before any work: none may be one of `inputs` (the model, its external data) or an
 * existing special file other than a character device (ir/files.h, sbp_file_check_output); each
 * is added to `outputs` (may be NULL). */
int sbp_codegen_check_outputs(const char *out_path, bool keep_c, const sbp_file_set *inputs,
                              sbp_file_set *outputs, ir_diag *d);

/* Compiles c_path into the shared object so_path with $CC (else clang, else cc) and links it
 * against libsbprt and its dependencies (paths fixed when sbpc was built). extra_cflags: more
 * flags, split at spaces (e.g. "-Werror"), may be NULL. */
int sbp_codegen_compile_so(const char *c_path, const char *so_path, const char *extra_cflags,
                           ir_diag *d);

/* sbp_codegen_write with the defaults but for the model path and the target ("cpu", "cuda";
 * NULL = cpu): a cuda step is emitted for the CUDA backend and linked, whole, against the build tree's libsbprt_cuda.a, the CUDA runtime and
 * cuBLAS (-lcudart -lcublas, paths recorded when sbpc was configured; codegen/cuda.cmake)
 * and the C++ runtime its kernels' host code needs. The C is compiled with $CC as for the
 * CPU; the kernels are in the library, built for CMAKE_CUDA_ARCHITECTURES (sm_90 + PTX by
 * default). An sbpc configured without a CUDA compiler writes cuda .c files but refuses to
 * build a cuda .so, saying so. */
int sbp_codegen_write_target(const sbp_train_program *p, const char *out_path,
                             const char *model_path, const char *extra_cflags,
                             const char *target, ir_diag *d);
int sbp_codegen_compile_so_target(const char *c_path, const char *so_path,
                                  const char *extra_cflags, const char *target, ir_diag *d);
/* Whether this sbpc can build .so files for target ("cpu" always; "cuda" when configured
 * with a CUDA compiler). */
bool sbp_codegen_target_available(const char *target);

/* ---------------------------------------------------------------- report.c */

/* One column of a memory report: a strategy's planned program (passes/train/memplan.h), or
 * NULL with the reason it could not be built. */
typedef struct sbp_report_entry {
    const char *name;              /* the strategy: "store", "checkpoint", "stream" */
    const sbp_train_program *p;    /* NULL: not built */
    const char *why;               /* p == NULL: why (may be NULL) */
} sbp_report_entry;

/* `sbpc --report`: a table with, per strategy, parameters, gradients, optimizer state (AdamW m
 * and v), the planned workspace, its liveness lower bound and what is live at its peak (logits,
 * K/V, layer checkpoints, per-chunk scratch, activation gradients, other activations), all in
 * bytes; then, for e[main_index] (-1: none), the largest buffers with offsets and lifetimes. */
int sbp_report_write(FILE *f, const sbp_report_entry *e, int n, int main_index, ir_diag *d);

/* `sbpc --memory-plot FILE.svg`: workspace bytes live at each schedule position, one polyline
 * per strategy (with its planned arena dashed), axis labels and a legend; a standalone SVG. */
int sbp_report_plot_svg(FILE *f, const sbp_report_entry *e, int n, ir_diag *d);

#endif
