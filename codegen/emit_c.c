/* emit_c.c — prints a training program as C.
 *
 * The file is laid out top-down the way a reader meets it: the header comment (model, dims,
 * memory), the constants, the parameter table and sbp_step_get_info(), the workspace offsets,
 * one static function per program block, and sbp_step_run() calling the blocks in order.
 * Inside a block function, the buffers it touches are declared first (each with its shape),
 * then the runtime calls, grouped per IR node under a comment naming the node, the phase
 * (forward / recompute / gradient) and the ONNX nodes it came from. A call is printed from the
 * kernel's template in passes/train/train_kernels.def.
 */
#include "codegen.h"
#include "emit_objective.h"
#include "emit_target.h"
#include "memplan.h"

#include <ctype.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#ifndef SBP_VERSION
#define SBP_VERSION "?"
#endif

/* ------------------------------------------------------------------ small printers */

/* Text inside a C comment (node and weight names come from the model): neither a comment
 * terminator nor a comment opener, since C compilers warn about every "/" "*" inside a comment
 * (-Wcomment); no control characters. A space goes between the two characters of either pair.
 * Every caller prints a space, ',' '.' or '(' on both sides of the text, so it cannot pair with
 * what surrounds it. */
static void put_comment_text(FILE *f, const char *s)
{
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if ((c == '*' && s[1] == '/') || (c == '/' && s[1] == '*')) {
            fputc(c, f);
            fputc(' ', f);
        } else if (c < 0x20 || c == 0x7f) {
            fputc('?', f);
        } else {
            fputc(c, f);
        }
    }
}

/* A C string literal. */
static void put_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (; s && *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c == '?')
            fputs("\\?", f); /* never a trigraph */
        else if (c < 0x20 || c >= 0x7f)
            fprintf(f, "\\%03o", c);
        else
            fputc(c, f);
    }
    fputc('"', f);
}

/* A float literal that reads back as the same float. */
static void put_float(FILE *f, double x)
{
    float v = (float)x;
    if (isnan(v)) {
        fputs("NAN", f);
        return;
    }
    if (isinf(v)) {
        fputs(v < 0 ? "-INFINITY" : "INFINITY", f);
        return;
    }
    char buf[48];
    snprintf(buf, sizeof buf, "%.9g", (double)v);
    if (!strpbrk(buf, ".e"))
        strcat(buf, ".0");
    fprintf(f, "%sf", buf);
}

static void put_dims(FILE *f, const tp_buf *b, bool stored)
{
    fputc('[', f);
    for (int i = 0; i < b->rank; i++) {
        int k = i;
        if (stored && b->swapped && b->rank == 4 && (i == 1 || i == 2))
            k = 3 - i;
        fprintf(f, "%s%lld", i ? "," : "", (long long)b->dims[k]);
    }
    fputc(']', f);
}

/* "f32[2,64,16]"; a buffer stored with axes 1 and 2 exchanged adds its stored order. */
static void put_type(FILE *f, const tp_buf *b)
{
    fputs(b->is_int ? "i32" : b->bf16 ? "bf16" : "f32", f);
    put_dims(f, b, false);
    if (b->swapped) {
        fputs(" stored as ", f);
        put_dims(f, b, true);
    }
}

/* The prefix of a program's macros: "" (training), "EVAL_" (evaluation) or "LOGP_" (the
 * log-probabilities), each program having its own plan in the same file. */
static const char *plan_prefix(const sbp_train_program *p)
{
    return p->logp_only ? "LOGP_" : p->forward_only ? "EVAL_" : "";
}

/* A workspace buffer's offset macro: WS_name, EVAL_WS_name, LOGP_WS_name. */
static const char *ws_macro(const sbp_train_program *p, const tp_buf *b)
{
    static char buf[170];
    snprintf(buf, sizeof buf, "%sWS_%s", plan_prefix(p), b->name);
    return buf;
}

/* The bf16 copy of the parameters' offset macro, per program. */
static const char *shadow_macro(const sbp_train_program *p)
{
    static char buf[64];
    snprintf(buf, sizeof buf, "%sSBP_BF16_SHADOW", plan_prefix(p));
    return buf;
}

/* ------------------------------------------------------------------ fingerprint */

static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
    const unsigned char *s = p;
    for (size_t i = 0; i < n; i++) {
        h ^= s[i];
        h *= 1099511628211ull;
    }
    return h;
}

uint64_t sbp_codegen_fingerprint(const sbp_train_program *p)
{
    uint64_t h = 14695981039346656037ull;
    for (int i = 0; i < p->n_params; i++) {
        const ir_value *v = p->params[i].value;
        h = fnv(h, v->name, strlen(v->name) + 1);
        unsigned char b[2] = {(unsigned char)v->dtype, (unsigned char)v->rank};
        h = fnv(h, b, 2);
        for (int k = 0; k < v->rank; k++) {
            uint64_t d = (uint64_t)v->dims[k].value;
            unsigned char le[8];
            for (int j = 0; j < 8; j++)
                le[j] = (unsigned char)(d >> (8 * j));
            h = fnv(h, le, 8);
        }
    }
    return h;
}

/* ------------------------------------------------------------------ pieces of the .c */

