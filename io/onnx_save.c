/* onnx_save.c — writing an ONNX model back with new values for its float initializers (the
 * trained weights), by editing the parsed protobuf and re-serialising it.
 *
 * Approach: unpack the model with protobuf-c, build one record per graph initializer, and point
 * the records that change at their new bytes without copying: the caller's floats (replaced
 * weights), data read from the input's external files, or — when tensors move to an external
 * file — nothing. Only then is the packed size known; if it exceeds the inline limit (1.5 GB, under
 * protobuf's 2 GB), tensors of at least 1 KiB are streamed into "<out>.data" (4096-aligned offsets,
 * as the ONNX spec recommends for mmap) and referenced by relative location. The model is
 * serialised straight into the temporary output file through a ProtobufCBuffer, so no second
 * in-memory copy of the weights is made.
 *
 * Every field the edit touches is saved first and restored before onnx__model_proto__free_unpacked,
 * because protobuf-c frees what it finds in the message and must never see the caller's pointers
 * or ours. Output files are atomic (sbpio_atomic): the data file is committed before the model,
 * and on any error both temporaries are removed.
 *
 * External data of the input is resolved relative to the input model's directory and must stay
 * inside it (no absolute locations, no escape through ".." or symlinks); its range is checked
 * against the file size and the tensor's byte size.
 */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <protobuf-c/protobuf-c.h>

#include "io_internal.h"
#include "onnx.pb-c.h"

#define ONNX_DEFAULT_INLINE_LIMIT 1500000000ull
#define ONNX_DEFAULT_EXTERNAL_MIN 1024ull
#define ONNX_EXTERNAL_ALIGN 4096ull
#define ONNX_FLOAT 1

typedef enum {
    SRC_KEEP,     /* untouched */
    SRC_CALLER,   /* replaced: the caller's floats */
    SRC_EXTERNAL, /* external in the input: bytes in ext_path at ext_offset */
    SRC_RAW,      /* inline raw_data of the input (moved out only in external mode) */
} src_kind;

typedef struct {
    Onnx__TensorProto *t;
    src_kind kind;
    const void *caller; /* SRC_CALLER: [numel] floats, host order */
    char *ext_path;     /* SRC_EXTERNAL: resolved path, malloc'd */
    uint64_t ext_offset;
    size_t nbytes;     /* the tensor's data size */
    void *owned;       /* inline bytes we allocated (external data read in, swapped floats) */
    bool external_out; /* goes to <out>.data */
    /* the external_data entries of the output (location, offset, length) */
    Onnx__StringStringEntryProto ent[3];
    Onnx__StringStringEntryProto *entp[3];
    char offbuf[24], lenbuf[24];
    /* fields as unpacked, restored before free_unpacked */
    bool saved;
    protobuf_c_boolean has_raw_data, has_data_location;
    ProtobufCBinaryData raw_data;
    size_t n_float_data, n_external_data;
    float *float_data;
    Onnx__StringStringEntryProto **external_data;
    Onnx__TensorProto__DataLocation data_location;
} init_rec;

typedef struct {
    ProtobufCBuffer base;
    FILE *f;
    bool failed;
} file_buffer;

static void fb_append(ProtobufCBuffer *b, size_t len, const uint8_t *data)
{
    file_buffer *fb = (file_buffer *)b;
    if (!fb->failed && len && fwrite(data, 1, len, fb->f) != len)
        fb->failed = true;
}

/* Bytes per element of an ONNX TensorProto.DataType; 0 for STRING/UNDEFINED/unknown. */
static size_t onnx_dtype_size(int32_t t)
{
    switch (t) {
    case 2:
    case 3:
    case 9: return 1; /* UINT8 INT8 BOOL */
    case 4:
    case 5:
    case 10:
    case 16: return 2; /* UINT16 INT16 FLOAT16 BFLOAT16 */
    case 1:
    case 6:
    case 12: return 4; /* FLOAT INT32 UINT32 */
    case 7:
    case 11:
    case 13:
    case 14: return 8;  /* INT64 DOUBLE UINT64 COMPLEX64 */
    case 15: return 16; /* COMPLEX128 */
    default: return 0;
    }
}

