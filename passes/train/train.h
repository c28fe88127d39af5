/* train.h — the training half of passes/ (passes/train/): from a graph that ends in its loss
 * to a training program (autodiff, strategies, precision, the memory plan).
 *
 * After canonicalisation the graph holds semantic ops, and the graph half's last rewrites
 * (passes.h) have prepared it:
 *
 *   objective    (graph/objective.c) makes the graph end in one scalar loss: a graph that
 *                outputs logits [B,T,V] gets the mean SFT cross-entropy appended (a new
 *                `labels` input, -100 = not scored); a graph that already ends in a loss
 *                (SoftmaxCrossEntropyLoss, canonicalised to CrossEntropy) keeps it.
 *   freeze       (graph/freeze.c) marks parameters whose name matches a regex frozen.
 *
 * Then the train build (train_build.c, the driver, over autodiff.c, grad_rules.c, stream.c,
 * plan.c; the toolkit they share is train_tx.c) lowers every node to runtime calls (forward),
 * derives the backward by reverse mode with one gradient rule per op (a table in
 * grad_rules.c; gradients of a value with several uses are summed because the runtime's
 * backward kernels accumulate), splits the graph into segments at the residual-stream values
 * between layers, and lays every buffer out in one workspace. Its stages are the flow's
 * autodiff, stream and plan, each file named after the stage it implements.
 *
 * The training program is a linear schedule of blocks (one C function each) of instructions;
 * an instruction is one runtime call (train_kernels.def) on named buffers with scalar
 * arguments and the IR node it came from. Buffers are the parameter and gradient blocks of
 * codegen/sbp_step.h (element offsets), constants (emitted as static arrays), the step's
 * token-id and label arrays, and workspace buffers (byte offsets).
 *
 * Strategies:
 *   store        every activation is kept from the forward to the backward;
 *   checkpoint   only values that cross a segment boundary (each layer's input) are kept;
 *                the rest of a segment lives in an overlay region that every segment reuses,
 *                and the backward of a segment first recomputes its forward there;
 *   stream       StreamBP (stream.c, after the sequence analysis of sequence.c):
 *                checkpoints as above, but each layer runs as a loop over sequence chunks in
 *                the forward and in the backward (K/V computed once per layer, weight and
 *                dK/dV gradients accumulated over the chunks), and the LM head with its loss
 *                runs chunk by chunk, forward and backward fused, so the full logits never
 *                exist. See "Chunk loops" below.
 *
 * Objectives at the LM head (objective_pref.c). SFT lowers the loss node to the fused
 * cross-entropy. DPO and GRPO lower it to the label log-probability of each token
 * (sbprt_label_logprob_forward) and write dlogits from a gradient by it (sbprt_label_logprob_
 * grad), so full logits never exist with stream either. GRPO is separable over tokens: its
 * per-token loss and derivative (sbprt_grpo_token_loss) run inside the head's chunk loop, with
 * each row's weight (its normalisation) computed before it from the labels (GRPO_WEIGHTS, a
 * host step of the emitted code). DPO is not: the logp of a row is a sum over all its tokens, so
 * the head first reduces the per-token logp (stream: a first chunk loop over the LM head, no
 * gradient; store/checkpoint: the forward), then a host step (DPO_COEF) computes the loss and
 * each row's coefficient dL/dlogp(row), and the backward takes dlogp per token = its row's
 * coefficient: exact, at the cost of the LM head's forward run twice with stream.
 *
 * Chunk loops (stream). A block may hold loops (tp_block.loops): a loop is a range of the
 * block's instructions run once per chunk, the chunk being rows [t0, t0 + len) of each batch
 * element b of a [batch, seq] row space (layers: batch = B, seq = T; the LM head: batch = 1,
 * seq = B*T, the flattened token rows). Inside a loop an operand may be an offset into its
 * buffer (tp_inst.off: elements per_row * r0 + per_batch * b, with r0 = b * seq + t0, the
 * chunk's first row) and an argument may be t0 itself (TP_ARG_T0, attention's q_start).
 * Buffers hold either every token's rows (tp_buf.rows = B*T, sliced by the loops) or one
 * chunk's rows (rows = the chunk capacity, reused by every iteration). A chunk loop is split
 * into the loops of one `group`: the full chunks, then the tail chunk when len does not
 * divide seq; together they cover every row exactly once (sbp_train_verify checks it).
 * Liveness across a loop (for memory planners): a buffer used inside a loop and also before
 * or after it is live for the whole loop; one used only inside may be reused only after the
 * loop, unless every use in the body is preceded, in the same iteration, by its write (the
 * chunk-local buffers: activations written by the body, gradients zeroed at its start).
 *
 * Precision (sbp_train_options.bf16, sbpc --precision bf16 for the CUDA target). The program
 * is the fp32 one; then every float workspace buffer used only as an activation operand of a
 * kernel (the BF16 column of train_kernels.def, 'b' / 'c') is marked bf16 and planned at 2 bytes an element,
 * while parameters and their gradients (the caller's fp32 blocks), statistics (mean, rstd,
 * lse), loss sums and any buffer some kernel reads or writes as fp32 stay fp32. GEMMs read a
 * parameter through its bf16 copy in the workspace (bf16_shadow_offset), which the step fills
 * from the fp32 parameters at its start. A DPO / GRPO objective has no bf16 form: an error.
 * With base_bf16 (sbpc --base-precision bf16: LoRA's frozen base model, or --freeze), a frozen
 * parameter whose every use is a GEMM operand or the table of an embedding lookup has no fp32
 * copy at all: the parameter block holds its bf16 values (laid out after the fp32 parameters,
 * each at a 16-byte boundary), the GEMMs and the lookup (sbprt_embedding_forward_bf16_table)
 * read them there, and the workspace's copy covers the fp32 parameters only. A tied embedding
 * and LM head is one such parameter (a re-tied copy reads its owner's buffer). Such a
 * parameter costs 2 bytes an element instead of 4 + 2. Nothing trains it, so nothing rounds it
 * again: the step computes exactly what the bf16 copy of its fp32 value would give (the bf16
 * lookup of an fp32 table rounds each element as that copy does).
 *
 * Evaluation (sbp_train_options.eval; the step's sbp_step_eval). The same graph built once
 * more with no gradient anywhere (forward_only: every parameter treated as frozen): the
 * strategy's forward with the same chunk sizes (stream: the layers' chunk loops, then the LM
 * head's chunk loop running the cross-entropy without dlogits), no backward block, and its own
 * memory plan, in which a layer's input dies once the next layer has read it. Its loss is
 * therefore the training step's loss on the same batch, bit for bit. Its blocks are named
 * eval_*. Built for the SFT and graph-loss objectives (DPO / GRPO need their own inputs: none).
 *
 * Log-probabilities (sbp_train_options.eval for DPO / GRPO; the step's sbp_step_logps). What
 * those objectives have instead: the same graph built once more forward only (logp_only: no
 * gradient, no loss), whose LM head computes each token's label log-probability into tok_logp
 * (sbprt_label_logprob_forward) and nothing after it: no DPO coefficients, no GRPO weights or
 * loss. Stream runs the training forward's chunk loops and, in the head, the chunk loop of
 * DPO's first pass (one pass over the head, the full logits never exist); store / checkpoint
 * their forward. Its own memory plan; blocks named logp_*. The per-token values are therefore
 * the training step's own (DPO's first pass computes the same kernels on the same chunks).
 *
 * Packed documents (sbp_train_options.packed, sbpc --packed). The step takes one document id
 * per token (args->doc_ids, a TP_BUF_DOCS buffer); the forward block starts by deriving from
 * them, in the workspace, each token's document start (doc_start_buf) and position in its
 * document (doc_pos_buf). Attention runs as its packed kernels (block-diagonal causal: a query
 * reads only earlier keys of its own document, key tiles of other documents skipped), reading
 * doc_start; RoPE's positions are doc_pos (tx_positions); a learned position embedding reads
 * doc_pos through the graph input sbp_doc_positions that graph/packed.c puts in place of its
 * constant positions. Everything else is unchanged: packing is a property of the inputs.
 * With per_document (sbpc --per-document; DPO and GRPO only) the objective's unit becomes the
 * document: the documents of a row are the maximal runs of equal ids that hold a scored label
 * (k = 0, 1, .. along the row), and the per-row inputs and outputs (DPO's ref_logps and
 * row_logps, GRPO's advantages) become [B*T], document k of row b at b*T + k. DPO pairs
 * document k of row i with document k of row B/2 + i (DPO_COEF reads the ids); GRPO takes each
 * token's weight and advantage from its document (GRPO_DOC_WEIGHTS, a host step, into the flat
 * tok_weight / tok_adv buffers that GRPO_DOC_LOSS indexes per token).
 *
 * Sequence parallelism (sbp_train_options.seq_parallel = N, sbpc --seq-parallel N; seqpar.c).
 * The graph is bound at the whole length T (so RoPE's tables and every constant are the whole
 * sequence's); after the sequence analysis every TOKEN value's sequence axis becomes T/N, the
 * rank's share, and the program is one rank's: every op but attention is row-wise and runs on
 * the rank's tokens; RoPE and a learned position embedding read each token's position in the
 * whole row (doc_pos_buf, filled by SP_POSITIONS, or for packed documents by SP_DOC_POSITIONS
 * from the whole rows' document starts); attention runs as SP_ATTENTION_FWD / _BWD on K/V of
 * the rank's heads over the whole sequence (SP_KV_GATHER before, SP_KV_SCATTER after: with
 * stream once per layer, around the chunk loop). The runtime's all-to-alls exchange heads;
 * the weight gradients stay the rank's share (the caller sums them over the ranks).
 *
 * Memory plan (memplan.h and plan.c, the last step of sbp_train_build): every workspace buffer
 * gets a lifetime over the linearised schedule (loops included) and an offset in one arena by
 * a best-fit heap simulation; workspace_bytes is the plan's peak. The builder marks where a
 * region's gradients must be zero with a MEMSET_ZERO of a span buffer; the planner replaces it
 * by per-buffer zeroing before each gradient's first contribution (spans are unused after
 * that). Everything lives in the graph's arena.
 */
