/* safetensors.c — writing and reading the safetensors format.
 *
 * The format: an unsigned 64-bit little-endian header size N, N bytes of UTF-8 JSON — an object
 * mapping each tensor name to {"dtype", "shape", "data_offsets": [begin, end]} plus an optional
 * "__metadata__" object of string values — padded with spaces, then the data section, each
 * tensor's bytes (little-endian, row-major) at [begin, end) relative to its start.
 *
 * Writer: builds the header with the JSON escaper of json.c, pads it to a multiple of 8 (so the
 * data section, and every tensor of 8-byte-multiple size before it, is 8-aligned), and streams
 * header and data into an atomic file.
 *
 * Reader: reads the header, parses it with json.c and validates every entry — dtype known, shape
 * non-negative and its byte size free of overflow, offsets ordered, inside the data section (whose
 * size the file size gives) and matching the byte size, names unique, and, after sorting by
 * offset, no two byte ranges overlapping — before the data section is read into its own
 * allocation (16-byte aligned whatever the header length), or, opened header only, left in the
 * file and read range by range when copied (sbp-train's checkpoints, larger than a rank needs).
 * Lookup by name is a binary search over a sorted index.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "io_internal.h"

/* The reference implementation's limit on the header. */
#define ST_MAX_HEADER 100000000ull

struct sbpio_st_file {
    char *path;
    sbpio_json_doc *doc; /* owns the names, metadata keys and values */
    unsigned char *data; /* the data section, [data_size]; NULL when opened header only */
    uint64_t data_size;
    FILE *fp;            /* header only (sbpio_st_open_header): the open file, else NULL */
    uint64_t data_start; /* header only: the data section's offset in the file */
    sbpio_st_info *t; /* [n] in header order */
    int n;
    int *by_name;   /* [n] indices into t, sorted by name */
    sbpio_kv *meta; /* [nmeta] in header order */
    int nmeta;
};

/* ---------------------------------------------------------------- writing */

/* Sorting without globals: (name, index, offsets) records. */
typedef struct {
    const char *name;
    int idx;
    uint64_t begin, end;
} name_rec;

static int cmp_rec_name(const void *a, const void *b)
{
    const name_rec *x = a, *y = b;
    int c = strcmp(x->name, y->name);
    return c ? c : (x->idx > y->idx) - (x->idx < y->idx);
}

static int cmp_rec_offset(const void *a, const void *b)
{
    const name_rec *x = a, *y = b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    return (x->end > y->end) - (x->end < y->end);
}

/* A tensor whose bytes come from its fill callback, in pieces of at most 4 MiB (whole elements):
 * the caller's memory holds a piece, never the tensor (sbp-train's rank 0 writes the moments of
 * all ranks this way). why: the callback's message, or "" for a write error (errno). */
static bool write_filled(FILE *out, const sbpio_st_tensor *t, size_t nbytes, char *why,
                         size_t whylen)
{
    const size_t sz = sbpio_dtype_size(t->dtype);
    const size_t piece = (size_t)4 << 20;
    unsigned char *buf = malloc(nbytes < piece ? nbytes : piece);
    if (!buf) {
        snprintf(why, whylen, "tensor '%s': out of memory", t->name);
        return false;
    }
    bool ok = true;
    for (size_t off = 0; ok && off < nbytes; off += piece) {
        const size_t len = nbytes - off < piece ? nbytes - off : piece;
        if (t->fill(t->fill_arg, off, buf, len, why, whylen) != 0) {
            if (!why[0])
                snprintf(why, whylen, "tensor '%s': its data could not be produced", t->name);
            ok = false;
        } else {
            ok = sbpio_write_le(out, buf, len / sz, sz);
        }
    }
    free(buf);
    return ok;
}

