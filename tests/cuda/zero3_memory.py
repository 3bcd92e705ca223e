#!/usr/bin/env python3
"""zero3_memory.py - ZeRO-3 on the (emulated) device holds less than ZeRO-1:
the same small GPT-2 at dp 2 under ZeRO 1 and 3 through run_device.py (each
also checked against the CPU target), HPDL_PROFILE=1 for the device memory
line, and the layers' parameters must be gone from the executor's peak:
it must be below ZeRO-1's by at least 90% of the fp32 weights of all the
layers but two (the layer in use and the next one, gathered).

  zero3_memory.py RUN_DEVICE_ARGS...   (run_device.py's arguments but --args)

Exits 77 where run_device.py does (no C++ compiler for the kernels)."""
import os
import re
import subprocess
import sys

SIZES = "-D T=16 -D C=64 -D L=8 --global-batch 4 --micro-batch 2"


def peak(extra):
    env = dict(os.environ, HPDL_PROFILE="1")
    cmd = [sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "run_device.py")] + sys.argv[1:] + [
        "--args", f"{SIZES} --dp 2 {extra}", "--show", "device memory"]
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
    z1, z3 = peak("--zero 1"), peak("--zero 3")
    # gpt2-tiny at C 64, L 8: a layer's weights 12 C^2 + 13 C values
    c, layers = 64, 8
    layer = (12 * c * c + 13 * c) * 4 / 1e6
    want = 0.9 * (layers - 2) * layer
    print(f"executor's peak: ZeRO-1 {z1:.3f} MB, ZeRO-3 {z3:.3f} MB (saves {z1 - z3:.3f} MB; at least {want:.3f} MB expected)")
    return 0 if z1 - z3 >= want else 1


if __name__ == "__main__":
    sys.exit(main())
