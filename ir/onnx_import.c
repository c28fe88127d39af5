/* onnx_import.c — reads an ONNX ModelProto into an ir_graph.
 *
 * Approach: the bytes are decoded by protobuf-c (bindings generated at build time from Debian's
 * onnx.proto), then the importer walks the decoded model once, building the graph in four steps:
 *   1. opset imports, initializers (PARAM for float dtypes, CONST otherwise; data from raw_data,
 *      the typed fields, or an external file confined to the model's directory) and graph inputs;
 *   2. every node's outputs become values (Constant nodes become CONST values right away, so later
 *      passes never see Constant nodes); duplicate producers are caught here;
 *   3. every node's inputs are resolved by name (so the file's node order does not matter) and
 *      the node is built with its attributes; unsupported ops are collected and each distinct one
 *      is reported once, with the first node that uses it;
 *   4. graph outputs and value_info types, then ir_graph_toposort (cycles) and inference
 *      (ir_infer_node in order), which also lowers CastLike(x, like) to Cast(x, to = like's
 *      element type): the dynamo exporter writes CastLike when it is not optimising, and like's
 *      type is known once the nodes before it are inferred, so the IR never holds a CastLike.
 *
 * Requires: nothing. Produces: a graph satisfying ir_verify's invariants, or NULL with every
 * problem found recorded in the ir_diag (what and where: node name + op_type, which input or
 * initializer). Nothing in here exits or trusts a size read from the file: every count is checked
 * against what the file actually holds before anything is allocated for it, and the protobuf
 * nesting depth is bounded before protobuf-c (which recurses without a limit) sees the bytes.
 */
#include "ir.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "files.h"
#include "onnx.pb-c.h"

/* Largest extent of one dimension, and largest tensor, the importer believes. Real LMs are far
 * below both (a 150k x 8k embedding is 2^32.2 bytes); anything larger is a corrupt header. */
#define IMPORT_MAX_DIM ((int64_t)1 << 40)
#define IMPORT_MAX_BYTES ((uint64_t)1 << 40)
/* Protobuf nesting accepted before decoding. A model nests ~8 deep (model, graph, node, attribute,
 * tensor / value_info, type, shape, dim); subgraphs and nested sequence types add a few. */
#define IMPORT_MAX_PB_DEPTH 64

typedef struct unsupported_op {
    const char *domain, *op_type; /* as written in the model */
    const char *first_node;       /* label of the first node using it */
    int count;
    bool subgraph;                /* that node has a subgraph attribute (If, Loop, Scan) */
} unsupported_op;

typedef struct importer {
    ir_graph *g;
    ir_diag *d;
    const Onnx__ModelProto *model;
    const char *base_dir;   /* directory for external data; NULL: external data refused */
    char *base_real;        /* realpath(base_dir), computed on first use (malloc'd) */
    bool base_failed;       /* realpath(base_dir) failed; reported once */
    char *ext_bad;          /* realpath of an external data file that could not be opened
                             * (malloc'd): reported once, not once per initializer */
    /* one-entry cache of the external data file last opened */
    char *ext_path;         /* realpath of the open file (malloc'd) */
    int ext_fd;
    uint64_t ext_size;
    /* per ONNX node: label for messages (name, or "<op_type>_<index>") */
    const char **node_label; /* [graph->n_node] */
    /* value id -> index of the ONNX node producing it, -1 otherwise; [cap_val_node] */
    int *val_node;
    int cap_val_node;
    unsupported_op *unsup;  /* [n_unsup] distinct unsupported (domain, op_type) */
    int n_unsup, cap_unsup;
    int n_cast_like;        /* CastLike nodes built as two-input Casts, lowered in infer_all */
    struct sbp_file_set *files; /* every file read is added here (ir_import_options), or NULL */
} importer;

/* ------------------------------------------------------------------ small helpers */

static const char *str_or_empty(const char *s) { return s ? s : ""; }

/* Records an error about node/op (both may be NULL) and returns IR_ERR. */
static int err(importer *I, const char *node, const char *op, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int err(importer *I, const char *node, const char *op, const char *fmt, ...)
{
    char buf[900];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    return ir_diag_add(I->d, IR_SEV_ERROR, node, op, "%s", buf);
}

/* Checked a * b for non-negative int64s; false on overflow. */
static bool mul_i64(int64_t a, int64_t b, int64_t *out)
{
    if (a < 0 || b < 0)
        return false;
    if (a && b > INT64_MAX / a)
        return false;
    *out = a * b;
    return true;
}

static bool dtype_supported(int32_t dt)
{
    return dt != IR_DT_STRING && ir_dtype_size((ir_dtype)dt) != 0;
}

/* The dtype's name for messages: "f32", "COMPLEX64", or "#99" for codes ONNX does not define. */
static const char *onnx_dtype_name(int32_t dt)
{
    static _Thread_local char buf[24];
    switch (dt) {
    case 0: return "UNDEFINED";
    case 8: return "STRING";
    case 14: return "COMPLEX64";
    case 15: return "COMPLEX128";
    default:
        if (ir_dtype_size((ir_dtype)dt))
            return ir_dtype_name((ir_dtype)dt);
        snprintf(buf, sizeof buf, "#%d", (int)dt);
        return buf;
    }
}

/* "f32[2,3]" for messages; dims known. */
static void fmt_tensor_type(char *buf, size_t n, int32_t dt, int rank, const int64_t *dims)
{
    size_t k = (size_t)snprintf(buf, n, "%s[", onnx_dtype_name(dt));
    for (int i = 0; i < rank && k < n; i++)
        k += (size_t)snprintf(buf + k, n - k, "%s%lld", i ? "," : "", (long long)dims[i]);
    if (k < n)
        snprintf(buf + k, n - k, "]");
}

/* value id -> ONNX node index bookkeeping */
static bool set_val_node(importer *I, int id, int node)
{
    if (id >= I->cap_val_node) {
        int nc = I->cap_val_node ? I->cap_val_node : 256;
        while (nc <= id)
            nc *= 2;
        int *na = realloc(I->val_node, (size_t)nc * sizeof(int));
        if (!na)
            return false;
        for (int i = I->cap_val_node; i < nc; i++)
            na[i] = -1;
        I->val_node = na;
        I->cap_val_node = nc;
    }
    I->val_node[id] = node;
    return true;
}

static int get_val_node(const importer *I, int id)
{
    return id < I->cap_val_node ? I->val_node[id] : -1;
}

/* What already defines value v, for duplicate-definition messages. */
static const char *describe_definer(importer *I, const ir_value *v)
{
    int ni = get_val_node(I, v->id);
    if (ni >= 0)
        return ir_arena_printf(I->g->arena, "node '%s'", I->node_label[ni]);
    switch (v->kind) {
    case IR_VAL_INPUT: return "a graph input";
    case IR_VAL_PARAM: case IR_VAL_CONST: return "an initializer";
    default: return "another node";
    }
}

/* ------------------------------------------------------------------ protobuf depth guard */

static bool pb_varint(const uint8_t **p, const uint8_t *end, uint64_t *v)
{
    uint64_t r = 0;
    for (int shift = 0; shift < 70 && *p < end; shift += 7) {
        uint8_t b = *(*p)++;
        if (shift < 64)
            r |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *v = r;
            return true;
        }
    }
    return false;
}

/* Walks the wire format with the message descriptors and returns false when submessages nest
 * deeper than IMPORT_MAX_PB_DEPTH. Malformed bytes end the walk with true: protobuf-c rejects
 * them itself. Linear in the input size (each byte is scanned at one level only). */
static bool pb_depth_ok(const ProtobufCMessageDescriptor *desc, const uint8_t *p, size_t n,
                        int depth)
{
    if (depth > IMPORT_MAX_PB_DEPTH)
        return false;
    const uint8_t *end = p + n;
    while (p < end) {
        uint64_t key, len;
        if (!pb_varint(&p, end, &key))
            return true;
        switch (key & 7) {
        case 0:
            if (!pb_varint(&p, end, &len))
                return true;
            break;
        case 1:
            if (end - p < 8)
                return true;
            p += 8;
            break;
        case 5:
            if (end - p < 4)
                return true;
            p += 4;
            break;
        case 2: {
            if (!pb_varint(&p, end, &len) || len > (uint64_t)(end - p))
                return true;
            uint64_t fn = key >> 3;
            const ProtobufCFieldDescriptor *f =
                fn <= UINT32_MAX ? protobuf_c_message_descriptor_get_field(desc, (unsigned)fn) : NULL;
            if (f && f->type == PROTOBUF_C_TYPE_MESSAGE && f->descriptor &&
                !pb_depth_ok(f->descriptor, p, (size_t)len, depth + 1))
                return false;
            p += len;
            break;
        }
        default:
            return true;
        }
    }
    return true;
}

