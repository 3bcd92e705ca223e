/* optim_emu_c.c - the C side of tests/cuda/optim_emu.cpp: kernels/hpdl_optim.cuh
 * included from plain C11 (with the project's warnings, -Werror), as the runtime will:
 * the chunk table and the step's arguments are built here, by the C helpers, and the
 * emulated kernels read them; the layout as the C compiler sees it is reported so that
 * the C++ side can check that both agree. */
#include <stddef.h>

#include "hpdl_optim.cuh"

long long optim_emu_c_build(const hpdl_optim_tensor *t, int n, int chunk_elems, hpdl_optim_chunk *out, long long cap);
void optim_emu_c_layout(long long out[12]);
hpdl_adamw_args optim_emu_c_adamw_args(double lr, double beta1, double beta2, double eps, double wd, long long t,
                                       double scale);
hpdl_sgd_args optim_emu_c_sgd_args(double lr, double momentum, double wd, long long t, double scale);

/* The table, or -1 when it would not fit in cap rows. */
long long optim_emu_c_build(const hpdl_optim_tensor *t, int n, int chunk_elems, hpdl_optim_chunk *out, long long cap) {
  if (hpdl_optim_count_chunks(t, n, chunk_elems) > cap) return -1;
  return hpdl_optim_build_chunks(t, n, chunk_elems, out);
}

void optim_emu_c_layout(long long out[12]) {
  out[0] = (long long)sizeof(hpdl_optim_chunk);
  out[1] = (long long)offsetof(hpdl_optim_chunk, g);
  out[2] = (long long)offsetof(hpdl_optim_chunk, m);
  out[3] = (long long)offsetof(hpdl_optim_chunk, v);
  out[4] = (long long)offsetof(hpdl_optim_chunk, offset);
  out[5] = (long long)offsetof(hpdl_optim_chunk, count);
  out[6] = (long long)offsetof(hpdl_optim_chunk, flags);
  out[7] = (long long)sizeof(hpdl_adamw_args);
  out[8] = (long long)offsetof(hpdl_adamw_args, decay);
  out[9] = (long long)sizeof(hpdl_sgd_args);
  out[10] = (long long)offsetof(hpdl_sgd_args, first);
  out[11] = (long long)sizeof(hpdl_optim_tensor);
}

hpdl_adamw_args optim_emu_c_adamw_args(double lr, double beta1, double beta2, double eps, double wd, long long t,
                                       double scale) {
  return hpdl_adamw_make_args(lr, beta1, beta2, eps, wd, t, scale);
}

hpdl_sgd_args optim_emu_c_sgd_args(double lr, double momentum, double wd, long long t, double scale) {
  return hpdl_sgd_make_args(lr, momentum, wd, t, scale);
}
