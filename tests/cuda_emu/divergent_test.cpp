/* divergent_test.cpp - each kernel of divergent.cu, and launches with a bad shape,
 * must come back with a non-zero status and a message naming the problem; the driver
 * (run_emu.py) runs this under a time limit, so a hang fails the test. After the
 * errors, a correct kernel still runs. */
#include <cstring>
#include <string>
#include "common.h"

extern "C" void early_return_barrier(int*);
extern "C" void if_else_barrier(int*);
extern "C" void loop_barrier(int*);
extern "C" void shuffle_vs_barrier(float*);
extern "C" void mask_without_caller(float*);
extern "C" void mixed_warp_ops(unsigned*);
extern "C" void trap_in_one_block(int*);
extern "C" void exited_lanes_shuffle(float*);
extern "C" void fine(int*);

static void expect_error(const char* what, int rc, const char* needle) {
  const char* msg = hpdl_emu_last_error();
  bool ok = rc != 0 && std::strstr(msg, needle) != nullptr;
  std::printf("%-34s rc=%d  %s\n    message: %s\n", what, rc, ok ? "ok" : "FAIL (expected an error naming '%s')",
              msg);
  if (!ok) {
    std::printf("    expected: '%s'\n", needle);
    g_failures++;
  }
}

int main() {
  setenv("HPDL_EMU_QUIET", "1", 1);  // the messages are printed below, once
  std::vector<int> iv(1024, 0);
  std::vector<float> fv(1024, 0);
  std::vector<unsigned> uv(1024, 0);
  expect_error("early return before a barrier", HPDL_EMU_LAUNCH(early_return_barrier, dim3(2), dim3(64), 0, iv.data()),
               "divergent barrier");
  expect_error("if / else barriers", HPDL_EMU_LAUNCH(if_else_barrier, dim3(1), dim3(64), 0, iv.data()),
               "divergent barrier");
  expect_error("barrier in a divergent loop", HPDL_EMU_LAUNCH(loop_barrier, dim3(1), dim3(64), 0, iv.data()),
               "divergent barrier");
  expect_error("shuffle vs barrier", HPDL_EMU_LAUNCH(shuffle_vs_barrier, dim3(1), dim3(64), 0, fv.data()),
               "__shfl_down_sync");
  expect_error("mask without the caller", HPDL_EMU_LAUNCH(mask_without_caller, dim3(1), dim3(32), 0, fv.data()),
               "does not name the calling lane");
  expect_error("ballot meets shuffle", HPDL_EMU_LAUNCH(mixed_warp_ops, dim3(1), dim3(32), 0, uv.data()),
               "different warp operations");
  expect_error("__trap in block 2", HPDL_EMU_LAUNCH(trap_in_one_block, dim3(4), dim3(32), 0, iv.data()),
               "block (2,0,0) thread (5,0,0): __trap()");
  expect_error("block of 1025 threads", HPDL_EMU_LAUNCH(fine, dim3(1), dim3(1025), 0, iv.data()), "invalid block size");
  expect_error("block of 32 x 32 x 2", HPDL_EMU_LAUNCH(fine, dim3(1), dim3(32, 32, 2), 0, iv.data()),
               "invalid block size");
  expect_error("block z = 65", HPDL_EMU_LAUNCH(fine, dim3(1), dim3(1, 1, 65), 0, iv.data()), "invalid block size");
  expect_error("grid y = 65536", HPDL_EMU_LAUNCH(fine, dim3(1, 65536), dim3(64), 0, iv.data()), "invalid grid size");
  expect_error("300 KiB of dynamic shared memory", HPDL_EMU_LAUNCH(fine, dim3(1), dim3(64), 300 * 1024, iv.data()),
               "dynamic shared memory");
  const char* order = std::getenv("HPDL_EMU_ORDER");
  std::string saved = order ? order : "";
  setenv("HPDL_EMU_ORDER", "sideways", 1);
  expect_error("HPDL_EMU_ORDER=sideways", HPDL_EMU_LAUNCH(fine, dim3(1), dim3(64), 0, iv.data()), "HPDL_EMU_ORDER");
  setenv("HPDL_EMU_ORDER", saved.c_str(), 1);

  std::vector<float> ex(64, -1.0f);
  int rc = HPDL_EMU_LAUNCH(exited_lanes_shuffle, dim3(1), dim3(64), 0, ex.data());
  bool ok = rc == 0;
  for (int t = 0; t < 64; t++) {
    int lane = t % 32;
    if (lane < 15) ok = ok && ex[t] == float(t + 1);
    if (lane == 15) ok = ok && ex[t] != ex[t];  // from an exited lane: poison (NaN)
    if (lane >= 16) ok = ok && ex[t] == -1.0f;
  }
  check(ok, "exited lanes named in a shuffle mask: allowed; their values NaN");

  std::fill(iv.begin(), iv.end(), 0);
  rc = HPDL_EMU_LAUNCH(fine, dim3(1), dim3(64), 0, iv.data());
  ok = rc == 0;
  for (int t = 0; t < 64; t++) ok = ok && iv[t] == 63 - t;
  check(ok, "a correct kernel after the errors");
  return finish("divergent");
}
