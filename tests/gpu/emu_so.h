/* emu_so.h — a cuda step compiled for the CUDA emulator and loaded, for the tests that run a
 * step's own entry points on emulated device memory (step_logps_emu.c, step_doc_emu.c).
 *
 * emu_so_load writes the program's C for --target cuda to SBP_E2E_OUT/TAG.c, compiles it as
 * sbpc would (but against libsbprt_cuda_emu.a: SBP_EMU_CC, SBP_EMU_INCLUDES, SBP_EMU_LIB, given
 * by tests/gpu/codegen.cmake), dlopens it and binds the step's runtime: its exported sbprt_*
 * functions, since the emulated backend's state lives in the step library. Failures are cmocka
 * failures.
 */
#ifndef SBP_TESTS_GPU_EMU_SO_H
#define SBP_TESTS_GPU_EMU_SO_H

#include <stddef.h>

#include "sbp_step.h"
#include "train.h"

/* The step's own runtime and entry points. */
typedef struct emu_rt {
    void *lib; /* the dlopen handle */
    int (*ctx_create)(sbprt_ctx **, int);
    void (*ctx_destroy)(sbprt_ctx *);
    int (*alloc)(sbprt_ctx *, void **, size_t);
    void (*free)(sbprt_ctx *, void *);
    int (*memcpy)(sbprt_ctx *, void *, const void *, size_t, int);
    int (*run)(sbprt_ctx *, const sbp_step_args *);
    int (*logps)(sbprt_ctx *, const sbp_step_args *, float *, float *);
    const sbp_step_info *(*info)(void);
} emu_rt;

/* The step of `program` (the flow's, for `model`) as SBP_E2E_OUT/TAG.so, loaded into *r. */
void emu_so_load(const sbp_train_program *program, const char *model, const char *tag,
                 emu_rt *r);

/* A symbol the step must export. */
void *emu_so_sym(const emu_rt *r, const char *name);

/* bytes of the step's device memory (at least 4), holding src's when src is not NULL. */
void *emu_dev_copy(const emu_rt *r, sbprt_ctx *ctx, const void *src, size_t bytes);

#endif