/* ------------------------------------------------------------------ types and shapes */

/* Reads a TypeProto into dtype / rank / dims. A missing type gives UNDEFINED and rank -1;
 * a missing shape gives rank -1. `what` names the value for messages ("graph input 'ids'"). */
static int read_type(importer *I, const Onnx__TypeProto *tp, const char *what, ir_dtype *dt,
                     int *rank, ir_dim *dims)
{
    *dt = IR_DT_UNDEFINED;
    *rank = -1;
    if (!tp)
        return IR_OK;
    if (tp->value_case != ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE || !tp->tensor_type) {
        if (tp->value_case == ONNX__TYPE_PROTO__VALUE__NOT_SET)
            return IR_OK;
        return err(I, NULL, NULL, "%s: only tensor types are supported (sequence, map, optional "
                   "and sparse types are not)", what);
    }
    const Onnx__TypeProto__Tensor *tt = tp->tensor_type;
    if (tt->has_elem_type && tt->elem_type != 0) {
        if (!dtype_supported(tt->elem_type))
            return err(I, NULL, NULL, "%s: element type %s is not supported", what,
                       onnx_dtype_name(tt->elem_type));
        *dt = (ir_dtype)tt->elem_type;
    }
    if (!tt->shape)
        return IR_OK;
    if (tt->shape->n_dim > IR_MAX_RANK)
        return err(I, NULL, NULL, "%s: rank %zu exceeds the supported maximum of %d", what,
                   tt->shape->n_dim, IR_MAX_RANK);
    int64_t known = 1; /* product of the known dims, to refuse absurd shapes early */
    for (size_t i = 0; i < tt->shape->n_dim; i++) {
        const Onnx__TensorShapeProto__Dimension *dm = tt->shape->dim[i];
        dims[i] = (ir_dim){-1, NULL};
        if (!dm)
            continue;
        if (dm->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE) {
            int64_t v = dm->dim_value;
            if (v < 0)
                return err(I, NULL, NULL, "%s: dimension %zu is negative (%lld)", what, i,
                           (long long)v);
            if (v > IMPORT_MAX_DIM)
                return err(I, NULL, NULL, "%s: dimension %zu is %lld, larger than the supported "
                           "maximum 2^40", what, i, (long long)v);
            if (!mul_i64(known, v, &known) || (uint64_t)known > IMPORT_MAX_BYTES)
                return err(I, NULL, NULL, "%s: the shape's known dimensions multiply to more "
                           "than 2^40 elements", what);
            dims[i].value = v;
        } else if (dm->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_PARAM &&
                   dm->dim_param && dm->dim_param[0]) {
            dims[i].sym = dm->dim_param; /* ir_value_new copies it into the arena */
        }
    }
    *rank = (int)tt->shape->n_dim;
    return IR_OK;
}

/* ------------------------------------------------------------------ tensor data */

typedef struct tensor_data {
    ir_dtype dt;
    int rank;
    int64_t dims[IR_MAX_RANK];
    void *data;     /* arena; [nbytes] */
    size_t nbytes;
} tensor_data;

/* Parses a decimal string entry of external_data ("offset", "length"). */
static bool parse_u64(const char *s, uint64_t *out)
{
    if (!s || !*s)
        return false;
    uint64_t v = 0;
    for (; *s; s++) {
        if (*s < '0' || *s > '9')
            return false;
        unsigned dgt = (unsigned)(*s - '0');
        if (v > (UINT64_MAX - dgt) / 10)
            return false;
        v = v * 10 + dgt;
    }
    *out = v;
    return true;
}

/* True when location has an absolute form or a ".." component (either separator). */
static bool location_escapes(const char *loc, const char **why)
{
    if (loc[0] == '/' || loc[0] == '\\') {
        *why = "is an absolute path";
        return true;
    }
    if (((loc[0] >= 'A' && loc[0] <= 'Z') || (loc[0] >= 'a' && loc[0] <= 'z')) && loc[1] == ':') {
        *why = "is an absolute (drive-letter) path";
        return true;
    }
    for (const char *p = loc; *p;) {
        const char *q = p;
        while (*q && *q != '/' && *q != '\\')
            q++;
        if (q - p == 2 && p[0] == '.' && p[1] == '.') {
            *why = "has a '..' component";
            return true;
        }
        p = *q ? q + 1 : q;
    }
    return false;
}

static void ext_close(importer *I)
{
    if (I->ext_path) {
        close(I->ext_fd);
        free(I->ext_path);
        I->ext_path = NULL;
    }
}

/* Opens (or reuses) the external data file `loc` after confining it to the model directory. */
static int ext_open(importer *I, const char *loc, const char *what)
{
    const char *why;
    if (!I->base_dir)
        return err(I, NULL, NULL, "%s: external data ('%s') cannot be read when the model is "
                   "imported from memory without a model directory", what, loc);
    if (!loc[0])
        return err(I, NULL, NULL, "%s: external data has an empty 'location'", what);
    if (location_escapes(loc, &why))
        return err(I, NULL, NULL, "%s: external data location '%s' %s; it must be a relative "
                   "path inside the model's directory", what, loc, why);
    if (!I->base_real) {
        if (I->base_failed)
            return IR_ERR;
        I->base_real = realpath(I->base_dir, NULL);
        if (!I->base_real) {
            I->base_failed = true;
            return err(I, NULL, NULL, "%s: cannot resolve the model directory '%s': %s", what,
                       I->base_dir, strerror(errno));
        }
    }
    size_t bl = strlen(I->base_dir), ll = strlen(loc);
    char *joined = malloc(bl + ll + 2);
    if (!joined)
        return err(I, NULL, NULL, "%s: out of memory", what);
    memcpy(joined, I->base_dir, bl);
    joined[bl] = '/';
    memcpy(joined + bl + 1, loc, ll + 1);
    char *real = realpath(joined, NULL);
    int e = errno;
    free(joined);
    if (!real) {
        if (e == ENOENT || e == ENOTDIR)
            return err(I, NULL, NULL, "%s: external data file '%s' not found in the model "
                       "directory '%s'", what, loc, I->base_dir);
        return err(I, NULL, NULL, "%s: cannot resolve external data file '%s': %s", what, loc,
                   strerror(e));
    }
    /* Inside means below base_real; base_real itself is let through to the regular-file check. */
    size_t rl = strlen(I->base_real);
    bool inside = strcmp(I->base_real, "/") == 0 ||
                  (strncmp(real, I->base_real, rl) == 0 && (real[rl] == '/' || real[rl] == 0));
    if (!inside) {
        err(I, NULL, NULL, "%s: external data location '%s' resolves to '%s', which escapes the "
            "model directory '%s'", what, loc, real, I->base_real);
        free(real);
        return IR_ERR;
    }
    if (I->ext_path && strcmp(I->ext_path, real) == 0) {
        free(real);
        return IR_OK;
    }
    if (I->ext_bad && strcmp(I->ext_bad, real) == 0) {
        free(real);
        return IR_ERR; /* already reported */
    }
    ext_close(I);
    /* Non-blocking: a FIFO in place of the data file must not hang the import. */
    struct stat st;
    char because[600];
    int fd = sbp_file_open_input(real, &st, because, sizeof because);
    if (fd < 0) {
        free(I->ext_bad);
        I->ext_bad = strdup(real);
        struct stat ls;
        if (stat(real, &ls) == 0 && !S_ISREG(ls.st_mode))
            err(I, NULL, NULL, "%s: external data file '%s' is %s, not a regular file", what, loc,
                sbp_file_kind(ls.st_mode));
        else
            err(I, NULL, NULL, "%s: cannot open external data file '%s': %s", what, loc, because);
        free(real);
        return IR_ERR;
    }
    if (I->files && sbp_file_set_add(I->files, real, "the model's external data", &st) !=
                        SBP_FILE_OK) {
        err(I, NULL, NULL, "%s: out of memory", what);
        close(fd);
        free(real);
        return IR_ERR;
    }
    I->ext_path = real;
    I->ext_fd = fd;
    I->ext_size = (uint64_t)st.st_size;
    return IR_OK;
}

