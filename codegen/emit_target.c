/* emit_target.c — the target-specific pieces of the emitted step (see emit_target.h).
 *
 * CUDA target. The step runs on the CUDA backend of libsbprt (runtime/cuda): every tensor
 * argument is a device pointer, and every call queues work on the context's one stream. The
 * caller's memory (parameters, gradients, workspace, input_ids, labels) is device memory
 * already (codegen/sbp_step.h); what the step itself owns are the constants (RoPE tables,
 * position ids): emit_c.c prints them as host arrays as for the CPU, and this file adds one
 * device block holding a copy of each at a 256-byte aligned offset, uploaded once by
 * sbp_step_init (sbp_step_run calls it on its first run) and freed by sbp_step_release. The
 * block functions name constants as the CPU code does; a macro per constant, defined after
 * the upload code, makes each name mean its device copy.
 *
 * Counting the scored positions (the SFT mean's divisor, and args->n_scored): the labels are
 * in device memory, and the runtime has no counting kernel, so the step copies them to a host
 * buffer (B*T int32: 256 KiB at 64k tokens, negligible next to a step) and counts there, only
 * when the count is needed (no caller denominator, or n_scored asked for).
 *
 * Errors: every runtime call is checked (TRY), and the step ends with sbprt_sync, so an
 * index out of range found by a kernel, or a fault, is the step's status; the runtime's
 * sbprt_ctx_last_error(ctx) then says what failed.
 */
#include "emit_target.h"

#include <stdlib.h>
#include <string.h>

#define CONST_ALIGN 256 /* bytes: cudaMalloc's alignment, so every copy is as aligned */

const char *sbp_codegen_target_name(const sbp_codegen_options *o)
{
    return sbp_codegen_target_cuda(o) ? "cuda" : "cpu";
}

bool sbp_codegen_target_cuda(const sbp_codegen_options *o)
{
    return o && o->target && strcmp(o->target, "cuda") == 0;
}

/* The constants emit_c.c prints: CONST buffers that some instruction uses (all of them if
 * the use set cannot be built, as emit_c.c does). */
static bool *const_used(const sbp_train_program *p)
{
    bool *used = calloc((size_t)p->n_bufs + 1, sizeof *used);
    for (int bi = 0; used && bi < p->n_blocks; bi++)
        for (int i = 0; i < p->blocks[bi]->n_insts; i++)
            for (int j = 0; j < TP_MAX_BUFS; j++)
                if (p->blocks[bi]->insts[i].buf[j] >= 0)
                    used[p->blocks[bi]->insts[i].buf[j]] = true;
    return used;
}

static bool is_emitted_const(const sbp_train_program *p, const bool *used, int i)
{
    return p->bufs[i]->kind == TP_BUF_CONST && (!used || used[i]);
}

static size_t const_bytes(const tp_buf *b) { return (b->numel ? b->numel : 1) * 4; }

static size_t align_up(size_t n) { return (n + CONST_ALIGN - 1) / CONST_ALIGN * CONST_ALIGN; }

/* Bytes of the device block holding every constant. */
static size_t device_const_bytes(const sbp_train_program *p, const bool *used)
{
    size_t off = 0;
    for (int i = 0; i < p->n_bufs; i++)
        if (is_emitted_const(p, used, i))
            off = align_up(off) + const_bytes(p->bufs[i]);
    return off;
}

void sbp_emit_target_comment(const sbp_train_program *p, const sbp_codegen_options *o, FILE *f)
{
    if (!sbp_codegen_target_cuda(o))
        return;
    bool *used = const_used(p);
    fprintf(f,
            " * Target cuda (runtime/cuda): every tensor is device memory (the parameter,\n"
            " * gradient and workspace blocks, input_ids and labels: codegen/sbp_step.h) and every\n"
            " * call queues work on the context's one stream. The constants are uploaded once to a\n"
            " * device block of %zu bytes (sbp_step_init). Every runtime call's status is checked;\n"
            " * the step ends with sbprt_sync and returns its status (an index out of range met by\n"
            " * a kernel, a fault), with the runtime's diagnostic in sbprt_ctx_last_error(ctx).\n",
            device_const_bytes(p, used));
    free(used);
}

static void emit_init_release_cpu(FILE *f)
{
    fputs("\n/* ---------------------------------------------------------------- init */\n"
          "\n/* Nothing to prepare on the CPU target: the constants above are read in place. */\n"
          "int sbp_step_init(sbprt_ctx *ctx) { return ctx ? SBPRT_OK : SBPRT_ERR_INVALID; }\n"
          "\nvoid sbp_step_release(sbprt_ctx *ctx) { (void)ctx; }\n",
          f);
}

