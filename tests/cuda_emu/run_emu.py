#!/usr/bin/env python3
"""run_emu.py - CUDA kernels on the CPU through kernels/cuda_emu.h (CTest: cuda_emu.CASE).

    run_emu.py --source REPO --work DIR [--cuda-home DIR] CASE

Compiles tests/cuda_emu/CASE.cu (plain CUDA C, as the CUDA back end writes it) with
tests/cuda_emu/CASE_test.cpp (the host side: inputs, launches, a reference, the
comparison) the way hpdlc will compile generated kernels: the system C++ compiler
($HPDL_CXX, else $CXX, else c++, g++, clang++), -x c++, the harness forced in with
-include. Then runs the program under every scheduling order of the harness
(HPDL_EMU_ORDER=forward, reverse, random with two seeds): each must exit 0.

  elementwise  float4 loads on lengths that are no multiple of 4 or of the block
  softmax      row softmax, rows of 1, 31, 33, 1000, 4097; blocks of 32, 256, 1024
  layernorm    LayerNorm forward, the same rows, the row cached in dynamic shared memory
  bf16         bf16 / fp16 storage, fp32 accumulation: conversions against an
               independent round-to-nearest-even, every 16-bit pattern, the errors
  warp         the warp primitives (shuffles of 5 types and widths, ballot, any, all,
               reductions), __syncthreads_count/and/or, atomics, a 2-D block
  divergent    divergent barriers, bad masks, bad launches, __trap: each reported as
               an error, never a hang (each run has a time limit)
  mutation     softmax.cu with one __syncthreads() removed, each in turn: every
               mutant must fail under at least one order
  cuda_compile the same .cu files through the real nvcc -arch=sm_80 -cubin and NVRTC
               (skipped without a CUDA toolkit)

Exit 0 pass, 1 fail, 77 skip (no C++ compiler; no CUDA toolkit for cuda_compile).
"""
import argparse
import ctypes
import glob
import os
import re
import shlex
import shutil
import subprocess
import sys

SKIP = 77
HERE = os.path.dirname(os.path.abspath(__file__))
ORDERS = [("forward", None), ("reverse", None), ("random", "1"), ("random", "2")]
RUN_TIMEOUT = 120  # seconds a test program may run: a hang is a failure, not a wait


class Fail(Exception):
    pass


def find_cxx():
    """The C++ compiler hpdlc would use, as a command list, and whether the
    environment named it; or (None, False)."""
    for var in ("HPDL_CXX", "CXX"):
        if os.environ.get(var, "").strip():
            return shlex.split(os.environ[var]), True
    for name in ("c++", "g++", "clang++"):
        path = shutil.which(name)
        if path:
            return [path], False
    return None, False


def sh(args, timeout, env=None, cwd=None):
    try:
        p = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout,
                           env=env, cwd=cwd)
        return p.returncode, p.stdout
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        return None, out
    except OSError as e:  # no such program
        return 127, str(e)


