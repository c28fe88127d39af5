/* train_fixture.c — makes the inputs of sbp-train's end-to-end tests and checks its outputs.
 *
 *   train_fixture all DIR
 *       writes the ONNX models of test_step.c's two models (and broken variants), token-id and
 *       label .npy files (good and bad), and llm.c token shards into DIR;
 *   train_fixture check-grads GRADS.safetensors KIND IDS.npy LABELS.npy
 *       compares sbp-train --dump-grads output with a float64 reference computed here;
 *   train_fixture check-saved SAVED.onnx KIND sgd|adamw LR WD IDS.npy LABELS.npy
 *       re-imports a --save output (after one step) and checks every weight against the
 *       optimizer update applied to the float64 reference gradient;
 *   train_fixture check-ref GRADS.safetensors REF.safetensors [LOG ADAMW.json]
 *       for steps compiled by sbpc from tests/fixtures: the dumped gradients against the
 *       PyTorch float64 ones, and the "step N loss X" lines of LOG against the AdamW losses;
 *   train_fixture check-sgd-save MODEL.onnx SAVED.onnx GRADS.safetensors LR
 *       after one SGD step: every saved initializer with a gradient is original - lr * grad,
 *       every other one unchanged.
 *   train_fixture compare-grads GOT.safetensors GOT.onnx WANT.safetensors WANT.onnx TOL
 *       gradients of two models with the same weights under other names (the exporters number
 *       folded initializers per file): each of GOT's tensors against WANT's tensor whose
 *       initializer holds the same bytes, per-tensor relative L2 error <= TOL, and the losses
 *       in the metadata within TOL relative (--grad-accum against one big batch; a dump against
 *       the PyTorch references of tests/fixtures/ref);
 *   train_fixture pref-inputs REF_DIR DIR
 *       bad variants of the DPO / GRPO inputs of tests/fixtures/ref for sbp-train's checks.
 *
 * KIND is "bigram" (logits = W[ids], W: [V,V]) or "tied" (logits = E[ids] @ head + bias with
 * head = Eᵀ re-tied and bias frozen), V = 16, D = 4 — the models of test_step.c. The weights
 * are a fixed pseudo-random function of the kind, so the checks regenerate them rather than trust
 * any file. ONNX files are written with the protobuf-c bindings the importer uses (no Python
 * needed); the reference is written independently of the runtime's kernels.
 */
#include "ir.h"
#include "onnx.pb-c.h"
#include "sbpio.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

enum { V = 16, D = 4, B = 2, T = 8, N = B * T };

static int failures;

static void fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "train_fixture: ");
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    failures++;
}

/* ------------------------------------------------------------------ deterministic numbers */

static uint64_t rng_state;
static void rng_seed(uint64_t s) { rng_state = s * 0x9E3779B97F4A7C15ull + 1; }
static uint32_t rng_u32(void)
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(rng_state >> 33);
}
static float rng_uniform(float a) { return a * (2.0f * (float)rng_u32() / 2147483648.0f - 1.0f); }

/* The initial weights of a model: W [V,V] (bigram) or E [V,D] and bias [V] (tied). */
static void make_weights(float *w, int n, uint64_t seed, float scale)
{
    rng_seed(seed);
    for (int i = 0; i < n; i++)
        w[i] = rng_uniform(scale);
}

/* ------------------------------------------------------------------ ONNX writing */

typedef struct model_builder {
    Onnx__TensorProto *inits[4];
    int n_inits;
    Onnx__NodeProto *nodes[4];
    int n_nodes;
} model_builder;

static Onnx__TensorProto *tensor_f32(const char *name, int rank, const int64_t *dims,
                                     const float *data)
{
    Onnx__TensorProto *t = calloc(1, sizeof *t);
    onnx__tensor_proto__init(t);
    t->name = (char *)name;
    t->n_dims = (size_t)rank;
    t->dims = (int64_t *)dims;
    t->has_data_type = 1;
    t->data_type = ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT;
    size_t n = 1;
    for (int i = 0; i < rank; i++)
        n *= (size_t)dims[i];
    t->has_raw_data = 1;
    t->raw_data.len = n * sizeof(float);
    t->raw_data.data = (uint8_t *)data;
    return t;
}

static Onnx__NodeProto *node(const char *op, const char *name, const char *in0, const char *in1,
                             const char *out)
{
    Onnx__NodeProto *n = calloc(1, sizeof *n);
    onnx__node_proto__init(n);
    n->op_type = (char *)op;
    n->name = (char *)name;
    n->n_input = 2;
    n->input = calloc(2, sizeof(char *));
    n->input[0] = (char *)in0;
    n->input[1] = (char *)in1;
    n->n_output = 1;
    n->output = calloc(1, sizeof(char *));
    n->output[0] = (char *)out;
    return n;
}

/* A value_info of elem type `et` and shape: dims[i] >= 0 fixed, -1 the symbol syms[i]. */
static Onnx__ValueInfoProto *value_info(const char *name, int et, int rank, const int64_t *dims,
                                        const char *const *syms)
{
    Onnx__ValueInfoProto *vi = calloc(1, sizeof *vi);
    Onnx__TypeProto *tp = calloc(1, sizeof *tp);
    Onnx__TypeProto__Tensor *tt = calloc(1, sizeof *tt);
    Onnx__TensorShapeProto *sp = calloc(1, sizeof *sp);
    onnx__value_info_proto__init(vi);
    onnx__type_proto__init(tp);
    onnx__type_proto__tensor__init(tt);
    onnx__tensor_shape_proto__init(sp);
    sp->n_dim = (size_t)rank;
    sp->dim = calloc((size_t)rank, sizeof *sp->dim);
    for (int i = 0; i < rank; i++) {
        Onnx__TensorShapeProto__Dimension *d = calloc(1, sizeof *d);
        onnx__tensor_shape_proto__dimension__init(d);
        if (dims[i] >= 0) {
            d->value_case = ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE;
            d->dim_value = dims[i];
        } else {
            d->value_case = ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_PARAM;
            d->dim_param = (char *)syms[i];
        }
        sp->dim[i] = d;
    }
    tt->has_elem_type = 1;
    tt->elem_type = et;
    tt->shape = sp;
    tp->value_case = ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE;
    tp->tensor_type = tt;
    vi->name = (char *)name;
    vi->type = tp;
    return vi;
}