void sbp_emit_target_constants(const sbp_train_program *p, const sbp_codegen_options *o,
                               FILE *f)
{
    if (!sbp_codegen_target_cuda(o)) {
        emit_init_release_cpu(f);
        return;
    }
    bool *used = const_used(p);
    int n = 0;
    for (int i = 0; i < p->n_bufs; i++)
        n += is_emitted_const(p, used, i);
    size_t total = device_const_bytes(p, used);
    fputs("\n/* ---------------------------------------------------------------- "
          "constants on the device */\n",
          f);
    fprintf(f,
            "\n/* The kernels read device copies of the constants above: one device block of\n"
            " * SBP_CONST_BYTES, each constant at a 256-byte aligned offset, uploaded by\n"
            " * sbp_step_init (sbp_step_run calls it on its first run; a program may call it\n"
            " * first, e.g. before timing) and freed by sbp_step_release. It is allocated on the\n"
            " * device current at that time, through the runtime (sbprt_arena_alloc); a process\n"
            " * that runs this step on several devices or threads at once must not. */\n"
            "#define SBP_CONST_BYTES ((size_t)%zu)\n"
            "static unsigned char *sbp_const_dev; /* the device block, NULL before "
            "sbp_step_init */\n",
            total);
    if (n > 0) {
        fprintf(f,
                "\n/* host array, byte offset in the device block, bytes */\n"
                "static const struct {\n"
                "    const void *host;\n"
                "    size_t offset, bytes;\n"
                "} sbp_const_table[%d] = {\n",
                n);
        size_t off = 0;
        for (int i = 0; i < p->n_bufs; i++) {
            if (!is_emitted_const(p, used, i))
                continue;
            off = align_up(off);
            fprintf(f, "    {%s, %zu, %zu},\n", p->bufs[i]->name, off, const_bytes(p->bufs[i]));
            off += const_bytes(p->bufs[i]);
        }
        fputs("};\n", f);
    }
    fputs("\nint sbp_step_init(sbprt_ctx *ctx)\n"
          "{\n"
          "    if (!ctx)\n"
          "        return SBPRT_ERR_INVALID;\n"
          "    if (sbp_const_dev || SBP_CONST_BYTES == 0)\n"
          "        return SBPRT_OK;\n"
          "    void *dev = NULL;\n"
          "    TRY(sbprt_arena_alloc(ctx, &dev, SBP_CONST_BYTES));\n",
          f);
    if (n > 0)
        fprintf(f,
                "    for (int i = 0; i < %d; i++) {\n"
                "        int rc = sbprt_memcpy(ctx, (unsigned char *)dev + "
                "sbp_const_table[i].offset,\n"
                "                              sbp_const_table[i].host, "
                "sbp_const_table[i].bytes,\n"
                "                              SBPRT_COPY_HOST_TO_DEVICE);\n"
                "        if (rc != SBPRT_OK) {\n"
                "            sbprt_arena_free(ctx, dev);\n"
                "            return rc;\n"
                "        }\n"
                "    }\n",
                n);
    fputs("    sbp_const_dev = (unsigned char *)dev;\n"
          "    return SBPRT_OK;\n"
          "}\n"
          "\nvoid sbp_step_release(sbprt_ctx *ctx)\n"
          "{\n"
          "    if (ctx && sbp_const_dev) {\n"
          "        sbprt_arena_free(ctx, sbp_const_dev);\n"
          "        sbp_const_dev = NULL;\n"
          "    }\n"
          "}\n",
          f);
    if (n > 0) {
        fputs("\n/* From here on a constant's name means its device copy. */\n", f);
        size_t off = 0;
        for (int i = 0; i < p->n_bufs; i++) {
            if (!is_emitted_const(p, used, i))
                continue;
            const tp_buf *b = p->bufs[i];
            off = align_up(off);
            fprintf(f, "#define %s ((const %s *)(sbp_const_dev + %zu))\n", b->name,
                    b->is_int ? "int32_t" : "float", off);
            off += const_bytes(b);
        }
    }
    free(used);
}

void sbp_emit_target_run_start(const sbp_train_program *p, const sbp_codegen_options *o,
                               size_t bt, FILE *f)
{
    if (!sbp_codegen_target_cuda(o))
        return;
    fputs("    TRY(sbp_step_init(ctx)); /* the first run uploads the constants */\n", f);
    if (o->tf32) /* a context setting: each entry point sets it on the context it is given */
        fputs("    TRY(sbprt_ctx_set_tf32(ctx, 1)); /* sbpc --tf32: TF32 GEMMs */\n", f);
    fputs("\n"
          "    /* The labels are device memory: the scored positions are counted on a host copy,\n"
          "     * made only when the count is needed. */\n"
          "    int64_t n_scored = 0;\n",
          f);
    fprintf(f,
            "    if (%s) {\n"
            "        int32_t *host_labels = malloc(sizeof(int32_t) * %zu);\n"
            "        if (!host_labels)\n"
            "            return SBPRT_ERR_NOMEM;\n"
            "        int rc = sbprt_memcpy(ctx, host_labels, labels, sizeof(int32_t) * %zu,\n"
            "                              SBPRT_COPY_DEVICE_TO_HOST);\n"
            "        for (size_t i = 0; rc == SBPRT_OK && i < %zu; i++)\n"
            "            n_scored += host_labels[i] != SBPRT_IGNORE_INDEX;\n"
            "        free(host_labels);\n"
            "        TRY(rc);\n"
            "    }\n"
            "    if (args->n_scored)\n"
            "        *args->n_scored = n_scored;\n",
            p->loss_is_mean ? "args->n_scored || args->denominator <= 0" : "args->n_scored", bt,
            bt, bt);
}

void sbp_emit_target_run_end(const sbp_train_program *p, const sbp_codegen_options *o, FILE *f)
{
    (void)p;
    if (!sbp_codegen_target_cuda(o))
        return;
    fputs("\n    /* Wait for the queued work: an index out of range met by a kernel, or a fault,\n"
          "     * is this status (sbprt_ctx_last_error(ctx) says more). */\n"
          "    TRY(sbprt_sync(ctx));\n",
          f);
}
