/* sbp_step.h — the interface of a compiled training step (what `sbpc -o train_step.so` exports).
 *
 * A step library is self-describing: sbp_step_get_info() tells its dims, strategy, objective,
 * parameter table (names and shapes of the ONNX initializers, offsets in one flat block) and
 * workspace size from the memory plan. The caller (sbp-train, or a user's C program) owns all
 * memory: the parameter block, the gradient block (same layout), and one workspace of exactly
 * workspace_bytes — the step never allocates. Optimizer updates are the caller's, with the
 * runtime's sbprt_adamw_update / sbprt_sgd_update over the flat blocks.
 *
 * Target (info->target): a "cpu" step runs on the CPU runtime and all of the memory above is
 * host memory. A "cuda" step (sbpc --target cuda) runs on the CUDA runtime: the parameter,
 * gradient and workspace blocks AND args->input_ids / args->labels are DEVICE pointers (give
 * the step's own runtime functions, which it exports, e.g. sbprt_arena_alloc and sbprt_memcpy,
 * a context made by its sbprt_ctx_create); only args itself, *loss and *n_scored are host
 * memory. The step's constants (RoPE tables, positions) go to a device block of its own on
 * the first run (sbp_step_init); the scored positions are counted on a host copy of the
 * labels, copied only when needed (denominator 0, or n_scored asked for). Kernels run
 * asynchronously on the context's stream; sbp_step_run ends with sbprt_sync, so its status
 * covers every kernel of the step (an out-of-range token id or label: SBPRT_ERR_RANGE), and
 * sbprt_ctx_last_error(ctx) describes a failure.
 *
 * Precision (sbpc --precision bf16, cuda steps only): nothing changes for the caller. The
 * parameter and gradient blocks stay fp32 (the master weights; the optimizer updates them as
 * always); the step stores its activations as bf16 in the workspace, which also holds a bf16
 * copy of the parameters that the step refreshes at its start (workspace_bytes and
 * planned_peak_bytes include it).
 * With sbpc --base-precision bf16 (ABI 3), a frozen weight that only matrix products read
 * (LoRA's base model, --freeze) is kept as bf16 only: its param->storage is
 * SBP_STEP_PARAM_BF16 and its numel bf16 values (round to nearest even of the fp32 ones)
 * occupy (numel + 1) / 2 floats' room at its offset, after every fp32 parameter. It costs 2
 * bytes an element instead of 4 (+ 2 for the copy). sbp_step_param_store / _fetch convert.
 *
 * Objectives (info->objective). The logp of a row b is Σ_t log softmax(logits[b,t])[labels[b,t]]
 * over its scored positions; values at unscored positions of the [B*T] inputs are not read.
 *   "sft"   the mean cross-entropy: Σ over scored tokens / denominator (scored positions).
 *   "dpo"   rows 0..B/2-1 are the chosen responses, B/2..B-1 the rejected ones, pair i =
 *           (row i, row B/2 + i): loss = Σ over pairs of -log σ(β ((logp_c - ref_c) - (logp_r -
 *           ref_r))) / denominator (pairs). The step computes each row's logp first (with
 *           stream, a first pass over the LM head only), then the backward: exact. With
 *           args->row_logps (ABI 6) it also hands those logps back (host memory, double),
 *           from which the caller gets DPO's rewards β (logp - ref) of the pairs it trained
 *           on (sbp-train logs them as TRL does). A GRPO step does not write row_logps: its
 *           per-token logp lives in the head's chunks only (sbp_step_logps gives them).
 *   "grpo"  per scored token: ratio = exp(logp - old), l = -min(ratio A, clip(ratio, 1-ε,
 *           1+ε) A) + β (exp(ref - logp) - (ref - logp) - 1), A the row's advantage; loss =
 *           Σ_rows (Σ_t l / the row's scored tokens) / denominator (rows) for grpo_norm
 *           "sequence", Σ l / denominator (scored positions) for "token". A "sequence" row
 *           with no scored token adds nothing.
 * Per document (info->per_document, ABI 8: sbpc --packed --per-document, DPO and GRPO only):
 *   the unit is each DOCUMENT of a row instead of the row. The documents of a row are the
 *   maximal runs of equal args->doc_ids along it that hold at least one scored label (a run
 *   with none, e.g. padding, is not a document), numbered k = 0, 1, .. along the row; the
 *   value of document k of row b lives at index b*T + k of a [B*T] array (k < T always).
 *   "dpo"   pair (i, k) = (document k of row i, document k of row B/2 + i) for i < B/2; rows i
 *           and B/2 + i must hold as many documents, else sbp_step_run returns
 *           SBPRT_ERR_INVALID. z = β ((logp_c - ref_c) - (logp_r - ref_r)) with each
 *           document's own logp (the sum over its scored tokens) and ref_logps[b*T + k];
 *           loss = Σ over pairs of -log σ(z) / denominator (document pairs); each scored token
 *           of a document gets its document's coefficient ∓β σ(-z) / denominator.
 *   "grpo"  A is the token's document's advantage, advantages[b*T + k]; "sequence": loss =
 *           Σ_documents (Σ_t l / the document's scored tokens) / denominator (documents);
 *           "token" as without per_document. old_logps / ref_logps stay per token.
 *   Sums are in double, in order, as per row; a row that is one document gives the per-row
 *   values (at b*T + 0).
 * Gradient accumulation over K micro-batches: pass the denominator of the whole batch (of all
 * K) to each step with accumulate = 1 after the first; the losses then add up to the whole
 * batch's loss and the gradients to its gradient. For DPO each micro-batch must hold whole
 * pairs (its own rows i and B/2 + i).
 *
 * Layout of the parameter block: each parameter with storage occupies numel floats at its
 * offset (sbp_step_param_room: half as many for one kept as bf16, ABI 3), row-major in the ONNX
 * initializer's own shape. A re-tied parameter (tied_to >= 0) has
 * no storage of its own: it is the transpose of its owner, and its gradient is the owner's
 * (reported by sbp-train under both names, each in its own layout).
 * Layout of the gradient block (ABI 2): the trained parameters only, each at its grad_offset
 * (in table order, numel floats, the parameter's layout), grad_elems floats in all: a frozen
 * parameter (sbpc --freeze, or LoRA's base model) has no gradient (grad_offset SIZE_MAX), so
 * neither the gradients nor an optimizer's state, which the caller sizes like the gradient
 * block, cost memory for it. With nothing frozen the two layouts are the same.
 */
