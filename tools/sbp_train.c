/* sbp_train.c — sbp-train, the driver that trains with a compiled step.
 *
 *   sbp-train STEP.so --model MODEL.onnx (--input-ids X.npy --labels Y.npy | --data SHARD.bin)
 *             [--steps N] [--lr F] [--optimizer sgd|adamw] [--weight-decay F] [--threads N]
 *             [--dump-grads FILE.safetensors] [--save OUT.onnx] [--grad-accum K]
 *             [--ref-logps R.npy] [--old-logps O.npy] [--advantages A.npy]
 *             [--lr-schedule constant|linear|cosine] [--warmup-steps N] [--min-lr F]
 *             [--clip-grad-norm F] [--log FILE.jsonl] [--save-safetensors FILE]
 *             [--checkpoint-dir DIR] [--checkpoint-every N] [--keep-checkpoints K] [--resume DIR]
 *             [--pack --eos ID | --doc-ids D.npy] [--zero 0|1|2]
 *
 * Approach: the step library (codegen/sbp_step.h) describes itself — dims, parameter table,
 * workspace size — so this program only has to check that the user's files agree with that
 * description, own the memory, and loop. main() runs four phases over one `run` struct (each
 * returns 0, or -1 after its message; run_free releases whatever was made):
 *   run_load      dlopen the step, check its ABI version and that its parameter table is
 *                 self-consistent; read the inputs (.npy ids + labels, or an llm.c token shard)
 *                 and check shapes, dtypes and ranges against the step's B, T, V before anything
 *                 runs; import the ONNX model (ir_import_onnx, no passes) and check that every
 *                 parameter of the step is a float32 initializer of the same shape (a re-tied
 *                 parameter only has to exist: it has no storage, being the transpose of its
 *                 owner);
 *   run_allocate  one arena (sbprt_arena_alloc) holds, at SBPRT_ALIGN-aligned offsets:
 *                 parameters, gradients, AdamW's m and v, the step's workspace, the ids and
 *                 labels of one batch; the model's weights are copied in;
 *   run_loop      per step (run_step): run the step, stop on a failed status or a non-finite
 *                 loss (naming the step), then update every trainable parameter with
 *                 sbprt_adamw_update / sbprt_sgd_update;
 *   run_report    optionally dump the first step's gradients (safetensors; written after step 1)
 *                 and save the trained weights into a copy of the model (ONNX), both written
 *                 atomically by sbpio; print the peak memory.
 * The command line is read by tools/cli.c (getopt_long and the value checkers sbpc shares).
 *
 * --grad-accum K: each optimizer step runs the step on K micro-batches of B rows (the input
 * files hold K*B rows; --data reads K batches), accumulating the gradients, with the whole
 * batch's denominator (scored positions, GRPO rows or DPO pairs: train_inputs.c), so that the
 * update is the one of a single step on all K*B rows. DPO and GRPO steps take their extra
 * inputs (--ref-logps, --old-logps, --advantages) for all rows, checked by train_inputs.c.
 *
 * A cuda step (sbpc --target cuda) runs the same way with the same flags: the arena is device
 * memory (the step's own sbprt_arena_alloc), the weights are copied in with sbprt_memcpy, the
 * ids and labels of each step are copied to the device, the gradients and weights come back for
 * --dump-grads and --save, and the end report gives the device's memory in use at its peak
 * (sbprt_device_memory, sampled after every step) next to the planned bytes. Failures print
 * the runtime's own diagnostic (sbprt_ctx_last_error): on a machine without a GPU, "no CUDA
 * device"; for an allocation that does not fit, the bytes asked and free and the
 * --memory-budget that would fit.
 *
 * Files: every input (the step, the model and its external data, the token files, the DPO / GRPO
 * arrays) is opened without blocking and must be a regular file, so a FIFO is an error rather
 * than a hang; the step's ELF tables are checked against its size before dlopen, so a truncated
 * .so is an error rather than SIGBUS in the loader. The outputs (--dump-grads, --save) are
 * checked against the identity of every input before anything runs (and again once the model's
 * external data files are known): writing over a file the run reads, over a FIFO or directory,
 * or twice to one file, is refused (ir/files.h).
 *
 * Checkpoints (train_ckpt.h): run_load prepares the directory (proved writable before
 * any work), run_allocate restores a --resume checkpoint over the model's weights and zeroed
 * moments, run_loop starts after its step and writes one after each due step; a SIGINT/SIGTERM
 * ends the loop after the current step's checkpoint and run_report then writes nothing.
 *
 * Packed documents (train_pack.h): a step compiled with sbpc --packed takes each
 * token's document id (sbp_step_args.doc_ids); --data --pack --eos packs the shard into rows of
 * whole documents each step, with the shard position as the cursor checkpoints already keep,
 * and --doc-ids gives them for --input-ids; run_load checks the step and the flags agree.
 *
 * Data parallel (train_dist.h): under mpirun every rank reads the global batch (G rows
 * per micro-batch; `bin` in run_load describes it), runs the step on its own rows
 * (train_dist_micro instead of ti_micro) with the global denominator, and the losses and
 * gradients are summed before the update (train_dist_reduce); --zero slices the optimizer state
 * (train_dist_owned in the update loop, then train_dist_gather_params). Every hook goes
 * through `dist`; rank 0 alone prints and writes.
 *
 * Runtime functions are taken from the step library when it exports them (a step links
 * libsbprt in, so the context and the arena then belong to the backend the step was built for)
 * and otherwise from the CPU runtime linked into this program, each copy with its own context
 * (see `runtime`); a step for another backend must export all of them. Every failure is a
 * message "sbp-train: error: ..." and exit status 1; nothing here trusts the step's table or
 * the user's files without checking.
 */
#include "cli.h"
#include "ir.h"
#include "sbp_step.h"
#include "sbpio.h"
#include "train_inputs.h"
#include "train_log.h"   /* schedule, clipping, log */
#include "train_sched.h"
#include "train_export.h" /* safetensors export */
#include "train_ckpt.h" /* checkpoints */
#include "train_progress.h" /* the progress line's text */
#include "train_pack.h" /* packed documents */
#include "train_adapter.h" /* LoRA adapters */
#include "train_eval.h" /* held-out evaluation */
#include "train_dist.h" /* data parallel under mpirun */
#include "train_finite.h"
#include "train_outputs.h"
#include "train_dataset.h"
#include "train_pretrained.h"

#include <dlfcn.h>
#include <elf.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static const char *prog = "sbp-train";

/* The ranks under mpirun (train_dist.h); one rank, MPI untouched, otherwise. prog
 * becomes "sbp-train: rank R" on every rank of a distributed run. */
static train_dist dist;

/* True while a progress bar is drawn on stderr: messages clear its line first. */
static bool bar_shown;

static void clear_bar(void)
{
    if (bar_shown) {
        fputs("\r\033[K", stderr);
        bar_shown = false;
    }
}

/* Prints "prog: KIND: message" with one fprintf, which glibc writes to the unbuffered stderr in
 * one write: under mpirun the line then reaches the job's stderr whole, not split by another
 * rank's output or by mpirun's own MPI_ABORT banner (seen in dist.abort_2 under ASan: the
 * line's three pieces were three writes). */
static void put_line(const char *kind, const char *fmt, va_list ap)
{
    char small[1024], *buf = small;
    va_list again;
    va_copy(again, ap);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    if (n >= (int)sizeof small) {
        buf = malloc((size_t)n + 1);
        if (buf)
            vsnprintf(buf, (size_t)n + 1, fmt, again);
        else
            buf = small; /* cut short rather than lost */
    }
    va_end(again);
    fprintf(stderr, "%s: %s: %s\n", prog, kind, n < 0 ? fmt : buf);
    if (buf != small)
        free(buf);
}

static int error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int error(const char *fmt, ...)
{
    va_list ap;
    clear_bar();
    va_start(ap, fmt);
    put_line("error", fmt, ap);
    va_end(ap);
    return -1;
}

/* An error that is printed only when `report` (the first few of a long list). */
static void mismatch(bool report, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void mismatch(bool report, const char *fmt, ...)
{
    if (!report)
        return;
    va_list ap;
    clear_bar();
    va_start(ap, fmt);
    put_line("error", fmt, ap);
    va_end(ap);
}

static void message(const char *kind, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void message(const char *kind, const char *fmt, ...)
{
    va_list ap;
    if (dist.on && dist.rank != 0 && strcmp(kind, "error") != 0)
        return; /* rank 0 speaks for the job; the others report errors only */
    clear_bar();
    va_start(ap, fmt);
    put_line(kind, fmt, ap);
    va_end(ap);
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
            "  --ref-logps R.npy       dpo: the reference model's logp of each row [N] (rows\n"
            "                          i < N/2 are chosen, row N/2+i is i's rejected partner);\n"
            "                          grpo: its logp of each label [N,T] (needed when beta > 0)\n"
            "  --old-logps O.npy       grpo: the sampling policy's logp of each label [N,T]\n"
            "                          (default: on-policy, the current logp)\n"
            "  --advantages A.npy      grpo: one advantage per row [N]\n"
            "  -h, --help              this text\n"
            "  --version               print the version\n"
            "\n"
            "Options and STEP.so may come in any order; --flag=value and --flag value are the\n"
            "same; a long option may be shortened to any unambiguous prefix (--grad for\n"
            "--grad-accum); everything after -- is STEP.so.\n"
            "\n"
            "Prints 'step N loss X tokens/s Y lr Z grad_norm G' per step (G: before clipping)\n"
            "and the peak memory at the end.\n",
            train_sched_usage(), train_ckpt_usage() /* checkpoints */,
            train_pack_usage(), train_eval_usage(),
            train_adapter_usage(), train_pretrained_usage(), train_dataset_usage(),
            train_dist_usage());
}

/* ------------------------------------------------------------------ command line */

typedef struct options {
    const char *step_path;   /* STEP.so */
    const char *model_path;  /* --model */
    const char *ids_path;    /* --input-ids */
    const char *labels_path; /* --labels */
    const char *data_path;   /* --data */
    const char *dump_grads;  /* --dump-grads, or NULL */
    const char *save;        /* --save, or NULL */
    /* safetensors export */
    const char *save_safetensors; /* --save-safetensors, or NULL */
    int64_t steps;           /* --steps, >= 1 */
    double lr;               /* --lr, >= 0 */
    double weight_decay;     /* --weight-decay, >= 0 */
    bool adamw;              /* --optimizer adamw (else sgd) */
    int64_t threads;         /* --threads, 0 = the runtime's default */
    int64_t grad_accum;      /* --grad-accum K >= 1 */
    const char *ref_logps;   /* --ref-logps (DPO, GRPO), or NULL */
    const char *old_logps;   /* --old-logps (GRPO), or NULL */
    const char *advantages;  /* --advantages (GRPO), or NULL */
    train_sched_opts sched;  /* --lr-schedule, --warmup-steps, --min-lr,
                              * --clip-grad-norm, --log (train_sched.h) */
    /* checkpoints */
    train_ckpt_opts ckpt;    /* --checkpoint-dir, --checkpoint-every, --keep-checkpoints,
                              * --resume (train_ckpt.h) */
    train_pack_opts pack;    /* --pack, --eos, --doc-ids (train_pack.h) */
    train_adapter_opts adapter; /* --save-adapter, --merge-lora */
    train_eval_opts eval;    /* --eval-data, --eval-every, --eval-batches */
    int64_t zero;            /* --zero 0|1|2 (train_dist.h) */
    train_dataset_opts dataset; /* --dataset, --epochs, --shuffle-seed (train_dataset.h) */
    train_pretrained_opts pretrained; /* --save-pretrained, --tokenizer (train_pretrained.h) */
    const char *compute_logps; /* --compute-logps OUT.safetensors: log-probs only, no training */
    const char *ref_cache;   /* --ref-cache FILE: where a dataset's reference log-probs are kept
                              * (default: DIR/ref-logps.safetensors of the checkpoints) */
} options;

enum { OPT_MODEL = 256, OPT_INPUT_IDS, OPT_LABELS, OPT_DATA, OPT_DUMP_GRADS, OPT_SAVE,
       OPT_REF_LOGPS, OPT_OLD_LOGPS, OPT_ADVANTAGES, OPT_GRAD_ACCUM, OPT_STEPS, OPT_THREADS,
       OPT_LR, OPT_WEIGHT_DECAY, OPT_OPTIMIZER, OPT_VERSION,
       /* safetensors export */
       OPT_SAVE_SAFETENSORS,
       OPT_ZERO, OPT_DATASET, OPT_EPOCHS, OPT_SHUFFLE_SEED, OPT_EVAL_DATASET,
       OPT_SAVE_PRETRAINED, OPT_TOKENIZER, OPT_COMPUTE_LOGPS, OPT_REF_CACHE };

/* schedule, clipping, log (consecutive, in train_sched_parse's order) */
enum { OPT_LR_SCHEDULE = 1200, OPT_WARMUP_STEPS, OPT_MIN_LR, OPT_CLIP_GRAD_NORM, OPT_LOG };
/* checkpoints (consecutive, in train_ckpt_parse's order) */
enum { OPT_CHECKPOINT_DIR = 1300, OPT_CHECKPOINT_EVERY, OPT_KEEP_CHECKPOINTS, OPT_RESUME };
/* packed documents (consecutive, in train_pack_parse's order) */
enum { OPT_PACK = 1313, OPT_EOS, OPT_DOC_IDS };
/* LoRA adapters (consecutive, in train_adapter_parse's order) */
enum { OPT_SAVE_ADAPTER = 1600, OPT_MERGE_LORA };
/* evaluation (consecutive, in train_eval_parse's order) */
enum { OPT_EVAL_DATA = 1400, OPT_EVAL_EVERY, OPT_EVAL_BATCHES };

/* Returns 0 to go on, 1 for a clean exit (--help), -1 on an error. The values are checked by
 * tools/cli.c, with the same rules and words as sbpc's. */
static int parse_args(int argc, char **argv, options *o)
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
        {"lr", required_argument, NULL, OPT_LR},
        {"weight-decay", required_argument, NULL, OPT_WEIGHT_DECAY},
        {"optimizer", required_argument, NULL, OPT_OPTIMIZER},
        /* schedule, clipping, log */
        {"lr-schedule", required_argument, NULL, OPT_LR_SCHEDULE},
        {"warmup-steps", required_argument, NULL, OPT_WARMUP_STEPS},
        {"min-lr", required_argument, NULL, OPT_MIN_LR},
        {"clip-grad-norm", required_argument, NULL, OPT_CLIP_GRAD_NORM},
        {"log", required_argument, NULL, OPT_LOG},
        {"help", no_argument, NULL, 'h'},
        {"version", no_argument, NULL, OPT_VERSION},
        /* safetensors export */
        {"save-safetensors", required_argument, NULL, OPT_SAVE_SAFETENSORS},
        /* checkpoints */
        {"checkpoint-dir", required_argument, NULL, OPT_CHECKPOINT_DIR},
        {"checkpoint-every", required_argument, NULL, OPT_CHECKPOINT_EVERY},
        {"keep-checkpoints", required_argument, NULL, OPT_KEEP_CHECKPOINTS},
        {"resume", required_argument, NULL, OPT_RESUME},
        /* packed documents */
        {"pack", no_argument, NULL, OPT_PACK},
        {"eos", required_argument, NULL, OPT_EOS},
        {"doc-ids", required_argument, NULL, OPT_DOC_IDS},
        /* LoRA adapters */
        {"save-adapter", required_argument, NULL, OPT_SAVE_ADAPTER},
        {"merge-lora", no_argument, NULL, OPT_MERGE_LORA},
        /* evaluation */
        {"eval-data", required_argument, NULL, OPT_EVAL_DATA},
        {"eval-every", required_argument, NULL, OPT_EVAL_EVERY},
        {"eval-batches", required_argument, NULL, OPT_EVAL_BATCHES},
        {"zero", required_argument, NULL, OPT_ZERO},
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
    *o = (options){.steps = 1, .lr = 1e-3, .adamw = true, .grad_accum = 1};
    bool steps_given = false;
    train_pack_opts_init(&o->pack);
    train_adapter_opts_init(&o->adapter);
    cli c;
    cli_init(&c, prog, table, argc, argv);
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
            break;
        case OPT_STEPS:
            bad = cli_count(&c, "--steps", v, 1, (int64_t)1 << 30, &o->steps);
            steps_given = true;
            break;
        case OPT_DATASET: bad = cli_path(&c, "--dataset", v, &o->dataset.path); break;
        case OPT_SAVE_PRETRAINED:
            bad = cli_path(&c, "--save-pretrained", v, &o->pretrained.dir);
            break;
        case OPT_TOKENIZER: bad = cli_path(&c, "--tokenizer", v, &o->pretrained.tokenizer); break;
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
        case OPT_LR: bad = cli_real(&c, "--lr", v, &o->lr); break;
        case OPT_WEIGHT_DECAY: bad = cli_real(&c, "--weight-decay", v, &o->weight_decay); break;
        case OPT_OPTIMIZER:
            if (!(bad = cli_choice(&c, "--optimizer", v, optimizers, &k)))
                o->adamw = k == 0;
            break;
        /* schedule, clipping, log */
        case OPT_LR_SCHEDULE: case OPT_WARMUP_STEPS: case OPT_MIN_LR: case OPT_CLIP_GRAD_NORM:
        case OPT_LOG:
            bad = train_sched_parse(&o->sched, &c, opt, OPT_LR_SCHEDULE, v);
            break;
        /* checkpoints */
        case OPT_CHECKPOINT_DIR: case OPT_CHECKPOINT_EVERY: case OPT_KEEP_CHECKPOINTS:
        case OPT_RESUME:
            bad = train_ckpt_parse(&o->ckpt, &c, opt, OPT_CHECKPOINT_DIR, v);
            break;
        /* packed documents */
        case OPT_PACK: case OPT_EOS: case OPT_DOC_IDS:
            bad = train_pack_parse(&o->pack, &c, opt, OPT_PACK, v);
            break;
        case OPT_SAVE_ADAPTER: case OPT_MERGE_LORA:
            bad = train_adapter_parse(&o->adapter, &c, opt, OPT_SAVE_ADAPTER, v);
            break;
        /* evaluation */
        case OPT_EVAL_DATA: case OPT_EVAL_EVERY: case OPT_EVAL_BATCHES:
            bad = train_eval_parse(&o->eval, &c, opt, OPT_EVAL_DATA, v);
            break;
        case OPT_ZERO: bad = cli_count(&c, "--zero", v, 0, 2, &o->zero); break;
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
    char sched_err[256]; /* the schedule's options against each other and --lr */
    if (train_sched_check(&o->sched, o->lr, sched_err, sizeof sched_err) ||
        train_eval_check_opts(&o->eval, sched_err, sizeof sched_err)) /* and evaluation's */
        return error("%s", sched_err);
    if (o->ref_cache && !o->dataset.path)
        return error("--ref-cache FILE keeps the reference log-probs of --dataset FILE");
    if (o->compute_logps && !o->dataset.path)
        return error("--compute-logps OUT.safetensors scores the examples of --dataset FILE");
    if (o->pretrained.tokenizer && !o->pretrained.dir)
        return error("--tokenizer TOKDIR is read with --save-pretrained DIR (its files are "
                     "copied there)");
    o->adapter.save_pretrained = o->pretrained.dir != NULL;
    if (train_adapter_check_outputs(&o->adapter, o->save != NULL,
                                    o->save_safetensors != NULL || o->pretrained.dir != NULL,
                                    sched_err, sizeof sched_err))
        return error("%s", sched_err); /* --merge-lora needs --save or -safetensors */
    if (!o->step_path) {
        error("no step library given");
        usage(stderr);
        return -1;
    }
    if (!o->model_path)
        return error("--model MODEL.onnx is required (the model the step was compiled from)");
    if (o->dataset.path && (o->data_path || o->ids_path || o->labels_path))
        return error("give one source of training data: --dataset, --data, or --input-ids with "
                     "--labels");
    if (!o->dataset.path && (o->dataset.epochs || o->dataset.shuffle))
        return error("%s is read with --dataset FILE", o->dataset.epochs ? "--epochs"
                                                                         : "--shuffle-seed");
    if (o->dataset.epochs && steps_given)
        return error("give --epochs or --steps, not both: --epochs sets the steps");
    if (o->data_path && (o->ids_path || o->labels_path))
        return error("give either --data or --input-ids with --labels, not both");
    if (!o->dataset.path && !o->data_path && !o->ids_path && !o->labels_path)
        return error("no training data: give --dataset DATA.safetensors, --input-ids X.npy "
                     "--labels Y.npy, or --data SHARD.bin");
    if (!o->dataset.path && !o->data_path && (!o->ids_path || !o->labels_path))
        return error("%s needs %s too", o->ids_path ? "--input-ids" : "--labels",
                     o->ids_path ? "--labels" : "--input-ids");
    char pack_err[256]; /* --pack / --eos / --doc-ids against the data flags */
    if (o->dataset.path && (o->pack.eos >= 0 || o->pack.doc_ids))
        return error("%s is read with --data or --input-ids; a dataset's examples are its "
                     "documents (--dataset with --pack needs no more)",
                     o->pack.eos >= 0 ? "--eos" : "--doc-ids");
    if (!o->dataset.path &&
        train_pack_check_opts(&o->pack, o->data_path != NULL, o->ids_path != NULL, pack_err,
                              sizeof pack_err))
        return error("%s", pack_err);
    return 0;
}