static void emit_header_comment(const sbp_train_program *p, const sbp_codegen_options *o,
                                FILE *f, const char *cname)
{
    fprintf(f, "/* %s — a training step compiled by sbpc %s; regenerate rather than edit.\n",
            cname, SBP_VERSION);
    fputs(" *\n * model       ", f);
    put_comment_text(f, o->model_path ? o->model_path : "?");
    fprintf(f, "\n * step        B = %lld, T = %lld, V = %lld; objective %s%s; strategy %s\n",
            (long long)p->batch, (long long)p->seq_len, (long long)p->vocab,
            sbp_objective_name(p->objective), p->per_document ? " per document" : "",
            sbp_strategy_name(p->strategy));
    int trainable = 0;
    for (int i = 0; i < p->n_params; i++)
        trainable += p->params[i].trainable && p->params[i].tied_to < 0;
    fprintf(f, " * parameters  %d tensors (%d trained), %zu floats in the parameter block, %zu in "
               "the gradient block\n",
            p->n_params, trainable, p->param_elems, p->grad_elems);
    fprintf(f, " * workspace   %zu bytes, liveness-planned (passes/train/plan.c): buffers\n"
               " *             that are never live at the same time share addresses\n",
            p->workspace_bytes);
    fprintf(f, " * segments   ");
    for (int s = 0; s < p->n_segments; s++)
        fprintf(f, " %s", p->segments[s].name);
    fputs("\n *\n"
          " * The interface is codegen/sbp_step.h. Every call is a libsbprt kernel\n"
          " * (runtime/sbprt.h): forward kernels write their outputs, backward kernels add into\n"
          " * their gradient buffers, which are zeroed before the first contribution. Buffers\n"
          " * are named after the ONNX values they hold: w_ parameters, dw_ their gradients\n"
          " * (parameter and gradient blocks), a_ activations, d_ activation gradients, s_ saved\n"
          " * statistics and scratch (workspace), c_ constants.\n",
          f);
    if (p->strategy == SBP_STRATEGY_CHECKPOINT)
        fputs(" * Checkpointing: only values crossing a segment boundary persist; the rest of a\n"
              " * segment is dead after its forward (its bytes are reused), and a segment's\n"
              " * backward first recomputes the forward values its gradient rules read.\n",
              f);
    if (p->strategy == SBP_STRATEGY_STREAM)
        fprintf(f,
                " * StreamBP: only the residual stream between layers persists. Each layer runs\n"
                " * its K/V path once on the whole sequence and the rest chunk by chunk (%lld\n"
                " * rows of each sequence; attention of a query chunk reads keys 0..end of the\n"
                " * chunk), in the forward and again in the backward, where weight gradients and\n"
                " * dK/dV accumulate over the chunks. The LM head and the loss run over chunks of\n"
                " * %lld token rows, forward and backward fused: the full logits never exist.\n"
                " * Inside a chunk loop, r0 = b * T + t0 is the chunk's first row; operands\n"
                " * holding every token's rows are passed at the chunk's rows.\n",
                (long long)p->chunk, (long long)p->logits_chunk);
    if (p->bf16)
        fputs(" * Precision bf16: the parameters, their gradients and the statistics (norm rstd,\n"
              " * attention lse, the loss sum) are fp32; activations and their gradients are\n"
              " * bf16 (type bf16 above), the kernels computing in fp32 (the *_bf16 functions\n"
              " * of runtime/sbprt.h); the GEMMs read a bf16 copy of the parameters made at the\n"
              " * start of each step (SBP_BF16_SHADOW, in the workspace) and write weight\n"
              " * gradients in fp32 (sbprt_gemm_bf16_f32).\n",
              f);
    sbp_emit_target_comment(p, o, f);
    fputs(" */\n", f);
}

/* used[i]: buffer i is an operand somewhere in the program. */
static bool *used_buffers(const sbp_train_program *p)
{
    bool *used = calloc((size_t)p->n_bufs + 1, sizeof *used);
    for (int bi = 0; used && bi < p->n_blocks; bi++)
        for (int i = 0; i < p->blocks[bi]->n_insts; i++)
            for (int j = 0; j < TP_MAX_BUFS; j++)
                if (p->blocks[bi]->insts[i].buf[j] >= 0)
                    used[p->blocks[bi]->insts[i].buf[j]] = true;
    return used;
}

/* Constants of at least this many bytes go to the blob file when there is one
 * (sbp_codegen_options.blob_min_bytes, 0: this). */
#define BLOB_MIN_BYTES_DEFAULT ((size_t)64 << 10)

/* Appends b's data to the blob (64-byte aligned) and declares it as an assembled-in array. */
static bool emit_blob_constant(const tp_buf *b, const sbp_codegen_options *o, FILE *f)
{
    long pos = ftell(o->blob);
    if (pos < 0)
        return false;
    size_t pad = (size_t)((64 - pos % 64) % 64), bytes = b->numel * 4;
    static const char zeros[64];
    if ((pad && fwrite(zeros, 1, pad, o->blob) != pad) ||
        fwrite(b->data, 1, bytes, o->blob) != bytes)
        return false;
    const char *type = b->is_int ? "int32_t" : "float";
    fprintf(f, " (%zu bytes, from the constants file) */\n"
               "extern const %s %s[%zu] __attribute__((visibility(\"hidden\")));\n"
               "__asm__(\".pushsection .rodata\\n.balign 64\\n.globl %s\\n.hidden %s\\n%s:\\n\"\n"
               "        \".incbin \\\"\" SBP_CONSTS_FILE \"\\\", %zu, %zu\\n.popsection\");\n",
            bytes, type, b->name, b->numel, b->name, b->name, b->name, (size_t)pos + pad, bytes);
    return true;
}

static void emit_constants(const sbp_train_program *p, const sbp_codegen_options *o, FILE *f)
{
    bool any = false;
    bool *used = used_buffers(p);
    const size_t blob_min = o->blob_min_bytes ? o->blob_min_bytes : BLOB_MIN_BYTES_DEFAULT;
    for (int i = 0; i < p->n_bufs; i++) {
        const tp_buf *b = p->bufs[i];
        if (b->kind != TP_BUF_CONST || (used && !used[i]))
            continue;
        if (!any) {
            fputs("\n/* ---------------------------------------------------------------- "
                  "constants */\n",
                  f);
            /* The file is named by a macro so that sbpc can build the .so while the file is
             * still a temporary (codegen/compile.c writes its outputs as a set). */
            if (o->blob)
                fprintf(f, "\n/* The constants file, by absolute path so that this file compiles "
                           "from any folder;\n * -DSBP_CONSTS_FILE='\"...\"' assembles another "
                           "copy in. */\n#ifndef SBP_CONSTS_FILE\n#define SBP_CONSTS_FILE "
                           "\"%s\"\n#endif\n", o->blob_path);
        }
        any = true;
        size_t n = b->numel ? b->numel : 1;
        fprintf(f, "\n/* ");
        put_type(f, b);
        fputs(": ", f);
        put_comment_text(f, b->value ? b->value->name : (b->what ? b->what : ""));
        if (o->blob && b->numel * 4 >= blob_min && emit_blob_constant(b, o, f))
            continue;
        fprintf(f, " */\nstatic const %s %s[%zu] = {", b->is_int ? "int32_t" : "float", b->name,
                n);
        for (size_t k = 0; k < n; k++) {
            fputs(k % 8 ? " " : "\n    ", f);
            if (!b->numel)
                fputs("0", f);
            else if (b->is_int)
                fprintf(f, "%d", (int)((const int32_t *)b->data)[k]);
            else
                put_float(f, ((const float *)b->data)[k]);
            fputc(',', f);
        }
        fputs("\n};\n", f);
    }
    free(used);
}

