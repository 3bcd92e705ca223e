#!/usr/bin/env python3
"""device_memory.py - what the (emulated) device holds, from HPDL_PROFILE's
device memory line (rank 0's executor peak), each run also checked against
the CPU target by run_device.py, on a small GPT-2 of 8 layers:
- ZeRO 2 and 3 at dp 2 below ZeRO 1 by at least 90% of the fp32 gradients
  of all the layers but three (ZeRO 2), and of the gradients and weights of
  all but three and two (ZeRO 3);
- in bf16, ZeRO 3 below ZeRO 1 by that and 90% of the bf16 copies of the
  GEMMs' weights of all the layers but three (a gathered layer's copies are
  its own, back to the pool with it); and below ZeRO 3 with fp32 gathers
  (HPDL_ZERO3_GATHER=fp32) by 80% of the fp32 GEMM weights of the two
  layers in flight (gathered as their bf16 copies, a rank holds none);
- pipeline stage 0 of pp 2 below one rank by at least 90% of the weights and
  gradients of the other stage's 4 layers (a stage holds its own layers).

  device_memory.py RUN_DEVICE_ARGS...   (run_device.py's arguments but --args)

Exits 77 where run_device.py does (no C++ compiler for the kernels)."""
import os
import re
import subprocess
import sys

SIZES = "-D T=16 -D C=64 -D L=8 --global-batch 4 --micro-batch 2"


def peak(extra, tols=(), **more_env):
    env = dict(os.environ, HPDL_PROFILE="1", **more_env)
    cmd = [sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "run_device.py")] + sys.argv[1:] + list(
        tols) + ["--args", f"{SIZES} {extra}", "--show", "device memory"]
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    print(r.stdout.strip().splitlines()[-1] if r.stdout.strip() else "(no output)")
    if r.returncode:
        print(r.stdout)
        sys.exit(r.returncode)
    m = re.findall(r"executor's peak ([0-9.]+) MB", r.stdout)
    if not m:
        print(r.stdout)
        print("no device memory line")
        sys.exit(1)
    return float(m[-1])


def main():
    z1, z2, z3 = peak("--dp 2 --zero 1"), peak("--dp 2 --zero 2"), peak("--dp 2 --zero 3")
    # (bf16 against the CPU target's bf16 run: the bf16 layouts' tolerances)
    bf16 = ("--first-tol", "1e-4", "--tol", "1e-3")
    b1, b3 = peak("--dp 2 --zero 1 --precision bf16", bf16), peak("--dp 2 --zero 3 --precision bf16", bf16)
    b3f = peak("--dp 2 --zero 3 --precision bf16", bf16, HPDL_ZERO3_GATHER="fp32")
    p1, p2 = peak(""), peak("--pp 2")
    # gpt2-tiny at C 64, L 8: a layer's weights 12 C^2 + 13 C values
    c, layers = 64, 8
    layer = (12 * c * c + 13 * c) * 4 / 1e6
    # ZeRO 2 holds the gradients of at most three layers (the one running
    # backward, the one before it whose reduce-scatter runs, one settling);
    # ZeRO 3 also the parameters of two (the one in use, the next gathered)
    want2, want3, wantp = 0.9 * (layers - 3) * layer, 0.9 * (2 * layers - 5) * layer, 0.9 * 2 * (layers // 2) * layer
    # bf16: ZeRO 3 also holds the bf16 copies of the GEMMs' weights (12 C^2
    # values a layer, 2 bytes each) of the gathered layers only
    layer16 = 12 * c * c * 2 / 1e6
    want16 = want3 + 0.9 * (layers - 3) * layer16
    want16g = 0.8 * 2 * 12 * c * c * 4 / 1e6
    print(f"executor's peak: ZeRO-1 {z1:.3f} MB, ZeRO-2 {z2:.3f} MB (saves {z1 - z2:.3f} MB; at least {want2:.3f} expected), "
          f"ZeRO-3 {z3:.3f} MB (saves {z1 - z3:.3f} MB; at least {want3:.3f} expected); one rank {p1:.3f} MB, "
          f"pp 2 stage 0 {p2:.3f} MB (saves {p1 - p2:.3f} MB; at least {wantp:.3f} expected); bf16: ZeRO-1 {b1:.3f} MB, "
          f"ZeRO-3 {b3:.3f} MB (saves {b1 - b3:.3f} MB; at least {want16:.3f} expected), with fp32 gathers {b3f:.3f} MB "
          f"(bf16's save {b3f - b3:.3f} MB; at least {want16g:.3f} expected)")
    return 0 if (z1 - z2 >= want2 and z1 - z3 >= want3 and p1 - p2 >= wantp and b1 - b3 >= want16
                 and b3f - b3 >= want16g) else 1


if __name__ == "__main__":
    sys.exit(main())