#ifndef SBP_TRAIN_H
#define SBP_TRAIN_H

#include "passes.h"

typedef enum {
    SBP_STRATEGY_STORE,
    SBP_STRATEGY_CHECKPOINT,
    SBP_STRATEGY_STREAM,
} sbp_strategy;

/* GRPO's normalisation of the token losses. */
typedef enum {
    SBP_GRPO_NORM_SEQUENCE,   /* mean over rows of (Σ_t l / the row's scored tokens) */
    SBP_GRPO_NORM_TOKEN,      /* Σ l / the scored tokens of the batch */
} sbp_grpo_norm;

const char *sbp_strategy_name(sbp_strategy s);  /* "store" | "checkpoint" | "stream" */
const char *sbp_grpo_norm_name(sbp_grpo_norm n); /* "sequence" | "token" */
/* GRPO's default ε (the objectives' default β: sbp_objective_default_beta, passes.h). */
#define SBP_GRPO_DEFAULT_EPSILON 0.2

/* ---------------------------------------------------------------- sequence.c */

/* The sequence analysis (requires the training program's layout plan; run by sbp_train_build
 * for the stream strategy, results in sbp_train_program.seq_values / seq_class). Every value
 * gets a state; every node a class:
 *   NONE     no sequence dependence: parameters, constants, values computed from them only;
 *   TOKEN    one row per token: logical axis `sax` is the sequence and `bax` the batch (-1 when
 *            the two are one merged axis [B*T, ...], or B == 1). Ops that keep rows propagate it;
 *   REDUCED  reduced over the sequence (the loss);
 *   MIXED    depends on the sequence in a way that is not row by row (cannot be chunked).
 * Node classes: STATIC (no sequence input), ROWWISE (rows of the outputs depend on the same rows
 * of the inputs: linears, norms, activations, RoPE, embedding, layout changes), CAUSAL
 * (attention: query row i reads K/V rows <= i), REDUCING (the loss), POSITIONAL (row-wise but
 * combining each row with a constant that varies along the sequence: computable on the whole
 * sequence, not in a chunk), MIXING (anything else, with a reason in seq_why). */