static bool tensor_bytes(const Onnx__TensorProto *t, size_t *nbytes)
{
    int64_t numel;
    for (size_t i = 0; i < t->n_dims; i++)
        if (t->dims[i] < 0)
            return false;
    return t->n_dims <= INT_MAX && sbpio_shape_bytes((int)t->n_dims, t->dims,
                                                     onnx_dtype_size(t->data_type), &numel, nbytes);
}

static bool parse_u64(const char *s, uint64_t *out)
{
    uint64_t v = 0;
    if (!s || !*s)
        return false;
    for (; *s; s++) {
        if (*s < '0' || *s > '9' || v > (UINT64_MAX - (uint64_t)(*s - '0')) / 10)
            return false;
        v = v * 10 + (uint64_t)(*s - '0');
    }
    *out = v;
    return true;
}

/* Resolves the external data of initializer r->t (input model in_model, directory in_dir). */
static int resolve_external(init_rec *r, const char *in_model, const char *in_dir, char *err,
                            size_t errlen)
{
    const Onnx__TensorProto *t = r->t;
    const char *loc = NULL;
    uint64_t offset = 0, length = 0;
    bool have_length = false;
    for (size_t i = 0; i < t->n_external_data; i++) {
        const Onnx__StringStringEntryProto *e = t->external_data[i];
        if (!e->key)
            continue;
        if (strcmp(e->key, "location") == 0)
            loc = e->value;
        else if (strcmp(e->key, "offset") == 0 && !parse_u64(e->value, &offset))
            return sbpio_errf(err, errlen, "%s: initializer '%s': bad external offset '%s'",
                              in_model, t->name, e->value ? e->value : "");
        else if (strcmp(e->key, "length") == 0) {
            if (!parse_u64(e->value, &length))
                return sbpio_errf(err, errlen, "%s: initializer '%s': bad external length '%s'",
                                  in_model, t->name, e->value ? e->value : "");
            have_length = true;
        }
    }
    if (!loc || !*loc)
        return sbpio_errf(err, errlen, "%s: initializer '%s': external data without a location",
                          in_model, t->name);
    if (loc[0] == '/')
        return sbpio_errf(err, errlen, "%s: initializer '%s': external location '%s' is absolute",
                          in_model, t->name, loc);
    if (have_length && length != r->nbytes)
        return sbpio_errf(err, errlen,
                          "%s: initializer '%s': external length %" PRIu64
                          " but dims need %zu bytes",
                          in_model, t->name, length, r->nbytes);
    size_t plen = strlen(in_dir) + strlen(loc) + 2;
    char *joined = malloc(plen);
    if (!joined)
        return sbpio_errf(err, errlen, "%s: out of memory", in_model);
    snprintf(joined, plen, "%s/%s", in_dir, loc);
    char *real = realpath(joined, NULL);
    int real_errno = errno;
    char *realdir = realpath(in_dir, NULL);
    int rc = SBPIO_OK;
    if (!real) {
        rc = sbpio_errf(err, errlen, "%s: initializer '%s': external data '%s': %s", in_model,
                        t->name, joined, strerror(real_errno));
    } else if (!realdir) {
        rc = sbpio_errf(err, errlen, "%s: %s: %s", in_model, in_dir, strerror(errno));
    } else {
        size_t dl = strlen(realdir);
        bool inside =
            strncmp(real, realdir, dl) == 0 && (real[dl] == '/' || strcmp(realdir, "/") == 0);
        if (!inside)
            rc = sbpio_errf(
                err, errlen,
                "%s: initializer '%s': external location '%s' leaves the model's directory",
                in_model, t->name, loc);
    }
    if (rc == SBPIO_OK) {
        char why[512];
        FILE *f = sbp_file_fopen_input(real, NULL, why, sizeof why);
        int64_t size = f ? sbpio_file_size(f) : -1;
        if (f)
            fclose(f);
        if (size < 0)
            rc = sbpio_errf(err, errlen, "%s: initializer '%s': external data '%s': %s", in_model,
                            t->name, joined, f ? strerror(errno) : why);
        else if (offset > (uint64_t)size || (uint64_t)size - offset < r->nbytes)
            rc = sbpio_errf(err, errlen,
                            "%s: initializer '%s': external range [%" PRIu64
                            ", +%zu) is beyond the %" PRId64 "-byte file '%s'",
                            in_model, t->name, offset, r->nbytes, size, joined);
    }
    free(joined);
    free(realdir);
    if (rc != SBPIO_OK) {
        free(real);
        return rc;
    }
    r->kind = SRC_EXTERNAL;
    r->ext_path = real;
    r->ext_offset = offset;
    return SBPIO_OK;
}