static void free_value_info(Onnx__ValueInfoProto *vi)
{
    Onnx__TensorShapeProto *sp = vi->type->tensor_type->shape;
    for (size_t i = 0; i < sp->n_dim; i++)
        free(sp->dim[i]);
    free(sp->dim);
    free(sp);
    free(vi->type->tensor_type);
    free(vi->type);
    free(vi);
}

/* Model variants. */
typedef enum {
    M_BIGRAM,     /* the bigram model, V = 16, dynamic [batch, sequence] ids */
    M_BIGRAM_V12, /* same with V = 12: W has another shape than the step's */
    M_RENAMED,    /* its weight is called 'W_renamed': the step's 'W' is missing */
    M_NAN,        /* W full of NaN: the loss is NaN */
    M_STATIC,     /* ids input with a fixed shape [3, 5] */
    M_TIED,       /* E, head = Eᵀ, frozen bias */
    M_TIED_UNTIED /* like M_TIED but head is not Eᵀ (sbp-train warns) */
} model_kind;

static int write_model(const char *path, model_kind kind)
{
    int vv = kind == M_BIGRAM_V12 ? 12 : V;
    float *w = calloc((size_t)vv * vv, sizeof(float));
    float E[V * D], head[D * V], bias[V];
    int64_t wdims[2] = {vv, vv}, edims[2] = {V, D}, hdims[2] = {D, V}, bdims[1] = {V};
    model_builder mb = {0};

    if (kind == M_TIED || kind == M_TIED_UNTIED) {
        make_weights(E, V * D, 2, 0.5f);
        make_weights(bias, V, 3, 0.1f);
        for (int i = 0; i < V; i++)
            for (int j = 0; j < D; j++)
                head[j * V + i] = E[i * D + j];
        if (kind == M_TIED_UNTIED)
            head[5] += 1.0f;
        mb.inits[mb.n_inits++] = tensor_f32("E", 2, edims, E);
        mb.inits[mb.n_inits++] = tensor_f32("head", 2, hdims, head);
        mb.inits[mb.n_inits++] = tensor_f32("bias", 1, bdims, bias);
        mb.nodes[mb.n_nodes++] = node("Gather", "embed", "E", "input_ids", "x");
        mb.nodes[mb.n_nodes++] = node("MatMul", "lm_head", "x", "head", "y");
        mb.nodes[mb.n_nodes++] = node("Add", "add_bias", "y", "bias", "logits");
    } else {
        make_weights(w, vv * vv, 1, 0.5f);
        if (kind == M_NAN)
            for (int i = 0; i < vv * vv; i++)
                w[i] = NAN;
        const char *wname = kind == M_RENAMED ? "W_renamed" : "W";
        mb.inits[mb.n_inits++] = tensor_f32(wname, 2, wdims, w);
        mb.nodes[mb.n_nodes++] = node("Gather", "bigram", wname, "input_ids", "logits");
    }

    const char *syms[3] = {"batch", "sequence", NULL};
    int64_t ids_dyn[2] = {-1, -1}, ids_static[2] = {3, 5};
    int64_t out_dims[3] = {kind == M_STATIC ? 3 : -1, kind == M_STATIC ? 5 : -1, vv};
    Onnx__ValueInfoProto *in = value_info("input_ids", ONNX__TENSOR_PROTO__DATA_TYPE__INT64, 2,
                                          kind == M_STATIC ? ids_static : ids_dyn, syms);
    Onnx__ValueInfoProto *out =
        value_info("logits", ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT, 3, out_dims, syms);

    Onnx__GraphProto g;
    onnx__graph_proto__init(&g);
    g.name = "train_fixture";
    g.n_node = (size_t)mb.n_nodes;
    g.node = mb.nodes;
    g.n_initializer = (size_t)mb.n_inits;
    g.initializer = mb.inits;
    g.n_input = 1;
    g.input = &in;
    g.n_output = 1;
    g.output = &out;

    Onnx__OperatorSetIdProto opset;
    onnx__operator_set_id_proto__init(&opset);
    opset.domain = "";
    opset.has_version = 1;
    opset.version = 17;
    Onnx__OperatorSetIdProto *opsets[1] = {&opset};

    Onnx__ModelProto m;
    onnx__model_proto__init(&m);
    m.has_ir_version = 1;
    m.ir_version = 8;
    m.producer_name = "train_fixture";
    m.n_opset_import = 1;
    m.opset_import = opsets;
    m.graph = &g;

    size_t len = onnx__model_proto__get_packed_size(&m);
    uint8_t *buf = malloc(len);
    onnx__model_proto__pack(&m, buf);
    FILE *f = fopen(path, "wb");
    int rc = 0;
    if (!f || fwrite(buf, 1, len, f) != len)
        rc = -1;
    if (f && fclose(f) != 0)
        rc = -1;
    if (rc)
        fail("cannot write %s", path);

    free(buf);
    free_value_info(in);
    free_value_info(out);
    for (int i = 0; i < mb.n_inits; i++)
        free(mb.inits[i]);
    for (int i = 0; i < mb.n_nodes; i++) {
        free(mb.nodes[i]->input);
        free(mb.nodes[i]->output);
        free(mb.nodes[i]);
    }
    free(w);
    return rc;
}

