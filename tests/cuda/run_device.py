#!/usr/bin/env python3
"""run_device.py - hpdlrun on a --target cuda artifact against the same job
compiled for the CPU: the same sample, data, seed and steps; every step's
loss and gradient norm (--metrics), and the auxiliary loss where the model
has one, must agree within --tol (relative).

  run_device.py --hpdlc H --hpdlrun R --hpdl-data D --sample S --device cuda|emulate
                [--steps N] [--tol T] [--first-tol T] [--args "COMPILE ARGS"]
                [--resume-args "COMPILE ARGS"] [--keep DIR]

--args are given to both compiles (a layout, -D sizes, batch sizes); the
ranks are the artifact's. --first-tol: the first step's loss must agree
within it (the later steps within --tol). --resume-args: the device run
stops halfway with a checkpoint and a second artifact, compiled with these
arguments instead (another layout), resumes it to the end; its steps must
agree with the CPU run's all the same. --run-args: more arguments of every
hpdlrun (--allow-native, for a model with extern functions). --cpu-metrics FILE: the CPU run's
metrics are read from FILE where it exists (a machine whose hpdlc lacks the
CPU back end, such as a GPU machine given bench/gpu_bundle.sh's tools), and
written there after the CPU run where it does not; with --cpu-only the CPU
run alone, to write them (the uninterrupted run at --args, which a resumed
device run is compared with too; the device runs' arguments are ignored). --halves FIRST,SECOND (device or
cpu, default device,device) says which target runs each half, so a
checkpoint written by one target is resumed by the other. --expect TEXT:
each device run's output must hold TEXT (the start-up line's collectives);
--show TEXT prints the lines of the device runs' output that hold it.
--twin-env NAME=VALUE: the device run again with NAME=VALUE in its
environment (another path to the same numbers, such as ZeRO-3's fp32
gathers) must report the same losses and gradient norms, bit for bit
(--twin-expect TEXT: and its output hold TEXT, the setting taken); with
--twin-fails TEXT it must instead exit 1 saying TEXT (a setting refused).
--twin-args ARGS: the device artifact compiled again with ARGS added (another
program for the same numbers, such as --fusion off's kernel an op) and run:
its losses and gradient norms within --tol of the first device run's (a row
kernel's reduction, or cuBLASLt's bias-gradient epilogue against a kernel of
its own, sums in the order of its launch shape); the report gives the worst
difference, or says the bits are the same.
--flip-tol T --flip-after K: for top-k routing, which is discontinuous (two
experts' gates within the two targets' rounding apart choose differently):
once a step after step K differs by more than --tol, that step and the later
ones are held to T (the precision's tolerance against fp32, not --tol) and
the report names the step; a difference by step K fails as always.

The CPU runs multiply bf16 GEMMs through the widened sgemm (HPDL_GEMM16=fp32,
unless the environment says otherwise), as the device's GEMMs accumulate in
fp32: on a CPU with AVX512-BF16 oneDNN's bf16 matmul sums in another way, which
over 20 steps of bf16 moved a gradient norm 1.06e-3 from the emulated device's
(the kernels, not the GEMM library, are what these runs compare).

Exits 77 (CTest's skip) when the device cannot run: no GPU or driver for
--device cuda (hpdlrun's message is printed), or no C++ compiler for
--emulate's kernels."""
import argparse
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile


def run(cmd, env=None, **kw):
    env = dict(os.environ if env is None else env)
    env.setdefault("HPDL_GEMM16", "fp32")
    return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, **kw)


def metrics(path):
    with open(path) as f:
        return [json.loads(l) for l in f if l.strip()]


