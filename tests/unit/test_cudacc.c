/* test_cudacc.c - NVRTC through cudacc: cubin + PTX for sm_80 and sm_90,
 * ptxas resource parsing, compile errors, the cache (hits, corrupt entries,
 * an unwritable directory, header edits), the not-found message and the
 * cubin check. Needs no GPU; skips (exit 0) when NVRTC cannot be loaded. */
#include <dirent.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cudacc.h"
#include "test_util.h"

/* An elementwise kernel on 128-bit loads, and a block reduction through
 * warp shuffles and shared memory: the two shapes generated code has most. */
static const char *kernel_src =
    "extern \"C\" __global__ void scale4(const float4 *__restrict__ x, float4 *__restrict__ y,\n"
    "                                    float a, int n4) {\n"
    "  int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "  if (i < n4) {\n"
    "    float4 v = x[i];\n"
    "    v.x *= a; v.y *= a; v.z *= a; v.w *= a;\n"
    "    y[i] = v;\n"
    "  }\n"
    "}\n"
    "\n"
    "extern \"C\" __global__ void block_sum(const float *__restrict__ x, float *__restrict__ out, int n) {\n"
    "  __shared__ float warp_sums[32];\n"
    "  float s = 0.f;\n"
    "  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) s += x[i];\n"
    "  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);\n"
    "  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;\n"
    "  if (lane == 0) warp_sums[warp] = s;\n"
    "  __syncthreads();\n"
    "  if (warp == 0) {\n"
    "    s = lane < (int)(blockDim.x >> 5) ? warp_sums[lane] : 0.f;\n"
    "    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);\n"
    "    if (lane == 0) atomicAdd(out, s);\n"
    "  }\n"
    "}\n";

static char tmpdir[] = "/tmp/hpdl-cudacc-XXXXXX";
static char cachedir[512];

static const CudaccKernelInfo *kernel(const CudaccResult *r, const char *name) {
  for (size_t i = 0; i < r->n_kernels; i++)
    if (strcmp(r->kernels[i].name, name) == 0) return &r->kernels[i];
  return NULL;
}

static CudaccRequest request(const char *src, const char *name, const char *arch, int cache) {
  CudaccRequest q = {0};
  q.source = src;
  q.name = name;
  q.arch = arch;
  q.use_cache = cache;
  return q;
}

static void entry_file(const CudaccResult *r, char *buf, size_t n) {
  snprintf(buf, n, "%s/%.2s/%s.hnvc", cachedir, r->hash, r->hash);
}

static int file_exists(const char *path) {
  struct stat st;
  return stat(path, &st) == 0;
}

static void write_text(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  EXPECT(f != NULL);
  if (!f) return;
  fputs(text, f);
  fclose(f);
}

static void remove_tree(const char *path) {
  struct stat st;
  if (lstat(path, &st) != 0) return;
  if (S_ISDIR(st.st_mode)) {
    DIR *d = opendir(path);
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL) {
      if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
      char sub[1024];
      snprintf(sub, sizeof sub, "%s/%s", path, e->d_name);
      remove_tree(sub);
    }
    if (d) closedir(d);
    rmdir(path);
  } else {
    unlink(path);
  }
}

