/* train_adapter.c — LoRA adapters in sbp-train: initial values and PEFT's adapter directory
 * (train_adapter.h).
 *
 * The adapters are told from the base weights by name (ir_lora_kind), the only thing the step's
 * table carries; their module is the name less its `.lora_A.weight` suffix. Writing reuses
 * sbpio's atomic safetensors writer (as --save-safetensors does) and ir/files.h's atomic file
 * for the JSON.
 */
#include "train_adapter.h"

#include "files.h"
#include "sbpio.h"
#include "torch.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static int fail(char *err, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(char *err, size_t n, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, n, fmt, ap);
    va_end(ap);
    return -1;
}

void train_adapter_opts_init(train_adapter_opts *o)
{
    *o = (train_adapter_opts){.alpha = 8.0, .seed = 0};
}

int train_adapter_parse(train_adapter_opts *o, cli *c, int val, int base, const char *v)
{
    switch (val - base) {
    case 0:
        return cli_path(c, "--save-adapter", v, &o->save_dir);
    case 1:
        o->given = "--lora-alpha";
        if (cli_real(c, "--lora-alpha", v, &o->alpha))
            return -1;
        if (!(o->alpha > 0 && o->alpha < 1e30))
            return cli_error(c, "--lora-alpha must be a positive number, not '%s'", v);
        return 0;
    default:
        o->given = "--lora-seed";
        return cli_count(c, "--lora-seed", v, 0, INT64_MAX, &o->seed);
    }
}

const char *train_adapter_usage(void)
{
    return "LoRA steps (sbpc --lora; only the adapters train):\n"
           "  --save-adapter DIR      write the trained adapters as PEFT does: DIR/adapter_model\n"
           "                          .safetensors and DIR/adapter_config.json (peft.PeftModel\n"
           "                          .from_pretrained(model, DIR) loads them)\n"
           "  --lora-alpha A          the step's sbpc --lora-alpha, for adapter_config.json\n"
           "                          (default 8, sbpc's)\n"
           "  --lora-seed S           the step's sbpc --lora-seed: lora_A's initial values\n"
           "                          (default 0, sbpc's)\n";
}

static int count_adapters(const sbp_step_info *in)
{
    int n = 0;
    for (int i = 0; i < in->n_params; i++)
        n += ir_lora_kind(in->params[i].name) != 0;
    return n;
}

int train_adapter_init(ir_graph *g, const sbp_step_info *in, const train_adapter_opts *o,
                       char *err, size_t errlen)
{
    if (count_adapters(in) == 0) {
        if (o->save_dir || o->given)
            return fail(err, errlen, "%s: the step has no LoRA adapters (compile it with sbpc "
                        "--lora)", o->save_dir ? "--save-adapter" : o->given);
        return 0;
    }
    int added = 0;
    for (int i = 0; i < in->n_params; i++) {
        const sbp_step_param *p = &in->params[i];
        if (!ir_lora_kind(p->name) || ir_value_find(g, p->name))
            continue; /* a model that holds it (a merged export, say) gives its own values */
        if (p->rank != 2 || p->dims[0] <= 0 || p->dims[1] <= 0)
            return fail(err, errlen, "the step's LoRA adapter '%s' is not a matrix", p->name);
        ir_dim d[2] = {{p->dims[0], NULL}, {p->dims[1], NULL}};
        ir_value *v = ir_value_new(g, p->name, IR_VAL_PARAM, IR_DT_FLOAT, 2, d);
        if (!v || strcmp(v->name, p->name) != 0)
            return fail(err, errlen, "cannot add the LoRA adapter '%s' to the model", p->name);
        v->nbytes = p->numel * sizeof(float);
        if (!(v->data = ir_arena_alloc(g->arena, v->nbytes)))
            return fail(err, errlen, "out of memory");
        ir_lora_init(p->name, (uint64_t)o->seed, p->dims[0], p->dims[1], v->data);
        added++;
    }
    return added;
}

/* s as a JSON string (module paths: no quoting needed in practice, escaped all the same). */
static void json_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\')
            fprintf(f, "\\%c", ch);
        else if (ch < 0x20)
            fprintf(f, "\\u%04x", ch);
        else
            fputc(ch, f);
    }
    fputc('"', f);
}

