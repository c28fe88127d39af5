/* sbpc.c — the compiler driver.
 *
 *   sbpc MODEL.onnx [--batch N] [--seq-len N] [--no-retie] [--dump-ir[=PASS]] [--dump-params]
 *        [-o train_step.c|train_step.so] [--strategy stream|store|checkpoint] [--target cpu|cuda]
 *        [--precision fp32|bf16] [--base-precision fp32|bf16] [--tf32]
 *        [--chunk N] [--logits-chunk N] [--memory-budget BYTES]
 *        [--offload checkpoints|optimizer|checkpoints,optimizer] [--host-budget BYTES]
 *        [--objective sft|graph-loss|dpo|grpo] [--beta F] [--epsilon F]
 *        [--grpo-norm sequence|token] [--freeze REGEX]... [--report] [--memory-plot FILE.svg]
 *        [--no-eval] [--packed [--doc-len L] [--per-document]] [--seq-parallel N]
 *        [--lora RANK [--lora-alpha A] [--lora-targets REGEX] [--lora-seed S]]
 *        [--report --ranks N [--zero 0|1|2]]   (one rank's bytes, sbpc_dist.h)
 *
 * Reads the model, runs the canonicalisation pipeline (passes/pipeline.c) and prints the IR, the
 * parameters (--dump-params) or a summary (with each attention layer's variant and work);
 * --dump-ir=objective and =program go past canonicalisation (the graph with its loss, the
 * training program's listing); with -o it also builds the training program (passes/train/train.h:
 * objective, freeze, autodiff, strategy) and writes it as C (codegen/), compiled into a shared
 * object for .so. --report and --memory-plot build the program for every strategy (from the one
 * canonical graph) and print / draw their memory plans side by side (codegen/report.c).
 * Files: the model and its external data are opened without blocking (a FIFO is an error); the
 * outputs are checked against them, and against special files, before any work; -o writes its
 * files as a set, all or none (codegen/compile.c).
 * main is the flow, one call a step, each taking the one sbpc_options value: parse_command_line
 * (tools/cli.c: getopt_long and the value checkers sbp-train shares), check_options (the rules
 * between options; --target and --precision are one value, sbpc_target, checked once by
 * target_check), choose_first_stop (how far the flow, passes/flow.h, runs before it prints),
 * and run: the flow to that stop and what it prints (print_first_stop), then for -o, --report
 * or --memory-plot the rest, the output and the reports (compile_and_report).
 * This is the only place where diagnostics become exit codes: library code records them, the
 * driver prints them compiler-style and exits 1.
 */
#include "cli.h"
#include "codegen.h"
#include "ir.h"
#include "flow.h"
#include "passes.h"
#include "train.h"
#include "sbpc_dist.h"
#include "sbpio.h" /* the model's recorded config.json: --seq-len against its positions */

#include <stdlib.h>
#include <string.h>

static const char *prog = "sbpc";