def compile_cached(a, cmd):
    """Runs an `hpdlc compile ... -o OUT`; with --cache, OUT becomes a link to
    an artifact compiled once for this hpdlc, sample and command (several
    layout tests compile the same artifacts), made under a temporary name and
    renamed into place, so tests running side by side never see half of one."""
    if not a.cache:
        return run(cmd)
    i = cmd.index("-o")
    out, rest = cmd[i + 1], cmd[:i] + cmd[i + 2:]
    h = hashlib.sha256()
    h.update(f"{' '.join(rest)}\n".encode())
    # what the artifact is made of: the built tools and libraries, the kernel
    # headers and standard library of the source tree, the sample
    src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
    bin_dir = os.path.dirname(os.path.realpath(a.hpdlc))
    for d in (bin_dir, os.path.join(bin_dir, "..", "lib"), os.path.join(src, "kernels"), os.path.join(src, "stdlib")):
        for name in sorted(os.listdir(d)) if os.path.isdir(d) else []:
            st = os.stat(os.path.join(d, name))
            h.update(f"{d}/{name} {st.st_size} {st.st_mtime_ns}\n".encode())
    with open(a.sample, "rb") as f:
        h.update(f.read())
    os.makedirs(a.cache, exist_ok=True)
    done = os.path.join(a.cache, h.hexdigest()[:24])
    if not os.path.isdir(done):
        part = tempfile.mkdtemp(prefix=".part-", dir=a.cache)
        r = run(cmd[:i + 1] + [os.path.join(part, "art")] + cmd[i + 2:])
        if r.returncode:
            shutil.rmtree(part, ignore_errors=True)
            return r
        try:
            os.rename(os.path.join(part, "art"), done)
        except OSError:  # another test made it first: the same artifact
            pass
        shutil.rmtree(part, ignore_errors=True)
    os.symlink(done, out)
    return subprocess.CompletedProcess(cmd, 0, stdout=f"(compiled artifact from the cache: {done})\n", stderr="")