static int read_external(importer *I, const Onnx__TensorProto *t, const char *what,
                         tensor_data *o)
{
    const char *loc = NULL, *off_s = NULL, *len_s = NULL;
    for (size_t i = 0; i < t->n_external_data; i++) {
        const Onnx__StringStringEntryProto *kv = t->external_data[i];
        if (!kv || !kv->key)
            continue;
        if (strcmp(kv->key, "location") == 0)
            loc = str_or_empty(kv->value);
        else if (strcmp(kv->key, "offset") == 0)
            off_s = str_or_empty(kv->value);
        else if (strcmp(kv->key, "length") == 0)
            len_s = str_or_empty(kv->value);
        /* "checksum" (SHA-1) and unknown keys are accepted and not checked. */
    }
    if (!loc)
        return err(I, NULL, NULL, "%s: data_location is EXTERNAL but there is no 'location' "
                   "entry", what);
    uint64_t off = 0, len = 0;
    if (off_s && !parse_u64(off_s, &off))
        return err(I, NULL, NULL, "%s: external data offset '%s' is not a non-negative integer",
                   what, off_s);
    if (len_s && !parse_u64(len_s, &len))
        return err(I, NULL, NULL, "%s: external data length '%s' is not a non-negative integer",
                   what, len_s);
    if (ext_open(I, loc, what) != IR_OK)
        return IR_ERR;
    if (off > I->ext_size)
        return err(I, NULL, NULL, "%s: external data offset %llu is beyond the end of '%s' "
                   "(%llu bytes)", what, (unsigned long long)off, loc,
                   (unsigned long long)I->ext_size);
    if (!len_s)
        len = I->ext_size - off;
    if (len > I->ext_size - off)
        return err(I, NULL, NULL, "%s: external data range [%llu, %llu + %llu) runs past the end "
                   "of '%s' (%llu bytes)", what, (unsigned long long)off,
                   (unsigned long long)off, (unsigned long long)len, loc,
                   (unsigned long long)I->ext_size);
    if (len != o->nbytes)
        return err(I, NULL, NULL, "%s: external data length is %llu bytes, but the tensor needs "
                   "%zu bytes", what, (unsigned long long)len, o->nbytes);
    o->data = ir_arena_alloc(I->g->arena, o->nbytes);
    if (!o->data)
        return err(I, NULL, NULL, "%s: out of memory reading %zu bytes of external data", what,
                   o->nbytes);
    size_t done = 0;
    while (done < o->nbytes) {
        ssize_t r = pread(I->ext_fd, (char *)o->data + done, o->nbytes - done,
                          (off_t)(off + done));
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return err(I, NULL, NULL, "%s: reading external data file '%s' failed: %s", what, loc,
                       r < 0 ? strerror(errno) : "unexpected end of file");
        done += (size_t)r;
    }
    return IR_OK;
}

/* Reads a TensorProto's header and data into o (data in the graph arena). `what` names it for
 * messages ("initializer 'w'", "attribute 'value'"); node/op give the location for attributes. */
static int read_tensor(importer *I, const Onnx__TensorProto *t, const char *what,
                       const char *node, const char *op, tensor_data *o)
{
    memset(o, 0, sizeof *o);
    int32_t dt = t->has_data_type ? t->data_type : 0;
    if (dt == IR_DT_STRING)
        return err(I, node, op, "%s: string tensors are not supported", what);
    if (!dtype_supported(dt))
        return err(I, node, op, "%s: data type %s is not supported", what,
                   onnx_dtype_name(dt));
    if (t->segment)
        return err(I, node, op, "%s: segmented tensors are not supported", what);
    if (t->n_dims > IR_MAX_RANK)
        return err(I, node, op, "%s: rank %zu exceeds the supported maximum of %d", what,
                   t->n_dims, IR_MAX_RANK);
    o->dt = (ir_dtype)dt;
    o->rank = (int)t->n_dims;
    int64_t numel = 1;
    for (int i = 0; i < o->rank; i++) {
        int64_t d = t->dims[i];
        if (d < 0)
            return err(I, node, op, "%s: dimension %d is negative (%lld)", what, i, (long long)d);
        if (d > IMPORT_MAX_DIM)
            return err(I, node, op, "%s: dimension %d is %lld, larger than the supported maximum "
                       "2^40", what, i, (long long)d);
        o->dims[i] = d;
        if (!mul_i64(numel, d, &numel))
            return err(I, node, op, "%s: the element count of its dimensions overflows 64 bits",
                       what);
    }
    size_t es = ir_dtype_size(o->dt);
    int64_t nb;
    if (!mul_i64(numel, (int64_t)es, &nb) || (uint64_t)nb > IMPORT_MAX_BYTES)
        return err(I, node, op, "%s: %lld elements of %zu bytes is more than the 2^40-byte "
                   "limit", what, (long long)numel, es);
    o->nbytes = (size_t)nb;
    char ty[160];
    fmt_tensor_type(ty, sizeof ty, dt, o->rank, o->dims);

    if (t->has_data_location && t->data_location == ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL)
        return read_external(I, t, what, o);

    if (t->has_raw_data) {
        if (t->raw_data.len != o->nbytes)
            return err(I, node, op, "%s: raw_data holds %zu bytes, but %s needs %zu bytes", what,
                       t->raw_data.len, ty, o->nbytes);
        o->data = ir_arena_alloc(I->g->arena, o->nbytes);
        if (!o->data)
            return err(I, node, op, "%s: out of memory (%zu bytes)", what, o->nbytes);
        if (o->nbytes)
            memcpy(o->data, t->raw_data.data, o->nbytes);
        return IR_OK;
    }

    /* Typed fields: which one holds the data depends on the dtype (onnx.proto, TensorProto). */
    size_t have;
    const char *field;
    switch (o->dt) {
    case IR_DT_FLOAT: have = t->n_float_data; field = "float_data"; break;
    case IR_DT_DOUBLE: have = t->n_double_data; field = "double_data"; break;
    case IR_DT_INT64: have = t->n_int64_data; field = "int64_data"; break;
    case IR_DT_UINT32: case IR_DT_UINT64: have = t->n_uint64_data; field = "uint64_data"; break;
    default: have = t->n_int32_data; field = "int32_data"; break;
    }
    if (have != (uint64_t)numel) {
        if (have == 0 && numel > 0)
            return err(I, node, op, "%s: %s has no data (expected %lld elements, %zu bytes, in "
                       "raw_data or %s)", what, ty, (long long)numel, o->nbytes, field);
        return err(I, node, op, "%s: %s holds %zu elements (%zu bytes), but %s needs %lld "
                   "elements (%zu bytes)", what, field, have, have * es, ty, (long long)numel,
                   o->nbytes);
    }
    o->data = ir_arena_alloc(I->g->arena, o->nbytes);
    if (!o->data)
        return err(I, node, op, "%s: out of memory (%zu bytes)", what, o->nbytes);
    size_t n = (size_t)numel;
    if (n == 0)
        return IR_OK;
    switch (o->dt) {
    case IR_DT_FLOAT: memcpy(o->data, t->float_data, n * 4); break;
    case IR_DT_DOUBLE: memcpy(o->data, t->double_data, n * 8); break;
    case IR_DT_INT64: memcpy(o->data, t->int64_data, n * 8); break;
    case IR_DT_UINT64: memcpy(o->data, t->uint64_data, n * 8); break;
    case IR_DT_UINT32:
        for (size_t i = 0; i < n; i++)
            ((uint32_t *)o->data)[i] = (uint32_t)t->uint64_data[i];
        break;
    case IR_DT_INT32: memcpy(o->data, t->int32_data, n * 4); break;
    case IR_DT_INT16: case IR_DT_UINT16: case IR_DT_FLOAT16: case IR_DT_BFLOAT16:
        /* 16-bit values (and the bit patterns of f16/bf16) sit in the low half of each int32 */
        for (size_t i = 0; i < n; i++)
            ((uint16_t *)o->data)[i] = (uint16_t)(uint32_t)t->int32_data[i];
        break;
    case IR_DT_INT8: case IR_DT_UINT8:
        for (size_t i = 0; i < n; i++)
            ((uint8_t *)o->data)[i] = (uint8_t)(uint32_t)t->int32_data[i];
        break;
    case IR_DT_BOOL:
        for (size_t i = 0; i < n; i++)
            ((uint8_t *)o->data)[i] = t->int32_data[i] != 0;
        break;
    default:
        return err(I, node, op, "%s: data type %s is not supported", what, onnx_dtype_name(dt));
    }
    return IR_OK;
}

