/* precision.c — the bf16 form of a training program (sbp_train_options.bf16; train.h,
 * "Precision").
 *
 * The program is built in fp32 as always; this pass only decides, per workspace buffer, how it
 * is stored. Every kernel has fixed operand roles in the runtime's bf16 API (runtime/sbprt.h):
 * activations and their gradients are bf16, parameters, parameter gradients, statistics and
 * loss sums fp32 (the BF16 column of train_kernels.def, tp_kernel_bf16_types). A float workspace buffer becomes bf16 when each of its
 * uses is an activation operand; one used anywhere as fp32 (a norm's rstd, attention's lse, the
 * loss sum) stays fp32, and then an activation use of it is an error, since no kernel converts
 * on the fly. A parameter read as a GEMM operand is read through the bf16 copy of the parameter
 * block that the step keeps at the end of the workspace (placed by sbp_train_place_bf16_shadow
 * after the memory plan, so the plan's peak includes it); the emitted step fills it from the
 * fp32 parameters once per step. Byte counts in the program (MEMSET_ZERO, COPY) stay in fp32
 * units, which keeps the planner's full-write test consistent; the emitter halves them.
 * With base_bf16 (sbpc --base-precision bf16) the frozen parameters that only GEMMs and the
 * embedding lookup's table operand read are kept in the parameter block as bf16 and have no
 * fp32 value and no copy (sbp_train_place_base_bf16, before the plan: the copy's size depends
 * on it); the lookup then reads the bf16 table (sbprt_embedding_forward_bf16_table), which
 * gives the rows the fp32 table's lookup rounds to, and what a GEMM reading it sees.
 */
#include "train_internal.h"

#include <stdlib.h>
#include <string.h>

/* The BF16 column of train_kernels.def: one letter per buffer operand, or "" (no bf16 form).
 * A row of another length fails the build here. */
#define K(e, nb, na, roles, bf16, args, call)                                                 \
    _Static_assert(sizeof(bf16) == (nb) + 1 || sizeof(bf16) == 1,                             \
                   "train_kernels.def: the BF16 types of kernel " #e " need one letter per "    \
                   "buffer operand (or none)");
#include "train_kernels.def"
#undef K

const char *tp_kernel_bf16_types(tp_kernel k)
{
    if ((int)k < 0 || k >= TP_K_COUNT || !tp_kernel_table[k].bf16[0])
        return NULL;
    return tp_kernel_table[k].bf16;
}

size_t tp_buf_elem_bytes(const tp_buf *b) { return b && b->bf16 ? 2 : 4; }

static bool candidate(const tp_buf *b) { return b->kind == TP_BUF_WS && !b->is_int && !b->span; }

int sbp_train_mark_bf16(sbp_train_program *p, ir_diag *d)
{
    int errors = 0;
    for (int i = 0; i < p->n_bufs; i++)
        p->bufs[i]->bf16 = candidate(p->bufs[i]);
    /* fp32 uses first: they pin a buffer to fp32; a copy pins both sides together */
    for (bool changed = true; changed;) {
        changed = false;
        for (int bi = 0; bi < p->n_blocks; bi++)
            for (int i = 0; i < p->blocks[bi]->n_insts; i++) {
                const tp_inst *in = &p->blocks[bi]->insts[i];
                const char *ty = tp_kernel_bf16_types(in->k);
                if (!ty)
                    continue;
                for (int j = 0; ty[j] && j < TP_MAX_BUFS; j++) {
                    int b = in->buf[j];
                    if (b < 0 || !p->bufs[b]->bf16)
                        continue;
                    bool fp32 = ty[j] == 'f';
                    if (in->k == TP_K_COPY) {
                        int o = in->buf[1 - j];
                        fp32 = o >= 0 && !p->bufs[o]->bf16;
                    }
                    if (fp32) {
                        p->bufs[b]->bf16 = false;
                        changed = true;
                    }
                }
            }
    }
    /* then every activation operand must be bf16 storage (or a parameter: its bf16 copy) */
    for (int bi = 0; bi < p->n_blocks; bi++)
        for (int i = 0; i < p->blocks[bi]->n_insts; i++) {
            const tp_inst *in = &p->blocks[bi]->insts[i];
            const char *ty = tp_kernel_bf16_types(in->k);
            if (!ty) {
                errors++;
                ir_diag_error(d, "--precision bf16: kernel %s (%s) has no bf16 form%s",
                              tp_kernel_table[in->k].name, in->node ? in->node->name : "?",
                              in->k == TP_K_LOGPROB_FWD || in->k == TP_K_LOGPROB_GRAD ||
                                      in->k == TP_K_GRPO_LOSS || in->k == TP_K_GRPO_WEIGHTS ||
                                      in->k == TP_K_DPO_COEF || in->k == TP_K_GRPO_DOC_LOSS ||
                                      in->k == TP_K_GRPO_DOC_WEIGHTS
                                  ? " (the dpo and grpo objectives are fp32 only)"
                                  : "");
                break;
            }
            for (int j = 0; ty[j] && j < TP_MAX_BUFS; j++) {
                int b = in->buf[j];
                if (b < 0 || (ty[j] != 'b' && ty[j] != 'c'))
                    continue;
                const tp_buf *bb = p->bufs[b];
                bool ok = bb->bf16 || (ty[j] == 'c' && (bb->kind == TP_BUF_GRAD || !bb->is_int)) ||
                          (in->k == TP_K_GEMM && j > 0 && bb->kind == TP_BUF_PARAM);
                if (!ok) {
                    errors++;
                    ir_diag_error(d,
                                  "--precision bf16: %s (%s) operand %d is '%s', which must "
                                  "stay fp32",
                                  tp_kernel_table[in->k].name, in->node ? in->node->name : "?", j,
                                  bb->name);
                }
            }
        }
    return errors ? IR_ERR : IR_OK;
}

