#!/usr/bin/env python3
"""cpu_bench.py - the measurements of bench/cpu_bench.sh (see there).

    python3 bench/cpu_bench.py --bin build/bin [--quick] [--no-coretype]
"""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
GPT2 = os.path.join(ROOT, "samples", "gpt2.hpd")
B, T = 4, 64
# the step of row 1: GPT-2 small at B x T, one rank, fp32 as the baseline
# runs it (the .hpd's bf16 would store activations in 16 bits, docs/compiler.md)
STEP_FLAGS = ["-D", f"T={T}", "--dp", "1", "--global-batch", str(B), "--micro-batch", str(B), "--cluster", "cpu",
              "--precision", "fp32"]
# the attention-heavy row: the same model at T = 1024 (issue 16: >= 60% of sgemm)
LONG_B, LONG_T = 1, 1024
LONG_FLAGS = ["-D", f"T={LONG_T}", "--dp", "1", "--global-batch", str(LONG_B), "--micro-batch", str(LONG_B),
              "--cluster", "cpu", "--precision", "fp32"]
# row 3: a GPT-2 of 3.2M parameters (byte vocabulary, 4 layers of width 256)
MID = ["-D", "V=256", "-D", "T=128", "-D", "C=256", "-D", "L=4", "-D", "H=4", "--precision", "fp32"]
MID_B = 8
# the convolutional row: samples/resnet18.hpd (width 64) at this batch
RESNET18 = os.path.join(ROOT, "samples", "resnet18.hpd")
RES_B = 32


class BenchError(Exception):
    pass


def run(cmd, env=None, timeout=1800):
    e = dict(os.environ)
    for k, v in (env or {}).items():
        if v is None:
            e.pop(k, None)
        else:
            e[k] = v
    p = subprocess.run(cmd, capture_output=True, text=True, env=e, timeout=timeout)
    if p.returncode != 0:
        raise BenchError(f"{' '.join(cmd)}: exit {p.returncode}\n{p.stdout[-2000:]}{p.stderr[-2000:]}")
    return p


def blas_env(coretype, threads):
    """The environment of a measurement: the BLAS's thread count, and its
    core type (None: OpenBLAS's own detection)."""
    return {"OPENBLAS_CORETYPE": coretype, "OPENBLAS_NUM_THREADS": str(threads), "OMP_NUM_THREADS": str(threads)}


def compile_job(args, out, flags):
    run([os.path.join(args.bin, "hpdlc"), "compile", GPT2, "--target", "cpu", "-q", "-o", out] + flags)


def hpdl_steps(args, art, data, steps, env, np_=1, threads=None):
    """Median seconds per step and tokens/s over the steps after the first
    (which pays for the first touch of every page), from --metrics."""
    with tempfile.TemporaryDirectory() as d:
        m = os.path.join(d, "m.jsonl")
        cmd = [os.path.join(args.bin, "hpdlrun"), art, "--data", data, "--steps", str(steps), "--metrics", m,
               "--progress", "quiet", "--checkpoint-every", "0"]
        if np_ > 1:
            cmd[1:1] = ["-np", str(np_)]
        if threads:
            cmd += ["--threads", str(threads)]
        run(cmd, env=env)
        rows = [json.loads(line) for line in open(m)]
    rows = rows[1:] if len(rows) > 1 else rows
    return statistics.median(r["step_s"] for r in rows), statistics.median(r["tokens_per_s"] for r in rows)


def sgemm_gflops(args, env):
    """OpenBLAS sgemm (1024^3, best of 5) as `hpdlc plan --measure-cpu` measures it."""
    p = run([os.path.join(args.bin, "hpdlc"), "plan", GPT2, "--measure-cpu"] + STEP_FLAGS, env=env)
    m = re.search(r"measured cpu: sgemm ([\d.]+) GFLOP/s \(([^)]*)\)", p.stdout + p.stderr)
    if not m:
        raise BenchError("no 'measured cpu' line from hpdlc plan --measure-cpu")
    return float(m.group(1)), m.group(2)


