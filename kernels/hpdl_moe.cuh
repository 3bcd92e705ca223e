/* hpdl_moe.cuh - the mixture of experts' routing table on the device: the place of
 * each of a sequence's choices among its expert's, by a block of HPDL_MOE_THREADS
 * threads (the generated moe_dispatch / moe_combine / moe_gate_grad kernels' first
 * step, codegen_cuda_special.c).
 *
 * A choice's place is the number of earlier choices (in the order the routing gives
 * them) of the same expert: GShard's capacity per sequence walks every first choice in
 * token order, then every second... (interp_moe_slots), and gives the choice slot
 * e cap + place while place < cap; the dropless packed form walks the choices as they
 * lie (interp_moe_rows) and gives row start(e) + place, start(e) the choices of lower
 * experts. The choices go a tile of HPDL_MOE_THREADS at a time: each thread counts the
 * tile's earlier choices of its expert (shared memory), adds the tiles before (each
 * expert's running count, `cnt`), and a thread per expert then moves that count past
 * the tile. Integer counts only: the same table on every run and the CPU's. */
#ifndef HPDL_MOE_CUH
#define HPDL_MOE_CUH

#define HPDL_MOE_THREADS 256

#if defined(__CUDACC__) || defined(HPDL_EMU)
/* One block: cnt[e] = the first packed row of expert e, the choices of the experts before
 * it (cnt[E] = those in [0, E)): counts by integer atomics into the zeroed cnt, then a
 * prefix sum. Ends with the block in step. */
__device__ void hpdl_moe_starts(const int *__restrict__ idx, long long n, long long E, int *__restrict__ cnt) {
  const int tid = threadIdx.x;
  for (long long p = tid; p < n; p += blockDim.x) {
    const int e = idx[p];
    if (e >= 0 && e < E) atomicAdd(&cnt[e + 1], 1);
  }
  __syncthreads();
  if (tid == 0)
    for (long long e = 0; e < E; e++) cnt[e + 1] += cnt[e];
  __syncthreads();
}

/* One block: idx the sequence's n = T K choices ([T, K]), slot[p] for each (-1: dropped, or
 * an expert outside [0, E)), src[s] = the choice in slot or row s (-1: empty) when not null
 * (e cap + place < E cap slots; the packed form's n rows), cnt E + 1 ints of scratch
 * (global). priority: GShard's order (choice q -> t = q % T, k = q / T); packed: rows. */
__device__ void hpdl_moe_route(const int *__restrict__ idx, long long T, long long K, long long E, long long cap, int priority,
                               int packed, int *__restrict__ slot, int *__restrict__ src, int *__restrict__ cnt) {
  __shared__ int tile_e[HPDL_MOE_THREADS];
  const long long n = T * K, nslots = packed ? n : E * cap;
  const int tid = threadIdx.x;
  for (long long e = tid; e <= E; e += blockDim.x) cnt[e] = 0;
  if (src)
    for (long long s = tid; s < nslots; s += blockDim.x) src[s] = -1;
  __syncthreads();
  if (packed) hpdl_moe_starts(idx, n, E, cnt); /* each expert's first row */
  for (long long q0 = 0; q0 < n; q0 += blockDim.x) {
    const long long q = q0 + tid;
    const long long p = q < n ? (priority ? (q % T) * K + q / T : q) : -1;
    const int e = p >= 0 ? idx[p] : -1;
    const int valid = e >= 0 && e < E;
    tile_e[tid] = valid ? e : -1;
    __syncthreads();
    int place = 0;
    if (valid) {
      for (int j = 0; j < tid; j++) place += tile_e[j] == e;
      place += cnt[e];
    }
    __syncthreads(); /* every thread has read its expert's count before it moves */
    if (p >= 0) {
      int s = -1;
      if (valid && (packed || place < cap)) s = packed ? place : (int)(e * cap + place);
      slot[p] = s;
      if (src && s >= 0) src[s] = (int)p;
    }
    const int in_tile = (int)(n - q0 < (long long)blockDim.x ? n - q0 : (long long)blockDim.x);
    for (long long x = tid; x < E; x += blockDim.x) {
      int c = 0;
      for (int j = 0; j < in_tile; j++) c += tile_e[j] == x;
      cnt[x] += c;
    }
    __syncthreads();
  }
}

/* One block: out[r] = the expert of packed row r, idx's n values sorted (moe_expert_ids; -1
 * past the rows of experts in [0, E)): each expert's count (integer atomics), their starts,
 * then each row finds its expert among the starts. cnt: E + 1 ints of scratch (global). */
__device__ void hpdl_moe_sorted(const int *__restrict__ idx, long long n, long long E, int *__restrict__ out,
                                int *__restrict__ cnt) {
  const int tid = threadIdx.x;
  for (long long e = tid; e <= E; e += blockDim.x) cnt[e] = 0;
  __syncthreads();
  hpdl_moe_starts(idx, n, E, cnt);
  for (long long r = tid; r < n; r += blockDim.x) {
    long long lo = 0, hi = E; /* the last expert whose start is at or before r */
    while (hi - lo > 1) {
      const long long mid = (lo + hi) / 2;
      if (cnt[mid] <= r) lo = mid;
      else hi = mid;
    }
    out[r] = r < cnt[E] ? (int)lo : -1;
  }
}

#endif /* device code */
#endif