typedef enum {
    SBP_SEQ_NONE,
    SBP_SEQ_TOKEN,
    SBP_SEQ_REDUCED,
    SBP_SEQ_MIXED,
} sbp_seq_state;

typedef struct sbp_seq_value {
    sbp_seq_state state;
    int bax, sax;            /* TOKEN: logical batch axis (-1: merged or B == 1), sequence axis */
} sbp_seq_value;

typedef enum {
    SBP_SEQOP_STATIC,
    SBP_SEQOP_ROWWISE,
    SBP_SEQOP_CAUSAL,
    SBP_SEQOP_REDUCING,
    SBP_SEQOP_POSITIONAL,
    SBP_SEQOP_MIXING,
} sbp_seq_class;

const char *sbp_seq_class_name(sbp_seq_class c); /* "static" | "row-wise" | ... */

/* ---------------------------------------------------------------- the training program */

typedef enum {
#define K(e, nbuf, narg, roles, bf16, args, call) TP_K_##e,
#include "train_kernels.def"
#undef K
    TP_K_COUNT
} tp_kernel;

typedef struct tp_kernel_info {
    const char *name; /* "GEMM" */
    int n_buf, n_arg;
    const char *roles; /* one letter per buffer operand: its role (memplan.h) */
    const char *bf16;  /* one letter per buffer operand: its bf16 type, "" none (precision.c) */
    bool reads_args;   /* the call reads the step's arguments (`args`, sbp_step_args) */
    const char *call;  /* template: @i buffer operand i, #i scalar argument i */
} tp_kernel_info;
extern const tp_kernel_info tp_kernel_table[TP_K_COUNT];

