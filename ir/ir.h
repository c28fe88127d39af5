/* ir.h — the public interface of sbpc's intermediate representation.
 *
 * The IR is a single dataflow graph: typed values (dtype + shape, where a dim is either a known
 * extent or a named symbol such as "batch") produced by nodes (an op from ir/ops.def, its inputs,
 * outputs and attributes). Graph inputs, parameters (trainable float initializers) and constants
 * (every other initializer, and the results of constant folding) are values without a producer.
 *
 * Invariants (checked by ir_verify):
 *   - graph->nodes is in topological order; every input of a live node is a graph input, a
 *     parameter, a constant, or an output of an earlier live node;
 *   - each value has at most one producer; node arities match the op table;
 *   - a constant or parameter has data of exactly numel * dtype_size bytes.
 *
 * Memory: everything of one compilation lives in one arena (ir_arena) and is freed at once with
 * the graph; passes never free individual objects (the STYLE notes' "arena per compilation").
 * Large initializer data may instead be mapped from the model file (data_owner).
 *
 * Errors: library code never exits. Functions return IR_OK / IR_ERR and record diagnostics in an
 * ir_diag (what and where: file, node name and op, which input); tools/ print them.
 */
#ifndef SBP_IR_H
#define SBP_IR_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define IR_OK 0
#define IR_ERR (-1)

/* The highest ai.onnx opset the importer accepts; newer models are refused with a diagnostic. */
#define IR_MAX_OPSET 23
/* Rank limit: exporters of transformer LMs never exceed 6; larger ranks are refused. */
#define IR_MAX_RANK 8

/* ---------------------------------------------------------------- arena (ir/arena.c) */

typedef struct ir_arena ir_arena;

