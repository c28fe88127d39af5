/* fuzz_import.c — libFuzzer target for the ONNX importer.
 *
 * Feeds arbitrary bytes to ir_import_onnx_buffer (no base directory, so external data is refused
 * rather than read from whatever path the input names) and frees everything, so ASan/UBSan catch
 * any out-of-bounds access, leak or undefined behaviour in decoding, import, toposort and shape
 * inference. The contract checked beyond "no crash": the importer either returns a graph that
 * passes ir_verify, or NULL with at least one error recorded.
 *
 *   cmake -S . -B build-fuzz -DCMAKE_C_COMPILER=clang -DSBP_FUZZ=ON
 *   cmake --build build-fuzz --target fuzz_import
 *   mkdir -p /tmp/fuzz-corpus
 *   build-fuzz/fuzz/fuzz_import /tmp/fuzz-corpus fuzz/seeds tests/import/corpus -max_total_time=300
 */
#include <stdlib.h>

#include "ir.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ir_diag d;
    ir_diag_init(&d, NULL);
    ir_graph *g = ir_import_onnx_buffer(data, size, "fuzz.onnx", NULL, &d, NULL);
    if (g) {
        if (d.n_errors != 0 || ir_verify(g) != IR_OK) {
            ir_diag_print(&d, stderr, "fuzz_import");
            abort();
        }
        ir_graph_free(g);
    } else if (d.n_errors == 0) {
        abort(); /* refused without saying why */
    }
    ir_diag_free(&d);
    return 0;
}