/* ------------------------------------------------------------------ token data */

/* A token stream with structure a bigram model can learn: mostly tok' = (5 tok + 3) mod V. */
static int32_t next_token(int32_t t)
{
    return rng_u32() % 8 == 0 ? (int32_t)(rng_u32() % V) : (5 * t + 3) % V;
}

static void write_npy_i(const char *dir, const char *name, sbpio_dtype dt, int b, int t,
                        const int64_t *vals)
{
    char path[1024], err[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    int64_t shape[2] = {b, t};
    size_t n = (size_t)b * t;
    void *data = malloc(n * 8);
    for (size_t i = 0; i < n; i++) {
        if (dt == SBPIO_DT_I64)
            ((int64_t *)data)[i] = vals[i];
        else if (dt == SBPIO_DT_I32)
            ((int32_t *)data)[i] = (int32_t)vals[i];
        else
            ((float *)data)[i] = (float)vals[i];
    }
    if (sbpio_npy_write(path, dt, 2, shape, data, err, sizeof err) != SBPIO_OK)
        fail("%s", err);
    free(data);
}

static void write_shard(const char *dir, const char *name, int64_t ntok, int64_t bad_at)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    int32_t header[256] = {SBPIO_SHARD_MAGIC_U16, SBPIO_SHARD_VERSION_U16, (int32_t)ntok};
    uint16_t *tok = malloc((size_t)ntok * sizeof *tok);
    rng_seed(7);
    int32_t t = 0;
    for (int64_t i = 0; i < ntok; i++) {
        tok[i] = (uint16_t)t;
        t = next_token(t);
    }
    if (bad_at >= 0)
        tok[bad_at] = V; /* one past the vocabulary */
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(header, sizeof header, 1, f) != 1 ||
        fwrite(tok, sizeof *tok, (size_t)ntok, f) != (size_t)ntok || fclose(f) != 0)
        fail("cannot write %s", path);
    free(tok);
}

static int cmd_all(const char *dir)
{
    static const struct { const char *file; model_kind kind; } models[] = {
        {"bigram.onnx", M_BIGRAM},   {"bigram_v12.onnx", M_BIGRAM_V12},
        {"renamed.onnx", M_RENAMED}, {"nan.onnx", M_NAN},
        {"static.onnx", M_STATIC},   {"tied.onnx", M_TIED},
        {"untied.onnx", M_TIED_UNTIED},
    };
    char path[1024];
    mkdir(dir, 0777); /* may exist already; a real problem shows when writing */
    for (size_t i = 0; i < sizeof models / sizeof models[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, models[i].file);
        write_model(path, models[i].kind);
    }

    /* One batch [B, T] of a token stream: ids and next-token labels, a few not scored. */
    int64_t ids[N], labels[N], bad[N];
    rng_seed(11);
    for (int b = 0; b < B; b++) {
        int32_t t = (int32_t)(rng_u32() % V);
        for (int i = 0; i < T; i++) {
            ids[b * T + i] = t;
            t = next_token(t);
            labels[b * T + i] = t;
        }
    }
    labels[0] = -100;
    labels[T + 3] = -100;
    write_npy_i(dir, "i32_ids.npy", SBPIO_DT_I32, B, T, ids);
    write_npy_i(dir, "i32_labels.npy", SBPIO_DT_I32, B, T, labels);
    write_npy_i(dir, "i64_ids.npy", SBPIO_DT_I64, B, T, ids);
    write_npy_i(dir, "i64_labels.npy", SBPIO_DT_I64, B, T, labels);
    write_npy_i(dir, "f32_ids.npy", SBPIO_DT_F32, B, T, ids);
    int64_t long_ids[B * (T + 1)];
    for (int i = 0; i < B * (T + 1); i++)
        long_ids[i] = i % V;
    write_npy_i(dir, "t9_ids.npy", SBPIO_DT_I32, B, T + 1, long_ids);
    write_npy_i(dir, "t9_labels.npy", SBPIO_DT_I32, B, T + 1, long_ids);
    memcpy(bad, ids, sizeof bad);
    bad[T + 2] = V; /* ids[1,2] = 16 */
    write_npy_i(dir, "badid_ids.npy", SBPIO_DT_I64, B, T, bad);
    memcpy(bad, labels, sizeof bad);
    bad[5] = -5; /* labels[0,5] = -5 */
    write_npy_i(dir, "badlabel_labels.npy", SBPIO_DT_I32, B, T, bad);
    for (int i = 0; i < N; i++)
        bad[i] = -100;
    write_npy_i(dir, "ignored_labels.npy", SBPIO_DT_I32, B, T, bad);
    /* document ids for the packed step: row 1 has a second document from position 4
     * (labels[1,3] is -100: no label crosses it); one that decreases; one of another shape */
    int64_t docs[N];
    for (int i = 0; i < N; i++)
        docs[i] = i >= T + 4;
    write_npy_i(dir, "docs_ok.npy", SBPIO_DT_I64, B, T, docs);
    docs[T + 2] = 1; /* doc_ids[1,2] = 1, doc_ids[1,3] = 0 */
    write_npy_i(dir, "docs_down.npy", SBPIO_DT_I32, B, T, docs);
    write_npy_i(dir, "docs_t4.npy", SBPIO_DT_I32, B, T / 2, docs);

    write_shard(dir, "stream.bin", 4096, -1);
    write_shard(dir, "short.bin", 10, -1);
    write_shard(dir, "badtok.bin", 4096, 1000);
    return failures ? 1 : 0;
}

/* ------------------------------------------------------------------ float64 reference */

typedef struct reference {
    int tied;
    double loss;
    double gW[V * V];  /* bigram: dL/dW */
    double gE[V * D];  /* tied: dL/dE, both uses (embedding and head = Eᵀ) */
    float W[V * V], E[V * D], bias[V]; /* the initial weights */
} reference;