/* Registers tensor data as a graph value (initializer or Constant output). */
static ir_value *value_from_tensor(importer *I, const char *name, ir_value_kind kind,
                                   const tensor_data *td)
{
    ir_dim dims[IR_MAX_RANK];
    for (int i = 0; i < td->rank; i++)
        dims[i] = (ir_dim){td->dims[i], NULL};
    ir_value *v = ir_value_new(I->g, name, kind, td->dt, td->rank, dims);
    if (!v)
        return NULL;
    v->data = td->data;
    v->nbytes = td->nbytes;
    return v;
}

/* A CONST value that is not registered in the graph (the value of a TENSOR attribute). */
static ir_value *unregistered_const(importer *I, const char *name, const tensor_data *td)
{
    ir_arena *a = I->g->arena;
    ir_value *v = ir_arena_alloc(a, sizeof *v);
    if (!v)
        return NULL;
    v->id = -1;
    v->name = ir_arena_strdup(a, name);
    v->kind = IR_VAL_CONST;
    v->dtype = td->dt;
    v->rank = td->rank;
    if (td->rank > 0) {
        v->dims = ir_arena_calloc(a, (size_t)td->rank, sizeof(ir_dim));
        if (!v->dims)
            return NULL;
        for (int i = 0; i < td->rank; i++)
            v->dims[i].value = td->dims[i];
    }
    v->data = td->data;
    v->nbytes = td->nbytes;
    return v;
}

/* ------------------------------------------------------------------ attributes */

static int attr_type(const Onnx__AttributeProto *a)
{
    if (a->has_type && a->type != ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__UNDEFINED)
        return (int)a->type;
    /* Very old exporters leave `type` unset; infer it from the field that is set. */
    if (a->has_f) return ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOAT;
    if (a->has_i) return ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INT;
    if (a->has_s) return ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__STRING;
    if (a->t) return ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__TENSOR;
    if (a->g) return ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__GRAPH;
    if (a->n_floats) return ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOATS;
    if (a->n_ints) return ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INTS;
    if (a->n_strings) return ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__STRINGS;
    if (a->n_graphs) return ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__GRAPHS;
    return ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__UNDEFINED;
}

static int convert_attr(importer *I, const Onnx__AttributeProto *a, const char *nl,
                        const char *op, ir_attr *out)
{
    ir_arena *ar = I->g->arena;
    const char *an = a->name;
    if (!an || !an[0])
        return err(I, nl, op, "an attribute has no name");
    out->name = ir_arena_strdup(ar, an);
    if (!out->name)
        return err(I, nl, op, "out of memory");
    switch (attr_type(a)) {
    case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOAT:
        out->kind = IR_ATTR_FLOAT;
        out->f = a->f;
        return IR_OK;
    case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INT:
        out->kind = IR_ATTR_INT;
        out->i = a->i;
        return IR_OK;
    case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__STRING: {
        out->kind = IR_ATTR_STRING;
        char *s = ir_arena_alloc(ar, a->s.len + 1);
        if (!s)
            return err(I, nl, op, "attribute '%s': out of memory", an);
        if (a->s.len)
            memcpy(s, a->s.data, a->s.len);
        out->s = s;
        return IR_OK;
    }
    case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INTS:
        if (a->n_ints > INT_MAX)
            return err(I, nl, op, "attribute '%s' has too many values", an);
        out->kind = IR_ATTR_INTS;
        out->n = (int)a->n_ints;
        out->ints = ir_arena_calloc(ar, a->n_ints ? a->n_ints : 1, sizeof(int64_t));
        if (!out->ints)
            return err(I, nl, op, "attribute '%s': out of memory", an);
        if (a->n_ints)
            memcpy(out->ints, a->ints, a->n_ints * sizeof(int64_t));
        return IR_OK;
    case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOATS:
        if (a->n_floats > INT_MAX)
            return err(I, nl, op, "attribute '%s' has too many values", an);
        out->kind = IR_ATTR_FLOATS;
        out->n = (int)a->n_floats;
        out->floats = ir_arena_calloc(ar, a->n_floats ? a->n_floats : 1, sizeof(float));
        if (!out->floats)
            return err(I, nl, op, "attribute '%s': out of memory", an);
        if (a->n_floats)
            memcpy(out->floats, a->floats, a->n_floats * sizeof(float));
        return IR_OK;
    case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__TENSOR: {
        if (!a->t)
            return err(I, nl, op, "attribute '%s' is a TENSOR attribute without a tensor", an);
        tensor_data td;
        char *what = ir_arena_printf(ar, "attribute '%s'", an);
        if (read_tensor(I, a->t, what ? what : an, nl, op, &td) != IR_OK)
            return IR_ERR;
        out->kind = IR_ATTR_TENSOR;
        out->t = unregistered_const(I, ir_arena_printf(ar, "%s.%s", nl, an), &td);
        if (!out->t)
            return err(I, nl, op, "attribute '%s': out of memory", an);
        return IR_OK;
    }
    case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__GRAPH:
    case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__GRAPHS:
        return err(I, nl, op, "attribute '%s' is a subgraph (If/Loop/Scan body); control flow "
                   "is not supported", an);
    case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__STRINGS:
        return err(I, nl, op, "attribute '%s' is a list of strings, which is not supported", an);
    case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__TENSORS:
        return err(I, nl, op, "attribute '%s' is a list of tensors, which is not supported", an);
    case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__SPARSE_TENSOR:
    case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__SPARSE_TENSORS:
        return err(I, nl, op, "attribute '%s' is a sparse tensor, which is not supported", an);
    case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__TYPE_PROTO:
    case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__TYPE_PROTOS:
        return err(I, nl, op, "attribute '%s' is a type attribute, which is not supported", an);
    default:
        return err(I, nl, op, "attribute '%s' has no value or an unknown type (%d)", an,
                   (int)(a->has_type ? a->type : 0));
    }
}

/* ------------------------------------------------------------------ Constant nodes */

/* Turns a Constant node into a CONST value named after its output. */
static int import_constant(importer *I, const Onnx__NodeProto *np, const char *nl,
                           const char *out_name, int node_index)
{
    const char *op = "Constant";
    if (np->n_attribute != 1 || !np->attribute[0] || !np->attribute[0]->name)
        return err(I, nl, op, "a Constant node needs exactly one value attribute, it has %zu",
                   np->n_attribute);
    const Onnx__AttributeProto *a = np->attribute[0];
    const char *an = a->name;
    tensor_data td;
    memset(&td, 0, sizeof td);
    int ty = attr_type(a);
    if (strcmp(an, "value") == 0 && ty == ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__TENSOR && a->t) {
        if (read_tensor(I, a->t, "attribute 'value'", nl, op, &td) != IR_OK)
            return IR_ERR;
    } else if ((strcmp(an, "value_float") == 0 && ty == ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOAT) ||
               (strcmp(an, "value_int") == 0 && ty == ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INT)) {
        bool is_f = an[6] == 'f';
        td.dt = is_f ? IR_DT_FLOAT : IR_DT_INT64;
        td.rank = 0;
        td.nbytes = is_f ? 4 : 8;
        td.data = ir_arena_alloc(I->g->arena, td.nbytes);
        if (!td.data)
            return err(I, nl, op, "out of memory");
        if (is_f)
            *(float *)td.data = a->f;
        else
            *(int64_t *)td.data = a->i;
    } else if ((strcmp(an, "value_floats") == 0 &&
                ty == ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOATS) ||
               (strcmp(an, "value_ints") == 0 && ty == ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INTS)) {
        bool is_f = an[6] == 'f';
        size_t n = is_f ? a->n_floats : a->n_ints;
        td.dt = is_f ? IR_DT_FLOAT : IR_DT_INT64;
        td.rank = 1;
        td.dims[0] = (int64_t)n;
        td.nbytes = n * (is_f ? 4 : 8);
        td.data = ir_arena_alloc(I->g->arena, td.nbytes);
        if (!td.data)
            return err(I, nl, op, "out of memory");
        if (n)
            memcpy(td.data, is_f ? (const void *)a->floats : (const void *)a->ints, td.nbytes);
    } else if (strncmp(an, "value_string", 12) == 0) {
        return err(I, nl, op, "string constants ('%s') are not supported", an);
    } else if (strcmp(an, "sparse_value") == 0) {
        return err(I, nl, op, "sparse constants ('sparse_value') are not supported");
    } else {
        return err(I, nl, op, "unexpected Constant attribute '%s' (type %d)", an, ty);
    }
    ir_value *v = value_from_tensor(I, out_name, IR_VAL_CONST, &td);
    if (!v || !set_val_node(I, v->id, node_index))
        return err(I, nl, op, "out of memory");
    return IR_OK;
}

