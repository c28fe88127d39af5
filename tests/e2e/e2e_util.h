/* e2e_util.h — what the end-to-end tests (test_e2e.c, test_stream.c, test_objectives.c,
 * test_rules.c) share, so that each test file holds only what it checks.
 *
 * The path every test takes is the one `sbpc -o x.so` takes: import a fixture, canonicalise,
 * apply the objective, build the training program, write it as C, compile it (-Werror) into a
 * shared object under SBP_E2E_OUT and dlopen it; then run one step with a workspace of exactly
 * the size the step reports (filled with garbage, so under AddressSanitizer an undersized plan
 * or a read of unwritten memory shows) and compare gradients per tensor by relative L2 error,
 * with PyTorch's float64 references (tests/fixtures/ref) or with another strategy's step.
 *
 * The helpers fail the running cmocka test on any error (they assert), so a test reads as the
 * list of its expectations. The tolerances below are the ones the tests document in their
 * headers; a test with a tighter bound of its own keeps it locally.
 */
#ifndef SBP_E2E_UTIL_H
#define SBP_E2E_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "codegen.h"
#include "ir.h"
#include "passes.h"
#include "sbp_step.h"
#include "sbpio.h"
#include "sbprt.h"
#include "train.h"

/* The SFT reference batch, tests/fixtures/ref/<family>_{input_ids,labels}.npy: [2, 64]. */
#define E2E_B 2
#define E2E_T 64

#define E2E_REF_GRAD_TOL 1e-4 /* per tensor, against the float64 PyTorch gradient */
#define E2E_REF_LOSS_TOL 1e-5 /* relative, against the float64 PyTorch loss */
#define E2E_STORE_TOL 1e-5    /* per tensor, another strategy against store */

/* The runtime context every step runs in; each test's main creates it (its thread count is
 * the test's choice) and destroys it. */
extern sbprt_ctx *e2e_ctx;

/* A compiled step and what it was compiled from. */
typedef struct e2e_step {
    ir_diag diag;              /* the compilation's diagnostics */
    ir_graph *g;               /* the canonical graph: parameter data (NULL: the caller owns it) */
    sbp_train_program *p;      /* in g's arena */
    void *lib;                 /* the dlopen'd shared object */
    const sbp_step_info *info; /* sbp_step_get_info() */
    int (*run)(sbprt_ctx *, const sbp_step_args *);
} e2e_step;

/* Points CC at the compiler the tests were built with (the shared objects must link the same
 * sanitizer runtime as the test) and creates SBP_E2E_OUT. */
void e2e_init(void);

/* SBP_FIXTURES_DIR/name, in one of four rotating buffers (so a few can be alive at once). */
const char *e2e_fixture(const char *name);

/* Prints the error diagnostics of d as "  node: message". */
void e2e_print_diag(const ir_diag *d);

/* The canonical graph of fixture `model` with batch b and sequence length t bound (0: the
 * export's static dims) and objective obj applied; *chosen is the objective the pass chose (SFT
 * on a graph that ends in its loss becomes graph-loss). d is initialised here. */
ir_graph *e2e_front(const char *model, int64_t b, int64_t t, sbp_objective obj, ir_diag *d,
                    sbp_objective *chosen);

/* e2e_front, then --freeze (freeze: a regular expression, NULL: none), then the training
 * program with options o. Returns the objective chosen. */
sbp_objective e2e_build(e2e_step *s, const char *model, int64_t b, int64_t t, sbp_objective obj,
                        const char *freeze, const sbp_train_options *o);

/* Writes program p as SBP_E2E_OUT/<tag>.so (with -Werror; model names the source in the
 * generated header; diagnostics go to d), dlopens it and fills s->lib, s->run and s->info. */
void e2e_load_so(e2e_step *s, const sbp_train_program *p, const char *model, const char *tag,
                 ir_diag *d);
/* The same with the code generator's options cg (its model_path is model's). */
void e2e_load_so_with(e2e_step *s, const sbp_train_program *p, const char *model,
                      const sbp_codegen_options *cg, const char *tag, ir_diag *d);

/* e2e_build and e2e_load_so; the step reports the strategy of o. Returns the objective chosen. */
sbp_objective e2e_compile(e2e_step *s, const char *model, int64_t b, int64_t t,
                          sbp_objective obj, const char *freeze, const sbp_train_options *o,
                          const char *tag);
