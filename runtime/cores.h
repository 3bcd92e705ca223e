/* cores.h - how many BLAS threads each rank runs, so that the threads of
 * the ranks on a node share its cores instead of fighting over them.
 *
 * The choice, in order: `hpdlrun --threads N`; else OPENBLAS_NUM_THREADS,
 * then OMP_NUM_THREADS, when the user set one (a positive number); else
 * max(1, online cores / ranks on this node). Two ranks of 2 threads on 2
 * cores each wait for the other's threads at every GEMM; 2 x 1 do not. */
#ifndef HPDL_CORES_H
#define HPDL_CORES_H

typedef enum {
  CORES_AUTO,   /* cores / ranks on the node */
  CORES_OPTION, /* --threads */
  CORES_ENV     /* the user's OPENBLAS_NUM_THREADS or OMP_NUM_THREADS */
} CoresSource;

typedef struct {
  int threads;         /* BLAS threads of this rank, >= 1 */
  CoresSource source;
  const char *env;     /* CORES_ENV: the variable that decided */
  int cores;           /* online cores of the node */
  int node_ranks;      /* ranks of the job on this node */
} CoresChoice;

/* threads_option: --threads (0: not given); node_ranks: ranks of the job
 * on this node (from MPI_COMM_TYPE_SHARED; 1 for a one-rank job). */
CoresChoice cores_choose(int threads_option, int node_ranks);

/* OpenBLAS's idle-thread spin, log2 of cycles (OPENBLAS_THREAD_TIMEOUT) */
#define CORES_BLAS_TIMEOUT "20"

/* Makes the BLAS use c->threads: sets OPENBLAS_NUM_THREADS and
 * OMP_NUM_THREADS (read when the program's BLAS is loaded, so call this
 * before loading it; a user's own setting is left alone), and
 * OPENBLAS_THREAD_TIMEOUT to CORES_BLAS_TIMEOUT unless the user set it (so
 * that OpenBLAS's idle threads leave the cores to the rank's own soon after
 * a GEMM), and calls openblas_set_num_threads when an OpenBLAS is already
 * in the process (found with dlsym, so another BLAS, or none, still works). */
void cores_apply(const CoresChoice *c);

/* "2 threads per rank", with where the number came from when not automatic:
 * "1 thread per rank (--threads)", "4 threads per rank (OPENBLAS_NUM_THREADS)". */
void cores_describe(const CoresChoice *c, char *buf, int n);

#endif
