/* lora.h — LoRA (low-rank adapters) as a compile-time rewrite of the canonical graph.
 *
 * sbpc --lora RANK [--lora-alpha A] [--lora-targets REGEX] [--lora-seed S]: every Linear whose
 * weight's PyTorch name (ir/torch.h) matches REGEX gets PEFT's adapter,
 *     y = W x (+ b)  ->  y = W x (+ b) + (A / RANK) * B (A x),
 * with two new float parameters of the graph, `<module>.lora_A.weight` [RANK, in] and
 * `<module>.lora_B.weight` [out, RANK] (PEFT's names and layouts), A initialised as PEFT's
 * kaiming_uniform_(a = sqrt(5)) by the seeded generator of ir_lora_init, B zeros. As PEFT does,
 * the base model is frozen: every parameter but the adapters (so no gradient buffer and no
 * optimizer state for them). A fused projection (GPT-2's c_attn, Phi-3's qkv_proj) is one
 * Linear with one weight, so it gets one adapter, as in PEFT. A weight read by several Linears
 * gets one adapter shared by them all (PEFT adapts the module, whichever call reads it).
 *
 * The adapters are ordinary ops of the canonical IR (Linear with trans_w = 1, Mul by a scalar
 * constant when the scaling is not 1, Add), so the gradient rules, StreamBP and codegen treat
 * them like any other projection.
 *
 * requires: a canonical graph (after "cleanup": Linear ops, parameters told from constants).
 * produces: the adapters above; an error (with the node and the weight) for a matched Linear
 *           whose RANK exceeds min(in, out), and for a REGEX that matches no Linear weight.
 */
#ifndef SBP_LORA_H
#define SBP_LORA_H

#include "ir.h"

#include <stdint.h>

/* The layers PEFT users adapt in the families sbpc reads: attention q/k/v/o (split or fused)
 * and the MLP's projections. The embedding and the LM head never match. */
#define SBP_LORA_DEFAULT_TARGETS                                                               \
    "\\.(q_proj|k_proj|v_proj|o_proj|qkv_proj|gate_proj|up_proj|down_proj|gate_up_proj|"      \
    "c_attn|c_proj|c_fc|query_key_value|dense|dense_h_to_4h|dense_4h_to_h|out_proj|fc1|fc2|"  \
    "query|key|value|Wqkv|fc_in|fc_out)\\.weight$"

/* PEFT's LoraConfig default lora_alpha (peft 0.21): scaling = alpha / rank. */
#define SBP_LORA_DEFAULT_ALPHA 8.0

typedef struct sbp_lora_options {
    int64_t rank;          /* --lora RANK; 0: no LoRA */
    double alpha;          /* --lora-alpha (SBP_LORA_DEFAULT_ALPHA when not given) */
    const char *targets;   /* --lora-targets, POSIX extended; NULL: SBP_LORA_DEFAULT_TARGETS */
    uint64_t seed;         /* --lora-seed: ir_lora_init's seed */
} sbp_lora_options;

/* The rewrite above; *n_adapted (may be NULL) gets the number of weights adapted. IR_ERR with
 * diagnostics on a bad regex, a rank too large or no match. */
int sbp_pass_lora(ir_graph *g, const sbp_lora_options *o, int *n_adapted);

/* --freeze REGEX with --lora: an error when REGEX names an adapter (the adapters are the only
 * thing a LoRA step trains; the base model is frozen already). */
int sbp_lora_check_freeze(ir_graph *g, const char *regex);

#endif