static void emit_info(const sbp_train_program *p, const sbp_codegen_options *o, FILE *f)
{
    fputs("\n/* ---------------------------------------------------------------- parameters */\n"
          "\n/* name, rank, dims, numel, element offset, trainable, tied_to (the parameter it\n"
          " * is the transpose of: no storage of its own), offset in the gradient block (the\n"
          " * trained parameters only; SIZE_MAX: not trained), storage (1: bf16) */\n",
          f);
    fprintf(f, "static const sbp_step_param step_params[%d] = {\n", p->n_params ? p->n_params : 1);
    for (int i = 0; i < p->n_params; i++) {
        const tp_param *q = &p->params[i];
        const ir_value *v = q->value;
        fputs("    {", f);
        put_string(f, v->name);
        fprintf(f, ", %d, {", v->rank);
        for (int k = 0; k < v->rank; k++)
            fprintf(f, "%s%lld", k ? ", " : "", (long long)v->dims[k].value);
        fprintf(f, "}, %zu, %zu, %d, %d, ", q->numel, q->offset, q->trainable ? 1 : 0,
                q->tied_to);
        if (q->grad_offset == SIZE_MAX)
            fputs("SIZE_MAX", f);
        else
            fprintf(f, "%zu", q->grad_offset);
        fputs(q->stored_bf16 ? ", SBP_STEP_PARAM_BF16},\n" : ", SBP_STEP_PARAM_F32},\n", f);
    }
    if (!p->n_params)
        fputs("    {0},\n", f);
    fputs("};\n", f);
    size_t peak = sbp_train_planned_peak(p);
    fputs("\nstatic const sbp_step_info step_info = {\n"
          "    .abi_version = SBP_STEP_ABI_VERSION,\n",
          f);
    fprintf(f, "    .target = \"%s\",\n", sbp_codegen_target_name(o));
    fprintf(f, "    .strategy = \"%s\",\n    .objective = \"%s\",\n    .model_path = ",
            sbp_strategy_name(p->strategy), sbp_objective_name(p->objective));
    put_string(f, o->model_path ? o->model_path : "");
    fprintf(f,
            ",\n    .model_fingerprint = 0x%016llxull,\n"
            "    .batch = %lld,\n    .seq_len = %lld,\n    .vocab = %lld,\n"
            "    .n_params = %d,\n    .params = step_params,\n"
            "    .param_elems = %zu,\n    .workspace_bytes = %zu,\n"
            "    .planned_peak_bytes = %zu, /* parameters + gradients + workspace */\n"
            "    .grad_elems = %zu, /* the trained parameters' gradients */\n",
            (unsigned long long)sbp_codegen_fingerprint(p), (long long)p->batch,
            (long long)p->seq_len, (long long)p->vocab, p->n_params, p->param_elems,
            p->workspace_bytes, peak, p->grad_elems);
    sbp_emit_objective_info(p, f); /* DPO / GRPO: beta, epsilon, grpo_norm */
    if (p->moe_layers > 0)
        fprintf(f, "    .moe_layers = %d,\n    .moe_experts = %lld,\n"
                   "    .router_aux_coef = %.17g, /* the load-balancing loss's coefficient */\n",
                p->moe_layers, (long long)p->moe_experts, p->moe_aux_coef);
    if (p->packed)
        fputs("    .packed = 1, /* args->doc_ids required */\n", f);
    if (p->g->lora_rank > 0)
        fprintf(f, "    .lora_rank = %lld,\n    .lora_alpha = %.17g,\n    .lora_seed = %lluull,\n",
                (long long)p->g->lora_rank, p->g->lora_alpha,
                (unsigned long long)p->g->lora_seed);
    if (p->eval)
        fprintf(f,
                "    .eval_workspace_bytes = %zu, /* sbp_step_eval's plan */\n"
                "    .eval_planned_peak_bytes = %zu, /* parameters + evaluation workspace */\n",
                p->eval->workspace_bytes, p->param_elems * sizeof(float) +
                p->eval->workspace_bytes);
    if (p->logps)
        fprintf(f,
                "    .logp_workspace_bytes = %zu, /* sbp_step_logps's plan */\n"
                "    .logp_planned_peak_bytes = %zu, /* parameters + log-probability "
                "workspace */\n",
                p->logps->workspace_bytes, p->param_elems * sizeof(float) +
                p->logps->workspace_bytes);
    fprintf(f, "    .offload = \"%s%s%s\",\n", p->n_transfers > 0 ? "checkpoints" : "",
            p->n_transfers > 0 && p->offload_optimizer ? "," : "",
            p->offload_optimizer ? "optimizer" : "");
    if (p->n_transfers > 0)
        fprintf(f,
                "    .host_bytes = %zu, /* the offloaded checkpoints (args->host_workspace) */\n",
                p->host_bytes);
    if (p->grads_on_host)
        fputs("    .grads_on_host = 1, /* args->grads is host memory (sbprt_host_alloc) */\n", f);
    fprintf(f, "    .seq_parallel = %d,%s\n", p->seq_parallel,
            p->seq_parallel >= 1 ? " /* one rank of a group that shares every row: seq_len is "
                                  "its share */"
                                : "");
    fputs("};\n", f);
    fputs("\nconst sbp_step_info *sbp_step_get_info(void) { return &step_info; }\n", f);
}

static const memplan *g_offsets_plan; /* for cmp_offset (qsort has no context) */

static int cmp_offset(const void *pa, const void *pb)
{
    int a = *(const int *)pa, b = *(const int *)pb;
    const sbp_train_program *p = g_offsets_plan->p;
    if (p->bufs[a]->offset != p->bufs[b]->offset)
        return p->bufs[a]->offset < p->bufs[b]->offset ? -1 : 1;
    int fa = g_offsets_plan->lv.hull[a].first, fb = g_offsets_plan->lv.hull[b].first;
    if (fa != fb)
        return fa < fb ? -1 : 1;
    return a < b ? -1 : a > b;
}

/* The workspace offsets from the memory plan, by address, each with its lifetime. */
static void emit_offsets(const sbp_train_program *p, FILE *f)
{
    if (p->logp_only)
        fputs("\n/* ---------------------------------------------------------------- "
              "log-probability workspace */\n"
              "\n/* The log-probability program's own memory plan (sbp_step_logps): the "
              "forward only,\n * ending in each token's label log-probability. By address, as "
              "above. */\n",
              f);
    else if (p->forward_only)
        fputs("\n/* ---------------------------------------------------------------- "
              "evaluation workspace */\n"
              "\n/* The evaluation program's own memory plan (sbp_step_eval): the forward only, "
              "so a\n * layer's input dies once the next layer has read it. By address, as "
              "above. */\n",
              f);
    else
        fputs("\n/* ---------------------------------------------------------------- workspace */\n"
              "\n/* Byte offsets in the workspace, from the memory plan (passes/train/plan.c), by\n"
              " * address. A buffer owns its bytes only while it is live (block:instruction "
              "ranges,\n * instructions counted from 0 in each block function); buffers that are "
              "never live\n * together share addresses. */\n",
              f);
    const memplan *m = memplan_analyze(p);
    int *idx = malloc(sizeof *idx * (size_t)(p->n_bufs + 1));
    int n = 0;
    for (int i = 0; idx && i < p->n_bufs; i++)
        if (p->bufs[i]->kind == TP_BUF_WS && !p->bufs[i]->span)
            idx[n++] = i;
    if (m && idx) {
        g_offsets_plan = m;
        qsort(idx, (size_t)n, sizeof *idx, cmp_offset);
    }
    for (int k = 0; k < n; k++) {
        const tp_buf *b = p->bufs[idx[k]];
        fprintf(f, "#define %-60s %zu /* ", ws_macro(p, b), b->offset);
        put_type(f, b);
        if (m && m->lv.start[idx[k]] == m->lv.start[idx[k] + 1])
            fputs(", never live", f);
        for (int r = m ? m->lv.start[idx[k]] : 0; m && r < m->lv.start[idx[k] + 1]; r++) {
            fputs(r == m->lv.start[idx[k]] ? ", live " : ", ", f);
            put_comment_text(f, memplan_pos_name(m, m->lv.range[r].first));
            fputs("..", f);
            put_comment_text(f, memplan_pos_name(m, m->lv.range[r].last));
        }
        fputs(" */\n", f);
    }
    free(idx);
    for (int i = 0; i < p->n_bufs; i++) {
        const tp_buf *b = p->bufs[i];
        if (b->kind == TP_BUF_WS && b->span) /* the builder's zeroing spans: unused once planned */
            fprintf(f, "#define %-60s 0 /* unused */\n", ws_macro(p, b));
    }
    if (p->bf16)
        fprintf(f,
                "#define %-60s %zu /* bf16[%zu] the parameters' bf16 copy, for the GEMMs; "
                "live the whole step */\n",
                shadow_macro(p), p->bf16_shadow_offset, p->shadow_elems);
    fprintf(f, "/* end of the workspace: %zu bytes", p->workspace_bytes);
    if (m)
        fprintf(f, "; the most bytes live at once: %zu, at %s", m->lower_bound,
                memplan_pos_name(m, m->lower_bound_pos));
    fputs(" */\n", f);
}