int sbpio_st_write(const char *path, int n, const sbpio_st_tensor *tensors, int nmeta,
                   const sbpio_kv *meta, bool sorted, char *err, size_t errlen)
{
    if (n < 0 || nmeta < 0 || (n && !tensors) || (nmeta && !meta))
        return sbpio_errf(err, errlen, "%s: bad tensor or metadata list", path);
    int *order = malloc(sizeof *order * (size_t)(n ? n : 1));
    size_t *nbytes = malloc(sizeof *nbytes * (size_t)(n ? n : 1));
    sbpio_strbuf h = {0};
    int rc = SBPIO_ERR;
    if (!order || !nbytes) {
        sbpio_errf(err, errlen, "%s: out of memory", path);
        goto done;
    }
    for (int i = 0; i < n; i++) {
        const sbpio_st_tensor *t = &tensors[i];
        order[i] = i;
        int64_t numel;
        if (!t->name || strcmp(t->name, "__metadata__") == 0) {
            sbpio_errf(err, errlen, "%s: tensor %d has an invalid name (%s)", path, i,
                       t->name ? t->name : "NULL");
            goto done;
        }
        if (sbpio_dtype_size(t->dtype) == 0 || t->rank < 0 || t->rank > SBPIO_MAX_RANK ||
            (t->rank && !t->shape)) {
            sbpio_errf(err, errlen, "%s: tensor '%s': bad dtype or rank", path, t->name);
            goto done;
        }
        if (!sbpio_shape_bytes(t->rank, t->shape, sbpio_dtype_size(t->dtype), &numel, &nbytes[i])) {
            sbpio_errf(err, errlen, "%s: tensor '%s': negative dimension or size overflow", path,
                       t->name);
            goto done;
        }
        if (nbytes[i] && !t->data && !t->fill) {
            sbpio_errf(err, errlen, "%s: tensor '%s': no data", path, t->name);
            goto done;
        }
    }
    /* Sort the names; duplicates are then neighbours. */
    name_rec *byname = malloc(sizeof *byname * (size_t)(n ? n : 1));
    if (!byname) {
        sbpio_errf(err, errlen, "%s: out of memory", path);
        goto done;
    }
    for (int i = 0; i < n; i++)
        byname[i] = (name_rec){tensors[i].name, i, 0, 0};
    qsort(byname, (size_t)n, sizeof *byname, cmp_rec_name);
    for (int i = 1; i < n; i++)
        if (strcmp(byname[i].name, byname[i - 1].name) == 0) {
            sbpio_errf(err, errlen, "%s: duplicate tensor name '%s'", path, byname[i].name);
            free(byname);
            goto done;
        }
    if (sorted)
        for (int i = 0; i < n; i++)
            order[i] = byname[i].idx;
    free(byname);
    for (int i = 0; i < nmeta; i++)
        for (int j = 0; j < i; j++)
            if (meta[i].key && meta[j].key && strcmp(meta[i].key, meta[j].key) == 0) {
                sbpio_errf(err, errlen, "%s: duplicate metadata key '%s'", path, meta[i].key);
                goto done;
            }

    sbpio_sb_append(&h, "{", 1);
    if (nmeta) {
        sbpio_sb_append(&h, "\"__metadata__\":{", 16);
        for (int i = 0; i < nmeta; i++) {
            if (i)
                sbpio_sb_append(&h, ",", 1);
            if (!meta[i].key || !meta[i].value || !sbpio_sb_json_string(&h, meta[i].key) ||
                (sbpio_sb_append(&h, ":", 1), !sbpio_sb_json_string(&h, meta[i].value))) {
                sbpio_errf(err, errlen, "%s: metadata entry %d is NULL or not valid UTF-8", path,
                           i);
                goto done;
            }
        }
        sbpio_sb_append(&h, "}", 1);
    }
    uint64_t off = 0;
    for (int k = 0; k < n; k++) {
        const sbpio_st_tensor *t = &tensors[order[k]];
        if (k || nmeta)
            sbpio_sb_append(&h, ",", 1);
        if (!sbpio_sb_json_string(&h, t->name)) {
            sbpio_errf(err, errlen, "%s: tensor name is not valid UTF-8", path);
            goto done;
        }
        sbpio_sb_printf(&h, ":{\"dtype\":\"%s\",\"shape\":[", sbpio_dtype_name(t->dtype));
        for (int d = 0; d < t->rank; d++)
            sbpio_sb_printf(&h, "%s%" PRId64, d ? "," : "", t->shape[d]);
        sbpio_sb_printf(&h, "],\"data_offsets\":[%" PRIu64 ",%" PRIu64 "]}", off,
                        off + nbytes[order[k]]);
        off += nbytes[order[k]];
    }
    sbpio_sb_append(&h, "}", 1);
    while (!h.oom && h.len % 8)
        sbpio_sb_append(&h, " ", 1);
    if (h.oom) {
        sbpio_errf(err, errlen, "%s: out of memory", path);
        goto done;
    }

    sbpio_atomic a;
    if (sbpio_atomic_begin(&a, path, err, errlen) != SBPIO_OK)
        goto done;
    unsigned char len8[8];
    sbpio_put_le64(len8, h.len);
    bool ok = fwrite(len8, 1, 8, a.f) == 8 && fwrite(h.s, 1, h.len, a.f) == h.len;
    char why[400] = "";
    for (int k = 0; ok && k < n; k++) {
        const sbpio_st_tensor *t = &tensors[order[k]];
        size_t sz = sbpio_dtype_size(t->dtype);
        if (t->data || !nbytes[order[k]]) {
            ok = sbpio_write_le(a.f, t->data, nbytes[order[k]] / sz, sz);
            continue;
        }
        ok = write_filled(a.f, t, nbytes[order[k]], why, sizeof why);
    }
    if (!ok) {
        int e = errno;
        sbpio_atomic_abort(&a);
        if (why[0])
            sbpio_errf(err, errlen, "%s: %s", path, why);
        else
            sbpio_errf(err, errlen, "%s: write error: %s", path, strerror(e));
        goto done;
    }
    rc = sbpio_atomic_commit(&a, err, errlen);
done:
    free(order);
    free(nbytes);
    free(h.s);
    return rc;
}

