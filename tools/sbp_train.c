/* sbp_train.c — sbp-train, the command line over the trainer library (train/sbptrain.h).
 *
 *   sbp-train STEP.so --model MODEL.onnx (--input-ids X.npy --labels Y.npy | --data SHARD.bin |
 *             --dataset DATA.safetensors) [options]      (--help lists them)
 *
 * This file only reads the command line (tools/cli.c: getopt_long and the value checkers sbpc
 * shares) into a train_config, prints what the library reports, and draws the progress bar;
 * the library does the rest. The loop:
 *
 *     open the run; print what is trained;
 *     while the run is not done: step; print "step N loss X ..."; end the step; draw the bar;
 *     finish (the outputs); print the memory figures; close.
 *
 * Every diagnostic is "sbp-train: KIND: text" on stderr, written with one fprintf (glibc writes
 * it to the unbuffered stderr in one write: under mpirun the line reaches the job's stderr
 * whole, not split by another rank's output or mpirun's MPI_ABORT banner); results go to
 * stdout. Under mpirun (train_dist.h) rank 0 speaks for the job: the other ranks print errors
 * only, their stdout is /dev/null and their outputs are dropped. Exit status 0, or 1 after an
 * error (a failed rank aborts every rank).
 */
#include "cli.h"
#include "sbptrain.h"
#include "train_log.h" /* train_log_now: the monotonic clock */
#include "train_progress.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

/* What the printing needs: the program's name (with the rank under mpirun), the ranks, and
 * the progress bar's state (drawn on stderr while a terminal; every line clears it first). */
static struct {
    const char *prog;
    train_dist dist;
    bool bar_shown;
    double bar_t0;      /* the ETA is this process's mean step time (train_progress.h) */
    int64_t bar_first;  /* from the step it started at */
} out = {.prog = "sbp-train", .bar_first = 1};

static void clear_bar(void)
{
    if (out.bar_shown) {
        fputs("\r\033[K", stderr);
        out.bar_shown = false;
    }
}

/* The library's lines (train_say.h). */
static void sink_line(void *ud, const char *kind, const char *text)
{
    (void)ud;
    const bool is_out = strcmp(kind, "out") == 0;
    if (out.dist.on && out.dist.rank != 0 && !is_out && *kind && strcmp(kind, "error") != 0)
        return; /* rank 0 speaks for the job; the others report errors only */
    clear_bar();
    if (is_out) {
        printf("%s\n", text);
        fflush(stdout);
    } else if (*kind) {
        fprintf(stderr, "%s: %s: %s\n", out.prog, kind, text);
    } else { /* an import's diagnostic, with its own place and severity */
        fprintf(stderr, "%s: %s\n", out.prog, text);
    }
}
static const train_sink sink = {sink_line, NULL};