ir_arena *ir_arena_new(void);
void ir_arena_free(ir_arena *a);
/* Zeroed, 16-byte aligned; NULL only when the system is out of memory or n is absurd. */
void *ir_arena_alloc(ir_arena *a, size_t n);
/* Checked n * size (returns NULL on overflow). */
void *ir_arena_calloc(ir_arena *a, size_t n, size_t size);
char *ir_arena_strdup(ir_arena *a, const char *s);
char *ir_arena_printf(ir_arena *a, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
size_t ir_arena_bytes(const ir_arena *a);

/* ---------------------------------------------------------------- diagnostics (ir/diag.c) */

typedef enum { IR_SEV_NOTE, IR_SEV_WARNING, IR_SEV_ERROR } ir_severity;

typedef struct ir_diag_entry {
    ir_severity sev;
    char *file;    /* the model file, or NULL */
    char *node;    /* node name, or NULL when the message is not about a node */
    char *op;      /* node op_type, or NULL */
    char *msg;     /* the message proper, no trailing newline */
} ir_diag_entry;

typedef struct ir_diag {
    ir_diag_entry *entries; /* [n] */
    int n, cap;
    int n_errors;
    char *file;             /* default file for new entries (strdup'd), may be NULL */
} ir_diag;

void ir_diag_init(ir_diag *d, const char *file);
void ir_diag_free(ir_diag *d);
void ir_diag_set_file(ir_diag *d, const char *file);
/* Record a message; node/op may be NULL. Returns IR_ERR for errors so callers can
 * `return ir_diag_error(...)`, IR_OK otherwise. */
int ir_diag_add(ir_diag *d, ir_severity sev, const char *node, const char *op, const char *fmt,
                ...) __attribute__((format(printf, 5, 6)));
int ir_diag_error(ir_diag *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void ir_diag_note(ir_diag *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Prints each entry compiler-style:  "PROG: FILE: node 'N' (Op): error: MSG" */
void ir_diag_print(const ir_diag *d, FILE *f, const char *prog);
/* Prints entries [first, d->n) only: for tools that print diagnostics in stages. */
void ir_diag_print_from(const ir_diag *d, int first, FILE *f, const char *prog);

/* ---------------------------------------------------------------- dtypes */

/* Numbered as ONNX's TensorProto.DataType, so import needs no table. */
typedef enum {
    IR_DT_UNDEFINED = 0,
    IR_DT_FLOAT = 1,
    IR_DT_UINT8 = 2,
    IR_DT_INT8 = 3,
    IR_DT_UINT16 = 4,
    IR_DT_INT16 = 5,
    IR_DT_INT32 = 6,
    IR_DT_INT64 = 7,
    IR_DT_STRING = 8,
    IR_DT_BOOL = 9,
    IR_DT_FLOAT16 = 10,
    IR_DT_DOUBLE = 11,
    IR_DT_UINT32 = 12,
    IR_DT_UINT64 = 13,
    IR_DT_BFLOAT16 = 16,
} ir_dtype;

/* Bytes per element; 0 for undefined/string/unknown codes. */
size_t ir_dtype_size(ir_dtype t);
/* "f32", "i64", "bool", ... ; "?" when unknown. */
const char *ir_dtype_name(ir_dtype t);
bool ir_dtype_is_float(ir_dtype t);
bool ir_dtype_is_int(ir_dtype t);

/* ---------------------------------------------------------------- ops (from ir/ops.def) */

typedef enum {
#define OP(e, name, dom, mi, ma, mo, mao, inf) IR_OP_##e,
#include "ops.def"
#undef OP
    IR_OP_COUNT
} ir_op;

typedef struct ir_op_info {
    const char *name;   /* ONNX op_type, or the semantic op's name */
    const char *domain; /* "", "sbp", "com.microsoft" */
    int min_in, max_in, min_out, max_out; /* -1 max: variadic */
} ir_op_info;

extern const ir_op_info ir_op_table[IR_OP_COUNT];
/* Looks an ONNX (domain, op_type) up; "" and "ai.onnx" are the same domain. Returns IR_OP_COUNT
 * when not in the table. */
ir_op ir_op_lookup(const char *domain, const char *op_type);
static inline const char *ir_op_name(ir_op op) { return ir_op_table[op].name; }
static inline bool ir_op_is_semantic(ir_op op) { return ir_op_table[op].domain[0] == 's'; }

/* ---------------------------------------------------------------- values */

/* A dimension: a known extent (value >= 0, sym NULL), or a symbol (value -1, sym = "batch"),
 * or unknown (value -1, sym NULL). */
typedef struct ir_dim {
    int64_t value;
    const char *sym;
} ir_dim;

typedef enum {
    IR_VAL_NODE,   /* produced by a node */
    IR_VAL_INPUT,  /* graph input (token ids, labels) */
    IR_VAL_PARAM,  /* trainable float initializer (a weight) */
    IR_VAL_CONST,  /* constant data: non-trainable initializer, Constant node, folded result */
} ir_value_kind;

typedef struct ir_node ir_node;
typedef struct ir_graph ir_graph;

typedef struct ir_value {
    int id;                  /* index in graph->values */
    const char *name;        /* ONNX name; unique in the graph */
    ir_value_kind kind;
    ir_dtype dtype;
    int rank;                /* -1: unknown rank */
    ir_dim *dims;            /* [rank] */
    /* data of PARAM and CONST values: [numel] elements of dtype, row-major. For a PARAM made
     * from a re-tied initializer (see tied_to) the data stays as imported. */
    void *data;
    size_t nbytes;
    ir_node *producer;       /* NULL unless kind == IR_VAL_NODE */
    int producer_slot;       /* which output of producer */
    bool is_output;          /* a graph output */
    /* Weight tying: this PARAM equals the transpose of tied_to (bitwise); see passes/graph/retie.c.
     * Its uses read tied_to after the pass; the value stays so gradients can be reported
     * under both names. */
    struct ir_value *tied_to;
    bool frozen;             /* a PARAM excluded from training (--freeze) */
} ir_value;

/* numel of a fully known shape; -1 when a dim is not known or the product overflows int64. */
int64_t ir_value_numel(const ir_value *v);
/* The size check every shape passes (ir/checked.h): the product of v's known dims (zeros read
 * as 1, so that no prefix product of a walk over the shape can wrap) times its element size
 * must fit int64. Otherwise an error naming node n (NULL: a graph input or initializer), `what`
 * ("output 0", "value"), the value and its dims; IR_ERR. Passes may then multiply a value's
 * dims (or any subset of them, or them and the element size) without checking again. Whether a
 * tensor fits a target (IR_MAX_TENSOR_BYTES) is decided where it is materialised (the training
 * program's buffers): an IR value such as attention's [B,H,T,T] scores never is. */
int ir_check_shape_size(ir_graph *g, const ir_node *n, const char *what,
                        const ir_value *v);
bool ir_value_shape_known(const ir_value *v);
/* "f32[2,64,32]" / "f32[batch,sequence,32]" into buf; returns buf. */
char *ir_value_type_str(const ir_value *v, char *buf, size_t n);
/* Element i of data of type dt as int64 / double: integers of any width as their value, BOOL
 * as 0 or 1 (any nonzero byte is true), floats to int64 by ir_f64_to_i64; 0 for a type that
 * is neither (half precision, strings). The one reader of constant elements: the passes, shape
 * inference, the printer and the folder (passes/graph/fold.c) all read through it. */
int64_t ir_data_i64(ir_dtype dt, const void *data, int64_t i);
double ir_data_f64(ir_dtype dt, const void *data, int64_t i);
/* The same for a CONST value's own data. */
int64_t ir_const_i64(const ir_value *v, int64_t i);
double ir_const_f64(const ir_value *v, int64_t i);
/* Reads a small integer (or bool) CONST of rank 0 or 1 into out[max]: the count, or -1 if v is
 * not such a constant (not CONST, another dtype, rank > 1, more than max elements). */
int ir_const_ints(const ir_value *v, int64_t *out, int max);
/* Float to integer the way a C runtime would, but without undefined behaviour: NaN gives 0 and
 * out-of-range values saturate to the int64 range. */
int64_t ir_f64_to_i64(double x);
bool ir_value_is_const(const ir_value *v); /* CONST (not PARAM) */

/* ---------------------------------------------------------------- attributes */

typedef enum {
    IR_ATTR_INT,
    IR_ATTR_FLOAT,
    IR_ATTR_STRING,
    IR_ATTR_INTS,
    IR_ATTR_FLOATS,
    IR_ATTR_TENSOR, /* value: a CONST ir_value not registered in the graph */
} ir_attr_kind;

typedef struct ir_attr {
    const char *name;
    ir_attr_kind kind;
    int64_t i;
    double f;
    const char *s;
    int64_t *ints;   /* [n] */
    float *floats;   /* [n] */
    int n;
    ir_value *t;
} ir_attr;

/* ---------------------------------------------------------------- nodes and graph */

struct ir_node {
    int id;                  /* creation index, stable */
    const char *name;        /* ONNX node name (may be made up: "<op>_<id>") */
    ir_op op;
    const char *op_type;     /* as written in the model (for messages); the op name for new nodes */
    int n_in;
    ir_value **in;           /* [n_in]; NULL entries are absent optional inputs */
    int n_out;
    ir_value **out;          /* [n_out]; NULL entries are absent optional outputs */
    int n_attr;
    ir_attr *attrs;          /* [n_attr] */
    bool dead;               /* removed; dropped by ir_graph_compact */
    /* The ONNX nodes this node stands for (names, for codegen's comments), or NULL. */
    const char **origin;     /* [n_origin] */
    int n_origin;
    /* The innermost PyTorch module the node was exported from ("model.layers.0.self_attn.q_proj",
     * in the arena), from the dynamo exporter's pkg.torch.onnx.name_scopes node metadata, whose
     * node names carry no module path; NULL when the model does not say (other exporters, a
     * node of the root module, nodes made by passes). train/train_export.c names renamed
     * weights from it. */
    const char *scope;
};

/* A pattern a pass recognised all but one part of and so left as it was, with why, as data: a
 * later stage that fails because of it (the training program's "no gradient rule for op
 * MatMul" of an attention left unrecognised) names the cause from here, not from the wording
 * of a diagnostic. The pass also warns, in the words of `msg`. */
typedef enum {
    /* attention whose mask is computed from constants but is neither causal nor a causal
     * sliding window (passes/graph/recognize_attention.c) */
    IR_REFUSED_ATTENTION_MASK_CONSTANT,
    /* attention whose mask is computed from the model's inputs (padding, say) */
    IR_REFUSED_ATTENTION_MASK_INPUT,
} ir_refusal_reason;

typedef struct ir_refusal {
    ir_refusal_reason reason;
    const ir_node *at;       /* the node the warning is about (attention: its Softmax) */
    const ir_node *also[2];  /* the pattern's other nodes a failure may be found at, or NULL
                              * (attention: the scores MatMul and the output MatMul) */
    const char *msg;         /* the warning's text (in the graph's arena) */
    struct ir_refusal *next; /* the one recorded before */
} ir_refusal;

typedef struct ir_graph {
    ir_arena *arena;         /* owns everything below */
    ir_diag *diag;           /* where passes report; not owned */
    const char *path;        /* model file */
    const char *name;        /* graph name */
    int64_t opset;           /* ai.onnx opset import */
    ir_value **values;       /* [n_values], index == id */
    int n_values, cap_values;
    ir_node **nodes;         /* [n_nodes], topological order */
    int n_nodes, cap_nodes;
    ir_value **inputs;       /* [n_inputs] graph inputs (not initializers) */
    int n_inputs;
    ir_value **outputs;      /* [n_outputs] */
    int n_outputs;
    /* Dim bindings from --batch / --seq-len: symbol name -> extent (applied by bind_dims). */
    int64_t bind_batch, bind_seq; /* 0: not given */
    int next_id;             /* for made-up names */
    /* torch.export's graph signature as the dynamo exporter wrote it (which initializers were
     * PARAMETERs and which BUFFERs of the module), or NULL; read by passes/graph/params.c. */
    const char *torch_signature;
    /* sbpc --lora, as passes/graph/lora.c applied it (rank 0: none), for the step's description */
    int64_t lora_rank;
    double lora_alpha;
    uint64_t lora_seed;
    ir_refusal *refusals;    /* the patterns passes left as they were, newest first */
    struct ir_name_index *names; /* value name -> value; private to ir/ir.c */
} ir_graph;

/* The entries of a torch.export graph signature (ir_graph.torch_signature): one per line
 * "<KIND>: target='<NAME>'" (KIND: PARAMETER, BUFFER, CONSTANT_TENSOR, USER_INPUT, ...).
 * Calls f(kind, name, name_len, ctx) for each, in order; kind points at the word (not
 * terminated: compare with strncmp). sig NULL: no calls. */
void ir_signature_each(const char *sig,
                       void (*f)(const char *kind, const char *name, size_t name_len, void *ctx),
                       void *ctx);

ir_graph *ir_graph_new(ir_diag *diag, const char *path);
void ir_graph_free(ir_graph *g);

/* Records a refusal (a copy of *r, `next` ignored) at the front of g->refusals and warns with
 * r->msg at r->at. IR_ERR with a diagnostic when out of memory. */
int ir_graph_refuse(ir_graph *g, const ir_refusal *r);

/* Builder. New values get fresh unique names derived from `name` when it clashes. */
ir_value *ir_value_new(ir_graph *g, const char *name, ir_value_kind kind, ir_dtype dt, int rank,
                       const ir_dim *dims);
/* A constant value holding a copy of data (nbytes must equal numel*size). */
ir_value *ir_const_new(ir_graph *g, const char *name, ir_dtype dt, int rank, const int64_t *dims,
                       const void *data);
ir_value *ir_value_find(const ir_graph *g, const char *name);
/* Appends a node with n_out fresh output values (types from ir_infer_node if inputs are known;
 * names "<name>_out<i>"). Returns NULL and records a diagnostic on failure. In ir/shape.c, with
 * the inference it calls (ir.c never calls into shape.c). */
ir_node *ir_node_new(ir_graph *g, ir_op op, const char *name, int n_in, ir_value *const *in,
                     int n_out);
/* Same, but the node takes existing output values (used by the importer). */
ir_node *ir_node_new_with_outputs(ir_graph *g, ir_op op, const char *name, const char *op_type,
                                  int n_in, ir_value *const *in, int n_out, ir_value *const *out);
/* Inserts node right after `after` in the node order (after == NULL: at the front). New nodes
 * made with ir_node_new are appended; passes that build replacements call this or
 * ir_graph_toposort. */
void ir_node_move_after(ir_graph *g, ir_node *n, ir_node *after);
/* Attributes: set (replacing) and get. */
void ir_attr_set_int(ir_graph *g, ir_node *n, const char *name, int64_t v);
void ir_attr_set_float(ir_graph *g, ir_node *n, const char *name, double v);
void ir_attr_set_string(ir_graph *g, ir_node *n, const char *name, const char *v);
void ir_attr_set_ints(ir_graph *g, ir_node *n, const char *name, const int64_t *v, int count);
const ir_attr *ir_attr_get(const ir_node *n, const char *name);
int64_t ir_attr_int(const ir_node *n, const char *name, int64_t dflt);
double ir_attr_float(const ir_node *n, const char *name, double dflt);
const char *ir_attr_string(const ir_node *n, const char *name, const char *dflt);
/* Records that n stands for the ONNX nodes of `from` (appends from's origin or name). */
void ir_node_add_origin(ir_graph *g, ir_node *n, const ir_node *from);

/* Rewiring. Replaces every use of `old` (node inputs and graph outputs) by `repl`. */
void ir_replace_uses(ir_graph *g, ir_value *old, ir_value *repl);
/* Number of live node inputs reading v, plus 1 if v is a graph output. */
int ir_value_use_count(const ir_graph *g, const ir_value *v);
/* Use lists for all values at once: uses[v->id] is an array of (node, slot) of length
 * n_uses[v->id]. Allocated in the arena; stale after the graph changes. */
typedef struct ir_use {
    ir_node *node;
    int slot;
} ir_use;
typedef struct ir_uses {
    ir_use **uses;  /* [n_values][n_uses[v]] */
    int *n_uses;    /* [n_values] */
} ir_uses;
ir_uses ir_uses_build(const ir_graph *g);
/* Drops dead nodes from the node list. */
void ir_graph_compact(ir_graph *g);
/* Restores topological order (stable for already-ordered nodes); IR_ERR + diagnostic on a cycle. */
int ir_graph_toposort(ir_graph *g);
/* Count of live nodes with this op. */
int ir_graph_count_op(const ir_graph *g, ir_op op);

/* ---------------------------------------------------------------- shape inference (ir/shape.c) */

/* Computes dtype and shape of n's outputs from its inputs and attributes (values of constant
 * inputs are used where the shape depends on them: Reshape, Expand, Slice, ...). Unknown input
 * shapes give unknown output shapes, not errors; contradictions are errors with a diagnostic
 * naming the node and the input. */
int ir_infer_node(ir_graph *g, ir_node *n);
/* Runs inference over all nodes in order. */
int ir_infer_graph(ir_graph *g);
/* ONNX Slice clamping of one axis of extent d (step != 0; a step below -INT64_MAX counts as
 * -INT64_MAX): the number of elements taken; *start_out (may be NULL) the first one's index.
 * Shape inference and the constant folder (passes/graph/fold.c) both use it, so they agree. */
int64_t ir_slice_axis(int64_t d, int64_t start, int64_t end, int64_t step, int64_t *start_out);
/* The dims a Shape node n (opset 15 start/end attributes) takes of an input of rank r, clamped
 * as ONNX says (a negative one counts from the back, then each is clamped into [0, r]; start >=
 * end: none): Slice's clamp with step 1 (ir_slice_axis). Returns the count; *start_out (may
 * be NULL) the first. Shape inference and the folder both use it. */
int64_t ir_shape_op_range(const ir_node *n, int64_t r, int64_t *start_out);

/* ---------------------------------------------------------------- printer and verifier */

/* The textual dump (--dump-ir). Stable format, used by the golden tests:
 *   graph NAME (opset N)
 *   input  %ids: i64[2,64]
 *   param  %wte.weight: f32[64,32]
 *   const  %cos: f32[64,8]
 *   %x = Embedding(%wte.weight, %ids)  : f32[2,64,32]       # node name
 *   output %logits
 * Semantic ops print their names (Attention prints "attention" in its comment as well). */
void ir_print(const ir_graph *g, FILE *f);
/* Checks the invariants listed at the top; records each violation; IR_ERR if any. */
int ir_verify(ir_graph *g);

/* ---------------------------------------------------------------- ONNX import (ir/onnx_import.c) */

typedef struct ir_import_options {
    /* When not NULL, the identity of every file the import reads (the model, each external data
     * file) is added here (ir/files.h), so that a tool can refuse outputs that would overwrite
     * them. Zero-initialise the rest. */
    struct sbp_file_set *files;
} ir_import_options;

/* Reads an ONNX model file into a new graph. On failure returns NULL with diagnostics in diag
 * (every unsupported op is listed, not only the first). */
ir_graph *ir_import_onnx(const char *path, ir_diag *diag, const ir_import_options *opt);
/* Same from memory (the fuzzer's entry point); external data resolved against base_dir (NULL:
 * external data refused). */
ir_graph *ir_import_onnx_buffer(const uint8_t *buf, size_t len, const char *display_name,
                                const char *base_dir, ir_diag *diag,
                                const ir_import_options *opt);

#endif
