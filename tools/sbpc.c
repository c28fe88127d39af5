/* sbpc.c — the compiler driver.
 *
 *   sbpc MODEL.onnx [--batch N] [--seq-len N] [--no-retie] [--dump-ir[=PASS]] [--dump-params]
 *        [-o train_step.c|train_step.so] [--strategy stream|store|checkpoint] [--target cpu|cuda]
 *        [--precision fp32|bf16]
 *        [--chunk N] [--logits-chunk N] [--memory-budget BYTES]
 *        [--objective sft|graph-loss|dpo|grpo] [--beta F] [--epsilon F]
 *        [--grpo-norm sequence|token] [--freeze REGEX]... [--report] [--memory-plot FILE.svg]
 *
 * Reads the model, runs the canonicalisation pipeline (passes/pipeline.c) and prints the IR, the
 * parameters (--dump-params) or a summary (with each attention layer's variant and work);
 * --dump-ir=objective and =program go past canonicalisation (the graph with its loss, the
 * training program's listing); with -o it also builds the training program (passes/train.h: objective, freeze,
 * autodiff, strategy) and writes it as C (codegen/), compiled into a shared object for .so.
 * --report and --memory-plot build the program for every strategy (from the one canonical graph)
 * and print / draw their memory plans side by side (codegen/report.c).
 * This is the only place where diagnostics become exit codes: library code records them, the
 * driver prints them compiler-style and exits 1.
 */
#include "codegen.h"
#include "ir.h"
#include "passes.h"
#include "train.h"

#include <errno.h>
#include <math.h>
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
            "  --seq-len N        bind the symbolic sequence dim to N\n"
            "  --no-retie         keep a tied weight that the exporter duplicated as two\n"
            "                     separate parameters\n"
            "  --dump-ir[=PASS]   print the IR after PASS (default: the last pass)\n"
            "  -o FILE            write the training step: FILE.c (with FILE.h), or FILE.so\n"
            "                     (the C files next to it, compiled with $CC, else clang)\n"
            "  --target T         cpu (default: the CPU runtime, OpenBLAS) or cuda (the CUDA\n"
            "                     runtime, cuBLAS: every tensor of the step is device memory;\n"
            "                     the .so links the CUDA backend built with sbpc)\n"
            "  --precision P      fp32 (default) or bf16 (--target cuda only): activations and\n"
            "                     their gradients stored as bfloat16, computed in fp32; the\n"
            "                     parameters (fp32 master weights), their gradients, the\n"
            "                     optimizer state and the statistics stay fp32; the GEMMs read\n"
            "                     a bf16 copy of the weights and accumulate in fp32; the\n"
            "                     workspace is planned at 2 bytes per activation element\n"
            "  --strategy S       stream (default: StreamBP, each layer and the LM head run\n"
            "                     chunk by chunk over the sequence in the forward and the\n"
            "                     backward; exact gradients), store (keep every activation) or\n"
            "                     checkpoint (keep each layer's input, recompute the layer)\n"
            "  --chunk N          stream: tokens per chunk in the layers (default: automatic;\n"
            "                     need not divide the sequence length)\n"
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
            "  --freeze REGEX     do not train parameters whose name matches (POSIX extended;\n"
            "                     may be repeated)\n"
            "  --dump-params      list the trainable parameters (shape, the ops that read\n"
            "                     them, frozen or not) after canonicalisation and --freeze:\n"
            "                     the exporter's graph signature says which initializers are\n"
            "                     weights; buffers, scalars and tables that never meet the\n"
            "                     tokens are constants\n"
            "  --report           print the memory plan: peak bytes and their breakdown, the\n"
            "                     largest buffers with their lifetimes, and the same figures\n"
            "                     for every strategy side by side\n"
            "  --memory-plot F    write an SVG plot of the workspace bytes live over the\n"
            "                     schedule, one line per strategy\n"
            "  -h, --help         this text\n"
            "  --version          print the version\n"
            "\n"
            "passes (for --dump-ir=PASS):\n");
    for (int i = 0; i < sbp_n_passes; i++)
        fprintf(f, "  %-12s %s\n", sbp_pass_list[i].name, sbp_pass_list[i].what);
    fprintf(f, "  %-12s %s\n", "objective", "the graph with its loss (--objective) and --freeze");
    fprintf(f, "  %-12s %s\n", "program",
            "the training program (--strategy, --chunk, ...): segments, chunk loops, the "
            "planned workspace, the instructions");
}