typedef enum {
    TP_BUF_WS,     /* workspace: byte offset `offset` */
    TP_BUF_PARAM,  /* parameter block: element offset `offset` (read-only in the step) */
    TP_BUF_GRAD,   /* gradient block: element offset `offset` */
    TP_BUF_CONST,  /* a static const array in the emitted code (`data`) */
    TP_BUF_IDS,    /* the step's input_ids [B*T] */
    TP_BUF_LABELS, /* the step's labels [B*T] */
    TP_BUF_DOCS,   /* packed steps: the step's document ids [B*T] (args->doc_ids) */
    TP_BUF_HOST,   /* --offload: a byte offset `offset` in the step's host workspace
                    * (args->host_workspace), holding a workspace buffer's copy */
} tp_buf_kind;

/* Where a workspace buffer lives. */
#define TP_REGION_PERSIST (-1) /* else: the segment whose overlay holds it */

typedef struct tp_buf {
    int id;                  /* index in program->bufs */
    const char *name;        /* C identifier, unique in the program */
    tp_buf_kind kind;
    bool is_int;             /* int32 elements (ids, labels, positions), else float */
    bool is_grad;            /* holds a gradient */
    int rank;                /* of the shape comment */
    int64_t dims[IR_MAX_RANK];
    bool swapped;            /* stored with axes 1 and 2 swapped ([B,T,H,hd] for [B,H,T,hd]) */
    size_t numel;
    int region;              /* TP_BUF_WS only: TP_REGION_PERSIST or a segment index */
    size_t offset;           /* WS: bytes from the workspace base; PARAM/GRAD: elements */
    const ir_value *value;   /* the value it holds (or whose gradient), NULL for scratch */
    const void *data;        /* CONST: numel float or int32 elements */
    const char *what;        /* one-line description for the emitted comment */
    bool span;               /* WS: covers every gradient buffer of `region` (for zeroing);
                              * overlaps them, owns nothing */
    int64_t rows;            /* token rows it holds: B*T (every token; chunk loops read and
                              * write slices of it), a chunk's capacity (a chunk-local buffer,
                              * stream), or 0 (not one row per token) */
    int64_t row_elems;       /* elements per token row when rows > 0 */
    bool chunk_local;        /* WS, stream: holds one chunk's rows; every iteration of the loops
                              * that use it writes it (activations) or zeroes it (gradients)
                              * before reading it */
    bool stored_bf16;        /* PARAM, base_bf16: its values are bf16 in the parameter block */
    bool bf16;               /* WS float, bf16 program: stored as bfloat16 (2 bytes an element;
                              * see "Precision" above). MEMSET_ZERO / COPY byte counts and the
                              * planner's roles stay in fp32 units (4 per element); the planner
                              * sizes the buffer and codegen halves the byte counts it prints */
} tp_buf;

typedef enum {
    TP_ARG_INT,    /* i */
    TP_ARG_FLOAT,  /* f (printed as a float literal) */
    TP_ARG_INTS,   /* ints[0..n): an `(const int[]){...}` compound literal */
    TP_ARG_EXPR,   /* expr: a C expression valid in every block (`scale`, SBPRT_BIN_ADD) */
    TP_ARG_T0,     /* i + t0, t0 being the enclosing chunk loop's chunk start (in a loop only) */
} tp_arg_kind;

typedef struct tp_arg {
    tp_arg_kind kind;
    int64_t i;
    double f;
    const int64_t *ints; /* [n] */
    int n;
    const char *expr;
} tp_arg;

#define TP_MAX_BUFS 24
#define TP_MAX_ARGS 12

/* Where an operand starts inside its buffer, in a chunk loop: element per_row * r0 +
 * per_batch * b (r0 = b * seq + t0, the chunk's first row). Both 0 outside loops. */
typedef struct tp_off {
    int64_t per_row, per_batch;
} tp_off;

typedef struct tp_inst {
    tp_kernel k;
    int buf[TP_MAX_BUFS];    /* buffer ids; -1 prints NULL */
    tp_off off[TP_MAX_BUFS]; /* operand offsets (chunk loops) */
    tp_arg arg[TP_MAX_ARGS];
    const ir_node *node;     /* the IR node it implements (origin for comments), or NULL */
    const char *what;        /* "forward", "gradient", "recompute", "zero gradients", ... */
} tp_inst;

/* A chunk loop: instructions [first, end) of its block, run for b in [0, batch) and t0 = begin,
 * begin + step, ... < stop, with chunk rows [t0, t0 + len) of each b (len == step, or the tail
 * loop's one chunk). Loops do not nest or overlap. */