static int parse_kind(const char *s)
{
    if (strcmp(s, "bigram") == 0)
        return 0;
    if (strcmp(s, "tied") == 0)
        return 1;
    fail("unknown kind '%s'", s);
    return -1;
}

static int read_batch(const char *ids_path, const char *labels_path, int32_t *ids,
                      int32_t *labels)
{
    char err[512];
    sbpio_array a = {0}, l = {0};
    if (sbpio_npy_read_i32(ids_path, &a, err, sizeof err) ||
        sbpio_npy_read_i32(labels_path, &l, err, sizeof err)) {
        fail("%s", err);
        sbpio_array_free(&a);
        return -1;
    }
    int rc = 0;
    if (a.numel != N || l.numel != N) {
        fail("expected %d ids and labels", N);
        rc = -1;
    } else {
        memcpy(ids, a.data, sizeof(int32_t) * N);
        memcpy(labels, l.data, sizeof(int32_t) * N);
    }
    sbpio_array_free(&a);
    sbpio_array_free(&l);
    return rc;
}

static void compute_reference(reference *r, int tied, const int32_t *ids, const int32_t *labels)
{
    memset(r, 0, sizeof *r);
    r->tied = tied;
    make_weights(r->W, V * V, 1, 0.5f);
    make_weights(r->E, V * D, 2, 0.5f);
    make_weights(r->bias, V, 3, 0.1f);
    int scored = 0;
    for (int i = 0; i < N; i++)
        scored += labels[i] != -100;
    for (int i = 0; i < N; i++) {
        if (labels[i] == -100)
            continue;
        double logit[V], p[V], mx = -INFINITY, s = 0;
        for (int v = 0; v < V; v++) {
            if (!tied) {
                logit[v] = r->W[ids[i] * V + v];
            } else {
                logit[v] = r->bias[v];
                for (int d = 0; d < D; d++)
                    logit[v] += (double)r->E[ids[i] * D + d] * r->E[v * D + d];
            }
            mx = fmax(mx, logit[v]);
        }
        for (int v = 0; v < V; v++)
            s += exp(logit[v] - mx);
        double lse = mx + log(s);
        r->loss += (lse - logit[labels[i]]) / scored;
        for (int v = 0; v < V; v++) {
            p[v] = (exp(logit[v] - lse) - (v == labels[i])) / scored; /* dL/dlogit */
            if (!tied) {
                r->gW[ids[i] * V + v] += p[v];
            } else {
                for (int d = 0; d < D; d++) {
                    r->gE[v * D + d] += p[v] * r->E[ids[i] * D + d];     /* head use */
                    r->gE[ids[i] * D + d] += p[v] * r->E[v * D + d];     /* embedding use */
                }
            }
        }
    }
}

/* max |got - want| relative to max |want|. */
static double rel_err(const float *got, const double *want, int n)
{
    double e = 0, m = 1e-30;
    for (int i = 0; i < n; i++) {
        e = fmax(e, fabs(got[i] - want[i]));
        m = fmax(m, fabs(want[i]));
    }
    return e / m;
}

static const float *st_tensor(const sbpio_st_file *f, const char *name, int rank, int64_t d0,
                              int64_t d1)
{
    const sbpio_st_info *t = sbpio_st_find(f, name);
    if (!t) {
        fail("no tensor '%s' in %s", name, sbpio_st_path(f));
        return NULL;
    }
    if (t->dtype != SBPIO_DT_F32 || t->rank != rank || t->shape[0] != d0 ||
        (rank > 1 && t->shape[1] != d1)) {
        fail("tensor '%s' is %s rank %d [%lld,...], expected F32 [%lld,%lld]", name,
             sbpio_dtype_name(t->dtype), t->rank, (long long)t->shape[0], (long long)d0,
             (long long)d1);
        return NULL;
    }
    return t->data;
}

static int cmd_check_grads(const char *file, const char *kind, const char *ids_path,
                           const char *labels_path)
{
    int tied = parse_kind(kind);
    int32_t ids[N], labels[N];
    if (tied < 0 || read_batch(ids_path, labels_path, ids, labels))
        return 1;
    static reference r;
    compute_reference(&r, tied, ids, labels);

    char err[512];
    sbpio_st_file *f = NULL;
    if (sbpio_st_open(file, &f, err, sizeof err)) {
        fail("%s", err);
        return 1;
    }
    const char *loss_s = sbpio_st_meta(f, "loss");
    if (!loss_s) {
        fail("%s has no 'loss' in __metadata__", file);
    } else {
        double loss = strtod(loss_s, NULL);
        printf("loss: dumped %s, reference %.9g\n", loss_s, r.loss);
        if (fabs(loss - r.loss) > 1e-6 * fabs(r.loss))
            fail("loss %s differs from the reference %.9g", loss_s, r.loss);
        /* at least 9 significant digits (float32 round trip) */
        int digits = 0;
        for (const char *p = loss_s; *p && *p != 'e' && *p != 'E'; p++)
            digits += *p >= '0' && *p <= '9';
        if (digits < 9 && (double)(float)loss != loss)
            fail("loss '%s' has fewer than 9 significant digits", loss_s);
    }
    if (!tied) {
        const float *gW = st_tensor(f, "W", 2, V, V);
        if (gW) {
            double e = rel_err(gW, r.gW, V * V);
            printf("W: relative error %.3g\n", e);
            if (e > 1e-5)
                fail("gradient of W is off: relative error %.3g", e);
        }
        if (sbpio_st_count(f) != 1)
            fail("expected exactly 1 tensor, found %d", sbpio_st_count(f));
    } else {
        const float *gE = st_tensor(f, "E", 2, V, D);
        const float *gH = st_tensor(f, "head", 2, D, V);
        const float *gb = st_tensor(f, "bias", 1, V, 0);
        if (gE) {
            double e = rel_err(gE, r.gE, V * D);
            printf("E: relative error %.3g\n", e);
            if (e > 1e-5)
                fail("gradient of E is off: relative error %.3g", e);
        }
        if (gE && gH)
            for (int i = 0; i < V; i++)
                for (int d = 0; d < D; d++)
                    if (gH[d * V + i] != gE[i * D + d]) {
                        fail("gradient of head[%d,%d] is not that of E[%d,%d] transposed", d, i,
                             i, d);
                        i = V;
                        break;
                    }
        if (gb)
            for (int i = 0; i < V; i++)
                if (gb[i] != 0) {
                    fail("gradient of the frozen bias[%d] is %g, not 0", i, gb[i]);
                    break;
                }
        if (sbpio_st_count(f) != 3)
            fail("expected exactly 3 tensors, found %d", sbpio_st_count(f));
    }
    sbpio_st_close(f);
    return failures ? 1 : 0;
}