/* ---------------------------------------------------------------- reading */

void sbpio_st_close(sbpio_st_file *f)
{
    if (!f)
        return;
    free(f->path);
    if (f->fp)
        fclose(f->fp);
    sbpio_json_free(f->doc);
    free(f->data);
    free(f->t);
    free(f->by_name);
    free(f->meta);
    free(f);
}

/* Validates one tensor entry of the header into *t. */
static int parse_entry(sbpio_st_file *f, const char *name, const sbpio_json *v, sbpio_st_info *t,
                       char *err, size_t errlen)
{
    const char *path = f->path;
    if (v->kind != SBPIO_JSON_OBJECT)
        return sbpio_errf(err, errlen, "%s: header entry '%s' is %s, not an object", path, name,
                          sbpio_json_kind_name(v->kind));
    const sbpio_json *dt = sbpio_json_get(v, "dtype"), *sh = sbpio_json_get(v, "shape"),
                     *of = sbpio_json_get(v, "data_offsets");
    if (!dt || !sh || !of)
        return sbpio_errf(err, errlen, "%s: tensor '%s': missing \"%s\"", path, name,
                          !dt   ? "dtype"
                          : !sh ? "shape"
                                : "data_offsets");
    if (dt->kind != SBPIO_JSON_STRING)
        return sbpio_errf(err, errlen, "%s: tensor '%s': \"dtype\" is not a string", path, name);
    t->name = name;
    t->dtype = sbpio_dtype_from_name(dt->str);
    if (t->dtype == SBPIO_DT_INVALID)
        return sbpio_errf(err, errlen, "%s: tensor '%s': unsupported dtype \"%.32s\"", path, name,
                          dt->str);
    if (sh->kind != SBPIO_JSON_ARRAY)
        return sbpio_errf(err, errlen, "%s: tensor '%s': \"shape\" is not an array", path, name);
    if (sh->n > SBPIO_MAX_RANK)
        return sbpio_errf(err, errlen, "%s: tensor '%s': rank %d exceeds %d", path, name, sh->n,
                          SBPIO_MAX_RANK);
    t->rank = sh->n;
    for (int d = 0; d < sh->n; d++) {
        uint64_t x;
        if (!sbpio_json_u64(sh->items[d], &x) || x > INT64_MAX)
            return sbpio_errf(err, errlen,
                              "%s: tensor '%s': shape[%d] is not a non-negative integer", path,
                              name, d);
        t->shape[d] = (int64_t)x;
    }
    if (!sbpio_shape_bytes(t->rank, t->shape, sbpio_dtype_size(t->dtype), &t->numel, &t->nbytes))
        return sbpio_errf(err, errlen, "%s: tensor '%s': shape size overflows", path, name);
    if (of->kind != SBPIO_JSON_ARRAY || of->n != 2 || !sbpio_json_u64(of->items[0], &t->begin) ||
        !sbpio_json_u64(of->items[1], &t->end))
        return sbpio_errf(err, errlen,
                          "%s: tensor '%s': \"data_offsets\" must be two non-negative integers",
                          path, name);
    if (t->begin > t->end)
        return sbpio_errf(err, errlen,
                          "%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64
                          "] end before they begin",
                          path, name, t->begin, t->end);
    if (t->end > f->data_size)
        return sbpio_errf(err, errlen,
                          "%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64
                          "] beyond the %" PRIu64 "-byte data section (file truncated?)",
                          path, name, t->begin, t->end, f->data_size);
    if (t->end - t->begin != t->nbytes) {
        char sb[256];
        return sbpio_errf(err, errlen,
                          "%s: tensor '%s': data_offsets span %" PRIu64
                          " bytes but %s shape %s needs %zu",
                          path, name, t->end - t->begin, sbpio_dtype_name(t->dtype),
                          sbpio_shape_str(t->rank, t->shape, sb, sizeof sb), t->nbytes);
    }
    return SBPIO_OK;
}