/* An operand as C: the buffer, or inside a chunk loop its slice at the chunk. */
/* A bf16 program's GEMM reads a parameter through its bf16 copy (bf16_name); so does the
 * embedding lookup a table kept as bf16 only (base_bf16), in the parameter block. */
static bool reads_bf16_table(const sbp_train_program *p, const tp_inst *in, int j)
{
    return p->bf16 && in->k == TP_K_EMBEDDING_FWD && j == 1 && in->buf[j] >= 0 &&
           p->bufs[in->buf[j]]->kind == TP_BUF_PARAM && p->bufs[in->buf[j]]->stored_bf16;
}

static bool reads_shadow(const sbp_train_program *p, const tp_inst *in, int j)
{
    return (p->bf16 && in->k == TP_K_GEMM && j > 0 && in->buf[j] >= 0 &&
            p->bufs[in->buf[j]]->kind == TP_BUF_PARAM) ||
           reads_bf16_table(p, in, j);
}

static void put_operand(const sbp_train_program *p, FILE *f, const tp_inst *in, int j)
{
    int id = in->buf[j];
    if (id < 0) {
        fputs("NULL", f);
        return;
    }
    const char *pre = reads_shadow(p, in, j) ? "bf16_" : "";
    const tp_off *o = &in->off[j];
    if (!o->per_row && !o->per_batch) {
        fprintf(f, "%s%s", pre, p->bufs[id]->name);
        return;
    }
    fprintf(f, "(%s%s", pre, p->bufs[id]->name);
    if (o->per_row)
        fprintf(f, " + %lld * r0", (long long)o->per_row);
    if (o->per_batch)
        fprintf(f, " + %lld * b", (long long)o->per_batch);
    fputc(')', f);
}

static void put_arg(FILE *f, const tp_arg *a)
{
    switch (a->kind) {
    case TP_ARG_INT: fprintf(f, "%lld", (long long)a->i); break;
    case TP_ARG_FLOAT: put_float(f, a->f); break;
    case TP_ARG_EXPR: fputs(a->expr, f); break;
    case TP_ARG_T0:
        if (a->i)
            fprintf(f, "(int)(t0 + %lld)", (long long)a->i);
        else
            fputs("(int)t0", f);
        break;
    case TP_ARG_INTS:
        if (a->n == 0) { /* a scalar's dims: C has no empty array */
            fputs("NULL", f);
            break;
        }
        fputs("(const int[]){", f);
        for (int i = 0; i < a->n; i++)
            fprintf(f, "%s%lld", i ? ", " : "", (long long)a->ints[i]);
        fputc('}', f);
        break;
    }
}

/* A bf16 program: the byte count of a MEMSET_ZERO / COPY (#0, in fp32 units in the program)
 * as the operands are stored; and the bf16 entry point's name suffix for the others. */
static bool put_bf16_arg(const sbp_train_program *p, FILE *f, const tp_inst *in, int k)
{
    if (!p->bf16 || k != 0 || (in->k != TP_K_MEMSET_ZERO && in->k != TP_K_COPY) ||
        in->arg[0].kind != TP_ARG_INT || in->buf[0] < 0 || !p->bufs[in->buf[0]]->bf16)
        return false;
    fprintf(f, "%lld", (long long)(in->arg[0].i / 4 * 2));
    return true;
}

static const char *bf16_suffix(const sbp_train_program *p, const tp_inst *in)
{
    if (!p->bf16 || in->k == TP_K_MEMSET_ZERO || in->k == TP_K_COPY)
        return "";
    const char *ty = tp_kernel_table[in->k].bf16;
    if (!strpbrk(ty, "bc")) /* no bf16 operand (the document kernels): one form */
        return "";
    if (in->k == TP_K_GEMM && in->buf[0] >= 0 && !p->bufs[in->buf[0]]->bf16)
        return "_bf16_f32"; /* a weight gradient: fp32 C */
    if (reads_bf16_table(p, in, 1))
        return "_bf16_table"; /* a frozen embedding kept as bf16 only */
    return "_bf16";
}

static void put_call(const sbp_train_program *p, FILE *f, const tp_inst *in)
{
    const char *s = tp_kernel_table[in->k].call;
    const char *suffix = bf16_suffix(p, in);
    const char *paren = *suffix ? strchr(s, '(') : NULL;
    for (; *s; s++) {
        if (s == paren)
            fputs(suffix, f);
        if ((*s == '@' || *s == '#') && isdigit((unsigned char)s[1])) {
            /* an index of one or two digits (the exchanging attention has 14 operands) */
            int k = s[1] - '0', len = 1;
            if (isdigit((unsigned char)s[2])) {
                k = k * 10 + (s[2] - '0');
                len = 2;
            }
            if (*s == '@')
                put_operand(p, f, in, k);
            else if (!put_bf16_arg(p, f, in, k))
                put_arg(f, &in->arg[k]);
            s += len;
        } else {
            fputc(*s, f);
        }
    }
}