/* ------------------------------------------------------------------ --save check */

static const float *param_data(ir_graph *g, const char *name, int64_t numel)
{
    ir_value *v = ir_value_find(g, name);
    if (!v || v->kind != IR_VAL_PARAM || v->dtype != IR_DT_FLOAT || ir_value_numel(v) != numel ||
        !v->data) {
        fail("saved model: no float initializer '%s' of %lld elements", name, (long long)numel);
        return NULL;
    }
    return v->data;
}

/* The weight after one optimizer step from w with gradient g (float64). */
static double updated(const char *opt, double lr, double wd, double w, double g)
{
    if (strcmp(opt, "sgd") == 0)
        return w - lr * (g + wd * w);
    /* AdamW, step 1: m̂ = g, v̂ = g² */
    return w * (1 - lr * wd) - lr * g / (fabs(g) + 1e-8);
}

static void check_updated(const char *name, const float *got, const float *w0, const double *g,
                          int n, const char *opt, double lr, double wd)
{
    double worst = 0;
    int changed = 0;
    for (int i = 0; i < n; i++) {
        double want = updated(opt, lr, wd, w0[i], g[i]);
        double e = fabs(got[i] - want) / (1e-6 + fabs(want));
        worst = fmax(worst, e);
        changed += got[i] != w0[i];
    }
    printf("%s: %d of %d weights changed, worst relative error %.3g\n", name, changed, n, worst);
    if (worst > 2e-5)
        fail("saved %s differs from the expected update (relative error %.3g)", name, worst);
    if (changed == 0)
        fail("saved %s is unchanged", name);
}

static int cmd_check_saved(const char *file, const char *kind, const char *opt,
                           const char *lr_s, const char *wd_s, const char *ids_path,
                           const char *labels_path)
{
    int tied = parse_kind(kind);
    int32_t ids[N], labels[N];
    if (tied < 0 || read_batch(ids_path, labels_path, ids, labels))
        return 1;
    static reference r;
    compute_reference(&r, tied, ids, labels);
    double lr = strtod(lr_s, NULL), wd = strtod(wd_s, NULL);

    ir_diag diag;
    ir_diag_init(&diag, file);
    ir_graph *g = ir_import_onnx(file, &diag, NULL);
    if (!g || diag.n_errors) {
        ir_diag_print(&diag, stderr, "train_fixture");
        fail("cannot re-import %s", file);
    } else if (!tied) {
        const float *W = param_data(g, "W", V * V);
        if (W)
            check_updated("W", W, r.W, r.gW, V * V, opt, lr, wd);
    } else {
        const float *E = param_data(g, "E", V * D), *H = param_data(g, "head", D * V);
        const float *bias = param_data(g, "bias", V);
        if (E)
            check_updated("E", E, r.E, r.gE, V * D, opt, lr, wd);
        if (E && H)
            for (int i = 0; i < V * D; i++)
                if (H[(i % D) * V + i / D] != E[i]) {
                    fail("saved head is not the transpose of saved E");
                    break;
                }
        if (bias && memcmp(bias, r.bias, sizeof r.bias) != 0)
            fail("the frozen bias changed");
    }
    ir_graph_free(g);
    ir_diag_free(&diag);
    return failures ? 1 : 0;
}

/* ------------------------------------------------------------------ steps compiled by sbpc */

static char *read_text(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fail("cannot open %s", path);
        return NULL;
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (!buf || fread(buf, 1, (size_t)n, f) != (size_t)n) {
        fail("cannot read %s", path);
        free(buf);
        fclose(f);
        return NULL;
    }
    buf[n] = 0;
    fclose(f);
    return buf;
}

/* sbp-train's "step N loss X" lines (in LOG) against the float64 AdamW losses of a
 * ref/<family>_adamw.json (a JSON array, the loss before each step). */