static void usage(FILE *f)
{
    fprintf(f,
            "usage: sbpc MODEL.onnx [options]\n"
            "\n"
            "Compiles an ONNX export of a transformer language model into a training step.\n"
            "\n"
            "options:\n"
            "  --batch N          bind the symbolic batch dim to N\n"
            "  --seq-len N        bind the symbolic sequence dim to N (a warning when N exceeds\n"
            "                     the max_position_embeddings sbp-export recorded)\n"
            "  --no-retie         keep a tied weight that the exporter duplicated as two\n"
            "                     separate parameters\n"
            "  --dump-ir[=PASS]   print the IR after PASS (default: the last pass)\n"
            "  -o FILE            write the training step: FILE.c (with FILE.h), or FILE.so\n"
            "                     (compiled with $CC, else clang; the C stays a temporary)\n"
            "  --keep-c           with -o FILE.so, also keep FILE.c and FILE.h beside it\n"
            "  --target T         cpu (default: the CPU runtime, OpenBLAS) or cuda (the CUDA\n"
            "                     runtime, cuBLAS: every tensor of the step is device memory;\n"
            "                     the .so links the CUDA backend built with sbpc)\n"
            "  --precision P      fp32 (default) or bf16 (--target cuda only): activations and\n"
            "                     their gradients stored as bfloat16, computed in fp32; the\n"
            "                     parameters (fp32 master weights), their gradients, the\n"
            "                     optimizer state and the statistics stay fp32; the GEMMs read\n"
            "                     a bf16 copy of the weights and accumulate in fp32; the\n"
            "                     workspace is planned at 2 bytes per activation element\n"
            "  --base-precision P fp32 (default) or bf16 (with --precision bf16): the frozen\n"
            "                     weights that only matrix products and embedding lookups\n"
            "                     read (LoRA's base model, --freeze; a tied embedding and LM\n"
            "                     head too) are kept as bf16 alone, 2 bytes an element instead\n"
            "                     of 4 + 2 (no fp32 master, no copy); norms stay fp32; the\n"
            "                     plan counts it\n"
            "  --tf32             (--target cuda, fp32) the GEMMs round their inputs to TF32 on\n"
            "                     tensor cores (cuBLAS's FAST_TF32; PyTorch's\n"
            "                     allow_tf32): faster, with about 1e-3 relative error per\n"
            "                     product instead of fp32's 1e-6 (docs/gpu.md); attention and\n"
            "                     the other kernels stay as they are. Off by default\n"
            "  --offload WHAT     checkpoints, optimizer or both, comma-separated (--target\n"
            "                     cuda --precision bf16). checkpoints (stream or checkpoint):\n"
            "                     each layer's input lives in page-locked host memory between\n"
            "                     its forward and its backward, copied out and back on a\n"
            "                     second stream behind the compute. optimizer: sbp-train keeps\n"
            "                     the fp32 master weights, AdamW's moments and the gradients\n"
            "                     in host memory and updates them there; the step holds bf16\n"
            "                     weights and sends each gradient to the host after its last\n"
            "                     contribution. The plan and --report count device and host\n"
            "                     bytes apart\n"
            "  --host-budget B    the host memory the offloaded state may take (suffixes as\n"
            "                     --memory-budget); more is refused before any work\n"
            "  --strategy S       stream (default: StreamBP, each layer and the LM head run\n"
            "                     chunk by chunk over the sequence in the forward and the\n"
            "                     backward; exact gradients), store (keep every activation) or\n"
            "                     checkpoint (keep each layer's input, recompute the layer)\n"
            "  --chunk N          stream: tokens per chunk in the layers (default: automatic,\n"
            "                     1024, or with Mixture-of-Experts layers of E experts and\n"
            "                     top-k at least 128 E / k, so that each expert averages 128\n"
            "                     rows a chunk; at most T; need not divide the sequence length)\n"
            "  --logits-chunk N   stream: token rows per chunk of the LM head and loss\n"
            "                     (default: automatic)\n"
            "  --memory-budget B  the step's planned peak (parameters + gradients + workspace;\n"
            "                     optimizer state not included) must fit in B bytes (suffix\n"
            "                     K, M, G: powers of 1024); stream picks the largest chunks\n"
            "                     that fit, else the error says the smallest budget that would\n"
            "  --objective O      sft (default: mean cross-entropy of the logits over labels\n"
            "                     != -100; a graph that ends in a loss keeps it), graph-loss,\n"
            "                     dpo (rows i and B/2+i are a chosen/rejected pair; the step\n"
            "                     takes the reference logp of each row) or grpo (clipped policy\n"
            "                     ratio + KL per token; takes advantages, old and reference\n"
            "                     logp per token); codegen/sbp_step.h has the definitions\n"
            "  --beta F           dpo: beta (default 0.1); grpo: the KL coefficient (default\n"
            "                     0.04; 0: no KL term, no reference logp needed)\n"
            "  --epsilon F        grpo: the ratio is clipped to [1-F, 1+F] (default 0.2)\n"
            "  --grpo-norm N      grpo: sequence (default: mean over rows of each row's mean\n"
            "                     token loss) or token (sum over tokens / scored tokens)\n"
            "  --router-aux-coef F Mixture-of-Experts models: the load-balancing loss's\n"
            "                     coefficient (default: router_aux_loss_coef of the config\n"
            "                     sbp-export recorded, else 0; 0 turns the term off): the\n"
            "                     loss is transformers' cross-entropy + F x aux\n"
            "  --freeze REGEX     do not train parameters whose name matches (POSIX extended;\n"
            "                     may be repeated)\n"
            "  --lora RANK        LoRA: add PEFT's low-rank adapters (lora_A [RANK,in], lora_B\n"
            "                     [out,RANK]) to the projections --lora-targets names and\n"
            "                     train only them (the base model is frozen, as in PEFT)\n"
            "  --lora-alpha A     the adapters' scaling is A/RANK (default 8, PEFT's)\n"
            "  --lora-targets R   the weights to adapt, by PyTorch name (POSIX extended;\n"
            "                     default: attention q/k/v/o and MLP projections)\n"
            "  --lora-seed S      seed of lora_A's initial values (default 0; the step\n"
            "                     records rank, alpha and seed for sbp-train)\n"
            "  --dump-params      list the trainable parameters (shape, the ops that read\n"
            "                     them, frozen or not) after canonicalisation and --freeze:\n"
            "                     the exporter's graph signature says which initializers are\n"
            "                     weights; buffers, scalars and tables that never meet the\n"
            "                     tokens are constants\n"
            "  --report           print the memory plan: peak bytes and their breakdown, the\n"
            "                     largest buffers with their lifetimes, and the same figures\n"
            "                     for every strategy side by side\n"
            "  --ranks N          with --report: also the bytes one rank of mpirun -np N\n"
            "                     sbp-train holds (the step is one rank's: --batch rows)\n"
            "  --zero 0|1|2       with --ranks: AdamW's moments divided over the ranks (1, 2)\n"
            "  --memory-plot F    write an SVG plot of the workspace bytes live over the\n"
            "                     schedule, one line per strategy\n"
            "  --seq-parallel N   sequence parallelism: one rank's step of N that share\n"
            "                     every row (mpirun -np D*N sbp-train): --seq-len T is the\n"
            "                     whole row, each rank holds T/N consecutive tokens of it, and\n"
            "                     at each attention the ranks exchange heads (all-to-all) so\n"
            "                     that each runs its H/N heads over the whole sequence\n"
            "  --packed           packed documents: the step also takes one document id per\n"
            "                     token (ids non-decreasing along a row); a token attends only\n"
            "                     to earlier tokens of its own document (other documents' key\n"
            "                     tiles are skipped), and positions (RoPE, learned position\n"
            "                     tables) restart at 0 in each document\n"
            "  --doc-len L        with --packed: the summary (and --report) also gives each\n"
            "                     attention layer's work for rows of documents of L tokens\n"
            "                     (sbp-train --pack measures it on the data)\n"
            "  --per-document     with --packed and --objective dpo or grpo: the objective's\n"
            "                     unit is each document of a row (the runs of equal ids that\n"
            "                     hold a scored label), not the row: DPO pairs document k of\n"
            "                     row i with document k of row B/2 + i, GRPO takes one\n"
            "                     advantage per document; the per-row inputs and outputs\n"
            "                     become [B*T], document k of row b at b*T + k\n"
            "  --no-eval          no evaluation entry point (sbp_step_eval: the forward and\n"
            "                     the loss only, on a memory plan of its own, what sbp-train\n"
            "                     --eval-data runs); by default sft and graph-loss steps\n"
            "                     have one; dpo and grpo steps have sbp_step_logps instead\n"
            "                     (each row's and token's label log-probability, forward\n"
            "                     only, its own plan), which --no-eval leaves out too\n"
            "  -h, --help         this text\n"
            "  --version          print the version\n"
            "\n"
            "Options and the model may come in any order; --flag=value and --flag value are the\n"
            "same; a long option may be shortened to any unambiguous prefix (--seq for\n"
            "--seq-len); everything after -- is the model.\n"
            "\n"
            "passes (for --dump-ir=PASS: print the result of PASS and stop there):\n");
    for (int i = 0; i < sbp_n_flow_stages; i++)
        fprintf(f, "  %-12s %s\n", sbp_flow_stages[i].name, sbp_flow_stages[i].what);
    fprintf(f, "  %-12s %s\n", "program",
            "all of the training program at once: segments, loops, workspace, instructions");
}

/* Pairs (query, key) of a causal attention over L tokens, with a sliding window w (0: none). */
static double causal_pairs(int64_t L, int64_t w)
{
    return w > 0 && w < L ? (double)w * (double)L - (double)w * (double)(w - 1) / 2
                          : (double)L * (double)(L + 1) / 2;
}

/* One line per attention layer: its variant and the work of its score and value products in
 * the forward, per sequence: a causal layer reads T(T+1)/2 (query, key) pairs, a sliding window
 * of w keys about T*w, so local layers cost O(T*w), not O(T^2); the kernels skip the key tiles
 * outside (runtime/sbprt.h, sbprt_attention_forward_ex). doc_len > 0 (--doc-len L, with
 * --packed) adds the packed attention's pairs for rows of T tokens filled with documents of L
 * tokens (the last one shorter), each attending only within itself. */