static int error(const char *msg)
{
    return train_err(&sink, "%s", msg);
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: sbp-train STEP.so --model MODEL.onnx (--input-ids X.npy --labels Y.npy |\n"
            "                 --data SHARD.bin | --dataset DATA.safetensors) [options]\n"
            "\n"
            "Trains with a step compiled by sbpc, starting from the model's weights.\n"
            "\n"
            "inputs:\n"
            "  --model MODEL.onnx      the model the step was compiled from (its weights)\n"
            "  --input-ids X.npy       token ids, int32 or int64 [B,T]; the same batch every step\n"
            "  --labels Y.npy          the target of each position, int32 or int64 [B,T];\n"
            "                          -100 = not scored\n"
            "  --data SHARD.bin        an llm.c token shard: each step takes the next B*T+1\n"
            "                          tokens, row b = tokens [b*T, b*T+T], labels = next tokens\n"
            "                          (with --pack: rows of whole documents, see below)\n"
            "options:\n"
            "  --steps N               optimizer steps (default 1)\n"
            "  --lr F                  learning rate (default 1e-3)\n"
            "  --optimizer NAME        adamw (default; as torch.optim.AdamW, betas 0.9/0.999,\n"
            "                          eps 1e-8) or sgd (no momentum)\n"
            "  --weight-decay F        decoupled weight decay for adamw, L2 for sgd (default 0)\n"
            "  --threads N             CPU threads (default: OMP_NUM_THREADS or all cores)\n"
            "  --host-budget B         host memory a step compiled with sbpc --offload may keep\n"
            "                          its checkpoints in (default: what the machine has free)\n"
            "  --dump-grads FILE       write the first step's gradients as safetensors (float32,\n"
            "                          keyed by initializer name; the loss in __metadata__)\n"
            "  --save OUT.onnx         write the trained weights into a copy of the model\n"
            /* safetensors export */
            "  --save-safetensors F    write the trained weights as safetensors under their\n"
            "                          PyTorch names and layouts, for model.load_state_dict\n"
            "                          (exporter-renamed weights are recovered from node\n"
            "                          scopes and listed; an ambiguous one is an error)\n"
            "  --grad-accum K          K micro-batches of B rows per optimizer step (default 1):\n"
            "                          the input files hold K*B rows (--data: K batches); the\n"
            "                          update equals one step on the whole batch\n"
            /* schedule, clipping, log */
            "%s"
            /* checkpoints */
            "%s"
            /* packed documents */
            "%s"
            /* evaluation */
            "%s"
            /* LoRA adapters */
            "%s"
            /* a model folder for transformers */
            "%s"
            /* datasets */
            "%s"
            /* data parallel */
            "%s"
            "DPO and GRPO steps (sbpc --objective dpo|grpo), N = K*B rows:\n"
            "  --ref-logps FILE        the reference's log-probs: an .npy, dpo each row's [N]\n"
            "                          (row N/2+i: row i's rejected), grpo each label's [N,T];\n"
            "                          with --dataset, a --compute-logps file (e.g. another\n"
            "                          model's) instead of computing them before step 1\n"
            "  --old-logps FILE        grpo: the sampler's, both forms (default: on-policy)\n"
            "  --advantages A.npy      grpo without --dataset: one advantage per row [N]\n"
            "  -h, --help              this text\n"
            "  --version               print the version\n"
            "\n"
            "Options and STEP.so may come in any order; --flag=value and --flag value are the\n"
            "same; a long option may be shortened to any unambiguous prefix (--grad for\n"
            "--grad-accum); everything after -- is STEP.so.\n"
            "\n"
            "Prints 'step N loss X tokens/s Y lr Z grad_norm G' per step (Y: the last 1 s of\n"
            "steps; G: before clipping; DPO adds TRL's rewards/*: rewards_chosen, _rejected,\n"
            "_margin, _accuracy) and the peak memory at the end (docs/memory.md).\n",
            train_sched_usage(), train_ckpt_usage(), train_pack_usage(), train_eval_usage(),
            train_adapter_usage(), train_pretrained_usage(), train_dataset_usage(),
            train_dist_usage());
}

/* ------------------------------------------------------------------ command line */

enum { OPT_MODEL = 256, OPT_INPUT_IDS, OPT_LABELS, OPT_DATA, OPT_DUMP_GRADS, OPT_SAVE,
       OPT_REF_LOGPS, OPT_OLD_LOGPS, OPT_ADVANTAGES, OPT_GRAD_ACCUM, OPT_STEPS, OPT_THREADS,
       OPT_LR, OPT_WEIGHT_DECAY, OPT_OPTIMIZER, OPT_VERSION, OPT_SAVE_SAFETENSORS,
       OPT_ZERO, OPT_SEQ_PARALLEL, OPT_DATASET, OPT_EPOCHS, OPT_SHUFFLE_SEED, OPT_EVAL_DATASET,
       OPT_SAVE_PRETRAINED, OPT_TOKENIZER, OPT_COMPUTE_LOGPS, OPT_REF_CACHE, OPT_HOST_BUDGET };

/* Records the option just parsed as one that only training reads (the first such): a value
 * equal to the default (--lr 1e-3) leaves no other trace, and --compute-logps refuses them all
 * (train_config_check). */
static void training_only(train_config *o, const cli *c)
{
    static char flag[64];
    if (!o->training_flag) {
        snprintf(flag, sizeof flag, "%s", c->flag);
        o->training_flag = flag;
    }
}

/* The library's modules' options (train_opt.h): each appends its table to ours and takes its
 * own options back by their spelling. Every module's options but packing's are training's. */