/* ------------------------------------------------------------------ nodes */

/* Number of names in list after dropping trailing "" (omitted optional inputs/outputs). */
static size_t trim_count(char **names, size_t n)
{
    while (n > 0 && (!names[n - 1] || !names[n - 1][0]))
        n--;
    return n;
}

static void note_unsupported(importer *I, const Onnx__NodeProto *np, const char *domain,
                             const char *op_type, const char *nl)
{
    for (int i = 0; i < I->n_unsup; i++)
        if (strcmp(I->unsup[i].domain, domain) == 0 && strcmp(I->unsup[i].op_type, op_type) == 0) {
            I->unsup[i].count++;
            return;
        }
    if (I->n_unsup == I->cap_unsup) {
        int nc = I->cap_unsup ? I->cap_unsup * 2 : 8;
        unsupported_op *nu = realloc(I->unsup, (size_t)nc * sizeof *nu);
        if (!nu) {
            err(I, nl, op_type, "unsupported operator %s (domain '%s')", op_type, domain);
            return;
        }
        I->unsup = nu;
        I->cap_unsup = nc;
    }
    bool sub = false;
    for (size_t k = 0; k < np->n_attribute; k++)
        if (np->attribute[k]) {
            int t = attr_type(np->attribute[k]);
            sub |= t == ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__GRAPH ||
                   t == ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__GRAPHS;
        }
    I->unsup[I->n_unsup++] = (unsupported_op){domain, op_type, nl, 1, sub};
}

/* CastLike(x, like) has no row of its own in ops.def: it is a Cast whose target type is like's
 * element type, so the importer builds it as a Cast that still holds `like` as a second input
 * (op_type "CastLike" for messages) and infer_all turns it into a plain one-input Cast. */
static bool is_cast_like(const char *domain, const char *op_type)
{
    return (domain[0] == 0 || strcmp(domain, "ai.onnx") == 0) && strcmp(op_type, "CastLike") == 0;
}

static bool domain_imported(const Onnx__ModelProto *m, const char *domain)
{
    for (size_t i = 0; i < m->n_opset_import; i++) {
        const Onnx__OperatorSetIdProto *os = m->opset_import[i];
        if (os && strcmp(str_or_empty(os->domain), domain) == 0)
            return true;
    }
    return false;
}

/* Step 2 for one node: checks the op and arity and creates its output values. Returns false
 * when the node is not to be built in step 3 (an error was recorded). */
static bool declare_node(importer *I, const Onnx__NodeProto *np, int idx)
{
    const char *nl = I->node_label[idx];
    const char *op_type = str_or_empty(np->op_type);
    const char *domain = str_or_empty(np->domain);
    if (!op_type[0]) {
        err(I, nl, "?", "node has no op_type");
        return false;
    }
    size_t n_in = trim_count(np->input, np->n_input);
    size_t n_out = trim_count(np->output, np->n_output);
    ir_op op = ir_op_lookup(domain, op_type);
    bool ok = true;
    if (is_cast_like(domain, op_type)) {
        if (n_in != 2) {
            err(I, nl, op_type, "has %zu inputs; CastLike takes 2 (input, like)", n_in);
            ok = false;
        } else if (!str_or_empty(np->input[0])[0] || !str_or_empty(np->input[1])[0]) {
            err(I, nl, op_type, "CastLike's input %d (%s) is absent",
                str_or_empty(np->input[0])[0] ? 1 : 0,
                str_or_empty(np->input[0])[0] ? "like" : "input");
            ok = false;
        }
        if (n_out != 1) {
            err(I, nl, op_type, "has %zu outputs; CastLike produces 1", n_out);
            ok = false;
        }
    } else if (op == IR_OP_COUNT) {
        note_unsupported(I, np, domain, op_type, nl);
        ok = false;
    } else if (op == IR_OP_CONSTANT) {
        if (n_in != 0)
            return err(I, nl, op_type, "a Constant node takes no inputs, it has %zu", n_in), false;
        if (n_out != 1 || !np->output[0][0])
            return err(I, nl, op_type, "a Constant node has exactly one output, it has %zu",
                       n_out), false;
        const char *on = np->output[0];
        ir_value *prev = ir_value_find(I->g, on);
        if (prev)
            return err(I, nl, op_type, "value '%s' is defined twice: by this node and by %s", on,
                       describe_definer(I, prev)), false;
        import_constant(I, np, nl, on, idx);
        return false; /* no node: the value is a constant */
    } else {
        const ir_op_info *info = &ir_op_table[op];
        if ((int64_t)n_in < info->min_in || (info->max_in >= 0 && (int64_t)n_in > info->max_in)) {
            if (info->max_in < 0)
                err(I, nl, op_type, "has %zu inputs; %s takes at least %d", n_in, op_type,
                    info->min_in);
            else if (info->min_in == info->max_in)
                err(I, nl, op_type, "has %zu inputs; %s takes %d", n_in, op_type, info->min_in);
            else
                err(I, nl, op_type, "has %zu inputs; %s takes %d to %d", n_in, op_type,
                    info->min_in, info->max_in);
            ok = false;
        }
        if ((int64_t)n_out < info->min_out ||
            (info->max_out >= 0 && (int64_t)n_out > info->max_out)) {
            if (info->max_out < 0)
                err(I, nl, op_type, "has %zu outputs; %s produces at least %d", n_out, op_type,
                    info->min_out);
            else if (info->min_out == info->max_out)
                err(I, nl, op_type, "has %zu outputs; %s produces %d", n_out, op_type,
                    info->min_out);
            else
                err(I, nl, op_type, "has %zu outputs; %s produces %d to %d", n_out, op_type,
                    info->min_out, info->max_out);
            ok = false;
        }
        if (n_in > INT_MAX / 2 || n_out > INT_MAX / 2) {
            err(I, nl, op_type, "has too many inputs or outputs");
            ok = false;
        }
    }
    /* Outputs are declared even for nodes that will not be built, so that their consumers do
     * not also report "undefined value". */
    for (size_t j = 0; j < np->n_output; j++) {
        const char *on = np->output[j];
        if (!on || !on[0])
            continue;
        ir_value *prev = ir_value_find(I->g, on);
        if (prev) {
            err(I, nl, op_type, "value '%s' (output %zu) is defined twice: by this node and by %s",
                on, j, describe_definer(I, prev));
            ok = false;
            continue;
        }
        ir_value *v = ir_value_new(I->g, on, IR_VAL_NODE, IR_DT_UNDEFINED, -1, NULL);
        if (!v || !set_val_node(I, v->id, idx)) {
            err(I, nl, op_type, "out of memory");
            return false;
        }
    }
    return ok;
}

/* metadata_props (ONNX IR 10: GraphProto field 16, NodeProto field 9) postdate Debian's
 * onnx.proto, so protobuf-c keeps them among a message's unknown fields: each is one
 * StringStringEntryProto, with its varint length in front of its bytes. Returns the value of
 * the first entry with key `key`, copied into the graph's arena, or NULL (none, or malformed:
 * metadata is advisory, so a bad entry is ignored, not an error). */
#define GRAPH_METADATA_PROPS_FIELD 16
#define NODE_METADATA_PROPS_FIELD 9

static const char *unknown_metadata(importer *I, const ProtobufCMessage *base, unsigned field,
                                    const char *key)
{
    for (unsigned i = 0; i < base->n_unknown_fields; i++) {
        const ProtobufCMessageUnknownField *f = &base->unknown_fields[i];
        if (f->tag != field || f->wire_type != PROTOBUF_C_WIRE_TYPE_LENGTH_PREFIXED)
            continue;
        size_t at = 0;
        while (at < f->len && at < 10 && (f->data[at] & 0x80))
            at++;
        if (++at > f->len)
            continue;
        Onnx__StringStringEntryProto *e =
            onnx__string_string_entry_proto__unpack(NULL, f->len - at, f->data + at);
        if (!e)
            continue;
        const char *v = NULL;
        if (e->key && e->value && strcmp(e->key, key) == 0)
            v = ir_arena_strdup(I->g->arena, e->value);
        onnx__string_string_entry_proto__free_unpacked(e, NULL);
        if (v)
            return v;
    }
    return NULL;
}