static void attention_work(const ir_graph *g, int64_t doc_len)
{
    int layer = 0;
    for (int i = 0; i < g->n_nodes; i++) {
        const ir_node *n = g->nodes[i];
        if (n->dead || n->op != IR_OP_ATTENTION || n->in[0]->rank != 4)
            continue;
        const int64_t hq = n->in[0]->dims[1].value, T = n->in[0]->dims[2].value,
                      hd = n->in[0]->dims[3].value, w = ir_attr_int(n, "window", 0);
        double pairs = causal_pairs(T, w);
        double flop = 4.0 * pairs * (double)hq * (double)hd; /* q.k and p.v, 2 flop per MAC */
        char packed[160] = "";
        if (doc_len > 0) {
            int64_t L = doc_len < T ? doc_len : T;
            double pp = (double)(T / L) * causal_pairs(L, w) + causal_pairs(T % L, w);
            snprintf(packed, sizeof packed,
                     "; packed with documents of %lld tokens: %.4g GFLOP, %.1f%% of that",
                     (long long)L, 4.0 * pp * (double)hq * (double)hd / 1e9, 100.0 * pp / pairs);
        }
        char var[96] = "";
        if (w > 0)
            snprintf(var, sizeof var, "sliding window %lld, O(T*w)", (long long)w);
        else
            snprintf(var, sizeof var, "causal, O(T^2)");
        char cap[48] = "";
        if (ir_attr_float(n, "softcap", 0.0) > 0)
            snprintf(cap, sizeof cap, ", softcap %.6g", ir_attr_float(n, "softcap", 0.0));
        printf("  attention %d (node '%s'): %s, scale %.6g%s, %lld/%lld heads: %.4g GFLOP per "
               "sequence (forward scores and values)%s\n",
               layer++, n->name, var, ir_attr_float(n, "scale", 1.0), cap, (long long)hq,
               (long long)ir_attr_int(n, "kv_heads", hq), flop / 1e9, packed);
    }
}

/* --dump-params: every trainable parameter with its shape and the ops that read it; frozen
 * ones (--freeze) are marked. */
static void dump_params(const ir_graph *g)
{
    ir_uses u = ir_uses_build(g);
    int n = 0;
    for (int i = 0; i < g->n_values; i++) {
        const ir_value *v = g->values[i];
        if (v->kind != IR_VAL_PARAM || (u.n_uses && u.n_uses[v->id] == 0 && !v->tied_to))
            continue;
        char ty[128];
        printf("%s %s%s", v->name, ir_value_type_str(v, ty, sizeof ty), v->frozen ? " frozen" : "");
        if (v->tied_to)
            printf(" tied to the transpose of %s", v->tied_to->name);
        for (int k = 0; u.n_uses && k < u.n_uses[v->id]; k++) {
            const ir_node *c = u.uses[v->id][k].node;
            printf("%s %s('%s')", k ? "," : " used by", ir_op_name(c->op), c->name);
        }
        putchar('\n');
        n++;
    }
    printf("%d parameter tensors\n", n);
}

/* The summary without a dump or -o: the graph's size and each attention layer's work
 * (attention_work, with doc_len). */
static void summary(const ir_graph *g, int64_t doc_len)
{
    int64_t params = 0;
    int nparams = 0;
    for (int i = 0; i < g->n_values; i++) {
        const ir_value *v = g->values[i];
        if (v->kind == IR_VAL_PARAM && !v->tied_to && ir_value_use_count(g, v) > 0) {
            nparams++;
            params += ir_value_numel(v);
        }
    }
    printf("%s: %d nodes, %d parameter tensors (%lld elements), %d attention layers\n", g->path,
           g->n_nodes, nparams, (long long)params, ir_graph_count_op(g, IR_OP_ATTENTION));
    attention_work(g, doc_len);
}

/* --base-precision bf16: what the program keeps as bf16 only (passes/train/precision.c) and what
 * that saves against the fp32 master weight plus its bf16 copy. */
static void base_bf16_summary(const sbp_train_program *p)
{
    int n = 0, frozen = 0, tables = 0;
    size_t elems = 0;
    bool *table = calloc((size_t)p->n_bufs + 1, sizeof *table);
    for (int bi = 0; table && bi < p->n_blocks; bi++) /* the embedding lookups' tables */
        for (int i = 0; i < p->blocks[bi]->n_insts; i++) {
            const tp_inst *in = &p->blocks[bi]->insts[i];
            if (in->k == TP_K_EMBEDDING_FWD && in->buf[1] >= 0)
                table[in->buf[1]] = true;
        }
    for (int i = 0; i < p->n_params; i++) {
        const tp_param *q = &p->params[i];
        frozen += q->tied_to < 0 && q->value->frozen;
        if (q->stored_bf16) {
            n++;
            elems += q->numel;
            tables += table && q->buf >= 0 && table[q->buf];
        }
    }
    free(table);
    printf("  base precision bf16: %d of %d frozen weights (%zu elements) kept as bf16 only "
           "(%d embedding table%s among them): %zu bytes instead of %zu (fp32 and its bf16 "
           "copy); the others are read as fp32 (norms, biases)\n",
           n, frozen, elems, tables, tables == 1 ? "" : "s", elems * 2, elems * 6);
}

/* --lora: what was adapted, and what is left to train (the adapters; the base is frozen). */
static void lora_summary(const ir_graph *g, const sbp_lora_options *lora, int n_adapted)
{
    int64_t trained = 0, total = 0;
    int n_tensors = 0;
    for (int i = 0; i < g->n_values; i++) {
        const ir_value *v = g->values[i];
        if (v->kind != IR_VAL_PARAM || v->tied_to || ir_value_use_count(g, v) == 0)
            continue;
        total += ir_value_numel(v);
        if (!v->frozen) {
            trained += ir_value_numel(v);
            n_tensors++;
        }
    }
    printf("  LoRA: %d weights adapted (rank %lld, alpha %g, scaling %g): %d adapter tensors, "
           "%lld of %lld parameter elements trained (%.2f%%); the base model is frozen\n",
           n_adapted, (long long)lora->rank, lora->alpha, lora->alpha / (double)lora->rank,
           n_tensors, (long long)trained, (long long)total,
           total ? 100.0 * (double)trained / (double)total : 0.0);
}

#define MAX_FREEZE 32
/* The largest --batch, --seq-len and chunk: no transformer batch or sequence is larger, and it
 * keeps every later product of dims in range. */
#define SBPC_MAX_DIM ((int64_t)1 << 30)

/* Before any work: no output (-o's files, --memory-plot) may replace a file this run reads (the
 * model and its external data, in `inputs` once imported), an existing FIFO, directory or other
 * special file (a character device such as /dev/null is written in place), or another output. */
static int check_outputs(const char *out, bool keep_c, const char *plot,
                         const sbp_file_set *inputs, ir_diag *diag)
{
    sbp_file_set outs = {0};
    char err[1024];
    int rc = IR_OK;
    if (out)
        rc = sbp_codegen_check_outputs(out, keep_c, inputs, &outs, diag);
    if (rc == IR_OK && plot &&
        sbp_file_check_output(plot, "--memory-plot", inputs, &outs, err, sizeof err) !=
            SBP_FILE_OK)
        rc = ir_diag_error(diag, "%s", err);
    sbp_file_set_free(&outs);
    return rc;
}

/* --report / --memory-plot: the program of every strategy, planned (passes/train/plan.c), printed
 * or drawn side by side. `have` is the program already built for topt->strategy; the others are
 * built from the same canonical graph with the same options (no memory budget): building a
 * program does not change the graph (stream's budget search builds many from one), so the model
 * is imported and canonicalised once, not once per strategy (at T = 131072 the constant tables
 * alone take seconds). Each strategy's diagnostics go to its own list: a strategy that cannot
 * be built is a row of the report saying why, not an error of the compilation. */