static int parse_module_option(train_config *o, cli *c, const char *v)
{
    int r = train_pack_parse(&o->pack, c, v); /* (the names are disjoint: any order) */
    if (r != TRAIN_OPT_NOT_MINE)
        return r;
    training_only(o, c);
    r = train_sched_parse(&o->sched, c, v);
    if (r == TRAIN_OPT_NOT_MINE)
        r = train_ckpt_parse(&o->ckpt, c, v);
    if (r == TRAIN_OPT_NOT_MINE)
        r = train_adapter_parse(&o->adapter, c, v);
    if (r == TRAIN_OPT_NOT_MINE)
        r = train_eval_parse(&o->eval, c, v);
    return r == TRAIN_OPT_NOT_MINE ? cli_error(c, "internal: %s has no parser", c->flag) : r;
}

/* ours, then the modules' (the all-zero end once, at the end) */
static const struct option *option_table(const struct option *own)
{
    static struct option all[128];
    const struct option *parts[] = {own, train_sched_options, train_ckpt_options,
                                    train_pack_options, train_adapter_options,
                                    train_eval_options};
    size_t n = 0;
    for (size_t k = 0; k < sizeof parts / sizeof parts[0]; k++)
        for (const struct option *q = parts[k]; q->name && n + 1 < 128; q++)
            all[n++] = *q;
    all[n] = (struct option){0};
    return all;
}

/* Returns 0 to go on, 1 for a clean exit (--help), -1 on an error. The values are checked by
 * tools/cli.c, with the same rules and words as sbpc's. */
