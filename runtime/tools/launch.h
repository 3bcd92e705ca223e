/* launch.h - what starts a compiled job on a cluster: an sbatch script for
 * SLURM and a Kubeflow MPIJob manifest for Kubernetes (`hpdlrun --sbatch`,
 * `hpdlrun --k8s`; docs/runtime.md, "Clusters: SLURM and Kubernetes").
 *
 * Both place the ranks on nodes the same way (launch_shape): the cluster the
 * layout was planned for says how many ranks a node holds, and rank r runs on
 * node r / ranks_per_node, so that a tensor group (tp consecutive ranks) stays
 * on one node's fast links as the planner assumed. */
#ifndef HPDL_LAUNCH_H
#define HPDL_LAUNCH_H

#include <stdio.h>

#include "artifact.h"
#include "rt.h"

/* CPUs a rank gets when neither --cpus-per-task nor --cpus-per-node says:
 * a GPU rank feeds its GPU (data loading, the host side of the step); a CPU
 * rank runs its GEMMs on them. */
enum { LAUNCH_DEFAULT_CPUS_GPU = 8, LAUNCH_DEFAULT_CPUS_CPU = 4 };

/* Seconds before the time limit that SLURM warns the batch script. */
enum { LAUNCH_DEFAULT_SIGNAL_S = 120 };

typedef struct {
  int ranks;           /* the artifact's world size */
  int nodes;
  int ranks_per_node;  /* on every node but the last, which may hold fewer */
  int last_node_ranks; /* == ranks_per_node when the ranks fill whole nodes */
  int gpus_per_node;   /* GPUs asked of each node: ranks_per_node for a cuda artifact, 0 for cpu */
  int cpus_per_task;
  const char *cpus_why; /* how cpus_per_task was chosen, for the script's comment */
} LaunchShape;

typedef struct {
  const char *dir;       /* the artifact folder as the job names it */
  const char *hpdlrun;   /* the hpdlrun the job runs */
  const char *workdir;   /* sbatch: the job's working folder (--chdir): the train block's relative paths */
  /* sbatch */
  const char *job_name, *partition, *time, *account, *output, *mpi;
  int signal_s;
  /* MPIJob */
  const char *image, *name, *namespace_, *claim, *mount;
  /* both */
  int ranks_per_node, cpus_per_task, cpus_per_node;
  char **run_args; /* hpdlrun's run flags, passed on to the ranks */
  int nrun_args;
} LaunchOptions;

/* The ranks' placement for artifact a: 0, or -1 with a message. */
int launch_shape(const Artifact *a, const LaunchOptions *o, LaunchShape *s, RtErr *e);

/* Checks a Kubernetes name: a DNS-1123 label (lower-case letters, digits
 * and '-', starting and ending with a letter or digit, at most max
 * characters); as_1035: also starting with a letter (DNS-1035, as the MPI
 * operator wants of a job's name, which becomes its pods' host names). what
 * names it in the message. 0, or -1 with a message. */
int launch_check_k8s_name(const char *what, const char *s, int max, int as_1035, RtErr *e);

/* A job name the scheduler and a shell take as it is: [A-Za-z0-9._+-],
 * and for SLURM's partition lists also ','. 0, or -1 with a message. */
int launch_check_slurm_word(const char *what, const char *s, int comma, RtErr *e);

/* SLURM's time limit: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS. */
int launch_check_slurm_time(const char *s, RtErr *e);

/* Writes s to f as one shell word (single quotes where needed). */
void launch_shell_word(FILE *f, const char *s);

/* The sbatch script; 0, or -1 with a message. */
int launch_write_sbatch(FILE *f, const Artifact *a, const LaunchOptions *o, RtErr *e);

/* The MPIJob manifest (YAML); 0, or -1 with a message. */
int launch_write_mpijob(FILE *f, const Artifact *a, const LaunchOptions *o, RtErr *e);

#endif
