/* ir.c — the IR's builder and graph utilities: op table, dtypes, values, nodes, attributes,
 * use lists, compaction and topological sort.
 *
 * The bottom of ir/: nothing here calls shape inference. ir_node_new, the builder that types
 * its fresh outputs by inferring them, is in shape.c, so the dependency runs one way (shape.c
 * uses this file's graph API; this file uses neither shape.c nor any other file above it).
 *
 * Names: every value has a unique name (ONNX's own where it has one); a name index (open
 * addressing over FNV-1a hashes) makes lookup by name O(1) for the importer and the passes.
 */
#include "ir.h"
#include "checked.h"

#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ op table */

const ir_op_info ir_op_table[IR_OP_COUNT] = {
#define OP(e, name, dom, mi, ma, mo, mao, inf) [IR_OP_##e] = {name, dom, mi, ma, mo, mao},
#include "ops.def"
#undef OP
};

ir_op ir_op_lookup(const char *domain, const char *op_type)
{
    if (!domain || strcmp(domain, "ai.onnx") == 0)
        domain = "";
    for (int i = 0; i < IR_OP_COUNT; i++) {
        /* Semantic ops are never read from a file: an "sbp" domain in a model is foreign. */
        if (ir_op_table[i].domain[0] == 's')
            continue;
        if (strcmp(ir_op_table[i].name, op_type) != 0)
            continue;
        if (strcmp(ir_op_table[i].domain, domain) == 0)
            return (ir_op)i;
        /* ORT's contrib normalisations are written in either domain by different exporters. */
        if (strcmp(domain, "com.microsoft") == 0 && i == IR_OP_SIMPLIFIED_LAYER_NORM)
            return (ir_op)i;
    }
    return IR_OP_COUNT;
}

/* ------------------------------------------------------------------ dtypes */

size_t ir_dtype_size(ir_dtype t)
{
    switch (t) {
    case IR_DT_FLOAT: case IR_DT_INT32: case IR_DT_UINT32: return 4;
    case IR_DT_DOUBLE: case IR_DT_INT64: case IR_DT_UINT64: return 8;
    case IR_DT_FLOAT16: case IR_DT_BFLOAT16: case IR_DT_INT16: case IR_DT_UINT16: return 2;
    case IR_DT_INT8: case IR_DT_UINT8: case IR_DT_BOOL: return 1;
    default: return 0;
    }
}

const char *ir_dtype_name(ir_dtype t)
{
    switch (t) {
    case IR_DT_FLOAT: return "f32";
    case IR_DT_DOUBLE: return "f64";
    case IR_DT_FLOAT16: return "f16";
    case IR_DT_BFLOAT16: return "bf16";
    case IR_DT_INT64: return "i64";
    case IR_DT_INT32: return "i32";
    case IR_DT_INT16: return "i16";
    case IR_DT_INT8: return "i8";
    case IR_DT_UINT64: return "u64";
    case IR_DT_UINT32: return "u32";
    case IR_DT_UINT16: return "u16";
    case IR_DT_UINT8: return "u8";
    case IR_DT_BOOL: return "bool";
    case IR_DT_STRING: return "string";
    default: return "?";
    }
}

bool ir_dtype_is_float(ir_dtype t)
{
    return t == IR_DT_FLOAT || t == IR_DT_DOUBLE || t == IR_DT_FLOAT16 || t == IR_DT_BFLOAT16;
}

bool ir_dtype_is_int(ir_dtype t)
{
    switch (t) {
    case IR_DT_INT64: case IR_DT_INT32: case IR_DT_INT16: case IR_DT_INT8:
    case IR_DT_UINT64: case IR_DT_UINT32: case IR_DT_UINT16: case IR_DT_UINT8: return true;
    default: return false;
    }
}

/* ------------------------------------------------------------------ name index */

typedef struct ir_name_index {
    ir_value **slots; /* [cap], NULL = empty */
    size_t cap, n;
} ir_name_index;