typedef struct tp_loop {
    int first, end;          /* the body: instruction indices in the block */
    int64_t batch, seq;      /* the row space [batch, seq]: (B, T) for layers, (1, B*T) head */
    int64_t begin, stop, step, len;
    int group;               /* the loops of one chunk loop (full chunks + tail) share it */
    const char *what;        /* "layer_0 forward", ... */
} tp_loop;

typedef struct tp_block {
    const char *name;        /* C function name, unique: "forward", "backward_layer_1" */
    const char *comment;     /* one paragraph for the function's header comment */
    tp_inst *insts;          /* [n_insts] */
    int n_insts, cap_insts;
    tp_loop *loops;          /* [n_loops], in instruction order */
    int n_loops, cap_loops;
} tp_block;

typedef struct tp_param {
    const ir_value *value;   /* the PARAM (name, shape, data) */
    size_t offset, numel;    /* in the parameter/gradient blocks; a tied parameter has no
                              * storage: offset is its owner's, numel its own count */
    bool trainable;          /* false: frozen or no gradient reaches it */
    bool stored_bf16;        /* base_bf16: kept as bf16 only, numel values in (numel + 1) / 2
                              * floats' room at offset (precision.c) */
    size_t grad_offset;      /* trainable: element offset in the gradient block (which holds
                              * the trained parameters only, in table order; a tied parameter
                              * has its owner's); SIZE_MAX when not trained */
    int tied_to;             /* -1, or the index of the parameter this one transposes */
    int buf, grad;           /* program buffers (-1 when none) */
} tp_param;

typedef enum {
    TP_SEG_WHOLE,            /* run on the whole sequence (store, checkpoint; stream: prologue) */
    TP_SEG_LAYER,            /* stream: K/V path once, then a chunk loop over [B, T] */
    TP_SEG_HEAD,             /* stream: the loss segment, a chunk loop over the B*T token rows,
                              * forward and backward fused */
} tp_seg_kind;

typedef struct tp_segment {
    const char *name;        /* "prologue", "layer_0", ..., "head" */
    int first_node, end_node;/* [first, end) in the graph's node order */
    tp_seg_kind kind;
} tp_segment;

/* A workspace buffer kept in host memory while it is not needed (offload.c): copied out after
 * its last write before a long gap (the forward of a layer's input checkpoint), waited for
 * after its last use before the gap, copied back one block ahead of its next read and waited
 * for just before it. Positions are (block, instruction) after the transfers were inserted. */
#define TP_COPY_EVENTS 4096 /* transfer events a step may name (runtime/sbprt.h:
                             * SBPRT_COPY_EVENTS) */
typedef struct tp_transfer {
    int buf, host;           /* the workspace buffer and its TP_BUF_HOST copy (a gradient's:
                              * its TP_BUF_GRAD buffer, in the caller's host gradient block) */
    size_t bytes;            /* as stored */
    int out_block, out_inst, out_wait_block, out_wait_inst;
    int in_block, in_inst, in_wait_block, in_wait_inst;
    int out_event, in_event; /* sbprt_copy_async's event numbers */
} tp_transfer;
/* A parameter gradient streamed to the host (offload_optimizer; offload.c) is a tp_transfer of
 * p->grad_transfers: its device buffer is a workspace buffer the plan places like any other,
 * from a GRAD_IN one block ahead of its first contribution (the gradient earlier micro-batches
 * left in the host block when accumulating, else zeros) to the wait of its way out, at the end
 * of the block after its last contribution. "in" is GRAD_IN / GRAD_WAIT, "out" OFFLOAD_OUT /
 * OFFLOAD_WAIT. */