/* The dynamo exporter's node names carry no module path ("node_linear_3"); it records the path
 * in the node's metadata_props under this key, as a Python list literal of the enclosing
 * modules' qualified names, outermost first, then the node's own fx name:
 *   "['', 'model', 'model.layers.0', 'model.layers.0.self_attn.q_proj', 'linear']"
 * Returns the innermost module ("model.layers.0.self_attn.q_proj"), in the arena, or NULL when
 * there is none (a node of the root module) or the text is not such a list. A last entry that
 * extends the one before it ("a.b" after "a") is itself a module: exporters that leave out the
 * fx name are read right too. */
#define TORCH_NAME_SCOPES_KEY "pkg.torch.onnx.name_scopes"

static const char *torch_node_scope(importer *I, const char *list)
{
    const char *ent[2] = {NULL, NULL}; /* the last two entries: [0] before [1] */
    size_t len[2] = {0, 0};
    const char *p = list;
    while (*p == ' ')
        p++;
    if (*p++ != '[')
        return NULL;
    for (;;) {
        while (*p == ' ' || *p == ',')
            p++;
        if (*p == ']')
            break;
        char q = *p;
        if (q != '\'' && q != '"')
            return NULL;
        const char *s = ++p;
        while (*p && *p != q && *p != '\\')
            p++;
        if (*p != q)
            return NULL; /* an escape or an unterminated string: not a module path */
        ent[0] = ent[1], len[0] = len[1];
        ent[1] = s, len[1] = (size_t)(p - s);
        p++;
    }
    if (!ent[1])
        return NULL;
    const char *m = ent[0];
    size_t n = len[0];
    if (ent[0] && len[0] && len[1] > len[0] + 1 && memcmp(ent[1], ent[0], len[0]) == 0 &&
        ent[1][len[0]] == '.')
        m = ent[1], n = len[1];
    if (!m || n == 0)
        return NULL;
    return ir_arena_printf(I->g->arena, "%.*s", (int)n, m);
}

/* Step 3 for one node: resolves inputs, converts attributes, builds the ir_node. */
static void build_node(importer *I, const Onnx__NodeProto *np, int idx)
{
    const char *nl = I->node_label[idx];
    const char *op_type = np->op_type;
    bool cast_like = is_cast_like(str_or_empty(np->domain), op_type);
    ir_op op = cast_like ? IR_OP_CAST : ir_op_lookup(str_or_empty(np->domain), op_type);
    int n_in = (int)trim_count(np->input, np->n_input);
    int n_out = (int)trim_count(np->output, np->n_output);
    ir_value **in = ir_arena_calloc(I->g->arena, (size_t)n_in + 1, sizeof *in);
    ir_value **out = ir_arena_calloc(I->g->arena, (size_t)n_out + 1, sizeof *out);
    ir_attr *attrs = ir_arena_calloc(I->g->arena, np->n_attribute + 1, sizeof *attrs);
    if (!in || !out || !attrs) {
        err(I, nl, op_type, "out of memory");
        return;
    }
    bool ok = true;
    for (int j = 0; j < n_in; j++) {
        const char *name = np->input[j];
        if (!name || !name[0])
            continue; /* absent optional input */
        in[j] = ir_value_find(I->g, name);
        if (!in[j]) {
            err(I, nl, op_type, "undefined value '%s' used as input %d", name, j);
            ok = false;
        }
    }
    for (int j = 0; j < n_out; j++) {
        const char *name = np->output[j];
        if (name && name[0])
            out[j] = ir_value_find(I->g, name);
    }
    int n_attr = 0;
    for (size_t k = 0; k < np->n_attribute; k++) {
        const Onnx__AttributeProto *a = np->attribute[k];
        if (!a)
            continue;
        bool dup = false;
        for (int m = 0; m < n_attr && a->name; m++)
            dup |= strcmp(attrs[m].name, a->name) == 0;
        if (dup) {
            err(I, nl, op_type, "attribute '%s' is given twice", a->name);
            ok = false;
            continue;
        }
        if (convert_attr(I, a, nl, op_type, &attrs[n_attr]) != IR_OK) {
            ok = false;
            continue;
        }
        n_attr++;
    }
    if (!ok)
        return;
    ir_node *n = ir_node_new_with_outputs(I->g, op, nl, op_type, n_in, in, n_out, out);
    if (!n) {
        err(I, nl, op_type, "out of memory");
        return;
    }
    n->attrs = attrs;
    n->n_attr = n_attr;
    if (cast_like) {
        if (ir_attr_get(n, "to")) {
            err(I, nl, op_type, "CastLike has no 'to' attribute: its type is the 'like' input's");
            n->dead = true;
            return;
        }
        I->n_cast_like++;
    }
    const char *scopes = unknown_metadata(I, &np->base, NODE_METADATA_PROPS_FIELD,
                                          TORCH_NAME_SCOPES_KEY);
    if (scopes)
        n->scope = torch_node_scope(I, scopes);
}

/* ------------------------------------------------------------------ graph */

static int import_opsets(importer *I, const Onnx__ModelProto *m)
{
    int rc = IR_OK;
    bool have_onnx = false;
    for (size_t i = 0; i < m->n_opset_import; i++) {
        const Onnx__OperatorSetIdProto *os = m->opset_import[i];
        if (!os)
            continue;
        const char *dom = str_or_empty(os->domain);
        int64_t ver = os->has_version ? os->version : 0;
        if (dom[0] == 0 || strcmp(dom, "ai.onnx") == 0) {
            if (have_onnx) {
                rc = err(I, NULL, NULL, "the model imports the ai.onnx opset twice");
                continue;
            }
            have_onnx = true;
            if (ver < 1)
                rc = err(I, NULL, NULL, "the model's ai.onnx opset import has no valid version "
                         "(%lld)", (long long)ver);
            else if (ver > IR_MAX_OPSET)
                rc = err(I, NULL, NULL, "the model uses ai.onnx opset %lld; sbpc supports "
                         "opsets up to %d (re-export with an older opset_version)",
                         (long long)ver, IR_MAX_OPSET);
            I->g->opset = ver;
        }
        /* com.microsoft and other domains are accepted here; nodes of domains without a row in
         * ops.def are reported as unsupported operators. */
    }
    if (!have_onnx)
        rc = err(I, NULL, NULL, "the model has no ai.onnx opset import");
    return rc;
}

static int import_initializers(importer *I, const Onnx__GraphProto *gp)
{
    int rc = IR_OK;
    for (size_t i = 0; i < gp->n_initializer; i++) {
        const Onnx__TensorProto *t = gp->initializer[i];
        if (!t)
            continue;
        if (!t->name || !t->name[0]) {
            rc = err(I, NULL, NULL, "initializer %zu has no name", i);
            continue;
        }
        char *what = ir_arena_printf(I->g->arena, "initializer '%s'", t->name);
        if (!what)
            return err(I, NULL, NULL, "out of memory");
        if (ir_value_find(I->g, t->name)) {
            rc = err(I, NULL, NULL, "%s is given twice", what);
            continue;
        }
        tensor_data td;
        ir_value_kind kind = t->has_data_type && ir_dtype_is_float((ir_dtype)t->data_type)
                                 ? IR_VAL_PARAM : IR_VAL_CONST;
        if (read_tensor(I, t, what, NULL, NULL, &td) != IR_OK) {
            /* a typeless placeholder keeps consumers from also reporting "undefined value" */
            ir_value_new(I->g, t->name, kind, IR_DT_UNDEFINED, -1, NULL);
            rc = IR_ERR;
            continue;
        }
        if (!value_from_tensor(I, t->name, kind, &td))
            return err(I, NULL, NULL, "%s: out of memory", what);
    }
    return rc;
}