/* Parses and validates header text (hlen bytes) against the already-loaded data section. */
static int st_parse(sbpio_st_file *f, const char *text, size_t hlen, char *err, size_t errlen)
{
    const char *path = f->path;
    char jerr[200];
    const sbpio_json *root;
    if (!(f->doc = sbpio_json_parse(text, hlen, &root, jerr, sizeof jerr)))
        return sbpio_errf(err, errlen, "%s: safetensors header is not valid JSON: %s", path, jerr);
    if (root->kind != SBPIO_JSON_OBJECT)
        return sbpio_errf(err, errlen, "%s: safetensors header is %s, not a JSON object", path,
                          sbpio_json_kind_name(root->kind));
    f->t = calloc((size_t)(root->n ? root->n : 1), sizeof *f->t);
    f->by_name = malloc(sizeof *f->by_name * (size_t)(root->n ? root->n : 1));
    if (!f->t || !f->by_name)
        return sbpio_errf(err, errlen, "%s: out of memory", path);
    bool have_meta = false;
    for (int i = 0; i < root->n; i++) {
        const char *key = root->keys[i];
        const sbpio_json *v = root->items[i];
        if (strcmp(key, "__metadata__") == 0) {
            if (have_meta)
                return sbpio_errf(err, errlen, "%s: duplicate \"__metadata__\"", path);
            have_meta = true;
            if (v->kind != SBPIO_JSON_OBJECT)
                return sbpio_errf(err, errlen, "%s: \"__metadata__\" is %s, not an object", path,
                                  sbpio_json_kind_name(v->kind));
            if (!(f->meta = calloc((size_t)(v->n ? v->n : 1), sizeof *f->meta)))
                return sbpio_errf(err, errlen, "%s: out of memory", path);
            for (int j = 0; j < v->n; j++) {
                if (v->items[j]->kind != SBPIO_JSON_STRING)
                    return sbpio_errf(err, errlen, "%s: metadata \"%s\" is %s, not a string", path,
                                      v->keys[j], sbpio_json_kind_name(v->items[j]->kind));
                for (int k = 0; k < j; k++)
                    if (strcmp(v->keys[k], v->keys[j]) == 0)
                        return sbpio_errf(err, errlen, "%s: duplicate metadata key \"%s\"", path,
                                          v->keys[j]);
                f->meta[j].key = v->keys[j];
                f->meta[j].value = v->items[j]->str;
            }
            f->nmeta = v->n;
            continue;
        }
        if (parse_entry(f, key, v, &f->t[f->n], err, errlen) != SBPIO_OK)
            return SBPIO_ERR;
        f->by_name[f->n] = f->n;
        f->n++;
    }
    name_rec *recs = malloc(sizeof *recs * (size_t)(f->n ? f->n : 1));
    if (!recs)
        return sbpio_errf(err, errlen, "%s: out of memory", path);
    for (int i = 0; i < f->n; i++)
        recs[i] = (name_rec){f->t[i].name, i, f->t[i].begin, f->t[i].end};
    qsort(recs, (size_t)f->n, sizeof *recs, cmp_rec_name);
    int rc = SBPIO_OK;
    for (int i = 0; i < f->n; i++) {
        f->by_name[i] = recs[i].idx;
        if (i && rc == SBPIO_OK && strcmp(recs[i].name, recs[i - 1].name) == 0)
            rc = sbpio_errf(err, errlen, "%s: duplicate tensor name '%s'", path, recs[i].name);
    }
    qsort(recs, (size_t)f->n, sizeof *recs, cmp_rec_offset);
    for (int i = 1; i < f->n && rc == SBPIO_OK; i++) {
        const name_rec *a = &recs[i - 1], *b = &recs[i];
        if (b->begin < a->end)
            rc = sbpio_errf(err, errlen,
                            "%s: tensors '%s' [%" PRIu64 ", %" PRIu64 ") and '%s' [%" PRIu64
                            ", %" PRIu64 ") overlap",
                            path, a->name, a->begin, a->end, b->name, b->begin, b->end);
    }
    free(recs);
    return rc;
}

