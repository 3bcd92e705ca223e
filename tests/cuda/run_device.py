#!/usr/bin/env python3
"""run_device.py - hpdlrun on a --target cuda artifact against the same job
compiled for the CPU: the same sample, data, seed and steps; every step's
loss and gradient norm (--metrics) must agree within --tol (relative).

  run_device.py --hpdlc H --hpdlrun R --hpdl-data D --sample S --device cuda|emulate
                [--steps N] [--tol T] [--keep DIR]

Exits 77 (CTest's skip) when the device cannot run: no GPU or driver for
--device cuda (hpdlrun's message is printed), or no C++ compiler for
--emulate's kernels."""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile


def run(cmd, **kw):
    return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)


def metrics(path):
    with open(path) as f:
        return [json.loads(l) for l in f if l.strip()]


def main():
    ap = argparse.ArgumentParser()
    for a in ("--hpdlc", "--hpdlrun", "--hpdl-data", "--sample", "--device"):
        ap.add_argument(a, required=True)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--tol", type=float, default=1e-4)
    ap.add_argument("--arch", default=None)
    ap.add_argument("--keep", default=None)
    a = ap.parse_args()
    tmp = a.keep or tempfile.mkdtemp(prefix="hpdl-rundev-")
    os.makedirs(tmp, exist_ok=True)
    try:
        r = run([a.hpdl_data, "--synthetic", "200000", "-o", f"{tmp}/data/syn"])
        if r.returncode:
            print(r.stdout)
            return 1
        data = f"{tmp}/data/syn_train_*.bin"
        cuda = [a.hpdlc, "compile", a.sample, "--target", "cuda", "-o", f"{tmp}/cuda"]
        if a.device == "emulate":
            cuda.append("--emulate")
        if a.arch:
            cuda += ["--arch", a.arch]
        for name, cmd in (("cpu", [a.hpdlc, "compile", a.sample, "-o", f"{tmp}/cpu"]), ("cuda", cuda)):
            r = run(cmd)
            if r.returncode:
                print(r.stdout)
                if name == "cuda" and "NVRTC not found" in r.stdout:
                    print("skipped: no NVRTC to compile the CUDA artifact")
                    return 77
                if name == "cuda" and "did not compile as C++" in r.stdout:
                    print("skipped: no C++ compiler for the emulated kernels")
                    return 77
                return 1
        runs = {}
        for name, extra in (("cpu", []), ("cuda", ["--device", a.device])):
            cmd = [a.hpdlrun, f"{tmp}/{name}", "--steps", str(a.steps), "--log-every", "1", "--data", data,
                   "--checkpoint-dir", f"{tmp}/ckpt-{name}", "--metrics", f"{tmp}/{name}.jsonl", "--progress", "plain"] + extra
            r = run(cmd)
            print(r.stdout.rstrip())
            if r.returncode:
                if name == "cuda" and a.device == "cuda" and ("no CUDA driver" in r.stdout or "sees no GPU" in r.stdout
                                                             or "no cuBLASLt" in r.stdout):
                    print("skipped: no GPU to run on")
                    return 77
                return 1
            runs[name] = metrics(f"{tmp}/{name}.jsonl")
        bad = 0
        for c, g in zip(runs["cpu"], runs["cuda"]):
            for key in ("loss", "grad_norm"):
                x, y = c[key], g[key]
                err = abs(x - y) / max(abs(x), 1e-30)
                ok = err <= a.tol
                bad += not ok
                print(f"step {c['step']}: {key} cpu {x:.9g} {a.device} {y:.9g} (relative {err:.2e}){'' if ok else '  FAIL'}")
        if len(runs["cpu"]) != a.steps or len(runs["cuda"]) != a.steps:
            print(f"expected {a.steps} steps of metrics, got {len(runs['cpu'])} and {len(runs['cuda'])}")
            bad += 1
        print(f"{a.device} against cpu: {'agree' if not bad else f'{bad} differ'} within {a.tol} over {a.steps} steps")
        return 1 if bad else 0
    finally:
        if not a.keep:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