static int import_inputs(importer *I, const Onnx__GraphProto *gp)
{
    int rc = IR_OK;
    ir_value **list = ir_arena_calloc(I->g->arena, gp->n_input + 1, sizeof *list);
    if (!list)
        return err(I, NULL, NULL, "out of memory");
    int n = 0;
    for (size_t i = 0; i < gp->n_input; i++) {
        const Onnx__ValueInfoProto *vi = gp->input[i];
        if (!vi)
            continue;
        if (!vi->name || !vi->name[0]) {
            rc = err(I, NULL, NULL, "graph input %zu has no name", i);
            continue;
        }
        ir_value *prev = ir_value_find(I->g, vi->name);
        if (prev) {
            /* Old exporters list every initializer as an input too: the initializer wins. */
            if (prev->kind == IR_VAL_INPUT)
                rc = err(I, NULL, NULL, "graph input '%s' is listed twice", vi->name);
            continue;
        }
        char *what = ir_arena_printf(I->g->arena, "graph input '%s'", vi->name);
        if (!what)
            return err(I, NULL, NULL, "out of memory");
        ir_dtype dt;
        int rank;
        ir_dim dims[IR_MAX_RANK];
        if (read_type(I, vi->type, what, &dt, &rank, dims) != IR_OK ||
            (dt == IR_DT_UNDEFINED &&
             err(I, NULL, NULL, "%s has no tensor element type", what) != IR_OK)) {
            /* a typeless placeholder keeps consumers from also reporting "undefined value" */
            ir_value_new(I->g, vi->name, IR_VAL_INPUT, IR_DT_UNDEFINED, -1, NULL);
            rc = IR_ERR;
            continue;
        }
        ir_value *v = ir_value_new(I->g, vi->name, IR_VAL_INPUT, dt, rank, dims);
        if (!v)
            return err(I, NULL, NULL, "%s: out of memory", what);
        list[n++] = v;
    }
    I->g->inputs = list;
    I->g->n_inputs = n;
    return rc;
}

/* Gives a node-produced value the type declared for it (graph output or value_info), where the
 * declaration says more than what the value has. */
static void apply_declared(ir_graph *g, ir_value *v, ir_dtype dt, int rank, const ir_dim *dims)
{
    if (v->kind != IR_VAL_NODE)
        return;
    if (v->dtype == IR_DT_UNDEFINED)
        v->dtype = dt;
    if (v->rank < 0 && rank >= 0) {
        v->rank = rank;
        v->dims = rank ? ir_arena_calloc(g->arena, (size_t)rank, sizeof(ir_dim)) : NULL;
        if (rank && !v->dims) {
            v->rank = -1;
            return;
        }
        for (int i = 0; i < rank; i++) {
            v->dims[i].value = dims[i].value;
            v->dims[i].sym = dims[i].sym ? ir_arena_strdup(g->arena, dims[i].sym) : NULL;
        }
    }
}

static int import_outputs(importer *I, const Onnx__GraphProto *gp)
{
    int rc = IR_OK;
    if (gp->n_output == 0)
        return err(I, NULL, NULL, "the graph has no outputs");
    ir_value **list = ir_arena_calloc(I->g->arena, gp->n_output + 1, sizeof *list);
    if (!list)
        return err(I, NULL, NULL, "out of memory");
    int n = 0;
    for (size_t i = 0; i < gp->n_output; i++) {
        const Onnx__ValueInfoProto *vi = gp->output[i];
        if (!vi || !vi->name || !vi->name[0]) {
            rc = err(I, NULL, NULL, "graph output %zu has no name", i);
            continue;
        }
        ir_value *v = ir_value_find(I->g, vi->name);
        if (!v) {
            rc = err(I, NULL, NULL, "graph output '%s' is not produced by any node, input or "
                     "initializer", vi->name);
            continue;
        }
        if (v->is_output) {
            rc = err(I, NULL, NULL, "graph output '%s' is listed twice", vi->name);
            continue;
        }
        char *what = ir_arena_printf(I->g->arena, "graph output '%s'", vi->name);
        ir_dtype dt;
        int rank;
        ir_dim dims[IR_MAX_RANK];
        if (read_type(I, vi->type, what ? what : vi->name, &dt, &rank, dims) != IR_OK) {
            rc = IR_ERR;
            continue;
        }
        apply_declared(I->g, v, dt, rank, dims);
        v->is_output = true;
        list[n++] = v;
    }
    I->g->outputs = list;
    I->g->n_outputs = n;
    return rc;
}

static int import_value_info(importer *I, const Onnx__GraphProto *gp)
{
    int rc = IR_OK;
    for (size_t i = 0; i < gp->n_value_info; i++) {
        const Onnx__ValueInfoProto *vi = gp->value_info[i];
        if (!vi || !vi->name)
            continue;
        ir_value *v = ir_value_find(I->g, vi->name);
        if (!v || v->kind != IR_VAL_NODE)
            continue; /* annotations of unknown or non-intermediate values are ignored */
        char *what = ir_arena_printf(I->g->arena, "value_info '%s'", vi->name);
        ir_dtype dt;
        int rank;
        ir_dim dims[IR_MAX_RANK];
        if (read_type(I, vi->type, what ? what : vi->name, &dt, &rank, dims) != IR_OK) {
            rc = IR_ERR;
            continue;
        }
        apply_declared(I->g, v, dt, rank, dims);
    }
    return rc;
}

static void report_unsupported(importer *I)
{
    for (int i = 0; i < I->n_unsup; i++) {
        const unsupported_op *u = &I->unsup[i];
        const char *hint = "";
        if (u->domain[0] && strcmp(u->domain, "ai.onnx") != 0 &&
            strcmp(u->domain, "com.microsoft") != 0)
            hint = domain_imported(I->model, u->domain) ? " (operators of this domain are not "
                                                          "supported)"
                                                        : " (the model does not even import "
                                                          "this domain)";
        for (size_t f = 0; f < I->model->n_functions; f++) {
            const Onnx__FunctionProto *fp = I->model->functions[f];
            if (fp && fp->name && strcmp(fp->name, u->op_type) == 0 &&
                strcmp(str_or_empty(fp->domain), u->domain) == 0)
                hint = " (a model-local function: inline it before export)";
        }
        if (u->subgraph)
            hint = " (control flow: subgraph attributes are not supported)";
        if (u->count > 1)
            err(I, u->first_node, u->op_type, "unsupported operator %s (domain '%s'), used by %d "
                "nodes%s", u->op_type, u->domain, u->count, hint);
        else
            err(I, u->first_node, u->op_type, "unsupported operator %s (domain '%s')%s",
                u->op_type, u->domain, hint);
    }
}

/* The dynamo exporter (torch.onnx, torch >= 2.5) writes torch.export's graph signature, which
 * says for each initializer whether it was a PARAMETER or a BUFFER of the module, into the
 * graph's metadata_props. The text is kept verbatim for passes/graph/params.c. */
#define TORCH_SIGNATURE_KEY "pkg.torch.export.ExportedProgram.graph_signature"

static void import_graph_metadata(importer *I, const Onnx__GraphProto *gp)
{
    const char *sig = unknown_metadata(I, &gp->base, GRAPH_METADATA_PROPS_FIELD,
                                       TORCH_SIGNATURE_KEY);
    if (sig)
        I->g->torch_signature = sig;
}

static int import_graph(importer *I, const Onnx__ModelProto *m)
{
    const Onnx__GraphProto *gp = m->graph;
    ir_graph *g = I->g;
    if (!gp)
        return err(I, NULL, NULL, "the model has no graph (is this an ONNX model?)");
    if (import_opsets(I, m) != IR_OK)
        return IR_ERR; /* a model of an unknown opset is not worth reading further */
    if (gp->name && gp->name[0])
        g->name = ir_arena_strdup(g->arena, gp->name);
    if (gp->n_output == 0)
        return err(I, NULL, NULL, "the graph has no outputs");
    if (gp->n_sparse_initializer)
        err(I, NULL, NULL, "sparse initializers are not supported (%zu found)",
            gp->n_sparse_initializer);
    import_graph_metadata(I, gp);
    import_initializers(I, gp);
    import_inputs(I, gp);

    I->node_label = ir_arena_calloc(g->arena, gp->n_node + 1, sizeof(char *));
    bool *build = calloc(gp->n_node + 1, sizeof(bool));
    if (!I->node_label || !build || gp->n_node > INT_MAX) {
        free(build);
        return err(I, NULL, NULL, "out of memory (%zu nodes)", gp->n_node);
    }
    for (size_t i = 0; i < gp->n_node; i++) {
        const Onnx__NodeProto *np = gp->node[i];
        const char *nm = np ? np->name : NULL;
        I->node_label[i] = (nm && nm[0]) ? nm
                                         : ir_arena_printf(g->arena, "%s_%zu",
                                                           np && np->op_type && np->op_type[0]
                                                               ? np->op_type : "node", i);
        if (!I->node_label[i])
            I->node_label[i] = "?";
    }
    for (size_t i = 0; i < gp->n_node; i++)
        if (gp->node[i])
            build[i] = declare_node(I, gp->node[i], (int)i);
    report_unsupported(I);
    for (size_t i = 0; i < gp->n_node; i++)
        if (build[i])
            build_node(I, gp->node[i], (int)i);
    free(build);
    import_outputs(I, gp);
    import_value_info(I, gp);
    return IR_OK; /* the caller decides from the error count */
}