static int memory_report(ir_graph *g, sbp_objective chosen, const sbp_train_options *topt,
                         sbp_train_program *have, bool report, const char *plot, ir_diag *diag)
{
    static const sbp_strategy strategies[] = {SBP_STRATEGY_STORE, SBP_STRATEGY_CHECKPOINT,
                                              SBP_STRATEGY_STREAM};
    enum { NS = sizeof strategies / sizeof strategies[0] };
    sbp_report_entry e[NS];
    ir_diag diags[NS];
    int main_index = -1, rc = 0;
    ir_diag *const saved = g->diag;
    for (int k = 0; k < NS; k++) {
        e[k] = (sbp_report_entry){sbp_strategy_name(strategies[k]), NULL, NULL};
        ir_diag_init(&diags[k], g->path);
        if (strategies[k] == topt->strategy) {
            e[k].p = have;
            main_index = k;
            continue;
        }
        sbp_train_options o = *topt;
        o.strategy = strategies[k];
        o.memory_budget = 0; /* show what the other strategies need, fitting or not */
        g->diag = &diags[k];
        e[k].p = sbp_train_build(g, chosen, &o);
        g->diag = saved;
        for (int i = 0; !e[k].p && i < diags[k].n && !e[k].why; i++)
            if (diags[k].entries[i].sev == IR_SEV_ERROR)
                e[k].why = diags[k].entries[i].msg;
    }
    if (report && sbp_report_write(stdout, e, NS, main_index, diag) != IR_OK)
        rc = 1;
    if (plot) {
        /* atomic: a failed plot leaves the previous one; /dev/null is written in place */
        sbp_atomic a;
        char err[1024];
        if (sbp_atomic_begin(&a, plot, err, sizeof err) != SBP_FILE_OK) {
            ir_diag_error(diag, "cannot write the memory plot: %s", err);
            rc = 1;
        } else if (sbp_report_plot_svg(a.f, e, NS, diag) != IR_OK) {
            sbp_atomic_abort(&a);
            rc = 1;
        } else if (sbp_atomic_commit(&a, err, sizeof err) != SBP_FILE_OK) {
            ir_diag_error(diag, "writing the memory plot failed: %s", err);
            rc = 1;
        }
    }
    for (int k = 0; k < NS; k++)
        ir_diag_free(&diags[k]);
    return rc;
}

/* Where the step runs and how it stores activations: --target and --precision, carried as one
 * value because they constrain each other (bf16 is a CUDA mode), the objective (DPO and GRPO
 * have no bf16 form) and the build (a cuda .so needs the CUDA backend built with this sbpc).
 * Parsed by target_parse, checked once by target_check. */
typedef struct sbpc_target {
    const char *backend; /* "cpu" (default) or "cuda": codegen.h's target names */
    bool bf16;           /* --precision bf16 (passes/train/train.h, "Precision"); else fp32 */
    bool base_bf16;      /* --base-precision bf16: frozen GEMM weights and embedding tables
                          * kept as bf16 only */
    bool tf32;           /* --tf32: the step's GEMMs in TF32 (sbprt_ctx_set_tf32) */
} sbpc_target;

enum { OPT_BATCH = 256, OPT_SEQ_LEN, OPT_NO_RETIE, OPT_DUMP_IR, OPT_DUMP_PARAMS, OPT_STRATEGY,
       OPT_TARGET, OPT_PRECISION, OPT_CHUNK, OPT_LOGITS_CHUNK, OPT_MEMORY_BUDGET, OPT_OBJECTIVE,
       OPT_BETA, OPT_EPSILON, OPT_GRPO_NORM, OPT_FREEZE, OPT_REPORT, OPT_MEMORY_PLOT,
       OPT_VERSION, OPT_NO_EVAL, OPT_PACKED, OPT_DOC_LEN, OPT_LORA, OPT_LORA_ALPHA,
       OPT_LORA_TARGETS, OPT_LORA_SEED, OPT_RANKS, OPT_ZERO, OPT_BASE_PRECISION, OPT_OFFLOAD,
       OPT_HOST_BUDGET, OPT_SEQ_PARALLEL, OPT_PER_DOCUMENT, OPT_KEEP_C, OPT_TF32,
       OPT_ROUTER_AUX_COEF };

/* --target T or --precision P into t; 0, or -1 after a message. */
static int target_parse(cli *c, int opt, const char *v, sbpc_target *t)
{
    static const char *const backends[] = {"cpu", "cuda", NULL};
    static const char *const precisions[] = {"fp32", "bf16", NULL};
    int k;
    if (opt == OPT_TF32) {
        t->tf32 = true;
    } else if (opt == OPT_TARGET) {
        if (cli_choice(c, "--target", v, backends, &k))
            return -1;
        t->backend = backends[k];
    } else if (opt == OPT_BASE_PRECISION) {
        if (cli_choice(c, "--base-precision", v, precisions, &k))
            return -1;
        t->base_bf16 = k == 1;
    } else {
        if (cli_choice(c, "--precision", v, precisions, &k))
            return -1;
        t->bf16 = k == 1;
    }
    return 0;
}

/* Every rule on the target and precision, once the whole command line is read: bf16 needs the
 * cuda target and an objective with a bf16 form (not dpo or grpo), and a .so for a backend
 * needs that backend built into this sbpc (sbp_codegen_target_available). 0, or -1 after a
 * message. */
static int target_check(cli *c, const sbpc_target *t, sbp_objective objective, const char *out)
{
    if (t->bf16 && strcmp(t->backend, "cuda") != 0)
        return cli_error(c, "--precision bf16 needs --target cuda");
    if (t->base_bf16 && !t->bf16)
        return cli_error(c, "--base-precision bf16 needs --precision bf16 (and --target cuda): "
                         "the GEMMs of an fp32 step read fp32 weights");
    if (t->tf32 && strcmp(t->backend, "cuda") != 0)
        return cli_error(c, "--tf32 needs --target cuda (the CPU's GEMMs are fp32 only)");
    if (t->tf32 && t->bf16)
        return cli_error(c, "--tf32 with --precision bf16: a bf16 step's GEMMs read bf16, and "
                         "TF32 applies to fp32 products only");
    if (t->bf16 && (objective == SBP_OBJECTIVE_DPO || objective == SBP_OBJECTIVE_GRPO))
        return cli_error(c, "--precision bf16: the %s objective is fp32 only",
                         sbp_objective_name(objective));
    size_t out_len = out ? strlen(out) : 0;
    if (out_len > 3 && strcmp(out + out_len - 3, ".so") == 0 &&
        !sbp_codegen_target_available(t->backend))
        return cli_error(c, "--target %s: this sbpc was configured without a CUDA compiler "
                         "(nvcc), so it cannot build a cuda .so; -o %.*s.c writes the C",
                         t->backend, (int)(out_len - 3), out);
    return 0;
}

/* The command line, as read by parse_command_line and completed by check_options (the
 * objective's defaults, the target's precision in `train`); then what to run, from
 * choose_first_stop. One value, passed to each step of main. */