/* The comment above a node's calls. */
static void put_node_comment(FILE *f, const tp_inst *in, const char *indent)
{
    const ir_node *n = in->node;
    fprintf(f, "\n%s/* ", indent);
    if (!n) {
        put_comment_text(f, in->what ? in->what : "");
        fputs(" */\n", f);
        return;
    }
    fprintf(f, "%s ", ir_op_name(n->op));
    put_comment_text(f, n->name);
    fprintf(f, " (%s)", in->what ? in->what : "");
    if (n->n_origin > 0) {
        fputs(" <- ", f);
        int shown = n->n_origin < 4 ? n->n_origin : 4;
        for (int i = 0; i < shown; i++) {
            if (i)
                fputs(", ", f);
            put_comment_text(f, n->origin[i]);
        }
        if (n->n_origin > shown)
            fprintf(f, " and %d more", n->n_origin - shown);
    }
    fputs(" */\n", f);
}

/* The parameters of every block function, in order; a block that does not use one says so with
 * a (void) cast, so that the emitted C compiles without warnings. */
typedef enum {
    BP_PARAMS,  /* P: the parameter block */
    BP_GRADS,   /* G: the gradient block */
    BP_WS,      /* ws: the workspace */
    BP_IDS,     /* ids: the token ids */
    BP_LABELS,  /* labels */
    BP_SCALE,   /* scale: 1 / the scored positions (an argument expression) */
    BP_ARGS,    /* args: the step's arguments (packed document ids, DPO / GRPO inputs) */
    BP_COUNT
} block_param;

static const char *const block_params[BP_COUNT] = {
    [BP_PARAMS] = "P",   [BP_GRADS] = "G",      [BP_WS] = "ws",     [BP_IDS] = "ids",
    [BP_LABELS] = "labels", [BP_SCALE] = "scale", [BP_ARGS] = "args",
};

/* The header of a chunk loop (the body follows, indented by the returned string): b runs over
 * the sequences, t0 over the chunk starts, r0 = b * seq + t0 is the chunk's first row. */
static const char *put_loop_open(FILE *f, const tp_block *blk, const tp_loop *l)
{
    bool use_b = false, use_r0 = false;
    for (int i = l->first; i < l->end; i++)
        for (int j = 0; j < TP_MAX_BUFS; j++) {
            use_b |= blk->insts[i].off[j].per_batch != 0;
            use_r0 |= blk->insts[i].off[j].per_row != 0;
        }
    fputs("\n    /* chunk loop: ", f);
    put_comment_text(f, l->what ? l->what : "");
    int64_t last = l->begin + (l->stop - l->begin - 1) / l->step * l->step;
    fprintf(f, ": rows [t0, t0 + %lld) of %s, t0 = %lld", (long long)l->len,
            l->batch > 1 ? "each sequence" : "the token rows", (long long)l->begin);
    if (last > l->begin)
        fprintf(f, ", %lld, ..., %lld", (long long)(l->begin + l->step), (long long)last);
    fputs(" */\n", f);
    const char *ind = "        ";
    if (l->batch > 1) {
        fprintf(f, "    for (int64_t b = 0; b < %lld; b++) {\n", (long long)l->batch);
        ind = "            ";
        fprintf(f, "        for (int64_t t0 = %lld; t0 < %lld; t0 += %lld) {\n",
                (long long)l->begin, (long long)l->stop, (long long)l->step);
    } else {
        fprintf(f, "    for (int64_t t0 = %lld; t0 < %lld; t0 += %lld) {\n", (long long)l->begin,
                (long long)l->stop, (long long)l->step);
        if (use_b)
            fprintf(f, "%sconst int64_t b = 0;\n", ind);
    }
    if (use_r0 && l->batch > 1)
        fprintf(f, "%sconst int64_t r0 = b * %lld + t0; /* the chunk's first row */\n", ind,
                (long long)l->seq);
    else if (use_r0)
        fprintf(f, "%sconst int64_t r0 = t0; /* the chunk's first row */\n", ind);
    return ind;
}

/* Whether kernel k's call names its operand j (OFFLOAD_WAIT's and GRAD_WAIT's buffer is there
 * for the memory plan only: the call names the event). */
static bool names_operand(tp_kernel k, int j)
{
    char at[8];
    snprintf(at, sizeof at, "@%d", j);
    return strstr(tp_kernel_table[k].call, at) != NULL;
}

