/* train_pretrained.c — the model folder of train_pretrained.h: the recorded config files, the
 * weights through train_export, the tokenizer's files copied. Every file is written atomically
 * (ir/files.h); the folder itself is made only when the first file is written. */
#include "train_pretrained.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"
#include "files.h"
#include "sbpio.h"

/* The files of a tokenizer folder that from_pretrained reads (fast and slow tokenizers). */
static const char *const tokenizer_files[] = {
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
    "chat_template.jinja", "chat_template.json", "tokenizer.model", "vocab.json", "merges.txt",
    "vocab.txt", "spiece.model"};
enum { N_TOKENIZER_FILES = sizeof tokenizer_files / sizeof tokenizer_files[0] };

static char *join(const char *dir, const char *name)
{
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = malloc(n);
    if (p)
        snprintf(p, n, "%s/%s", dir, name);
    return p;
}

int train_pretrained_plan(train_pretrained *p, const train_pretrained_opts *o,
                          const char *model_path, char *err, size_t errlen)
{
    memset(p, 0, sizeof *p);
    sbpio_kv *kv = NULL;
    int n = 0;
    char why[600];
    if (sbpio_onnx_meta_read(model_path, &kv, &n, why, sizeof why) != SBPIO_OK)
        return cli_errf(err, errlen, "--save-pretrained: %s", why);
    const char *cfg = sbpio_onnx_meta_get(kv, n, "sbp.config.json");
    const char *gen = sbpio_onnx_meta_get(kv, n, "sbp.generation_config.json");
    if (cfg)
        p->config = strdup(cfg);
    if (gen)
        p->generation = strdup(gen);
    sbpio_onnx_meta_free(kv, n);
    if (!cfg)
        return cli_errf(err, errlen, "--save-pretrained: %s records no config.json (metadata "
                        "'sbp.config.json'): export the model with sbp-export, which keeps it",
                        model_path);
    if (!p->config || (gen && !p->generation))
        return cli_errf(err, errlen, "out of memory");
    p->names[p->n_names++] = "config.json";
    if (p->generation)
        p->names[p->n_names++] = "generation_config.json";
    p->names[p->n_names++] = "model.safetensors";
    if (!o->tokenizer)
        return 0;
    struct stat st;
    if (stat(o->tokenizer, &st) != 0 || !S_ISDIR(st.st_mode))
        return cli_errf(err, errlen, "--tokenizer: %s is not a directory", o->tokenizer);
    bool config = false;
    for (int i = 0; i < N_TOKENIZER_FILES; i++) {
        char *path = join(o->tokenizer, tokenizer_files[i]);
        if (!path)
            return cli_errf(err, errlen, "out of memory");
        bool here = stat(path, &st) == 0 && S_ISREG(st.st_mode);
        free(path);
        if (!here)
            continue;
        p->tok_files[p->n_tok++] = tokenizer_files[i];
        p->names[p->n_names++] = tokenizer_files[i];
        config |= strcmp(tokenizer_files[i], "tokenizer_config.json") == 0 ||
                  strcmp(tokenizer_files[i], "tokenizer.json") == 0;
    }
    if (!config)
        return cli_errf(err, errlen, "--tokenizer: %s holds neither tokenizer.json nor "
                        "tokenizer_config.json: not a tokenizer folder", o->tokenizer);
    return 0;
}

/* text into dir/name, atomically */
static int write_text(const char *dir, const char *name, const char *text, char *err,
                      size_t errlen)
{
    char *path = join(dir, name);
    if (!path)
        return cli_errf(err, errlen, "out of memory");
    sbp_atomic a;
    int rc = 0;
    if (sbp_atomic_begin(&a, path, err, errlen) != SBP_FILE_OK) {
        rc = -1;
    } else if (fwrite(text, 1, strlen(text), a.f) != strlen(text)) {
        sbp_atomic_abort(&a);
        rc = cli_errf(err, errlen, "%s: write error", path);
    } else if (sbp_atomic_commit(&a, err, errlen) != SBP_FILE_OK) {
        rc = -1;
    }
    free(path);
    return rc;
}

/* src into dir/name, atomically, in pieces */
static int copy_file(const char *src, const char *dir, const char *name, char *err,
                     size_t errlen)
{
    char why[600];
    FILE *in = sbp_file_fopen_input(src, NULL, why, sizeof why);
    if (!in)
        return cli_errf(err, errlen, "--tokenizer: %s", why);
    char *path = join(dir, name);
    sbp_atomic a;
    int rc = 0;
    if (!path) {
        rc = cli_errf(err, errlen, "out of memory");
    } else if (sbp_atomic_begin(&a, path, err, errlen) != SBP_FILE_OK) {
        rc = -1;
    } else {
        char buf[1 << 16];
        size_t got;
        while (rc == 0 && (got = fread(buf, 1, sizeof buf, in)) > 0)
            if (fwrite(buf, 1, got, a.f) != got)
                rc = cli_errf(err, errlen, "%s: write error", path);
        if (rc == 0 && ferror(in))
            rc = cli_errf(err, errlen, "--tokenizer: %s: read error", src);
        if (rc)
            sbp_atomic_abort(&a);
        else if (sbp_atomic_commit(&a, err, errlen) != SBP_FILE_OK)
            rc = -1;
    }
    free(path);
    fclose(in);
    return rc;
}

int train_pretrained_write(const train_pretrained *p, const train_pretrained_opts *o,
                           const train_export *x, const sbp_step_info *in, const float *params,
                           const train_adapter_merge_plan *merge, char *err, size_t errlen)
{
    struct stat st;
    if (stat(o->dir, &st) != 0 && mkdir(o->dir, 0777) != 0)
        return cli_errf(err, errlen, "--save-pretrained: cannot make the directory %s: %s",
                        o->dir, strerror(errno));
    char why[1024];
    char *weights = join(o->dir, "model.safetensors");
    if (!weights)
        return cli_errf(err, errlen, "out of memory");
    int rc = train_export_write_lora(x, in, params, merge, weights, why, sizeof why);
    free(weights);
    if (rc)
        return cli_errf(err, errlen, "--save-pretrained: %s", why);
    if (write_text(o->dir, "config.json", p->config, why, sizeof why) ||
        (p->generation &&
         write_text(o->dir, "generation_config.json", p->generation, why, sizeof why)))
        return cli_errf(err, errlen, "--save-pretrained: %s", why);
    for (int i = 0; i < p->n_tok; i++) {
        char *src = join(o->tokenizer, p->tok_files[i]);
        if (!src)
            return cli_errf(err, errlen, "out of memory");
        rc = copy_file(src, o->dir, p->tok_files[i], why, sizeof why);
        free(src);
        if (rc)
            return cli_errf(err, errlen, "--save-pretrained: %s", why);
    }
    return 0;
}

void train_pretrained_free(train_pretrained *p)
{
    if (!p)
        return;
    free(p->config);
    free(p->generation);
    memset(p, 0, sizeof *p);
}

const char *train_pretrained_usage(void)
{
    return "a model folder for transformers:\n"
           "  --save-pretrained DIR   write DIR/config.json (and generation_config.json) as\n"
           "                          sbp-export recorded them in the model, and the trained\n"
           "                          weights as DIR/model.safetensors under transformers'\n"
           "                          names, so that AutoModelForCausalLM.from_pretrained(DIR)\n"
           "                          loads them (a LoRA step: with --merge-lora, the merged\n"
           "                          model)\n"
           "  --tokenizer TOKDIR      with --save-pretrained: copy the tokenizer's files into\n"
           "                          DIR, for AutoTokenizer.from_pretrained(DIR)\n";
}