static int write_config(const char *path, const train_adapter_opts *o, const sbp_step_info *in,
                        int64_t r, char *err, size_t errlen)
{
    sbp_atomic a;
    if (sbp_atomic_begin(&a, path, err, errlen) != SBP_FILE_OK)
        return -1;
    FILE *f = a.f;
    fprintf(f, "{\n  \"peft_type\": \"LORA\",\n  \"task_type\": \"CAUSAL_LM\",\n");
    fprintf(f, "  \"base_model_name_or_path\": null,\n  \"revision\": null,\n");
    fprintf(f, "  \"r\": %lld,\n", (long long)r);
    if (o->alpha == floor(o->alpha) && o->alpha < 1e15)
        fprintf(f, "  \"lora_alpha\": %lld,\n", (long long)o->alpha);
    else
        fprintf(f, "  \"lora_alpha\": %.17g,\n", o->alpha);
    /* the adapted modules by full path: PEFT matches a target by name or dotted suffix, so a
     * full path selects exactly the module sbpc adapted (a short name like "q_proj" would also
     * select the layers a custom --lora-targets left out) */
    fprintf(f, "  \"target_modules\": [");
    int k = 0;
    for (int i = 0; i < in->n_params; i++) {
        const char *name = in->params[i].name;
        if (ir_lora_kind(name) != 'A')
            continue;
        char mod[1024];
        snprintf(mod, sizeof mod, "%.*s", (int)(strlen(name) - strlen(IR_LORA_A_SUFFIX)), name);
        fputs(k++ ? ",\n    " : "\n    ", f);
        json_string(f, mod);
    }
    fprintf(f, "\n  ],\n");
    fprintf(f, "  \"lora_dropout\": 0.0,\n  \"bias\": \"none\",\n  \"fan_in_fan_out\": false,\n"
               "  \"modules_to_save\": null,\n  \"init_lora_weights\": true,\n"
               "  \"use_rslora\": false,\n  \"use_dora\": false,\n  \"inference_mode\": true\n}\n");
    if (ferror(f)) {
        sbp_atomic_abort(&a);
        return fail(err, errlen, "%s: write error", path);
    }
    return sbp_atomic_commit(&a, err, errlen) == SBP_FILE_OK ? 0 : -1;
}

int train_adapter_save(const train_adapter_opts *o, const sbp_step_info *in, const float *params,
                       int *n_written, char *err, size_t errlen)
{
    *n_written = 0;
    struct stat st;
    if (stat(o->save_dir, &st) != 0) {
        if (mkdir(o->save_dir, 0777) != 0)
            return fail(err, errlen, "--save-adapter: cannot make the directory %s: %s",
                        o->save_dir, strerror(errno));
    } else if (!S_ISDIR(st.st_mode)) {
        return fail(err, errlen, "--save-adapter: %s exists and is not a directory", o->save_dir);
    }
    int n = count_adapters(in);
    sbpio_st_tensor *ts = calloc((size_t)n + 1, sizeof *ts);
    char **names = calloc((size_t)n + 1, sizeof *names);
    int64_t(*shapes)[2] = calloc((size_t)n + 1, sizeof *shapes);
    int rc = !ts || !names || !shapes ? fail(err, errlen, "out of memory") : 0;
    int k = 0;
    int64_t r = -1;
    for (int i = 0; i < in->n_params && !rc; i++) {
        const sbp_step_param *p = &in->params[i];
        int kind = ir_lora_kind(p->name);
        if (!kind)
            continue;
        int64_t pr = kind == 'A' ? p->dims[0] : p->dims[1];
        if (r >= 0 && pr != r) {
            rc = fail(err, errlen, "--save-adapter: the adapters have different ranks (%lld "
                      "and %lld, '%s'): PEFT's config has one r", (long long)r, (long long)pr,
                      p->name);
            break;
        }
        r = pr;
        size_t len = strlen(p->name) + sizeof "base_model.model.";
        if (!(names[k] = malloc(len))) {
            rc = fail(err, errlen, "out of memory");
            break;
        }
        snprintf(names[k], len, "base_model.model.%s", p->name);
        shapes[k][0] = p->dims[0];
        shapes[k][1] = p->dims[1];
        ts[k] = (sbpio_st_tensor){.name = names[k], .dtype = SBPIO_DT_F32, .rank = 2,
                                  .shape = shapes[k], .data = params + p->offset};
        k++;
    }
    char path[4096];
    sbpio_kv meta[] = {{"format", "pt"}, {"producer", "sbp-train --save-adapter"}};
    if (!rc) {
        snprintf(path, sizeof path, "%s/adapter_model.safetensors", o->save_dir);
        if (sbpio_st_write(path, k, ts, 2, meta, true, err, errlen) != SBPIO_OK)
            rc = -1;
    }
    if (!rc) {
        snprintf(path, sizeof path, "%s/adapter_config.json", o->save_dir);
        rc = write_config(path, o, in, r, err, errlen);
    }
    if (!rc)
        *n_written = k;
    for (int i = 0; names && i < k; i++)
        free(names[i]);
    free(names);
    free(shapes);
    free(ts);
    return rc;
}