/* A strict positive count: decimal digits only, no sign, no trailing junk, at most 2^30 (no
 * transformer batch or sequence is larger, and it keeps every later product in range). */
static int parse_count(const char *flag, const char *s, int64_t *out)
{
    if (!s || !*s) {
        fprintf(stderr, "%s: error: %s needs a value\n", prog, flag);
        return -1;
    }
    for (const char *p = s; *p; p++)
        if (*p < '0' || *p > '9') {
            fprintf(stderr, "%s: error: %s: '%s' is not a positive integer\n", prog, flag, s);
            return -1;
        }
    errno = 0;
    long long v = strtoll(s, NULL, 10);
    if (errno || v <= 0 || v > (1ll << 30)) {
        fprintf(stderr, "%s: error: %s: '%s' is out of range (1 to %lld)\n", prog, flag, s,
                1ll << 30);
        return -1;
    }
    *out = v;
    return 0;
}

/* A finite real number >= 0, the whole string. */
static int parse_real(const char *flag, const char *s, double *out)
{
    char *end = NULL;
    errno = 0;
    double v = s && *s && *s != ' ' ? strtod(s, &end) : 0;
    if (!end || end == s || *end || errno || !isfinite(v) || v < 0) {
        fprintf(stderr, "%s: error: %s: '%s' is not a finite number >= 0\n", prog, flag,
                s ? s : "");
        return -1;
    }
    *out = v;
    return 0;
}

/* A byte count: decimal digits with an optional K, M or G suffix (powers of 1024). */
static int parse_bytes(const char *flag, const char *s, size_t *out)
{
    char *end = NULL;
    errno = 0;
    unsigned long long v = s && *s >= '0' && *s <= '9' ? strtoull(s, &end, 10) : 0;
    int shift = !end ? -1 : !*end ? 0 : !end[1] && (*end == 'K' || *end == 'k') ? 10
                : !end[1] && *end == 'M' ? 20 : !end[1] && *end == 'G' ? 30 : -1;
    if (errno || shift < 0 || v == 0 || v > (SIZE_MAX >> shift)) {
        fprintf(stderr, "%s: error: %s: '%s' is not a byte count (e.g. 8G, 512M, 1048576)\n",
                prog, flag, s ? s : "");
        return -1;
    }
    *out = (size_t)v << shift;
    return 0;
}

/* "--flag=value" or "--flag value"; advances *i in the second form. */
static const char *flag_value(int argc, char **argv, int *i, const char *flag)
{
    size_t n = strlen(flag);
    if (strncmp(argv[*i], flag, n) == 0 && argv[*i][n] == '=')
        return argv[*i] + n + 1;
    if (strcmp(argv[*i], flag) == 0) {
        if (*i + 1 >= argc)
            return "";
        return argv[++*i];
    }
    return NULL;
}

/* One line per attention layer: its variant and the work of its score and value products in
 * the forward, per sequence: a causal layer reads T(T+1)/2 (query, key) pairs, a sliding window
 * of w keys about T*w, so local layers cost O(T*w), not O(T^2); the kernels skip the key tiles
 * outside (runtime/sbprt.h, sbprt_attention_forward_ex). */