def main():
    ap = argparse.ArgumentParser()
    for a in ("--hpdlc", "--hpdlrun", "--hpdl-data", "--sample", "--device"):
        ap.add_argument(a, required=True)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--tol", type=float, default=1e-4)
    ap.add_argument("--arch", default=None)
    ap.add_argument("--first-tol", type=float, default=None)
    ap.add_argument("--flip-tol", type=float, default=None, help="after a routing flip past --flip-after, the steps' tolerance")
    ap.add_argument("--flip-after", type=int, default=None, help="the last step that must agree within --tol when --flip-tol is given")
    ap.add_argument("--args", default="")
    ap.add_argument("--resume-args", default=None)
    ap.add_argument("--run-args", default="", help="more arguments of every hpdlrun (--allow-native for externs)")
    ap.add_argument("--halves", default="device,device")
    ap.add_argument("--keep", default=None)
    ap.add_argument("--cpu-metrics", default=None, help="the CPU run's metrics: read where the file exists, else written")
    ap.add_argument("--cpu-only", action="store_true", help="the CPU run alone, writing --cpu-metrics")
    ap.add_argument("--expect", action="append", default=None,
                    help="a text the device runs' output must hold (the start-up line's collectives); repeatable")
    ap.add_argument("--show", default=None, help="print the device runs' output lines holding this text")
    ap.add_argument("--twin-env", default=None, help="NAME=VALUE: the device run again with it must give the same bits")
    ap.add_argument("--twin-fails", default=None, help="TEXT: the --twin-env run must instead fail (exit 1) saying TEXT")
    ap.add_argument("--twin-expect", default=None, help="TEXT the --twin-env run's output must hold (the setting taken)")
    ap.add_argument("--twin-args", default=None, help="ARGS: the device artifact compiled with them too must agree within --tol")
    ap.add_argument("--cache", default=None, help="a folder of compiled artifacts shared by the tests (keyed by hpdlc, the sample and the command)")
    a = ap.parse_args()
    if a.cpu_only and a.cpu_metrics is None:
        print("--cpu-only: needs --cpu-metrics")
        return 2
    if a.device == "cuda" and not a.cpu_only:  # say so before compiling anything: hpdlrun --info lists the GPUs the driver sees
        r = run([a.hpdlrun, "--info"])
        if not any(l.startswith("    GPU ") for l in r.stdout.splitlines()):
            print("\n".join(l for l in r.stdout.splitlines() if "CUDA driver" in l))
            print("skipped: no GPU to run on")
            return 77
    tmp = a.keep or tempfile.mkdtemp(prefix="hpdl-rundev-")
    os.makedirs(tmp, exist_ok=True)
    try:
        r = run([a.hpdl_data, "--synthetic", "200000", "-o", f"{tmp}/data/syn"])
        if r.returncode:
            print(r.stdout)
            return 1
        data = f"{tmp}/data/syn_train_*.bin"
        extra = shlex.split(a.args)

        def cuda_compile(out, args):
            cmd = [a.hpdlc, "compile", a.sample, "--target", "cuda", "-o", out] + args
            if a.device == "emulate":
                cmd.append("--emulate")
            if a.arch:
                cmd += ["--arch", a.arch]
            return cmd

        compiles = [("cpu", [a.hpdlc, "compile", a.sample, "-o", f"{tmp}/cpu"] + extra), ("cuda", cuda_compile(f"{tmp}/cuda", extra))]
        cpu_known = a.cpu_metrics is not None and os.path.exists(a.cpu_metrics)
        if a.cpu_only:
            compiles = compiles[:1]
        halves = a.halves.split(",")
        if len(halves) != 2 or any(h not in ("device", "cpu") for h in halves):
            print(f"--halves {a.halves}: expected two of device, cpu")
            return 2
        if cpu_known and not a.cpu_only:
            # the CPU run to compare with is the uninterrupted one at --args, so its
            # metrics serve a resumed device run too; a half on the CPU does not
            if "cpu" in halves:
                print("--cpu-metrics: not with a half on the CPU (--halves)")
                return 2
            compiles = compiles[1:]
        if a.twin_args is not None and not a.cpu_only:
            compiles.append(("cuda", cuda_compile(f"{tmp}/cuda-twin", extra + shlex.split(a.twin_args))))
        if a.resume_args is not None and not a.cpu_only:
            second = shlex.split(a.resume_args)
            compiles.append(("cuda", cuda_compile(f"{tmp}/cuda2", second)))
            if "cpu" in halves:
                compiles.append(("cpu", [a.hpdlc, "compile", a.sample, "-o", f"{tmp}/cpu2"] + second))
        for name, cmd in compiles:
            r = compile_cached(a, cmd)
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
        half = max(1, a.steps // 2)
        plan = [("cpu", "cpu", [], "cpu.jsonl"), ("cuda", "cuda", ["--device", a.device], "cuda.jsonl")]
        if a.resume_args is not None:  # the first half, then the rest at the other layout from its checkpoint
            on = lambda h, art: (art, ["--device", a.device]) if h == "device" else (art.replace("cuda", "cpu"), [])
            art1, dev1 = on(halves[0], "cuda")
            art2, dev2 = on(halves[1], "cuda2")
            plan[1] = ("cuda", art1, dev1 + ["--stop-at", str(half), "--checkpoint-every", str(half)], "cuda.jsonl")
            plan.append(("cuda2", art2, dev2 + ["--resume"], "cuda2.jsonl"))
        if a.cpu_only:
            plan = plan[:1]
        elif cpu_known:
            runs["cpu"] = metrics(a.cpu_metrics)
            plan = plan[1:]
        for name, art, flags, out in plan:
            ckpt = f"{tmp}/ckpt-{'cpu' if name == 'cpu' else 'cuda'}"
            cmd = [a.hpdlrun, f"{tmp}/{art}", "--steps", str(a.steps), "--log-every", "1", "--data", data,
                   "--checkpoint-dir", ckpt, "--metrics", f"{tmp}/{out}", "--progress", "plain"] + flags + shlex.split(a.run_args)
            r = run(cmd)
            print(r.stdout.rstrip())
            if r.returncode:
                if name == "cuda" and a.device == "cuda" and ("no CUDA driver" in r.stdout or "sees no GPU" in r.stdout
                                                             or "no cuBLASLt" in r.stdout):
                    print("skipped: no GPU to run on")
                    return 77
                return 1
            if name != "cpu":
                for want in a.expect or []:
                    if want not in r.stdout:
                        print(f"the device run's output does not say {want!r}")
                        return 1
                for line in r.stdout.splitlines() if a.show is not None else []:
                    if a.show in line:
                        print(f"{name}: {line}")
            runs[name] = metrics(f"{tmp}/{out}")
            if name == "cuda" and (a.twin_env or a.twin_args is not None) and a.resume_args is None:
                var, _, value = (a.twin_env or "").partition("=")
                twin = [x if x != f"{tmp}/{out}" else f"{tmp}/twin.jsonl" for x in cmd]
                twin = [x if not x.startswith(ckpt) else f"{ckpt}-twin" for x in twin]
                if a.twin_args is not None:
                    twin = [x if x != f"{tmp}/{art}" else f"{tmp}/cuda-twin" for x in twin]
                r2 = run(twin, env=dict(os.environ, **({var: value} if var else {})))
                what = a.twin_env or f"compiled with {a.twin_args}"
                if a.twin_fails is not None:
                    ok = r2.returncode == 1 and a.twin_fails in r2.stdout and "Traceback" not in r2.stdout
                    print(f"{what}: " + (f"refused (exit 1): {a.twin_fails}" if ok else
                                          f"exit {r2.returncode}, expected 1 with {a.twin_fails!r}:\n{r2.stdout}"))
                    if not ok:
                        return 1
                else:
                    if r2.returncode:
                        print(r2.stdout.rstrip())
                        return 1
                    if a.twin_expect is not None and a.twin_expect not in r2.stdout:
                        print(f"{what}: the run's output does not say {a.twin_expect!r}")
                        return 1
                    mine = [(m["loss"], m.get("grad_norm")) for m in runs[name]]
                    theirs = [(m["loss"], m.get("grad_norm")) for m in metrics(f"{tmp}/twin.jsonl")]
                    same = mine == theirs
                    if same or a.twin_args is None:
                        print(f"{what}: " + ("the same losses and gradient norms, bit for bit" if same
                                              else "other losses or gradient norms than without it"))
                    else:  # another program: its reductions may sum in another order
                        worst = max((abs(x - y) / max(abs(x), 1e-30) for p, q in zip(mine, theirs)
                                     for x, y in zip(p, q) if x is not None and y is not None), default=0.0)
                        same = len(mine) == len(theirs) and worst <= a.tol
                        print(f"{what}: the losses and gradient norms within {worst:.2e} (--tol {a.tol:g})")
                    if not same:
                        return 1
            if name == "cpu" and a.cpu_metrics is not None:
                shutil.copyfile(f"{tmp}/{out}", a.cpu_metrics)
        if a.cpu_only:
            print(f"cpu metrics of {len(runs['cpu'])} steps written to {a.cpu_metrics}")
            return 0 if len(runs["cpu"]) == a.steps else 1
        if "cuda2" in runs:
            runs["cuda"] = runs["cuda"] + runs.pop("cuda2")
        bad = 0
        if (a.flip_tol is None) != (a.flip_after is None):
            print("--flip-tol and --flip-after go together")
            return 2
        flipped = None  # the step from which --flip-tol holds
        for c, g in zip(runs["cpu"], runs["cuda"]):
            if c["step"] != g["step"]:
                print(f"step {c['step']} of the CPU run against step {g['step']} of the device's")
                bad += 1
                continue
            keys = ("loss", "grad_norm") + (("aux_loss",) if "aux_loss" in c else ())
            for key in keys:
                if key not in g:
                    print(f"step {c['step']}: the CPU run reports {key}, the device run does not  FAIL")
                    bad += 1
                    continue
                x, y = c[key], g[key]
                if x is None or y is None:  # a skipped step's norm (fp16's overflow): both or neither
                    ok = x is None and y is None
                    bad += not ok
                    print(f"step {c['step']}: {key} cpu {x} {a.device} {y}{'' if ok else '  FAIL'}")
                    continue
                err = abs(x - y) / max(abs(x), 1e-30)
                tol = a.first_tol if a.first_tol is not None and key == "loss" and c["step"] == runs["cpu"][0]["step"] else a.tol
                if flipped is None and err > tol and a.flip_tol is not None and c["step"] > a.flip_after:
                    flipped = c["step"]
                    print(f"step {c['step']}: {key} apart by {err:.2e}, over {tol}: a routing choice flipped; "
                          f"from here on within {a.flip_tol}")
                if flipped is not None and c["step"] >= flipped:
                    tol = a.flip_tol
                ok = err <= tol
                bad += not ok
                print(f"step {c['step']}: {key} cpu {x:.9g} {a.device} {y:.9g} (relative {err:.2e}){'' if ok else '  FAIL'}")
        if len(runs["cpu"]) != a.steps or len(runs["cuda"]) != a.steps:
            print(f"expected {a.steps} steps of metrics, got {len(runs['cpu'])} and {len(runs['cuda'])}")
            bad += 1
        within = f"{a.tol}" if flipped is None else f"{a.tol} to step {flipped - 1}, {a.flip_tol} after"
        print(f"{a.device} against cpu: {'agree' if not bad else f'{bad} differ'} within {within} over {a.steps} steps")
        return 1 if bad else 0
    finally:
        if not a.keep:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