typedef struct sbp_train_program {
    ir_graph *g;
    sbp_strategy strategy;
    sbp_objective objective;
    int64_t batch, seq_len, vocab;
    bool loss_is_mean;       /* the loss is loss_sum / denominator (else loss_sum) */

    tp_buf **bufs;           /* [n_bufs] */
    int n_bufs, cap_bufs;
    tp_block **blocks;       /* [n_blocks], in execution order */
    int n_blocks, cap_blocks;
    tp_param *params;        /* [n_params], in initializer order */
    int n_params;
    size_t param_elems;
    size_t grad_elems;       /* floats of the gradient block: the trained parameters' (the
                              * optimizer state is as large); param_elems when none is frozen */
    tp_segment *segments;    /* [n_segments] */
    int n_segments;

    int64_t chunk;           /* stream: tokens per chunk in layers (per batch element) */
    int64_t logits_chunk;    /* stream: token rows per chunk of the LM head (of B*T) */
    sbp_seq_value *seq_values; /* stream: [g->n_values] by value id, the sequence analysis */
    sbp_seq_class *seq_class;  /* stream: [g->n_nodes] by node index */
    const char **seq_why;      /* stream: [g->n_nodes] why a node is MIXING (else NULL) */
    bool *pre_loop;            /* stream: [g->n_nodes] a node of a chunked segment that runs
                                * once on the whole sequence (the K/V path, static values) */

    int loss_buf;            /* float [1]: Σ of token losses of the forward */
    /* Mixture-of-Experts (grad_rules.c, MoE): transformers' load-balancing loss, pooled over
     * the MoE layers, aux = E / R² Σ_e c_e P_e (c_e: the (row, choice) pairs routed to expert
     * e, P_e: its router probabilities summed over the rows, R: the rows of all MoE layers);
     * the step's loss adds moe_aux_coef · aux (docs/moe-export.md) */
    int moe_stats_buf;       /* WS float [2E]: c then P, accumulated by the forward; -1: no MoE */
    int64_t moe_experts;     /* E */
    int moe_layers;          /* MoE nodes */
    double moe_aux_rows;     /* R */
    double moe_aux_coef;     /* router_aux_loss_coef (0: the term is off) */
    double moe_aux_scale;    /* moe_aux_coef · E / R²: d(coef · aux) / dP_e = scale · c_e */
    /* Packed documents (sbp_train_options.packed; see "Packed documents" above) */
    bool packed;
    bool per_document;       /* DPO / GRPO per document (sbp_train_options.per_document) */
    int docs_buf;            /* TP_BUF_DOCS int32 [B*T], or -1 */
    int doc_start_buf;       /* WS int32 [B*T]: where each token's document starts in its row */
    int doc_pos_buf;         /* WS int32 [B*T]: each token's position in its document */
    int ids_buf, labels_buf; /* TP_BUF_IDS / TP_BUF_LABELS, -1 when the graph has none */
    /* Sequence parallelism (sbp_train_options.seq_parallel; seqpar.c). seq_len is the rank's
     * share T/N; every [B*T] buffer above holds the rank's tokens, except doc_start, which a
     * packed program holds for the whole rows ([B, N*T]) */
    int seq_parallel;        /* N; 0: none */
    int64_t seq_len_global;  /* N * seq_len: the rows' whole length */
    int doc_all_buf;         /* packed, N > 1: WS int32 [B, N*T] every rank's document ids */
    int doc_gather_buf;      /* packed, N > 1: WS int32 [N, T] the exchange's scratch */

    size_t workspace_bytes;  /* the planned workspace (memplan.h), bytes */

    /* DPO / GRPO (objective_pref.c; loss_is_mean is false: the loss buffer holds the loss
     * itself) */
    double beta, epsilon;    /* as sbp_train_options */
    sbp_grpo_norm grpo_norm;
    int tok_logp_buf;        /* float [B*T] each token's label log-probability (DPO), or -1 */
    int tok_dlogp_buf;       /* float [B*T] dL/dlogp per token (DPO: its row's coefficient) */
    int row_weight_buf;      /* float [B] GRPO: each row's weight of its token losses */
    int tok_weight_buf;      /* float [B*T] GRPO per document: each token's weight (its
                              * document's), flat (rows 0: kernels index it at r0 + i) */
    int tok_adv_buf;         /* float [B*T] GRPO per document: each token's advantage (its
                              * document's), flat as tok_weight_buf */

    /* Precision (sbp_train_options.bf16; see "Precision" above) */
    bool bf16;               /* activations bf16, parameters / gradients / statistics fp32 */
    size_t shadow_elems;     /* the parameters the bf16 copy covers: the block's first
                              * shadow_elems floats (param_elems without base_bf16; with it, the
                              * parameters kept in fp32, which come first) */
    size_t bf16_shadow_offset; /* bytes: the bf16 copy of the parameter block in the workspace
                              * ([shadow_elems] bf16, element offsets as the parameter block's),
                              * after every planned buffer */

    /* Offload (sbp_train_options.offload_checkpoints; offload.c; and offload_optimizer) */
    bool offload_optimizer;  /* the caller's masters and optimizer state are on the host */
    size_t host_bytes;       /* the host workspace the transfers' host copies live in */
    tp_transfer *transfers;  /* [n_transfers] each offloaded buffer's way out and back */
    int n_transfers;
    bool grads_on_host;      /* offload_optimizer: the gradient block is host memory; each
                              * trained parameter's gradient is accumulated in the workspace
                              * and leaves the device after its last contribution */
    tp_transfer *grad_transfers; /* [n_grad_transfers] one per trained parameter */
    int n_grad_transfers;

    /* Evaluation (see "Evaluation" above) */
    bool forward_only;       /* this is an evaluation program: no gradient anywhere */
    struct sbp_train_program *eval; /* the training program's evaluation program, or NULL */
    const char *no_eval_why; /* eval == NULL: why (NULL: not asked for) */
    /* Log-probabilities (DPO / GRPO; see "Log-probabilities" above) */
    bool logp_only;          /* this is a log-probability program (forward_only too): the head
                              * ends in tok_logp, no loss */
    struct sbp_train_program *logps; /* the training program's log-probability program, or
                              * NULL */
    const char *no_logps_why; /* logps == NULL: why (NULL: not asked for) */
} sbp_train_program;