static void emit_block(const sbp_train_program *p, const tp_block *blk, FILE *f)
{
    bool *used = calloc((size_t)p->n_bufs + 1, sizeof *used);
    bool *shadow = p->bf16 ? calloc((size_t)p->n_bufs + 1, sizeof *shadow) : NULL;
    bool uses[BP_COUNT] = {false}; /* by block_param */
    for (int i = 0; i < blk->n_insts; i++) {
        const tp_inst *in = &blk->insts[i];
        for (int j = 0; shadow && j < TP_MAX_BUFS; j++)
            if (reads_shadow(p, in, j)) {
                shadow[in->buf[j]] = true;
                /* the copy is in the workspace; a parameter kept as bf16 is in the block */
                uses[p->bufs[in->buf[j]]->stored_bf16 ? BP_PARAMS : BP_WS] = true;
            }
        uses[BP_ARGS] |= tp_kernel_table[in->k].reads_args; /* DPO / GRPO inputs */
        for (int j = 0; j < TP_MAX_BUFS; j++)
            if (in->buf[j] >= 0 && used && !reads_shadow(p, in, j) && names_operand(in->k, j))
                used[in->buf[j]] = true;
        for (int j = 0; j < tp_kernel_table[in->k].n_arg; j++)
            if (in->arg[j].kind == TP_ARG_EXPR && strcmp(in->arg[j].expr, "scale") == 0)
                uses[BP_SCALE] = true;
    }
    for (int i = 0; i < p->n_bufs; i++) {
        if (!used || !used[i])
            continue;
        switch (p->bufs[i]->kind) {
        case TP_BUF_PARAM: uses[BP_PARAMS] = true; break;
        case TP_BUF_GRAD: uses[BP_GRADS] = true; break;
        case TP_BUF_WS: uses[BP_WS] = true; break;
        case TP_BUF_IDS: uses[BP_IDS] = true; break;
        case TP_BUF_LABELS: uses[BP_LABELS] = true; break;
        case TP_BUF_DOCS: uses[BP_ARGS] = true; break; /* args->doc_ids */
        case TP_BUF_HOST: uses[BP_ARGS] = true; break; /* args->host_workspace */
        default: break;
        }
    }
    fputs("\n/* ", f);
    put_comment_text(f, blk->comment ? blk->comment : blk->name);
    fprintf(f, " */\nstatic int %s(sbprt_ctx *ctx, const float *P, float *G, unsigned char *ws,\n"
               "    const int32_t *ids, const int32_t *labels, float scale,\n"
               "    const sbp_step_args *args)\n{\n",
            blk->name);
    if (blk->n_insts == 0)
        fputs("    (void)ctx;\n", f);
    for (int k = 0; k < BP_COUNT; k++)
        if (!uses[k])
            fprintf(f, "    (void)%s;\n", block_params[k]);
    for (int i = 0; i < p->n_bufs && used; i++) {
        if (!used[i] && !(shadow && shadow[i]))
            continue;
        const tp_buf *b = p->bufs[i];
        switch (used[i] ? b->kind : TP_BUF_CONST) { /* (shadow only: its copy, below) */
        case TP_BUF_PARAM:
            fprintf(f, "    const float *const %s = P + %zu; /* ", b->name, b->offset);
            put_type(f, b);
            fputs(" ", f);
            put_comment_text(f, b->value->name);
            fputs(" */\n", f);
            break;
        case TP_BUF_DOCS:
            fprintf(f, "    const int32_t *const %s = args->doc_ids; /* i32[%zu] document ids */\n",
                    b->name, b->numel);
            break;
        case TP_BUF_HOST:
            fprintf(f, "    unsigned char *const %s = (unsigned char *)args->host_workspace + "
                       "%zu; /* host copy, %zu bytes */\n",
                    b->name, b->offset, b->numel * tp_buf_elem_bytes(b));
            break;
        case TP_BUF_GRAD:
            fprintf(f, "    float *const %s = G + %zu; /* ", b->name, b->offset);
            put_type(f, b);
            fputs(" gradient of ", f);
            put_comment_text(f, b->value->name);
            fputs(" */\n", f);
            break;
        case TP_BUF_WS: {
            const char *ty = b->is_int ? "int32_t" : b->bf16 ? "sbprt_bf16" : "float";
            fprintf(f, "    %s *const %s = (%s *)(ws + %s); /* ", ty, b->name, ty, ws_macro(p, b));
            if (b->span)
                fputs("every gradient buffer of the region", f);
            else
                put_type(f, b);
            if (b->value && !b->span) {
                fputs(b->is_grad ? " gradient of " : " ", f);
                put_comment_text(f, b->value->name);
            } else if (b->what && !b->span) {
                fputs(" ", f);
                put_comment_text(f, b->what);
            }
            fputs(" */\n", f);
            break;
        }
        default: break;
        }
        if (shadow && shadow[i] && b->stored_bf16) /* base_bf16: no fp32 value, no copy */
            fprintf(f,
                    "    const sbprt_bf16 *const bf16_%s = (const sbprt_bf16 *)(P + %zu); /* "
                    "kept as bf16 only */\n",
                    b->name, b->offset);
        else if (shadow && shadow[i])
            fprintf(f,
                    "    const sbprt_bf16 *const bf16_%s = (const sbprt_bf16 *)(ws + "
                    "%s) + %zu; /* its bf16 copy */\n",
                    b->name, shadow_macro(p), b->offset);
    }
    free(shadow);
    const ir_node *prev = NULL;
    const char *prev_what = NULL;
    const char *indent = "    ";
    int li = 0;
    for (int i = 0; i < blk->n_insts; i++) {
        const tp_inst *in = &blk->insts[i];
        const tp_loop *l = li < blk->n_loops ? &blk->loops[li] : NULL;
        if (l && l->first == i) {
            indent = put_loop_open(f, blk, l);
            prev = NULL;
        }
        if (i == 0 || in->node != prev || in->what != prev_what || !in->node)
            put_node_comment(f, in, indent);
        prev = in->node;
        prev_what = in->what;
        fprintf(f, "%sTRY(", indent);
        put_call(p, f, in);
        fputs(");\n", f);
        if (l && l->end == i + 1) {
            fputs(l->batch > 1 ? "        }\n    }\n" : "    }\n", f);
            indent = "    ";
            prev = NULL;
            li++;
        }
    }
    fputs("    return SBPRT_OK;\n}\n", f);
    free(used);
}

static void header_guard(const char *header_name, char *out, size_t n);

/* sbp_step_logps (p->logp_only): the argument checks, the scored positions when asked, the
 * program's blocks, then the outputs from its per-token buffer (obj_logp_outputs,
 * emit_objective.c). */
static void emit_logps_run(const sbp_train_program *p, const sbp_codegen_options *o, FILE *f)
{
    size_t bt = (size_t)(p->batch * p->seq_len);
    fputs("\n/* ---------------------------------------------------------------- "
          "log-probabilities */\n"
          "\n/* Each row's and each token's label log-probability (codegen/sbp_step.h, "
          "sbp_step_logps):\n * the blocks logp_* on the log-probability plan above; no "
          "gradient, no loss. */\n"
          "int sbp_step_logps(sbprt_ctx *ctx, const sbp_step_args *args, float *row_logps,\n"
          "                   float *token_logps)\n{\n"
          "    if (!ctx || !args || !args->params || !args->input_ids ||\n",
          f);
    if (p->packed)
        fputs("        !args->doc_ids || /* a packed step: the document ids */\n", f);
    fputs("        !args->labels || !args->workspace ||\n"
          "        (uintptr_t)args->workspace % SBPRT_ALIGN != 0)\n"
          "        return SBPRT_ERR_INVALID;\n"
          "    const float *P = args->params;\n"
          "    float *G = NULL; /* no gradients */\n"
          "    unsigned char *ws = (unsigned char *)args->workspace;\n"
          "    const int32_t *ids = args->input_ids, *labels = args->labels;\n"
          "    const float scale = 1.0f; /* no loss */\n\n",
          f);
    if (sbp_codegen_target_cuda(o))
        sbp_emit_target_run_start(p, o, bt, f);
    else
        fprintf(f,
                "    if (args->n_scored) {\n"
                "        int64_t n_scored = 0;\n"
                "        for (size_t i = 0; i < %zu; i++)\n"
                "            n_scored += labels[i] != SBPRT_IGNORE_INDEX;\n"
                "        *args->n_scored = n_scored;\n"
                "    }\n",
                bt);
    for (int i = 0; i < p->n_blocks; i++)
        fprintf(f, "    TRY(%s(ctx, P, G, ws, ids, labels, scale, args));\n", p->blocks[i]->name);
    fprintf(f, "    TRY(obj_logp_outputs(ctx, args, row_logps, token_logps,\n"
               "                         (const float *)(ws + %s)));\n",
            ws_macro(p, p->bufs[p->tok_logp_buf]));
    sbp_emit_target_run_end(p, o, f);
    fputs("    return SBPRT_OK;\n}\n", f);
}

/* A MoE step's load-balancing term, from the sums its forward accumulated (train.h: moe_*),
 * on the host in double, in expert order: coef * E / R^2 * sum_e c_e P_e, added to the loss. */
