/* lora_check.c — checks one sbp-train run of a LoRA step against float64 PEFT.
 *
 *   lora_check ADAPTER_DIR REF.safetensors LOG GRADS.safetensors [TOL]
 *
 * ADAPTER_DIR is sbp-train's --save-adapter after 10 AdamW steps (sbp-train's defaults: lr 1e-3,
 * no weight decay), REF tests/fixtures/lora/ref/<family>.safetensors (gen_lora.py), LOG the run's
 * output ("step N loss X" lines), GRADS its --dump-grads (the first step's gradients).
 * Passes when: the first step's adapter gradients are within 1e-4 of PEFT's `grad0/` (relative
 * per tensor; lora_A's are zero there and are checked against 1e-8 of the largest norm) and
 * every base weight's gradient is zero (frozen); the first loss is within 1e-5 of `loss0` and
 * the 10 losses within 1e-4 of `adamw`; adapter_model.safetensors holds exactly PEFT's keys
 * (base_model.model.<module>.lora_{A,B}.weight) with PEFT's shapes, each within 1e-4 of the
 * float64 trained adapters (`trained/`; ten fp32 steps of Adam land within 2e-6); adapter_config.json says LORA, r 4, lora_alpha 8. Prints the figures;
 * exit 1 on a failure. TOL (a --precision bf16 step, tests/gpu/emu_lora.cmake; the MoE family,
 * tests/lora/CMakeLists.txt) replaces every one of those tolerances (1e-4 and 1e-5) by TOL.
 * A reference with LoRA on fused expert tensors (gen_lora.py's qwen3_moe) names in its metadata
 * peft_keys, PEFT's key -> sbpc's name for the adapters whose two differ (PEFT nests one
 * lora.ParamWrapper per tensor of a module: M.base_layer.lora_A.weight is gate_up_proj's), and
 * target_parameters, the adapted tensors: such an adapter must be saved under PEFT's key (not
 * sbpc's name), and adapter_config.json's "target_parameters" must list exactly those tensors.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sbpio.h"

static int failures;

static void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("lora_check: FAIL: ", stdout);
    vprintf(fmt, ap);
    putchar('\n');
    va_end(ap);
    failures++;
}

static char *read_text(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    if (s && fread(s, 1, (size_t)n, f) != (size_t)n) {
        free(s);
        s = NULL;
    }
    if (s)
        s[n] = 0;
    fclose(f);
    return s;
}

static double norm(const double *r, int64_t n)
{
    double s = 0;
    for (int64_t k = 0; k < n; k++)
        s += r[k] * r[k];
    return sqrt(s);
}

/* ||got - ref|| / max(||ref||, floor) */
static double rel_err(const float *g, const double *r, int64_t n, double floor)
{
    double num = 0;
    for (int64_t k = 0; k < n; k++)
        num += (g[k] - r[k]) * (g[k] - r[k]);
    return sqrt(num) / fmax(norm(r, n), floor);
}

/* The JSON string that follows `"key": ` in the flat object obj (json.dumps' separators; torch
 * names need no escapes), copied into out; NULL when obj has no such key. */
static const char *json_value(const char *obj, const char *key, char *out, size_t n)
{
    char pat[1100];
    snprintf(pat, sizeof pat, "\"%s\": \"", key);
    const char *at = obj ? strstr(obj, pat) : NULL;
    if (!at)
        return NULL;
    at += strlen(pat);
    const char *end = strchr(at, '"');
    if (!end || (size_t)(end - at) >= n)
        return NULL;
    snprintf(out, n, "%.*s", (int)(end - at), at);
    return out;
}

/* Whether value is one of obj's values: sbpc's name of an adapter PEFT keys otherwise */
static int json_has_value(const char *obj, const char *value)
{
    char pat[1100];
    snprintf(pat, sizeof pat, ": \"%s\"", value);
    return obj && strstr(obj, pat) != NULL;
}

/* The next quoted string at or after q and before limit (NULL: the end of the text): its
 * opening quote, *end its closing one; NULL when there is none. */
static const char *next_quoted(const char *q, const char *limit, const char **end)
{
    const char *s = strchr(q, '"');
    if (!s || (limit && s > limit) || !(*end = strchr(s + 1, '"')))
        return NULL;
    return s;
}

/* The quoted strings of the JSON list `list` (the reference's target_parameters) must be, as a
 * set, the list that follows `"target_parameters":` in cfg (sbp-train writes one per line). */