#ifndef SBP_STEP_H
#define SBP_STEP_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "sbprt.h"

#define SBP_STEP_ABI_VERSION 9
#define SBP_STEP_MAX_RANK 8

typedef struct sbp_step_param {
    const char *name;                  /* ONNX initializer name */
    int rank;
    int64_t dims[SBP_STEP_MAX_RANK];   /* the initializer's own shape */
    size_t numel;
    size_t offset;                     /* element offset in the parameter block */
    int trainable;                     /* 0: frozen (--freeze): no gradient */
    int tied_to;                       /* -1, or index of the parameter this one transposes */
    size_t grad_offset;                /* ABI 2: element offset in the gradient block; SIZE_MAX
                                        * when not trainable (a tied parameter: its owner's) */
    int storage;                       /* ABI 3: SBP_STEP_PARAM_F32, or SBP_STEP_PARAM_BF16 (a
                                        * frozen weight kept as bf16 only: sbpc --base-precision
                                        * bf16; or a trained one whose master the caller keeps:
                                        * --offload optimizer); read and write it with sbp_step_param_store /
                                        * sbp_step_param_fetch below */
} sbp_step_param;

enum { SBP_STEP_PARAM_F32 = 0, SBP_STEP_PARAM_BF16 = 1 };

typedef struct sbp_step_info {
    int abi_version;                   /* SBP_STEP_ABI_VERSION */
    const char *target;                /* "cpu" | "cuda" */
    const char *strategy;              /* "store" | "checkpoint" | "stream" */
    const char *objective;             /* "sft" | "graph-loss" | "dpo" | "grpo" */
    const char *model_path;            /* the model it was compiled from (informational) */
    uint64_t model_fingerprint;        /* FNV-1a over parameter names, dtypes and shapes */
    int64_t batch, seq_len, vocab;     /* B, T, V */
    int n_params;
    const sbp_step_param *params;      /* [n_params] */
    size_t param_elems;                /* floats in the parameter block */
    size_t workspace_bytes;            /* the planned arena for activations and scratch */
    size_t planned_peak_bytes;         /* params + grads + workspace (+ optimizer state: caller) */
    /* Appended to ABI 1 for DPO / GRPO (sbpc --objective dpo|grpo --beta --epsilon
     * --grpo-norm, fixed at compile time). Steps from an older sbpc lack them: read them only
     * when objective is "dpo" or "grpo". */
    double beta;                       /* DPO β; GRPO's KL coefficient (0: no KL term) */
    double epsilon;                    /* GRPO: the ratio is clipped to [1 - ε, 1 + ε] */
    const char *grpo_norm;             /* GRPO: "sequence" | "token" (else NULL) */
    /* ABI 2: the gradient block, evaluation, packed documents, LoRA. */
    size_t grad_elems;                 /* floats in the gradient block (the trained parameters;
                                        * param_elems when nothing is frozen) */
    size_t eval_workspace_bytes;       /* sbp_step_eval's planned workspace; 0: the step has
                                        * no sbp_step_eval (DPO / GRPO: see sbp_step_logps, or
                                        * sbpc --no-eval) */
    size_t eval_planned_peak_bytes;    /* params + eval workspace (no gradients) */
    int packed;                        /* 1: compiled with sbpc --packed: args->doc_ids is
                                        * required (one document id per token) */
    int64_t lora_rank;                 /* sbpc --lora RANK (0: no adapters), with the */
    double lora_alpha;                 /* scaling numerator (--lora-alpha; scaling = alpha /
                                        * rank) and */
    uint64_t lora_seed;                /* the adapters' initial values' seed (--lora-seed) */
    /* ABI 4: log-probabilities (DPO / GRPO). */
    size_t logp_workspace_bytes;       /* sbp_step_logps's planned workspace; 0: the step has
                                        * no sbp_step_logps (SFT / graph loss, or --no-eval) */
    size_t logp_planned_peak_bytes;    /* params + log-probability workspace (no gradients) */
    /* ABI 5: host offload (sbpc --offload checkpoints). */
    const char *offload;               /* "" (nothing offloaded), "checkpoints", "optimizer" or
                                        * "checkpoints,optimizer". With "optimizer" the caller
                                        * keeps the fp32 master weights and the optimizer state
                                        * in host memory: every trained weight that only matrix
                                        * products and embedding lookups read is bf16 alone in
                                        * the parameter block (storage SBP_STEP_PARAM_BF16), and
                                        * after each update the caller stores the masters into
                                        * the block with sbp_step_param_store, which rounds them
                                        * as the step's own bf16 copy of an fp32 weight would */
    size_t host_bytes;                 /* the host workspace sbp_step_run needs (args->
                                        * host_workspace); 0: none. The layer checkpoints
                                        * live there between the forward and the backward;
                                        * planned_peak_bytes is device memory only */
    /* ABI 6 */
    int grads_on_host;                 /* 1 (offload "optimizer"): args->grads is HOST memory,
                                        * from sbprt_host_alloc (page-locked on CUDA); each
                                        * gradient is accumulated in the workspace and copied
                                        * into it after its last contribution, so the device
                                        * holds a few layers' gradients, not the block, and
                                        * planned_peak_bytes counts none */
    /* ABI 7: sequence parallelism (sbpc --seq-parallel N). */
    int seq_parallel;                  /* 0: an ordinary step. N >= 1 (sbpc --seq-parallel N;
                                        * N = 1 runs the exchanges through a group of one, to
                                        * test their paths): the step is one rank of a group of N
                                        * that share every row: seq_len is this rank's share
                                        * (T / N consecutive tokens; rank r holds positions
                                        * r*seq_len ..), args' [B*seq_len] arrays (input_ids,
                                        * labels, doc_ids) hold those tokens, and the context
                                        * must carry a communicator of size N
                                        * (sbprt_ctx_set_comm) whose rank says which share it
                                        * is. args->denominator must be the whole rows' (all N
                                        * ranks'; 0 is refused), and *n_scored counts this
                                        * rank's tokens. Every rank of the group must call
                                        * sbp_step_run (and sbp_step_eval) together: the
                                        * attention exchanges heads between them. The weight
                                        * gradients are this rank's tokens' share: summed over
                                        * the group (and any data-parallel ranks) they are the
                                        * whole batch's. */
    /* ABI 8 */
    int per_document;                  /* 1: compiled with sbpc --packed --per-document (DPO /
                                        * GRPO): the objective's unit is each document of a row
                                        * (see "Objectives"): ref_logps (DPO), advantages (GRPO),
                                        * row_logps and sbp_step_logps's row_logps are [B*T],
                                        * document k of row b at b*T + k */
    /* ABI 9: Mixture-of-Experts (docs/moe-export.md). */
    int moe_layers;                    /* the step's MoE layers (0: a dense model) */
    int64_t moe_experts;               /* E, the experts of each */
    double router_aux_coef;            /* the load-balancing loss's coefficient (sbpc
                                        * --router-aux-coef, default the config's
                                        * router_aux_loss_coef; 0: the term is off): *loss is
                                        * transformers' CE + router_aux_coef x aux, aux =
                                        * E / R^2 Σ_e c_e P_e pooled over the MoE layers (c_e
                                        * the (token, choice) pairs routed to expert e, P_e its
                                        * router probabilities summed over the tokens, R the
                                        * tokens of all MoE layers); the term is this batch's,
                                        * whatever args->denominator */
} sbp_step_info;

