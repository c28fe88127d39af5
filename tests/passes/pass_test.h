/* pass_test.h — small graph-building helpers shared by the pass tests (header-only).
 *
 * Shapes are written as strings so a test reads like the IR dump: val(g, IR_VAL_INPUT, "x",
 * IR_DT_FLOAT, "batch,sequence,32"); "" is a scalar, "?" an unknown dim. Nodes are built with
 * mknode(), which does NOT run inference, so tests can call ir_infer_node and look at the
 * diagnostics of broken nodes themselves.
 */
#ifndef SBP_PASS_TEST_H
#define SBP_PASS_TEST_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "passes.h"

typedef struct tgraph {
    ir_diag diag;
    ir_graph *g;
} tgraph;

static inline tgraph *tg_new(int64_t opset)
{
    tgraph *t = calloc(1, sizeof *t);
    ir_diag_init(&t->diag, "test.onnx");
    t->g = ir_graph_new(&t->diag, "test.onnx");
    t->g->opset = opset;
    return t;
}

static inline void tg_free(tgraph *t)
{
    ir_graph_free(t->g);
    ir_diag_free(&t->diag);
    free(t);
}

/* Parses "2,sequence,?" into dims; returns the rank. */
static inline int parse_dims(const char *s, ir_dim *d)
{
    int r = 0;
    if (!s || !*s)
        return 0;
    static char syms[64][32];
    static int nsym;
    while (*s) {
        const char *e = strchr(s, ',');
        size_t len = e ? (size_t)(e - s) : strlen(s);
        if (len == 1 && s[0] == '?') {
            d[r] = (ir_dim){-1, NULL};
        } else if (s[0] >= '0' && s[0] <= '9') {
            d[r] = (ir_dim){strtoll(s, NULL, 10), NULL};
        } else {
            char *b = syms[nsym++ % 64];
            snprintf(b, 32, "%.*s", (int)len, s);
            d[r] = (ir_dim){-1, b};
        }
        r++;
        s += len;
        if (*s == ',')
            s++;
    }
    return r;
}

static inline ir_value *val(ir_graph *g, ir_value_kind k, const char *name, ir_dtype dt,
                            const char *dims)
{
    ir_dim d[IR_MAX_RANK];
    int r = parse_dims(dims, d);
    ir_value *v = ir_value_new(g, name, k, dt, r, d);
    if (k == IR_VAL_INPUT) {
        ir_value **ni = ir_arena_calloc(g->arena, (size_t)g->n_inputs + 1, sizeof *ni);
        for (int i = 0; i < g->n_inputs; i++)
            ni[i] = g->inputs[i];
        ni[g->n_inputs++] = v;
        g->inputs = ni;
    }
    if (k == IR_VAL_PARAM) {
        int64_t n = ir_value_numel(v);
        v->nbytes = (size_t)n * ir_dtype_size(dt);
        v->data = ir_arena_alloc(g->arena, v->nbytes);
    }
    return v;
}

static inline void add_output(ir_graph *g, ir_value *v)
{
    ir_value **no = ir_arena_calloc(g->arena, (size_t)g->n_outputs + 1, sizeof *no);
    for (int i = 0; i < g->n_outputs; i++)
        no[i] = g->outputs[i];
    no[g->n_outputs++] = v;
    g->outputs = no;
    v->is_output = true;
}

static inline ir_value *ci64(ir_graph *g, const char *name, int n, const int64_t *data)
{
    int64_t d[1] = {n};
    return ir_const_new(g, name, IR_DT_INT64, 1, d, data);
}

/* A scalar int64 constant. */
static inline ir_value *si64(ir_graph *g, const char *name, int64_t x)
{
    return ir_const_new(g, name, IR_DT_INT64, 0, NULL, &x);
}

static inline ir_value *sf32(ir_graph *g, const char *name, float x)
{
    return ir_const_new(g, name, IR_DT_FLOAT, 0, NULL, &x);
}

/* A node with fresh, untyped outputs named "<name>_out<i>"; no inference. */
static inline ir_node *mknode(ir_graph *g, ir_op op, const char *name, int n_in,
                              ir_value *const *in, int n_out)
{
    ir_value *outs[16];
    for (int i = 0; i < n_out; i++) {
        char vn[128];
        snprintf(vn, sizeof vn, "%s_out%d", name, i);
        outs[i] = ir_value_new(g, vn, IR_VAL_NODE, IR_DT_UNDEFINED, -1, NULL);
    }
    return ir_node_new_with_outputs(g, op, name, NULL, n_in, in, n_out, outs);
}

#define NODE(g, op, name, nout, ...)                                                               \
    mknode((g), (op), (name), (int)(sizeof((ir_value *[]){__VA_ARGS__}) / sizeof(ir_value *)),     \
           (ir_value *[]){__VA_ARGS__}, (nout))

/* There is no ir_attr_set_tensor: set an int, then turn it into a tensor attribute. */
static inline void set_tensor_attr(ir_graph *g, ir_node *n, const char *name, ir_value *t)
{
    ir_attr_set_int(g, n, name, 0);
    for (int i = 0; i < n->n_attr; i++)
        if (strcmp(n->attrs[i].name, name) == 0) {
            n->attrs[i].kind = IR_ATTR_TENSOR;
            n->attrs[i].t = t;
        }
}

static inline const char *tstr(const ir_value *v)
{
    static char buf[8][128];
    static int k;
    char *b = buf[k++ % 8];
    return ir_value_type_str(v, b, 128);
}

/* Whether some diagnostic contains every one of the (NULL-terminated) substrings, looking at
 * node name, op type and message. */
static inline bool diag_has(const ir_diag *d, ...)
{
    for (int i = 0; i < d->n; i++) {
        const ir_diag_entry *e = &d->entries[i];
        char all[1400];
        snprintf(all, sizeof all, "node '%s' (%s): %s", e->node ? e->node : "", e->op ? e->op : "",
                 e->msg ? e->msg : "");
        va_list ap;
        va_start(ap, d);
        bool ok = true;
        for (const char *s; (s = va_arg(ap, const char *));)
            if (!strstr(all, s))
                ok = false;
        va_end(ap);
        if (ok)
            return true;
    }
    return false;
}

static inline void diag_dump(const ir_diag *d) { ir_diag_print(d, stderr, "test"); }

#define assert_type(v, s) assert_string_equal(tstr(v), (s))

#endif
