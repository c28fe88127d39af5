/* onnx_meta.c — an ONNX model's metadata_props (ModelProto field 14), read without the graph.
 *
 * sbp-export records the model folder's config.json there; sbp-train reads it back to write a
 * model folder. A model can be many gigabytes of initializers, and the metadata is a few
 * kilobytes, so instead of unpacking the whole ModelProto with protobuf-c this walks the
 * top-level fields of the protobuf wire format and seeks past every one it does not need (the
 * graph above all), decoding only the StringStringEntryProto entries (key: field 1, value:
 * field 2). Any malformed encoding is an error naming the file, never a guess.
 */
#include "io_internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

#define META_MAX_BYTES (64u << 20) /* one entry; config.json is kilobytes */

static bool get_varint(FILE *f, uint64_t *out, bool *eof)
{
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
        int c = fgetc(f);
        if (c == EOF) {
            if (eof)
                *eof = shift == 0;
            return false;
        }
        v |= (uint64_t)(c & 0x7f) << shift;
        if (!(c & 0x80)) {
            *out = v;
            return true;
        }
    }
    return false;
}

/* varint from memory [*p, end) */
static bool mem_varint(const unsigned char **p, const unsigned char *end, uint64_t *out)
{
    uint64_t v = 0;
    for (int shift = 0; shift < 64 && *p < end; shift += 7) {
        unsigned c = *(*p)++;
        v |= (uint64_t)(c & 0x7f) << shift;
        if (!(c & 0x80)) {
            *out = v;
            return true;
        }
    }
    return false;
}

/* One StringStringEntryProto into a malloc'd key and value (missing fields: ""). */
static bool parse_entry(const unsigned char *p, size_t n, char **key, char **value)
{
    const unsigned char *end = p + n;
    *key = *value = NULL;
    while (p < end) {
        uint64_t tag, len;
        if (!mem_varint(&p, end, &tag))
            return false;
        unsigned field = (unsigned)(tag >> 3), wt = (unsigned)(tag & 7);
        if (wt == 0) {
            if (!mem_varint(&p, end, &len))
                return false;
            continue;
        }
        if (wt != 2 || !mem_varint(&p, end, &len) || len > (uint64_t)(end - p))
            return false;
        if (field == 1 || field == 2) {
            char **dst = field == 1 ? key : value;
            free(*dst);
            if (!(*dst = strndup((const char *)p, (size_t)len)))
                return false;
        }
        p += len;
    }
    if (!*key)
        *key = strdup("");
    if (!*value)
        *value = strdup("");
    return *key && *value;
}

int sbpio_onnx_meta_read(const char *path, sbpio_kv **out, int *n, char *err, size_t errlen)
{
    *out = NULL;
    *n = 0;
    char why[512];
    FILE *f = sbp_file_fopen_input(path, NULL, why, sizeof why);
    if (!f)
        return sbpio_errf(err, errlen, "%s", why);
    int64_t size = sbpio_file_size(f);
    int rc = SBPIO_OK, cap = 0;
    sbpio_kv *v = NULL;
    for (;;) {
        uint64_t tag, len;
        bool eof = false;
        if (!get_varint(f, &tag, &eof)) {
            if (!eof)
                rc = sbpio_errf(err, errlen, "%s: not an ONNX model (a field's tag is cut off)",
                                path);
            break;
        }
        unsigned field = (unsigned)(tag >> 3), wt = (unsigned)(tag & 7);
        int64_t at = (int64_t)ftello(f);
        if (wt == 0) {
            if (!get_varint(f, &len, NULL))
                rc = sbpio_errf(err, errlen, "%s: not an ONNX model (a varint is cut off)", path);
        } else if (wt == 1 || wt == 5) {
            if (fseeko(f, wt == 1 ? 8 : 4, SEEK_CUR) != 0 || at + (wt == 1 ? 8 : 4) > size)
                rc = sbpio_errf(err, errlen, "%s: not an ONNX model (a field is cut off)", path);
        } else if (wt == 2) {
            if (!get_varint(f, &len, NULL) || (at = (int64_t)ftello(f)) < 0 ||
                len > (uint64_t)(size - at)) {
                rc = sbpio_errf(err, errlen, "%s: not an ONNX model (field %u reaches past the "
                                "end of the file)", path, field);
            } else if (field == 14) {
                unsigned char *buf = len <= META_MAX_BYTES ? malloc(len ? len : 1) : NULL;
                char *key = NULL, *value = NULL;
                if (!buf || !sbpio_read_exact(f, buf, (size_t)len) ||
                    !parse_entry(buf, (size_t)len, &key, &value)) {
                    rc = sbpio_errf(err, errlen, "%s: a metadata_props entry cannot be read",
                                    path);
                    free(key);
                    free(value);
                } else {
                    if (*n == cap) {
                        sbpio_kv *w = realloc(v, (size_t)(cap = cap ? 2 * cap : 8) * sizeof *v);
                        if (!w) {
                            free(key);
                            free(value);
                            free(buf);
                            rc = sbpio_errf(err, errlen, "%s: out of memory", path);
                            break;
                        }
                        v = w;
                    }
                    v[(*n)++] = (sbpio_kv){key, value};
                }
                free(buf);
            } else if (fseeko(f, (off_t)len, SEEK_CUR) != 0) {
                rc = sbpio_errf(err, errlen, "%s: %s", path, strerror(errno));
            }
        } else {
            rc = sbpio_errf(err, errlen, "%s: not an ONNX model (wire type %u)", path, wt);
        }
        if (rc != SBPIO_OK)
            break;
    }
    fclose(f);
    if (rc != SBPIO_OK) {
        sbpio_onnx_meta_free(v, *n);
        *n = 0;
        return rc;
    }
    *out = v;
    return SBPIO_OK;
}

void sbpio_onnx_meta_free(sbpio_kv *kv, int n)
{
    for (int i = 0; kv && i < n; i++) {
        free((char *)kv[i].key);
        free((char *)kv[i].value);
    }
    free(kv);
}

const char *sbpio_onnx_meta_get(const sbpio_kv *kv, int n, const char *key)
{
    for (int i = 0; i < n; i++)
        if (strcmp(kv[i].key, key) == 0)
            return kv[i].value;
    return NULL;
}