static void attention_work(const ir_graph *g)
{
    int layer = 0;
    for (int i = 0; i < g->n_nodes; i++) {
        const ir_node *n = g->nodes[i];
        if (n->dead || n->op != IR_OP_ATTENTION || n->in[0]->rank != 4)
            continue;
        const int64_t hq = n->in[0]->dims[1].value, T = n->in[0]->dims[2].value,
                      hd = n->in[0]->dims[3].value, w = ir_attr_int(n, "window", 0);
        double pairs = w > 0 && w < T ? (double)w * (double)T - (double)w * (double)(w - 1) / 2
                                      : (double)T * (double)(T + 1) / 2;
        double flop = 4.0 * pairs * (double)hq * (double)hd; /* q.k and p.v, 2 flop per MAC */
        char var[96] = "";
        if (w > 0)
            snprintf(var, sizeof var, "sliding window %lld, O(T*w)", (long long)w);
        else
            snprintf(var, sizeof var, "causal, O(T^2)");
        char cap[48] = "";
        if (ir_attr_float(n, "softcap", 0.0) > 0)
            snprintf(cap, sizeof cap, ", softcap %.6g", ir_attr_float(n, "softcap", 0.0));
        printf("  attention %d (node '%s'): %s, scale %.6g%s, %lld/%lld heads: %.4g GFLOP per "
               "sequence (forward scores and values)\n",
               layer++, n->name, var, ir_attr_float(n, "scale", 1.0), cap, (long long)hq,
               (long long)ir_attr_int(n, "kv_heads", hq), flop / 1e9);
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

static void summary(const ir_graph *g)
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
    attention_work(g);
}

#define MAX_FREEZE 32

/* --freeze REGEX..., each in turn. */
static int apply_freeze(ir_graph *g, const char *const *freeze, int n_freeze)
{
    for (int k = 0; k < n_freeze; k++)
        if (sbp_freeze_params(g, freeze[k], NULL) != IR_OK)
            return IR_ERR;
    return IR_OK;
}

/* --report / --memory-plot: the program of every strategy, planned (passes/memplan.c), printed
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
        FILE *f = fopen(plot, "w");
        if (!f) {
            ir_diag_error(diag, "cannot write the memory plot '%s'", plot);
            rc = 1;
        } else {
            if (sbp_report_plot_svg(f, e, NS, diag) != IR_OK)
                rc = 1;
            if (fclose(f) != 0) {
                ir_diag_error(diag, "writing the memory plot '%s' failed", plot);
                rc = 1;
            }
        }
    }
    for (int k = 0; k < NS; k++)
        ir_diag_free(&diags[k]);
    return rc;
}

int main(int argc, char **argv)
{
    const char *model = NULL, *dump_pass = NULL, *out = NULL;
    const char *freeze[MAX_FREEZE];
    int n_freeze = 0;
    bool dump = false, report = false, want_params = false;
    const char *plot = NULL;
    sbp_pass_options opt = {.verify = true};
    sbp_train_options topt = {.strategy = SBP_STRATEGY_STREAM};
    sbp_objective objective = SBP_OBJECTIVE_SFT;
    const char *beta_given = NULL, *grpo_given = NULL; /* a DPO / GRPO flag seen */
    topt.epsilon = -1; /* unset */
    const char *target = "cpu";

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            usage(stdout);
            return 0;
        } else if (strcmp(a, "--version") == 0) {
            printf("sbpc %s\n", SBP_VERSION);
            return 0;
        } else if ((v = flag_value(argc, argv, &i, "--batch"))) {
            if (parse_count("--batch", v, &opt.batch))
                return 1;
        } else if ((v = flag_value(argc, argv, &i, "--seq-len"))) {
            if (parse_count("--seq-len", v, &opt.seq_len))
                return 1;
        } else if ((v = flag_value(argc, argv, &i, "-o")) ||
                   (v = flag_value(argc, argv, &i, "--output"))) {
            if (!*v) {
                fprintf(stderr, "%s: error: -o needs a file name\n", prog);
                return 1;
            }
            out = v;
        } else if ((v = flag_value(argc, argv, &i, "--strategy"))) {
            if (strcmp(v, "store") == 0) {
                topt.strategy = SBP_STRATEGY_STORE;
            } else if (strcmp(v, "checkpoint") == 0) {
                topt.strategy = SBP_STRATEGY_CHECKPOINT;
            } else if (strcmp(v, "stream") == 0) {
                topt.strategy = SBP_STRATEGY_STREAM;
            } else {
                fprintf(stderr, "%s: error: --strategy: '%s' is not stream, store or checkpoint\n",
                        prog, v);
                return 1;
            }
        } else if ((v = flag_value(argc, argv, &i, "--target"))) {
            if (strcmp(v, "cpu") != 0 && strcmp(v, "cuda") != 0) {
                fprintf(stderr, "%s: error: --target: '%s' is not cpu or cuda\n", prog, v);
                return 1;
            }
            target = v;
        } else if ((v = flag_value(argc, argv, &i, "--precision"))) {
            if (strcmp(v, "fp32") != 0 && strcmp(v, "bf16") != 0) {
                fprintf(stderr, "%s: error: --precision: '%s' is not fp32 or bf16\n", prog, v);
                return 1;
            }
            topt.bf16 = strcmp(v, "bf16") == 0;
        } else if ((v = flag_value(argc, argv, &i, "--chunk"))) {
            if (parse_count("--chunk", v, &topt.chunk))
                return 1;
        } else if ((v = flag_value(argc, argv, &i, "--logits-chunk"))) {
            if (parse_count("--logits-chunk", v, &topt.logits_chunk))
                return 1;
        } else if ((v = flag_value(argc, argv, &i, "--memory-budget"))) {
            if (parse_bytes("--memory-budget", v, &topt.memory_budget))
                return 1;
        } else if ((v = flag_value(argc, argv, &i, "--objective"))) {
            if (strcmp(v, "sft") == 0) {
                objective = SBP_OBJECTIVE_SFT;
            } else if (strcmp(v, "graph-loss") == 0) {
                objective = SBP_OBJECTIVE_GRAPH_LOSS;
            } else if (strcmp(v, "dpo") == 0) {
                objective = SBP_OBJECTIVE_DPO;
            } else if (strcmp(v, "grpo") == 0) {
                objective = SBP_OBJECTIVE_GRPO;
            } else {
                fprintf(stderr, "%s: error: --objective: '%s' is not sft, graph-loss, dpo or "
                                "grpo\n", prog, v);
                return 1;
            }
        } else if ((v = flag_value(argc, argv, &i, "--beta"))) {
            if (parse_real("--beta", v, &topt.beta))
                return 1;
            beta_given = "--beta";
        } else if ((v = flag_value(argc, argv, &i, "--epsilon"))) {
            if (parse_real("--epsilon", v, &topt.epsilon))
                return 1;
            grpo_given = "--epsilon";
        } else if ((v = flag_value(argc, argv, &i, "--grpo-norm"))) {
            if (strcmp(v, "sequence") == 0) {
                topt.grpo_norm = SBP_GRPO_NORM_SEQUENCE;
            } else if (strcmp(v, "token") == 0) {
                topt.grpo_norm = SBP_GRPO_NORM_TOKEN;
            } else {
                fprintf(stderr, "%s: error: --grpo-norm: '%s' is not sequence or token\n", prog,
                        v);
                return 1;
            }
            grpo_given = "--grpo-norm";
        } else if ((v = flag_value(argc, argv, &i, "--freeze"))) {
            if (!*v || n_freeze == MAX_FREEZE) {
                fprintf(stderr, "%s: error: --freeze needs a regular expression (at most %d)\n",
                        prog, MAX_FREEZE);
                return 1;
            }
            freeze[n_freeze++] = v;
        } else if (strcmp(a, "--report") == 0) {
            report = true;
        } else if (strcmp(a, "--dump-params") == 0) {
            want_params = true;
        } else if ((v = flag_value(argc, argv, &i, "--memory-plot"))) {
            if (!*v) {
                fprintf(stderr, "%s: error: --memory-plot needs a file name\n", prog);
                return 1;
            }
            plot = v;
        } else if (strcmp(a, "--no-retie") == 0) {
            opt.no_retie = true;
        } else if (strcmp(a, "--dump-ir") == 0) {
            dump = true;
        } else if (strncmp(a, "--dump-ir=", 10) == 0) {
            dump = true;
            dump_pass = a + 10;
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "%s: error: unknown option '%s' (see --help)\n", prog, a);
            return 1;
        } else if (model) {
            fprintf(stderr, "%s: error: more than one model given ('%s' and '%s')\n", prog, model,
                    a);
            return 1;
        } else {
            model = a;
        }
    }
    /* DPO / GRPO hyper-parameters: the defaults, and no flag for another objective */
    bool pref = objective == SBP_OBJECTIVE_DPO || objective == SBP_OBJECTIVE_GRPO;
    if ((beta_given && !pref) || (grpo_given && objective != SBP_OBJECTIVE_GRPO)) {
        fprintf(stderr, "%s: error: %s applies to --objective %s, not %s\n", prog,
                grpo_given && objective != SBP_OBJECTIVE_GRPO ? grpo_given : beta_given,
                grpo_given && objective != SBP_OBJECTIVE_GRPO ? "grpo" : "dpo or grpo",
                sbp_objective_name(objective));
        return 1;
    }
    if (!beta_given)
        topt.beta = sbp_objective_default_beta(objective);
    if (topt.epsilon < 0)
        topt.epsilon = objective == SBP_OBJECTIVE_GRPO ? SBP_GRPO_DEFAULT_EPSILON : 0;
    if (!model) {
        fprintf(stderr, "%s: error: no model given\n", prog);
        usage(stderr);
        return 1;
    }
    if (topt.bf16 && strcmp(target, "cuda") != 0) {
        fprintf(stderr, "%s: error: --precision bf16 needs --target cuda\n", prog);
        return 1;
    }
    if (topt.bf16 && (objective == SBP_OBJECTIVE_DPO || objective == SBP_OBJECTIVE_GRPO)) {
        fprintf(stderr, "%s: error: --precision bf16: the %s objective is fp32 only\n", prog,
                sbp_objective_name(objective));
        return 1;
    }
    size_t out_len = out ? strlen(out) : 0;
    if (out_len > 3 && strcmp(out + out_len - 3, ".so") == 0 &&
        !sbp_codegen_target_available(target)) {
        fprintf(stderr, "%s: error: --target %s: this sbpc was configured without a CUDA compiler "
                "(nvcc), so it cannot build a cuda .so; -o %.*s.c writes the C\n", prog, target,
                (int)(out_len - 3), out);
        return 1;
    }

    ir_diag diag;
    ir_diag_init(&diag, model);
    int rc = 0;
    const bool dump_training = dump_pass && (strcmp(dump_pass, "objective") == 0 ||
                                             strcmp(dump_pass, "program") == 0);
    if (dump_training && (out || report || plot || want_params)) {
        fprintf(stderr, "%s: error: --dump-ir=%s prints and exits: not with -o, --report, "
                "--memory-plot or --dump-params\n", prog, dump_pass);
        ir_diag_free(&diag);
        return 1;
    }
    ir_graph *g = ir_import_onnx(model, &diag, NULL);
    if (!g || diag.n_errors) {
        rc = 1;
    } else if (sbp_canonicalize(g, &opt, dump_training ? NULL : dump_pass) != IR_OK) {
        rc = 1;
    }
    ir_diag_print(&diag, stderr, prog);
    int printed = diag.n;
    sbp_objective chosen = objective;
    if (rc != 0) {
        /* the diagnostics say why */
    } else if (want_params) {
        if (apply_freeze(g, freeze, n_freeze) == IR_OK)
            dump_params(g);
        else
            rc = 1;
    } else if (dump_training) {
        /* past canonicalisation: the graph with its objective (and --freeze), or the training
         * program the step is emitted from (segments, StreamBP chunk loops with their row
         * ranges and what runs once per layer, each workspace buffer's offset, size and
         * lifetime, the instructions) */
        sbp_train_program *p = NULL;
        if (sbp_pass_objective(g, objective, &chosen) != IR_OK ||
            apply_freeze(g, freeze, n_freeze) != IR_OK)
            rc = 1;
        else if (strcmp(dump_pass, "objective") == 0)
            ir_print(g, stdout);
        else if ((p = sbp_train_build(g, chosen, &topt)))
            sbp_train_print(p, stdout);
        else
            rc = 1;
    } else {
        if (dump)
            ir_print(g, stdout);
        else if (!out)
            summary(g);
        if (out || report || plot) {
            if (dump_pass && strcmp(dump_pass, sbp_pass_list[sbp_n_passes - 1].name) != 0) {
                ir_diag_error(&diag, "-o needs the whole pipeline (not --dump-ir=%s)", dump_pass);
                rc = 1;
            }
            if (rc == 0 && (sbp_pass_objective(g, objective, &chosen) != IR_OK ||
                            apply_freeze(g, freeze, n_freeze) != IR_OK))
                rc = 1;
            sbp_train_program *p = rc == 0 ? sbp_train_build(g, chosen, &topt) : NULL;
            if (!p)
                rc = 1;
            else if (out && sbp_codegen_write_target(p, out, model, NULL, target, &diag) != IR_OK)
                rc = 1;
            if (p && (report || plot) &&
                memory_report(g, chosen, &topt, p, report, plot, &diag) != 0)
                rc = 1;
        }
    }
    ir_diag_print_from(&diag, printed, stderr, prog); /* what code generation added */
    ir_graph_free(g);
    ir_diag_free(&diag);
    return rc;
}