typedef struct sbpc_options {
    const char *model;            /* the positional argument */
    const char *out;              /* -o FILE (NULL: none) */
    bool keep_c;                  /* --keep-c: -o FILE.so keeps FILE.c and FILE.h too */
    const char *plot;             /* --memory-plot FILE (NULL: none) */
    bool dump;                    /* --dump-ir[=PASS] */
    const char *dump_pass;        /* its PASS (NULL: --dump-ir alone, the last pass) */
    bool want_params;             /* --dump-params */
    bool report;                  /* --report */
    bool no_eval;                 /* --no-eval */
    const char *freeze[MAX_FREEZE]; /* [n_freeze] --freeze REGEX... */
    int n_freeze;
    sbp_pass_options pass;        /* --batch, --seq-len, --no-retie; SBPC_MAX_COMPILE_BYTES */
    sbp_train_options train;      /* --strategy, --chunk, --logits-chunk, --memory-budget,
                                   * --beta, --epsilon (-1: unset), --grpo-norm, --packed,
                                   * --per-document */
    sbp_objective objective;      /* --objective */
    const char *beta_given;       /* "--beta" when given: DPO and GRPO only */
    const char *grpo_given;       /* "--epsilon" / "--grpo-norm" when given: GRPO only */
    bool aux_coef_given;          /* --router-aux-coef (else the config's, aux_coef_default) */
    sbpc_target tgt;              /* --target, --precision, --base-precision */
    sbp_lora_options lora;        /* --lora RANK, --lora-alpha, --lora-targets, --lora-seed */
    const char *lora_given;       /* a --lora-* flag seen: it needs --lora RANK */
    int64_t ranks, zero;          /* --ranks, --zero (0 / -1: not given) */
    int64_t doc_len;              /* --doc-len L (0: not given): the summary's packed work */
    /* what to run (choose_first_stop) */
    bool compile;                 /* -o, --report or --memory-plot: the flow runs to the plan */
    const char *first_stop;       /* the stage the first run of the flow stops after */
    int stop_index;               /* its index in sbp_flow_stages (-1: no such stage) */
} sbpc_options;

enum { NOT_MINE = 1 }; /* an option parser's answer for an option of another kind */

/* --offload WHAT: a comma-separated list of what lives in host memory: checkpoints (the layer
 * checkpoints between forward and backward), optimizer (the fp32 masters and AdamW's moments:
 * the trainer's, the step keeps bf16 weights). */
static int offload_parse(cli *c, const char *v, sbp_train_options *t)
{
    const char *p = v;
    while (*p) {
        size_t n = strcspn(p, ",");
        if (n == strlen("checkpoints") && strncmp(p, "checkpoints", n) == 0)
            t->offload_checkpoints = true;
        else if (n == strlen("optimizer") && strncmp(p, "optimizer", n) == 0)
            t->offload_optimizer = true;
        else
            return cli_error(c, "--offload: '%.*s' is not something to offload (checkpoints, "
                             "optimizer)", (int)n, p);
        p += n + (p[n] == ',');
    }
    if (!t->offload_checkpoints && !t->offload_optimizer)
        return cli_error(c, "--offload needs what to offload: checkpoints, optimizer or both");
    return 0;
}

/* A step option: the dims, the strategy and its chunks, the target, what is trained and how
 * the step is packed. 0, -1 after a message, or NOT_MINE. */
static int parse_step_option(cli *c, int o, const char *v, sbpc_options *s)
{
    static const char *const strategy_words[] = {"stream", "store", "checkpoint", NULL};
    static const sbp_strategy strategy_values[] = {SBP_STRATEGY_STREAM, SBP_STRATEGY_STORE,
                                                   SBP_STRATEGY_CHECKPOINT};
    int k = 0, bad = 0;
    switch (o) {
    case OPT_BATCH:
        return cli_count(c, "--batch", v, 1, SBPC_MAX_DIM, &s->pass.batch);
    case OPT_SEQ_LEN:
        return cli_count(c, "--seq-len", v, 1, SBPC_MAX_DIM, &s->pass.seq_len);
    case OPT_NO_RETIE:
        s->pass.no_retie = true;
        return 0;
    case OPT_STRATEGY:
        if (!(bad = cli_choice(c, "--strategy", v, strategy_words, &k)))
            s->train.strategy = strategy_values[k];
        return bad;
    case OPT_TARGET:
    case OPT_PRECISION:
    case OPT_BASE_PRECISION:
    case OPT_TF32:
        return target_parse(c, o, v, &s->tgt);
    case OPT_CHUNK:
        return cli_count(c, "--chunk", v, 1, SBPC_MAX_DIM, &s->train.chunk);
    case OPT_LOGITS_CHUNK:
        return cli_count(c, "--logits-chunk", v, 1, SBPC_MAX_DIM, &s->train.logits_chunk);
    case OPT_MEMORY_BUDGET:
        return cli_bytes(c, "--memory-budget", v, &s->train.memory_budget);
    case OPT_HOST_BUDGET:
        return cli_bytes(c, "--host-budget", v, &s->train.host_budget);
    case OPT_OFFLOAD:
        return offload_parse(c, v, &s->train);
    case OPT_FREEZE:
        if (!*v || s->n_freeze == MAX_FREEZE)
            return cli_error(c, "--freeze needs a regular expression (at most %d)", MAX_FREEZE);
        s->freeze[s->n_freeze++] = v;
        return 0;
    case OPT_SEQ_PARALLEL: { /* passes/train/train.h, "Sequence parallelism" */
        int64_t n = 0;
        int r = cli_count(c, "--seq-parallel", v, 1, 4096, &n);
        s->train.seq_parallel = (int)n;
        return r;
    }
    case OPT_PACKED: /* passes/train/train.h, "Packed documents" */
        s->train.packed = true;
        return 0;
    case OPT_DOC_LEN:
        return cli_count(c, "--doc-len", v, 1, SBPC_MAX_DIM, &s->doc_len);
    case OPT_PER_DOCUMENT: /* passes/train/train.h, "Packed documents" */
        s->train.per_document = true;
        return 0;
    case OPT_NO_EVAL:
        s->no_eval = true;
        return 0;
    }
    return NOT_MINE;
}