static void check_target_parameters(const char *cfg, const char *list, const char *path)
{
    const char *at = strstr(cfg, "\"target_parameters\":");
    const char *open = at ? strchr(at, '[') : NULL, *close = open ? strchr(open, ']') : NULL;
    const char *nl = at ? strchr(at, '\n') : NULL; /* "target_parameters": null ends its line */
    if (!close || (nl && nl < open)) {
        fail("%s: no \"target_parameters\" list (PEFT would not adapt the expert tensors)", path);
        return;
    }
    int want = 0, have = 0;
    const char *s, *e;
    for (const char *q = open; (s = next_quoted(q, close, &e)); q = e + 1)
        have++;
    for (const char *q = list; (s = next_quoted(q, NULL, &e)); q = e + 1) {
        char pat[1100];
        snprintf(pat, sizeof pat, "%.*s", (int)(e - s + 1), s);
        const char *hit = strstr(open, pat);
        if (!hit || hit > close)
            fail("%s: \"target_parameters\" does not name %s", path, pat);
        want++;
    }
    if (have != want)
        fail("%s: \"target_parameters\" names %d tensors, PEFT adapted %d", path, have, want);
}

static int is_adapter(const char *name)
{
    return strstr(name, ".lora_A.weight") || strstr(name, ".lora_B.weight");
}

