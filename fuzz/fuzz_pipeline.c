/* fuzz_pipeline.c — libFuzzer target for the whole compile flow, import to memory plan.
 *
 * Feeds arbitrary bytes to sbp_flow_run (passes/flow.h) as a model read from memory (so external
 * data is refused rather than read from whatever path the input names) and runs every stage:
 * import, the canonicalisation passes, the objective (SFT), autodiff, the strategy's schedule and
 * the memory plan; then frees everything, so ASan/UBSan catch any out-of-bounds access, leak or
 * undefined behaviour anywhere on the way. No code is generated and nothing is written.
 *
 * The bindings and the strategy come from a hash of the whole input, not from its first bytes:
 * the seeds are real ONNX files, whose first bytes are the protobuf header, and a prefix eaten
 * for options would leave every seed unreadable. With the hash, a mutation that leaves the model
 * meaning the same (a weight's byte, most of a model file) recompiles it under other options,
 * and libFuzzer keeps the ones that reach new code. Kept small (batch 1 or 2, sequence 8..16, or one
 * run in four the model's own static dims; stream chunks of a few tokens), so one run of a
 * fixture-sized model takes milliseconds, not seconds.
 *
 * The contract checked beyond "no crash, leak or UB": the flow returns IR_OK with a planned
 * program (a workspace, and a plan memplan_verify accepts) and no error recorded, or IR_ERR with
 * at least one error recorded — and none of those errors may be one of the compiler's own
 * consistency checks (the verifier after a pass, the program verifier, the planner's checks),
 * which report an sbpc bug, not a bad model.
 *
 *   cmake -S . -B build-fuzz -DCMAKE_C_COMPILER=clang -DSBP_FUZZ=ON -DSBP_TESTS=OFF
 *   cmake --build build-fuzz --target fuzz_pipeline
 *   mkdir -p build-fuzz/corpus-pipeline
 *   build-fuzz/fuzz/fuzz_pipeline build-fuzz/corpus-pipeline fuzz/seeds tests/fixtures \
 *       examples -rss_limit_mb=2048 -timeout=10 -max_total_time=600
 *
 * SBP_FUZZ_VERBOSE=1 prints each run's options, outcome and diagnostics (to see what the seeds
 * reach: build-fuzz/fuzz/fuzz_pipeline FILE...).
 */
#include <stdlib.h>
#include <string.h>

#include "flow.h"
#include "memplan.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The compilation's own memory: a shape that would need more is refused (sbp_check_compile_size,
 * fold's guard) instead of allocated, far below libFuzzer's -rss_limit_mb. */
#define FUZZ_COMPILE_MEM (256ll << 20)
/* Folded constants stay small: a fuzzed shape's Range or Expand is not built at a million
 * elements (it stays a node, and the training build refuses or lowers it). */
#define FUZZ_FOLD_MAX_ELEMS (1ll << 16)

/* FNV-1a over the input: the options' source (see the header). */
static uint64_t hash_bytes(const uint8_t *p, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

/* Errors that are the compiler checking itself: after the flow's verifier (pipeline.c), the
 * training program's verifier (train_verify.c) and the planner's own checks (plan.c). A model
 * must never be able to trigger one. Told by their fixed opening words only: the rest of a
 * message quotes the model's names, which the fuzzer fills with whatever strings it saw
 * compared (it found "(an sbpc bug)" inside a value's name within minutes). */
static int starts_with(const char *s, const char *prefix)
{
    return strncmp(s, prefix, strlen(prefix)) == 0;
}
static int is_internal_error(const char *msg)
{
    return starts_with(msg, "the graph is invalid after pass '") ||
           starts_with(msg, "verify: ") ||
           (starts_with(msg, "memory plan: ") &&
            !starts_with(msg, "memory plan: liveness failed (out of memory)"));
}

static void fail(ir_diag *d, const char *why)
{
    fprintf(stderr, "fuzz_pipeline: %s\n", why);
    ir_diag_print(d, stderr, "fuzz_pipeline");
    abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint64_t h = hash_bytes(data, size);
    static const sbp_strategy strategies[] = {SBP_STRATEGY_STORE, SBP_STRATEGY_CHECKPOINT,
                                              SBP_STRATEGY_STREAM};
    sbp_train_options train = {.strategy = strategies[h % 3]};
    if (train.strategy == SBP_STRATEGY_STREAM) {
        /* small chunks, so a 8..16-token sequence is several of them, with a tail */
        train.chunk = 1 + (int64_t)((h >> 8) % 6);
        train.logits_chunk = 1 + (int64_t)((h >> 16) % 7);
    }

    sbp_flow_options fo = {
        .pass = {.batch = 1 + (int64_t)((h >> 2) & 1),
                 .seq_len = 8 + (int64_t)((h >> 24) % 9),
                 .verify = true,
                 .fold_max_elems = FUZZ_FOLD_MAX_ELEMS,
                 .compile_mem_limit = FUZZ_COMPILE_MEM},
        .objective = SBP_OBJECTIVE_SFT,
        .train = train,
    };
    /* one run in four binds nothing, as sbpc without --batch/--seq-len: a model with static
     * dims (the op17_static fixtures, B=2 T=64) is refused under any other binding */
    if ((h >> 40) % 4 == 0)
        fo.pass.batch = fo.pass.seq_len = 0;

    ir_diag d;
    ir_diag_init(&d, NULL);
    sbp_flow f = {.path = "fuzz.onnx", .buf = data, .len = size};
    /* an empty input is "no model" to the flow (buf NULL means a path): give it a valid
     * pointer, the importer then refuses zero bytes itself */
    static const uint8_t empty[1];
    if (size == 0)
        f.buf = empty;
    const int rc = sbp_flow_run(&f, &fo, &d, NULL);

    static int verbose = -1;
    if (verbose < 0)
        verbose = getenv("SBP_FUZZ_VERBOSE") != NULL;
    if (verbose) {
        fprintf(stderr, "fuzz_pipeline: %zu bytes, B=%lld T=%lld %s chunk %lld/%lld: %s\n", size,
                (long long)fo.pass.batch, (long long)fo.pass.seq_len,
                sbp_strategy_name(train.strategy), (long long)train.chunk,
                (long long)train.logits_chunk, rc == IR_OK ? "planned" : "refused");
        ir_diag_print(&d, stderr, "fuzz_pipeline");
    }

    for (int i = 0; i < d.n; i++)
        if (d.entries[i].sev == IR_SEV_ERROR && is_internal_error(d.entries[i].msg))
            fail(&d, "an internal check failed");
    if (rc == IR_OK) {
        if (d.n_errors != 0)
            fail(&d, "IR_OK with errors recorded");
        if (!f.program || f.program->workspace_bytes == 0)
            fail(&d, "IR_OK without a planned program");
        if (memplan_verify(f.program, &d) != IR_OK)
            fail(&d, "the memory plan does not verify");
    } else if (d.n_errors == 0) {
        fail(&d, "refused without saying why");
    }
    /* the program lives in the graph's arena */
    if (f.g)
        ir_graph_free(f.g);
    ir_diag_free(&d);
    return 0;
}