/* Loads the data section and parses the header; shared by the file and memory readers. */
static int st_load(sbpio_st_file *f, FILE *fp, const unsigned char *mem, uint64_t size,
                   bool header_only, char *err, size_t errlen)
{
    const char *path = f->path;
    unsigned char len8[8];
    if (size < 8)
        return sbpio_errf(err, errlen,
                          "%s: file is %" PRIu64 " bytes, too short for a safetensors header", path,
                          size);
    if (!fp)
        memcpy(len8, mem, 8);
    else if (!sbpio_read_exact(fp, len8, 8))
        return sbpio_errf(err, errlen, "%s: read error", path);
    uint64_t hlen = sbpio_le64(len8);
    if (hlen > ST_MAX_HEADER)
        return sbpio_errf(err, errlen, "%s: safetensors header size %" PRIu64 " exceeds %llu bytes",
                          path, hlen, ST_MAX_HEADER);
    if (hlen > size - 8)
        return sbpio_errf(err, errlen,
                          "%s: safetensors header size %" PRIu64
                          " runs past the end of the %" PRIu64 "-byte file",
                          path, hlen, size);
    if (hlen < 2)
        return sbpio_errf(err, errlen, "%s: safetensors header size %" PRIu64 " is too small", path,
                          hlen);
    f->data_size = size - 8 - hlen;
    if (f->data_size > SIZE_MAX)
        return sbpio_errf(err, errlen, "%s: too large for this platform", path);
    /* The header first: a bad file is refused before its data section is read. */
    char *text = malloc((size_t)hlen);
    if (!text)
        return sbpio_errf(err, errlen, "%s: out of memory", path);
    if (!fp)
        memcpy(text, mem + 8, (size_t)hlen);
    else if (!sbpio_read_exact(fp, text, (size_t)hlen)) {
        free(text);
        return sbpio_errf(err, errlen, "%s: read error", path);
    }
    int rc = SBPIO_OK;
    if (text[0] != '{')
        rc = sbpio_errf(err, errlen, "%s: safetensors header does not start with '{'", path);
    else
        rc = st_parse(f, text, (size_t)hlen, err, errlen);
    free(text); /* the parsed document holds copies of every string */
    if (rc != SBPIO_OK)
        return rc;
    if (header_only) { /* the offsets are checked against the file's size; data on demand */
        f->fp = fp;
        f->data_start = 8 + hlen;
        return SBPIO_OK;
    }
    if (!(f->data = malloc(f->data_size ? (size_t)f->data_size : 1)))
        return sbpio_errf(err, errlen, "%s: out of memory (%" PRIu64 " bytes)", path, f->data_size);
    if (!fp)
        memcpy(f->data, mem + 8 + hlen, (size_t)f->data_size);
    else if (!sbpio_read_exact(fp, f->data, (size_t)f->data_size))
        return sbpio_errf(err, errlen, "%s: read error in the data section", path);
    for (int i = 0; i < f->n; i++)
        f->t[i].data = f->data + f->t[i].begin;
    return SBPIO_OK;
}

static int st_open_common(const char *name, FILE *fp, const unsigned char *mem, uint64_t size,
                          bool header_only, sbpio_st_file **out, char *err, size_t errlen)
{
    sbpio_st_file *f = calloc(1, sizeof *f);
    if (!f || !(f->path = strdup(name))) {
        free(f);
        return sbpio_errf(err, errlen, "%s: out of memory", name);
    }
    if (st_load(f, fp, mem, size, header_only, err, errlen) != SBPIO_OK) {
        f->fp = NULL; /* the caller closes it */
        sbpio_st_close(f);
        return SBPIO_ERR;
    }
    *out = f;
    return SBPIO_OK;
}