typedef struct sbp_step_args {
    const float *params;               /* [param_elems] */
    float *grads;                      /* [grad_elems]; written (or added to, see below);
                                        * host memory when info->grads_on_host */
    int accumulate;                    /* 0: grads are overwritten; 1: added to (grad-accum) */
    const int32_t *input_ids;          /* [B*T] token ids in [0, V) (cuda: device memory) */
    const int32_t *labels;             /* [B*T] target of position t, -100 = not scored
                                        * (cuda: device memory) */
    double denominator;                /* the mean's divisor, 0 = this batch's: SFT and GRPO
                                        * token: scored positions; GRPO sequence: rows; DPO:
                                        * pairs (see "Objectives"); per_document: documents
                                        * (GRPO sequence), document pairs (DPO) */
    void *workspace;                   /* [workspace_bytes], SBPRT_ALIGN-aligned */
    double *loss;                      /* out: the loss (mean over the denominator) */
    int64_t *n_scored;                 /* out, may be NULL: scored positions in this batch */
    /* Appended to ABI 1: the DPO / GRPO inputs (other objectives ignore them; a caller that
     * zero-initialises the struct stays valid), in the memory labels are in (cuda: device). */
    const float *ref_logps;            /* DPO: [B] the reference model's logp of each row
                                        * (per_document: [B*T], document k of row b at b*T +
                                        * k); GRPO: [B*T] its logp of each label, required
                                        * when beta > 0, not read when beta == 0 */
    const float *old_logps;            /* GRPO: [B*T] the sampling policy's logp of each label;
                                        * NULL: on-policy (old = the current logp, detached) */
    const float *advantages;           /* GRPO: [B] one per row (per_document: [B*T], one per
                                        * document, document k of row b at b*T + k) */
    /* ABI 2 */
    const int32_t *doc_ids;            /* packed steps: [B*T] each token's document id, non-
                                        * decreasing along a row (cuda: device memory); a token
                                        * attends only to earlier tokens of its own document and
                                        * positions restart at each document. Else not read. */
    /* ABI 5 */
    void *host_workspace;              /* [host_bytes] host memory, SBPRT_ALIGN-aligned, from
                                        * sbprt_host_alloc (page-locked on CUDA, so that the
                                        * transfers overlap the kernels); required when
                                        * host_bytes > 0, else not read */
    /* ABI 6 */
    double *row_logps;                 /* out, may be NULL: DPO: [B] each row's logp as this
                                        * step's forward computed it before the backward
                                        * (summed in double: the value its loss uses), HOST
                                        * memory on every target, so that the caller can log
                                        * the rewards β (logp - ref); per_document (ABI 8):
                                        * [B*T], document k of row b's logp at b*T + k, 0
                                        * elsewhere; other objectives do not write it (see
                                        * "Objectives") */
    /* ABI 9 */
    double *aux_loss;                  /* out, may be NULL: a MoE step's load-balancing
                                        * loss aux itself (transformers' out.aux_loss, before
                                        * the coefficient: *loss holds router_aux_coef x aux;
                                        * computed also when the coefficient is 0); not
                                        * written for a dense model; HOST memory */
} sbp_step_args;