void sbp_train_place_bf16_shadow(sbp_train_program *p)
{
    const size_t align = 256; /* as the device allocator: every bf16 row stays aligned */
    p->bf16_shadow_offset = (p->workspace_bytes + align - 1) / align * align;
    p->workspace_bytes = p->bf16_shadow_offset + p->shadow_elems * 2;
}

int sbp_train_place_base_bf16(sbp_train_program *p, bool trained_too, ir_diag *d)
{
    /* (trained_too, --offload optimizer: trained ones too, whose fp32 masters the caller keeps
     * on the host and rounds into the block after each update, as the step's copy would.)
     * a frozen parameter qualifies when every read of it is a GEMM operand (its bf16 copy) or
     * the table of an embedding lookup, whose bf16 output is the table's bf16 rounding either
     * way (a tied embedding and LM head: one parameter, read by both; a re-tied copy reads its
     * owner's buffer, so the owner qualifies as the two together); the frozen flag is the
     * graph's, so the evaluation program (where nothing trains) decides the same and keeps
     * the training step's layout */
    bool *other = calloc((size_t)p->n_bufs + 1, sizeof *other);
    if (!other)
        return ir_diag_error(d, "out of memory");
    for (int bi = 0; bi < p->n_blocks; bi++)
        for (int i = 0; i < p->blocks[bi]->n_insts; i++) {
            const tp_inst *in = &p->blocks[bi]->insts[i];
            for (int j = 0; j < TP_MAX_BUFS; j++) {
                int b = in->buf[j];
                if (b >= 0 && p->bufs[b]->kind == TP_BUF_PARAM &&
                    !(in->k == TP_K_GEMM && j > 0) && !(in->k == TP_K_EMBEDDING_FWD && j == 1))
                    other[b] = true;
            }
        }
    int n = 0;
    for (int i = 0; i < p->n_params; i++) {
        tp_param *q = &p->params[i];
        q->stored_bf16 = q->tied_to < 0 && q->buf >= 0 && (q->value->frozen || trained_too) &&
                         !other[q->buf];
        n += q->stored_bf16;
    }
    free(other);
    if (!n && !trained_too)
        return ir_diag_error(d, "--base-precision bf16: no frozen parameter is read by matrix "
                                "products and embedding lookups alone (freeze the base model "
                                "with --lora or --freeze; norms stay fp32)");
    /* fp32 parameters first (the bf16 copy covers them as one range), then the bf16 ones,
     * each at a 16-byte boundary as cuBLAS prefers its operands */
    size_t off = 0;
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < p->n_params; i++) {
            tp_param *q = &p->params[i];
            if (q->tied_to >= 0 || q->stored_bf16 != (pass == 1))
                continue;
            if (pass == 1)
                off = (off + 3) / 4 * 4;
            q->offset = off;
            off += pass == 1 ? (q->numel + 1) / 2 : q->numel;
            if (q->buf >= 0) {
                p->bufs[q->buf]->offset = q->offset;
                p->bufs[q->buf]->stored_bf16 = q->stored_bf16;
            }
        }
        if (pass == 0)
            p->shadow_elems = off;
    }
    p->param_elems = off;
    for (int i = 0; i < p->n_params; i++)
        if (p->params[i].tied_to >= 0)
            p->params[i].offset = p->params[p->params[i].tied_to].offset;
    return IR_OK;
}
