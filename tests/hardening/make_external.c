/* make_external.c — test helper: rewrites an ONNX model so that every initializer lives in an
 * external data file, "<OUT>.data" next to OUT, as large exports do. The hardening tests need
 * such a model to check that the external data is opened without blocking and is never
 * overwritten by an output; no fixture in the tree has external data, so it is made at test
 * time with sbpio's own writer (external mode forced by an inline limit of 1 byte).
 *
 *   make_external IN.onnx OUT.onnx
 */
#include "sbpio.h"

#include <stdio.h>

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: make_external IN.onnx OUT.onnx\n");
        return 2;
    }
    char err[1024];
    sbpio_onnx_save_opts opts = {.inline_limit = 1, .external_min_bytes = 1};
    if (sbpio_onnx_save_ex(argv[1], argv[2], 0, NULL, NULL, NULL, &opts, err, sizeof err) !=
        SBPIO_OK) {
        fprintf(stderr, "make_external: %s\n", err);
        return 1;
    }
    return 0;
}