/* Under mpirun: this rank's options and files against rank 0's (train_dist_agree), before
 * anything depends on them; 0, or -1 after the one rank that differs has printed which.
 * Every field is one that, differing, would hang a collective or train another run than rank
 * 0's. Left out, as local to a rank or to what rank 0 alone writes: --threads and
 * OMP_NUM_THREADS (this machine's cores; another count changes only the last bits of this
 * rank's share), and the outputs that only rank 0 writes and main drops on the others: --save,
 * --save-safetensors, --merge-lora (what --save holds), --save-adapter, --save-pretrained and
 * its --tokenizer, --log, --keep-checkpoints (rank 0's pruning). --dump-grads is rank 0's file too, but whether it is
 * given changes step 1's sum under ZeRO 2 on every rank. Files are compared by size and
 * content, not by path (a model's external data files are known only once it is imported, and
 * are not among them); the checkpoint folders by path, as every rank reads --resume's and
 * bases its checkpoint decisions on --checkpoint-dir. */
static int dist_agree(const options *o, bool leaving)
{
    static const char *const scheds[] = {"constant", "linear", "cosine"};
    train_dist_digest g;
    char err[1024];
    train_dist_digest_init(&g);
    /* a rank that only prints --help or --version must not leave the others waiting */
    train_dist_digest_str(&g, "--help or --version", leaving ? "given" : NULL);
    if (leaving)
        return train_dist_agree(&dist, &g, err, sizeof err) ? error("%s", err) : 0;
    train_dist_digest_file(&g, "the step library", o->step_path);
    train_dist_digest_file(&g, "--model", o->model_path);
    train_dist_digest_file(&g, "--input-ids", o->ids_path);
    train_dist_digest_file(&g, "--labels", o->labels_path);
    train_dist_digest_file(&g, "--data", o->data_path);
    train_dist_digest_file(&g, "--dataset", o->dataset.path);
    train_dist_digest_file(&g, "--ref-logps", o->ref_logps);
    train_dist_digest_file(&g, "--old-logps", o->old_logps);
    train_dist_digest_file(&g, "--advantages", o->advantages);
    train_dist_digest_file(&g, "--doc-ids", o->pack.doc_ids);
    train_dist_digest_file(&g, "--eval-data", o->eval.data);
    train_dist_digest_file(&g, "--eval-dataset", o->eval.dataset);
    train_dist_digest_int(&g, "--steps", o->steps);
    train_dist_digest_int(&g, "--epochs", o->dataset.epochs);
    if (o->dataset.shuffle)
        train_dist_digest_int(&g, "--shuffle-seed", (int64_t)o->dataset.seed);
    else
        train_dist_digest_str(&g, "--shuffle-seed", NULL);
    train_dist_digest_real(&g, "--lr", o->lr);
    train_dist_digest_str(&g, "--optimizer", o->adamw ? "adamw" : "sgd");
    train_dist_digest_real(&g, "--weight-decay", o->weight_decay);
    train_dist_digest_int(&g, "--grad-accum", o->grad_accum);
    train_dist_digest_int(&g, "--zero", o->zero);
    train_dist_digest_str(&g, "--lr-schedule", o->sched.kind >= 0 && o->sched.kind < 3
                                                   ? scheds[o->sched.kind] : "?");
    train_dist_digest_int(&g, "--warmup-steps", o->sched.warmup);
    if (o->sched.min_lr_set)
        train_dist_digest_real(&g, "--min-lr", o->sched.min_lr);
    else
        train_dist_digest_str(&g, "--min-lr", NULL);
    train_dist_digest_real(&g, "--clip-grad-norm", o->sched.clip);
    train_dist_digest_str(&g, "--checkpoint-dir", o->ckpt.dir);
    train_dist_digest_int(&g, "--checkpoint-every", o->ckpt.every);
    train_dist_digest_str(&g, "--resume", o->ckpt.resume);
    train_dist_digest_str(&g, "--pack", o->pack.pack ? "given" : NULL);
    train_dist_digest_int(&g, "--eos", o->pack.eos);
    train_dist_digest_int(&g, "--eval-every", o->eval.every);
    train_dist_digest_int(&g, "--eval-batches", o->eval.batches);
    train_dist_digest_str(&g, "--dump-grads", o->dump_grads ? "given" : NULL);
    if (train_dist_agree(&dist, &g, err, sizeof err))
        return error("%s", err);
    return 0;
}

/* ------------------------------------------------------------------ formatting helpers */

static char *shape_str(char *buf, size_t n, int rank, const int64_t *dims)
{
    size_t k = (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < rank && k < n; i++)
        k += (size_t)snprintf(buf + k, n - k, "%s%lld", i ? "," : "", (long long)dims[i]);
    if (k < n)
        snprintf(buf + k, n - k, "]");
    return buf;
}

/* NumPy's name for an element type, for messages about .npy files. */
static const char *numpy_name(sbpio_dtype t)
{
    switch (t) {
    case SBPIO_DT_BOOL: return "bool";
    case SBPIO_DT_U8: return "uint8";
    case SBPIO_DT_I8: return "int8";
    case SBPIO_DT_U16: return "uint16";
    case SBPIO_DT_I16: return "int16";
    case SBPIO_DT_U32: return "uint32";
    case SBPIO_DT_I32: return "int32";
    case SBPIO_DT_U64: return "uint64";
    case SBPIO_DT_I64: return "int64";
    case SBPIO_DT_F16: return "float16";
    case SBPIO_DT_BF16: return "bfloat16";
    case SBPIO_DT_F32: return "float32";
    case SBPIO_DT_F64: return "float64";
    default: return "an unknown type";
    }
}

/* The shortest decimal form of x that reads back as x (as Python's repr), at least 9
 * significant digits so a float32 loss also survives the trip. */
static void repr_double(char *buf, size_t n, double x)
{
    for (int prec = 9; prec <= 17; prec++) {
        snprintf(buf, n, "%.*g", prec, x);
        if (strtod(buf, NULL) == x)
            return;
    }
}

static double now_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ------------------------------------------------------------------ the step library */

typedef int (*step_run_fn)(sbprt_ctx *, const sbp_step_args *);
typedef const sbp_step_info *(*step_info_fn)(void);

/* The runtime functions this program calls, each with the context it must be given.
 *
 * A step links libsbprt in, so two copies of the runtime may be at hand: the step's and the
 * one linked into this program. A context is only ever passed to functions of the copy that
 * made it: when the step exports sbprt_ctx_create, `step_ctx` is made by the step's copy and
 * every function the step also exports is taken from it; functions it does not export (a
 * static link keeps only what the step calls, typically not the optimizers) come from this
 * program's copy with a context of their own, `own_ctx`. Both copies then share memory, so
 * that is only allowed when the step's backend is this program's (the CPU). */
typedef struct runtime {
    const char *(*status_string)(int);
    const char *(*backend_name)(void);
    int (*ctx_create)(sbprt_ctx **, int);
    void (*ctx_destroy)(sbprt_ctx *);
    int (*sync)(sbprt_ctx *);
    int (*arena_alloc)(sbprt_ctx *, void **, size_t);
    void (*arena_free)(sbprt_ctx *, void *);
    int (*copy)(sbprt_ctx *, void *, const void *, size_t, int);
    int (*sgd_update)(sbprt_ctx *, float *, const float *, size_t, double, double);
    int (*adamw_update)(sbprt_ctx *, float *, float *, float *, const float *, size_t, double,
                        double, double, double, double, int);
    /* the gradient norm and clipping (train_sched.h) */
    int (*grad_sq_norm)(sbprt_ctx *, double *, const float *, size_t);
    int (*scale)(sbprt_ctx *, float *, const float *, size_t, float);
    /* the step's copy when it made the context (else ours): diagnostics and memory figures */
    const char *(*last_error)(const sbprt_ctx *);
    int (*device_memory)(sbprt_ctx *, size_t *, size_t *);
    int (*ctx_nthreads)(const sbprt_ctx *); /* the step's copy, ours, or NULL (not exported) */
    /* the step's sbp_step_init / sbp_step_release (codegen/sbp_step.h), or NULL (older steps) */
    int (*step_init)(sbprt_ctx *);
    void (*step_release)(sbprt_ctx *);
    /* which context each group of functions takes: &step_ctx or &own_ctx */
    sbprt_ctx **sync_ctx, **arena_ctx, **copy_ctx, **sgd_ctx, **adamw_ctx;
    sbprt_ctx **norm_ctx, **scale_ctx;
    sbprt_ctx *step_ctx;     /* made by ctx_create; the one sbp_step_run gets */
    sbprt_ctx *own_ctx;      /* made by this program's runtime, or NULL when not needed */
    bool ctx_from_step;      /* ctx_create/ctx_destroy are the step's */
    const char *own_missing; /* a function the step does not export, or NULL */
} runtime;

/* Calls runtime function fn with the context it belongs with. */
#define RT(rt, fn, ctxf, ...) ((rt).fn(*(rt).ctxf, __VA_ARGS__))

/* Fills rt: from the step library where it can (see above), else from the linked runtime.
 * `target` is the step's; a step for another backend than the linked one must export all. */