static int parse_args(int argc, char **argv, train_config *o)
{
    static const struct option table[] = {
        {"model", required_argument, NULL, OPT_MODEL},
        {"input-ids", required_argument, NULL, OPT_INPUT_IDS},
        {"labels", required_argument, NULL, OPT_LABELS},
        {"data", required_argument, NULL, OPT_DATA},
        {"dump-grads", required_argument, NULL, OPT_DUMP_GRADS},
        {"save", required_argument, NULL, OPT_SAVE},
        {"ref-logps", required_argument, NULL, OPT_REF_LOGPS},
        {"old-logps", required_argument, NULL, OPT_OLD_LOGPS},
        {"advantages", required_argument, NULL, OPT_ADVANTAGES},
        {"grad-accum", required_argument, NULL, OPT_GRAD_ACCUM},
        {"steps", required_argument, NULL, OPT_STEPS},
        {"threads", required_argument, NULL, OPT_THREADS},
        {"host-budget", required_argument, NULL, OPT_HOST_BUDGET},
        {"lr", required_argument, NULL, OPT_LR},
        {"weight-decay", required_argument, NULL, OPT_WEIGHT_DECAY},
        {"optimizer", required_argument, NULL, OPT_OPTIMIZER},
        {"help", no_argument, NULL, 'h'},
        {"version", no_argument, NULL, OPT_VERSION},
        /* safetensors export */
        {"save-safetensors", required_argument, NULL, OPT_SAVE_SAFETENSORS},
        {"zero", required_argument, NULL, OPT_ZERO},
        {"seq-parallel", required_argument, NULL, OPT_SEQ_PARALLEL},
        {"dataset", required_argument, NULL, OPT_DATASET},
        {"epochs", required_argument, NULL, OPT_EPOCHS},
        {"shuffle-seed", required_argument, NULL, OPT_SHUFFLE_SEED},
        {"eval-dataset", required_argument, NULL, OPT_EVAL_DATASET},
        {"save-pretrained", required_argument, NULL, OPT_SAVE_PRETRAINED},
        {"tokenizer", required_argument, NULL, OPT_TOKENIZER},
        {"compute-logps", required_argument, NULL, OPT_COMPUTE_LOGPS},
        {"ref-cache", required_argument, NULL, OPT_REF_CACHE},
        {0},
    };
    static const char *const optimizers[] = {"adamw", "sgd", NULL};
    train_config_init(o);
    cli c;
    cli_init(&c, out.prog, option_table(table), argc, argv);
    for (int opt; (opt = cli_next(&c)) != CLI_END;) {
        const char *v = c.arg;
        int k = 0, bad = 0;
        switch (opt) {
        case CLI_ERROR:
            return -1;
        case 'h':
            usage(stdout);
            return 1;
        case OPT_VERSION:
            printf("sbp-train %s (step ABI %d)\n", SBP_VERSION, SBP_STEP_ABI_VERSION);
            return 1;
        case OPT_MODEL: bad = cli_path(&c, "--model", v, &o->model_path); break;
        case OPT_INPUT_IDS: bad = cli_path(&c, "--input-ids", v, &o->ids_path); break;
        case OPT_LABELS: bad = cli_path(&c, "--labels", v, &o->labels_path); break;
        case OPT_DATA: bad = cli_path(&c, "--data", v, &o->data_path); break;
        case OPT_DUMP_GRADS: bad = cli_path(&c, "--dump-grads", v, &o->dump_grads); break;
        case OPT_SAVE: bad = cli_path(&c, "--save", v, &o->save); break;
        /* safetensors export */
        case OPT_SAVE_SAFETENSORS:
            bad = cli_path(&c, "--save-safetensors", v, &o->save_safetensors);
            break;
        case OPT_REF_LOGPS: bad = cli_path(&c, "--ref-logps", v, &o->ref_logps); break;
        case OPT_OLD_LOGPS: bad = cli_path(&c, "--old-logps", v, &o->old_logps); break;
        case OPT_ADVANTAGES: bad = cli_path(&c, "--advantages", v, &o->advantages); break;
        case OPT_GRAD_ACCUM:
            bad = cli_count(&c, "--grad-accum", v, 1, 1 << 20, &o->grad_accum);
            training_only(o, &c);
            break;
        case OPT_STEPS:
            bad = cli_count(&c, "--steps", v, 1, (int64_t)1 << 30, &o->steps);
            o->steps_given = true;
            break;
        case OPT_DATASET: bad = cli_path(&c, "--dataset", v, &o->dataset.path); break;
        case OPT_SAVE_PRETRAINED:
            bad = cli_path(&c, "--save-pretrained", v, &o->pretrained.dir);
            break;
        case OPT_TOKENIZER:
            bad = cli_path(&c, "--tokenizer", v, &o->pretrained.tokenizer);
            training_only(o, &c);
            break;
        case OPT_REF_CACHE: bad = cli_path(&c, "--ref-cache", v, &o->ref_cache); break;
        case OPT_COMPUTE_LOGPS:
            bad = cli_path(&c, "--compute-logps", v, &o->compute_logps);
            break;
        case OPT_EVAL_DATASET:
            bad = cli_path(&c, "--eval-dataset", v, &o->eval.dataset);
            break;
        case OPT_EPOCHS:
            bad = cli_count(&c, "--epochs", v, 1, 1 << 20, &o->dataset.epochs);
            break;
        case OPT_SHUFFLE_SEED: {
            int64_t seed = 0;
            if (!(bad = cli_count(&c, "--shuffle-seed", v, 0, INT64_MAX, &seed))) {
                o->dataset.shuffle = true;
                o->dataset.seed = (uint64_t)seed;
            }
            break;
        }
        case OPT_THREADS:
            bad = cli_count(&c, "--threads", v, 1, 4096, &o->threads);
            break;
        case OPT_HOST_BUDGET: bad = cli_bytes(&c, "--host-budget", v, &o->host_budget); break;
        case OPT_LR:
            bad = cli_real(&c, "--lr", v, &o->lr);
            training_only(o, &c);
            break;
        case OPT_WEIGHT_DECAY:
            bad = cli_real(&c, "--weight-decay", v, &o->weight_decay);
            training_only(o, &c);
            break;
        case OPT_OPTIMIZER:
            if (!(bad = cli_choice(&c, "--optimizer", v, optimizers, &k)))
                o->adamw = k == 0;
            training_only(o, &c);
            break;
        case TRAIN_OPT: bad = parse_module_option(o, &c, v); break;
        case OPT_ZERO: bad = cli_count(&c, "--zero", v, 0, 2, &o->zero); break;
        case OPT_SEQ_PARALLEL:
            bad = cli_count(&c, "--seq-parallel", v, 1, 4096, &o->seq_parallel);
            break;
        case CLI_POSITIONAL:
            if (o->step_path)
                bad = cli_error(&c, "more than one step library given ('%s' and '%s')",
                                o->step_path, v);
            else
                o->step_path = v;
            break;
        }
        if (bad)
            return -1;
    }
    int rc = train_config_check(o, &sink); /* the options against each other */
    if (rc == -2)
        usage(stderr);
    return rc ? -1 : 0;
}