static void test_sha256(void) {
  char hex[65];
  cudacc_sha256_hex("", 0, hex);
  EXPECT_STR(hex, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  cudacc_sha256_hex("abc", 3, hex);
  EXPECT_STR(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  const char *two = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"; /* 56 bytes: padding spills a block */
  cudacc_sha256_hex(two, strlen(two), hex);
  EXPECT_STR(hex, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  static char million[1000000];
  memset(million, 'a', sizeof million);
  cudacc_sha256_hex(million, sizeof million, hex);
  EXPECT_STR(hex, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

/* The search list and the message, from an explicit list so that the answer
 * does not depend on what this machine has installed. */
static void test_not_found(void) {
  char *old_nvrtc = getenv("HPDL_NVRTC") ? strdup(getenv("HPDL_NVRTC")) : NULL;
  char *old_home = getenv("CUDA_HOME") ? strdup(getenv("CUDA_HOME")) : NULL;
  setenv("HPDL_NVRTC", "/nonexistent/libnvrtc.so", 1);
  unsetenv("CUDA_HOME");
  CudaccCandidate list[CUDACC_MAX_CANDIDATES];
  char buf[512], err[2048];
  size_t n = cudacc_nvrtc_candidates(list, CUDACC_MAX_CANDIDATES, buf, sizeof buf);
  EXPECT(n == 6);
  EXPECT_STR(list[0].path, "/nonexistent/libnvrtc.so");
  EXPECT(list[1].path == NULL);
  EXPECT_STR(list[2].path, "/usr/local/cuda/lib64/libnvrtc.so");
  EXPECT_STR(list[3].path, "libnvrtc.so.13");
  EXPECT_STR(list[4].path, "libnvrtc.so.12");
  EXPECT_STR(list[5].path, "libnvrtc.so");

  /* $HPDL_NVRTC at a missing file, $CUDA_HOME unset. */
  EXPECT(cudacc_nvrtc_open(list, 2, err, sizeof err) == NULL);
  printf("not found: %s\n", err);
  EXPECT_STR(err,
             "NVRTC not found: tried $HPDL_NVRTC=/nonexistent/libnvrtc.so (no such file), "
             "$CUDA_HOME/lib64/libnvrtc.so (unset); install the CUDA toolkit or set HPDL_NVRTC to the path "
             "of libnvrtc.so");
  /* A soname no loader has: dlopen's own words (they differ between C libraries). */
  CudaccCandidate none = {"libnvrtc-hpdl-none.so.99", "libnvrtc-hpdl-none.so.99"};
  EXPECT(cudacc_nvrtc_open(&none, 1, err, sizeof err) == NULL);
  printf("not found: %s\n", err);
  EXPECT(strncmp(err, "NVRTC not found: tried libnvrtc-hpdl-none.so.99 (dlopen: ", 56) == 0);

  /* A file that is not a library, and a library that is not NVRTC. */
  char notlib[600];
  snprintf(notlib, sizeof notlib, "%s/libnvrtc.so", tmpdir);
  write_text(notlib, "not an ELF\n");
  CudaccCandidate odd[2] = {{"$HPDL_NVRTC", notlib}, {"libc.so.6", "libc.so.6"}};
  EXPECT(cudacc_nvrtc_open(odd, 2, err, sizeof err) == NULL);
  printf("not NVRTC: %s\n", err);
  EXPECT(strstr(err, "(dlopen: ") != NULL);
  EXPECT(strstr(err, "libc.so.6 (no nvrtcGetErrorString: not NVRTC 11.1 or later)") != NULL);
  unlink(notlib);

  if (old_nvrtc) setenv("HPDL_NVRTC", old_nvrtc, 1);
  else unsetenv("HPDL_NVRTC");
  if (old_home) setenv("CUDA_HOME", old_home, 1);
  free(old_nvrtc);
  free(old_home);
}

/* A synthetic ELF header: both e_flags layouts, and what is not a cubin. */
static void test_elf_synthetic(void) {
  unsigned char h[64] = {0x7f, 'E', 'L', 'F', 2, 1, 1, 0x41, 8};
  char err[256];
  int sm = 0;
  h[18] = 190;
  h[48] = 0x04, h[49] = 0x5a, h[50] = 0x00, h[51] = 0x06; /* 0x06005a04: NVRTC 13's sm_90 */
  EXPECT(cudacc_elf_check(h, sizeof h, &sm, err, sizeof err) == 0 && sm == 90);
  h[7] = 0x33, h[8] = 7; /* the older ABI: 0x00500550 is sm_80 */
  h[48] = 0x50, h[49] = 0x05, h[50] = 0x50, h[51] = 0;
  EXPECT(cudacc_elf_check(h, sizeof h, &sm, err, sizeof err) == 0 && sm == 80);
  EXPECT(cudacc_elf_check(h, 40, &sm, err, sizeof err) == -1);
  h[18] = 62; /* x86-64 */
  EXPECT(cudacc_elf_check(h, sizeof h, &sm, err, sizeof err) == -1 && strstr(err, "EM_CUDA") != NULL);
  h[18] = 190, h[4] = 1;
  EXPECT(cudacc_elf_check(h, sizeof h, &sm, err, sizeof err) == -1);
  h[4] = 2, h[40] = 200, h[60] = 3, h[58] = 64; /* section headers past the end */
  EXPECT(cudacc_elf_check(h, sizeof h, &sm, err, sizeof err) == -1 && strstr(err, "truncated") != NULL);
}

static void check_arch(const CudaccResult *r, int want_sm) {
  char err[256], target[32];
  int sm = 0;
  EXPECT(r->cubin_size > 64);
  EXPECT(cudacc_elf_check(r->cubin, r->cubin_size, &sm, err, sizeof err) == 0);
  EXPECT(sm == want_sm);
  EXPECT(r->sm == want_sm);
  snprintf(target, sizeof target, ".target sm_%d", want_sm);
  EXPECT(r->ptx && r->ptx_size > 0 && strlen(r->ptx) == r->ptx_size);
  EXPECT(r->ptx && strstr(r->ptx, target) != NULL);
  EXPECT(r->ptx && strstr(r->ptx, ".version") != NULL);
  EXPECT(r->ptx && strstr(r->ptx, "ld.global.nc.v4.f32") != NULL); /* the 128-bit loads */
  EXPECT(r->ptx && strstr(r->ptx, "shfl.sync.bfly") != NULL);      /* __shfl_xor_sync */
  EXPECT(r->nvrtc_major >= 11);
  EXPECT(strlen(r->hash) == 64);
  EXPECT(r->n_options >= 3);
  EXPECT(r->n_kernels == 2);
  const CudaccKernelInfo *a = kernel(r, "scale4"), *b = kernel(r, "block_sum");
  EXPECT(a && b);
  if (!a || !b) return;
  EXPECT(a->registers > 0 && b->registers > 0);
  EXPECT(a->spill_store == 0 && a->spill_load == 0 && a->stack == 0);
  EXPECT(b->spill_store == 0 && b->spill_load == 0 && b->stack == 0);
  EXPECT(a->smem_bytes == 0);
  EXPECT(b->smem_bytes == 32 * 4); /* warp_sums */
  EXPECT(b->barriers == 1);
  for (size_t i = 0; i < r->n_kernels; i++) {
    const CudaccKernelInfo *k = &r->kernels[i];
    printf("  sm_%d %-10s registers %3d  smem %5ld  spill st/ld %ld/%ld  stack %ld\n", want_sm, k->name,
           k->registers, k->smem_bytes, k->spill_store, k->spill_load, k->stack);
  }
}

/* Whether this process has NVRTC mapped; -1 when it cannot tell. */
static int nvrtc_mapped(void) {
  FILE *f = fopen("/proc/self/maps", "r");
  if (!f) return -1;
  char line[1024];
  int found = 0;
  while (!found && fgets(line, sizeof line, f)) found = strstr(line, "libnvrtc") != NULL;
  fclose(f);
  return found;
}

/* Run in a fresh process (this test with --hit-child): a cache hit must not
 * load NVRTC when NVRTC is found by path. */
static int hit_child(void) {
  char err[1024];
  CudaccResult r;
  CudaccRequest q = request(kernel_src, "kernels.cu", "sm_80", 1);
  int rc = cudacc_compile(&q, &r, err, sizeof err);
  int mapped = nvrtc_mapped();
  printf("sm_80 cached, fresh process: %.3f ms, hit %d, NVRTC mapped %d\n", r.seconds * 1e3, r.cache_hit, mapped);
  EXPECT(rc == 0 && r.cache_hit && r.n_kernels == 2);
  EXPECT(r.nvrtc_major > 0);
  const char *home = getenv("CUDA_HOME");
  char p[600];
  snprintf(p, sizeof p, "%s/lib64/libnvrtc.so", home && *home ? home : "/usr/local/cuda");
  if (access(p, R_OK) == 0 || access("/usr/local/cuda/lib64/libnvrtc.so", R_OK) == 0) EXPECT(mapped == 0);
  cudacc_result_free(&r);
  TEST_DONE();
}

static const char *self_path;

/* This test again, in a fresh process, with one argument. */
static pid_t spawn_self(const char *arg) {
  fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) {
    execl(self_path, self_path, arg, (char *)NULL);
    execl("/proc/self/exe", self_path, arg, (char *)NULL); /* run through $PATH */
    _exit(127);
  }
  return pid;
}

static int child_ok(pid_t pid) {
  int status = 0;
  return pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

static const char *race_src(void) {
  static char buf[4096];
  snprintf(buf, sizeof buf, "%s// compiled by several processes at once\n", kernel_src);
  return buf;
}

/* One of several processes that compile one new key into one cache. */
static int race_child(void) {
  char err[1024];
  CudaccResult r;
  CudaccRequest q = request(race_src(), "race.cu", "sm_80", 1);
  EXPECT(cudacc_compile(&q, &r, err, sizeof err) == 0);
  EXPECT(r.warning == NULL);
  if (r.warning) fprintf(stderr, "race: %s\n", r.warning);
  cudacc_result_free(&r);
  TEST_DONE();
}

/* Concurrent writers of one entry: every compile succeeds, the entry that
 * stays is whole, and no temporary file is left behind. */
static void test_concurrent(void) {
  pid_t pids[4];
  for (int i = 0; i < 4; i++) pids[i] = spawn_self("--race-child");
  for (int i = 0; i < 4; i++) EXPECT(child_ok(pids[i]));
  char err[1024];
  CudaccResult r;
  CudaccRequest q = request(race_src(), "race.cu", "sm_80", 1);
  EXPECT(cudacc_compile(&q, &r, err, sizeof err) == 0 && r.cache_hit && r.warning == NULL);
  char sub[700];
  snprintf(sub, sizeof sub, "%s/%.2s", cachedir, r.hash);
  DIR *d = opendir(sub);
  struct dirent *e;
  int files = 0, temps = 0;
  while (d && (e = readdir(d)) != NULL) {
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
    files++;
    temps += e->d_name[0] == '.';
  }
  if (d) closedir(d);
  EXPECT(temps == 0);
  printf("4 concurrent compiles of one key: %d file(s) in its folder, %d temporary\n", files, temps);
  cudacc_result_free(&r);
}

static void test_compile_and_cache(void) {
  char err[1024], path[1024];
  CudaccResult cold, hot, r90, r90b;

  CudaccRequest q = request(kernel_src, "kernels.cu", "sm_80", 1);
  EXPECT(cudacc_compile(&q, &cold, err, sizeof err) == 0);
  printf("sm_80 cold: %.1f ms, NVRTC %d.%d, cubin %zu bytes, PTX %zu bytes, key %.16s...\n", cold.seconds * 1e3,
         cold.nvrtc_major, cold.nvrtc_minor, cold.cubin_size, cold.ptx_size, cold.hash);
  printf("  options:");
  for (size_t i = 0; i < cold.n_options; i++) printf(" %s", cold.options[i]);
  printf("\n");
  EXPECT(!cold.cache_hit);
  EXPECT(cold.warning == NULL);
  if (cold.warning) printf("  warning: %s\n", cold.warning);
  EXPECT_STR(cold.options[0], "--gpu-architecture=sm_80");
  EXPECT(strstr(cold.log, "ptxas") != NULL);
  check_arch(&cold, 80);
  entry_file(&cold, path, sizeof path);
  EXPECT(file_exists(path));

  /* The second compile is a hit: same bytes, same resources, no NVRTC call. */
  EXPECT(cudacc_compile(&q, &hot, err, sizeof err) == 0);
  printf("sm_80 cached: %.3f ms (%.0fx faster)\n", hot.seconds * 1e3, cold.seconds / (hot.seconds + 1e-9));
  EXPECT(hot.cache_hit);
  EXPECT(hot.warning == NULL);
  EXPECT_STR(hot.hash, cold.hash);
  EXPECT(hot.cubin_size == cold.cubin_size && memcmp(hot.cubin, cold.cubin, cold.cubin_size) == 0);
  EXPECT(hot.ptx_size == cold.ptx_size && strcmp(hot.ptx, cold.ptx) == 0);
  EXPECT(hot.nvrtc_major == cold.nvrtc_major && hot.nvrtc_minor == cold.nvrtc_minor);
  EXPECT(hot.n_options == cold.n_options);
  check_arch(&hot, 80);
  EXPECT(hot.seconds * 5 < cold.seconds);
  cudacc_result_free(&hot);

  EXPECT(child_ok(spawn_self("--hit-child")));

  /* sm_90: another key, its own cubin. */
  q.arch = "sm_90";
  EXPECT(cudacc_compile(&q, &r90, err, sizeof err) == 0);
  printf("sm_90 cold: %.1f ms, cubin %zu bytes\n", r90.seconds * 1e3, r90.cubin_size);
  EXPECT(!r90.cache_hit);
  EXPECT(strcmp(r90.hash, cold.hash) != 0);
  check_arch(&r90, 90);
  EXPECT(cudacc_compile(&q, &r90b, err, sizeof err) == 0);
  printf("sm_90 cached: %.3f ms\n", r90b.seconds * 1e3);
  EXPECT(r90b.cache_hit);
  cudacc_result_free(&r90b);
  cudacc_result_free(&r90);

  /* A truncated entry is noticed, never trusted, and compiled over. */
  q.arch = "sm_80";
  EXPECT(truncate(path, 1000) == 0);
  EXPECT(cudacc_compile(&q, &hot, err, sizeof err) == 0);
  EXPECT(!hot.cache_hit);
  EXPECT(hot.warning && strstr(hot.warning, "truncated") && strstr(hot.warning, "recompiled"));
  printf("truncated entry: %s\n", hot.warning ? hot.warning : "(no warning)");
  EXPECT(hot.cubin_size == cold.cubin_size && memcmp(hot.cubin, cold.cubin, cold.cubin_size) == 0);
  cudacc_result_free(&hot);
  EXPECT(cudacc_compile(&q, &hot, err, sizeof err) == 0);
  EXPECT(hot.cache_hit && hot.warning == NULL);
  cudacc_result_free(&hot);

  /* One flipped byte in the cubin: the checksum says so. */
  int fd = open(path, O_RDWR);
  EXPECT(fd >= 0);
  unsigned char c = 0;
  EXPECT(pread(fd, &c, 1, 200) == 1);
  c ^= 0x10;
  EXPECT(pwrite(fd, &c, 1, 200) == 1);
  close(fd);
  EXPECT(cudacc_compile(&q, &hot, err, sizeof err) == 0);
  EXPECT(!hot.cache_hit && hot.warning && strstr(hot.warning, "checksum"));
  printf("flipped byte: %s\n", hot.warning ? hot.warning : "(no warning)");
  cudacc_result_free(&hot);

  /* Without the cache nothing is read or written. */
  unlink(path);
  q.use_cache = 0;
  EXPECT(cudacc_compile(&q, &hot, err, sizeof err) == 0);
  EXPECT(!hot.cache_hit && hot.warning == NULL && !file_exists(path));
  EXPECT_STR(hot.hash, cold.hash); /* the key is the same with or without the cache */
  cudacc_result_free(&hot);
  q.use_cache = 1;

  /* A cache that cannot be written: under a regular file (even root cannot). */
  char blocker[600], bad[700];
  snprintf(blocker, sizeof blocker, "%s/not-a-dir", tmpdir);
  snprintf(bad, sizeof bad, "%s/cache", blocker);
  write_text(blocker, "x");
  setenv("HPDL_CACHE", bad, 1);
  EXPECT(cudacc_compile(&q, &hot, err, sizeof err) == 0);
  EXPECT(!hot.cache_hit && hot.cubin_size == cold.cubin_size);
  EXPECT(hot.warning && strstr(hot.warning, "not written"));
  printf("unwritable cache: %s\n", hot.warning ? hot.warning : "(no warning)");
  cudacc_result_free(&hot);
  setenv("HPDL_CACHE", cachedir, 1);
  cudacc_result_free(&cold);
}

static void test_compile_error(void) {
  const char *src = "extern \"C\" __global__ void broken(float *p) {\n"
                    "  int i = threadIdx.x;\n"
                    "  p[i] = undefined_thing * 2.f;\n"
                    "}\n";
  char err[1024];
  CudaccResult r;
  CudaccRequest q = request(src, "broken.cu", "sm_80", 1);
  EXPECT(cudacc_compile(&q, &r, err, sizeof err) == -1);
  printf("compile error: %s\n", err);
  EXPECT(strstr(err, "nvrtcCompileProgram") != NULL);
  EXPECT(strstr(err, "NVRTC_ERROR_COMPILATION") != NULL);
  EXPECT(strstr(err, "broken.cu(3)") != NULL);
  EXPECT(strchr(err, '\n') == NULL);
  EXPECT(r.log && strstr(r.log, "broken.cu(3): error") && strstr(r.log, "undefined_thing"));
  EXPECT(r.cubin == NULL && !r.cache_hit);
  char path[1024];
  entry_file(&r, path, sizeof path);
  EXPECT(!file_exists(path)); /* failures are not cached */
  cudacc_result_free(&r);

  q.arch = "compute_80";
  EXPECT(cudacc_compile(&q, &r, err, sizeof err) == -1 && strstr(err, "compute_80"));
  cudacc_result_free(&r);
}

/* Headers are part of the key: editing one in an include directory misses. */
static void test_headers(void) {
  char inc[600], hdr[700], err[1024];
  snprintf(inc, sizeof inc, "%s/include", tmpdir);
  EXPECT(mkdir(inc, 0755) == 0);
  snprintf(hdr, sizeof hdr, "%s/hpdl_test_scale.cuh", inc);
  write_text(hdr, "#define HPDL_SCALE 2.0f\n");
  const char *src = "#include \"hpdl_test_scale.cuh\"\n"
                    "extern \"C\" __global__ void sc(float *p) { p[threadIdx.x] *= HPDL_SCALE; }\n";
  const char *dirs[2] = {inc, NULL};
  size_t ndirs = 1;
  char cuda_inc[600];
  const char *home = getenv("CUDA_HOME");
  snprintf(cuda_inc, sizeof cuda_inc, "%s/include", home ? home : "/usr/local/cuda");
  char fp16[700];
  snprintf(fp16, sizeof fp16, "%s/cuda_fp16.h", cuda_inc);
  if (file_exists(fp16)) dirs[ndirs++] = cuda_inc;

  CudaccRequest q = request(src, "scale.cu", "sm_90", 1);
  q.include_dirs = dirs;
  q.n_include_dirs = ndirs;
  CudaccResult a, b, c;
  EXPECT(cudacc_compile(&q, &a, err, sizeof err) == 0 && !a.cache_hit);
  EXPECT(cudacc_compile(&q, &b, err, sizeof err) == 0 && b.cache_hit);
  /* the same header in another folder (an artifact compiled elsewhere): a hit */
  char inc2[600], hdr2[700];
  snprintf(inc2, sizeof inc2, "%s/include2", tmpdir);
  EXPECT(mkdir(inc2, 0755) == 0);
  snprintf(hdr2, sizeof hdr2, "%s/hpdl_test_scale.cuh", inc2);
  write_text(hdr2, "#define HPDL_SCALE 2.0f\n");
  dirs[0] = inc2;
  EXPECT(cudacc_compile(&q, &c, err, sizeof err) == 0 && c.cache_hit && strcmp(a.hash, c.hash) == 0);
  cudacc_result_free(&c);
  write_text(hdr2, "#define HPDL_SCALE 4.0f\n"); /* ... but not when it holds another text */
  EXPECT(cudacc_compile(&q, &c, err, sizeof err) == 0 && !c.cache_hit && strcmp(a.hash, c.hash) != 0);
  EXPECT(c.ptx && strstr(c.ptx, "0f40800000") != NULL);
  cudacc_result_free(&c);
  dirs[0] = inc;
  write_text(hdr, "#define HPDL_SCALE 3.0f\n");
  EXPECT(cudacc_compile(&q, &c, err, sizeof err) == 0 && !c.cache_hit);
  EXPECT(strcmp(a.hash, c.hash) != 0);
  EXPECT(c.ptx && strstr(c.ptx, "0f40400000") != NULL); /* 3.0f: the new header was compiled */
  cudacc_result_free(&a);
  cudacc_result_free(&b);
  cudacc_result_free(&c);

  /* cuda_fp16.h from the toolkit: its headers are hashed on every lookup. */
  if (ndirs == 2) {
    const char *h16 = "#include <cuda_fp16.h>\n"
                      "extern \"C\" __global__ void h2f(const __half *x, float *y, int n) {\n"
                      "  int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
                      "  if (i < n) y[i] = __half2float(x[i]);\n"
                      "}\n";
    q.source = h16;
    q.name = "h2f.cu";
    EXPECT(cudacc_compile(&q, &a, err, sizeof err) == 0 && !a.cache_hit);
    if (a.cubin == NULL) printf("fp16: %s\n%s\n", err, a.log);
    EXPECT(cudacc_compile(&q, &b, err, sizeof err) == 0 && b.cache_hit);
    printf("cuda_fp16.h kernel: cold %.1f ms, cached %.3f ms\n", a.seconds * 1e3, b.seconds * 1e3);
    cudacc_result_free(&a);
    cudacc_result_free(&b);
  }
}

int main(int argc, char **argv) {
  self_path = argv[0];
  if (argc > 1 && strcmp(argv[1], "--hit-child") == 0) return hit_child();
  if (argc > 1 && strcmp(argv[1], "--race-child") == 0) return race_child();
  if (!mkdtemp(tmpdir)) {
    perror("mkdtemp");
    return 1;
  }
  snprintf(cachedir, sizeof cachedir, "%s/cache", tmpdir);
  setenv("HPDL_CACHE", cachedir, 1);
  char dir[600];
  EXPECT(cudacc_cache_dir(dir, sizeof dir) == 0);
  EXPECT_STR(dir, cachedir);

  test_sha256();
  test_not_found();
  test_elf_synthetic();

  char err[2048];
  const CudaccNvrtc *lib = cudacc_nvrtc(err, sizeof err);
  if (!lib) {
    printf("skipped: %s\n", err);
    remove_tree(tmpdir);
    return test_failures ? 1 : 0;
  }
  int major = 0, minor = 0;
  cudacc_nvrtc_version(lib, &major, &minor);
  printf("NVRTC %d.%d at %s\n", major, minor, cudacc_nvrtc_path(lib));

  test_compile_and_cache();
  test_compile_error();
  test_headers();
  test_concurrent();

  remove_tree(tmpdir);
  TEST_DONE();
}
