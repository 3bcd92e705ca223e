#!/usr/bin/env python3
"""missing_libs.py - what hpdlrun says when the GPU path cannot run.

  missing_libs.py --hpdlc H --hpdlrun R --hpdl-data D --sample S --what libcuda|cublaslt|nccl|info

libcuda: HPDL_LIBCUDA names a library that is not there; `hpdlrun DIR` on a
--target cuda artifact must exit 1 with one line of error that names the
path (and the --device emulate hint), nothing else on stderr, no crash.
cublaslt: the same with HPDL_CUBLASLT, which only a machine with a GPU
reaches (skipped, 77, elsewhere). nccl: an emulated dp 2 artifact run with
HPDL_COLLECTIVES=nccl and HPDL_NCCL naming a library that is not there
must fail the same way (one line naming the path). info: `hpdlrun --info` names every part,
and a library made absent by its variable is reported absent with its path."""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile


def run(cmd, env=None):
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=e)


def check_info(a):
    r = run([a.hpdlrun, "--info"], {"HPDL_NCCL": "/nonexistent/libnccl.so.2"})
    print(r.stdout + r.stderr)
    bad = 0
    if r.returncode != 0:
        print(f"exit {r.returncode}, expected 0")
        bad += 1
    for part in ("MPI", "BLAS", "cores", "CUDA driver", "NVRTC", "cuBLASLt", "NCCL"):
        if not re.search(rf"^  {re.escape(part)} +\S", r.stdout, re.M):
            print(f"no line for {part}")
            bad += 1
    if not re.search(r"^  NCCL +absent: could not open /nonexistent/libnccl\.so\.2 ", r.stdout, re.M):
        print("HPDL_NCCL=/nonexistent/libnccl.so.2: the NCCL line does not say it is absent, naming the path")
        bad += 1
    if not re.search(r"^  CUDA driver +(absent: could not open \S+|\d+\.\d+, )", r.stdout, re.M):
        print("the driver line gives neither a version nor why it is absent")
        bad += 1
    return 1 if bad else 0


def main():
    ap = argparse.ArgumentParser()
    for o in ("--hpdlc", "--hpdlrun", "--hpdl-data", "--sample", "--what"):
        ap.add_argument(o, required=True)
    a = ap.parse_args()
    if a.what == "info":
        return check_info(a)
    if a.what == "cublaslt":  # reached only where the driver sees a GPU: say so before compiling
        r = run([a.hpdlrun, "--info"])
        if not any(l.startswith("    GPU ") for l in r.stdout.splitlines()):
            print("\n".join(l for l in r.stdout.splitlines() if "CUDA driver" in l))
            print("skipped: no GPU here, so cuBLASLt is never reached")
            return 77
    tmp = tempfile.mkdtemp(prefix="hpdl-missing-")
    try:
        extra = ["--emulate", "--dp", "2", "--global-batch", "4", "--micro-batch", "2"] if a.what == "nccl" else []
        r = run([a.hpdlc, "compile", a.sample, "--target", "cuda", "-o", f"{tmp}/art"] + extra)
        if r.returncode:
            print(r.stdout + r.stderr)
            if "NVRTC not found" in r.stdout + r.stderr:
                print("skipped: no NVRTC to compile the CUDA artifact")
                return 77
            if "did not compile as C++" in r.stdout + r.stderr:
                print("skipped: no C++ compiler for the emulated kernels")
                return 77
            return 1
        r = run([a.hpdl_data, "--synthetic", "50000", "-o", f"{tmp}/data/syn"])
        if r.returncode:
            print(r.stdout + r.stderr)
            return 1
        var, path = {"libcuda": ("HPDL_LIBCUDA", "/nonexistent/libcuda.so.1"),
                     "cublaslt": ("HPDL_CUBLASLT", "/nonexistent/libcublasLt.so"),
                     "nccl": ("HPDL_NCCL", "/nonexistent/libnccl.so.2")}[a.what]
        env = {var: path}
        flags = []
        if a.what == "nccl":
            env["HPDL_COLLECTIVES"] = "nccl"
            flags = ["--device", "emulate"]
        r = run([a.hpdlrun, f"{tmp}/art", "--steps", "1", "--data", f"{tmp}/data/syn_train_*.bin", "--checkpoint-dir",
                 f"{tmp}/ckpt", "--progress", "plain"] + flags, env)
        print(f"{var}={path}: exit {r.returncode}\nstdout:\n{r.stdout}stderr:\n{r.stderr}")
        if a.what == "cublaslt" and ("no CUDA driver" in r.stderr or "sees no GPU" in r.stderr):
            print("skipped: no GPU here, so cuBLASLt is never reached")
            return 77
        lines = [l for l in r.stderr.splitlines() if l.strip()]
        want = {"libcuda": rf"^hpdlrun: error: no CUDA driver: could not open {re.escape(path)} .*--device emulate",
                "cublaslt": rf"^hpdlrun: error: no cuBLASLt for the GEMMs: could not open {re.escape(path)} ",
                "nccl": rf"^hpdlrun: error: collectives over NCCL: no NCCL: could not open {re.escape(path)} "}[a.what]
        bad = 0
        if r.returncode != 1:
            print(f"exit {r.returncode}, expected 1")
            bad += 1
        errors = [l for l in lines if "error" in l]
        if len(errors) != 1 or not re.search(want, errors[0]):
            print(f"expected one error line matching {want!r}, got {errors}")
            bad += 1
        if any(s in r.stderr for s in ("Sanitizer", "Segmentation", "core dumped", "Aborted")):
            print("a crash")
            bad += 1
        print("ok" if not bad else f"{bad} problems")
        return 1 if bad else 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
