/* pipeline.c — the whole compile flow as one list: import, the canonicalisation passes, the
 * objective, --freeze, and the training program's stages (autodiff, stream, plan), each with
 * the function that runs it and the one that prints its result (flow.h). Code generation
 * (codegen/) takes the planned program from here.
 *
 * --lora's adapters (passes/graph/lora.c) are added between canonicalisation and the objective.
 * `sbpc --dump-ir=NAME` stops after the stage called NAME and prints its result ("import"
 * stops before the first pass). The verifier runs after every graph stage: a pass that leaves a
 * broken graph is named at once. sbpc, the tests and the benchmarks all run the flow through
 * sbp_flow_run; this file is the top of passes/ (nothing here is called from below).
 */
#include "flow.h"
#include "checked.h"

#include <string.h>

static int run_bind(ir_graph *g, const sbp_pass_options *o)
{
    return sbp_pass_bind_dims(g, o->batch, o->seq_len);
}
/* The fold cap: the caller's, else 16 Mi elements or 1024 per token (B*T), whichever is larger,
 * so that tables with a row per token (RoPE's [T, head_dim], which the recogniser needs as
 * constants) fold at any sequence length, while T x T mask chains stay nodes at long T. */
static int64_t fold_cap(const sbp_pass_options *o)
{
    if (o->fold_max_elems)
        return o->fold_max_elems;
    const int64_t cap = (int64_t)1 << 24;
    /* saturating (ir/checked.h): the bindings are the command line's, not yet checked here */
    const int64_t tokens =
        ck_mul_sat_i64(o->batch > 0 ? o->batch : 1, o->seq_len > 0 ? o->seq_len : 0);
    return tokens > cap / 1024 ? ck_mul_sat_i64(tokens, 1024) : cap;
}

static int run_params(ir_graph *g, const sbp_pass_options *o)
{
    (void)o;
    return sbp_pass_params(g);
}

static int run_fold(ir_graph *g, const sbp_pass_options *o)
{
    /* first the size check: at a huge --seq-len the tables fold would build are what blows up */
    if (sbp_check_compile_size(g, fold_cap(o), o->compile_mem_limit) != IR_OK)
        return IR_ERR;
    return sbp_pass_fold_limited(g, fold_cap(o), sbp_compile_mem_limit(o->compile_mem_limit));
}
static int run_dce(ir_graph *g, const sbp_pass_options *o) { (void)o; return sbp_pass_dce(g); }
static int run_retie(ir_graph *g, const sbp_pass_options *o)
{
    return o->no_retie ? IR_OK : sbp_pass_retie(g);
}
static int run_recognize(ir_graph *g, const sbp_pass_options *o)
{
    (void)o;
    return sbp_pass_recognize(g);
}
static int run_cleanup(ir_graph *g, const sbp_pass_options *o)
{
    return sbp_pass_cleanup(g, fold_cap(o));
}

/* ------------------------------------------------------------------ the flow's own steps */

static int step_import(sbp_flow *f)
{
    f->g = f->buf ? ir_import_onnx_buffer(f->buf, f->len, f->path ? f->path : "model.onnx",
                                          NULL, f->diag, f->import)
                  : ir_import_onnx(f->path, f->diag, f->import);
    return f->g ? IR_OK : IR_ERR;
}

static int step_objective(sbp_flow *f)
{
    return sbp_pass_objective(f->g, f->opt->objective, &f->chosen);
}

/* --lora (passes/graph/lora.c). After canonicalisation, because it adapts Linear ops, which exist
 * only once recognition has folded each projection's MatMul/Gemm, transposed weight and bias
 * into one node (and the LM head's tie is restored, so the head is not taken for a projection).
 * Before the objective and --freeze: the adapters must be parameters when --freeze looks at
 * the names (a --freeze that names an adapter contradicts --lora: an error), and the rewrite
 * then sees the model's own graph, not the loss appended to it. A flow step (it needs the flow's
 * options), so it runs the verifier itself, as run_stages does after a graph pass. */
static int step_lora(sbp_flow *f)
{
    if (f->opt->lora.rank <= 0)
        return IR_OK;
    if (sbp_pass_lora(f->g, &f->opt->lora, &f->n_adapted) != IR_OK)
        return IR_ERR;
    if (f->opt->pass.verify && ir_verify(f->g) != IR_OK)
        return ir_diag_error(f->diag, "the graph is invalid after pass 'lora' (an sbpc bug)");
    return IR_OK;
}

/* --packed (passes/graph/packed.c): a learned position table read by the document positions. After
 * canonicalisation (the Embedding and its folded constant positions exist only then), before
 * the objective (the token-id input is still the graph's only integer input). */
static int step_packed(sbp_flow *f)
{
    /* a sequence-parallel step reads each token's position in its whole row the same way */
    if (!f->opt->train.packed && f->opt->train.seq_parallel < 1)
        return IR_OK;
    if (sbp_pass_packed(f->g, NULL) != IR_OK)
        return IR_ERR;
    if (f->opt->pass.verify && ir_verify(f->g) != IR_OK)
        return ir_diag_error(f->diag, "the graph is invalid after pass 'packed' (an sbpc bug)");
    return IR_OK;
}

static int step_freeze(sbp_flow *f)
{
    for (int k = 0; k < f->opt->n_freeze; k++) {
        int n = 0;
        if (f->opt->lora.rank > 0 && sbp_lora_check_freeze(f->g, f->opt->freeze[k]) != IR_OK)
            return IR_ERR;
        if (sbp_freeze_params(f->g, f->opt->freeze[k], &n) != IR_OK)
            return IR_ERR;
        f->n_frozen += n;
    }
    return IR_OK;
}

/* The three training stages are one build (sbp_train_build_until) stopped after the last of
 * them the caller asked for: the earlier ones are not built on their own. */