static void emit_moe_aux(const sbp_train_program *p, FILE *f)
{
    if (p->moe_stats_buf < 0)
        return;
    fprintf(f,
            "\n    /* the load-balancing loss: E / R^2 sum_e c_e P_e over the %d MoE layers (R = "
            "%.17g rows) */\n"
            "    float moe_sums[%lld];\n"
            "    TRY(sbprt_memcpy(ctx, moe_sums, ws + %s, sizeof moe_sums,\n"
            "                     SBPRT_COPY_DEVICE_TO_HOST));\n"
            "    double aux = 0;\n"
            "    for (int e = 0; e < %lld; e++)\n"
            "        aux += (double)moe_sums[e] * (double)moe_sums[%lld + e];\n"
            "    aux *= %.17g; /* E / R^2 */\n"
            "    *args->loss += %.17g * aux; /* router_aux_coef */\n"
            "    if (args->aux_loss)\n"
            "        *args->aux_loss = aux;\n",
            p->moe_layers, p->moe_aux_rows, (long long)(2 * p->moe_experts),
            ws_macro(p, p->bufs[p->moe_stats_buf]), (long long)p->moe_experts,
            (long long)p->moe_experts,
            (double)p->moe_experts / (p->moe_aux_rows * p->moe_aux_rows), p->moe_aux_coef);
}

/* sbp_step_run, or for the evaluation program (p->forward_only) sbp_step_eval: the same
 * checks, scored-position count and mean's divisor, then the program's blocks and the loss. */
static void emit_run(const sbp_train_program *p, const sbp_codegen_options *o, FILE *f)
{
    char prefix[128];
    header_guard(o->header_name, prefix, sizeof prefix);
    prefix[strlen(prefix) - 2] = 0; /* the guard without its _H */
    size_t bt = (size_t)(p->batch * p->seq_len);
    const bool ev = p->forward_only;
    fputs("\n/* ---------------------------------------------------------------- ", f);
    fputs(ev ? "evaluation */\n" : "the step */\n", f);
    if (ev)
        fputs("\n/* The forward only, with the loss (codegen/sbp_step.h, sbp_step_eval): the "
              "blocks eval_*\n * on the evaluation plan above; no gradient is computed or "
              "written. */\n"
              "int sbp_step_eval(sbprt_ctx *ctx, const sbp_step_args *args)\n{\n"
              "    if (!ctx || !args || !args->params || !args->input_ids ||\n",
              f);
    else
        fputs("\n/* One forward + backward (codegen/sbp_step.h). The scored positions are counted "
              "here,\n * on the host (a CPU step's labels are host memory; a CUDA step counts a "
              "host copy). */\n"
              "int sbp_step_run(sbprt_ctx *ctx, const sbp_step_args *args)\n{\n"
              "    if (!ctx || !args || !args->params || !args->grads || !args->input_ids ||\n",
              f);
    if (p->packed)
        fputs("        !args->doc_ids || /* a packed step: the document ids */\n", f);
    if (p->n_transfers > 0 && !ev)
        fprintf(f, "        !args->host_workspace || /* the offloaded checkpoints: %zu bytes */\n"
                "        (uintptr_t)args->host_workspace %% SBPRT_ALIGN != 0 ||\n",
                p->host_bytes);
    fputs("        !args->labels || !args->workspace || !args->loss ||\n"
          "        (uintptr_t)args->workspace % SBPRT_ALIGN != 0 || args->denominator < 0)\n"
          "        return SBPRT_ERR_INVALID;\n",
          f);
    if (p->seq_parallel >= 1)
        fprintf(f, "    /* one rank of %d that share every row: the mean's divisor is the whole "
                   "rows', and\n     * the attention exchanges heads with the others */\n"
                   "    if (!(args->denominator > 0) || sbprt_ctx_comm_size(ctx) != %d)\n"
                   "        return SBPRT_ERR_INVALID;\n",
                p->seq_parallel, p->seq_parallel);
    fputs("    const float *P = args->params;\n",
          f);
    fputs(ev ? "    float *G = NULL; /* no gradients */\n" : "    float *G = args->grads;\n", f);
    fputs("    unsigned char *ws = (unsigned char *)args->workspace;\n"
          "    const int32_t *ids = args->input_ids, *labels = args->labels;\n\n",
          f);
    sbp_emit_objective_checks(p, f); /* DPO / GRPO: their inputs */
    if (sbp_codegen_target_cuda(o))
        sbp_emit_target_run_start(p, o, bt, f);
    else
        fprintf(f,
                "    int64_t n_scored = 0;\n"
                "    for (size_t i = 0; i < %zu; i++)\n"
                "        n_scored += labels[i] != SBPRT_IGNORE_INDEX;\n"
                "    if (args->n_scored)\n"
                "        *args->n_scored = n_scored;\n",
                bt);
    if (p->loss_is_mean)
        fputs("    /* the mean's divisor: the caller's (gradient accumulation over several\n"
              "     * batches), else this batch's scored positions */\n"
              "    const double denom = args->denominator > 0 ? args->denominator : "
              "(double)n_scored;\n"
              "    const float scale = denom > 0 ? (float)(1.0 / denom) : 0.0f;\n\n",
              f);
    else
        fprintf(f, "    const double denom = 1.0; /* %s */\n"
                   "    const float scale = 1.0f;\n\n",
                p->objective == SBP_OBJECTIVE_DPO || p->objective == SBP_OBJECTIVE_GRPO
                    ? "the loss buffer holds the loss, normalised by its host steps"
                    : "the graph's loss is a sum");
    if (!ev && p->grads_on_host)
        fputs("    /* G is host memory: each gradient is zeroed (or fetched, accumulating) in the\n"
              "     * workspace before its first contribution and sent back after its last */\n",
              f);
    else if (!ev)
        fprintf(f, "    if (!args->accumulate)\n"
                   "        TRY(sbprt_memset_zero(ctx, G, sizeof(float) * %s_GRAD_ELEMS));\n",
                prefix);
    if (p->bf16 && p->shadow_elems == p->param_elems)
        fprintf(f,
                "    /* the GEMMs read the parameters as bf16: this step's copy of them */\n"
                "    TRY(sbprt_convert_f32_to_bf16(ctx, (sbprt_bf16 *)(ws + %s), P,\n"
                "                                  %s_PARAM_ELEMS));\n",
                shadow_macro(p), prefix);
    else if (p->bf16 && p->shadow_elems)
        fprintf(f,
                "    /* the GEMMs read the parameters as bf16: this step's copy of the fp32 ones\n"
                "     * (the block's first %zu floats; the rest is kept as bf16 only) */\n"
                "    TRY(sbprt_convert_f32_to_bf16(ctx, (sbprt_bf16 *)(ws + %s), P, %zu));\n",
                p->shadow_elems, shadow_macro(p), p->shadow_elems);
    for (int i = 0; i < p->n_blocks; i++)
        fprintf(f, "    TRY(%s(ctx, P, G, ws, ids, labels, scale, args));\n", p->blocks[i]->name);
    sbp_emit_target_run_end(p, o, f);
    if (p->loss_buf >= 0) {
        fprintf(f,
                "\n    float loss_sum = 0;\n"
                "    TRY(sbprt_memcpy(ctx, &loss_sum, ws + %s, sizeof loss_sum,\n"
                "                     SBPRT_COPY_DEVICE_TO_HOST));\n"
                "    *args->loss = denom > 0 ? (double)loss_sum / denom : 0.0;\n",
                ws_macro(p, p->bufs[p->loss_buf]));
        emit_moe_aux(p, f);
    }
    fputs("    return SBPRT_OK;\n}\n", f);
}

