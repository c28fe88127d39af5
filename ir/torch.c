/* torch.c — PyTorch's names for an export's initializers, and PEFT's LoRA adapters (torch.h).
 *
 * Moved here from train/train_export.c (sbp-train --save-safetensors) so that sbpc's --lora
 * pass names the layers it adapts the same way: one procedure, two callers. Everything is
 * read-only on the graph; strings are malloc'd because the tools keep them past the graph.
 */
#include "torch.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fail(char *err, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(char *err, size_t n, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, n, fmt, ap);
    va_end(ap);
    return -1;
}

/* The PARAMETER entries of the dynamo signature (ir_signature_each), passed on to f. */
struct sig_params {
    void (*f)(const char *, size_t, void *);
    void *ctx;
};

static void sig_params_cb(const char *kind, const char *name, size_t len, void *ctx)
{
    struct sig_params *q = ctx;
    if (strncmp(kind, "PARAMETER", 9) == 0)
        q->f(name, len, q->ctx);
}

void ir_torch_signature_params(const char *sig, void (*f)(const char *, size_t, void *),
                               void *ctx)
{
    struct sig_params q = {f, ctx};
    ir_signature_each(sig, sig_params_cb, &q);
}

struct sig_find {
    const char *name;
    bool found;
};

static void sig_find_cb(const char *s, size_t n, void *ctx)
{
    struct sig_find *q = ctx;
    q->found |= strlen(q->name) == n && strncmp(q->name, s, n) == 0;
}

bool ir_torch_is_name(const ir_graph *g, const char *name)
{
    if (g->torch_signature) {
        struct sig_find q = {name, false};
        ir_torch_signature_params(g->torch_signature, sig_find_cb, &q);
        return q.found;
    }
    if (strncmp(name, "onnx::", 6) == 0)
        return false;
    if (strncmp(name, "val_", 4) == 0 && name[4]) {
        const char *d = name + 4;
        while (*d >= '0' && *d <= '9')
            d++;
        return *d != 0;
    }
    return true;
}

/* The module path of a TorchScript node name, `/a/b.0/c/Op` -> "a.b.0.c" (malloc'd), or NULL
 * when the name carries no scope. */
static char *name_scope(const char *name)
{
    if (!name || name[0] != '/')
        return NULL;
    const char *last = strrchr(name, '/');
    if (last == name)
        return NULL; /* "/Op": the top-level module, no path */
    char *s = strndup(name + 1, (size_t)(last - name - 1));
    for (char *c = s; c && *c; c++)
        if (*c == '/')
            *c = '.';
    return s;
}

static bool ends_with(const char *s, const char *tail)
{
    size_t n = strlen(s), k = strlen(tail);
    return n >= k && strcmp(s + n - k, tail) == 0;
}

char *ir_torch_node_scope(const ir_node *n)
{
    if (n->name && n->name[0] == '/')
        return name_scope(n->name);
    /* a canonical node: the product it stands for names the module best (a Linear's origins
     * are its MatMul or Gemm and the Transpose / Add / Reshapes around it, all of one module) */
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < n->n_origin; i++) {
            const char *o = n->origin[i];
            if (o && o[0] == '/' &&
                (pass == 1 || ends_with(o, "/MatMul") || ends_with(o, "/Gemm")))
                return name_scope(o);
        }
    return NULL;
}

bool ir_torch_consumer_role(const ir_node *n, int slot, const ir_value *v, const char **leaf,
                            bool *transposed)
{
    if (n->op == IR_OP_MATMUL && slot == 1 && v->rank == 2) {
        *leaf = "weight";
        *transposed = true; /* x @ W with W [in, out]: nn.Linear's weight is [out, in] */
        return true;
    }
    if (n->op == IR_OP_GEMM && slot == 1 && v->rank == 2) {
        *leaf = "weight";
        *transposed = ir_attr_int(n, "transB", 0) == 0;
        return true;
    }
    if (n->op == IR_OP_LINEAR && slot == 1 && v->rank == 2) {
        *leaf = "weight";
        *transposed = ir_attr_int(n, "trans_w", 0) == 0; /* [K,N] unless trans_w */
        return true;
    }
    if ((n->op == IR_OP_GEMM || n->op == IR_OP_LINEAR) && slot == 2 && v->rank == 1) {
        *leaf = "bias";
        *transposed = false;
        return true;
    }
    return false;
}