class Emu:
    def __init__(self, args):
        self.args = args
        self.cxx, self.named = find_cxx()
        self.header = os.path.join(args.source, "kernels", "cuda_emu.h")
        os.makedirs(args.work, exist_ok=True)
        self.flags = ["-std=c++17", "-O2", "-fno-strict-aliasing", "-Wall", "-Wextra"]

    def usable(self):
        """Skip (77) without a working C++ compiler (fail when $HPDL_CXX or $CXX names
        one that does not work); add UBSan when it links, so that a misaligned float4
        load, which faults on the GPU, fails here too."""
        if not self.cxx:
            print("skipped: no C++ compiler found (set HPDL_CXX or CXX, or install c++)")
            sys.exit(SKIP)
        probe = os.path.join(self.args.work, "probe.cpp")
        with open(probe, "w") as f:
            f.write("#include <vector>\nint main() { std::vector<int> v(3); return int(v.size()) - 3; }\n")
        rc, out = sh([*self.cxx, "-std=c++17", probe, "-o", probe + ".exe"], 120)
        if rc != 0 and self.named:
            raise Fail("the C++ compiler %s (from the environment) cannot build a C++17 program:\n%s" %
                       (" ".join(self.cxx), out))
        if rc != 0:
            print("skipped: the C++ compiler %s cannot build a C++17 program:\n%s" % (" ".join(self.cxx), out))
            sys.exit(SKIP)
        ubsan = ["-fsanitize=alignment,bounds,signed-integer-overflow", "-fno-sanitize-recover=all"]
        rc, _ = sh([*self.cxx, "-std=c++17", *ubsan, probe, "-o", probe + ".exe"], 120)
        if rc == 0:
            self.flags += ubsan
        print("compiler: %s %s" % (" ".join(self.cxx), " ".join(self.flags)))

    def build(self, name, cu, host):
        exe = os.path.join(self.args.work, name)
        compile_checked([*self.cxx, *self.flags, "-include", self.header, "-I", HERE, "-x", "c++", cu, "-x", "c++", host,
                         "-o", exe])
        return exe

    def run(self, exe, order, seed, timeout=RUN_TIMEOUT):
        return run_ordered([exe], order, seed, timeout)


def compile_checked(cmd, timeout=300):
    """Runs a compile; a failure or any warning is a test failure."""
    rc, out = sh(cmd, timeout)
    if rc != 0:
        raise Fail("compile failed: %s\n%s" % (" ".join(cmd), out))
    if out.strip():
        raise Fail("compiler warnings: %s\n%s" % (" ".join(cmd), out))


def run_ordered(cmd, order, seed, timeout=RUN_TIMEOUT):
    """Runs an emulated program with its fibers in `order` (seeded when random)."""
    env = dict(os.environ, HPDL_EMU_ORDER=order)
    if seed:
        env["HPDL_EMU_SEED"] = seed
    return sh(cmd, timeout, env=env)


def label(order, seed):
    return order + (" seed " + seed if seed else "")


def case_program(emu, case, timeout=RUN_TIMEOUT):
    exe = emu.build(case, os.path.join(HERE, case + ".cu"), os.path.join(HERE, case + "_test.cpp"))
    failed = []
    for order, seed in ORDERS:
        rc, out = emu.run(exe, order, seed, timeout)
        print("=== %s, HPDL_EMU_ORDER=%s: %s" % (case, label(order, seed),
                                               "timed out after %d s" % timeout if rc is None else "exit %d" % rc))
        print(out.rstrip())
        if rc != 0:
            failed.append(label(order, seed))
    if failed:
        raise Fail("%s failed under: %s" % (case, ", ".join(failed)))


def case_mutation(emu):
    """Each __syncthreads() of softmax.cu removed in turn must be caught: a failed
    comparison or a harness error under at least one order (never a hang)."""
    src = os.path.join(HERE, "softmax.cu")
    lines = open(src).read().split("\n")
    sites = [i for i, l in enumerate(lines) if "__syncthreads();" in l]
    if not sites:
        raise Fail("softmax.cu has no __syncthreads() to remove")
    missed = []
    for k, i in enumerate(sites):
        mutant = list(lines)
        mutant[i] = mutant[i].replace("__syncthreads();", "/* __syncthreads(); removed by the mutation test */")
        path = os.path.join(emu.args.work, "softmax_mut%d.cu" % k)
        with open(path, "w") as f:
            f.write("\n".join(mutant))
        exe = emu.build("softmax_mut%d" % k, path, os.path.join(HERE, "softmax_test.cpp"))
        caught = []
        for order, seed in ORDERS:
            rc, out = emu.run(exe, order, seed)
            if rc is None:
                raise Fail("mutant %d hung under %s" % (k, label(order, seed)))
            fails = [l for l in out.split("\n") if "FAIL" in l or "hpdl_emu:" in l]
            if rc != 0:
                caught.append(label(order, seed))
            print("mutant %d (softmax.cu:%d '%s' removed), order %s: exit %d%s" %
                  (k, i + 1, lines[i].strip(), label(order, seed), rc,
                   "; first failure: " + fails[0].strip() if fails else ""))
        print("mutant %d: %s" % (k, "caught under " + ", ".join(caught) if caught else "NOT CAUGHT"))
        if not caught:
            missed.append("softmax.cu:%d" % (i + 1))
    if missed:
        raise Fail("barriers whose removal no order caught: " + ", ".join(missed))
    print("all %d mutants caught" % len(sites))