/* Floats of the parameter block that parameter p occupies (a tied parameter: none). */
static inline size_t sbp_step_param_room(const sbp_step_param *p)
{
    if (p->tied_to >= 0)
        return 0;
    return p->storage == SBP_STEP_PARAM_BF16 ? (p->numel + 1) / 2 : p->numel;
}

/* bf16 of x, rounded to nearest even (a NaN stays a quiet NaN): the rounding of the runtime's
 * sbprt_convert_f32_to_bf16, so a weight stored here equals the step's own copy of it. */
static inline uint16_t sbp_step_bf16_bits(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40u);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* Writes p's numel fp32 values (src, p's own layout) into its storage in the HOST parameter
 * block (a cuda step: a host copy of it, uploaded after). */
static inline void sbp_step_param_store(const sbp_step_param *p, float *block, const float *src)
{
    if (p->storage != SBP_STEP_PARAM_BF16) {
        for (size_t i = 0; i < p->numel; i++)
            block[p->offset + i] = src[i];
        return;
    }
    uint16_t *d = (uint16_t *)(void *)(block + p->offset);
    for (size_t i = 0; i < p->numel; i++)
        d[i] = sbp_step_bf16_bits(src[i]);
}

/* p's numel values as fp32 into dst, from the HOST parameter block (bf16 widens exactly). */
static inline void sbp_step_param_fetch(const sbp_step_param *p, const float *block, float *dst)
{
    if (p->storage != SBP_STEP_PARAM_BF16) {
        for (size_t i = 0; i < p->numel; i++)
            dst[i] = block[p->offset + i];
        return;
    }
    const uint16_t *s = (const uint16_t *)(const void *)(block + p->offset);
    for (size_t i = 0; i < p->numel; i++) {
        uint32_t u = (uint32_t)s[i] << 16;
        memcpy(&dst[i], &u, sizeof u);
    }
}