/* ------------------------------------------------------------------ printing */

static void print_start(const train_run *r)
{
    const sbp_step_info *in = train_run_info(r);
    const train_config *o = train_run_config(r);
    int64_t n_weights = 0;
    for (int i = 0; i < in->n_params; i++)
        n_weights += in->params[i].tied_to < 0 ? (int64_t)in->params[i].numel : 0;
    printf("%s: %s (%s, %s, %s): batch %lld, seq-len %lld, vocab %lld; %d parameter tensors, "
           "%lld weights; %s lr %g%s\n", out.prog, o->step_path, in->target ? in->target : "?",
           in->strategy ? in->strategy : "?", in->objective ? in->objective : "?",
           (long long)in->batch, (long long)in->seq_len, (long long)in->vocab, in->n_params,
           (long long)n_weights, o->adamw ? "adamw" : "sgd", o->lr,
           o->weight_decay > 0 ? " (with weight decay)" : "");
    fflush(stdout);
}

static void print_step(const train_step_stats *st)
{
    clear_bar();
    /* "step N loss X" first: scripts parse that prefix; the other fields follow */
    printf("step %lld loss %.6f tokens/s %.1f lr %.9g grad_norm %.9g", (long long)st->step,
           st->loss, st->tokens_per_s, st->lr, st->grad_norm);
    if (!isnan(st->aux_loss)) printf(" aux_loss %.9g", st->aux_loss); /* MoE: load balancing */
    const train_rewards_stats *w = &st->rewards; /* DPO: TRL's rewards/... */
    if (!isnan(w->margin))
        printf(" rewards_chosen %.9g rewards_rejected %.9g rewards_margin %.9g "
               "rewards_accuracy %.6g", w->chosen, w->rejected, w->margin, w->accuracy);
    putchar('\n');
    fflush(stdout);
}

static void draw_bar(const train_step_stats *st, int64_t total)
{
    char line[256];
    const int64_t s = st->step;
    const double eta = train_progress_eta(s, total, s - out.bar_first + 1,
                                          train_log_now() - out.bar_t0);
    train_progress_format(line, sizeof line, s, total, st->loss, st->tokens_per_s, eta);
    fprintf(stderr, "\r\033[K%s", line);
    fflush(stderr);
    out.bar_shown = true;
}

