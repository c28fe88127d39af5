/* export_verify.c — sbp-train --save-safetensors --merge-lora against the base model and the
 * saved adapters, without Python (tests/lora/run_export.cmake; runs in CI).
 *
 *   export_verify MERGED.safetensors BASE.safetensors ADAPTER.safetensors R ALPHA out_in|in_out
 *
 * BASE is the untrained model as a plain step's --save-safetensors writes it (the transformers
 * state_dict's keys and layouts); ADAPTER is --save-adapter's adapter_model.safetensors (PEFT's
 * keys `base_model.model.<module>.lora_{A,B}.weight`). MERGED must hold exactly BASE's keys with
 * BASE's shapes — no adapter key, so load_state_dict(strict=True) on the original model takes
 * it — every `<module>.weight` with an adapter equal to BASE + (ALPHA/R)·B·A (computed here in
 * double; in_out: the weight is stored [in, out], GPT-2's Conv1D, and gets (B·A)^T) within 1e-6
 * of its largest entry, every other key bit for bit BASE's. The update must be visible (at least
 * 1e-4 of the weight), so a merge that was skipped fails. Exit 0 or 1 with a message.
 */
#include "sbpio.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fail(const char *fmt, const char *a, const char *b)
{
    fprintf(stderr, "export_verify: ");
    fprintf(stderr, fmt, a, b);
    fprintf(stderr, "\n");
    return 1;
}

static double *read_all(const sbpio_st_file *f, const sbpio_st_info *t)
{
    char err[256];
    double *d = malloc((size_t)t->numel * sizeof *d + 1);
    if (d && sbpio_st_copy_f64(f, t->name, d, t->numel, err, sizeof err) != 0) {
        fprintf(stderr, "export_verify: %s\n", err);
        free(d);
        return NULL;
    }
    return d;
}

int main(int argc, char **argv)
{
    if (argc != 7 || (strcmp(argv[6], "out_in") && strcmp(argv[6], "in_out"))) {
        fprintf(stderr, "usage: export_verify MERGED BASE ADAPTER R ALPHA out_in|in_out\n");
        return 1;
    }
    char err[512];
    sbpio_st_file *mf = NULL, *bf = NULL, *af = NULL;
    if (sbpio_st_open(argv[1], &mf, err, sizeof err) || sbpio_st_open(argv[2], &bf, err, sizeof err) ||
        sbpio_st_open(argv[3], &af, err, sizeof err)) {
        fprintf(stderr, "export_verify: %s\n", err);
        return 1;
    }
    double scaling = strtod(argv[5], NULL) / strtod(argv[4], NULL);
    int rank = atoi(argv[4]);
    int in_out = strcmp(argv[6], "in_out") == 0;
    if (sbpio_st_count(mf) != sbpio_st_count(bf)) {
        fprintf(stderr, "export_verify: %d keys merged, %d in the base model's state_dict\n",
                sbpio_st_count(mf), sbpio_st_count(bf));
        return 1;
    }
    int merged = 0;
    double worst = 0;
    for (int i = 0; i < sbpio_st_count(bf); i++) {
        const sbpio_st_info *b = sbpio_st_at(bf, i), *m = sbpio_st_find(mf, b->name);
        if (!m)
            return fail("'%s' of the base model is missing from %s", b->name, argv[1]);
        if (m->rank != b->rank || m->numel != b->numel ||
            memcmp(m->shape, b->shape, (size_t)b->rank * sizeof *b->shape))
            return fail("'%s' has another shape than in %s", b->name, argv[2]);
        /* the module's adapters: <module>.weight -> base_model.model.<module>.lora_A.weight */
        size_t n = strlen(b->name);
        char ka[1024], kb[1024];
        const sbpio_st_info *ta = NULL, *tb = NULL;
        if (n > 7 && strcmp(b->name + n - 7, ".weight") == 0) {
            snprintf(ka, sizeof ka, "base_model.model.%.*s.lora_A.weight", (int)(n - 7), b->name);
            snprintf(kb, sizeof kb, "base_model.model.%.*s.lora_B.weight", (int)(n - 7), b->name);
            ta = sbpio_st_find(af, ka);
            tb = sbpio_st_find(af, kb);
        }
        double *mv = read_all(mf, m), *bv = read_all(bf, b);
        if (!mv || !bv)
            return 1;
        if (!ta || !tb) { /* not adapted: the base weight as it was */
            for (int64_t k = 0; k < b->numel; k++)
                if (mv[k] != bv[k])
                    return fail("'%s' is not adapted but differs from %s", b->name, argv[2]);
            free(mv);
            free(bv);
            continue;
        }
        double *av = read_all(af, ta), *bb = read_all(af, tb);
        if (!av || !bb)
            return 1;
        int64_t out = tb->shape[0], in = ta->shape[1];
        if (b->rank != 2 || ta->shape[0] != rank || tb->shape[1] != rank ||
            b->shape[0] != (in_out ? in : out) || b->shape[1] != (in_out ? out : in))
            return fail("'%s': the adapters' shapes do not fit the weight's in %s", b->name,
                        argv[3]);
        double big = 0, err_max = 0, upd_max = 0;
        for (int64_t o = 0; o < out; o++)
            for (int64_t c = 0; c < in; c++) {
                double u = 0;
                for (int r = 0; r < rank; r++)
                    u += bb[o * rank + r] * av[r * in + c];
                int64_t k = in_out ? c * out + o : o * in + c;
                double want = bv[k] + scaling * u;
                big = fmax(big, fabs(want));
                upd_max = fmax(upd_max, fabs(scaling * u));
                err_max = fmax(err_max, fabs(mv[k] - want));
            }
        double e = err_max / big;
        printf("  %s: merged, max |error| / max |W'| = %.2g, update %.2g\n", b->name, e,
               upd_max / big);
        if (!(e <= 1e-6))
            return fail("'%s' is not base + (alpha/r)·B·A (see above)%s", b->name, "");
        if (!(upd_max >= 1e-4 * big))
            return fail("'%s': the adapters' update is too small to tell a merge%s", b->name, "");
        worst = fmax(worst, e);
        merged++;
        free(av);
        free(bb);
        free(mv);
        free(bv);
    }
    for (int i = 0; i < sbpio_st_count(mf); i++)
        if (strstr(sbpio_st_at(mf, i)->name, "lora_"))
            return fail("'%s': an adapter key in the merged state_dict%s",
                        sbpio_st_at(mf, i)->name, "");
    int pairs = 0;
    for (int i = 0; i < sbpio_st_count(af); i++)
        pairs += strstr(sbpio_st_at(af, i)->name, ".lora_A.") != NULL;
    if (merged == 0 || merged != pairs) {
        fprintf(stderr, "export_verify: %d weights merged, %d adapter pairs saved\n", merged, pairs);
        return 1;
    }
    printf("export_verify: %d keys, %d merged weights, worst %.2g\n", sbpio_st_count(mf), merged,
           worst);
    sbpio_st_close(mf);
    sbpio_st_close(bf);
    sbpio_st_close(af);
    return 0;
}