const sbp_step_info *sbp_step_get_info(void);
/* One forward + backward. Returns SBPRT_OK or a runtime status (e.g. SBPRT_ERR_RANGE for a
 * token id >= V); on error the gradients are unspecified. */
int sbp_step_run(sbprt_ctx *ctx, const sbp_step_args *args);

/* Appended to ABI 1 (steps from an older sbpc lack them: look them up with dlsym).
 * sbp_step_init prepares what the step owns: a cuda step allocates its constants' device block
 * (through the runtime, on the current device) and uploads them; a cpu step has nothing to do.
 * sbp_step_run calls it on its first run; calling it first keeps that upload out of the first
 * step (and out of a timing). sbp_step_release frees it (call it before destroying the context
 * the step ran with); a later run would prepare it again. Neither is safe to call while
 * another thread runs the step. */
int sbp_step_init(sbprt_ctx *ctx);
void sbp_step_release(sbprt_ctx *ctx);

/* ABI 2: evaluation. The forward only, with the loss of the step's objective (SFT / graph
 * loss), on its own memory plan: no gradients, no backward buffers, the StreamBP chunk loops of
 * the training forward (the same chunk sizes, so the loss is the training step's loss on the
 * same batch). args->grads and accumulate are not read; args->workspace must hold
 * info->eval_workspace_bytes (a training workspace does when it is at least as large).
 * Present only when info->eval_workspace_bytes > 0. */
int sbp_step_eval(sbprt_ctx *ctx, const sbp_step_args *args);

/* ABI 4: log-probabilities, for DPO and GRPO steps (what they have instead of sbp_step_eval):
 * the step's own forward, chunked as its training forward is (stream: the layers' chunk loops,
 * then one chunk loop over the LM head, DPO's first pass: no [B*T, V] logits), on its own
 * memory plan, with no gradient and no loss. It writes
 *   row_logps[b]       (may be NULL) logp_b = Σ_t log softmax(logits[b,t])[labels[b,t]] over
 *                      the row's scored positions (the per-token values summed in double, in
 *                      order, as DPO's step sums them; 0 for a row with nothing scored);
 *                      per_document (ABI 8): [B*T], row_logps[b*T + k] the logp of document
 *                      k of row b (summed likewise), 0 beyond the row's documents;
 *   token_logps[b*T+t] (may be NULL) each position's log softmax(logits[b,t])[labels[b,t]],
 *                      0 at positions not scored (labels -100): every element is written;
 * both in the memory labels are in (cuda: device memory), so that they can be passed as a
 * later step's args->ref_logps (DPO: row_logps; GRPO: token_logps) or args->old_logps (GRPO).
 * args->params, input_ids, labels, workspace (and doc_ids for a packed step) are read;
 * *args->n_scored is written when given; grads, accumulate, denominator, loss, ref_logps,
 * old_logps and advantages are not read. args->workspace must hold info->logp_workspace_bytes
 * (a training workspace does when it is at least as large). The per-token values are the
 * training step's own on the same batch (the same kernels on the same chunks).
 * With LoRA, the adapters' initial B = 0 makes the model the base model: logps computed with
 * the initial adapter values are the reference model's. Present only when
 * info->logp_workspace_bytes > 0. */
int sbp_step_logps(sbprt_ctx *ctx, const sbp_step_args *args, float *row_logps,
                   float *token_logps);

#endif