static void save_fields(init_rec *r)
{
    Onnx__TensorProto *t = r->t;
    if (r->saved)
        return;
    r->saved = true;
    r->has_raw_data = t->has_raw_data;
    r->raw_data = t->raw_data;
    r->n_float_data = t->n_float_data;
    r->float_data = t->float_data;
    r->n_external_data = t->n_external_data;
    r->external_data = t->external_data;
    r->has_data_location = t->has_data_location;
    r->data_location = t->data_location;
}

static void restore_fields(init_rec *r)
{
    if (!r->saved)
        return;
    Onnx__TensorProto *t = r->t;
    t->has_raw_data = r->has_raw_data;
    t->raw_data = r->raw_data;
    t->n_float_data = r->n_float_data;
    t->float_data = r->float_data;
    t->n_external_data = r->n_external_data;
    t->external_data = r->external_data;
    t->has_data_location = r->has_data_location;
    t->data_location = r->data_location;
    r->saved = false;
}

/* Makes r's tensor carry its data inline as raw_data (data pointer may be NULL while sizing). */
static void set_inline(init_rec *r, const void *data)
{
    Onnx__TensorProto *t = r->t;
    t->has_raw_data = 1;
    t->raw_data.len = r->nbytes;
    t->raw_data.data = (uint8_t *)data;
    t->n_float_data = 0;
    t->float_data = NULL;
    t->n_external_data = 0;
    t->external_data = NULL;
    t->has_data_location = 0;
    t->data_location = ONNX__TENSOR_PROTO__DATA_LOCATION__DEFAULT;
}

static void set_external(init_rec *r, const char *location, uint64_t offset)
{
    Onnx__TensorProto *t = r->t;
    static const char *keys[3] = {"location", "offset", "length"};
    snprintf(r->offbuf, sizeof r->offbuf, "%" PRIu64, offset);
    snprintf(r->lenbuf, sizeof r->lenbuf, "%zu", r->nbytes);
    const char *vals[3] = {location, r->offbuf, r->lenbuf};
    for (int i = 0; i < 3; i++) {
        onnx__string_string_entry_proto__init(&r->ent[i]);
        r->ent[i].key = (char *)keys[i];
        r->ent[i].value = (char *)vals[i];
        r->entp[i] = &r->ent[i];
    }
    t->has_raw_data = 0;
    t->raw_data.len = 0;
    t->raw_data.data = NULL;
    t->n_float_data = 0;
    t->float_data = NULL;
    t->n_external_data = 3;
    t->external_data = r->entp;
    t->has_data_location = 1;
    t->data_location = ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL;
}

/* Copies [offset, offset+n) of file path into out (a stream) or into buf. */
static int copy_external(const init_rec *r, FILE *out, void *buf, const char *in_model, char *err,
                         size_t errlen)
{
    char why[512];
    FILE *f = sbp_file_fopen_input(r->ext_path, NULL, why, sizeof why);
    if (!f)
        return sbpio_errf(err, errlen, "%s: initializer '%s': %s", in_model, r->t->name, why);
    int rc = SBPIO_OK;
    if (fseeko(f, (off_t)r->ext_offset, SEEK_SET) != 0) {
        rc = sbpio_errf(err, errlen, "%s: seek: %s", r->ext_path, strerror(errno));
    } else if (buf) {
        if (!sbpio_read_exact(f, buf, r->nbytes))
            rc = sbpio_errf(err, errlen, "%s: short read of initializer '%s'", r->ext_path,
                            r->t->name);
    } else {
        unsigned char tmp[1 << 16];
        for (size_t left = r->nbytes; left && rc == SBPIO_OK;) {
            size_t k = left < sizeof tmp ? left : sizeof tmp;
            if (!sbpio_read_exact(f, tmp, k))
                rc = sbpio_errf(err, errlen, "%s: short read of initializer '%s'", r->ext_path,
                                r->t->name);
            else if (fwrite(tmp, 1, k, out) != k)
                rc = sbpio_errf(err, errlen, "write error: %s", strerror(errno));
            left -= k;
        }
    }
    fclose(f);
    return rc;
}