typedef struct sbp_train_options {
    sbp_strategy strategy;
    int64_t chunk;           /* stream: tokens per chunk in layers; 0 = automatic */
    int64_t logits_chunk;    /* stream: token rows per LM-head chunk; 0 = automatic */
    size_t memory_budget;    /* bytes, 0 = none: the planned peak (sbp_train_planned_peak) must
                              * fit; stream picks the largest chunks (of those not given) whose
                              * plan fits. Too small: NULL, and a diagnostic with the smallest
                              * budget that fits (the plan at chunk 1, logits chunk 1) */
    /* DPO / GRPO, used as given (sbpc applies the defaults: sbp_objective_default_beta,
     * SBP_GRPO_DEFAULT_EPSILON, sequence) */
    double beta;             /* DPO's β; GRPO's KL coefficient (0: no KL, no reference) */
    double epsilon;          /* GRPO: the ratio is clipped to [1 - ε, 1 + ε] */
    sbp_grpo_norm grpo_norm; /* GRPO */
    bool bf16;               /* mixed precision (CUDA target): see "Precision" above */
    bool base_bf16;          /* with bf16: a frozen parameter that only GEMMs and embedding
                              * lookups (its table) read is kept as bf16 alone (sbpc
                              * --base-precision bf16; "Precision" above) */
    bool forward_only;       /* build the evaluation program itself (no gradients) */
    bool logp_only;          /* with forward_only, DPO / GRPO: build the log-probability
                              * program itself */
    bool packed;             /* packed documents: see "Packed documents" above */
    bool per_document;       /* with packed, DPO / GRPO: the unit of the objective is each
                              * document of a row, not the row (see "Packed documents") */
    bool offload_optimizer;  /* the caller keeps the fp32 master weights and the optimizer
                              * state on the host: every trained weight that only GEMMs and
                              * embedding lookups read is bf16 alone in the parameter block
                              * (as base_bf16 does for frozen ones); CUDA, bf16 */
    bool offload_checkpoints; /* each layer's input checkpoint lives in host memory between
                              * its forward and its backward (offload.c; CUDA, bf16) */
    size_t host_budget;      /* bytes, 0 = none: the host workspace must fit */
    int seq_parallel;        /* N >= 1: sequence parallelism, one rank's program for T/N of
                              * each row's tokens (seqpar.c; "Sequence parallelism" above; N =
                              * 1: one rank through the exchanges, which tests their paths on
                              * one device); 0: none */
    double moe_aux_coef;     /* Mixture-of-Experts: the load-balancing loss's coefficient
                              * (router_aux_loss_coef; 0: off) */
    bool eval;               /* sbp_train_build: also build the evaluation program (p->eval:
                              * SFT, graph loss) or the log-probability program (p->logps: DPO,
                              * GRPO) */
} sbp_train_options;

/* The operand types of kernel k in a bf16 program (the BF16 column of train_kernels.def), one
 * character per buffer operand: 'b' bf16 (an activation or activation gradient), 'f' fp32 (a
 * parameter, a parameter gradient, a statistic, a loss sum, a table), 'i' int32, 'c' a GEMM's C
 * (bf16, or fp32 for a gradient in the gradient block), 'x' typeless bytes (memset, copy: as the
 * buffer is stored). NULL: the kernel has no bf16 form (the preference objectives' kernels). */
const char *tp_kernel_bf16_types(tp_kernel k);

/* ---------------------------------------------------------------- offload.c */

/* requires: the strategy's program (checkpoints: stream or checkpoint; store is refused),
 * after the precision pass; not yet planned. produces, with checkpoints: the layer
 * checkpoints' transfers to host memory and back (tp_transfer, TP_BUF_HOST buffers,
 * p->host_bytes); with grads: each trained parameter's gradient in the workspace and its way
 * to the caller's host gradient block (p->grad_transfers, grads_on_host). See offload.c. */
int sbp_train_offload(sbp_train_program *p, bool checkpoints, bool grads, ir_diag *d);

/* Bytes of the gradient block on the device: grad_elems floats, none when grads_on_host. */
size_t sbp_train_device_grad_bytes(const sbp_train_program *p);

