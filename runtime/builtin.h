/* builtin.h - programs built into the runtime, for tests and for running
 * the whole path (launch, data, collectives, optimizer, checkpoints)
 * before a compiled model exists.
 *
 *   bigram  next-token logits = W[token] + b, softmax cross-entropy; W is
 *           [V, V] ("bigram.weight"), b is [V] ("bigram.bias"). Under
 *           tensor parallelism both are split over the output vocabulary
 *           (W along axis 1, b along axis 0) and the softmax is computed
 *           vocabulary-parallel as Megatron-LM does (max, sum of
 *           exponentials and the target logit all-reduced over tp). */
#ifndef HPDL_BUILTIN_H
#define HPDL_BUILTIN_H

#include "program.h"

/* NULL when there is no builtin of that name. */
const TrainProgram *builtin_program(const char *name);

#endif