def torch_python():
    """A Python that imports torch: $HPDL_TORCH_PYTHON (e.g. a virtual environment with
    PyPI's newest torch, the baseline the product names), else python3."""
    for py in (os.environ.get("HPDL_TORCH_PYTHON"), "python3", "/usr/bin/python3"):
        if not py:
            continue
        exe = shutil.which(py) or (py if os.path.exists(py) else None)
        if exe and subprocess.run([exe, "-c", "import torch"], capture_output=True).returncode == 0:
            return exe
    return None


def torch_step(py, threads, steps, env, precision="fp32"):
    p = run([py, os.path.join(HERE, "torch_gpt2.py"), "--batch", str(B), "--seq", str(T), "--threads", str(threads),
             "--steps", str(steps), "--warmup", "1", "--precision", precision], env=env)
    return json.loads(p.stdout.strip().splitlines()[-1])["ms_per_step"] / 1e3


def loadavg():
    try:
        return open("/proc/loadavg").read().split()[0]
    except OSError:
        return "?"


def has_avx512():
    try:
        return " avx512f " in open("/proc/cpuinfo").read()
    except OSError:
        return False


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--quick", action="store_true", help="fewer timed steps")
    ap.add_argument("--no-coretype", action="store_true", help="only OpenBLAS as it detects the CPU")
    args = ap.parse_args()
    # the cores this process may run on (a taskset or cgroup limit counts)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    steps = 3 if args.quick else 5
    rows, notes = [], []

    def row(measure, value, baseline, ratio, goal, met):
        rows.append((measure, value, baseline, ratio, goal, met))
        print("  measured: %s: %s (baseline %s)" % (measure, value, baseline), flush=True)

    cpu = "?"
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    print(f"cpu_bench: {cpu}, {cores} cores, load average {loadavg()} at the start; "
          f"{subprocess.run([os.path.join(args.bin, 'hpdlc'), '--version'], capture_output=True, text=True).stdout.strip()}",
          flush=True)
    work = tempfile.mkdtemp(prefix="hpdl-cpu-bench-")
    try:
        data = os.path.join(work, "tok")
        run([os.path.join(args.bin, "hpdl-data"), "--synthetic", "400000", "--seed", "1", "-o", data])
        data += "_train_*.bin"

        # 4. compile time of the sample as it is (dp=8 on a DGX, micro-batch 64 x 1024)
        out = os.path.join(work, "gpt2-as-is")
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            compile_job(args, out, [])
            times.append(time.perf_counter() - t0)
        ct = statistics.median(times)
        compile_row = ("hpdlc compile samples/gpt2.hpd --target cpu", f"{ct:.2f} s", "-", "-", "< 2 s", ct < 2.0)

        # 1 and 2: the 124M step
        step_art = os.path.join(work, "gpt2")
        compile_job(args, step_art, STEP_FLAGS)
        plan = json.loads(run([os.path.join(args.bin, "hpdlc"), "plan", GPT2, "--format", "json"] + STEP_FLAGS).stdout)
        flops = plan["model"]["flops_per_step"]
        notes.append(f"model FLOPs per step (hpdlc plan, GEMMs of forward and backward): {flops / 1e9:.1f} G")
        py = torch_python()
        if not py:
            notes.append("PyTorch not found: the PyTorch ratio is skipped (Debian: apt-get install python3-torch)")
        modes = [("default", None)]
        if has_avx512() and not args.no_coretype:
            modes.append(("SkylakeX", "SkylakeX"))
        for label, coretype in modes:
            env = blas_env(coretype, cores)
            tag = f"BLAS {label}" if coretype is None else f"OPENBLAS_CORETYPE={coretype}"
            # sgemm before and after the two steps, and the best of the two:
            # other work on the machine changes while the bench runs
            gf, how = sgemm_gflops(args, env)
            s, _ = hpdl_steps(args, step_art, data, steps + 1, env)
            ts = torch_step(py, cores, steps, env) if py else None
            gf = max(gf, sgemm_gflops(args, env)[0])
            if py:
                row(f"gpt2 124M step B={B} T={T}, {cores} threads, {tag}: hpdl vs PyTorch eager", f"{s * 1e3:.0f} ms",
                    f"{ts * 1e3:.0f} ms", f"{ts / s:.2f}x", ">= 3x", ts / s >= 3.0)
            else:
                row(f"gpt2 124M step B={B} T={T}, {cores} threads, {tag}: hpdl", f"{s * 1e3:.0f} ms", "no PyTorch", "-",
                    ">= 3x", None)
            achieved = flops / s / 1e9
            row(f"  step FLOP/s vs sgemm 1024^3 ({how}), {tag}", f"{achieved:.1f} GFLOP/s", f"{gf:.1f} GFLOP/s",
                f"{achieved / gf:.0%}", ">= 75%", achieved / gf >= 0.75)
            if coretype is None:
                # the same step under train { precision = bf16 }: activations
                # stored in bf16, the GEMMs on bf16 operands (oneDNN where
                # installed: hpdlrun --info's "bf16 GEMMs" line names it)
                bf_art = os.path.join(work, "gpt2-bf16")
                compile_job(args, bf_art, STEP_FLAGS[:-1] + ["bf16"])
                info = run([os.path.join(args.bin, "hpdlrun"), "--info"], env=env).stdout
                m = re.search(r"bf16 GEMMs +(.*)", info)
                gemm16 = m.group(1).strip() if m else "?"
                sb, _ = hpdl_steps(args, bf_art, data, steps + 1, env)
                row(f"  the same step in bf16 (GEMMs: {gemm16}) vs hpdl fp32", f"{sb * 1e3:.0f} ms", f"{s * 1e3:.0f} ms",
                    f"{s / sb:.2f}x", "-", None)
                if py:
                    row(f"  the same step in bf16 vs PyTorch eager (fp32)", f"{sb * 1e3:.0f} ms", f"{ts * 1e3:.0f} ms",
                        f"{ts / sb:.2f}x", ">= 3x", ts / sb >= 3.0)
                    # like for like: PyTorch's own mixed precision on the CPU (autocast to
                    # bfloat16, oneDNN's bf16 GEMMs), fp32 weights and optimizer as hpdl's
                    tb = torch_step(py, cores, steps, env, "bf16")
                    row(f"  the same step in bf16 vs PyTorch eager (bf16 autocast)", f"{sb * 1e3:.0f} ms",
                        f"{tb * 1e3:.0f} ms", f"{tb / sb:.2f}x", ">= 3x", tb / sb >= 3.0)
                # parallel.fused_ce: the head's GEMM and the loss in blocks, the logits never
                # stored, the backward making them again (a memory setting: its price in time)
                for prec, base in (("fp32", s), ("bf16", sb)):
                    fa = os.path.join(work, f"gpt2-fce-{prec}")
                    compile_job(args, fa, STEP_FLAGS[:-1] + [prec, "--fused-ce", "on"])
                    sf, _ = hpdl_steps(args, fa, data, steps + 1, env)
                    row(f"  the same step, {prec}, with fused_ce (logits never stored) vs without", f"{sf * 1e3:.0f} ms",
                        f"{base * 1e3:.0f} ms", f"{base / sf:.2f}x", "-", None)
                # start-up: launch to the first step (the initial values of 124M
                # parameters, the arena's first touch), as hpdlrun --steps 0 pays it
                t0 = time.perf_counter()
                run([os.path.join(args.bin, "hpdlrun"), step_art, "--data", data, "--steps", "0", "--progress", "quiet",
                     "--checkpoint-every", "0"], env=env)
                st = time.perf_counter() - t0
                row(f"start-up of the 124M run (hpdlrun --steps 0), {cores} threads", f"{st:.2f} s", "-", "-", "< 2 s",
                    st < 2.0)
                # the attention-heavy step: T = 1024
                long_art = os.path.join(work, "gpt2-long")
                compile_job(args, long_art, LONG_FLAGS)
                lplan = json.loads(run([os.path.join(args.bin, "hpdlc"), "plan", GPT2, "--format", "json"] +
                                       LONG_FLAGS).stdout)
                lflops = lplan["model"]["flops_per_step"]
                ls, _ = hpdl_steps(args, long_art, data, 3 if args.quick else 4, env)
                la = lflops / ls / 1e9
                row(f"gpt2 124M step B={LONG_B} T={LONG_T} ({lflops / 1e9:.0f} GFLOP), {tag}: FLOP/s vs sgemm",
                    f"{la:.1f} GFLOP/s", f"{gf:.1f} GFLOP/s", f"{la / gf:.0%}", ">= 60%", la / gf >= 0.6)

        # 5. a convolutional network: samples/resnet18.hpd (torchvision's resnet18,
        #    width 64) at batch 32 on synthetic images, against PyTorch eager
        images = os.path.join(work, "img")
        run([os.path.join(args.bin, "hpdl-data"), "--synthetic-images", "512", "--seed", "1", "-o", images])
        res_art = os.path.join(work, "resnet18")
        run([os.path.join(args.bin, "hpdlc"), "compile", RESNET18, "--target", "cpu", "-q", "-o", res_art,
             "--micro-batch", str(RES_B), "--global-batch", str(RES_B)])
        env = blas_env(None, cores)
        rs, _ = hpdl_steps(args, res_art, images + "_train_*.img", steps + 1, env)
        if py:
            p = run([py, os.path.join(HERE, "torch_resnet.py"), "--batch", str(RES_B), "--threads", str(cores), "--steps",
                     str(steps), "--warmup", "1"], env=env)
            rt = json.loads(p.stdout.strip().splitlines()[-1])["ms_per_step"] / 1e3
            row(f"resnet18 step B={RES_B} 3x32x32, {cores} threads: hpdl vs PyTorch eager", f"{rs * 1e3:.0f} ms",
                f"{rt * 1e3:.0f} ms", f"{rt / rs:.2f}x", ">= 1x", rt / rs >= 1.0)
        else:
            row(f"resnet18 step B={RES_B} 3x32x32, {cores} threads: hpdl", f"{rs * 1e3:.0f} ms", "no PyTorch", "-",
                ">= 1x", None)

        # 3. weak scaling, one thread per rank
        one, two = os.path.join(work, "mid1"), os.path.join(work, "mid2")
        compile_job(args, one, MID + ["--dp", "1", "--global-batch", str(MID_B), "--micro-batch", str(MID_B),
                                      "--cluster", "cpu"])
        compile_job(args, two, MID + ["--dp", "2", "--gpus", "2", "--global-batch", str(2 * MID_B), "--micro-batch",
                                      str(MID_B), "--cluster", "cpu"])
        env = blas_env(None, 1)
        wsteps = 6 if args.quick else 10
        _, tok1 = hpdl_steps(args, one, data, wsteps, env, threads=1)
        _, tok2 = hpdl_steps(args, two, data, wsteps, env, np_=2, threads=1)
        row(f"weak scaling, 3.2M GPT-2 B={MID_B} T=128/rank, 1 thread/rank: dp=2 vs 1 rank",
            f"{tok2:.0f} tok/s", f"{tok1:.0f} tok/s", f"{tok2 / tok1:.2f}x", ">= 1.9x", tok2 / tok1 >= 1.9)
        rows.append(compile_row)
    except BenchError as e:
        print(f"cpu_bench: error: {e}", file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(work, ignore_errors=True)

    print()
    w = max(len(r[0]) for r in rows)
    fmt = "%-" + str(w) + "s  %14s  %14s  %7s  %12s  %s"
    print(fmt % ("measure", "value", "baseline", "ratio", "goal", "met?"))
    for r in rows:
        met = "n/a" if r[5] is None else "yes" if r[5] else "NO"
        print(fmt % (r[0], r[1], r[2], r[3], r[4], met))
    for n in notes:
        print("note: " + n)
    print(f"load average {loadavg()} at the end (other work on the machine slows every row)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