/* Sequence parallelism: the bytes one rank sends to the others in one sbp_step_run (every
 * all-to-all of the program, loops counted); 0 without --seq-parallel. */
int64_t sbp_train_sp_bytes_sent(const sbp_train_program *p);
/* The bytes one call of in puts through all-to-alls (its send buffers), 0 for other kernels. */
int64_t sp_inst_exchange_bytes(const tp_inst *in);

/* Bytes of one element of b as stored: 4, or 2 for a bf16 workspace buffer. */
size_t tp_buf_elem_bytes(const tp_buf *b);

/* requires: sbp_pass_objective done (one scalar loss output); dims bound.
 * produces: the program, allocated in g's arena; NULL with diagnostics when an op has no
 * forward lowering or no gradient rule ("no gradient rule for op X (node N)"), or a shape is
 * unsupported. */
sbp_train_program *sbp_train_build(ir_graph *g, sbp_objective objective,
                                   const sbp_train_options *opt);

/* The stages of sbp_train_build (train_build.c), for sbpc --dump-ir:
 *   AUTODIFF   the reverse-mode program on the whole sequence, every activation kept (as store,
 *              whatever the strategy): block "forward", then the gradient rules of each segment
 *              in reverse; not yet planned (workspace offsets 0);
 *   SCHEDULE   the strategy's program ("stream"): checkpoint's recomputation, stream's chunk
 *              loops; not yet planned;
 *   PLAN       the program with its memory plan (what sbp_train_build returns). */
typedef enum {
    SBP_TRAIN_UNTIL_AUTODIFF,
    SBP_TRAIN_UNTIL_SCHEDULE,
    SBP_TRAIN_UNTIL_PLAN,
} sbp_train_stage;
const char *sbp_train_stage_name(sbp_train_stage s); /* "autodiff" | "stream" | "plan" */
/* sbp_train_build stopped after stage `stop` (with a memory budget, at the chunks the budget
 * search chose). */
sbp_train_program *sbp_train_build_until(ir_graph *g, sbp_objective objective,
                                         const sbp_train_options *opt, sbp_train_stage stop);

/* The memory a step needs, as sbp_step_info.planned_peak_bytes reports it: parameters +
 * gradients (the caller's two blocks) + the planned workspace; optimizer state is the
 * caller's and not included. */
size_t sbp_train_planned_peak(const sbp_train_program *p);
/* What the step's caller keeps in host memory: the offloaded checkpoints (host_bytes) and, with
 * offload_optimizer, the fp32 masters of every parameter, AdamW's m and v and a host copy of the
 * gradients. */
size_t sbp_train_host_state_bytes(const sbp_train_program *p);

/* Human-readable listing of the program (buffers with offsets, blocks, instructions):
 * sbpc --dump-ir=program. */
void sbp_train_print(const sbp_train_program *p, FILE *f);
/* The schedule (sbpc --dump-ir=autodiff / stream): the parameters (trained or frozen), the
 * segments, stream's chunk sizes and per-node classes, then every block with its chunk loops
 * (row ranges), each instruction's operands (a slice of a full-length buffer shown as
 * name[rows r0..]), gradients accumulated over the chunks and what is recomputed. */
void sbp_train_print_schedule(const sbp_train_program *p, const char *stage, FILE *f);
/* The memory plan (sbpc --dump-ir=plan): the workspace size, then each workspace buffer's
 * offset, size and lifetime (the first and last instruction that uses it, in the schedule's
 * order), by offset. */
void sbp_train_print_plan(const sbp_train_program *p, FILE *f);

/* ---------------------------------------------------------------- train_verify.c */

/* Checks a built program: operands name existing buffers with the kernel's operand count;
 * loops lie inside their block without overlapping; the loops of each chunk-loop group cover
 * the rows [0, batch*seq) exactly once (no row twice, none missing, no chunk past its
 * sequence); a sliced operand (tp_off) stays inside its buffer in every iteration; TP_ARG_T0
 * and offsets appear only inside loops. Returns IR_OK, or IR_ERR with one diagnostic per
 * problem (naming the block, the loop or instruction). sbp_train_build runs it.
 * Limits, checked first and reported once (the first problem only): no buffer holds more than
 * IR_MAX_TENSOR_BYTES (ir/checked.h), and every scalar argument fits the C type the runtime
 * function takes it as (an int dimension, a size_t count), naming the kernel, the node and the
 * value. */
int sbp_train_verify(const sbp_train_program *p, ir_diag *d);
/* After the plan: parameters + gradients + workspace fit IR_MAX_TENSOR_BYTES; else IR_ERR with
 * the three sizes. sbp_train_build runs it. */
int sbp_train_check_totals(const sbp_train_program *p, ir_diag *d);

#endif