/* The packing figures, the peak memory (planned against used) and the launches. */
static void print_report(const train_report *p)
{
    char b1[32], b2[32], b3[32], b4[32];
    struct rusage ru; /* peak RSS */
    const double rss = getrusage(RUSAGE_SELF, &ru) ? 0 : (double)ru.ru_maxrss * 1024.0;
    if (p->rows > 0)
        printf("packed documents: %lld documents (a row's padding counts as one) in %lld rows "
               "of %lld tokens (mean %.1f tokens); causal attention over them is %.1f%% of the "
               "work of unpacked rows (%.3g of %.3g query-key pairs: the packed kernels skip "
               "other documents' keys)\n", (long long)p->docs, (long long)p->rows,
               (long long)p->seq_len, (double)(p->rows * p->seq_len) / (double)(p->docs ? p->docs : 1),
               100.0 * p->pairs_packed / p->pairs_full, p->pairs_packed, p->pairs_full);
    const double planned = (double)p->planned_bytes + (double)p->opt_state_bytes;
    cli_human_bytes(b1, sizeof b1, planned);
    cli_human_bytes(b2, sizeof b2, (double)p->planned_bytes);
    cli_human_bytes(b3, sizeof b3, (double)p->opt_state_bytes);
    if (p->host_visible) {
        printf("peak memory: planned %s (step %s + optimizer state %s), actual %s (peak RSS: "
               "libraries and data too, docs/memory.md)%s\n", b1, b2, b3,
               cli_human_bytes(b4, sizeof b4, rss), p->data_parallel ? " per rank" : "");
    } else {
        printf("peak device memory: planned %s (step %s + optimizer state %s)", b1, b2, b3);
        if (p->dev_known)
            printf(", actual %s more in use than before the arena (%zu bytes: arena, constants, "
                   "runtime scratch, cuBLAS workspace; at most %s of %s in use, sampled after "
                   "each step)", cli_human_bytes(b4, sizeof b4, (double)p->dev_used), p->dev_used,
                   cli_human_bytes(b1, sizeof b1, (double)p->dev_peak),
                   cli_human_bytes(b2, sizeof b2, (double)p->dev_total));
        printf("\npeak host memory: %s (peak RSS)\n", cli_human_bytes(b4, sizeof b4, rss));
        if (p->launches >= 0) /* kernels and cuBLAS calls, the optimizer's too */
            printf("device launches: %lld in the last step\n", (long long)p->launches);
        if (p->host_bytes)
            printf("host workspace: %zu bytes (%s): what the step offloads (sbpc --offload: "
                   "layer checkpoints, page-locked; fp32 masters, gradients and AdamW state)\n",
                   p->host_bytes, cli_human_bytes(b4, sizeof b4, (double)p->host_bytes));
    }
    if (p->data_parallel) /* cpu and cuda steps alike */
        printf("data parallel: %d ranks, ZeRO %d: optimizer state %zu bytes per rank (%zu "
               "without ZeRO), global batch %lld rows per micro-batch\n", p->ranks, p->zero,
               p->opt_state_bytes, p->opt_state_full, (long long)p->global_rows);
    if (p->seq_parallel > 0)
        printf("sequence parallel: %d data group%s of %d ranks, each rank %lld of every row's "
               "%lld tokens\n", p->ranks / p->seq_parallel, p->ranks / p->seq_parallel == 1 ? ""
               : "s", p->seq_parallel, (long long)(p->row_tokens / p->seq_parallel),
               (long long)p->row_tokens);
}

/* ------------------------------------------------------------------ main */

/* The run from its first step to its report; 0 or -1. */
static int train(train_run *r)
{
    const int64_t total = train_run_config(r)->steps;
    const bool bar = isatty(STDERR_FILENO);
    print_start(r);
    out.bar_first = train_run_next_step(r);
    out.bar_t0 = train_log_now();
    train_step_stats st;
    while (!train_run_done(r)) {
        if (train_run_step(r, &st))
            return -1;
        print_step(&st);
        if (train_run_end_step(r, &st))
            return -1;
        if (bar)
            draw_bar(&st, total);
    }
    clear_bar();
    train_report rep;
    if (train_run_finish(r, &rep))
        return -1;
    if (!rep.stopped)
        print_report(&rep);
    return 0;
}

int main(int argc, char **argv)
{
    char derr[512]; /* MPI, only when a launcher started this process */
    if (train_dist_init(&out.dist, &argc, &argv, derr, sizeof derr))
        return error(derr), 1;
    out.prog = out.dist.prog;
    train_config c;
    int prc = parse_args(argc, argv, &c);
    if (prc > 0 && out.dist.on && train_config_agree(&c, &out.dist, true, &sink))
        prc = -1;
    if (prc) {
        train_dist_end(&out.dist, prc > 0 ? 0 : 1);
        return prc > 0 ? 0 : 1;
    }
    /* before anything that could wait on another rank */
    if (out.dist.on && train_config_agree(&c, &out.dist, false, &sink)) {
        train_dist_end(&out.dist, 1);
        return 1;
    }
    if (out.dist.on && out.dist.rank != 0) {
        /* rank 0 prints and writes the outputs; the others only report errors (stderr).
         * --dump-grads stays set: ZeRO 2 then sums the whole first gradient on every rank
         * alike, and only rank 0 writes it. */
        if (!freopen("/dev/null", "w", stdout))
            return train_err(&sink, "cannot silence rank %d's output: /dev/null", out.dist.rank), 1;
        train_config_rank_outputs(&c);
    }
    train_run *r = NULL;
    int rc = train_run_open(&r, &c, &out.dist, &sink) ||
                     (!train_run_logps_only(r) && train(r))
                 ? 1
                 : 0;
    clear_bar();
    train_run_close(r);
    train_dist_end(&out.dist, rc); /* a failed rank aborts every rank */
    return rc;
}