static void check_losses(const char *log_path, const char *json_path)
{
    char *log = read_text(log_path), *json = read_text(json_path);
    if (!log || !json) {
        free(log);
        free(json);
        return;
    }
    double ref[256];
    int n_ref = 0;
    char *p = strchr(json, '[');
    while (p && *p && *p != ']' && n_ref < 256) {
        p++;
        char *end;
        double x = strtod(p, &end);
        if (end == p)
            break;
        ref[n_ref++] = x;
        p = end;
        while (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t')
            p++;
    }
    int n = 0;
    double worst = 0;
    for (char *line = log, *nl; line && *line; line = nl ? nl + 1 : NULL) {
        nl = strchr(line, '\n');
        long long step;
        double loss;
        if (sscanf(line, "step %lld loss %lf", &step, &loss) != 2)
            continue;
        n++;
        if (step != n || step > n_ref) {
            fail("unexpected line 'step %lld' (%d reference losses)", step, n_ref);
            break;
        }
        double e = fabs(loss - ref[step - 1]) / fabs(ref[step - 1]);
        worst = fmax(worst, e);
        if (e > 1e-4)
            fail("step %lld: loss %.6f, the reference says %.9g", step, loss, ref[step - 1]);
    }
    printf("%d losses against %s: worst relative error %.3g\n", n, json_path, worst);
    if (n < 2)
        fail("fewer than 2 'step N loss X' lines in %s", log_path);
    free(log);
    free(json);
}

/* Every tensor of a --dump-grads file against ref/<family>_grads.safetensors (F64, same names,
 * same layouts): ||g - ref|| / ||ref|| <= 1e-4 per tensor, the loss to 1e-5. */
static int cmd_check_ref(const char *grads, const char *ref, const char *log, const char *json)
{
    char err[512];
    sbpio_st_file *g = NULL, *r = NULL;
    if (sbpio_st_open(grads, &g, err, sizeof err) || sbpio_st_open(ref, &r, err, sizeof err)) {
        fail("%s", err);
        sbpio_st_close(g);
        return 1;
    }
    const char *gl = sbpio_st_meta(g, "loss"), *rl = sbpio_st_meta(r, "loss");
    if (!gl || !rl) {
        fail("no loss in the metadata");
    } else {
        double e = fabs(strtod(gl, NULL) - strtod(rl, NULL)) / fabs(strtod(rl, NULL));
        printf("loss %s, reference %s: relative error %.3g\n", gl, rl, e);
        if (e > 1e-5)
            fail("the loss is off");
    }
    double worst = 0;
    const char *worst_name = "";
    for (int i = 0; i < sbpio_st_count(r); i++) {
        const sbpio_st_info *ri = sbpio_st_at(r, i);
        const sbpio_st_info *gi = sbpio_st_find(g, ri->name);
        if (!gi) {
            fail("%s has no gradient for '%s'", grads, ri->name);
            continue;
        }
        bool same = gi->dtype == SBPIO_DT_F32 && gi->rank == ri->rank;
        for (int d = 0; same && d < ri->rank; d++)
            same = gi->shape[d] == ri->shape[d];
        if (!same) {
            fail("'%s': the dumped gradient is not F32 of the reference's shape", ri->name);
            continue;
        }
        double *a = malloc((size_t)ri->numel * sizeof(double) + 8);
        double *b = malloc((size_t)ri->numel * sizeof(double) + 8);
        if (!sbpio_st_copy_f64(g, ri->name, a, ri->numel, err, sizeof err) &&
            !sbpio_st_copy_f64(r, ri->name, b, ri->numel, err, sizeof err)) {
            double d2 = 0, r2 = 0;
            for (int64_t k = 0; k < ri->numel; k++) {
                d2 += (a[k] - b[k]) * (a[k] - b[k]);
                r2 += b[k] * b[k];
            }
            double e = sqrt(d2) / fmax(sqrt(r2), 1e-30);
            if (e > worst) {
                worst = e;
                worst_name = ri->name;
            }
            if (e > 1e-4)
                fail("gradient of '%s': relative error %.3g", ri->name, e);
        } else {
            fail("%s", err);
        }
        free(a);
        free(b);
    }
    for (int i = 0; i < sbpio_st_count(g); i++)
        if (!sbpio_st_find(r, sbpio_st_at(g, i)->name))
            fail("'%s' is not a float initializer of the reference", sbpio_st_at(g, i)->name);
    printf("%d gradients against %s: worst relative error %.3g ('%s')\n", sbpio_st_count(r), ref,
           worst, worst_name);
    sbpio_st_close(g);
    sbpio_st_close(r);
    if (log && json)
        check_losses(log, json);
    return failures ? 1 : 0;
}

/* After one SGD step without weight decay, every initializer in GRADS must be saved as
 * original - lr * gradient (tied copies included, each in its own layout), and every other
 * initializer must be unchanged. */
static int cmd_check_sgd_save(const char *orig_path, const char *saved_path, const char *grads,
                              const char *lr_s)
{
    double lr = strtod(lr_s, NULL);
    char err[512];
    ir_diag d0, d1;
    ir_diag_init(&d0, orig_path);
    ir_diag_init(&d1, saved_path);
    ir_graph *g0 = ir_import_onnx(orig_path, &d0, NULL);
    ir_graph *g1 = ir_import_onnx(saved_path, &d1, NULL);
    sbpio_st_file *gf = NULL;
    if (!g0 || !g1 || d0.n_errors || d1.n_errors) {
        ir_diag_print(&d0, stderr, "train_fixture");
        ir_diag_print(&d1, stderr, "train_fixture");
        fail("cannot import the models");
    } else if (sbpio_st_open(grads, &gf, err, sizeof err)) {
        fail("%s", err);
    } else {
        int n_changed = 0, n_same = 0;
        double worst = 0;
        for (int i = 0; i < g0->n_values; i++) {
            const ir_value *v0 = g0->values[i];
            if (v0->kind != IR_VAL_PARAM && v0->kind != IR_VAL_CONST)
                continue;
            const ir_value *v1 = ir_value_find(g1, v0->name);
            if (!v1 || v1->dtype != v0->dtype || v1->nbytes != v0->nbytes) {
                fail("saved model: '%s' is missing or changed type", v0->name);
                continue;
            }
            const sbpio_st_info *t = sbpio_st_find(gf, v0->name);
            if (!t) {
                if (memcmp(v0->data, v1->data, v0->nbytes) != 0)
                    fail("'%s' has no gradient but changed", v0->name);
                n_same++;
                continue;
            }
            if (t->dtype != SBPIO_DT_F32 || (size_t)t->numel * 4 != v0->nbytes) {
                fail("'%s': gradient of another size", v0->name);
                continue;
            }
            const float *w0 = v0->data, *w1 = v1->data, *gr = t->data;
            for (int64_t k = 0; k < t->numel; k++) {
                double want = (double)w0[k] - lr * gr[k];
                double e = fabs(w1[k] - want) / (1e-6 + fabs(want));
                worst = fmax(worst, e);
            }
            n_changed++;
        }
        printf("%d updated initializers (worst relative error %.3g), %d unchanged\n", n_changed,
               worst, n_same);
        if (worst > 1e-5)
            fail("the saved weights are not original - lr * gradient");
        if (n_changed != sbpio_st_count(gf))
            fail("%d gradients but %d updated initializers", sbpio_st_count(gf), n_changed);
    }
    sbpio_st_close(gf);
    ir_graph_free(g0);
    ir_graph_free(g1);
    ir_diag_free(&d0);
    ir_diag_free(&d1);
    return failures ? 1 : 0;
}

/* After a step with parameters frozen (sbpc --freeze): every gradient tensor whose name
 * contains `frozen` is all zero and its weight saved unchanged (weight decay included); every
 * other one changed. */
static int cmd_check_frozen(const char *orig_path, const char *saved_path, const char *grads,
                            const char *frozen)
{
    char err[512];
    ir_diag d0, d1;
    ir_diag_init(&d0, orig_path);
    ir_diag_init(&d1, saved_path);
    ir_graph *g0 = ir_import_onnx(orig_path, &d0, NULL);
    ir_graph *g1 = ir_import_onnx(saved_path, &d1, NULL);
    sbpio_st_file *gf = NULL;
    int n_frozen = 0, n_trained = 0;
    if (!g0 || !g1 || d0.n_errors || d1.n_errors) {
        fail("cannot import the models");
    } else if (sbpio_st_open(grads, &gf, err, sizeof err)) {
        fail("%s", err);
    } else {
        for (int i = 0; i < sbpio_st_count(gf); i++) {
            const sbpio_st_info *t = sbpio_st_at(gf, i);
            const ir_value *v0 = ir_value_find(g0, t->name), *v1 = ir_value_find(g1, t->name);
            if (!v0 || !v1 || v0->nbytes != v1->nbytes || !v0->data || !v1->data) {
                fail("'%s' is missing from a model", t->name);
                continue;
            }
            bool same = memcmp(v0->data, v1->data, v0->nbytes) == 0;
            if (strstr(t->name, frozen)) {
                n_frozen++;
                const float *gr = t->data;
                for (int64_t k = 0; k < t->numel; k++)
                    if (gr[k] != 0) {
                        fail("frozen '%s' has a nonzero gradient", t->name);
                        break;
                    }
                if (!same)
                    fail("frozen '%s' changed", t->name);
            } else {
                n_trained++;
                if (same)
                    fail("trainable '%s' did not change", t->name);
            }
        }
    }
    printf("%d frozen parameters unchanged with zero gradients, %d trained\n", n_frozen,
           n_trained);
    if (n_frozen == 0 || n_trained == 0)
        fail("expected both frozen and trained parameters");
    sbpio_st_close(gf);
    ir_graph_free(g0);
    ir_graph_free(g1);
    ir_diag_free(&d0);
    ir_diag_free(&d1);
    return failures ? 1 : 0;
}

/* ------------------------------------------------------------------ DPO / GRPO */

/* The initializer of g holding the same bytes as v. */
static const ir_value *same_weights(const ir_graph *g, const ir_value *v)
{
    for (int i = 0; i < g->n_values; i++) {
        const ir_value *w = g->values[i];
        if (w->kind == IR_VAL_PARAM && w->nbytes == v->nbytes && w->rank == v->rank &&
            w->data && memcmp(w->data, v->data, v->nbytes) == 0)
            return w;
    }
    return NULL;
}

static int cmd_compare_grads(const char *got, const char *got_model, const char *want,
                             const char *want_model, const char *tol_s)
{
    double tol = strtod(tol_s, NULL);
    char err[512];
    sbpio_st_file *g = NULL, *w = NULL;
    ir_diag d0, d1;
    ir_diag_init(&d0, got_model);
    ir_diag_init(&d1, want_model);
    ir_graph *gm = ir_import_onnx(got_model, &d0, NULL), *wm = ir_import_onnx(want_model, &d1, NULL);
    if (!gm || !wm)
        fail("cannot read the models");
    else if (sbpio_st_open(got, &g, err, sizeof err) || sbpio_st_open(want, &w, err, sizeof err))
        fail("%s", err);
    if (failures)
        goto out;
    const char *gl = sbpio_st_meta(g, "loss"), *wl = sbpio_st_meta(w, "loss");
    if (!gl || !wl) {
        fail("no loss in the metadata");
    } else {
        double e = fabs(strtod(gl, NULL) - strtod(wl, NULL)) / fabs(strtod(wl, NULL));
        printf("loss %s, want %s: relative error %.3g\n", gl, wl, e);
        if (!(e <= tol))
            fail("the loss is off");
    }
    double worst = 0;
    for (int i = 0; i < sbpio_st_count(g); i++) {
        const sbpio_st_info *gi = sbpio_st_at(g, i);
        const ir_value *v = ir_value_find(gm, gi->name);
        const ir_value *u = v && v->data ? same_weights(wm, v) : NULL;
        const sbpio_st_info *wi = u ? sbpio_st_find(w, u->name) : NULL;
        if (!wi || wi->numel != gi->numel) {
            fail("'%s': no gradient of the same weights in %s", gi->name, want);
            continue;
        }
        double *a = malloc((size_t)gi->numel * sizeof(double) + 8);
        double *b = malloc((size_t)gi->numel * sizeof(double) + 8);
        if (a && b && !sbpio_st_copy_f64(g, gi->name, a, gi->numel, err, sizeof err) &&
            !sbpio_st_copy_f64(w, wi->name, b, wi->numel, err, sizeof err)) {
            double d2 = 0, r2 = 0;
            for (int64_t k = 0; k < gi->numel; k++) {
                d2 += (a[k] - b[k]) * (a[k] - b[k]);
                r2 += b[k] * b[k];
            }
            double e = sqrt(d2) / fmax(sqrt(r2), 1e-30);
            worst = fmax(worst, e);
            if (!(e <= tol))
                fail("gradient of '%s': relative error %.3g > %g", gi->name, e, tol);
        } else {
            fail("%s", err);
        }
        free(a);
        free(b);
    }
    printf("%d gradients against %s: worst relative error %.3g (tolerance %g)\n",
           sbpio_st_count(g), want, worst, tol);
out:
    sbpio_st_close(g);
    sbpio_st_close(w);
    ir_graph_free(gm);
    ir_graph_free(wm);
    ir_diag_free(&d0);
    ir_diag_free(&d1);
    return failures ? 1 : 0;
}

/* Copies REF_DIR/name (.npy) to DIR/out keeping its first `rows` rows (0: all), with a NaN at
 * flat index nan_at (float32 arrays; -1: none) and row clear_row all -100 (int32 labels; -1:
 * none). */
static void write_variant(const char *ref_dir, const char *name, const char *dir,
                          const char *out, int64_t rows, float nan_at, int32_t clear_row)
{
    char path[1024], err[512];
    snprintf(path, sizeof path, "%s/%s", ref_dir, name);
    sbpio_array a;
    if (sbpio_npy_read(path, &a, err, sizeof err) != SBPIO_OK) {
        fail("%s", err);
        return;
    }
    int64_t shape[2] = {a.shape[0], a.rank > 1 ? a.shape[1] : 1};
    int64_t per_row = a.rank > 1 ? shape[1] : 1;
    if (rows > 0)
        shape[0] = rows; /* the first rows */
    if (nan_at >= 0 && a.dtype == SBPIO_DT_F32)
        ((float *)a.data)[(int64_t)nan_at] = NAN;
    if (clear_row >= 0 && a.dtype == SBPIO_DT_I32)
        for (int64_t t = 0; t < per_row; t++)
            ((int32_t *)a.data)[clear_row * per_row + t] = -100;
    snprintf(path, sizeof path, "%s/%s", dir, out);
    if (sbpio_npy_write(path, a.dtype, a.rank, shape, a.data, err, sizeof err) != SBPIO_OK)
        fail("%s", err);
    sbpio_array_free(&a);
}

static int cmd_pref_inputs(const char *ref_dir, const char *dir)
{
    write_variant(ref_dir, "llama_grpo_advantages.npy", dir, "nan_advantages.npy", 0, 2, -1);
    write_variant(ref_dir, "llama_grpo_advantages.npy", dir, "advantages_3.npy", 3, -1, -1);
    write_variant(ref_dir, "llama_grpo_old_logps.npy", dir, "old_logps_nan.npy", 0, 64 + 20,
                  -1); /* row 1, t 20: scored (its prompt is 3 tokens) */
    write_variant(ref_dir, "pref_labels.npy", dir, "labels_row2_unscored.npy", 0, -1, 2);
    write_variant(ref_dir, "pref_input_ids.npy", dir, "ids_3rows.npy", 3, -1, -1);
    write_variant(ref_dir, "pref_labels.npy", dir, "labels_3rows.npy", 3, -1, -1);
    write_variant(ref_dir, "llama_grpo_ref_logps.npy", dir, "ref_logps_3rows.npy", 3, -1, -1);
    return failures ? 1 : 0;
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "all") == 0)
        return cmd_all(argv[2]);
    if (argc == 6 && strcmp(argv[1], "check-grads") == 0)
        return cmd_check_grads(argv[2], argv[3], argv[4], argv[5]);
    if (argc == 9 && strcmp(argv[1], "check-saved") == 0)
        return cmd_check_saved(argv[2], argv[3], argv[4], argv[5], argv[6], argv[7], argv[8]);
    if ((argc == 4 || argc == 6) && strcmp(argv[1], "check-ref") == 0)
        return cmd_check_ref(argv[2], argv[3], argc == 6 ? argv[4] : NULL,
                             argc == 6 ? argv[5] : NULL);
    if (argc == 6 && strcmp(argv[1], "check-frozen") == 0)
        return cmd_check_frozen(argv[2], argv[3], argv[4], argv[5]);
    if (argc == 6 && strcmp(argv[1], "check-sgd-save") == 0)
        return cmd_check_sgd_save(argv[2], argv[3], argv[4], argv[5]);
    if (argc == 7 && strcmp(argv[1], "compare-grads") == 0)
        return cmd_compare_grads(argv[2], argv[3], argv[4], argv[5], argv[6]);
    if (argc == 4 && strcmp(argv[1], "pref-inputs") == 0)
        return cmd_pref_inputs(argv[2], argv[3]);
    fprintf(stderr, "usage: train_fixture all DIR\n"
                    "       train_fixture check-grads GRADS.safetensors KIND IDS.npy LABELS.npy\n"
                    "       train_fixture check-saved SAVED.onnx KIND OPT LR WD IDS.npy "
                    "LABELS.npy\n"
                    "       train_fixture check-ref GRADS.safetensors REF.safetensors [LOG "
                    "ADAMW.json]\n"
                    "       train_fixture check-sgd-save MODEL.onnx SAVED.onnx GRADS.safetensors "
                    "LR\n"
                    "       train_fixture check-frozen MODEL.onnx SAVED.onnx GRADS.safetensors "
                    "SUBSTRING\n"
                    "       train_fixture compare-grads GOT.safetensors GOT.onnx "
                    "WANT.safetensors WANT.onnx TOL\n"
                    "       train_fixture pref-inputs REF_DIR DIR\n");
    return 2;
}