static uint64_t name_hash(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

static bool names_grow(ir_name_index *ix)
{
    size_t nc = ix->cap ? ix->cap * 2 : 256;
    ir_value **ns = calloc(nc, sizeof *ns);
    if (!ns)
        return false;
    for (size_t i = 0; i < ix->cap; i++) {
        ir_value *v = ix->slots[i];
        if (!v)
            continue;
        size_t j = name_hash(v->name) & (nc - 1);
        while (ns[j])
            j = (j + 1) & (nc - 1);
        ns[j] = v;
    }
    free(ix->slots);
    ix->slots = ns;
    ix->cap = nc;
    return true;
}

static bool names_insert(ir_name_index *ix, ir_value *v)
{
    if ((ix->n + 1) * 2 > ix->cap && !names_grow(ix))
        return false;
    size_t j = name_hash(v->name) & (ix->cap - 1);
    while (ix->slots[j])
        j = (j + 1) & (ix->cap - 1);
    ix->slots[j] = v;
    ix->n++;
    return true;
}

ir_value *ir_value_find(const ir_graph *g, const char *name)
{
    const ir_name_index *ix = g->names;
    if (!ix || !ix->cap || !name)
        return NULL;
    size_t j = name_hash(name) & (ix->cap - 1);
    while (ix->slots[j]) {
        if (strcmp(ix->slots[j]->name, name) == 0)
            return ix->slots[j];
        j = (j + 1) & (ix->cap - 1);
    }
    return NULL;
}

/* ------------------------------------------------------------------ graph */

void ir_signature_each(const char *sig,
                       void (*f)(const char *kind, const char *name, size_t name_len, void *ctx),
                       void *ctx)
{
    for (const char *p = sig ? strstr(sig, "target='") : NULL; p; p = strstr(p + 1, "target='")) {
        /* the kind is the word after the line's colon, before " target=" */
        const char *ls = p;
        while (ls > sig && ls[-1] != '\n')
            ls--;
        const char *colon = memchr(ls, ':', (size_t)(p - ls));
        const char *t = p + 8, *e = strchr(t, '\'');
        if (!colon || !e)
            continue;
        const char *k = colon + 1;
        while (*k == ' ')
            k++;
        f(k, t, (size_t)(e - t), ctx);
    }
}

ir_graph *ir_graph_new(ir_diag *diag, const char *path)
{
    ir_arena *a = ir_arena_new();
    if (!a)
        return NULL;
    ir_graph *g = ir_arena_alloc(a, sizeof *g);
    ir_name_index *ix = calloc(1, sizeof *ix);
    if (!g || !ix) {
        free(ix);
        ir_arena_free(a);
        return NULL;
    }
    g->arena = a;
    g->diag = diag;
    g->path = ir_arena_strdup(a, path ? path : "<memory>");
    g->name = "graph";
    g->names = ix;
    return g;
}

void ir_graph_free(ir_graph *g)
{
    if (!g)
        return;
    free(g->values);
    free(g->nodes);
    if (g->names) {
        free(g->names->slots);
        free(g->names);
    }
    ir_arena_free(g->arena);
}

int ir_graph_refuse(ir_graph *g, const ir_refusal *r)
{
    ir_refusal *c = ir_arena_alloc(g->arena, sizeof *c);
    if (!c || !r->msg)
        return ir_diag_error(g->diag, "out of memory");
    *c = *r;
    c->next = g->refusals;
    g->refusals = c;
    return ir_diag_add(g->diag, IR_SEV_WARNING, r->at ? r->at->name : NULL,
                       r->at ? r->at->op_type : NULL, "%s", r->msg);
}

static bool grow_ptrs(void ***arr, int *cap, int need)
{
    if (need <= *cap)
        return true;
    int nc = *cap ? *cap * 2 : 64;
    while (nc < need)
        nc *= 2;
    void **na = realloc(*arr, (size_t)nc * sizeof(void *));
    if (!na)
        return false;
    *arr = na;
    *cap = nc;
    return true;
}

/* ------------------------------------------------------------------ values */

ir_value *ir_value_new(ir_graph *g, const char *name, ir_value_kind kind, ir_dtype dt, int rank,
                       const ir_dim *dims)
{
    if (rank > IR_MAX_RANK) {
        ir_diag_error(g->diag, "value '%s' has rank %d; at most %d is supported",
                      name ? name : "?", rank, IR_MAX_RANK);
        return NULL;
    }
    if (!grow_ptrs((void ***)&g->values, &g->cap_values, g->n_values + 1))
        return NULL;
    ir_value *v = ir_arena_alloc(g->arena, sizeof *v);
    if (!v)
        return NULL;
    const char *base = (name && name[0]) ? name : "v";
    const char *nm = base;
    if (!name || !name[0] || ir_value_find(g, nm)) {
        do
            nm = ir_arena_printf(g->arena, "%s.%d", base, g->next_id++);
        while (nm && ir_value_find(g, nm));
    } else {
        nm = ir_arena_strdup(g->arena, nm);
    }
    if (!nm)
        return NULL;
    v->name = nm;
    v->id = g->n_values;
    v->kind = kind;
    v->dtype = dt;
    v->rank = rank;
    if (rank > 0) {
        v->dims = ir_arena_calloc(g->arena, (size_t)rank, sizeof(ir_dim));
        if (!v->dims)
            return NULL;
        for (int i = 0; i < rank; i++) {
            v->dims[i].value = dims ? dims[i].value : -1;
            v->dims[i].sym = dims && dims[i].sym ? ir_arena_strdup(g->arena, dims[i].sym) : NULL;
        }
    }
    if (!names_insert(g->names, v))
        return NULL;
    g->values[g->n_values++] = v;
    return v;
}

ir_value *ir_const_new(ir_graph *g, const char *name, ir_dtype dt, int rank, const int64_t *dims,
                       const void *data)
{
    ir_dim d[IR_MAX_RANK];
    if (rank < 0 || rank > IR_MAX_RANK)
        return NULL;
    for (int i = 0; i < rank; i++)
        d[i] = (ir_dim){dims[i], NULL};
    ir_value *v = ir_value_new(g, name, IR_VAL_CONST, dt, rank, d);
    if (!v)
        return NULL;
    int64_t n = ir_value_numel(v);
    size_t es = ir_dtype_size(dt);
    if (n < 0 || es == 0 || (uint64_t)n > SIZE_MAX / es)
        return NULL;
    v->nbytes = (size_t)n * es;
    v->data = ir_arena_alloc(g->arena, v->nbytes);
    if (!v->data)
        return NULL;
    if (data)
        memcpy(v->data, data, v->nbytes);
    return v;
}

int64_t ir_value_numel(const ir_value *v)
{
    if (v->rank < 0)
        return -1;
    int64_t n = 1;
    for (int i = 0; i < v->rank; i++) {
        int64_t d = v->dims[i].value;
        if (d < 0)
            return -1;
        if (d && n > INT64_MAX / d)
            return -1;
        n *= d;
    }
    return n;
}

int ir_check_shape_size(ir_graph *g, const ir_node *n, const char *what, const ir_value *v)
{
    if (!v || v->rank <= 0)
        return IR_OK;
    /* the product of the known dims, zeros read as 1, then times the element size: both must
     * fit, so that numel * dtype_size never wraps either */
    int64_t q = (int64_t)(ir_dtype_size(v->dtype) ? ir_dtype_size(v->dtype) : 1);
    bool wraps = false;
    for (int i = 0; i < v->rank && !wraps; i++)
        if (v->dims[i].value > 0)
            wraps = !ck_mul_i64(q, v->dims[i].value, &q);
    if (!wraps)
        return IR_OK;
    char ty[256];
    ir_value_type_str(v, ty, sizeof ty);
    return ir_diag_add(g->diag, IR_SEV_ERROR, n ? n->name : NULL, n ? n->op_type : NULL,
                       "%s ('%s') %s: its size overflows 64 bits (the product of its dims, "
                       "times %zu bytes an element, does not fit in int64)",
                       what, v->name, ty, ir_dtype_size(v->dtype));
}

bool ir_value_shape_known(const ir_value *v)
{
    if (v->rank < 0)
        return false;
    for (int i = 0; i < v->rank; i++)
        if (v->dims[i].value < 0)
            return false;
    return true;
}

char *ir_value_type_str(const ir_value *v, char *buf, size_t n)
{
    size_t k = (size_t)snprintf(buf, n, "%s", ir_dtype_name(v->dtype));
    if (v->rank < 0) {
        if (k < n)
            snprintf(buf + k, n - k, "[?]");
        return buf;
    }
    if (k < n)
        k += (size_t)snprintf(buf + k, n - k, "[");
    for (int i = 0; i < v->rank && k < n; i++) {
        const ir_dim *d = &v->dims[i];
        if (d->value >= 0)
            k += (size_t)snprintf(buf + k, n - k, "%s%lld", i ? "," : "", (long long)d->value);
        else
            k += (size_t)snprintf(buf + k, n - k, "%s%s", i ? "," : "", d->sym ? d->sym : "?");
    }
    if (k < n)
        snprintf(buf + k, n - k, "]");
    return buf;
}

bool ir_value_is_const(const ir_value *v) { return v && v->kind == IR_VAL_CONST && v->data; }

int64_t ir_f64_to_i64(double x)
{
    if (x != x)
        return 0;
    if (x >= 9223372036854775807.0)
        return INT64_MAX;
    if (x <= -9223372036854775808.0)
        return INT64_MIN;
    return (int64_t)x;
}

/* (ir.h) A BOOL byte other than 0 and 1 (raw_data is copied as written) is true: ONNX and
 * every runtime treat it so, and a reader that returned the byte would make, say, a mask
 * element 2 a different value from 1. */
int64_t ir_data_i64(ir_dtype dt, const void *p, int64_t i)
{
    switch (dt) {
    case IR_DT_INT64: return ((const int64_t *)p)[i];
    case IR_DT_INT32: return ((const int32_t *)p)[i];
    case IR_DT_INT16: return ((const int16_t *)p)[i];
    case IR_DT_INT8: return ((const int8_t *)p)[i];
    case IR_DT_UINT64: return (int64_t)((const uint64_t *)p)[i];
    case IR_DT_UINT32: return ((const uint32_t *)p)[i];
    case IR_DT_UINT16: return ((const uint16_t *)p)[i];
    case IR_DT_UINT8: return ((const uint8_t *)p)[i];
    case IR_DT_BOOL: return ((const uint8_t *)p)[i] != 0;
    case IR_DT_FLOAT: return ir_f64_to_i64(((const float *)p)[i]); /* a NaN condition, axis */
    case IR_DT_DOUBLE: return ir_f64_to_i64(((const double *)p)[i]);
    default: return 0;
    }
}

double ir_data_f64(ir_dtype dt, const void *p, int64_t i)
{
    switch (dt) {
    case IR_DT_FLOAT: return ((const float *)p)[i];
    case IR_DT_DOUBLE: return ((const double *)p)[i];
    case IR_DT_UINT64: return (double)((const uint64_t *)p)[i]; /* not through int64 */
    default: return (double)ir_data_i64(dt, p, i);
    }
}

int64_t ir_const_i64(const ir_value *v, int64_t i) { return ir_data_i64(v->dtype, v->data, i); }

double ir_const_f64(const ir_value *v, int64_t i) { return ir_data_f64(v->dtype, v->data, i); }

/* ------------------------------------------------------------------ nodes */

ir_node *ir_node_new_with_outputs(ir_graph *g, ir_op op, const char *name, const char *op_type,
                                  int n_in, ir_value *const *in, int n_out, ir_value *const *out)
{
    if (!grow_ptrs((void ***)&g->nodes, &g->cap_nodes, g->n_nodes + 1))
        return NULL;
    ir_node *n = ir_arena_alloc(g->arena, sizeof *n);
    if (!n)
        return NULL;
    n->id = g->next_id++;
    n->op = op;
    n->op_type = op_type ? ir_arena_strdup(g->arena, op_type) : ir_op_name(op);
    n->name = (name && name[0]) ? ir_arena_strdup(g->arena, name)
                                : ir_arena_printf(g->arena, "%s_%d", ir_op_name(op), n->id);
    n->n_in = n_in;
    n->in = ir_arena_calloc(g->arena, (size_t)(n_in ? n_in : 1), sizeof(ir_value *));
    n->n_out = n_out;
    n->out = ir_arena_calloc(g->arena, (size_t)(n_out ? n_out : 1), sizeof(ir_value *));
    if (!n->in || !n->out || !n->name)
        return NULL;
    for (int i = 0; i < n_in; i++)
        n->in[i] = in ? in[i] : NULL;
    for (int i = 0; i < n_out; i++) {
        n->out[i] = out ? out[i] : NULL;
        if (n->out[i]) {
            n->out[i]->kind = IR_VAL_NODE;
            n->out[i]->producer = n;
            n->out[i]->producer_slot = i;
        }
    }
    g->nodes[g->n_nodes++] = n;
    return n;
}

void ir_node_move_after(ir_graph *g, ir_node *n, ir_node *after)
{
    int from = -1, to = -1;
    for (int i = 0; i < g->n_nodes; i++) {
        if (g->nodes[i] == n)
            from = i;
        if (g->nodes[i] == after)
            to = i;
    }
    if (from < 0)
        return;
    memmove(&g->nodes[from], &g->nodes[from + 1], (size_t)(g->n_nodes - from - 1) * sizeof(ir_node *));
    g->n_nodes--;
    if (after && to > from)
        to--;
    int pos = after ? to + 1 : 0;
    memmove(&g->nodes[pos + 1], &g->nodes[pos], (size_t)(g->n_nodes - pos) * sizeof(ir_node *));
    g->nodes[pos] = n;
    g->n_nodes++;
}

void ir_node_add_origin(ir_graph *g, ir_node *n, const ir_node *from)
{
    int add = from->n_origin ? from->n_origin : 1;
    const char **no = ir_arena_calloc(g->arena, (size_t)(n->n_origin + add), sizeof(char *));
    if (!no)
        return;
    for (int i = 0; i < n->n_origin; i++)
        no[i] = n->origin[i];
    if (from->n_origin)
        for (int i = 0; i < from->n_origin; i++)
            no[n->n_origin + i] = from->origin[i];
    else
        no[n->n_origin] = from->name;
    n->origin = no;
    n->n_origin += add;
}

/* ------------------------------------------------------------------ attributes */

static ir_attr *attr_slot(ir_graph *g, ir_node *n, const char *name)
{
    for (int i = 0; i < n->n_attr; i++)
        if (strcmp(n->attrs[i].name, name) == 0) {
            memset(&n->attrs[i], 0, sizeof n->attrs[i]);
            n->attrs[i].name = ir_arena_strdup(g->arena, name);
            return &n->attrs[i];
        }
    ir_attr *na = ir_arena_calloc(g->arena, (size_t)n->n_attr + 1, sizeof *na);
    if (!na)
        return NULL;
    if (n->n_attr)
        memcpy(na, n->attrs, (size_t)n->n_attr * sizeof *na);
    n->attrs = na;
    ir_attr *a = &na[n->n_attr++];
    a->name = ir_arena_strdup(g->arena, name);
    return a;
}

void ir_attr_set_int(ir_graph *g, ir_node *n, const char *name, int64_t v)
{
    ir_attr *a = attr_slot(g, n, name);
    if (a) {
        a->kind = IR_ATTR_INT;
        a->i = v;
    }
}

void ir_attr_set_float(ir_graph *g, ir_node *n, const char *name, double v)
{
    ir_attr *a = attr_slot(g, n, name);
    if (a) {
        a->kind = IR_ATTR_FLOAT;
        a->f = v;
    }
}

void ir_attr_set_string(ir_graph *g, ir_node *n, const char *name, const char *v)
{
    ir_attr *a = attr_slot(g, n, name);
    if (a) {
        a->kind = IR_ATTR_STRING;
        a->s = ir_arena_strdup(g->arena, v);
    }
}

void ir_attr_set_ints(ir_graph *g, ir_node *n, const char *name, const int64_t *v, int count)
{
    ir_attr *a = attr_slot(g, n, name);
    if (!a)
        return;
    a->kind = IR_ATTR_INTS;
    a->n = count;
    a->ints = ir_arena_calloc(g->arena, (size_t)(count ? count : 1), sizeof(int64_t));
    if (a->ints && count)
        memcpy(a->ints, v, (size_t)count * sizeof(int64_t));
}

const ir_attr *ir_attr_get(const ir_node *n, const char *name)
{
    for (int i = 0; i < n->n_attr; i++)
        if (strcmp(n->attrs[i].name, name) == 0)
            return &n->attrs[i];
    return NULL;
}

int64_t ir_attr_int(const ir_node *n, const char *name, int64_t dflt)
{
    const ir_attr *a = ir_attr_get(n, name);
    return a && a->kind == IR_ATTR_INT ? a->i : dflt;
}

double ir_attr_float(const ir_node *n, const char *name, double dflt)
{
    const ir_attr *a = ir_attr_get(n, name);
    return a && a->kind == IR_ATTR_FLOAT ? a->f : dflt;
}

const char *ir_attr_string(const ir_node *n, const char *name, const char *dflt)
{
    const ir_attr *a = ir_attr_get(n, name);
    return a && a->kind == IR_ATTR_STRING ? a->s : dflt;
}

/* ------------------------------------------------------------------ uses and rewiring */

void ir_replace_uses(ir_graph *g, ir_value *old, ir_value *repl)
{
    for (int i = 0; i < g->n_nodes; i++) {
        ir_node *n = g->nodes[i];
        if (n->dead)
            continue;
        for (int j = 0; j < n->n_in; j++)
            if (n->in[j] == old)
                n->in[j] = repl;
    }
    for (int i = 0; i < g->n_outputs; i++)
        if (g->outputs[i] == old) {
            g->outputs[i] = repl;
            old->is_output = false;
            repl->is_output = true;
        }
}

int ir_value_use_count(const ir_graph *g, const ir_value *v)
{
    int c = v->is_output ? 1 : 0;
    for (int i = 0; i < g->n_nodes; i++) {
        const ir_node *n = g->nodes[i];
        if (n->dead)
            continue;
        for (int j = 0; j < n->n_in; j++)
            if (n->in[j] == v)
                c++;
    }
    return c;
}

ir_uses ir_uses_build(const ir_graph *g)
{
    ir_uses u = {0};
    int nv = g->n_values;
    u.n_uses = ir_arena_calloc(g->arena, (size_t)nv + 1, sizeof(int));
    u.uses = ir_arena_calloc(g->arena, (size_t)nv + 1, sizeof(ir_use *));
    int *fill = calloc((size_t)nv + 1, sizeof(int));
    if (!u.n_uses || !u.uses || !fill) {
        free(fill);
        return (ir_uses){0};
    }
    for (int i = 0; i < g->n_nodes; i++) {
        const ir_node *n = g->nodes[i];
        if (n->dead)
            continue;
        for (int j = 0; j < n->n_in; j++)
            if (n->in[j])
                u.n_uses[n->in[j]->id]++;
    }
    for (int v = 0; v < nv; v++)
        u.uses[v] = ir_arena_calloc(g->arena, (size_t)u.n_uses[v] + 1, sizeof(ir_use));
    for (int i = 0; i < g->n_nodes; i++) {
        ir_node *n = g->nodes[i];
        if (n->dead)
            continue;
        for (int j = 0; j < n->n_in; j++)
            if (n->in[j]) {
                int id = n->in[j]->id;
                u.uses[id][fill[id]++] = (ir_use){n, j};
            }
    }
    free(fill);
    return u;
}

void ir_graph_compact(ir_graph *g)
{
    int k = 0;
    for (int i = 0; i < g->n_nodes; i++)
        if (!g->nodes[i]->dead)
            g->nodes[k++] = g->nodes[i];
    g->n_nodes = k;
}

int ir_graph_count_op(const ir_graph *g, ir_op op)
{
    int c = 0;
    for (int i = 0; i < g->n_nodes; i++)
        if (!g->nodes[i]->dead && g->nodes[i]->op == op)
            c++;
    return c;
}

/* Kahn's algorithm, taking ready nodes in their current order so an ordered graph is unchanged
 * and a pass that appended replacements gets them placed right where their inputs allow. */
int ir_graph_toposort(ir_graph *g)
{
    ir_graph_compact(g);
    int nn = g->n_nodes, nv = g->n_values;
    int *pending = calloc((size_t)nn + 1, sizeof(int));   /* unresolved inputs per node */
    int *pos = malloc(((size_t)nv + 1) * sizeof(int));    /* producer node index per value */
    ir_node **order = malloc(((size_t)nn + 1) * sizeof(ir_node *));
    int *ready = malloc(((size_t)nn + 1) * sizeof(int));
    /* consumers in CSR form */
    int *cstart = calloc((size_t)nv + 2, sizeof(int));
    int rc = IR_OK;
    if (!pending || !pos || !order || !ready || !cstart) {
        rc = ir_diag_error(g->diag, "out of memory sorting the graph");
        goto out;
    }
    for (int v = 0; v < nv; v++)
        pos[v] = -1;
    for (int i = 0; i < nn; i++)
        for (int j = 0; j < g->nodes[i]->n_out; j++)
            if (g->nodes[i]->out[j])
                pos[g->nodes[i]->out[j]->id] = i;
    for (int i = 0; i < nn; i++)
        for (int j = 0; j < g->nodes[i]->n_in; j++) {
            ir_value *v = g->nodes[i]->in[j];
            if (v && pos[v->id] >= 0) {
                pending[i]++;
                cstart[v->id + 1]++;
            }
        }
    for (int v = 0; v < nv; v++)
        cstart[v + 1] += cstart[v];
    int *cons = malloc(((size_t)cstart[nv] + 1) * sizeof(int));
    int *cfill = calloc((size_t)nv + 1, sizeof(int));
    if (!cons || !cfill) {
        free(cons);
        free(cfill);
        rc = ir_diag_error(g->diag, "out of memory sorting the graph");
        goto out;
    }
    for (int i = 0; i < nn; i++)
        for (int j = 0; j < g->nodes[i]->n_in; j++) {
            ir_value *v = g->nodes[i]->in[j];
            if (v && pos[v->id] >= 0)
                cons[cstart[v->id] + cfill[v->id]++] = i;
        }
    /* A min-heap on original index keeps the order stable. */
    int nready = 0, nord = 0;
    for (int i = 0; i < nn; i++)
        if (!pending[i])
            ready[nready++] = i; /* already sorted ascending: a valid heap */
    while (nready) {
        int i = ready[0];
        ready[0] = ready[--nready];
        for (int k = 0;;) { /* sift down */
            int l = 2 * k + 1, r = l + 1, m = k;
            if (l < nready && ready[l] < ready[m]) m = l;
            if (r < nready && ready[r] < ready[m]) m = r;
            if (m == k) break;
            int t = ready[k]; ready[k] = ready[m]; ready[m] = t; k = m;
        }
        order[nord++] = g->nodes[i];
        for (int j = 0; j < g->nodes[i]->n_out; j++) {
            ir_value *v = g->nodes[i]->out[j];
            if (!v)
                continue;
            for (int c = cstart[v->id]; c < cstart[v->id + 1]; c++)
                if (--pending[cons[c]] == 0) {
                    int k = nready++;
                    ready[k] = cons[c];
                    while (k && ready[(k - 1) / 2] > ready[k]) { /* sift up */
                        int p = (k - 1) / 2, t = ready[p];
                        ready[p] = ready[k]; ready[k] = t; k = p;
                    }
                }
        }
    }
    if (nord != nn) {
        for (int i = 0; i < nn; i++)
            if (pending[i]) {
                ir_diag_add(g->diag, IR_SEV_ERROR, g->nodes[i]->name, g->nodes[i]->op_type,
                            "the graph has a cycle through this node");
                break;
            }
        rc = IR_ERR;
    } else {
        memcpy(g->nodes, order, (size_t)nn * sizeof(ir_node *));
    }
    free(cons);
    free(cfill);
out:
    free(pending);
    free(pos);
    free(order);
    free(ready);
    free(cstart);
    return rc;
}