/* The objective and its hyper-parameters, and LoRA's: 0, -1 after a message, or NOT_MINE. */
static int parse_objective_option(cli *c, int o, const char *v, sbpc_options *s)
{
    static const char *const objective_words[] = {"sft", "graph-loss", "dpo", "grpo", NULL};
    static const sbp_objective objective_values[] = {SBP_OBJECTIVE_SFT, SBP_OBJECTIVE_GRAPH_LOSS,
                                                     SBP_OBJECTIVE_DPO, SBP_OBJECTIVE_GRPO};
    static const char *const grpo_norm_words[] = {"sequence", "token", NULL};
    static const sbp_grpo_norm grpo_norm_values[] = {SBP_GRPO_NORM_SEQUENCE,
                                                     SBP_GRPO_NORM_TOKEN};
    int k = 0, bad = 0;
    int64_t seed = 0;
    switch (o) {
    case OPT_OBJECTIVE:
        if (!(bad = cli_choice(c, "--objective", v, objective_words, &k)))
            s->objective = objective_values[k];
        return bad;
    case OPT_BETA:
        s->beta_given = "--beta";
        return cli_real(c, "--beta", v, &s->train.beta);
    case OPT_ROUTER_AUX_COEF:
        s->aux_coef_given = true;
        return cli_real(c, "--router-aux-coef", v, &s->train.moe_aux_coef);
    case OPT_EPSILON:
        s->grpo_given = "--epsilon";
        return cli_real(c, "--epsilon", v, &s->train.epsilon);
    case OPT_GRPO_NORM:
        s->grpo_given = "--grpo-norm";
        if (!(bad = cli_choice(c, "--grpo-norm", v, grpo_norm_words, &k)))
            s->train.grpo_norm = grpo_norm_values[k];
        return bad;
    case OPT_LORA:
        return cli_count(c, "--lora", v, 1, SBPC_MAX_DIM, &s->lora.rank);
    case OPT_LORA_ALPHA:
        s->lora_given = "--lora-alpha";
        if ((bad = cli_real(c, "--lora-alpha", v, &s->lora.alpha)))
            return bad;
        if (!(s->lora.alpha > 0 && s->lora.alpha < 1e30))
            return cli_error(c, "--lora-alpha must be a positive number, not '%s'", v);
        return 0;
    case OPT_LORA_TARGETS:
        s->lora_given = "--lora-targets";
        s->lora.targets = v;
        return *v ? 0 : cli_error(c, "--lora-targets needs a regular expression");
    case OPT_LORA_SEED:
        s->lora_given = "--lora-seed";
        if ((bad = cli_count(c, "--lora-seed", v, 0, INT64_MAX, &seed)))
            return bad;
        s->lora.seed = (uint64_t)seed;
        return 0;
    }
    return NOT_MINE;
}

/* What to print or write, and the model: 0, -1 after a message, or NOT_MINE. */
static int parse_output_option(cli *c, int o, const char *v, sbpc_options *s)
{
    switch (o) {
    case 'o':
        return cli_path(c, "-o", v, &s->out);
    case OPT_KEEP_C:
        s->keep_c = true;
        return 0;
    case OPT_DUMP_IR:
        s->dump = true;
        s->dump_pass = v; /* NULL: --dump-ir alone, the last pass */
        return 0;
    case OPT_DUMP_PARAMS:
        s->want_params = true;
        return 0;
    case OPT_REPORT:
        s->report = true;
        return 0;
    case OPT_RANKS:
        return cli_count(c, "--ranks", v, 1, 1 << 20, &s->ranks);
    case OPT_ZERO:
        return cli_count(c, "--zero", v, 0, 2, &s->zero);
    case OPT_MEMORY_PLOT:
        return cli_path(c, "--memory-plot", v, &s->plot);
    case CLI_POSITIONAL:
        if (s->model)
            return cli_error(c, "more than one model given ('%s' and '%s')", s->model, v);
        s->model = v;
        return 0;
    }
    return NOT_MINE;
}

enum { PARSE_RUN, PARSE_EXIT, PARSE_ERROR }; /* go on; exit 0 (--help, --version); exit 1 */

/* argv into s, an option at a time, in command-line order: the first bad one stops the parse
 * (its message printed), as do --help and --version. */
static int parse_command_line(cli *c, int argc, char **argv, sbpc_options *s)
{
    static const struct option options[] = {
        {"batch", required_argument, NULL, OPT_BATCH},
        {"seq-len", required_argument, NULL, OPT_SEQ_LEN},
        {"no-retie", no_argument, NULL, OPT_NO_RETIE},
        {"dump-ir", optional_argument, NULL, OPT_DUMP_IR},
        {"dump-params", no_argument, NULL, OPT_DUMP_PARAMS},
        {"output", required_argument, NULL, 'o'},
        {"strategy", required_argument, NULL, OPT_STRATEGY},
        {"target", required_argument, NULL, OPT_TARGET},
        {"precision", required_argument, NULL, OPT_PRECISION},
        {"base-precision", required_argument, NULL, OPT_BASE_PRECISION},
        {"chunk", required_argument, NULL, OPT_CHUNK},
        {"logits-chunk", required_argument, NULL, OPT_LOGITS_CHUNK},
        {"memory-budget", required_argument, NULL, OPT_MEMORY_BUDGET},
        {"offload", required_argument, NULL, OPT_OFFLOAD},
        {"host-budget", required_argument, NULL, OPT_HOST_BUDGET},
        {"objective", required_argument, NULL, OPT_OBJECTIVE},
        {"beta", required_argument, NULL, OPT_BETA},
        {"epsilon", required_argument, NULL, OPT_EPSILON},
        {"grpo-norm", required_argument, NULL, OPT_GRPO_NORM},
        {"freeze", required_argument, NULL, OPT_FREEZE},
        {"report", no_argument, NULL, OPT_REPORT},
        {"memory-plot", required_argument, NULL, OPT_MEMORY_PLOT},
        {"no-eval", no_argument, NULL, OPT_NO_EVAL},
        {"packed", no_argument, NULL, OPT_PACKED},
        {"seq-parallel", required_argument, NULL, OPT_SEQ_PARALLEL},
        {"doc-len", required_argument, NULL, OPT_DOC_LEN},
        {"per-document", no_argument, NULL, OPT_PER_DOCUMENT},
        {"keep-c", no_argument, NULL, OPT_KEEP_C},
        {"tf32", no_argument, NULL, OPT_TF32},
        {"router-aux-coef", required_argument, NULL, OPT_ROUTER_AUX_COEF},
        {"help", no_argument, NULL, 'h'},
        {"version", no_argument, NULL, OPT_VERSION},
        {"lora", required_argument, NULL, OPT_LORA},
        {"lora-alpha", required_argument, NULL, OPT_LORA_ALPHA},
        {"lora-targets", required_argument, NULL, OPT_LORA_TARGETS},
        {"lora-seed", required_argument, NULL, OPT_LORA_SEED},
        {"ranks", required_argument, NULL, OPT_RANKS},
        {"zero", required_argument, NULL, OPT_ZERO},
        {0},
    };
    *s = (sbpc_options){.pass = {.verify = true},
                        .train = {.strategy = SBP_STRATEGY_STREAM, .epsilon = -1},
                        .objective = SBP_OBJECTIVE_SFT,
                        .tgt = {.backend = "cpu"},
                        .lora = {.alpha = SBP_LORA_DEFAULT_ALPHA},
                        .zero = -1};
    /* The memory this compilation may use (passes.h: sbp_compile_mem_limit): this machine's,
     * or less with SBPC_MAX_COMPILE_BYTES (the tests use it to be machine-independent). */
    const char *max_compile = getenv("SBPC_MAX_COMPILE_BYTES");
    if (max_compile && *max_compile)
        s->pass.compile_mem_limit = strtoll(max_compile, NULL, 10);
    cli_init(c, prog, options, argc, argv);
    for (int o; (o = cli_next(c)) != CLI_END;) {
        if (o == CLI_ERROR)
            return PARSE_ERROR;
        if (o == 'h') {
            usage(stdout);
            return PARSE_EXIT;
        }
        if (o == OPT_VERSION) {
            printf("sbpc %s\n", SBP_VERSION);
            return PARSE_EXIT;
        }
        int r = parse_step_option(c, o, c->arg, s);
        if (r == NOT_MINE)
            r = parse_objective_option(c, o, c->arg, s);
        if (r == NOT_MINE)
            r = parse_output_option(c, o, c->arg, s);
        if (r != 0 && r != NOT_MINE)
            return PARSE_ERROR;
    }
    return PARSE_RUN;
}