def case_cuda_compile(args):
    """The same .cu files, unchanged, through nvcc and NVRTC for sm_80."""
    home = args.cuda_home or os.environ.get("CUDA_HOME") or ""
    nvcc = os.path.join(home, "bin", "nvcc") if home else shutil.which("nvcc")
    if not nvcc or not os.path.exists(nvcc):
        print("skipped: no CUDA toolkit (nvcc) found; set CUDA_HOME or HPDL_CUDA_HOME")
        sys.exit(SKIP)
    home = home or os.path.dirname(os.path.dirname(nvcc))
    sources = sorted(glob.glob(os.path.join(HERE, "*.cu")))
    for cu in sources:
        cubin = os.path.join(args.work, os.path.basename(cu) + ".cubin")
        rc, out = sh([nvcc, "-arch=sm_80", "-cubin", "-o", cubin, cu], 300)
        print("nvcc -arch=sm_80 -cubin %s: %s" % (os.path.basename(cu), "ok" if rc == 0 else "FAILED"))
        if rc != 0 or out.strip():
            raise Fail("nvcc %s:\n%s" % ("failed" if rc else "warned", out))
    libs = sorted(glob.glob(os.path.join(home, "lib64", "libnvrtc.so*")) +
                  glob.glob(os.path.join(home, "lib", "libnvrtc.so*")))
    libs = [l for l in libs if "builtins" not in l]
    if not libs:
        print("NVRTC: no libnvrtc.so under %s; nvcc only" % home)
        return
    nvrtc = ctypes.CDLL(libs[0])
    for cu in sources:
        prog = ctypes.c_void_p()
        text = open(cu, "rb").read()
        rc = nvrtc.nvrtcCreateProgram(ctypes.byref(prog), text, os.path.basename(cu).encode(), 0, None, None)
        if rc != 0:
            raise Fail("nvrtcCreateProgram %s: %d" % (cu, rc))
        # cuda_fp16.h / cuda_bf16.h come from the toolkit's include folder, as hpdlc
        # will pass it
        opts = [b"--gpu-architecture=sm_80", ("--include-path=" + os.path.join(home, "include")).encode()]
        arr = (ctypes.c_char_p * len(opts))(*opts)
        rc = nvrtc.nvrtcCompileProgram(prog, len(opts), arr)
        size = ctypes.c_size_t()
        nvrtc.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value)
        nvrtc.nvrtcGetProgramLog(prog, log)
        nvrtc.nvrtcDestroyProgram(ctypes.byref(prog))
        print("NVRTC --gpu-architecture=sm_80 %s: %s" % (os.path.basename(cu), "ok" if rc == 0 else "FAILED"))
        if rc != 0 or log.value.strip():
            raise Fail("NVRTC %s:\n%s" % ("failed" if rc else "warned", log.value.decode(errors="replace")))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--source", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--cuda-home", default="")
    ap.add_argument("case")
    args = ap.parse_args()
    try:
        if args.case == "cuda_compile":
            os.makedirs(args.work, exist_ok=True)
            case_cuda_compile(args)
        else:
            emu = Emu(args)
            emu.usable()
            if args.case == "mutation":
                case_mutation(emu)
            elif os.path.exists(os.path.join(HERE, args.case + ".cu")):
                case_program(emu, args.case, 60 if args.case == "divergent" else RUN_TIMEOUT)
            else:
                raise Fail("unknown case " + args.case)
    except Fail as e:
        print("FAIL: %s" % e)
        return 1
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