struct prefix_tally {
    char *text[8];
    int count[8];
    int n;
};

static void tally_add(struct prefix_tally *t, const char *s, size_t len)
{
    for (int i = 0; i < t->n; i++)
        if (strlen(t->text[i]) == len && strncmp(t->text[i], s, len) == 0) {
            t->count[i]++;
            return;
        }
    if (t->n < 8 && (t->text[t->n] = strndup(s, len)))
        t->count[t->n++] = 1;
}

char *ir_torch_learn_prefix(const ir_graph *g, const ir_uses *u, int n,
                            const ir_value *const *vals, const char *const *names)
{
    (void)g;
    struct prefix_tally t = {0};
    for (int i = 0; i < n; i++) {
        const char *dot = names[i] && vals[i] ? strrchr(names[i], '.') : NULL;
        const ir_value *v = vals[i];
        if (!dot)
            continue;
        size_t ml = (size_t)(dot - names[i]); /* the module path's length */
        for (int k = 0; k < u->n_uses[v->id]; k++) {
            char *s = ir_torch_node_scope(u->uses[v->id][k].node);
            size_t sl = s ? strlen(s) : 0;
            if (s && sl >= ml && strncmp(s + sl - ml, names[i], ml) == 0 &&
                (sl == ml || s[sl - ml - 1] == '.'))
                tally_add(&t, s, sl - ml);
            free(s);
        }
    }
    int best = -1;
    for (int i = 0; i < t.n; i++)
        if (best < 0 || t.count[i] > t.count[best])
            best = i;
    char *p = best >= 0 ? t.text[best] : strndup("", 0);
    for (int i = 0; i < t.n; i++)
        if (i != best)
            free(t.text[i]);
    return p;
}

int ir_torch_name_from_scopes(const ir_graph *g, const ir_uses *u, const ir_value *v,
                              const char *prefix, ir_torch_name *pn, char *err, size_t errlen)
{
    (void)g;
    if (!v)
        return 0;
    size_t pl = strlen(prefix);
    for (int k = 0; k < u->n_uses[v->id]; k++) {
        const ir_node *n = u->uses[v->id][k].node;
        const char *leaf;
        bool tr;
        if (!ir_torch_consumer_role(n, u->uses[v->id][k].slot, v, &leaf, &tr))
            continue;
        pn->tr_hint = tr;
        /* The dynamo exporter's module path (node metadata, see ir_node.scope) is relative to
         * the exported module already, as its parameter names are: no prefix to strip. */
        char *s = n->scope ? strndup(n->scope, strlen(n->scope)) : ir_torch_node_scope(n);
        if (!s)
            continue;
        const char *mod = !n->scope && strncmp(s, prefix, pl) == 0 ? s + pl : s;
        size_t len = strlen(mod) + strlen(leaf) + 2;
        char *name = malloc(len);
        if (!name) {
            free(s);
            return fail(err, errlen, "out of memory");
        }
        snprintf(name, len, "%s.%s", mod, leaf);
        free(s);
        if (pn->name && (strcmp(pn->name, name) != 0 || pn->transposed != tr)) {
            int rc = fail(err, errlen,
                          "initializer '%s' was renamed by the exporter, and its PyTorch name is "
                          "ambiguous: node '%s' reads it as '%s'%s, node '%s' as '%s'%s; refusing "
                          "to guess", v->name, pn->via, pn->name,
                          pn->transposed ? " (transposed)" : "", n->name, name,
                          tr ? " (transposed)" : "");
            free(name);
            return rc;
        }
        if (pn->name) {
            free(name);
            continue;
        }
        *pn = (ir_torch_name){.name = name, .transposed = tr, .recovered = true, .via = n->name,
                              .tr_hint = tr};
    }
    return 0;
}

/* ------------------------------------------------------------------ LoRA adapters */

int ir_lora_kind(const char *name)
{
    if (ends_with(name, IR_LORA_A_SUFFIX))
        return 'A';
    if (ends_with(name, IR_LORA_B_SUFFIX))
        return 'B';
    return 0;
}

