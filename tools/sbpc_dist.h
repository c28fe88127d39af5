/* sbpc_dist.h — `sbpc --report --ranks N [--zero 0|1|2]`: what one rank of a
 * data-parallel run (mpirun -np N sbp-train, train/train_dist.h) holds, planned.
 *
 * The step sbpc compiles is one rank's: --batch is the rows each rank runs (the global batch of
 * a micro-batch is N x --batch rows). Per rank, sbp-train allocates the parameter block, the
 * whole gradient block (the step writes every element of it, also under ZeRO 2, whose
 * reduce-scatter saves traffic, not memory), AdamW's m and v and the workspace. Under --zero 1|2
 * the moments cover one contiguous slice of the gradient block: train_dist_plan_slices gives
 * rank r the elements [E*r/N, E*(r+1)/N), so the largest rank holds ceil(E/N) of the E
 * elements, and that is the figure printed (rank 0, which sbp-train's end report speaks for,
 * holds floor(E/N)). Checkpoints under ZeRO have rank 0 buffer one other rank's slice of one
 * moment on the host while it writes (train_dist_fill_state); that is said, not counted.
 */
#ifndef SBPC_DIST_H
#define SBPC_DIST_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "train.h"

/* The checks of --ranks / --zero against the rest of the command line: they describe --report's
 * per-rank figures, so they need --report, and --zero needs --ranks. ranks == 0 / zero < 0:
 * not given. Returns 0, or -1 with the message in err. */
int sbpc_dist_check(int64_t ranks, int64_t zero, bool report, char *err, size_t errlen);

/* The per-rank figures of program p for N = ranks ranks under ZeRO `zero` (0 when not given),
 * printed after the memory report. */
void sbpc_dist_report(FILE *out, const sbp_train_program *p, int64_t ranks, int64_t zero);

/* `sbpc --report --seq-parallel N [--ranks R [--zero Z]]`: what one rank of a sequence-parallel
 * run holds (the same parameters, gradient block and moments as any data-parallel rank: the
 * ranks of a row are data-parallel ranks over different tokens; the moments divided over the
 * R ranks of the run under ZeRO), its workspace with the exchanges' buffers in it, and the bytes
 * it sends to the other ranks of its row in one step. */
void sbpc_sp_report(FILE *out, const sbp_train_program *p, int64_t ranks, int64_t zero);

#endif