int main(int argc, char **argv)
{
    if (argc != 5 && argc != 6) {
        fprintf(stderr, "usage: lora_check ADAPTER_DIR REF.safetensors LOG GRADS.safetensors "
                "[TOL]\n");
        return 2;
    }
    /* the gradients, the losses after the first, the trained adapters; the first loss */
    double tol = 1e-4, tol_loss0 = 1e-5;
    if (argc == 6) {
        char *end;
        tol = tol_loss0 = strtod(argv[5], &end);
        if (*end || !(tol > 0 && tol < 1)) {
            fprintf(stderr, "lora_check: TOL '%s' is not a number in (0, 1)\n", argv[5]);
            return 2;
        }
    }
    char path[4096], err[512], key[1024];
    sbpio_st_file *ad = NULL, *ref = NULL, *gr = NULL;
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", argv[1]);
    if (sbpio_st_open(path, &ad, err, sizeof err) || sbpio_st_open(argv[2], &ref, err, sizeof err) ||
        sbpio_st_open(argv[4], &gr, err, sizeof err)) {
        printf("lora_check: FAIL: %s\n", err);
        return 1;
    }
    /* the first step's gradients */
    double scale = 0;
    for (int i = 0; i < sbpio_st_count(ref); i++) {
        const sbpio_st_info *r = sbpio_st_at(ref, i);
        if (strncmp(r->name, "grad0/", 6) == 0)
            scale = fmax(scale, norm(r->data, r->numel));
    }
    double worst = 0;
    int n_grads = 0;
    for (int i = 0; i < sbpio_st_count(gr); i++) {
        const sbpio_st_info *g = sbpio_st_at(gr, i);
        if (!is_adapter(g->name)) { /* frozen: --dump-grads writes its gradient, all zero */
            const float *x = g->data;
            for (int64_t k = 0; g->dtype == SBPIO_DT_F32 && k < g->numel; k++)
                if (x[k] != 0.0f) {
                    fail("'%s' has a gradient: a LoRA step trains only the adapters", g->name);
                    break;
                }
            continue;
        }
        snprintf(key, sizeof key, "grad0/%s", g->name);
        const sbpio_st_info *r = sbpio_st_find(ref, key);
        if (!r || r->numel != g->numel || g->dtype != SBPIO_DT_F32) {
            fail("'%s': no float64 reference of %lld elements", g->name, (long long)g->numel);
            continue;
        }
        double e = rel_err(g->data, r->data, r->numel, 1e-4 * scale);
        worst = fmax(worst, e);
        if (!(e <= tol))
            fail("gradient of '%s': relative error %.3g > %g", g->name, e, tol);
        n_grads++;
    }
    printf("lora_check: %d adapter gradients, worst relative error %.3g\n", n_grads, worst);
    /* the saved adapters, under PEFT's keys: sbpc's names but where peft_keys says otherwise */
    const char *peft_keys = sbpio_st_meta(ref, "peft_keys");
    int n_ref = 0, n_ad = 0;
    double worst_w = 0;
    for (int i = 0; i < sbpio_st_count(ref); i++)
        n_ref += strncmp(sbpio_st_at(ref, i)->name, "trained/", 8) == 0;
    if (n_grads != n_ref)
        fail("%d adapter gradients dumped, PEFT has %d adapters", n_grads, n_ref);
    for (int i = 0; i < sbpio_st_count(ad); i++) {
        const sbpio_st_info *a = sbpio_st_at(ad, i);
        const char *pre = "base_model.model.";
        if (strncmp(a->name, pre, strlen(pre)) != 0) {
            fail("adapter key '%s' does not start with '%s'", a->name, pre);
            continue;
        }
        const char *peft = a->name + strlen(pre), *name = peft;
        char mapped[1000];
        if (json_value(peft_keys, peft, mapped, sizeof mapped)) {
            name = mapped;
        } else if (json_has_value(peft_keys, peft)) {
            fail("adapter '%s' is saved under sbpc's name, not PEFT's key", a->name);
            continue;
        }
        snprintf(key, sizeof key, "trained/%s", name);
        const sbpio_st_info *r = sbpio_st_find(ref, key);
        if (!r || r->numel != a->numel || r->rank != a->rank || a->dtype != SBPIO_DT_F32 ||
            r->shape[0] != a->shape[0]) {
            fail("adapter '%s': not one of PEFT's (name, shape or dtype)", a->name);
            continue;
        }
        double e = rel_err(a->data, r->data, r->numel, 0);
        worst_w = fmax(worst_w, e);
        if (!(e <= tol))
            fail("trained adapter '%s': relative error %.3g > %g", a->name, e, tol);
        n_ad++;
    }
    if (n_ad != n_ref)
        fail("%d adapters saved, PEFT has %d", n_ad, n_ref);
    printf("lora_check: %d saved adapters after 10 steps, worst relative error %.3g\n", n_ad,
           worst_w);
    /* adapter_config.json */
    snprintf(path, sizeof path, "%s/adapter_config.json", argv[1]);
    char *cfg = read_text(path);
    if (!cfg || !strstr(cfg, "\"peft_type\": \"LORA\"") || !strstr(cfg, "\"r\": 4,") ||
        !strstr(cfg, "\"lora_alpha\": 8,") || !strstr(cfg, "\"task_type\": \"CAUSAL_LM\""))
        fail("%s: not PEFT's LoRA config with r 4 and lora_alpha 8", path);
    const char *tp = sbpio_st_meta(ref, "target_parameters");
    if (cfg && tp)
        check_target_parameters(cfg, tp, path);
    free(cfg);
    /* the losses */
    char *log = read_text(argv[3]);
    const char *am = sbpio_st_meta(ref, "adamw");
    double adamw[10] = {0}, loss0 = strtod(sbpio_st_meta(ref, "loss0"), NULL);
    for (int k = 0; am && k < 10; k++) {
        while (*am && !(*am == '-' || (*am >= '0' && *am <= '9')))
            am++;
        char *end;
        adamw[k] = strtod(am, &end);
        am = end;
    }
    int n = 0;
    double worst_l = 0;
    for (char *line = log, *nl; line && *line; line = nl ? nl + 1 : NULL) {
        nl = strchr(line, '\n');
        long long s;
        double loss;
        if (sscanf(line, "step %lld loss %lf", &s, &loss) != 2 || s < 1 || s > 10)
            continue;
        n++;
        if (s == 1 && !(fabs(loss - loss0) / loss0 <= tol_loss0))
            fail("the first loss %.7f differs from PEFT's %.9f", loss, loss0);
        double e = fabs(loss - adamw[s - 1]) / adamw[s - 1];
        worst_l = fmax(worst_l, e);
        if (!(e <= tol))
            fail("step %lld: loss %.7f differs from PEFT's %.9f by %.3g", s, loss, adamw[s - 1], e);
    }
    if (n != 10)
        fail("%d step losses in the log, not 10", n);
    printf("lora_check: 10 AdamW losses, worst relative error %.3g (last %.7f)\n", worst_l,
           adamw[9]);
    free(log);
    sbpio_st_close(ad);
    sbpio_st_close(ref);
    sbpio_st_close(gr);
    printf("lora_check: %s\n", failures ? "FAILED" : "ok");
    return failures ? 1 : 0;
}
