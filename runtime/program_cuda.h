/* program_cuda.h - the program of --target cuda artifacts (program_cuda.c),
 * built into the runtime: the training loop picks it when the manifest's
 * target is "cuda". */
#ifndef HPDL_PROGRAM_CUDA_H
#define HPDL_PROGRAM_CUDA_H

#include "program.h"

const TrainProgram *cuda_program(void);

#endif
