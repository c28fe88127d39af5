/* step_info.c — prints a compiled step's self-description and checks its target.
 *
 *   sbp_step_info STEP.so TARGET
 *
 * dlopens the step (which needs no device: a CUDA step registers its kernels lazily), prints
 * "target strategy objective B T V n_params param_elems workspace_bytes host_bytes offload
 * grad_elems grads_on_host" (offload "-" when nothing is) and exits 0 when
 * info->target is TARGET and the step exports what the code generator promises for it:
 * sbp_step_init / sbp_step_release, sbp_step_eval / sbp_step_logps exactly when the info gives
 * their workspace, and for a cuda step every runtime function sbp-train takes from it (the
 * whole runtime is linked in). Exit 1 otherwise, with a message.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include "sbp_step.h"

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: %s STEP.so TARGET\n", argv[0]);
        return 2;
    }
    void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        fprintf(stderr, "step_info: cannot load %s: %s\n", argv[1], dlerror());
        return 1;
    }
    const sbp_step_info *(*get_info)(void);
    *(void **)&get_info = dlsym(lib, "sbp_step_get_info");
    const sbp_step_info *in = get_info ? get_info() : NULL;
    if (!in) {
        fprintf(stderr, "step_info: %s has no sbp_step_get_info\n", argv[1]);
        return 1;
    }
    printf("%s %s %s %lld %lld %lld %d %zu %zu %zu %s %zu %d\n", in->target ? in->target : "(null)",
           in->strategy, in->objective, (long long)in->batch, (long long)in->seq_len,
           (long long)in->vocab, in->n_params, in->param_elems, in->workspace_bytes,
           in->host_bytes, in->offload && *in->offload ? in->offload : "-", in->grad_elems,
           in->grads_on_host);
    int rc = 0;
    if (in->abi_version != SBP_STEP_ABI_VERSION || !in->target || strcmp(in->target, argv[2])) {
        fprintf(stderr, "step_info: %s: ABI %d, target '%s'; expected ABI %d, target '%s'\n",
                argv[1], in->abi_version, in->target ? in->target : "(null)",
                SBP_STEP_ABI_VERSION, argv[2]);
        rc = 1;
    }
    static const char *const always[] = {"sbp_step_run", "sbp_step_init", "sbp_step_release"};
    static const char *const runtime[] = {
        "sbprt_ctx_create", "sbprt_ctx_destroy",  "sbprt_sync",           "sbprt_arena_alloc",
        "sbprt_arena_free", "sbprt_memcpy",       "sbprt_adamw_update",   "sbprt_sgd_update",
        "sbprt_ctx_last_error", "sbprt_device_memory", "sbprt_backend_name",
        "sbprt_host_alloc", "sbprt_host_free",
    };
    for (size_t i = 0; i < sizeof always / sizeof always[0]; i++)
        if (!dlsym(lib, always[i])) {
            fprintf(stderr, "step_info: %s does not export %s\n", argv[1], always[i]);
            rc = 1;
        }
    /* the forward-only entry points: exported exactly when the info gives their plan */
    const struct {
        const char *sym;
        size_t ws;
    } entries[] = {{"sbp_step_eval", in->eval_workspace_bytes},
                   {"sbp_step_logps", in->logp_workspace_bytes}};
    for (size_t i = 0; i < sizeof entries / sizeof entries[0]; i++)
        if (!dlsym(lib, entries[i].sym) != !entries[i].ws) {
            fprintf(stderr, "step_info: %s %s %s, but its info gives a workspace of %zu bytes\n",
                    argv[1], dlsym(lib, entries[i].sym) ? "exports" : "does not export",
                    entries[i].sym, entries[i].ws);
            rc = 1;
        }
    if (strcmp(argv[2], "cpu") != 0) {
        for (size_t i = 0; i < sizeof runtime / sizeof runtime[0]; i++)
            if (!dlsym(lib, runtime[i])) {
                fprintf(stderr, "step_info: %s does not export %s\n", argv[1], runtime[i]);
                rc = 1;
            }
        const char *(*backend)(void);
        *(void **)&backend = dlsym(lib, "sbprt_backend_name");
        if (backend && strcmp(backend(), argv[2]) != 0) {
            fprintf(stderr, "step_info: %s links the '%s' runtime\n", argv[1], backend());
            rc = 1;
        }
    }
    /* no dlclose: the CUDA runtime's and libstdc++'s global state would look leaked (LSan) */
    return rc;
}