/* The rules between options, once the whole command line is read, and the defaults that
 * depend on other options (the objective's hyper-parameters, the evaluation program). 0, or
 * -1 after a message (cli_error: each is short, so none is cut at cli's 512 bytes). */
static int check_options(cli *c, sbpc_options *s)
{
    sbp_train_options *t = &s->train;
    /* DPO / GRPO hyper-parameters: the defaults, and no flag for another objective */
    bool pref = s->objective == SBP_OBJECTIVE_DPO || s->objective == SBP_OBJECTIVE_GRPO;
    bool not_grpo = s->grpo_given && s->objective != SBP_OBJECTIVE_GRPO;
    if ((s->beta_given && !pref) || not_grpo)
        return cli_error(c, "%s applies to --objective %s, not %s",
                         not_grpo ? s->grpo_given : s->beta_given,
                         not_grpo ? "grpo" : "dpo or grpo", sbp_objective_name(s->objective));
    if (!s->beta_given)
        t->beta = sbp_objective_default_beta(s->objective);
    if (t->epsilon < 0)
        t->epsilon = s->objective == SBP_OBJECTIVE_GRPO ? SBP_GRPO_DEFAULT_EPSILON : 0;
    if (s->lora_given && s->lora.rank == 0)
        return cli_error(c, "%s needs --lora RANK", s->lora_given);
    if (!s->model) {
        cli_error(c, "no model given");
        usage(stderr);
        return -1;
    }
    if (t->seq_parallel >= 1 && s->pass.seq_len > 0 && s->pass.seq_len % t->seq_parallel) {
        int64_t n = t->seq_parallel, lo = s->pass.seq_len / n * n;
        return cli_error(c, "--seq-parallel %lld needs a sequence length that %lld ranks share "
                         "equally: %lld is not a multiple of %lld (the nearest are --seq-len "
                         "%lld and %lld)", (long long)n, (long long)n,
                         (long long)s->pass.seq_len, (long long)n,
                         (long long)(lo > 0 ? lo : n), (long long)(lo > 0 ? lo + n : 2 * n));
    }
    if (s->doc_len > 0 && !t->packed)
        return cli_error(c, "--doc-len applies to --packed steps");
    if (t->per_document && (!t->packed || !pref))
        return cli_error(c, "--per-document applies to --packed steps of --objective dpo or "
                         "grpo, not %s%s", t->packed ? "" : "unpacked ",
                         sbp_objective_name(s->objective));
    if (target_check(c, &s->tgt, s->objective, s->out))
        return -1;
    if (t->offload_checkpoints && (strcmp(s->tgt.backend, "cuda") != 0 || !s->tgt.bf16))
        return cli_error(c, "--offload checkpoints needs --target cuda --precision bf16: a cpu "
                         "step's memory is host memory already, and the transfers are planned "
                         "for bf16 checkpoints (an fp32 step would move twice the bytes over "
                         "the bus behind the same compute)");
    if (t->offload_optimizer && (strcmp(s->tgt.backend, "cuda") != 0 || !s->tgt.bf16))
        return cli_error(c, "--offload optimizer needs --target cuda --precision bf16: a cpu "
                         "step's optimizer state is host memory already, and an fp32 step's "
                         "GEMMs read fp32 weights, so the device would keep them all");
    if (t->offload_checkpoints && t->strategy == SBP_STRATEGY_STORE)
        return cli_error(c, "--offload checkpoints: --strategy store keeps every activation and "
                         "has no layer checkpoints (use stream or checkpoint)");
    if (t->host_budget && !t->offload_checkpoints && !t->offload_optimizer)
        return cli_error(c, "--host-budget applies to --offload");
    char derr[256]; /* --ranks / --zero describe --report's per-rank figures */
    if (sbpc_dist_check(s->ranks, s->zero, s->report, derr, sizeof derr))
        return cli_error(c, "%s", derr);
    t->bf16 = s->tgt.bf16;
    t->base_bf16 = s->tgt.base_bf16;
    /* the evaluation program: written with the step (-o) and shown by --report */
    t->eval = !s->no_eval && (s->out || s->report);
    return 0;
}

/* What to run: the flow (passes/flow.h) up to the stage a dump names, then, for -o, --report
 * or --memory-plot, on through the memory plan. A dump past the canonical graph (the
 * objective and later, or the whole program) prints and exits; a canonical dump other than
 * the last ("cleanup") stops before the training program those flags need. 0, or -1 after a
 * message (printed whole, not through cli_error: it quotes PASS, of any length). */
static int choose_first_stop(sbpc_options *s)
{
    const char *const out = s->out, *const plot = s->plot;
    const bool report = s->report;
    s->compile = out || report || plot;
    s->first_stop = "cleanup";
    if (s->want_params)
        s->first_stop = "freeze";
    else if (s->dump_pass)
        s->first_stop = strcmp(s->dump_pass, "program") == 0 ? "plan" : s->dump_pass;
    else if (s->lora.rank > 0)
        s->first_stop = "lora"; /* the summary (or --dump-ir) is of the adapted graph */
    s->stop_index = sbp_flow_find(s->first_stop);
    const int cleanup = sbp_flow_find("cleanup");
    if (s->dump_pass && s->compile && s->stop_index != cleanup) {
        fprintf(stderr, "%s: error: --dump-ir=%s prints and exits: not with %s%s%s (%s)\n",
                prog, s->dump_pass, out ? "-o" : report ? "--report" : "--memory-plot",
                out && (report || plot) ? ", " : "",
                out && report ? "--report" : out && plot ? "--memory-plot" : "",
                s->stop_index > cleanup || s->stop_index < 0
                    ? "it stops at the training program's listing"
                    : "it stops before canonicalisation ends, and they need the whole pipeline");
        return -1;
    }
    if (s->want_params && (s->dump || s->compile)) {
        fprintf(stderr, "%s: error: --dump-params prints the parameters and exits: not with %s\n",
                prog, s->dump ? "--dump-ir" : out ? "-o" : report ? "--report" : "--memory-plot");
        return -1;
    }
    return 0;
}

/* What the first stop prints: the parameters, a dump, or the summary (not with -o); and
 * --lora's line on the adapters. */
static void print_first_stop(const sbpc_options *s, const sbp_flow *flow)
{
    if (s->want_params)
        dump_params(flow->g);
    else if (s->dump_pass && strcmp(s->dump_pass, "program") == 0)
        sbp_train_print(flow->program, stdout);
    else if (s->dump_pass)
        sbp_flow_stages[s->stop_index].dump(flow, stdout);
    else if (s->dump)
        ir_print(flow->g, stdout);
    else if (!s->out)
        summary(flow->g, s->doc_len);
    if (s->lora.rank > 0 && !s->want_params && !s->dump)
        lora_summary(flow->g, &s->lora, flow->n_adapted);
}