void ir_lora_init(const char *name, uint64_t seed, int64_t rows, int64_t cols, float *out)
{
    const int64_t n = rows * cols;
    if (ir_lora_kind(name) != 'A') {
        memset(out, 0, (size_t)n * sizeof *out);
        return;
    }
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a 64 */
    for (const unsigned char *c = (const unsigned char *)name; *c; c++)
        h = (h ^ *c) * 0x100000001b3ull;
    uint64_t state = seed ^ h;
    const double bound = 1.0 / sqrt((double)cols);
    for (int64_t i = 0; i < n; i++) {
        state += 0x9E3779B97F4A7C15ull;
        uint64_t z = state;
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        z ^= z >> 31;
        double uni = (double)(z >> 40) * (1.0 / 16777216.0);
        out[i] = (float)((2.0 * uni - 1.0) * bound);
    }
}

/* ------------------------------------------------------------------ merged initializers */

/* path with every all-digit component replaced by '#': "model.layers.3.mlp" -> "model.layers.#.mlp"
 * (into buf, truncated). Returns whether any component was a number. */
static bool path_shape(const char *path, char *buf, size_t n)
{
    bool any = false;
    size_t k = 0;
    for (const char *p = path; *p && k + 1 < n;) {
        size_t len = strcspn(p, ".");
        bool digits = len > 0;
        for (size_t i = 0; i < len && digits; i++)
            digits = p[i] >= '0' && p[i] <= '9';
        if (digits) {
            buf[k++] = '#';
            any = true;
        } else {
            for (size_t i = 0; i < len && k + 1 < n; i++)
                buf[k++] = p[i];
        }
        p += len;
        if (*p == '.' && k + 1 < n) {
            buf[k++] = '.';
            p++;
        }
    }
    buf[k] = '\0';
    return any;
}

/* The module a node came from: the dynamo exporter's scope, else the TorchScript name's. */
static char *user_module(const ir_node *n)
{
    if (n->scope && n->scope[0])
        return strndup(n->scope, strlen(n->scope));
    return ir_torch_node_scope(n);
}

int ir_torch_warn_merged(const ir_graph *g, const ir_uses *u, ir_diag *d)
{
    int warned = 0, more = 0;
    for (int i = 0; i < g->n_values; i++) {
        const ir_value *v = g->values[i];
        if (v->kind != IR_VAL_PARAM || u->n_uses[v->id] < 2)
            continue;
        /* two users in modules of one shape but different indices ("layers.0.input_layernorm"
         * and "layers.1.input_layernorm"): one initializer serves two copies of a module */
        char *first = NULL, *other = NULL;
        int n_mod = 0;
        for (int k = 0; k < u->n_uses[v->id]; k++) {
            char *m = user_module(u->uses[v->id][k].node);
            if (!m)
                continue;
            if (!first) {
                first = m;
                n_mod = 1;
                continue;
            }
            char a[512], b[512];
            if (strcmp(m, first) != 0 && path_shape(m, a, sizeof a) &&
                path_shape(first, b, sizeof b) && strcmp(a, b) == 0 &&
                (!other || strcmp(m, other) != 0)) {
                n_mod++;
                free(other);
                other = m;
            } else {
                free(m);
            }
        }
        if (other && warned < 3)
            ir_diag_add(d, IR_SEV_WARNING, NULL, NULL,
                        "parameter '%s' is read by copies of one module with different indices "
                        "('%s', '%s'%s): the file holds one initializer for them, so they train "
                        "as one weight. If the model has one per copy, the exporter merged "
                        "initializers of equal value (torch.onnx.export's default optimisation "
                        "does, e.g. for a freshly initialised model's norm weights, all ones): "
                        "export with optimize=False, or from trained weights",
                        v->name, first, other, n_mod > 2 ? ", ..." : "");
        else if (other)
            more++;
        warned += other != NULL;
        free(first);
        free(other);
    }
    if (more)
        ir_diag_add(d, IR_SEV_WARNING, NULL, NULL,
                    "... and %d more parameters read by several copies of a module", more);
    return warned;
}
