/* export_check.c — compares a file written by sbp-train --save-safetensors with the PyTorch
 * reference in tests/export/expected.json (made by gen_expected.py from the exporting module's
 * state_dict()).
 *
 *   export_check FILE.safetensors expected.json EXPORT
 *
 * The file must hold exactly the reference's keys (no more, no fewer), each float32 with the
 * reference's shape, and the sampled elements bit for bit: the file comes from a step with
 * learning rate 0, so its values are the module's initial weights, and an element off its place
 * (a matrix left transposed) shows. Exit 0 when all agree, 1 after listing what does not.
 */
#include "io_internal.h"
#include "sbpio.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char *read_all(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    char *buf = NULL;
    if (fseek(f, 0, SEEK_END) == 0) {
        long n = ftell(f);
        if (n >= 0 && fseek(f, 0, SEEK_SET) == 0 && (buf = malloc((size_t)n + 1))) {
            *len = fread(buf, 1, (size_t)n, f);
            buf[*len] = 0;
        }
    }
    fclose(f);
    return buf;
}

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: export_check FILE.safetensors expected.json EXPORT\n");
        return 2;
    }
    char err[512];
    size_t len = 0;
    char *text = read_all(argv[2], &len);
    const sbpio_json *root = NULL;
    sbpio_json_doc *doc = text ? sbpio_json_parse(text, len, &root, err, sizeof err) : NULL;
    if (!doc) {
        fprintf(stderr, "export_check: cannot read %s: %s\n", argv[2], text ? err : "open failed");
        return 1;
    }
    const sbpio_json *exp = sbpio_json_get(root, argv[3]);
    const sbpio_json *keys = exp ? sbpio_json_get(exp, "keys") : NULL;
    sbpio_st_file *f = NULL;
    if (!keys || keys->kind != SBPIO_JSON_OBJECT) {
        fprintf(stderr, "export_check: %s has no export '%s'\n", argv[2], argv[3]);
        return 1;
    }
    if (sbpio_st_open(argv[1], &f, err, sizeof err) != SBPIO_OK) {
        fprintf(stderr, "export_check: %s\n", err);
        return 1;
    }
    int bad = 0, checked = 0;
    for (int i = 0; i < sbpio_st_count(f); i++)
        if (!sbpio_json_get(keys, sbpio_st_at(f, i)->name)) {
            fprintf(stderr, "export_check: '%s' is in the file, but not in the module's "
                    "state_dict\n", sbpio_st_at(f, i)->name);
            bad++;
        }
    for (int k = 0; k < keys->n; k++) {
        const char *name = keys->keys[k];
        const sbpio_json *shape = sbpio_json_get(keys->items[k], "shape");
        const sbpio_json *vals = sbpio_json_get(keys->items[k], "values");
        const sbpio_st_info *t = sbpio_st_find(f, name);
        if (!t) {
            fprintf(stderr, "export_check: '%s' is missing from the file\n", name);
            bad++;
            continue;
        }
        bool same = t->dtype == SBPIO_DT_F32 && shape && t->rank == shape->n;
        for (int d = 0; same && d < t->rank; d++)
            same = strtoll(shape->items[d]->str, NULL, 10) == t->shape[d];
        if (!same) {
            fprintf(stderr, "export_check: '%s' has rank %d (first dim %lld) or is not f32; "
                    "PyTorch's shape has rank %d\n", name, t->rank,
                    (long long)(t->rank ? t->shape[0] : 0), shape ? shape->n : -1);
            bad++;
            continue;
        }
        for (int v = 0; vals && v < vals->n; v++) {
            long long at = strtoll(vals->items[v]->items[0]->str, NULL, 10);
            float want = (float)strtod(vals->items[v]->items[1]->str, NULL);
            float have = ((const float *)t->data)[at];
            checked++;
            if (memcmp(&have, &want, sizeof have) != 0) {
                fprintf(stderr, "export_check: '%s' element %lld is %.9g, PyTorch's is %.9g\n",
                        name, at, (double)have, (double)want);
                bad++;
            }
        }
    }
    printf("export_check: %s: %d keys, %d sampled values, %d problems\n", argv[3], keys->n,
           checked, bad);
    sbpio_st_close(f);
    sbpio_json_free(doc);
    free(text);
    return bad ? 1 : 0;
}