/* After -o: one line on stderr naming what was written and the workspace it plans (the step's
 * activations, gradients' scratch and chunk buffers; the parameters, gradients and optimizer
 * state are the trainer's and come on top: --report has them all), so that a quiet compile is
 * not mistaken for one that did nothing. */
static void wrote_summary(const char *out, bool keep_c, const sbp_train_program *p)
{
    size_t n = strlen(out);
    bool so = n > 3 && strcmp(out + n - 3, ".so") == 0;
    int stem = (int)(n - (so ? 3 : 2));
    fprintf(stderr, "%s: wrote %s", prog, out);
    if (!so || keep_c)
        fprintf(stderr, "%s%.*s.h", so ? ", " : " and ", stem, out);
    if (so && keep_c)
        fprintf(stderr, ", %.*s.c", stem, out);
    fprintf(stderr, ": %s step, workspace %.1f MiB planned (sbpc --report: the whole plan)\n",
            sbp_strategy_name(p->strategy), (double)p->workspace_bytes / (1024.0 * 1024.0));
}

/* -o, --report, --memory-plot: the rest of the flow, through the memory plan; the step written
 * (C, or a .so, for the target: codegen/compile.c); then the reports: --base-precision's line,
 * the memory report or plot of every strategy, and with --ranks one rank's bytes under mpirun
 * (sbpc_dist.h). 0, or 1 with diagnostics in diag. */
static int compile_and_report(const sbpc_options *s, sbp_flow *flow, const sbp_flow_options *fo,
                              ir_diag *diag)
{
    if (sbp_flow_run(flow, fo, diag, NULL) != IR_OK)
        return 1;
    const sbp_codegen_options co = {.model_path = s->model, .target = s->tgt.backend,
                                    .keep_c = s->keep_c, .tf32 = s->tgt.tf32};
    if (s->out && sbp_codegen_write(flow->program, s->out, &co, NULL, diag) != IR_OK)
        return 1;
    if (s->out)
        wrote_summary(s->out, s->keep_c, flow->program);
    if (s->tgt.base_bf16)
        base_bf16_summary(flow->program);
    if ((s->report || s->plot) && memory_report(flow->g, flow->chosen, &s->train, flow->program,
                                                s->report, s->plot, diag) != 0)
        return 1;
    if (s->report && s->ranks > 0)
        sbpc_dist_report(stdout, flow->program, s->ranks, s->zero);
    if (s->report && s->train.seq_parallel >= 1)
        sbpc_sp_report(stdout, flow->program, s->ranks, s->zero);
    return 0;
}

/* Runs what s asks for: the import alone first, so that outputs that would replace an input
 * are refused before any work; the flow to its first stop and what that prints; then, for -o,
 * --report or --memory-plot, the rest. The diagnostics are printed after the first stop and
 * again after the rest (what code generation added). The exit status. */
/* A warning when --seq-len exceeds the positions the model was trained for: sbp-export records
 * config.json in the ONNX metadata ("sbp.config.json"), whose max_position_embeddings bounds
 * the positions; a model without that record is not checked. The step still compiles (RoPE
 * and learned tables past their end are the model's concern: docs/sbpc.md). */
static void warn_positions(const sbpc_options *s)
{
    sbpio_kv *kv = NULL;
    int n = 0;
    char why[600];
    if (s->pass.seq_len <= 0 ||
        sbpio_onnx_meta_read(s->model, &kv, &n, why, sizeof why) != SBPIO_OK)
        return; /* the import reports an unreadable file */
    const char *cfg = sbpio_onnx_meta_get(kv, n, "sbp.config.json");
    uint64_t max_pos = 0;
    if (cfg && sbpio_json_object_u64(cfg, strlen(cfg), "max_position_embeddings", &max_pos) &&
        max_pos > 0 && (uint64_t)s->pass.seq_len > max_pos)
        fprintf(stderr, "%s: warning: --seq-len %lld exceeds the model's %llu positions "
                "(max_position_embeddings)\n", prog, (long long)s->pass.seq_len,
                (unsigned long long)max_pos);
    sbpio_onnx_meta_free(kv, n);
}

static int run(const sbpc_options *s)
{
    ir_diag diag;
    ir_diag_init(&diag, s->model);
    sbp_file_set inputs = {0}; /* what the import read: no output may replace it */
    const ir_import_options iopt = {.files = &inputs};
    const sbp_flow_options fo = {.pass = s->pass, .objective = s->objective,
                                 .freeze = s->freeze, .n_freeze = s->n_freeze,
                                 .lora = s->lora, .train = s->train};
    sbp_flow flow = {.path = s->model, .import = &iopt};
    int rc = 0;
    if (sbp_flow_run(&flow, &fo, &diag, "import") != IR_OK ||
        check_outputs(s->out, s->keep_c, s->plot, &inputs, &diag) != IR_OK ||
        sbp_flow_run(&flow, &fo, &diag, s->first_stop) != IR_OK)
        rc = 1; /* the diagnostics say why */
    ir_diag_print(&diag, stderr, prog);
    if (rc == 0)
        warn_positions(s);
    const int printed = diag.n;
    if (rc == 0)
        print_first_stop(s, &flow);
    if (rc == 0 && s->compile && !s->want_params)
        rc = compile_and_report(s, &flow, &fo, &diag);
    ir_diag_print_from(&diag, printed, stderr, prog);
    ir_graph_free(flow.g);
    ir_diag_free(&diag);
    sbp_file_set_free(&inputs);
    return rc;
}

/* The load-balancing loss's coefficient of a Mixture-of-Experts model when --router-aux-coef
 * is not given: router_aux_loss_coef of the config.json sbp-export recorded ("sbp.config.json"
 * in the ONNX metadata), as transformers' loss uses it; 0 without one (a dense model never
 * reads it). */
static void aux_coef_default(sbpc_options *s)
{
    if (s->aux_coef_given || !s->model)
        return;
    sbpio_kv *kv = NULL;
    int n = 0;
    char why[600];
    if (sbpio_onnx_meta_read(s->model, &kv, &n, why, sizeof why) != SBPIO_OK)
        return; /* the import reports an unreadable file */
    const char *cfg = sbpio_onnx_meta_get(kv, n, "sbp.config.json");
    double coef = 0;
    if (cfg && sbpio_json_object_f64(cfg, strlen(cfg), "router_aux_loss_coef", &coef) &&
        coef >= 0)
        s->train.moe_aux_coef = coef;
    sbpio_onnx_meta_free(kv, n);
}

int main(int argc, char **argv)
{
    cli c;
    sbpc_options s;
    switch (parse_command_line(&c, argc, argv, &s)) {
    case PARSE_EXIT:
        return 0;
    case PARSE_ERROR:
        return 1;
    }
    if (check_options(&c, &s) != 0 || choose_first_stop(&s) != 0)
        return 1;
    aux_coef_default(&s);
    return run(&s);
}