/* The same with the code generator's options cg (e2e_load_so_with). */
sbp_objective e2e_compile_with(e2e_step *s, const char *model, int64_t b, int64_t t,
                               sbp_objective obj, const char *freeze,
                               const sbp_train_options *o, const sbp_codegen_options *cg,
                               const char *tag);

/* Closes the shared object and frees the graph and diagnostics. */
void e2e_free_step(e2e_step *s);

/* The parameter block (info->param_elems floats, plus one) filled from g's initializers; a tied
 * copy's rows are left to its owner. The caller frees it. */
float *e2e_param_block(const sbp_step_info *info, const ir_graph *g);

/* Runs one step with args a (a->workspace and a->loss are set here: a workspace of exactly
 * workspace_bytes, filled with garbage since the step must not rely on zeroed memory). poison:
 * fill a->grads with NaN first (accumulate = 0 must overwrite every element). Returns the loss;
 * the step must return SBPRT_OK. */
double e2e_run(const e2e_step *s, sbp_step_args *a, bool poison);

/* SBP_FIXTURES_DIR/ref/<file>, an npy of exactly n elements, converted into dst. */
void e2e_read_i32(const char *file, int32_t *dst, int64_t n);
void e2e_read_f32(const char *file, float *dst, int64_t n);

/* A batch of token ids and labels (-100: not scored), row-major [b, t]. */
typedef struct e2e_batch {
    int64_t b, t;
    int32_t ids[E2E_B * E2E_T], labels[E2E_B * E2E_T];
} e2e_batch;

/* The family's SFT reference batch (E2E_B x E2E_T). */
void e2e_load_batch(const char *family, e2e_batch *bt);

/* Parameter i's gradient in its own layout, as double (a tied copy's is its owner's,
 * transposed). */
void e2e_grad_of(const sbp_step_info *info, const float *grads, int i, double *out);

/* ||got - ref|| / ||ref|| (||got - ref|| where ref is all zero). */
double e2e_rel_err(const double *got, const double *ref, size_t n);

/* The largest per-tensor relative difference between two steps' gradients (a against b), for
 * two steps of the same model (the same parameter table, asserted); parameters above tol are
 * printed. */
double e2e_max_rel_vs(const e2e_step *a, const float *ga, const e2e_step *b, const float *gb,
                      double tol);

/* A float64 PyTorch reference: the gradients of one objective on one batch. */
typedef struct e2e_reference {
    ir_diag diag;
    ir_graph *g;       /* <family>_op17_static.onnx as imported: its initializer names key the
                        * reference tensors */
    sbpio_st_file *st; /* the gradients */
    double loss;       /* __metadata__.loss */
    e2e_batch bt;      /* the family's SFT batch */
} e2e_reference;

/* ref/<file> of the family (file NULL: <family>_grads.safetensors, the SFT gradients). */
void e2e_load_reference(e2e_reference *r, const char *family, const char *file);
void e2e_free_reference(e2e_reference *r);

/* The reference tensor of parameter v: the name of the static model's parameter with v's shape
 * and bytes (the fixtures of a family hold identical weights, but the dyn and loss exports name
 * their folded weights differently), if the reference holds it; NULL otherwise. */
const char *e2e_ref_name(const e2e_reference *r, const ir_value *v);

/* The largest per-tensor relative error of a step's gradients against the reference; every
 * parameter must have a reference tensor when every_param, else those without one are skipped.
 * Parameters above E2E_REF_GRAD_TOL are printed. */
double e2e_max_rel_vs_ref(const e2e_step *s, const float *grads, const e2e_reference *r,
                          bool every_param);

/* The generated C compiles without a warning: writes p's listing to <stem>.txt (for reading)
 * and its C to <stem>.c under SBP_E2E_OUT, and runs gcc and clang with -std=c11 -Wall -Wextra
 * -Wpedantic -Werror -fsyntax-only on it. Each compiler is the one CMake found at configure
 * time (SBP_E2E_GCC, SBP_E2E_CLANG); one found then but failing now fails the test. One CMake
 * did not find is left out here and its half of the check is reported by ctest as the skipped
 * test e2e.warnings_gcc / e2e.warnings_clang (tests/e2e/CMakeLists.txt), never passed quietly. */
void e2e_check_warnings(const sbp_train_program *p, const char *model, const char *stem,
                        ir_diag *d);

#endif
