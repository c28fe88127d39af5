/* step_info.c — prints a compiled step's sizes from its own sbp_step_get_info(), for
 * tests/dist/report_case.sh, which checks `sbpc --report --ranks N --zero Z` against them:
 * the figures come from the built library, not from the compiler's report code.
 *
 *   step_info STEP.so   ->  "param_elems grad_elems workspace_bytes planned_peak_bytes batch"
 *
 * Exit 1 with a message when the library cannot be loaded or is not a step.
 */
#include "sbp_step.h"

#include <dlfcn.h>
#include <stdio.h>

typedef const sbp_step_info *(*info_fn)(void);

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: step_info STEP.so\n");
        return 1;
    }
    void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        fprintf(stderr, "step_info: error: %s\n", dlerror());
        return 1;
    }
    info_fn get;
    *(void **)(&get) = dlsym(lib, "sbp_step_get_info");
    const sbp_step_info *in = get ? get() : NULL;
    if (!in) {
        fprintf(stderr, "step_info: error: %s is not a compiled step\n", argv[1]);
        return 1;
    }
    printf("%zu %zu %zu %zu %lld\n", in->param_elems, in->grad_elems, in->workspace_bytes,
           in->planned_peak_bytes, (long long)in->batch);
    return 0;
}