/* The caller's floats as little-endian bytes: the pointer itself on little-endian hosts. */
static int caller_bytes(init_rec *r, const void **out, char *err, size_t errlen)
{
    if (sbpio_host_is_le() || r->nbytes == 0) {
        *out = r->caller;
        return SBPIO_OK;
    }
    if (!(r->owned = malloc(r->nbytes)))
        return sbpio_errf(err, errlen, "out of memory (%zu bytes)", r->nbytes);
    memcpy(r->owned, r->caller, r->nbytes);
    sbpio_byteswap(r->owned, r->nbytes / 4, 4);
    *out = r->owned;
    return SBPIO_OK;
}

typedef struct {
    const char *name;
    int idx;
} name_idx;

static int cmp_name_idx(const void *a, const void *b)
{
    const name_idx *x = a, *y = b;
    int c = strcmp(x->name, y->name);
    return c ? c : (x->idx > y->idx) - (x->idx < y->idx);
}

/* Refuses out_model, and "<out_model>.data", when it is an external data file of the input
 * (of any initializer, replaced or kept: the model on disk still points at it). */
static int check_not_external(const init_rec *rec, size_t ni, const char *in_model,
                              const char *in_dir, const char *out_model, char *err,
                              size_t errlen)
{
    size_t dl = strlen(out_model) + 6;
    char *data_path = malloc(dl);
    if (!data_path)
        return sbpio_errf(err, errlen, "%s: out of memory", out_model);
    snprintf(data_path, dl, "%s.data", out_model);
    const char *outs[2] = {out_model, data_path};
    int rc = SBPIO_OK;
    for (int k = 0; k < 2 && rc == SBPIO_OK; k++) {
        struct stat os, es;
        if (stat(outs[k], &os) != 0)
            continue;
        for (size_t i = 0; i < ni && rc == SBPIO_OK; i++) {
            const Onnx__TensorProto *t = rec[i].t;
            if (!t->has_data_location ||
                t->data_location != ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL)
                continue;
            for (size_t e = 0; e < t->n_external_data && rc == SBPIO_OK; e++) {
                const Onnx__StringStringEntryProto *kv = t->external_data[e];
                if (!kv || !kv->key || !kv->value || strcmp(kv->key, "location") != 0)
                    continue;
                size_t pl = strlen(in_dir) + strlen(kv->value) + 2;
                char *p = malloc(pl);
                if (!p) {
                    rc = sbpio_errf(err, errlen, "%s: out of memory", out_model);
                    break;
                }
                snprintf(p, pl, "%s/%s", in_dir, kv->value);
                if (stat(p, &es) == 0 && es.st_dev == os.st_dev && es.st_ino == os.st_ino)
                    rc = sbpio_errf(err, errlen, "%s would overwrite %s, the external data of "
                                    "%s's initializer '%s'", outs[k], p, in_model,
                                    t->name ? t->name : "");
                free(p);
            }
        }
    }
    free(data_path);
    return rc;
}

static Onnx__ModelProto *load_model(const char *path, char *err, size_t errlen)
{
    FILE *f = sbp_file_fopen_input(path, NULL, err, errlen); /* never blocks on a FIFO */
    if (!f)
        return NULL;
    int64_t size = sbpio_file_size(f);
    unsigned char *buf = NULL;
    Onnx__ModelProto *m = NULL;
    if (size < 0)
        sbpio_errf(err, errlen, "%s: %s", path,
                   errno == EINVAL ? "not a regular file" : strerror(errno));
    else if ((uint64_t)size > SIZE_MAX || !(buf = malloc(size ? (size_t)size : 1)))
        sbpio_errf(err, errlen, "%s: out of memory (%" PRId64 " bytes)", path, size);
    else if (!sbpio_read_exact(f, buf, (size_t)size))
        sbpio_errf(err, errlen, "%s: read error", path);
    else if (!(m = onnx__model_proto__unpack(NULL, (size_t)size, buf)))
        sbpio_errf(err, errlen, "%s: not a valid ONNX model (protobuf parse failed)", path);
    else if (!m->graph) {
        sbpio_errf(err, errlen, "%s: ONNX model has no graph", path);
        onnx__model_proto__free_unpacked(m, NULL);
        m = NULL;
    }
    free(buf);
    fclose(f);
    return m;
}

