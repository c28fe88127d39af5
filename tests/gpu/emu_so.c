/* emu_so.c — a cuda step compiled for the CUDA emulator and loaded (emu_so.h). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

#include "codegen.h"
#include "e2e_util.h"
#include "emu_so.h"

void *emu_so_sym(const emu_rt *r, const char *name)
{
    void *f = dlsym(r->lib, name);
    if (!f)
        print_message("the step does not export %s\n", name);
    assert_non_null(f);
    return f;
}

void emu_so_load(const sbp_train_program *program, const char *model, const char *tag,
                 emu_rt *r)
{
    char c[1024], so[1024], cmd[8192];
    ir_diag d;
    ir_diag_init(&d, model);
    snprintf(c, sizeof c, "%s/%s.c", SBP_E2E_OUT, tag);
    snprintf(so, sizeof so, "%s/%s.so", SBP_E2E_OUT, tag);
    const int wrc = sbp_codegen_write_target(program, c, model, NULL, "cuda", &d);
    if (wrc != IR_OK)
        e2e_print_diag(&d);
    ir_diag_free(&d);
    assert_int_equal(wrc, IR_OK);
    snprintf(cmd, sizeof cmd,
             "%s -std=c11 -O2 -fPIC -shared -Wall -Wextra -Werror -I%s %s -o %s %s "
             "-Wl,-Bsymbolic -Wl,--whole-archive %s -Wl,--no-whole-archive -lstdc++ -lm",
             SBP_EMU_CC, SBP_E2E_OUT, SBP_EMU_INCLUDES, so, c, SBP_EMU_LIB);
    int src = system(cmd);
    if (src != 0)
        print_message("failed: %s\n", cmd);
    assert_int_equal(src, 0);
    r->lib = dlopen(so, RTLD_NOW | RTLD_LOCAL);
    if (!r->lib)
        print_message("dlopen: %s\n", dlerror());
    assert_non_null(r->lib);
    *(void **)&r->ctx_create = emu_so_sym(r, "sbprt_ctx_create");
    *(void **)&r->ctx_destroy = emu_so_sym(r, "sbprt_ctx_destroy");
    *(void **)&r->alloc = emu_so_sym(r, "sbprt_arena_alloc");
    *(void **)&r->free = emu_so_sym(r, "sbprt_arena_free");
    *(void **)&r->memcpy = emu_so_sym(r, "sbprt_memcpy");
    *(void **)&r->run = emu_so_sym(r, "sbp_step_run");
    *(void **)&r->logps = emu_so_sym(r, "sbp_step_logps");
    *(void **)&r->info = emu_so_sym(r, "sbp_step_get_info");
}

void *emu_dev_copy(const emu_rt *r, sbprt_ctx *ctx, const void *src, size_t bytes)
{
    void *d = NULL;
    assert_int_equal(r->alloc(ctx, &d, bytes ? bytes : 4), SBPRT_OK);
    if (src)
        assert_int_equal(r->memcpy(ctx, d, src, bytes, SBPRT_COPY_HOST_TO_DEVICE), SBPRT_OK);
    return d;
}