/* Whether n is a CastLike still waiting for its target type (built by build_node). */
static bool pending_cast_like(const ir_node *n)
{
    return n->op == IR_OP_CAST && n->n_in == 2 && strcmp(n->op_type, "CastLike") == 0;
}

/* Step 4's inference: ir_infer_graph, except that each CastLike is lowered when its turn comes
 * in topological order, by which time its `like` input has its type (from the file, or inferred
 * from the nodes before it). A node that fails poisons its outputs and their consumers are
 * skipped, as ir_infer_graph does: one root cause, one diagnostic. */
static void infer_all(importer *I)
{
    ir_graph *g = I->g;
    if (I->n_cast_like == 0) {
        ir_infer_graph(g);
        return;
    }
    bool *bad = calloc((size_t)g->n_values + 1, sizeof *bad); /* by value id */
    if (!bad) {
        err(I, NULL, NULL, "out of memory");
        return;
    }
    for (int i = 0; i < g->n_nodes; i++) {
        ir_node *n = g->nodes[i];
        if (n->dead)
            continue;
        bool skip = false;
        for (int k = 0; k < n->n_in && !skip; k++)
            skip = n->in[k] && n->in[k]->id >= 0 && n->in[k]->id < g->n_values &&
                   bad[n->in[k]->id];
        if (!skip && pending_cast_like(n)) {
            const ir_value *like = n->in[1];
            if (ir_dtype_size(like->dtype) == 0 || like->dtype == IR_DT_STRING) {
                err(I, n->name, n->op_type, "CastLike: the element type of input 1 ('like', "
                    "value '%s') is %s, so the type to cast to is unknown (give the value a "
                    "type in the model's value_info)", like->name,
                    like->dtype == IR_DT_UNDEFINED ? "not known"
                                                   : onnx_dtype_name((int32_t)like->dtype));
                skip = true;
            } else {
                ir_attr_set_int(g, n, "to", (int64_t)like->dtype);
                n->in[1] = NULL;
                n->n_in = 1;
            }
        }
        if (!skip && ir_infer_node(g, n) == IR_OK)
            continue;
        for (int k = 0; k < n->n_out; k++)
            if (n->out[k] && n->out[k]->id >= 0 && n->out[k]->id < g->n_values)
                bad[n->out[k]->id] = true;
    }
    free(bad);
}

/* ------------------------------------------------------------------ entry points */

static ir_graph *import_bytes(const uint8_t *buf, size_t len, const char *display_name,
                              const char *base_dir, ir_diag *diag, const ir_import_options *opt)
{
    bool set_file = diag->file == NULL && display_name;
    if (set_file)
        ir_diag_set_file(diag, display_name);
    int errors0 = diag->n_errors;
    ir_graph *g = NULL;
    Onnx__ModelProto *m = NULL;
    importer I;
    memset(&I, 0, sizeof I);
    I.d = diag;
    I.base_dir = base_dir;
    I.ext_fd = -1;
    I.files = opt ? opt->files : NULL;

    if (!buf || len == 0) {
        ir_diag_error(diag, "the model file is empty");
        goto out;
    }
    if (!pb_depth_ok(&onnx__model_proto__descriptor, buf, len, 0)) {
        ir_diag_error(diag, "not a valid ONNX model: protobuf messages nest deeper than %d levels",
                      IMPORT_MAX_PB_DEPTH);
        goto out;
    }
    m = onnx__model_proto__unpack(NULL, len, buf);
    if (!m) {
        ir_diag_error(diag, "not a valid ONNX model: the protobuf data could not be decoded "
                      "(truncated or not an ONNX file; %zu bytes)", len);
        goto out;
    }
    g = ir_graph_new(diag, display_name);
    if (!g) {
        ir_diag_error(diag, "out of memory");
        goto out;
    }
    I.g = g;
    I.model = m;
    import_graph(&I, m);
    if (diag->n_errors == errors0 && ir_graph_toposort(g) == IR_OK && diag->n_errors == errors0)
        infer_all(&I);

out:
    ext_close(&I);
    free(I.base_real);
    free(I.ext_bad);
    free(I.val_node);
    free(I.unsup);
    if (m)
        onnx__model_proto__free_unpacked(m, NULL);
    if (g && diag->n_errors != errors0) {
        ir_graph_free(g);
        g = NULL;
    }
    if (set_file)
        ir_diag_set_file(diag, NULL);
    return g;
}

ir_graph *ir_import_onnx_buffer(const uint8_t *buf, size_t len, const char *display_name,
                                const char *base_dir, ir_diag *diag,
                                const ir_import_options *opt)
{
    return import_bytes(buf, len, display_name ? display_name : "<memory>", base_dir, diag, opt);
}

ir_graph *ir_import_onnx(const char *path, ir_diag *diag, const ir_import_options *opt)
{
    if (!path || !path[0]) {
        ir_diag_error(diag, "no model file given");
        return NULL;
    }
    /* Non-blocking and checked to be a regular file before a byte is read: a FIFO as the model
     * is an error, not a compiler that waits forever for a writer. */
    struct stat st;
    char why[600];
    int fd = sbp_file_open_input(path, &st, why, sizeof why);
    if (fd < 0) {
        struct stat ls;
        if (stat(path, &ls) == 0 && !S_ISREG(ls.st_mode))
            ir_diag_error(diag, "model file '%s' is %s, not a regular file", path,
                          sbp_file_kind(ls.st_mode));
        else
            ir_diag_add(diag, IR_SEV_ERROR, NULL, NULL, "cannot open model file %s", why);
        return NULL;
    }
    if (opt && opt->files && sbp_file_set_add(opt->files, path, "the model", &st) != SBP_FILE_OK) {
        ir_diag_error(diag, "out of memory");
        close(fd);
        return NULL;
    }
    if (st.st_size == 0) {
        close(fd);
        bool set_file = diag->file == NULL;
        if (set_file)
            ir_diag_set_file(diag, path);
        ir_diag_error(diag, "the model file is empty");
        if (set_file)
            ir_diag_set_file(diag, NULL);
        return NULL;
    }
    if ((uint64_t)st.st_size > SIZE_MAX / 2) {
        ir_diag_error(diag, "model file '%s' is too large", path);
        close(fd);
        return NULL;
    }
    size_t len = (size_t)st.st_size;
    uint8_t *buf = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
    bool mapped = buf != MAP_FAILED;
    if (!mapped) {
        buf = malloc(len);
        size_t done = 0;
        while (buf && done < len) {
            ssize_t r = read(fd, buf + done, len - done);
            if (r < 0 && errno == EINTR)
                continue;
            if (r <= 0)
                break;
            done += (size_t)r;
        }
        if (!buf || done != len) {
            ir_diag_add(diag, IR_SEV_ERROR, NULL, NULL, "cannot read model file '%s'%s%s", path,
                        buf ? ": " : ": out of memory", buf ? strerror(errno) : "");
            free(buf);
            close(fd);
            return NULL;
        }
    }
    close(fd);
    /* external data lives next to the model: its directory is the base */
    char *dir = strdup(path);
    char *slash = dir ? strrchr(dir, '/') : NULL;
    const char *base = ".";
    if (slash) {
        if (slash == dir)
            slash[1] = 0; /* "/model.onnx" -> "/" */
        else
            *slash = 0;
        base = dir;
    }
    ir_graph *g = dir ? import_bytes(buf, len, path, base, diag, opt) : NULL;
    if (!dir)
        ir_diag_error(diag, "out of memory");
    free(dir);
    if (mapped)
        munmap(buf, len);
    else
        free(buf);
    return g;
}