/* Node attributes holding external tensors would point at the input's directory; refuse them. */
static int check_node_attributes(const Onnx__GraphProto *g, const char *in_model, char *err,
                                 size_t errlen)
{
    for (size_t i = 0; i < g->n_node; i++) {
        const Onnx__NodeProto *nd = g->node[i];
        for (size_t j = 0; j < nd->n_attribute; j++) {
            const Onnx__AttributeProto *a = nd->attribute[j];
            bool ext = a->t && a->t->has_data_location &&
                       a->t->data_location == ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL;
            for (size_t k = 0; k < a->n_tensors && !ext; k++)
                ext = a->tensors[k]->has_data_location &&
                      a->tensors[k]->data_location == ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL;
            if (ext)
                return sbpio_errf(err, errlen,
                                  "%s: node '%s' (%s): attribute '%s' holds external data, which "
                                  "is not supported",
                                  in_model, nd->name ? nd->name : "",
                                  nd->op_type ? nd->op_type : "", a->name ? a->name : "");
        }
    }
    return SBPIO_OK;
}

int sbpio_onnx_save_ex(const char *in_model, const char *out_model, int n, const char *const *names,
                       const float *const *data, const int64_t *numel,
                       const sbpio_onnx_save_opts *opts, char *err, size_t errlen)
{
    uint64_t limit = opts && opts->inline_limit ? opts->inline_limit : ONNX_DEFAULT_INLINE_LIMIT;
    uint64_t min_ext =
        opts && opts->external_min_bytes ? opts->external_min_bytes : ONNX_DEFAULT_EXTERNAL_MIN;
    if (limit > INT32_MAX)
        limit = INT32_MAX; /* protobuf's hard limit */
    if (n < 0 || (n && (!names || !data)))
        return sbpio_errf(err, errlen, "%s: bad list of weights", out_model);

    Onnx__ModelProto *m = load_model(in_model, err, errlen);
    if (!m)
        return SBPIO_ERR;
    Onnx__GraphProto *g = m->graph;
    size_t ni = g->n_initializer;
    init_rec *rec = calloc(ni ? ni : 1, sizeof *rec);
    name_idx *inits = malloc(sizeof *inits * (ni ? ni : 1));
    name_idx *given = malloc(sizeof *given * (size_t)(n ? n : 1));
    char *in_dir = sbpio_dirname(in_model);
    char *location = NULL;
    sbpio_atomic data_file = {0}, model_file = {0};
    int rc = SBPIO_ERR;
    if (!rec || !inits || !given || !in_dir) {
        sbpio_errf(err, errlen, "%s: out of memory", in_model);
        goto done;
    }
    if (check_node_attributes(g, in_model, err, errlen) != SBPIO_OK)
        goto done;

    /* Index the initializers by name, then match the caller's names. */
    for (size_t i = 0; i < ni; i++) {
        rec[i].t = g->initializer[i];
        inits[i] = (name_idx){g->initializer[i]->name ? g->initializer[i]->name : "", (int)i};
    }
    qsort(inits, ni, sizeof *inits, cmp_name_idx);
    for (int i = 0; i < n; i++) {
        if (!names[i]) {
            sbpio_errf(err, errlen, "%s: weight %d has no name", out_model, i);
            goto done;
        }
        given[i] = (name_idx){names[i], i};
    }
    qsort(given, (size_t)n, sizeof *given, cmp_name_idx);
    for (int i = 1; i < n; i++)
        if (strcmp(given[i].name, given[i - 1].name) == 0) {
            sbpio_errf(err, errlen, "%s: weight '%s' given twice", out_model, given[i].name);
            goto done;
        }
    for (int i = 0; i < n; i++) {
        size_t lo = 0, hi = ni; /* first initializer whose name is >= names[i] */
        while (lo < hi) {
            size_t mid = lo + (hi - lo) / 2;
            if (strcmp(inits[mid].name, names[i]) < 0)
                lo = mid + 1;
            else
                hi = mid;
        }
        const name_idx *hit = lo < ni && strcmp(inits[lo].name, names[i]) == 0 ? &inits[lo] : NULL;
        if (!hit) {
            sbpio_errf(err, errlen, "%s: no initializer named '%s'", in_model, names[i]);
            goto done;
        }
        if (lo + 1 < ni && strcmp(inits[lo + 1].name, names[i]) == 0) {
            sbpio_errf(err, errlen, "%s: the model has two initializers named '%s'", in_model,
                       names[i]);
            goto done;
        }
        init_rec *r = &rec[hit->idx];
        if (r->t->data_type != ONNX_FLOAT) {
            sbpio_errf(err, errlen, "%s: initializer '%s' has data type %d, not FLOAT", in_model,
                       names[i], r->t->data_type);
            goto done;
        }
        if (!tensor_bytes(r->t, &r->nbytes)) {
            sbpio_errf(err, errlen, "%s: initializer '%s' has negative or overflowing dims",
                       in_model, names[i]);
            goto done;
        }
        if (numel && (numel[i] < 0 || (uint64_t)numel[i] != r->nbytes / 4)) {
            sbpio_errf(err, errlen, "%s: weight '%s' has %" PRId64 " elements, the model's has %zu",
                       in_model, names[i], numel[i], r->nbytes / 4);
            goto done;
        }
        if (r->nbytes && !data[i]) {
            sbpio_errf(err, errlen, "%s: no data for weight '%s'", out_model, names[i]);
            goto done;
        }
        r->kind = SRC_CALLER;
        r->caller = data[i];
    }
    /* Everything else that lives in external files, and (for external mode) inline raw data. */
    for (size_t i = 0; i < ni; i++) {
        init_rec *r = &rec[i];
        if (r->kind != SRC_KEEP)
            continue;
        Onnx__TensorProto *t = r->t;
        if (t->has_data_location &&
            t->data_location == ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL) {
            if (!tensor_bytes(t, &r->nbytes) || onnx_dtype_size(t->data_type) == 0) {
                sbpio_errf(err, errlen,
                           "%s: external initializer '%s' has an unsupported type or dims",
                           in_model, t->name ? t->name : "");
                goto done;
            }
            if (resolve_external(r, in_model, in_dir, err, errlen) != SBPIO_OK)
                goto done;
        } else if (t->has_raw_data) {
            r->kind = SRC_RAW;
            r->nbytes = t->raw_data.len;
        }
    }

    /* Writing over one of the input's external data files would replace weights the model
     * still points at (the next import reads a protobuf as floats): refused. The model itself
     * may be replaced: everything is read before the rename. */
    if (check_not_external(rec, ni, in_model, in_dir, out_model, err, errlen) != SBPIO_OK)
        goto done;

    /* Size the all-inline model: SRC_RAW stays as is, the others become raw_data. */
    for (size_t i = 0; i < ni; i++)
        if (rec[i].kind == SRC_CALLER || rec[i].kind == SRC_EXTERNAL) {
            save_fields(&rec[i]);
            set_inline(&rec[i], NULL);
        }
    size_t packed = onnx__model_proto__get_packed_size(m);
    bool external = packed > limit;

    if (external) {
        const char *base = sbpio_basename(out_model);
        size_t ll = strlen(base) + 6;
        if (!(location = malloc(ll))) {
            sbpio_errf(err, errlen, "%s: out of memory", out_model);
            goto done;
        }
        snprintf(location, ll, "%s.data", base);
        size_t dl = strlen(out_model) + 6;
        char *data_path = malloc(dl);
        if (!data_path) {
            sbpio_errf(err, errlen, "%s: out of memory", out_model);
            goto done;
        }
        snprintf(data_path, dl, "%s.data", out_model);
        int brc = sbpio_atomic_begin(&data_file, data_path, err, errlen);
        free(data_path);
        if (brc != SBPIO_OK)
            goto done;
        uint64_t off = 0;
        for (size_t i = 0; i < ni; i++) {
            init_rec *r = &rec[i];
            if (r->kind == SRC_KEEP || r->nbytes < min_ext)
                continue;
            uint64_t aligned =
                (off + ONNX_EXTERNAL_ALIGN - 1) / ONNX_EXTERNAL_ALIGN * ONNX_EXTERNAL_ALIGN;
            for (; off < aligned; off++)
                if (fputc(0, data_file.f) == EOF)
                    break;
            int wrc = SBPIO_OK;
            if (off != aligned) {
                wrc =
                    sbpio_errf(err, errlen, "%s: write error: %s", data_file.path, strerror(errno));
            } else if (r->kind == SRC_CALLER) {
                if (!sbpio_write_le(data_file.f, r->caller, r->nbytes / 4, 4))
                    wrc = sbpio_errf(err, errlen, "%s: write error: %s", data_file.path,
                                     strerror(errno));
            } else if (r->kind == SRC_EXTERNAL) {
                wrc = copy_external(r, data_file.f, NULL, in_model, err, errlen);
            } else { /* SRC_RAW */
                if (fwrite(r->t->raw_data.data, 1, r->nbytes, data_file.f) != r->nbytes)
                    wrc = sbpio_errf(err, errlen, "%s: write error: %s", data_file.path,
                                     strerror(errno));
                save_fields(r);
            }
            if (wrc != SBPIO_OK)
                goto done;
            r->external_out = true;
            set_external(r, location, off);
            off += r->nbytes;
        }
    }
    /* Point the inline ones at their bytes. */
    for (size_t i = 0; i < ni; i++) {
        init_rec *r = &rec[i];
        if (r->external_out || (r->kind != SRC_CALLER && r->kind != SRC_EXTERNAL))
            continue;
        const void *bytes = NULL;
        if (r->kind == SRC_CALLER) {
            if (caller_bytes(r, &bytes, err, errlen) != SBPIO_OK)
                goto done;
        } else {
            if (r->nbytes && !(r->owned = malloc(r->nbytes))) {
                sbpio_errf(err, errlen, "%s: out of memory (%zu bytes)", in_model, r->nbytes);
                goto done;
            }
            if (r->nbytes && copy_external(r, NULL, r->owned, in_model, err, errlen) != SBPIO_OK)
                goto done;
            bytes = r->owned;
        }
        set_inline(r, bytes);
    }
    packed = onnx__model_proto__get_packed_size(m);
    if (packed > INT32_MAX) {
        sbpio_errf(err, errlen,
                   "%s: the model is %zu bytes even with external data, over protobuf's 2 GB limit",
                   out_model, packed);
        goto done;
    }

    if (sbpio_atomic_begin(&model_file, out_model, err, errlen) != SBPIO_OK)
        goto done;
    file_buffer fb = {{fb_append}, model_file.f, false};
    size_t wrote = onnx__model_proto__pack_to_buffer(m, &fb.base);
    if (fb.failed || wrote != packed) {
        sbpio_errf(err, errlen, "%s: write error: %s", out_model, strerror(errno));
        goto done;
    }
    if (external && sbpio_atomic_commit(&data_file, err, errlen) != SBPIO_OK)
        goto done;
    if (sbpio_atomic_commit(&model_file, err, errlen) != SBPIO_OK)
        goto done;
    rc = SBPIO_OK;
done:
    sbpio_atomic_abort(&data_file);
    sbpio_atomic_abort(&model_file);
    for (size_t i = 0; rec && i < ni; i++) {
        restore_fields(&rec[i]);
        free(rec[i].owned);
        free(rec[i].ext_path);
    }
    onnx__model_proto__free_unpacked(m, NULL);
    free(rec);
    free(inits);
    free(given);
    free(in_dir);
    free(location);
    return rc;
}

int sbpio_onnx_save_with_weights(const char *in_model, const char *out_model, int n,
                                 const char *const *names, const float *const *data, char *err,
                                 size_t errlen)
{
    return sbpio_onnx_save_ex(in_model, out_model, n, names, data, NULL, NULL, err, errlen);
}