static int st_open_path(const char *path, bool header_only, sbpio_st_file **out, char *err,
                        size_t errlen)
{
    *out = NULL;
    FILE *fp = sbp_file_fopen_input(path, NULL, err, errlen); /* never blocks on a FIFO */
    if (!fp)
        return SBPIO_ERR;
    int64_t size = sbpio_file_size(fp);
    int rc;
    if (size < 0)
        rc = sbpio_errf(err, errlen, "%s: %s", path,
                        errno == EINVAL ? "not a regular file" : strerror(errno));
    else
        rc = st_open_common(path, fp, NULL, (uint64_t)size, header_only, out, err, errlen);
    if (rc != SBPIO_OK || !header_only)
        fclose(fp);
    return rc;
}

int sbpio_st_open(const char *path, sbpio_st_file **out, char *err, size_t errlen)
{
    return st_open_path(path, false, out, err, errlen);
}

int sbpio_st_open_header(const char *path, sbpio_st_file **out, char *err, size_t errlen)
{
    return st_open_path(path, true, out, err, errlen);
}

int sbpio_st_open_mem(const void *buf, size_t len, const char *name, sbpio_st_file **out, char *err,
                      size_t errlen)
{
    *out = NULL;
    return st_open_common(name, NULL, buf, len, false, out, err, errlen);
}

const char *sbpio_st_path(const sbpio_st_file *f) { return f->path; }
int sbpio_st_count(const sbpio_st_file *f) { return f->n; }

const sbpio_st_info *sbpio_st_at(const sbpio_st_file *f, int i)
{
    return i >= 0 && i < f->n ? &f->t[i] : NULL;
}

const sbpio_st_info *sbpio_st_find(const sbpio_st_file *f, const char *name)
{
    int lo = 0, hi = f->n - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        int c = strcmp(name, f->t[f->by_name[mid]].name);
        if (c == 0)
            return &f->t[f->by_name[mid]];
        if (c < 0)
            hi = mid - 1;
        else
            lo = mid + 1;
    }
    return NULL;
}

int sbpio_st_get(const sbpio_st_file *f, const char *name, const sbpio_st_info **out, char *err,
                 size_t errlen)
{
    *out = sbpio_st_find(f, name);
    if (!*out)
        return sbpio_errf(err, errlen, "%s: no tensor named '%s'", f->path, name);
    return SBPIO_OK;
}

static void st_convert(sbpio_dtype dtype, const unsigned char *p, int64_t first, int64_t n,
                       void *dst, bool f64);

/* Elements [first, first + n) of the named tensor, which must hold `total`, into dst. */
/* Bytes [at, at + want) of tensor t's data, from a file opened header only. pread, not stdio:
 * no buffer that could serve bytes the file no longer holds. */
static int st_pread(const sbpio_st_file *f, const sbpio_st_info *t, uint64_t at, void *buf,
                    size_t want, char *err, size_t errlen)
{
    at += f->data_start + t->begin;
    size_t got = 0;
    ssize_t r = 1;
    while (got < want && at + got <= (uint64_t)INT64_MAX &&
           ((r = pread(fileno(f->fp), (char *)buf + got, want - got, (off_t)(at + got))) > 0 ||
            (r < 0 && errno == EINTR)))
        got += r > 0 ? (size_t)r : 0;
    if (got < want)
        return sbpio_errf(err, errlen, "%s: tensor '%s': read error%s%s", f->path, t->name,
                          r < 0 ? ": " : " (the file shrank since it was opened)",
                          r < 0 ? strerror(errno) : "");
    return SBPIO_OK;
}

