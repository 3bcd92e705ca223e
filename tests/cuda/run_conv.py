#!/usr/bin/env python3
"""run_conv.py - hpdlrun on a --target cuda artifact of an image model against the same job
compiled for the CPU (CTest cuda.run.{emulate,cuda}.conv-tiny, tests/cuda_conv.cmake): the
convolution and pooling kernels (kernels/hpdl_conv.cuh) end to end, on synthetic labelled
images; every step's loss and gradient norm within --tol (relative), and the validation loss
of an evaluation pass after the last step (--eval-every: batch norm's running statistics,
which the device's forwards updated, then read in evaluation mode).

    run_conv.py --hpdlc H --hpdlrun R --hpdl-data D --sample S --device cuda|emulate
                [--steps N] [--tol T] [--size CxHxW] [--classes K] [--args "COMPILE ARGS"]

Exits 77 (CTest's skip) when hpdl-data makes no images (--synthetic-images: image inputs
not in this build), when there is no GPU for --device cuda, or no C++ compiler for the
emulated kernels."""
import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile


def run(cmd):
    return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def metrics(path):
    with open(path) as f:
        return [json.loads(l) for l in f if l.strip()]


def main():
    ap = argparse.ArgumentParser()
    for name in ("--hpdlc", "--hpdlrun", "--hpdl-data", "--sample"):
        ap.add_argument(name, required=True)
    ap.add_argument("--device", choices=["cuda", "emulate"], required=True)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--tol", type=float, default=1e-5)
    ap.add_argument("--size", default="3x24x24")
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--args", default="", help="more arguments of both compiles")
    ap.add_argument("--expect", action="append", default=[], help="a text the device run's output must hold (repeatable)")
    a = ap.parse_args()
    if "--synthetic-images" not in run([a.hpdl_data, "--help"]).stdout:
        print("skipped: hpdl-data makes no synthetic images (image inputs are not in this build)")
        return 77
    if a.device == "cuda":
        r = run([a.hpdlrun, "--info"])
        if not any(l.startswith("    GPU ") for l in r.stdout.splitlines()):
            print("skipped: no GPU to run on")
            return 77
    tmp = tempfile.mkdtemp(prefix="hpdl-runconv-")
    try:
        r = run([a.hpdl_data, "--synthetic-images", "512", "--classes", str(a.classes), "--size", a.size, "-o",
                 f"{tmp}/img"])
        print(r.stdout.rstrip())
        if r.returncode:
            return 1
        extra = ["-D", f"classes={a.classes}"] + shlex.split(a.args)
        cuda = [a.hpdlc, "compile", a.sample, "--target", "cuda", "-o", f"{tmp}/cuda"] + extra
        if a.device == "emulate":
            cuda.append("--emulate")
        for name, cmd in (("cpu", [a.hpdlc, "compile", a.sample, "-o", f"{tmp}/cpu"] + extra), ("cuda", cuda)):
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
        for name, flags in (("cpu", []), ("cuda", ["--device", a.device])):
            cmd = [a.hpdlrun, f"{tmp}/{name}", "--steps", str(a.steps), "--log-every", "1", "--data",
                   f"{tmp}/img_train_*.img", "--checkpoint-dir", f"{tmp}/ckpt-{name}", "--metrics", f"{tmp}/{name}.jsonl",
                   "--progress", "plain", "--eval-every", str(a.steps), "--eval-steps", "2"] + flags
            r = run(cmd)
            print(r.stdout.rstrip())
            if r.returncode:
                if name == "cuda" and a.device == "cuda" and ("no CUDA driver" in r.stdout or "sees no GPU" in r.stdout
                                                             or "no cuBLASLt" in r.stdout):
                    print("skipped: no GPU to run on")
                    return 77
                return 1
            runs[name] = metrics(f"{tmp}/{name}.jsonl")
            if name == "cuda":
                cuda_out = r.stdout
        bad = 0
        for text in a.expect:
            if text not in cuda_out:
                print(f"the {a.device} run's output lacks: {text}")
                bad += 1
        if len(runs["cpu"]) != a.steps or len(runs["cuda"]) != a.steps:
            print(f"expected {a.steps} steps of metrics, got {len(runs['cpu'])} and {len(runs['cuda'])}")
            bad += 1
        for c, g in zip(runs["cpu"], runs["cuda"]):
            for key in ("loss", "grad_norm", "val_loss"):
                if key == "val_loss" and c["step"] != a.steps:
                    continue
                x, y = c.get(key, float("nan")), g.get(key, float("nan"))
                err = abs(x - y) / max(abs(x), 1e-30)
                ok = c["step"] == g["step"] and err <= a.tol
                bad += not ok
                print(f"step {c['step']}: {key} cpu {x:.9g} {a.device} {y:.9g} (relative {err:.2e}){'' if ok else '  FAIL'}")
        print(f"{a.device} against cpu: {'agree' if not bad else f'{bad} differ'} within {a.tol} over {a.steps} steps")
        return 1 if bad else 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