/* The header's include guard, from its file name: "train_step.h" gives TRAIN_STEP_H (always
 * ending in _H); its stem is the prefix of the header's macros. */
static void header_guard(const char *header_name, char *out, size_t n)
{
    const char *base = strrchr(header_name, '/');
    base = base ? base + 1 : header_name;
    size_t k = 0;
    for (; *base && k + 2 < n; base++)
        out[k++] = isalnum((unsigned char)*base) ? (char)toupper((unsigned char)*base) : '_';
    out[k] = 0;
    if (k == 0 || isdigit((unsigned char)out[0])) {
        memmove(out + 1, out, k + 1);
        out[0] = 'S';
        k++;
    }
    if (k < 2 || strcmp(out + k - 2, "_H") != 0)
        snprintf(out + k, n - k, "_H");
}

static void emit_h(const sbp_train_program *p, const sbp_codegen_options *o, FILE *h)
{
    char guard[128];
    header_guard(o->header_name, guard, sizeof guard);
    const char *base = strrchr(o->header_name, '/');
    base = base ? base + 1 : o->header_name;
    fprintf(h, "/* %s — the training step compiled by sbpc %s from ", base, SBP_VERSION);
    put_comment_text(h, o->model_path ? o->model_path : "?");
    fputs(".\n *\n * The step's interface is codegen/sbp_step.h (sbp_step_get_info, "
          "sbp_step_run); the\n * numbers below repeat what sbp_step_get_info() reports, "
          "for callers that size\n * their buffers at compile time.\n */\n",
          h);
    fprintf(h, "#ifndef %s\n#define %s\n\n#include \"sbp_step.h\"\n\n", guard, guard);
    char px[128];
    snprintf(px, sizeof px, "%s", guard);
    px[strlen(px) - 2] = 0;
    fprintf(h,
            "#define %s_BATCH %lld\n#define %s_SEQ_LEN %lld\n#define %s_VOCAB %lld\n"
            "#define %s_N_PARAMS %d\n"
            "#define %s_PARAM_ELEMS ((size_t)%zu) /* floats: the parameter block */\n"
            "#define %s_GRAD_ELEMS ((size_t)%zu) /* floats: the gradient block (trained "
            "parameters) */\n"
            "#define %s_WORKSPACE_BYTES ((size_t)%zu)\n",
            px, (long long)p->batch, px, (long long)p->seq_len, px, (long long)p->vocab, px,
            p->n_params, px, p->param_elems, px, p->grad_elems, px, p->workspace_bytes);
    if (p->eval)
        fprintf(h, "#define %s_EVAL_WORKSPACE_BYTES ((size_t)%zu) /* sbp_step_eval */\n", px,
                p->eval->workspace_bytes);
    if (p->logps)
        fprintf(h, "#define %s_LOGP_WORKSPACE_BYTES ((size_t)%zu) /* sbp_step_logps */\n", px,
                p->logps->workspace_bytes);
    fputc('\n', h);
    fputs("/* Parameters: index, ONNX initializer name, shape, element offset in the parameter\n"
          " * block (and in the gradient block, gNNN, when trained).\n",
          h);
    for (int i = 0; i < p->n_params; i++) {
        const tp_param *q = &p->params[i];
        char ty[160];
        fprintf(h, " * %4d  ", i);
        put_comment_text(h, q->value->name);
        fprintf(h, "  %s  @%zu", ir_value_type_str(q->value, ty, sizeof ty), q->offset);
        if (q->trainable && q->tied_to < 0 && q->grad_offset != q->offset)
            fprintf(h, "  g%zu", q->grad_offset);
        if (q->tied_to >= 0)
            fprintf(h, "  (transpose of %d, no storage)", q->tied_to);
        else if (!q->trainable)
            fputs(q->stored_bf16 ? "  (frozen, kept as bf16)" : "  (frozen)", h);
        fputc('\n', h);
    }
    fputs(" */\n\n#endif\n", h);
}

int sbp_codegen_emit(const sbp_train_program *p, const sbp_codegen_options *o, FILE *c, FILE *h,
                     ir_diag *d)
{
    if (p->bf16 && !sbp_codegen_target_cuda(o)) /* the CPU runtime's bf16 forms are twins */
        return ir_diag_error(d, "--precision bf16 needs --target cuda");
    const char *hname = o->header_name ? o->header_name : "train_step.h";
    sbp_codegen_options oo = *o;
    oo.header_name = hname;
    char cname[256];
    snprintf(cname, sizeof cname, "%s", hname);
    char *dot = strrchr(cname, '.');
    if (dot && strcmp(dot, ".h") == 0)
        strcpy(dot, ".c");
    const char *base = strrchr(cname, '/');

    emit_header_comment(p, &oo, c, base ? base + 1 : cname);
    fputs("#include ", c);
    put_string(c, hname);
    fputs("\n\n#include <math.h>\n#include <stddef.h>\n#include <stdint.h>\n#include <stdlib.h>\n\n"
          "/* A runtime error ends the step; the caller gets the status. */\n"
          "#define TRY(call)                                                              \\\n"
          "    do {                                                                       \\\n"
          "        int rc_ = (call);                                                      \\\n"
          "        if (rc_ != SBPRT_OK)                                                   \\\n"
          "            return rc_;                                                        \\\n"
          "    } while (0)\n",
          c);
    emit_constants(p, &oo, c);
    if (oo.blob && ferror(oo.blob))
        return ir_diag_error(d, "writing the constants file %s failed", oo.blob_path);
    sbp_emit_target_constants(p, &oo, c); /* CUDA: their device copies; sbp_step_init */
    emit_info(p, &oo, c);
    emit_offsets(p, c);
    sbp_emit_objective_helpers(p, c); /* DPO / GRPO: the host steps */
    fputs("\n/* ---------------------------------------------------------------- blocks */\n", c);
    for (int i = 0; i < p->n_blocks; i++)
        emit_block(p, p->blocks[i], c);
    emit_run(p, &oo, c);
    if (p->eval) { /* sbp_step_eval: its plan, its blocks (constants shared: train_build.c) */
        emit_offsets(p->eval, c);
        for (int i = 0; i < p->eval->n_blocks; i++)
            emit_block(p->eval, p->eval->blocks[i], c);
        emit_run(p->eval, &oo, c);
    }
    if (p->logps) { /* sbp_step_logps: likewise */
        emit_offsets(p->logps, c);
        for (int i = 0; i < p->logps->n_blocks; i++)
            emit_block(p->logps, p->logps->blocks[i], c);
        emit_logps_run(p->logps, &oo, c);
    }
    emit_h(p, &oo, h);
    if (ferror(c) || ferror(h))
        return ir_diag_error(d, "writing the generated code failed");
    return IR_OK;
}