static int step_train(sbp_flow *f, sbp_train_stage stage)
{
    if (f->stop_stage > stage)
        return IR_OK;
    f->program = sbp_train_build_until(f->g, f->chosen, &f->opt->train, stage);
    return f->program ? IR_OK : IR_ERR;
}
static int step_autodiff(sbp_flow *f) { return step_train(f, SBP_TRAIN_UNTIL_AUTODIFF); }
static int step_stream(sbp_flow *f) { return step_train(f, SBP_TRAIN_UNTIL_SCHEDULE); }
static int step_plan(sbp_flow *f) { return step_train(f, SBP_TRAIN_UNTIL_PLAN); }

static void dump_graph(const sbp_flow *f, FILE *out) { ir_print(f->g, out); }
static void dump_schedule(const sbp_flow *f, FILE *out)
{
    sbp_train_print_schedule(f->program, sbp_flow_stages[f->last].name, out);
}
static void dump_plan(const sbp_flow *f, FILE *out) { sbp_train_print_plan(f->program, out); }

/* ------------------------------------------------------------------ the list */

const sbp_flow_stage sbp_flow_stages[] = {
    {"import", "the graph as read from the ONNX file", step_import, NULL, dump_graph},
    {"bind-dims", "bind the symbolic batch/sequence dims to --batch/--seq-len", NULL, run_bind,
     dump_graph},
    {"params", "tell trainable weights from constant initializers (buffers, scalars)", NULL,
     run_params, dump_graph},
    {"fold", "fold shape arithmetic and constants", NULL, run_fold, dump_graph},
    {"dce", "remove nodes that do not reach an output", NULL, run_dce, dump_graph},
    {"retie", "restore weight tying broken by the exporter's constant folding", NULL, run_retie,
     dump_graph},
    {"recognize", "recognise semantic ops (Linear, norms, attention, ...)", NULL, run_recognize,
     dump_graph},
    {"cleanup", "fold and dce again after recognition", NULL, run_cleanup, dump_graph},
    {"lora", "add LoRA adapters to the --lora-targets projections (--lora)", step_lora, NULL,
     dump_graph},
    {"packed", "learned positions per document (--packed)", step_packed, NULL, dump_graph},
    {"objective", "end the graph in its loss (--objective)", step_objective, NULL, dump_graph},
    {"freeze", "mark the parameters --freeze names as not trained", step_freeze, NULL,
     dump_graph},
    {"autodiff", "the reverse-mode program on the whole sequence (as store)", step_autodiff,
     NULL, dump_schedule},
    {"stream", "the strategy's program: chunk loops, slices, accumulators, recomputation",
     step_stream, NULL, dump_schedule},
    {"plan", "the memory plan: each workspace buffer's offset, size and lifetime", step_plan,
     NULL, dump_plan},
};
const int sbp_n_flow_stages = (int)(sizeof sbp_flow_stages / sizeof sbp_flow_stages[0]);

int sbp_flow_find(const char *name)
{
    for (int i = 0; i < sbp_n_flow_stages; i++)
        if (strcmp(sbp_flow_stages[i].name, name) == 0)
            return i;
    return -1;
}

/* Runs stages [first, last] on f; the verifier after each graph pass. */
static int run_stages(sbp_flow *f, int first, int last)
{
    for (int i = first; i <= last; i++) {
        const sbp_flow_stage *s = &sbp_flow_stages[i];
        int errors = f->diag->n_errors;
        int rc = s->pass ? s->pass(f->g, &f->opt->pass) : s->step(f);
        if (rc != IR_OK || f->diag->n_errors) {
            /* the stage's own error says why, in one line; a stage that failed without saying
             * so is named */
            if (f->diag->n_errors == errors)
                ir_diag_error(f->diag, "pass '%s' failed", s->name);
            return IR_ERR;
        }
        if (s->pass && f->opt->pass.verify && ir_verify(f->g) != IR_OK) {
            ir_diag_error(f->diag, "the graph is invalid after pass '%s' (an sbpc bug)",
                          s->name);
            return IR_ERR;
        }
    }
    return IR_OK;
}

int sbp_flow_run(sbp_flow *f, const sbp_flow_options *o, ir_diag *d, const char *stop_after)
{
    int last = sbp_n_flow_stages - 1;
    if (stop_after && (last = sbp_flow_find(stop_after)) < 0)
        return ir_diag_error(d, "unknown pass '%s' (see sbpc --help for the list)", stop_after);
    if (!f->g) { /* a fresh flow (a zeroed struct) */
        f->done = -1;
        f->chosen = o->objective;
    }
    if (last <= f->done)
        return IR_OK;
    f->opt = o;
    f->diag = d;
    f->stop_stage = last == sbp_flow_find("autodiff")  ? SBP_TRAIN_UNTIL_AUTODIFF
                    : last == sbp_flow_find("stream") ? SBP_TRAIN_UNTIL_SCHEDULE
                                                       : SBP_TRAIN_UNTIL_PLAN;
    f->last = last;
    int rc = run_stages(f, f->done + 1, last);
    if (rc == IR_OK)
        f->done = last;
    return rc;
}

int sbp_canonicalize(ir_graph *g, const sbp_pass_options *opt, const char *stop_after)
{
    int last = sbp_flow_find("cleanup");
    if (stop_after) {
        int k = sbp_flow_find(stop_after);
        if (k < 0 || k > last)
            return ir_diag_error(g->diag, "unknown pass '%s' (see sbpc --help for the list)",
                                 stop_after);
        last = k;
    }
    sbp_flow_options o = {.pass = *opt};
    sbp_flow f = {.g = g, .opt = &o, .diag = g->diag};
    return run_stages(&f, 1, last);
}