static int runtime_load(runtime *rt, void *lib, const char *step_path, const char *target)
{
    memset(rt, 0, sizeof *rt);
    void *create = dlsym(lib, "sbprt_ctx_create"), *destroy = dlsym(lib, "sbprt_ctx_destroy");
    rt->ctx_from_step = create && destroy;
    if (rt->ctx_from_step) {
        *(void **)(&rt->ctx_create) = create;
        *(void **)(&rt->ctx_destroy) = destroy;
    } else {
        rt->ctx_create = sbprt_ctx_create;
        rt->ctx_destroy = sbprt_ctx_destroy;
    }
    /* A function from the step when the step made the context and exports it; else ours. */
#define RT_PICK(field, fn, ctxf)                                                                  \
    do {                                                                                          \
        void *p_ = rt->ctx_from_step ? dlsym(lib, #fn) : NULL;                                    \
        if (p_) {                                                                                 \
            *(void **)(&rt->field) = p_;                                                          \
            rt->ctxf = &rt->step_ctx;                                                             \
        } else {                                                                                  \
            rt->field = fn;                                                                       \
            rt->ctxf = &rt->own_ctx;                                                              \
            if (!rt->own_missing)                                                                 \
                rt->own_missing = #fn;                                                            \
        }                                                                                         \
    } while (0)
    RT_PICK(sync, sbprt_sync, sync_ctx);
    RT_PICK(copy, sbprt_memcpy, copy_ctx);
    RT_PICK(sgd_update, sbprt_sgd_update, sgd_ctx);
    RT_PICK(adamw_update, sbprt_adamw_update, adamw_ctx);
    RT_PICK(grad_sq_norm, sbprt_grad_sq_norm, norm_ctx);
    RT_PICK(scale, sbprt_scale, scale_ctx);
    RT_PICK(arena_alloc, sbprt_arena_alloc, arena_ctx);
#undef RT_PICK
    /* alloc and free must be one copy's pair */
    void *afree = rt->arena_ctx == &rt->step_ctx ? dlsym(lib, "sbprt_arena_free") : NULL;
    if (afree) {
        *(void **)(&rt->arena_free) = afree;
    } else {
        rt->arena_alloc = sbprt_arena_alloc;
        rt->arena_free = sbprt_arena_free;
        rt->arena_ctx = &rt->own_ctx;
    }
    void *last = rt->ctx_from_step ? dlsym(lib, "sbprt_ctx_last_error") : NULL;
    void *mem = rt->ctx_from_step ? dlsym(lib, "sbprt_device_memory") : NULL;
    if (last)
        *(void **)(&rt->last_error) = last;
    else
        rt->last_error = sbprt_ctx_last_error;
    void *nth = rt->ctx_from_step ? dlsym(lib, "sbprt_ctx_nthreads") : NULL;
    if (nth)
        *(void **)(&rt->ctx_nthreads) = nth;
    else if (!rt->ctx_from_step)
        rt->ctx_nthreads = sbprt_ctx_nthreads;
    if (mem)
        *(void **)(&rt->device_memory) = mem;
    else if (!rt->ctx_from_step)
        rt->device_memory = sbprt_device_memory;
    *(void **)(&rt->step_init) = dlsym(lib, "sbp_step_init");
    *(void **)(&rt->step_release) = dlsym(lib, "sbp_step_release");
    void *name = rt->ctx_from_step ? dlsym(lib, "sbprt_backend_name") : NULL;
    void *status = dlsym(lib, "sbprt_status_string");
    if (name)
        *(void **)(&rt->backend_name) = name;
    else
        rt->backend_name = sbprt_backend_name;
    if (status)
        *(void **)(&rt->status_string) = status;
    else
        rt->status_string = sbprt_status_string;

    bool foreign = target && strcmp(target, sbprt_backend_name()) != 0;
    if (foreign && (!rt->ctx_from_step || rt->own_missing || rt->arena_ctx == &rt->own_ctx))
        return error("%s was compiled for the '%s' backend but does not export %s, and this "
                     "sbp-train's own runtime is '%s'", step_path, target,
                     !rt->ctx_from_step ? "sbprt_ctx_create"
                     : rt->own_missing  ? rt->own_missing
                                        : "sbprt_arena_free",
                     sbprt_backend_name());
    return 0;
}

/* Creates the contexts: the step's, and ours where some function comes from our runtime. */
static int runtime_start(runtime *rt, int nthreads)
{
    int st = rt->ctx_create(&rt->step_ctx, nthreads);
    if (st) {
        const char *why = rt->last_error(NULL);
        return error("cannot create a %s runtime context: %s%s%s", rt->backend_name(),
                     rt->status_string(st), why && *why ? ": " : "", why ? why : "");
    }
    if (!rt->ctx_from_step) {
        rt->own_ctx = rt->step_ctx; /* one copy, one context */
        return 0;
    }
    bool need_own = rt->sync_ctx == &rt->own_ctx || rt->copy_ctx == &rt->own_ctx ||
                    rt->sgd_ctx == &rt->own_ctx || rt->adamw_ctx == &rt->own_ctx ||
                    rt->arena_ctx == &rt->own_ctx || rt->norm_ctx == &rt->own_ctx ||
                    rt->scale_ctx == &rt->own_ctx;
    if (need_own && (st = sbprt_ctx_create(&rt->own_ctx, nthreads)))
        return error("cannot create a runtime context: %s", sbprt_status_string(st));
    return 0;
}

/* The CPU threads a cpu step's reductions are split over (what makes its results bit for bit
 * reproducible only at the same count), or 0 for another target or when the step does not say. */
static int step_threads(const sbp_step_info *in, const runtime *rt, int64_t asked)
{
    if (!in->target || strcmp(in->target, "cpu") != 0)
        return 0;
    int n = rt->ctx_nthreads ? rt->ctx_nthreads(rt->step_ctx) : 0;
    return n > 0 ? n : (int)asked;
}

/* "; <the runtime's diagnostic>" for a failure on ctx, or "" when it recorded none. */
static const char *rt_why(const runtime *rt, sbprt_ctx *ctx, char *buf, size_t n)
{
    const char *why = rt->last_error ? rt->last_error(ctx) : NULL;
    if (!why || !*why)
        return "";
    snprintf(buf, n, " (%s)", why);
    return buf;
}

static void runtime_stop(runtime *rt)
{
    if (rt->step_ctx && rt->step_release)
        rt->step_release(rt->step_ctx); /* the step's device copies of its constants */
    if (rt->own_ctx && rt->own_ctx != rt->step_ctx)
        sbprt_ctx_destroy(rt->own_ctx);
    if (rt->step_ctx)
        rt->ctx_destroy(rt->step_ctx);
    rt->own_ctx = rt->step_ctx = NULL;
}

/* Checks that the step's self-description is usable: positive dims whose products fit the
 * runtime's int sizes, and a parameter table whose shapes, offsets and ties are consistent. */
static int validate_info(const sbp_step_info *in, const char *step_path)
{
    const char *bad = "the step's self-description is inconsistent";
    if (in->batch < 1 || in->seq_len < 1 || in->vocab < 1 || in->batch > INT32_MAX ||
        in->seq_len > INT32_MAX || in->vocab > INT32_MAX ||
        in->batch * in->seq_len > INT32_MAX)
        return error("%s: %s: batch %lld, sequence length %lld, vocabulary %lld", step_path, bad,
                     (long long)in->batch, (long long)in->seq_len, (long long)in->vocab);
    if (in->n_params < 0 || (in->n_params > 0 && !in->params))
        return error("%s: %s: %d parameters but no table", step_path, bad, in->n_params);
    if (in->param_elems > SIZE_MAX / 16 || in->workspace_bytes > SIZE_MAX / 4 ||
        in->grad_elems > in->param_elems)
        return error("%s: %s: absurd block sizes", step_path, bad);
    for (int i = 0; i < in->n_params; i++) {
        const sbp_step_param *p = &in->params[i];
        if (!p->name || !p->name[0])
            return error("%s: %s: parameter %d has no name", step_path, bad, i);
        if (p->rank < 0 || p->rank > SBP_STEP_MAX_RANK)
            return error("%s: %s: parameter '%s' has rank %d", step_path, bad, p->name, p->rank);
        size_t numel = 1;
        for (int d = 0; d < p->rank; d++) {
            if (p->dims[d] < 0 || (p->dims[d] > 0 && numel > SIZE_MAX / 16 / (size_t)p->dims[d]))
                return error("%s: %s: parameter '%s' has a bad dimension %lld", step_path, bad,
                             p->name, (long long)p->dims[d]);
            numel *= (size_t)p->dims[d];
        }
        if (numel != p->numel)
            return error("%s: %s: parameter '%s' has numel %zu, but its shape holds %zu",
                         step_path, bad, p->name, p->numel, numel);
        for (int j = 0; j < i; j++)
            if (strcmp(in->params[j].name, p->name) == 0)
                return error("%s: %s: parameter '%s' is listed twice", step_path, bad, p->name);
        if (p->tied_to >= 0) {
            const sbp_step_param *o = p->tied_to < in->n_params ? &in->params[p->tied_to] : NULL;
            if (!o || p->tied_to == i || o->tied_to >= 0 || o->rank != 2 || p->rank != 2 ||
                o->dims[0] != p->dims[1] || o->dims[1] != p->dims[0])
                return error("%s: %s: parameter '%s' is tied to %d, which is not a parameter "
                             "whose transpose has its shape", step_path, bad, p->name,
                             p->tied_to);
        } else if (p->tied_to != -1 || p->offset > in->param_elems ||
                   sbp_step_param_room(p) > in->param_elems - p->offset) {
            return error("%s: %s: parameter '%s' (offset %zu, %zu elements) lies outside the "
                         "parameter block of %zu elements", step_path, bad, p->name, p->offset,
                         p->numel, in->param_elems);
        }
        /* a weight kept as bf16 (--base-precision bf16) is frozen and has storage */
        if (p->storage != SBP_STEP_PARAM_F32 &&
            (p->storage != SBP_STEP_PARAM_BF16 || p->trainable || p->tied_to >= 0))
            return error("%s: %s: parameter '%s' has storage %d (0: fp32, 1: bf16 for a frozen "
                         "weight with storage of its own)", step_path, bad, p->name, p->storage);
        /* the gradient block: a trained parameter's slice inside it, none for a frozen one (a
         * tied copy shares its owner's) */
        const sbp_step_param *own = p->tied_to >= 0 ? &in->params[p->tied_to] : p;
        if (own->trainable != p->trainable || p->grad_offset != own->grad_offset ||
            (p->trainable ? p->grad_offset > in->grad_elems ||
                                own->numel > in->grad_elems - p->grad_offset
                          : p->grad_offset != SIZE_MAX))
            return error("%s: %s: parameter '%s' (%s, gradient offset %zu) does not fit the "
                         "gradient block of %zu elements", step_path, bad, p->name,
                         p->trainable ? "trained" : "frozen", p->grad_offset, in->grad_elems);
    }
    return 0;
}

/* ------------------------------------------------------------------ the model */

/* The model's value for step parameter p, checked: a float32 initializer of p's shape. NULL
 * (with a message when `report`) when it does not match. */
static const ir_value *match_param(const ir_graph *g, const sbp_step_param *p, const char *model,
                                   const char *step, bool report)
{
    char want[256], have[256];
    const ir_value *v = ir_value_find(g, p->name);
    if (!v || (v->kind != IR_VAL_PARAM && v->kind != IR_VAL_CONST)) {
        mismatch(report, "%s does not match %s: the step's parameter '%s' is not an initializer "
                 "of the model", model, step, p->name);
        return NULL;
    }
    if (v->dtype != IR_DT_FLOAT) {
        mismatch(report, "%s does not match %s: initializer '%s' is %s, but the step trains it "
                 "as f32", model, step, p->name, ir_dtype_name(v->dtype));
        return NULL;
    }
    bool same = v->rank == p->rank;
    int64_t vd[IR_MAX_RANK];
    for (int d = 0; d < v->rank && d < IR_MAX_RANK; d++) {
        vd[d] = v->dims[d].value;
        same = same && vd[d] == p->dims[d];
    }
    if (!same) {
        mismatch(report, "%s does not match %s: initializer '%s' has shape %s but the step was "
                 "compiled for %s", model, step, p->name,
                 shape_str(have, sizeof have, v->rank < 0 ? 0 : v->rank, vd),
                 shape_str(want, sizeof want, p->rank, p->dims));
        return NULL;
    }
    /* A re-tied copy has no storage in the step: its data is only compared with its owner's. */
    if ((!v->data || v->nbytes != p->numel * sizeof(float)) && p->tied_to < 0) {
        mismatch(report, "%s: initializer '%s' has no data (%zu bytes for %zu floats)", model,
                 p->name, v->nbytes, p->numel);
        return NULL;
    }
    return v;
}

/* ------------------------------------------------------------------ files of the run */

/* Every file this run reads, by identity (paths that do not exist are left to their readers). */
static int collect_inputs(const options *o, sbp_file_set *inputs)
{
    const struct {
        const char *path, *role;
    } in[] = {{o->step_path, "the step library"}, {o->model_path, "the model (--model)"},
              {o->ids_path, "--input-ids"},      {o->labels_path, "--labels"},
              {o->data_path, "--data"},          {o->ref_logps, "--ref-logps"},
              {o->old_logps, "--old-logps"},     {o->advantages, "--advantages"},
              {o->pack.doc_ids, "--doc-ids"},
              {o->eval.data, "--eval-data"},
              {o->dataset.path, "--dataset"},    {o->eval.dataset, "--eval-dataset"}};
    for (size_t i = 0; i < sizeof in / sizeof in[0]; i++)
        if (in[i].path && sbp_file_set_add(inputs, in[i].path, in[i].role, NULL) != SBP_FILE_OK)
            return error("out of memory");
    return 0;
}

/* Every file the run will write (train_outputs.h): none may replace an input, a special file
 * or another output, and each must be writable, all before step 1 (a run that cannot write
 * its result finds out now, not after training). */
static int check_outputs(const options *o, const train_pretrained *pre,
                         const sbp_file_set *inputs)
{
    static const char *const adapter_files[] = {"adapter_model.safetensors",
                                                "adapter_config.json"};
    const struct {
        const char *path, *role;
    } files[] = {{o->dump_grads, "--dump-grads"},
                 {o->save, "--save"},
                 {o->save_safetensors, "--save-safetensors"},
                 {o->sched.log_path, "--log"},
                 {o->compute_logps, "--compute-logps"},
                 {o->ref_cache, "--ref-cache"}};
    train_outputs reg;
    char err[1024];
    int rc = 0;
    train_outputs_init(&reg, inputs);
    for (size_t i = 0; i < sizeof files / sizeof files[0] && !rc; i++)
        if (files[i].path && train_outputs_file(&reg, files[i].path, files[i].role, err,
                                                sizeof err))
            rc = -1;
    if (!rc && o->adapter.save_dir &&
        train_outputs_dir(&reg, o->adapter.save_dir, "--save-adapter", adapter_files,
                          (int)(sizeof adapter_files / sizeof adapter_files[0]), err, sizeof err))
        rc = -1;
    if (!rc && o->pretrained.dir &&
        train_outputs_dir(&reg, o->pretrained.dir, "--save-pretrained", pre->names, pre->n_names,
                          err, sizeof err))
        rc = -1;
    const char *ckpt_dir = o->ckpt.dir ? o->ckpt.dir : o->ckpt.resume;
    if (!rc && ckpt_dir &&
        train_outputs_ckpt_dir(&reg, ckpt_dir, o->ckpt.dir ? "--checkpoint-dir" : "--resume",
                               err, sizeof err))
        rc = -1;
    train_outputs_free(&reg);
    return rc ? error("%s", err) : 0;
}

/* A shared object whose program headers or segments reach past its end (a truncated copy, a
 * build that was interrupted) makes dlopen map pages beyond the file, and the loader's first
 * touch of them is SIGBUS. So before dlopen: a regular file (opened without blocking), an ELF64
 * header of this machine's byte order, and the program header table, the section header table
 * and every PT_LOAD segment's file bytes inside the file. */
static int check_step_file(const char *path)
{
    char why[600];
    struct stat st;
    int fd = sbp_file_open_input(path, &st, why, sizeof why);
    if (fd < 0)
        return error("cannot load the step library %s", why);
    const uint64_t size = (uint64_t)st.st_size;
    Elf64_Ehdr eh;
    Elf64_Phdr *ph = NULL;
    const char *bad = NULL;
    char detail[200] = "";
    if (pread(fd, &eh, sizeof eh, 0) != (ssize_t)sizeof eh) {
        bad = "shorter than an ELF header";
    } else if (memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0) {
        bad = "not an ELF file";
    } else if (eh.e_ident[EI_CLASS] != ELFCLASS64 || eh.e_ident[EI_DATA] !=
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
                                                        ELFDATA2LSB
#else
                                                        ELFDATA2MSB
#endif
    ) {
        bad = "not a 64-bit ELF file of this machine's byte order";
    } else if (eh.e_phnum == 0 || eh.e_phentsize != sizeof(Elf64_Phdr)) {
        bad = "it has no program headers";
    } else if (eh.e_phoff > size || (uint64_t)eh.e_phnum * eh.e_phentsize > size - eh.e_phoff) {
        bad = "truncated: the program header table";
        snprintf(detail, sizeof detail, " (bytes %llu + %u x %u)", (unsigned long long)eh.e_phoff,
                 eh.e_phnum, eh.e_phentsize);
    } else if (eh.e_shoff != 0 && (eh.e_shoff > size || (uint64_t)eh.e_shnum * eh.e_shentsize >
                                                            size - eh.e_shoff)) {
        bad = "truncated: the section header table";
        snprintf(detail, sizeof detail, " (bytes %llu + %u x %u)", (unsigned long long)eh.e_shoff,
                 eh.e_shnum, eh.e_shentsize);
    } else if (!(ph = malloc((size_t)eh.e_phnum * sizeof *ph))) {
        bad = "out of memory";
    } else if (pread(fd, ph, (size_t)eh.e_phnum * sizeof *ph, (off_t)eh.e_phoff) !=
               (ssize_t)((size_t)eh.e_phnum * sizeof *ph)) {
        bad = "its program headers cannot be read";
    } else {
        for (int i = 0; i < eh.e_phnum && !bad; i++)
            if (ph[i].p_type == PT_LOAD &&
                (ph[i].p_filesz > size || ph[i].p_offset > size - ph[i].p_filesz)) {
                bad = "truncated: a loadable segment";
                snprintf(detail, sizeof detail, " (segment %d: bytes %llu + %llu)", i,
                         (unsigned long long)ph[i].p_offset, (unsigned long long)ph[i].p_filesz);
            }
    }
    free(ph);
    close(fd);
    if (bad && strncmp(bad, "truncated", 9) == 0)
        return error("cannot load the step library %s: %s%s reaches past the end of the "
                     "%llu-byte file", path, bad, detail, (unsigned long long)size);
    if (bad)
        return error("cannot load the step library %s: %s", path, bad);
    return 0;
}

/* The imported model and, for each step parameter, its initializer. */
typedef struct model {
    ir_diag diag;
    ir_graph *g;            /* owns the initializer data */
    const ir_value **vals;  /* [n_params] */
} model;

static void model_free(model *m)
{
    free(m->vals);
    ir_graph_free(m->g);
    ir_diag_free(&m->diag);
    memset(m, 0, sizeof *m);
}

/* Imports the model and checks it against the step. Every mismatch is reported, not only the
 * first. The files the import read (the model's external data) join `inputs`, and the outputs
 * are checked against them before any training. */
static int model_open(model *m, const options *o, const sbp_step_info *in,
                      const train_pretrained *pre, sbp_file_set *inputs)
{
    memset(m, 0, sizeof *m);
    ir_diag_init(&m->diag, o->model_path);
    m->g = ir_import_onnx(o->model_path, &m->diag, &(ir_import_options){.files = inputs});
    ir_diag_print(&m->diag, stderr, prog); /* errors, or warnings if any */
    if (!m->g || m->diag.n_errors)
        return error("cannot read the model %s", o->model_path);
    if (check_outputs(o, pre, inputs))
        return -1;
    char lora_err[512]; /* a LoRA step's adapters join the model's weights */
    if (train_adapter_init(m->g, in, &o->adapter, lora_err, sizeof lora_err) < 0)
        return error("%s", lora_err);
    int rc = 0;

    /* A model with fixed input dims must have the step's (a dynamic one may have any). Token
     * inputs are [B,T]; a leading 1 is let through, as position_ids are often [1,T]. */
    for (int i = 0; i < m->g->n_inputs; i++) {
        const ir_value *x = m->g->inputs[i];
        if (!ir_dtype_is_int(x->dtype) || x->rank != 2)
            continue;
        int64_t want[2] = {in->batch, in->seq_len}, have[2];
        bool clash = false;
        for (int d = 0; d < 2; d++) {
            have[d] = x->dims[d].value;
            clash |= !x->dims[d].sym && have[d] >= 0 && have[d] != want[d] &&
                     !(d == 0 && have[d] == 1);
        }
        if (clash) {
            char hs[64], ws[64];
            rc = error("%s does not match %s: its input '%s' has the fixed shape %s, but the "
                       "step was compiled for batch %lld and sequence length %lld (%s)",
                       o->model_path, o->step_path, x->name, shape_str(hs, sizeof hs, 2, have),
                       (long long)in->batch, (long long)in->seq_len,
                       shape_str(ws, sizeof ws, 2, want));
        }
    }

    m->vals = calloc((size_t)in->n_params + 1, sizeof *m->vals);
    if (!m->vals)
        return error("out of memory");
    enum { MAX_REPORTED = 8 }; /* a wholly different model would list every parameter */
    int bad = 0;
    for (int i = 0; i < in->n_params; i++)
        if (!(m->vals[i] = match_param(m->g, &in->params[i], o->model_path, o->step_path,
                                       bad < MAX_REPORTED)))
            bad++;
    if (bad > MAX_REPORTED)
        error("... and %d more of the step's %d parameters do not match", bad - MAX_REPORTED,
              in->n_params);
    if (bad && in->model_path)
        message("note", "%s was compiled from %s", o->step_path, in->model_path);
    return bad ? -1 : rc;
}

/* Copies the model's weights into the parameter block (host memory, [param_elems]); warns
 * where a re-tied copy in the file is not the transpose of its owner. */
static void model_copy_weights(const model *m, const options *o, const sbp_step_info *in,
                               float *params)
{
    for (int i = 0; i < in->n_params; i++) {
        const sbp_step_param *p = &in->params[i];
        if (p->tied_to < 0) { /* rounded to bf16 where the step keeps it so */
            sbp_step_param_store(p, params, m->vals[i]->data);
            continue;
        }
        const sbp_step_param *own = &in->params[p->tied_to];
        const float *mine = m->vals[i]->data, *owner = m->vals[p->tied_to]->data;
        int64_t r = own->dims[0], c = own->dims[1];
        bool transposed = mine && m->vals[i]->nbytes == p->numel * sizeof(float);
        for (int64_t a = 0; a < r && transposed; a++)
            for (int64_t b = 0; b < c; b++)
                if (memcmp(&mine[b * r + a], &owner[a * c + b], sizeof(float)) != 0) {
                    transposed = false;
                    break;
                }
        if (!transposed)
            message("warning", "%s: initializer '%s' is not the transpose of '%s', but %s ties "
                    "them: training starts from '%s' and '%s' follows it", o->model_path,
                    p->name, own->name, o->step_path, own->name, p->name);
    }
}

/* ------------------------------------------------------------------ inputs */

/* Reads token ids or labels [K*B,T] (K micro-batches) from a .npy file into out, checking
 * dtype, shape and range; `pairs` (DPO): the rows must pair up. */
static int load_tokens(const char *path, bool labels, const sbp_step_info *in,
                       const char *step_path, int64_t k, bool pairs, int32_t *out)
{
    const char *what = labels ? "labels" : "input_ids";
    char err[512];
    sbpio_array a;
    if (sbpio_npy_read(path, &a, err, sizeof err) != SBPIO_OK)
        return error("%s", err);
    int rc = 0;
    if (a.dtype != SBPIO_DT_I32 && a.dtype != SBPIO_DT_I64) {
        rc = error("%s: %s must be int32 or int64, but the file holds %s", path, what,
                   numpy_name(a.dtype));
    } else if (pairs && a.rank == 2 && a.shape[0] % 2 != 0) {
        rc = error("%s: %s have %lld rows, an odd number: the step's objective is dpo, which "
                   "pairs row i (chosen) with row N/2 + i (rejected)", path, what,
                   (long long)a.shape[0]);
    } else if (a.rank != 2 || a.shape[0] != k * in->batch || a.shape[1] != in->seq_len) {
        char hs[256], ws[64], acc[96] = "";
        int64_t want[2] = {k * in->batch, in->seq_len};
        if (k > 1)
            snprintf(acc, sizeof acc, " times --grad-accum %lld", (long long)k);
        rc = error("%s: %s have shape %s, but %s was compiled for batch %lld%s and sequence "
                   "length %lld (%s): pass inputs of that shape or recompile the step with "
                   "sbpc --batch and --seq-len", path, what,
                   shape_str(hs, sizeof hs, a.rank, a.shape), step_path, (long long)in->batch,
                   acc, (long long)in->seq_len, shape_str(ws, sizeof ws, 2, want));
    } else {
        for (int64_t i = 0; i < a.numel && rc == 0; i++) {
            int64_t v = a.dtype == SBPIO_DT_I32 ? ((const int32_t *)a.data)[i]
                                                : ((const int64_t *)a.data)[i];
            long long b = (long long)(i / in->seq_len), t = (long long)(i % in->seq_len);
            if (labels && v != SBPRT_IGNORE_INDEX && (v < 0 || v >= in->vocab))
                rc = error("%s: labels[%lld,%lld] = %lld is neither a token id in [0, %lld) nor "
                           "-100 (not scored)", path, b, t, (long long)v, (long long)in->vocab);
            else if (!labels && (v < 0 || v >= in->vocab))
                rc = error("%s: input_ids[%lld,%lld] = %lld is out of range: %s was compiled for "
                           "a vocabulary of %lld tokens (ids 0 to %lld)", path, b, t,
                           (long long)v, step_path, (long long)in->vocab,
                           (long long)in->vocab - 1);
            else
                out[i] = (int32_t)v;
        }
    }
    sbpio_array_free(&a);
    return rc;
}

/* ------------------------------------------------------------------ outputs */

/* Host copies of the gradient or weight of every parameter in its own layout: the block's
 * slice for a parameter with storage, the owner's transposed for a re-tied one. `bufs` gets
 * the copies made (to free); data[i] points at parameter i's values. grads: the block is the
 * gradient block (slices at grad_offset; a frozen parameter, which has none, gets zeros). */
static int gather_views(const sbp_step_info *in, const float *block, bool grads,
                        const float **data, float **bufs)
{
    for (int i = 0; i < in->n_params; i++) {
        const sbp_step_param *p = &in->params[i];
        const sbp_step_param *own = p->tied_to < 0 ? p : &in->params[p->tied_to];
        size_t off = grads ? own->grad_offset : own->offset;
        bufs[i] = NULL;
        if (grads && off == SIZE_MAX) { /* not trained: its gradient is zero */
            if (!(bufs[i] = calloc(p->numel + 1, sizeof(float))))
                return error("out of memory");
            data[i] = bufs[i];
            continue;
        }
        if (p->tied_to < 0) {
            data[i] = block + off;
            continue;
        }
        int64_t r = own->dims[0], c = own->dims[1];
        const float *src = block + off;
        float *t = malloc(p->numel * sizeof(float) + 1);
        if (!t)
            return error("out of memory");
        for (int64_t a = 0; a < r; a++)
            for (int64_t b = 0; b < c; b++)
                t[b * r + a] = src[a * c + b];
        bufs[i] = t;
        data[i] = t;
    }
    return 0;
}

static int dump_grads(const options *o, const sbp_step_info *in, const float *grads, double loss)
{
    int n = in->n_params, rc = 0;
    const float **data = calloc((size_t)n + 1, sizeof *data);
    float **bufs = calloc((size_t)n + 1, sizeof *bufs);
    sbpio_st_tensor *ts = calloc((size_t)n + 1, sizeof *ts);
    if (!data || !bufs || !ts) {
        rc = error("out of memory");
        goto out;
    }
    if ((rc = gather_views(in, grads, true, data, bufs)))
        goto out;
    for (int i = 0; i < n; i++)
        ts[i] = (sbpio_st_tensor){.name = in->params[i].name, .dtype = SBPIO_DT_F32,
                                  .rank = in->params[i].rank, .shape = in->params[i].dims,
                                  .data = data[i]};
    char loss_s[64], err[512];
    repr_double(loss_s, sizeof loss_s, loss);
    sbpio_kv meta[] = {{"format", "pt"}, {"loss", loss_s}, {"step", "1"},
                       {"producer", "sbp-train"}};
    if (sbpio_st_write(o->dump_grads, n, ts, (int)(sizeof meta / sizeof meta[0]), meta, false,
                       err, sizeof err) != SBPIO_OK)
        rc = error("--dump-grads: %s", err);
out:
    for (int i = 0; bufs && i < n; i++)
        free(bufs[i]);
    free(bufs);
    free(data);
    free(ts);
    return rc;
}

/* The parameter table and block with every parameter in fp32, for the writers
 * (--save, --merge-lora, --save-safetensors, --save-adapter), which index the block by
 * parameter offset. A step with a weight kept as bf16 (--base-precision bf16) gets a copy laid
 * out as an fp32 step's; its bf16 weights, frozen, get the model file's own fp32 values (read
 * once more), which is what the step started from and what a step with fp32 base weights
 * writes: the bf16 values are only the step's rounding of them. Any other step is used as is. */
typedef struct f32_view {
    sbp_step_info info;      /* the step's, with params and param_elems of the copy */
    sbp_step_param *params;  /* [n_params], or NULL: the step's own table and block */
    float *block;            /* [info.param_elems], or NULL */
} f32_view;

static void f32_view_free(f32_view *v);

static int f32_view_make(const options *o, const sbp_step_info *in, const float *block,
                         f32_view *v)
{
    v->info = *in;
    v->params = NULL;
    v->block = NULL;
    bool any = false;
    for (int i = 0; i < in->n_params; i++)
        any |= in->params[i].storage == SBP_STEP_PARAM_BF16;
    if (!any)
        return 0;
    if (!(v->params = malloc(sizeof *v->params * (size_t)in->n_params)))
        return error("out of memory");
    size_t off = 0;
    for (int i = 0; i < in->n_params; i++) {
        v->params[i] = in->params[i];
        v->params[i].storage = SBP_STEP_PARAM_F32;
        if (in->params[i].tied_to < 0) {
            v->params[i].offset = off;
            off += in->params[i].numel;
        }
    }
    for (int i = 0; i < in->n_params; i++)
        if (in->params[i].tied_to >= 0)
            v->params[i].offset = v->params[in->params[i].tied_to].offset;
    v->info.params = v->params;
    v->info.param_elems = off;
    if (!(v->block = malloc(off * sizeof(float) + 1))) {
        f32_view_free(v);
        return error("out of memory");
    }
    ir_diag diag;
    ir_diag_init(&diag, o->model_path);
    ir_graph *g = ir_import_onnx(o->model_path, &diag, NULL);
    int rc = 0;
    if (!g || diag.n_errors) {
        ir_diag_print(&diag, stderr, prog);
        rc = error("cannot read the model %s again for its full-precision frozen weights",
                   o->model_path);
    }
    for (int i = 0; rc == 0 && i < in->n_params; i++) {
        const sbp_step_param *p = &in->params[i];
        if (p->tied_to >= 0)
            continue;
        if (p->storage == SBP_STEP_PARAM_F32) {
            sbp_step_param_fetch(p, block, v->block + v->params[i].offset);
            continue;
        }
        const ir_value *x = match_param(g, p, o->model_path, o->step_path, true);
        if (!x)
            rc = -1;
        else
            memcpy(v->block + v->params[i].offset, x->data, p->numel * sizeof(float));
    }
    ir_graph_free(g);
    ir_diag_free(&diag);
    if (rc)
        f32_view_free(v);
    return rc;
}

static void f32_view_free(f32_view *v)
{
    free(v->params);
    free(v->block);
    v->params = NULL;
    v->block = NULL;
}

/* --save: the ONNX copy with the block's weights (in, params: the fp32 view, f32_view). */
static int save_model(const options *o, const sbp_step_info *in, const float *params)
{
    int n = in->n_params, rc = 0;
    const float **data = calloc((size_t)n + 1, sizeof *data);
    float **bufs = calloc((size_t)n + 1, sizeof *bufs);
    const char **names = calloc((size_t)n + 1, sizeof *names);
    if (!data || !bufs || !names) {
        rc = error("out of memory");
        goto out;
    }
    if ((rc = gather_views(in, params, false, data, bufs)))
        goto out;
    int k = 0; /* a LoRA step's adapters are not the model's (--merge-lora) */
    for (int i = 0; i < n; i++)
        if (!train_adapter_is_adapter(in->params[i].name)) {
            names[k] = in->params[i].name;
            data[k++] = data[i];
        }
    char err[512];
    if (sbpio_onnx_save_with_weights(o->model_path, o->save, k, names, data, err, sizeof err) !=
        SBPIO_OK)
        rc = error("--save: %s", err);
out:
    for (int i = 0; bufs && i < n; i++)
        free(bufs[i]);
    free(bufs);
    free(data);
    free(names);
    return rc;
}

/* ------------------------------------------------------------------ progress */

/* The ETA is the mean step time of this process (train_progress.h says why):
 * run_loop sets when its first step started and which step that was. */
static double bar_t0;
static int64_t bar_first = 1;

static void draw_bar(int64_t s, int64_t total, double loss, double tps)
{
    char line[256];
    const double eta = train_progress_eta(s, total, s - bar_first + 1, now_seconds() - bar_t0);
    train_progress_format(line, sizeof line, s, total, loss, tps, eta);
    fprintf(stderr, "\r\033[K%s", line);
    fflush(stderr);
    bar_shown = true;
}

/* ------------------------------------------------------------------ helpers of the run */

static size_t align_up(size_t n) { return (n + SBPRT_ALIGN - 1) / SBPRT_ALIGN * SBPRT_ALIGN; }

static void note_message(const char *msg) { message("note", "%s", msg); }

/* After an arena of `asked` bytes did not fit on a device that had free_bytes free: the
 * --memory-budget (sbpc's planned peak: parameters + gradients + workspace) that would fit,
 * keeping the optimizer state, the ids and labels, and some headroom (the step's constants,
 * the runtime's scratch, cuBLAS's workspace: 5% of the free memory, at least 256 MiB or a
 * quarter of it) out. */
static void fit_advice(const sbp_step_info *in, size_t asked, size_t free_bytes, bool adamw)
{
    /* parameters + gradients (the trained parameters' only) */
    const size_t pgbytes = (in->param_elems + in->grad_elems) * sizeof(float);
    const size_t rest = asked - in->workspace_bytes - pgbytes; /* optimizer, ids, labels */
    const size_t least = free_bytes / 4 < ((size_t)256 << 20) ? free_bytes / 4
                                                               : ((size_t)256 << 20);
    const size_t headroom = free_bytes / 20 > least ? free_bytes / 20 : least;
    char b1[32], b2[32], b3[32], b4[32];
    if (pgbytes + rest + headroom >= free_bytes) {
        message("note", "the device has %s free, and the parameters, gradients%s alone take %s: "
                "this model does not fit on it%s", cli_human_bytes(b1, sizeof b1, (double)free_bytes),
                adamw ? " and AdamW state" : "",
                cli_human_bytes(b2, sizeof b2, (double)(pgbytes + rest)),
                adamw ? " with AdamW (--optimizer sgd keeps no optimizer state)" : "");
        return;
    }
    const size_t budget = free_bytes - headroom - rest;
    const int shift = budget >= ((size_t)64 << 20) ? 20 : budget >= ((size_t)64 << 10) ? 10 : 0;
    message("note", "the device has %s free; the step plans %s (parameters, gradients and a "
            "workspace of %s) and needs %s more for %s: a step planned within %zu bytes would "
            "fit: recompile it with sbpc --memory-budget %zu%s (the stream strategy picks the "
            "largest chunks that fit)", cli_human_bytes(b1, sizeof b1, (double)free_bytes),
            cli_human_bytes(b2, sizeof b2, (double)in->planned_peak_bytes),
            cli_human_bytes(b3, sizeof b3, (double)in->workspace_bytes),
            cli_human_bytes(b4, sizeof b4, (double)rest),
            adamw ? "AdamW state, ids and labels" : "ids and labels", budget, budget >> shift,
            shift == 20 ? "M" : shift == 10 ? "K" : "");
}

/* ------------------------------------------------------------------ the run */

/* Everything one run holds, filled in order by its phases: run_load (the step, the token data,
 * the runtime, the model), run_allocate (the arena and the initial weights), run_loop (the
 * steps) and run_report (the outputs and the memory figures); run_free releases it, whichever
 * phase failed. Each phase returns 0, or -1 after its message. */
typedef struct run {
    options o;                /* the command line */
    sbp_file_set inputs;      /* every file the run reads, for the output checks */
    /* run_load */
    void *lib;                /* the step library (never closed: see run_free) */
    step_run_fn step_run;     /* its sbp_step_run */
    const sbp_step_info *in;  /* its self-description, validated */
    runtime rt;               /* the runtime functions and their contexts */
    int64_t B, T, V;          /* the step's batch, sequence length, vocabulary */
    int64_t K;                /* --grad-accum: micro-batches per optimizer step */
    size_t ntok;              /* B*T: the tokens of one micro-batch */
    bool host_visible;        /* the backend's memory is the host's (cpu) */
    int32_t *ids, *labels;    /* [K*B*T]: the K micro-batches of one step */
    train_inputs ti;          /* micro-batches, DPO / GRPO inputs (train_inputs.h) */
    sbpio_shard shard;        /* --data */
    bool have_shard;          /* shard is open */
    train_dataset ds;         /* --dataset (train_dataset.h) */
    train_pretrained pre;     /* --save-pretrained: what it will write (train_pretrained.h) */
    bool have_ds;             /* ds is open */
    model mdl;                /* the model, until its weights are copied into the arena */
    train_export *export;     /* --save-safetensors's keys, planned at load */
    train_adapter_merge_plan *merge; /* --merge-lora's base weights, planned at load */
    /* run_allocate */
    char *arena;              /* one block: parameters, gradients, AdamW's m and v, the step's
                               * workspace, one micro-batch's ids, labels, DPO / GRPO inputs */
    size_t pbytes;            /* bytes of the parameter block: param_elems floats */
    size_t gbytes;            /* bytes of the gradient block and of each AdamW moment:
                               * grad_elems floats (the trained parameters) */
    char *workspace;          /* [workspace_bytes] in the arena */
    float *d_params;          /* [param_elems] in the arena */
    float *d_grads, *d_m, *d_v; /* [grad_elems] each, in the arena (m, v: adamw) */
    int32_t *d_ids, *d_labels;             /* [B*T] each, in the arena */
    float *d_ref, *d_old;     /* [B] (DPO reference) or [B*T], in the arena when used */
    float *d_adv;             /* [B], in the arena when used */
    float *host_params, *host_grads; /* [param_elems], [grad_elems] host views of the blocks */
    bool own_host;            /* host_params/host_grads were malloc'd (not the arena itself) */
    /* device memory (a backend whose memory is not the host's): in use before the arena, the
     * device's total, and the most in use seen after it, sampled after every step */
    bool dev_mem;             /* the figures are available */
    size_t dev_before, dev_total, dev_peak;
    train_log log;            /* --log, open from run_loop's start (train_log.h) */
    train_ckpt ckpt;          /* checkpoints: prepared in run_load, restored in
                               * run_allocate, written after steps (train_ckpt.h) */
    /* packed documents (train_pack.h); NULL unless the step is packed */
    int32_t *doc_ids;         /* [K*B*T] the step's batch: packed from --data, or --doc-ids */
    int32_t *mb_doc_ids;      /* [B*T] one micro-batch, in the step's row order */
    int32_t *d_doc_ids;       /* [B*T] in the arena */
    double pairs_packed, pairs_full; /* attention's query-key pairs over the run, packed and if
                               * the rows were one document each (train_pack_attention_work) */
    int64_t n_docs, n_rows;   /* documents and rows trained on */
    /* evaluation (train_eval.h), when --eval-data */
    step_run_fn step_eval;    /* the step's sbp_step_eval */
    /* DPO on a dataset: the reference model's logp of every example, computed before step 1
     * from the model's initial weights with the step's sbp_step_logps */
    int (*step_logps)(sbprt_ctx *, const sbp_step_args *, float *, float *);
    float *ref_ex;            /* [examples] */
    float *ref_tok;           /* GRPO: [dataset tokens] each token's, 0 where not scored */
    bool ds_grpo;             /* a grpo dataset: advantages from the file, rows one example */
    int64_t *row_ex;          /* [K*G] the example in each row of the step's batch */
    bool logps_only;          /* --compute-logps: written; no training */
    train_eval ev;            /* the held-out batches */
    /* data parallel (train_dist.h); with one rank G = B and gin is unused */
    int64_t G;                /* the global rows of one micro-batch (every rank reads them) */
    sbp_step_info gin;        /* the step's description with batch G: the files' shapes */
    size_t mbytes;            /* bytes of each AdamW moment on this rank (its ZeRO slice) */
} run;

static void sample_device_memory(run *r)
{
    size_t used = 0;
    if (r->dev_mem && r->rt.device_memory(r->rt.step_ctx, &used, NULL) == SBPRT_OK &&
        used > r->dev_peak)
        r->dev_peak = used;
}

static int copy_failed(run *r, int st)
{
    char why[400];
    return error("copying between host and %s memory failed: %s%s", r->rt.backend_name(),
                 r->rt.status_string(st), rt_why(&r->rt, *r->rt.copy_ctx, why, sizeof why));
}

/* --eval-data: the step's evaluation entry point and the held-out batches, cut or
 * packed as the training data is. */
static int load_eval(run *r, char *err, size_t errlen)
{
    const options *o = &r->o;
    const sbp_step_info *in = r->in;
    *(void **)(&r->step_eval) = dlsym(r->lib, "sbp_step_eval");
    if (!r->step_eval || in->eval_workspace_bytes == 0)
        return error("%s: %s has no evaluation entry point (sbp_step_eval): a %s step "
                     "has none%s", o->eval.dataset ? "--eval-dataset" : "--eval-data",
                     o->step_path, in->objective ? in->objective : "?",
                     in->objective && (strcmp(in->objective, "sft") == 0 ||
                                       strcmp(in->objective, "graph-loss") == 0)
                         ? " when compiled with sbpc --no-eval; recompile it without"
                         : " (evaluation is the language-modelling loss of sft and graph-loss "
                           "steps)");
    if (o->eval.dataset) {
        if (train_eval_open_dataset(&r->ev, &o->eval, in, err, errlen))
            return error("%s", err);
        return 0;
    }
    if (in->packed && !o->pack.pack)
        return error("--eval-data: %s is a packed step, and the held-out text is packed as "
                     "--data is: give --pack --eos ID", o->step_path);
    if (train_eval_open(&r->ev, &o->eval, r->B, r->T, r->V, o->pack.pack,
                        (uint32_t)o->pack.eos, err, errlen))
        return error("%s", err);
    return 0;
}

/* The step (dlopen'd, its description checked), the token data and the DPO / GRPO inputs
 * (checked against the step's B, T, V: cheap, so before the model), the runtime's contexts, and
 * the model checked against the step. The outputs are refused first if they would replace an
 * input or a special file, before any work. */
static int run_load(run *r)
{
    const options *o = &r->o;
    char err[512];
    /* --save-pretrained: the export's recorded config, and so the folder's files, first */
    if (o->pretrained.dir &&
        train_pretrained_plan(&r->pre, &o->pretrained, o->model_path, err, sizeof err))
        return error("%s", err);
    if (collect_inputs(o, &r->inputs) || check_outputs(o, &r->pre, &r->inputs))
        return -1;
    /* checkpoints: an unwritable directory is found now, not after hours (under mpirun: rank 0
     * first, which creates it, then the others; a failing rank 0 aborts them all) */
    if (dist.rank != 0)
        train_dist_barrier(&dist);
    if (train_ckpt_prepare(&r->ckpt, &o->ckpt, err, sizeof err))
        return error("%s", err);
    if (dist.rank == 0)
        train_dist_barrier(&dist);

    char *so_path = NULL;
    if (!strchr(o->step_path, '/')) { /* dlopen would search the library path instead */
        so_path = malloc(strlen(o->step_path) + 3);
        if (so_path)
            sprintf(so_path, "./%s", o->step_path);
    }
    if (check_step_file(so_path ? so_path : o->step_path)) {
        free(so_path);
        return -1;
    }
    r->lib = dlopen(so_path ? so_path : o->step_path, RTLD_NOW | RTLD_LOCAL);
    free(so_path);
    if (!r->lib) {
        const char *why = dlerror();
        return error("cannot load the step library %s: %s", o->step_path,
                     why ? why : "dlopen failed");
    }
    step_info_fn get_info;
    *(void **)(&get_info) = dlsym(r->lib, "sbp_step_get_info");
    *(void **)(&r->step_run) = dlsym(r->lib, "sbp_step_run");
    if (!get_info || !r->step_run)
        return error("%s is not a compiled training step: it does not export %s", o->step_path,
                     !get_info ? "sbp_step_get_info" : "sbp_step_run");
    const sbp_step_info *in = r->in = get_info();
    if (!in)
        return error("%s: sbp_step_get_info() returned NULL", o->step_path);
    if (in->abi_version != SBP_STEP_ABI_VERSION)
        return error("%s was built for step ABI version %d, but this sbp-train reads version "
                     "%d: recompile it with the matching sbpc", o->step_path, in->abi_version,
                     SBP_STEP_ABI_VERSION);
    if (validate_info(in, o->step_path) || runtime_load(&r->rt, r->lib, o->step_path, in->target))
        return -1;
    const int64_t B = r->B = in->batch, T = r->T = in->seq_len, V = r->V = in->vocab;
    const size_t ntok = r->ntok = (size_t)(B * T);
    r->host_visible = strcmp(r->rt.backend_name(), "cpu") == 0;
    const int64_t K = r->K = o->grad_accum;
    const bool pairs = in->objective && strcmp(in->objective, "dpo") == 0;
    /* a packed step takes document ids, and only a packed step does */
    if (train_pack_check_step(&o->pack, in, o->step_path, err, sizeof err))
        return error("%s", err);
    if ((o->eval.data || o->eval.dataset) && load_eval(r, err, sizeof err))
        return -1;

    /* under mpirun the files (or each --data read) hold the global batch of G rows
     * per micro-batch, which every rank reads whole; `bin` describes it */
    const sbp_step_info *bin = in;
    r->G = B;
    if (dist.on) {
        if (!r->host_visible && !train_dist_have_nccl())
            return error("%s is a %s step: this sbp-train was built without NCCL, so under "
                         "mpirun only cpu steps run (MPI sums host memory)", o->step_path,
                         r->rt.backend_name());
        if (in->packed || o->pack.pack || o->pack.doc_ids)
            return error("packed documents (--pack, --doc-ids) do not run under mpirun yet");
        int64_t rows_all = -1;
        if (o->ids_path) { /* the files' rows; a bad file is load_tokens's to report */
            sbpio_array a;
            rows_all = K * B * dist.size;
            if (sbpio_npy_read(o->ids_path, &a, err, sizeof err) == SBPIO_OK) {
                if (a.rank == 2)
                    rows_all = a.shape[0];
                sbpio_array_free(&a);
            }
        }
        if (train_dist_plan_rows(&dist, in, rows_all, K, pairs, err, sizeof err))
            return error("%s: %s", o->step_path, err);
        r->G = dist.G;
        r->gin = *in;
        r->gin.batch = r->G;
        bin = &r->gin;
    }
    const int64_t G = r->G;
    const size_t gtok = (size_t)(G * T); /* the global tokens of one micro-batch */

    r->ids = malloc((size_t)K * gtok * sizeof *r->ids);
    r->labels = malloc((size_t)K * gtok * sizeof *r->labels);
    if (!r->ids || !r->labels)
        return error("out of memory");
    if (o->data_path && in->objective && (pairs || strcmp(in->objective, "grpo") == 0))
        return error("--data: %s is a %s step, which trains on --input-ids and --labels with "
                     "its own inputs (see --help)", o->step_path, in->objective);
    if (o->dataset.path) {
        if (train_dataset_open(&r->ds, &o->dataset, in, in->packed, err, sizeof err))
            return error("%s", err);
        r->have_ds = true;
        if (o->dataset.epochs) { /* --epochs: the steps that many passes take */
            int64_t steps = train_dataset_steps(&r->ds, o->dataset.epochs, K * G);
            if (steps < 1)
                return error("out of memory");
            r->o.steps = steps;
        }
        message("note", "%s: %lld examples, %lld tokens (%lld scored), the longest %lld; %s%s",
                o->dataset.path, (long long)r->ds.d.n_ex, (long long)r->ds.d.n_tok,
                (long long)r->ds.d.scored, (long long)r->ds.d.longest,
                in->packed ? "packed next-fit into rows" : "one example a row",
                o->dataset.shuffle ? ", shuffled each pass" : ", in file order");
    } else if (o->data_path) {
        if (sbpio_shard_open(o->data_path, &r->shard, err, sizeof err) != SBPIO_OK)
            return error("%s", err);
        r->have_shard = true;
        if (r->shard.ntok < G * T + 1)
            return error("%s holds %lld tokens, fewer than one batch of %s needs (batch %lld x "
                         "sequence length %lld + 1 = %lld)", o->data_path,
                         (long long)r->shard.ntok, o->step_path, (long long)G, (long long)T,
                         (long long)(G * T + 1));
        if (sbpio_shard_check_vocab(&r->shard, V, err, sizeof err) != SBPIO_OK)
            return error("%s (%s was compiled for a vocabulary of %lld tokens)", err,
                         o->step_path, (long long)V);
    } else {
        if (load_tokens(o->ids_path, false, bin, o->step_path, K, pairs, r->ids) ||
            load_tokens(o->labels_path, true, bin, o->step_path, K, pairs, r->labels))
            return -1;
        size_t scored = 0;
        for (size_t i = 0; i < (size_t)K * gtok; i++)
            scored += r->labels[i] != SBPRT_IGNORE_INDEX;
        if (scored == 0)
            return error("%s: every label is -100: no position is scored, there is nothing to "
                         "train", o->labels_path);
    }
    r->ds_grpo = r->have_ds && strcmp(r->ds.d.task, "grpo") == 0;
    /* DPO / GRPO on a dataset: the reference is ours, GRPO's advantages the file's */
    const bool self_ref = r->have_ds && (r->ds.pairs || r->ds_grpo);
    if (self_ref && o->ref_logps)
        return error("--ref-logps: with --dataset the reference log-probs are computed from the "
                     "model's initial weights before step 1 (a file of them is not read yet)");
    if (r->have_ds && !self_ref && o->compute_logps)
        return error("--compute-logps scores the examples of a dpo or grpo step (the step here "
                     "is %s)", in->objective ? in->objective : "sft");
    if (self_ref && (o->old_logps || o->advantages))
        return error("%s: with --dataset GRPO's advantages are the dataset's and its old "
                     "log-probs on-policy", o->old_logps ? "--old-logps" : "--advantages");
    if ((self_ref ? ti_open_self_ref(&r->ti, bin, K, note_message, err, sizeof err)
                  : ti_open(&r->ti, bin, K, o->ref_logps, o->old_logps, o->advantages,
                            note_message, err, sizeof err)) ||
        (o->ids_path && ti_check(&r->ti, r->labels, o->labels_path, err, sizeof err)))
        return error("%s", err);
    if (self_ref) {
        *(void **)(&r->step_logps) = dlsym(r->lib, "sbp_step_logps");
        if (!r->step_logps || in->logp_workspace_bytes == 0)
            return error("--dataset: %s has no log-probability entry point (sbp_step_logps), "
                         "which computes the reference log-probs: recompile it without "
                         "--no-eval", o->step_path);
        if (in->logp_workspace_bytes > in->workspace_bytes)
            return error("%s: its log-probability workspace (%zu bytes) exceeds the training "
                         "workspace (%zu bytes) it is to share", o->step_path,
                         in->logp_workspace_bytes, in->workspace_bytes);
        r->ref_ex = malloc((size_t)r->ds.d.n_ex * sizeof *r->ref_ex);
        r->row_ex = malloc((size_t)(K * G) * sizeof *r->row_ex);
        if (r->ds_grpo)
            r->ref_tok = calloc((size_t)r->ds.d.n_tok, sizeof *r->ref_tok);
        if (!r->ref_ex || !r->row_ex || (r->ds_grpo && !r->ref_tok))
            return error("out of memory");
    }
    if (in->packed) { /* the batch's document ids (--pack packs them each step) */
        r->doc_ids = malloc((size_t)K * ntok * sizeof *r->doc_ids);
        r->mb_doc_ids = malloc(ntok * sizeof *r->mb_doc_ids);
        if (!r->doc_ids || !r->mb_doc_ids)
            return error("out of memory");
        if (o->pack.doc_ids && train_pack_load_doc_ids(o->pack.doc_ids, K * B, T, r->doc_ids,
                                                       err, sizeof err))
            return error("%s", err);
        if (o->pack.pack && r->have_shard &&
            !train_pack_shard_scores(&r->shard, (uint32_t)o->pack.eos))
            return error("%s: every document is one token long (the shard is --eos %lld tokens "
                         "only): packed, no position is scored, there is nothing to train",
                         o->data_path, (long long)o->pack.eos);
        if (o->pack.pack && r->have_shard &&
            !train_pack_shard_has(&r->shard, (uint32_t)o->pack.eos))
            message("note", "%s holds no --eos %lld token: it is one document, cut into rows "
                    "of %lld tokens", o->data_path, (long long)o->pack.eos, (long long)T);
    }

    /* the context first: no device is quicker to find than a large model is to read */
    if (runtime_start(&r->rt, (int)o->threads) || model_open(&r->mdl, o, in, &r->pre, &r->inputs))
        return -1;
    /* a cuda step's gradients are summed on the GPUs (NCCL), once its context exists */
    if (dist.on && !r->host_visible && train_dist_nccl_start(&dist, err, sizeof err))
        return error("%s", err);
    /* safetensors export: the PyTorch names, before any training (train_export.c) */
    if ((o->save_safetensors || o->pretrained.dir) &&
        !(r->export = train_export_plan_lora(r->mdl.g, in, o->adapter.merge, note_message,
                                             err, sizeof err)))
        return error("%s: %s", o->save_safetensors ? "--save-safetensors" : "--save-pretrained",
                     err);
    /* --merge-lora: which initializer each adapter updates, before any training */
    if (o->adapter.merge &&
        !(r->merge = train_adapter_merge_plan_make(r->mdl.g, in, err, sizeof err)))
        return error("--merge-lora: %s", err);
    return 0;
}

/* DPO on a dataset: every example's log-probability under the model's initial weights (the
 * reference model), B examples a call of sbp_step_logps in file order (padding rows score
 * nothing), in the training workspace (the step's own forward, no gradient): no memory is added
 * to the run's peak. Every rank computes all of them (the same values a single process gets).
 * With --compute-logps the values are written and the run ends there. */
static int run_ref_pass(run *r)
{
    const options *o = &r->o;
    const sbp_step_info *in = r->in;
    runtime *rt = &r->rt;
    const int64_t B = r->B, T = r->T, n = r->ds.d.n_ex;
    int32_t *ids = malloc((size_t)(B * T) * sizeof *ids), *labels = malloc((size_t)(B * T) *
                                                                               sizeof *labels);
    const bool tok = r->ds_grpo; /* GRPO: each token's; DPO: each row's sum */
    const size_t per = tok ? (size_t)(B * T) : (size_t)B;
    float *row = malloc(per * sizeof *row);
    char err[700], why[400];
    int rc = !ids || !labels || !row ? error("out of memory") : 0;
    /* the cache: kept beside the checkpoints (or in --ref-cache), valid for this model's
     * initial weights, this step's model and this dataset, and reused only then */
    char cache[4200] = "", key[128];
    const char *dir = o->ckpt.dir ? o->ckpt.dir : o->ckpt.resume;
    if (o->ref_cache)
        snprintf(cache, sizeof cache, "%s", o->ref_cache);
    else if (dir && !o->compute_logps)
        snprintf(cache, sizeof cache, "%s/ref-logps.safetensors", dir);
    const uint64_t h = sbpio_fnv1a(SBPIO_FNV_SEED, r->host_params,
                                   in->param_elems * sizeof(float)); /* the initial weights */
    snprintf(key, sizeof key, "%016llx-%016llx-%016llx", (unsigned long long)h,
             (unsigned long long)r->ds.d.hash, (unsigned long long)in->model_fingerprint);
    if (!rc && cache[0] && access(cache, F_OK) == 0) {
        sbpio_st_file *f = NULL;
        const char *k = NULL;
        if (sbpio_st_open(cache, &f, why, sizeof why) == SBPIO_OK &&
            (k = sbpio_st_meta(f, "key")) && strcmp(k, key) == 0 &&
            sbpio_st_copy_f32(f, "row_logps", r->ref_ex, n, why, sizeof why) == SBPIO_OK &&
            (!tok || sbpio_st_copy_f32(f, "token_logps", r->ref_tok, r->ds.d.n_tok, why,
                                       sizeof why) == SBPIO_OK)) {
            bool finite = true;
            for (int64_t i = 0; i < n; i++)
                finite = finite && isfinite(r->ref_ex[i]);
            for (int64_t i = 0; tok && i < r->ds.d.n_tok; i++)
                finite = finite && isfinite(r->ref_tok[i]);
            sbpio_st_close(f);
            if (finite) {
                message("note", "reusing the reference log-probs of %s (this model and "
                        "dataset)", cache);
                free(ids);
                free(labels);
                free(row);
                return 0;
            }
        } else {
            sbpio_st_close(f);
        }
        message("note", "%s holds reference log-probs of another model, step or dataset (or "
                "is damaged): computing them again", cache);
    }
    const double t0 = now_seconds();
    for (int64_t e = 0; e < n && !rc; e += B) {
        for (int64_t j = 0; j < B && !rc; j++) {
            if (e + j < n) {
                rc = train_dataset_row(&r->ds, e + j, ids + j * T, labels + j * T, err,
                                       sizeof err) ? error("%s", err) : 0;
            } else {
                for (int64_t t = 0; t < T; t++) {
                    ids[j * T + t] = 0;
                    labels[j * T + t] = SBPRT_IGNORE_INDEX;
                }
            }
        }
        int st = 0;
        if (!rc && ((st = RT(*rt, copy, copy_ctx, r->d_ids, ids, (size_t)(B * T) * sizeof *ids,
                             SBPRT_COPY_HOST_TO_DEVICE)) ||
                    (st = RT(*rt, copy, copy_ctx, r->d_labels, labels,
                             (size_t)(B * T) * sizeof *labels, SBPRT_COPY_HOST_TO_DEVICE))))
            rc = copy_failed(r, st);
        sbp_step_args args = {.params = r->d_params, .input_ids = r->d_ids,
                              .labels = r->d_labels, .workspace = r->workspace,
                              .doc_ids = r->d_doc_ids};
        if (!rc && ((st = r->step_logps(rt->step_ctx, &args, tok ? NULL : r->d_ref,
                                        tok ? r->d_ref : NULL)) ||
                    (st = rt->sync(*rt->sync_ctx))))
            rc = error("the reference log-probs of examples %lld..%lld failed: %s%s",
                       (long long)e, (long long)(e + B - 1), rt->status_string(st),
                       rt_why(rt, rt->step_ctx, why, sizeof why));
        if (!rc && (st = RT(*rt, copy, copy_ctx, row, r->d_ref, per * sizeof *row,
                            SBPRT_COPY_DEVICE_TO_HOST)))
            rc = copy_failed(r, st);
        for (int64_t j = 0; j < B && e + j < n && !rc; j++) {
            float sum = 0;
            if (tok) { /* the example's tokens, and their sum over the scored ones */
                const int64_t len = sbpio_dataset_len(&r->ds.d, e + j);
                const int64_t at = r->ds.d.offsets[e + j];
                for (int64_t t = 0; t < len; t++) {
                    r->ref_tok[at + t] = labels[j * T + t] == SBPRT_IGNORE_INDEX ? 0
                                                                                 : row[j * T + t];
                    sum += r->ref_tok[at + t];
                }
            }
            const float v = tok ? sum : row[j];
            if (!isfinite(v))
                rc = error("the reference log-prob of example %lld is %g", (long long)(e + j),
                           (double)v);
            r->ref_ex[e + j] = v;
        }
    }
    free(ids);
    free(labels);
    free(row);
    if (rc)
        return -1;
    message("note", "reference log-probs of %lld examples computed in %.2f s (the model's "
            "initial weights, before step 1)", (long long)n, now_seconds() - t0);
    const char *out = o->compute_logps ? o->compute_logps : cache[0] ? cache : NULL;
    if (!out || (dist.on && dist.rank != 0)) /* rank 0 writes what every rank computed */
        return 0;
    int64_t shape[1] = {n}, tshape[1] = {r->ds.d.n_tok};
    char count[32];
    snprintf(count, sizeof count, "%lld", (long long)n);
    sbpio_kv meta[] = {{"format", "sbp-logps"}, {"key", key}, {"dataset", o->dataset.path},
                       {"model", o->model_path}, {"examples", count},
                       {"producer", "sbp-train"}};
    sbpio_st_tensor t[2] = {{.name = "row_logps", .dtype = SBPIO_DT_F32, .rank = 1,
                             .shape = shape, .data = r->ref_ex},
                            {.name = "token_logps", .dtype = SBPIO_DT_F32, .rank = 1,
                             .shape = tshape, .data = r->ref_tok}};
    if (sbpio_st_write(out, tok ? 2 : 1, t, 6, meta, false, err, sizeof err) != SBPIO_OK)
        return error("%s: %s", o->compute_logps ? "--compute-logps" : "the reference log-probs",
                     err);
    if (o->compute_logps) {
        printf("wrote the log-probs of %lld examples to %s\n", (long long)n, o->compute_logps);
        r->logps_only = true;
    }
    return 0;
}

/* One arena (the step's runtime's sbprt_arena_alloc) holds, at SBPRT_ALIGN-aligned offsets, the
 * parameters, the gradients, AdamW's m and v, the step's workspace and one micro-batch's ids,
 * labels and DPO / GRPO inputs; then the model's weights are copied in (and the model freed),
 * m and v zeroed, and the step prepared (sbp_step_init). */
static int run_allocate(run *r)
{
    const options *o = &r->o;
    const sbp_step_info *in = r->in;
    runtime *rt = &r->rt;
    const size_t ntok = r->ntok;
    char why[400];
    int st;
    r->dev_mem = !r->host_visible && rt->device_memory &&
                 rt->device_memory(rt->step_ctx, &r->dev_before, &r->dev_total) == SBPRT_OK;
    const size_t pbytes = r->pbytes = in->param_elems * sizeof(float);
    const size_t gbytes = r->gbytes = in->grad_elems * sizeof(float);
    /* --zero 1|2 under mpirun keeps this rank's slice of m and v only */
    dist.zero = (int)o->zero;
    if (train_dist_plan_slices(&dist, in, why, sizeof why))
        return error("%s", why);
    const size_t mbytes = r->mbytes = train_dist_state_elems(&dist) * sizeof(float);
    const size_t off_params = 0;
    const size_t off_grads = off_params + align_up(pbytes);
    const size_t off_m = off_grads + align_up(gbytes);
    const size_t off_v = off_m + (o->adamw ? align_up(mbytes) : 0);
    const size_t off_ws = off_v + (o->adamw ? align_up(mbytes) : 0);
    /* evaluation runs in the training workspace (its plan is usually the smaller) */
    const size_t ws_bytes = r->step_eval && in->eval_workspace_bytes > in->workspace_bytes
                                ? in->eval_workspace_bytes
                                : in->workspace_bytes;
    const size_t off_ids = off_ws + align_up(ws_bytes);
    const size_t off_labels = off_ids + align_up(ntok * sizeof(int32_t));
    /* DPO / GRPO inputs of one micro-batch: reference logp ([B] or [B*T]), old logp, advantages */
    const size_t off_ref = off_labels + align_up(ntok * sizeof(int32_t));
    const size_t off_old = off_ref + (r->ti.mb_ref ? align_up(ntok * sizeof(float)) : 0);
    const size_t off_adv = off_old + (r->ti.mb_old ? align_up(ntok * sizeof(float)) : 0);
    /* one micro-batch's document ids (packed steps) */
    const size_t off_docs = off_adv + (r->ti.mb_adv ? align_up((size_t)r->B * sizeof(float)) : 0);
    const size_t arena_bytes = off_docs + (r->doc_ids ? align_up(ntok * sizeof(int32_t)) : 0);
    st = RT(*rt, arena_alloc, arena_ctx, (void **)&r->arena, arena_bytes);
    if (st) {
        char b1[32];
        error("cannot allocate %s for parameters, gradients, optimizer state and workspace: %s%s",
              cli_human_bytes(b1, sizeof b1, (double)arena_bytes), rt->status_string(st),
              rt_why(rt, *rt->arena_ctx, why, sizeof why));
        if (r->dev_mem && st == SBPRT_ERR_NOMEM)
            fit_advice(in, arena_bytes, r->dev_total - r->dev_before, o->adamw);
        return -1;
    }
    sample_device_memory(r);
    char *arena = r->arena;
    r->d_params = (float *)(arena + off_params);
    r->d_grads = (float *)(arena + off_grads);
    r->d_m = (float *)(arena + off_m);
    r->d_v = (float *)(arena + off_v);
    r->workspace = arena + off_ws;
    r->d_ids = (int32_t *)(arena + off_ids);
    r->d_labels = (int32_t *)(arena + off_labels);
    r->d_ref = (float *)(arena + off_ref);
    r->d_old = (float *)(arena + off_old);
    r->d_adv = (float *)(arena + off_adv);
    r->d_doc_ids = r->doc_ids ? (int32_t *)(arena + off_docs) : NULL;
    if (r->host_visible) {
        r->host_params = r->d_params;
        r->host_grads = r->d_grads;
    } else {
        r->own_host = true;
        r->host_params = malloc(pbytes + 1);
        r->host_grads = malloc(gbytes + 1);
        if (!r->host_params || !r->host_grads)
            return error("out of memory");
    }
    memset(r->host_params, 0, pbytes);
    model_copy_weights(&r->mdl, o, in, r->host_params);
    model_free(&r->mdl); /* the weights are in the block now; the file's copy is not needed */
    if (!r->host_visible && (st = RT(*rt, copy, copy_ctx, r->d_params, r->host_params, pbytes,
                                     SBPRT_COPY_HOST_TO_DEVICE)))
        return copy_failed(r, st);
    if (o->adamw) { /* zero m and v: through a zeroed host buffer, backend-neutral */
        float *zeros = calloc(1, mbytes + 1);
        if (!zeros)
            return error("out of memory");
        st = RT(*rt, copy, copy_ctx, r->d_m, zeros, mbytes, SBPRT_COPY_HOST_TO_DEVICE);
        if (!st)
            st = RT(*rt, copy, copy_ctx, r->d_v, zeros, mbytes, SBPRT_COPY_HOST_TO_DEVICE);
        free(zeros);
        if (st)
            return copy_failed(r, st);
    }
    /* the step's own preparation (a cuda step uploads its constants), outside the timing */
    if (rt->step_init && (st = rt->step_init(rt->step_ctx)))
        return error("preparing the step (sbp_step_init) failed: %s%s", rt->status_string(st),
                     rt_why(rt, rt->step_ctx, why, sizeof why));
    /* the reference log-probs, from the model's initial weights: before a resume restores
     * later ones */
    if (r->ref_ex && (!r->ds_grpo || r->ti.ref || o->compute_logps) && run_ref_pass(r))
        return -1;
    /* checkpoints: --resume overwrites the weights, m, v and the data position */
    /* under ZeRO a checkpoint still holds the whole moments: a resume reads this
     * rank's slice of them, and rank 0 writes the ranks' slices as they arrive */
    const bool sliced = dist.on && dist.zero > 0 && o->adamw && r->ckpt.dir;
    dist.state_sliced = sliced;
    dist.state_m = r->d_m;
    dist.state_v = r->d_v;
    char ckpt_err[1024], pack_id[64]; /* the packing is part of the run's identity */
    train_pack_identity(&o->pack, r->doc_ids, (size_t)r->K * ntok, pack_id, sizeof pack_id);
    if (r->have_ds && r->ds.packed) /* a dataset's examples, packed next-fit */
        snprintf(pack_id, sizeof pack_id, "next-fit");
    if (train_ckpt_start(&r->ckpt, &(train_ckpt_run){
            .in = in, .step_path = o->step_path, .adamw = o->adamw, .grad_accum = o->grad_accum,
            .total_steps = o->steps, .lr = o->lr, .weight_decay = o->weight_decay,
            .sched = &o->sched, .dump_grads = o->dump_grads != NULL,
            .shard = r->have_shard ? &r->shard : NULL, .ids = r->ids, .labels = r->labels,
            .dataset = r->have_ds ? &r->ds : NULL,
            .ntok_all = (size_t)(r->ti.N * r->T) /* the global batch */,
            .pbytes = pbytes, .gbytes = gbytes, .d_params = r->d_params,
            .d_m = r->d_m, .d_v = r->d_v,
            .host_params = r->host_params, .ranks = dist.size,
            .threads = step_threads(in, rt, o->threads),
            .state_fill = sliced ? train_dist_fill_state : NULL, .state_arg = &dist,
            .state_lo = dist.lo, .state_n = dist.hi - dist.lo, /* ZeRO's slice */
            .host_visible = r->host_visible, .copy = rt->copy, .copy_ctx = *rt->copy_ctx,
            .note = note_message, .packing = pack_id}, ckpt_err, sizeof ckpt_err))
        return error("%s", ckpt_err);
    if (dist.on && dist.rank != 0) /* rank 0 alone writes checkpoints */
        r->ckpt.dir = NULL;
    return 0;
}

/* Evaluation after optimizer step s: the step's forward-only entry point on the K
 * held-out batches, with the caller's denominator 1 so that each batch's loss is the sum of its
 * token losses (for a mean and for a graph's summed loss alike); *out = their total over the
 * scored tokens of all K. Prints 'eval step N loss X ppl Y ...'. */
static int run_eval(run *r, int64_t s, double *out)
{
    const sbp_step_info *in = r->in;
    runtime *rt = &r->rt;
    train_eval *ev = &r->ev;
    const size_t ntok = r->ntok;
    char err[512], why[400];
    double sum = 0, t0 = now_seconds();
    int64_t scored = 0;
    int st;
    train_eval_rewind(ev);
    for (int64_t k = 0; k < ev->K; k++) {
        if (train_eval_next(ev, err, sizeof err))
            return error("step %lld: evaluation batch %lld: %s", (long long)s, (long long)k + 1,
                         err);
        if ((st = RT(*rt, copy, copy_ctx, r->d_ids, ev->ids, ntok * sizeof *ev->ids,
                     SBPRT_COPY_HOST_TO_DEVICE)) ||
            (st = RT(*rt, copy, copy_ctx, r->d_labels, ev->labels, ntok * sizeof *ev->labels,
                     SBPRT_COPY_HOST_TO_DEVICE)) ||
            (in->packed && ev->doc_ids &&
             (st = RT(*rt, copy, copy_ctx, r->d_doc_ids, ev->doc_ids,
                      ntok * sizeof *ev->doc_ids, SBPRT_COPY_HOST_TO_DEVICE))))
            return copy_failed(r, st);
        double batch_sum = NAN;
        int64_t n = 0;
        sbp_step_args args = {
            .params = r->d_params,
            .input_ids = r->d_ids,
            .labels = r->d_labels,
            .denominator = 1.0, /* the sum of the token losses */
            .workspace = r->workspace,
            .loss = &batch_sum,
            .n_scored = &n,
            .doc_ids = in->packed ? r->d_doc_ids : NULL,
        };
        st = r->step_eval(rt->step_ctx, &args);
        if (!st)
            st = rt->sync(*rt->sync_ctx);
        if (st)
            return error("step %lld: evaluation batch %lld failed: %s%s%s", (long long)s,
                         (long long)k + 1, rt->status_string(st),
                         st == SBPRT_ERR_RANGE ? " (a token id or label outside the vocabulary)"
                                               : "",
                         rt_why(rt, rt->step_ctx, why, sizeof why));
        sum += batch_sum;
        scored += n;
    }
    double dt = now_seconds() - t0;
    clear_bar();
    if (scored == 0) {
        message("note", "step %lld: the evaluation batches have no scored token", (long long)s);
        return 0;
    }
    *out = sum / (double)scored;
    printf("eval step %lld loss %.6f ppl %.4f (%lld batches, %lld scored tokens, %.1f tokens/s)"
           "\n",
           (long long)s, *out, exp(*out), (long long)ev->K, (long long)scored,
           dt > 0 ? (double)ntok * (double)ev->K / dt : 0.0);
    fflush(stdout);
    if (!isfinite(*out))
        return error("step %lld: the evaluation loss is %s", (long long)s,
                     isnan(*out) ? "NaN" : "infinite");
    return 0;
}

/* Optimizer step s: the next batch when reading a shard, the step run on each of the K
 * micro-batches with the gradients accumulated (the whole batch's denominator), a stop on a
 * failed status or a non-finite loss (naming the step), the first step's gradients dumped when
 * asked, every trainable parameter updated, and the step's line printed. */
/* Step s's rows from --dataset into r->ids / r->labels (and doc_ids): DPO pairs in the step's
 * layout with their reference log-probs, GRPO rows with their advantages and reference tokens,
 * or K micro-batches of G rows; a note when a pass ends (unless --epochs asked for passes). */
static int run_fetch_dataset(run *r, int64_t s)
{
    const options *o = &r->o;
    train_inputs *ti = &r->ti;
    const int64_t K = r->K, G = r->G, T = r->T, N = K * G, epoch = r->ds.epoch;
    char err[700];
    int rc = 0;
    if (r->ds.pairs) { /* K*G/2 pairs as (row i, row K*G/2 + i) */
        rc = train_dataset_next_pairs(&r->ds, N / 2, r->ids, r->labels, r->row_ex, err,
                                      sizeof err);
        for (int64_t i = 0; i < N && !rc; i++)
            ti->ref[i] = r->ref_ex[r->row_ex[i]];
    } else if (r->ds_grpo) {
        rc = train_dataset_next_rows(&r->ds, N, r->ids, r->labels, r->row_ex, err, sizeof err);
        for (int64_t i = 0; i < N && !rc; i++) {
            const int64_t e = r->row_ex[i], len = sbpio_dataset_len(&r->ds.d, e);
            ti->adv[i] = r->ds.d.advantages[e];
            for (int64_t t = 0; ti->ref && t < T; t++)
                ti->ref[i * T + t] = t < len ? r->ref_tok[r->ds.d.offsets[e] + t] : 0;
        }
    } else {
        const size_t gtok = (size_t)(G * T), ntok = r->ntok;
        for (int64_t k = 0; k < K && !rc; k++)
            rc = train_dataset_next(&r->ds, G, r->ids + (size_t)k * gtok,
                                    r->labels + (size_t)k * gtok,
                                    r->doc_ids ? r->doc_ids + (size_t)k * ntok : NULL, NULL, err,
                                    sizeof err);
    }
    if (rc)
        return error("step %lld: %s", (long long)s, err);
    if (r->ds.epoch != epoch && !o->dataset.epochs)
        message("note", "step %lld: pass %lld over %s is done; pass %lld begins", (long long)s,
                (long long)epoch + 1, o->dataset.path, (long long)r->ds.epoch + 1);
    return 0;
}

static int run_step(run *r, int64_t s, int64_t epoch0, bool bar)
{
    const options *o = &r->o;
    const sbp_step_info *in = r->in;
    runtime *rt = &r->rt;
    train_inputs *ti = &r->ti;
    const int64_t B = r->B, T = r->T, K = r->K;
    const size_t ntok = r->ntok;
    const int64_t G = r->G; /* the global rows of a micro-batch (B with one rank) */
    const size_t gtok = (size_t)(G * T);
    char err[512], why[400];
    int st;
    if (r->have_ds && run_fetch_dataset(r, s))
        return -1;
    for (int64_t k = 0; r->have_shard && k < K; k++) {
        int64_t epoch = r->shard.epoch;
        if (o->pack.pack /* rows of whole documents, the same shard cursor */
                ? train_pack_shard(&r->shard, (uint32_t)o->pack.eos, T, B,
                                   r->ids + (size_t)k * ntok, r->labels + (size_t)k * ntok,
                                   r->doc_ids + (size_t)k * ntok, err, sizeof err)
                : sbpio_shard_next_batch(&r->shard, (int)G, (int)T, r->ids + (size_t)k * gtok,
                                         r->labels + (size_t)k * gtok, err, sizeof err))
            return error("step %lld: %s", (long long)s, err);
        if (r->shard.epoch != epoch && r->shard.epoch > epoch0)
            message("note", "step %lld: %s is exhausted; starting over from its first token "
                    "(pass %lld)", (long long)s, o->data_path, (long long)r->shard.epoch + 1);
    }
    if (r->doc_ids) { /* what packing saves of attention, measured on the data */
        train_pack_attention_work(r->doc_ids, K * B, T, &r->pairs_packed, &r->pairs_full,
                                  &r->n_docs);
        r->n_rows += K * B;
    }
    double t0 = now_seconds();
    /* K micro-batches, the gradients accumulated, with the whole batch's denominator */
    const double denominator = ti_denominator(ti, r->labels);
    double loss = 0;
    int64_t micro = 0; /* after a failure: the failed micro-batch's number, from 1 */
    int64_t pad_pairs = 0; /* DPO pairs of padding on this rank */
    st = SBPRT_OK;
    for (; micro < K && st == SBPRT_OK; micro++) {
        if (dist.on) /* this rank's rows of the global micro-batch */
            pad_pairs += train_dist_micro(&dist, ti, r->ids, r->labels, micro);
        else
            ti_micro(ti, r->ids, r->labels, micro);
        if (r->doc_ids) { /* the micro-batch's document ids, in its row order */
            train_pack_micro(r->doc_ids, r->mb_doc_ids, K * B, B, T, micro, ti->dpo);
            if ((st = RT(*rt, copy, copy_ctx, r->d_doc_ids, r->mb_doc_ids,
                         ntok * sizeof *r->mb_doc_ids, SBPRT_COPY_HOST_TO_DEVICE)))
                return copy_failed(r, st);
        }
        if ((st = RT(*rt, copy, copy_ctx, r->d_ids, ti->mb_ids, ntok * sizeof *r->ids,
                     SBPRT_COPY_HOST_TO_DEVICE)) ||
            (st = RT(*rt, copy, copy_ctx, r->d_labels, ti->mb_labels, ntok * sizeof *r->labels,
                     SBPRT_COPY_HOST_TO_DEVICE)) ||
            (ti->mb_ref && (st = RT(*rt, copy, copy_ctx, r->d_ref, ti->mb_ref,
                                    (ti->dpo ? (size_t)B : ntok) * sizeof(float),
                                    SBPRT_COPY_HOST_TO_DEVICE))) ||
            (ti->mb_old && (st = RT(*rt, copy, copy_ctx, r->d_old, ti->mb_old,
                                    ntok * sizeof(float), SBPRT_COPY_HOST_TO_DEVICE))) ||
            (ti->mb_adv && (st = RT(*rt, copy, copy_ctx, r->d_adv, ti->mb_adv,
                                    (size_t)B * sizeof(float), SBPRT_COPY_HOST_TO_DEVICE))))
            return copy_failed(r, st);
        double micro_loss = NAN;
        sbp_step_args args = {
            .params = r->d_params,
            .grads = r->d_grads,
            .accumulate = micro > 0,
            .input_ids = r->d_ids,
            .labels = r->d_labels,
            .denominator = denominator,
            .workspace = r->workspace,
            .loss = &micro_loss,
            .ref_logps = ti->mb_ref ? r->d_ref : NULL,
            .old_logps = ti->mb_old ? r->d_old : NULL,
            .advantages = ti->mb_adv ? r->d_adv : NULL,
            .doc_ids = r->d_doc_ids, /* NULL unless the step is packed */
        };
        st = r->step_run(rt->step_ctx, &args);
        if (!st)
            st = rt->sync(*rt->sync_ctx);
        loss += micro_loss;
    }
    if (st) {
        char mb[64] = "";
        if (K > 1)
            snprintf(mb, sizeof mb, " (micro-batch %lld of %lld)", (long long)micro,
                     (long long)K);
        error("step %lld%s: the step failed: %s%s%s", (long long)s, mb, rt->status_string(st),
              st == SBPRT_ERR_RANGE ? " (a token id or label outside the vocabulary)" : "",
              rt_why(rt, rt->step_ctx, why, sizeof why));
        if (r->dev_mem && st == SBPRT_ERR_NOMEM) {
            size_t used = 0;
            if (rt->device_memory(rt->step_ctx, &used, NULL) == SBPRT_OK)
                message("note", "the runtime's scratch or cuBLAS's workspace did not fit next to "
                        "the arena (%zu of %zu bytes in use); recompile the step with a "
                        "--memory-budget some hundreds of MiB below its planned %zu bytes",
                        used, r->dev_total, in->planned_peak_bytes);
        }
        return -1;
    }
    /* the sums over the ranks (a padded DPO pair's ln 2 taken out first); ZeRO 2
     * keeps its slice of the gradients only, except for the first step's --dump-grads */
    if (dist.on) {
        if (train_dist_injected_failure(&dist, s))
            return error("step %lld: a failure injected by the tests (SBP_TEST_FAIL_RANK)",
                         (long long)s);
        loss -= (double)pad_pairs * log(2.0) / denominator;
        if (train_dist_reduce(&dist, r->d_grads, &loss, s == 1 && o->dump_grads, err,
                              sizeof err))
            return error("step %lld: %s", (long long)s, err);
    }
    if (!isfinite(loss))
        return error("step %lld: the loss is %s; stopping before the update%s", (long long)s,
                     isnan(loss) ? "NaN" : "infinite", o->save ? " (nothing saved)" : "");
    double t_run = now_seconds() - t0;

    if (s == 1 && o->dump_grads) {
        if (!r->host_visible && (st = RT(*rt, copy, copy_ctx, r->host_grads, r->d_grads,
                                         r->gbytes, SBPRT_COPY_DEVICE_TO_HOST)))
            return copy_failed(r, st);
        if ((!dist.on || dist.rank == 0) && dump_grads(o, in, r->host_grads, loss))
            return -1;
    }

    /* this step's lr; the gradient norm, clipped when asked (in backend memory) */
    const double lr = train_sched_lr(&o->sched, o->lr, s, o->steps);
    double gnorm = 0, clip_coef = 1;
    const train_grad_rt grt = {rt->grad_sq_norm, *rt->norm_ctx, rt->scale, *rt->scale_ctx};
    if ((st = dist.on && dist.zero > 0 /* the norm of the ranks' slices */
                  ? train_dist_clip(&dist, &grt, in, r->d_grads, o->sched.clip, &gnorm,
                                    &clip_coef)
                  : train_clip_grads(&grt, in, r->d_grads, o->sched.clip, &gnorm, &clip_coef)))
        return error("step %lld: the gradient norm%s failed: %s%s", (long long)s,
                     o->sched.clip > 0 ? " or its clipping" : "", rt->status_string(st),
                     rt_why(rt, *rt->norm_ctx, why, sizeof why));

    t0 = now_seconds();
    for (int i = 0; i < in->n_params; i++) {
        const sbp_step_param *p = &in->params[i];
        size_t a = 0, n = p->numel; /* the part this rank updates (ZeRO: a slice) */
        if (p->tied_to >= 0 || !p->trainable || p->numel == 0 ||
            !train_dist_owned(&dist, p, &a, &n))
            continue;
        size_t k = p->offset + a, g = p->grad_offset + a; /* the parameter and gradient blocks */
        size_t mo = g - dist.lo; /* m and v hold the slice [lo, hi) of the gradient block */
        if (o->adamw)
            st = RT(*rt, adamw_update, adamw_ctx, r->d_params + k, r->d_m + mo, r->d_v + mo,
                    r->d_grads + g, n, lr, 0.9, 0.999, 1e-8, o->weight_decay,
                    s > INT32_MAX ? INT32_MAX : (int)s);
        else
            st = RT(*rt, sgd_update, sgd_ctx, r->d_params + k, r->d_grads + g, n, lr,
                    o->weight_decay);
        if (st)
            return error("step %lld: the %s update of '%s' failed: %s", (long long)s,
                         o->adamw ? "adamw" : "sgd", p->name, rt->status_string(st));
    }
    if ((st = rt->sync(*rt->sync_ctx)))
        return error("step %lld: %s%s", (long long)s, rt->status_string(st),
                     rt_why(rt, *rt->sync_ctx, why, sizeof why));
    /* ZeRO: every rank's updated slice to every rank (the moments move only for a
     * checkpoint, in run_loop) */
    if (train_dist_gather_params(&dist, in, r->d_params, r->d_grads, err, sizeof err))
        return error("step %lld: %s", (long long)s, err);
    /* An update that overflowed (a huge --lr or --weight-decay) stops the run here, naming the
     * tensor; the next loss would only say NaN, and a last step's update has no next loss. A
     * device's weights are checked when they come back to be written (run_report, checkpoints). */
    if (r->host_visible &&
        train_finite_check(in, TRAIN_BLOCK_PARAMS, r->d_params, 0, in->param_elems, false,
                           "the update made a weight non-finite", err, sizeof err))
        return error("step %lld: %s: stopping (nothing of this step is saved; a smaller --lr "
                     "or --weight-decay?)", (long long)s, err);
    sample_device_memory(r);
    double dt = t_run + (now_seconds() - t0);
    /* the global batch's tokens (all ranks'; ti->N = K*G) */
    double tps = dt > 0 ? (double)ti->N * (double)T / dt : 0;
    clear_bar();
    /* "step N loss X" first: scripts parse that prefix; the other fields follow */
    printf("step %lld loss %.6f tokens/s %.1f lr %.9g grad_norm %.9g\n", (long long)s, loss, tps,
           lr, gnorm);
    fflush(stdout);
    double eval_loss = NAN; /* held-out evaluation after the update, when due */
    if (train_eval_due(&o->eval, s, o->steps) && run_eval(r, s, &eval_loss))
        return -1;
    if (train_log_step(&r->log, s, loss, lr, gnorm, tps, eval_loss, err, sizeof err))
        return error("step %lld: %s", (long long)s, err);
    if (bar)
        draw_bar(s, o->steps, loss, tps);
    return 0;
}

/* The run's first line (what is trained, how), then --steps optimizer steps. */
static int run_loop(run *r)
{
    const options *o = &r->o;
    const sbp_step_info *in = r->in;
    int64_t n_weights = 0;
    for (int i = 0; i < in->n_params; i++)
        n_weights += in->params[i].tied_to < 0 ? (int64_t)in->params[i].numel : 0;
    printf("%s: %s (%s, %s, %s): batch %lld, seq-len %lld, vocab %lld; %d parameter tensors, "
           "%lld weights; %s lr %g%s\n", prog, o->step_path, in->target ? in->target : "?",
           in->strategy ? in->strategy : "?", in->objective ? in->objective : "?",
           (long long)r->B, (long long)r->T, (long long)r->V, in->n_params,
           (long long)n_weights, o->adamw ? "adamw" : "sgd", o->lr,
           o->weight_decay > 0 ? " (with weight decay)" : "");
    fflush(stdout);

    const bool bar = isatty(STDERR_FILENO);
    const int64_t epoch0 = r->shard.epoch;
    char err[512]; /* the log, opened before step 1 */
    const int64_t first = train_ckpt_first_step(&r->ckpt); /* > 1 when resumed */
    if (train_log_open(&r->log, o->sched.log_path, first > 1 ? first - 1 : -1, err, sizeof err))
        return error("%s", err);
    /* checkpoints: a resumed run starts after its checkpoint's step, and a
     * SIGINT / SIGTERM ends the loop once the current step's checkpoint is written */
    char ckpt_err[1024];
    bar_first = first;
    bar_t0 = now_seconds();
    for (int64_t s = first; s <= o->steps && !r->ckpt.stopped; s++) {
        if (run_step(r, s, epoch0, bar))
            return -1;
        /* the signal this step acts on, read once: under mpirun the ranks' combined one, so
         * that every rank decides alike whether a checkpoint is due */
        int sig = train_ckpt_stop_signal();
        if (dist.on) {
            sig = train_dist_max(&dist, sig);
            train_ckpt_request_stop(sig);
        }
        if ((train_ckpt_after_step(&r->ckpt, s, sig, ckpt_err, sizeof ckpt_err) &&
             error("%s", ckpt_err)))
            return -1;
        /* ZeRO: the other ranks' moment slices go to rank 0 as it writes them */
        if (dist.state_sliced && dist.rank != 0 && train_ckpt_due(&o->ckpt, s, o->steps, sig) &&
            train_dist_send_state(&dist, ckpt_err, sizeof ckpt_err))
            return error("step %lld: %s", (long long)s, ckpt_err);
        if (dist.on) /* rank 0 stopped by a signal stops every rank */
            r->ckpt.stopped = train_dist_any(&dist, r->ckpt.stopped);
    }
    clear_bar();
    if (train_log_close(&r->log, err, sizeof err))
        return error("%s", err);
    return 0;
}

/* run_report's writers, on the fp32 view of the parameters (in, host32). */
static int run_saves(run *r, const sbp_step_info *in, const float *host32)
{
    const options *o = &r->o;
    if (o->save) {
        float *merged = NULL; /* --merge-lora: W + (alpha/r)·B·A, a copy */
        if (r->merge && !(merged = malloc(in->param_elems * sizeof(float) + 1)))
            return error("--merge-lora: out of memory");
        if (merged)
            train_adapter_merge(r->merge, in, host32, merged);
        int bad = save_model(o, in, merged ? merged : host32);
        free(merged);
        if (bad)
            return -1;
        if (r->merge)
            printf("merged the LoRA adapters into %d weights (scaling %g = %g / %lld)\n",
                   train_adapter_merge_count(r->merge), in->lora_alpha / (double)in->lora_rank,
                   in->lora_alpha, (long long)in->lora_rank);
        printf("saved the trained weights to %s\n", o->save);
    }
    if (o->save_safetensors) { /* safetensors export */
        char err[1024];
        if (train_export_write_lora(r->export, in, host32, r->merge, o->save_safetensors, err,
                                    sizeof err))
            return error("--save-safetensors: %s", err);
        printf("saved the trained weights as %d PyTorch tensors to %s\n",
               train_export_count(r->export), o->save_safetensors);
    }
    if (o->pretrained.dir) { /* a model folder for from_pretrained */
        char err[1024];
        if (train_pretrained_write(&r->pre, &o->pretrained, r->export, in, host32, r->merge, err,
                                   sizeof err))
            return error("%s", err);
        printf("saved the trained model (%d files: config, %d weights%s) to %s\n",
               r->pre.n_names, train_export_count(r->export),
               r->pre.n_tok ? ", tokenizer" : "", o->pretrained.dir);
    }
    if (o->adapter.save_dir) { /* PEFT's adapter directory */
        char err[1024];
        int n_saved = 0;
        if (train_adapter_save(&o->adapter, in, host32, &n_saved, err, sizeof err))
            return error("%s", err);
        printf("saved %d LoRA adapter tensors (PEFT) to %s\n", n_saved, o->adapter.save_dir);
    }
    return 0;
}

/* The outputs (--save: the trained weights into a copy of the model; --dump-grads was written
 * after the first step) and the peak memory, planned against what the process or the device
 * actually used. */
static int run_report(run *r)
{
    const options *o = &r->o;
    const sbp_step_info *in = r->in;
    int st;
    if (r->ckpt.stopped) /* checkpoints: stopped by a signal, the checkpoint is the */
        return 0;        /* output; --save and friends are for a finished run */
    /* the writers see every parameter in fp32 (f32_view) */
    f32_view view = {.info = *in};
    const float *host32 = r->host_params;
    if (o->save || o->save_safetensors || o->adapter.save_dir || o->pretrained.dir) {
        if (!r->host_visible && (st = RT(r->rt, copy, copy_ctx, r->host_params, r->d_params,
                                         r->pbytes, SBPRT_COPY_DEVICE_TO_HOST)))
            return copy_failed(r, st);
        if (f32_view_make(o, in, r->host_params, &view))
            return -1;
        if (view.block) {
            in = &view.info;
            host32 = view.block;
        }
    }
    /* nothing non-finite leaves the run (a cuda step's weights are checked only here) */
    char err[1024];
    int rc = 0;
    if ((o->save || o->save_safetensors || o->adapter.save_dir || o->pretrained.dir) &&
        train_finite_check(in, TRAIN_BLOCK_PARAMS, host32, 0, in->param_elems, false,
                           "the trained weights", err, sizeof err))
        rc = error("%s: nothing saved", err);
    if (!rc)
        rc = run_saves(r, in, host32);
    f32_view_free(&view);
    if (rc)
        return rc;
    in = r->in;

    if (o->dump_grads)
        printf("wrote the first step's gradients to %s\n", o->dump_grads);

    if (r->n_rows > 0 && r->pairs_full > 0)
        printf("packed documents: %lld documents (a row's padding counts as one) in %lld rows "
               "of %lld tokens (mean %.1f tokens); "
               "causal attention over them is %.1f%% of the work of unpacked rows (%.3g of %.3g "
               "query-key pairs: the packed kernels skip other documents' keys)\n",
               (long long)r->n_docs, (long long)r->n_rows, (long long)r->T,
               (double)(r->n_rows * r->T) / (double)(r->n_docs ? r->n_docs : 1),
               100.0 * r->pairs_packed / r->pairs_full, r->pairs_packed, r->pairs_full);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    /* the trained parameters' moments (under ZeRO: this rank's slice of them) */
    size_t opt_state = o->adamw ? 2 * r->mbytes : 0;
    char b1[32], b2[32], b3[32], b4[32];
    if (r->host_visible) {
        printf("peak memory: planned %s (step %s + optimizer state %s), actual %s (peak RSS)%s\n",
               cli_human_bytes(b1, sizeof b1, (double)in->planned_peak_bytes + (double)opt_state),
               cli_human_bytes(b2, sizeof b2, (double)in->planned_peak_bytes),
               cli_human_bytes(b3, sizeof b3, (double)opt_state),
               cli_human_bytes(b4, sizeof b4, (double)ru.ru_maxrss * 1024.0),
               dist.on ? " per rank" : "");
    } else {
        printf("peak device memory: planned %s (step %s + optimizer state %s)",
               cli_human_bytes(b1, sizeof b1, (double)in->planned_peak_bytes + (double)opt_state),
               cli_human_bytes(b2, sizeof b2, (double)in->planned_peak_bytes),
               cli_human_bytes(b3, sizeof b3, (double)opt_state));
        if (r->dev_mem && r->dev_peak >= r->dev_before)
            printf(", actual %s more in use than before the arena (%zu bytes: arena, constants, "
                   "runtime scratch, cuBLAS workspace; at most %s of %s in use, sampled after "
                   "each step)",
                   cli_human_bytes(b4, sizeof b4, (double)(r->dev_peak - r->dev_before)),
                   r->dev_peak - r->dev_before, cli_human_bytes(b1, sizeof b1, (double)r->dev_peak),
                   cli_human_bytes(b2, sizeof b2, (double)r->dev_total));
        printf("\npeak host memory: %s (peak RSS)\n",
               cli_human_bytes(b4, sizeof b4, (double)ru.ru_maxrss * 1024.0));
    }
    if (dist.on) /* cpu and cuda steps alike */
        printf("data parallel: %d ranks, ZeRO %d: optimizer state %zu bytes per rank "
               "(%zu without ZeRO), global batch %lld rows per micro-batch\n", dist.size,
               dist.zero, opt_state, o->adamw ? 2 * r->gbytes : 0, (long long)r->G);
    return 0;
}

static void run_free(run *r)
{
    clear_bar();
    train_ckpt_free(&r->ckpt); /* checkpoints */
    char log_err[512]; /* a run that failed keeps the steps it logged */
    (void)train_log_close(&r->log, log_err, sizeof log_err);
    if (r->own_host) {
        free(r->host_params);
        free(r->host_grads);
    }
    if (r->arena)
        r->rt.arena_free(*r->rt.arena_ctx, r->arena);
    runtime_stop(&r->rt);
    free(r->ids);
    free(r->labels);
    free(r->doc_ids);
    free(r->mb_doc_ids);
    train_eval_close(&r->ev);
    ti_free(&r->ti);
    if (r->have_shard)
        sbpio_shard_close(&r->shard);
    if (r->have_ds)
        train_dataset_close(&r->ds);
    free(r->ref_ex);
    free(r->ref_tok);
    free(r->row_ex);
    model_free(&r->mdl);
    train_export_free(r->export);
    train_pretrained_free(&r->pre);
    train_adapter_merge_plan_free(r->merge);
    sbp_file_set_free(&r->inputs);
    /* The step library stays loaded until the process ends: a cuda step's libraries (the CUDA
     * runtime, cuBLAS, libstdc++) keep global state that dlclose would leave unreachable, which
     * LeakSanitizer then reports as leaks. */
}

int main(int argc, char **argv)
{
    run r = {0};
    char derr[512]; /* MPI, only when a launcher started this process */
    if (train_dist_init(&dist, &argc, &argv, derr, sizeof derr)) {
        error("%s", derr);
        return 1;
    }
    prog = dist.prog;
    int prc = parse_args(argc, argv, &r.o);
    if (prc > 0 && dist.on && dist_agree(&r.o, true))
        prc = -1;
    if (prc) {
        train_dist_end(&dist, prc > 0 ? 0 : 1);
        return prc > 0 ? 0 : 1;
    }
    if (dist.on && dist_agree(&r.o, false)) { /* before anything that could wait on another rank */
        train_dist_end(&dist, 1);
        return 1;
    }
    if (dist.on && dist.rank != 0) {
        /* rank 0 prints and writes the outputs; the others only report errors
         * (stderr). --dump-grads stays set: ZeRO 2 then sums the whole first gradient on
         * every rank alike, and only rank 0 writes it (see run_step). */
        if (!freopen("/dev/null", "w", stdout))
            return error("cannot silence rank %d's output: /dev/null", dist.rank), 1;
        r.o.save = r.o.save_safetensors = r.o.sched.log_path = NULL;
        r.o.adapter.save_dir = NULL;
        r.o.pretrained.dir = NULL;
    }
    int rc = run_load(&r) || run_allocate(&r) ||
                     (!r.logps_only && (run_loop(&r) || run_report(&r)))
                 ? 1
                 : 0;
    run_free(&r);
    train_dist_end(&dist, rc); /* a failed rank aborts every rank */
    return rc;
}