static int st_copy(const sbpio_st_file *f, const char *name, void *dst, int64_t total,
                   int64_t first, int64_t n, bool f64, char *err, size_t errlen)
{
    const sbpio_st_info *t;
    if (sbpio_st_get(f, name, &t, err, errlen) != SBPIO_OK)
        return SBPIO_ERR;
    if (!sbpio_dtype_is_float(t->dtype))
        return sbpio_errf(err, errlen, "%s: tensor '%s' is %s, not floating point", f->path, name,
                          sbpio_dtype_name(t->dtype));
    if (total != t->numel)
        return sbpio_errf(err, errlen,
                          "%s: tensor '%s' has %" PRId64 " elements, caller expects %" PRId64,
                          f->path, name, t->numel, total);
    if (first < 0 || n < 0 || first > total || n > total - first)
        return sbpio_errf(err, errlen, "%s: tensor '%s': elements [%" PRId64 ", %" PRId64
                          ") are outside its %" PRId64, f->path, name, first, first + n, total);
    if (!f->data) { /* opened header only: the range is read in pieces of at most 1 MiB */
        const size_t esz = sbpio_dtype_size(t->dtype);
        const int64_t per = (int64_t)(((size_t)1 << 20) / esz);
        unsigned char *buf = malloc((size_t)(n < per ? (n ? n : 1) : per) * esz);
        if (!buf)
            return sbpio_errf(err, errlen, "%s: out of memory", f->path);
        int rc = SBPIO_OK;
        for (int64_t k = 0; k < n && rc == SBPIO_OK; k += per) {
            const int64_t m = n - k < per ? n - k : per;
            rc = st_pread(f, t, (uint64_t)(first + k) * esz, buf, (size_t)m * esz, err, errlen);
            if (rc == SBPIO_OK)
                st_convert(t->dtype, buf, 0, m, f64 ? (void *)((double *)dst + k)
                                                    : (void *)((float *)dst + k), f64);
        }
        free(buf);
        return rc;
    }
    st_convert(t->dtype, t->data, first, n, dst, f64);
    return SBPIO_OK;
}

/* Elements [first, first + n) of little-endian float data p of dtype into dst (double or float). */
static void st_convert(sbpio_dtype dtype, const unsigned char *p, int64_t first, int64_t n,
                       void *dst, bool f64)
{
    for (int64_t k = 0; k < n; k++) {
        const int64_t i = first + k;
        double v;
        switch (dtype) {
        case SBPIO_DT_F16: v = sbpio_f16_to_f32(sbpio_le16(p + 2 * i)); break;
        case SBPIO_DT_BF16: v = sbpio_bf16_to_f32(sbpio_le16(p + 2 * i)); break;
        case SBPIO_DT_F32: {
            uint32_t b = sbpio_le32(p + 4 * i);
            float x;
            memcpy(&x, &b, 4);
            v = x;
            break;
        }
        default: {
            uint64_t b = sbpio_le64(p + 8 * i);
            memcpy(&v, &b, 8);
            break;
        }
        }
        if (f64)
            ((double *)dst)[k] = v;
        else
            ((float *)dst)[k] = (float)v;
    }
}

int sbpio_st_copy_f64(const sbpio_st_file *f, const char *name, double *dst, int64_t n, char *err,
                      size_t errlen)
{
    return st_copy(f, name, dst, n, 0, n, true, err, errlen);
}

int sbpio_st_copy_f32(const sbpio_st_file *f, const char *name, float *dst, int64_t n, char *err,
                      size_t errlen)
{
    return st_copy(f, name, dst, n, 0, n, false, err, errlen);
}

int sbpio_st_copy_f32_range(const sbpio_st_file *f, const char *name, float *dst, int64_t total,
                            int64_t first, int64_t n, char *err, size_t errlen)
{
    return st_copy(f, name, dst, total, first, n, false, err, errlen);
}

int sbpio_st_read_range(const sbpio_st_file *f, const sbpio_st_info *t, int64_t first, int64_t n,
                        void *dst, char *err, size_t errlen)
{
    const size_t esz = sbpio_dtype_size(t->dtype);
    if (first < 0 || n < 0 || first > t->numel || n > t->numel - first)
        return sbpio_errf(err, errlen, "%s: tensor '%s': elements [%" PRId64 ", %" PRId64
                          ") are outside its %" PRId64, f->path, t->name, first, first + n,
                          t->numel);
    if (f->data) {
        memcpy(dst, (const unsigned char *)t->data + (size_t)first * esz, (size_t)n * esz);
        return SBPIO_OK;
    }
    return st_pread(f, t, (uint64_t)first * esz, dst, (size_t)n * esz, err, errlen);
}

const char *sbpio_st_meta(const sbpio_st_file *f, const char *key)
{
    for (int i = 0; i < f->nmeta; i++)
        if (strcmp(f->meta[i].key, key) == 0)
            return f->meta[i].value;
    return NULL;
}

int sbpio_st_meta_count(const sbpio_st_file *f) { return f->nmeta; }

const sbpio_kv *sbpio_st_meta_at(const sbpio_st_file *f, int i)
{
    return i >= 0 && i < f->nmeta ? &f->meta[i] : NULL;
}
