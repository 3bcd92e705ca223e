#!/usr/bin/env python3
"""router_e2e.py - the router builtins of issue 13 through every phase (CTest: moe.CASE).

    router_e2e.py --bin BUILD/bin --source REPO --work DIR CASE

tests/moe/router-tiny.hpd: a top-2 router (topk_values, topk_indices, one_hot) over four
dense experts with Switch Transformer's load-balancing loss.

  phases     hpdlc check, emit ir (topk, take, one_hot nodes), emit grad (take_bwd: the
             values' gradient scattered into the chosen positions; none through the
             indices), plan (priced), compile --target cpu (native: the CPU back end
             hands the router's ops to the runtime's host ops; manifest executor
             native), compile --target cuda (refused, naming the op, where the CUDA
             target is built in).
  one_rank   hpdlrun trains the artifact 10 steps on one rank: the loss falls (step 10
             below step 1 by more than 10%) and stays finite.
  tp2        the router Linear column-split at tp=2: the partitioner makes the router's
             inputs whole, and the step-1 loss and gradient norm are within 1e-9 of one
             rank's, the step-5 loss within 1e-7 (needs mpirun).
Exit 0 pass, 1 fail, 77 skip.
"""
import json
import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
import e2e_common  # noqa: E402
from e2e_common import SKIP, Fail, check, metrics  # noqa: E402

ARGS = None


def run(args, expect=0):
    return e2e_common.run(args, expect, timeout=280)


def tool(name):
    return os.path.join(ARGS.bin, name)


def model():
    return os.path.join(ARGS.source, "tests", "moe", "router-tiny.hpd")


def work(name):
    return e2e_common.fresh_dir(ARGS.work, name)


def data():
    return e2e_common.synthetic_data(ARGS.bin, ARGS.work)


def train(art, tag, steps):
    m = os.path.join(ARGS.work, tag + ".jsonl")
    if os.path.exists(m):
        os.remove(m)
    run([tool("hpdlrun"), art, "--data", data(), "--steps", str(steps), "--metrics", m, "--progress", "plain"])
    got = metrics(m)
    check(len(got) == steps, f"{tag}: {len(got)} steps recorded, not {steps}")
    return got


def case_phases():
    p = run([tool("hpdlc"), "check", model()])
    check("ok: model RouterTiny" in p.stdout + p.stderr, p.stdout + p.stderr)
    ir = run([tool("hpdlc"), "emit", "ir", model()]).stdout
    for op in ("= topk ", "k=2", "= take ", "= one_hot ", "n=4"):
        check(op in ir, f"emit ir: no '{op}'")
    grad = run([tool("hpdlc"), "emit", "grad", model()]).stdout
    check("= take_bwd " in grad, "emit grad: no take_bwd (the gradient of the top-k values)")
    check("topk_bwd" not in grad and "one_hot_bwd" not in grad, "emit grad: a gradient through integer results")
    plan = run([tool("hpdlc"), "plan", model()]).stdout
    check("tokens/s" in plan, plan)
    art = work("art")
    p = run([tool("hpdlc"), "compile", model(), "-o", art])
    check(os.path.exists(os.path.join(art, "stage0.hir")), "no stage0.hir")
    man = json.load(open(os.path.join(art, "manifest.json")))
    # the CPU back end hands the router's ops to the runtime (hpd_ctx.host_op); without LLVM the
    # reference executor runs the stage
    want = "interp" if "is not built into this hpdlc" in p.stderr else "native"
    check(man["program"]["executor"] == want, f"executor {man['program']['executor']}, not {want}: {p.stderr}")
    cu = work("art-cuda")
    p = run([tool("hpdlc"), "compile", model(), "--target", "cuda", "-o", cu], expect=None)
    if p.returncode == 0:  # the router's kernels generated (and compiled where NVRTC is)
        src = open(os.path.join(cu, "stage0.cu")).read()
        for kind in ("topk:", "take:", "take_bwd:", "one_hot:"):
            check(kind in src, f"stage0.cu has no {kind} kernel")
    else:  # the CUDA toolkit is optional: only its absence may stop it
        check("NVRTC" in p.stderr or "nvrtc" in p.stderr, p.stderr)


def case_one_rank():
    art = work("art-one")
    run([tool("hpdlc"), "compile", model(), "--executor", "interp", "-o", art])
    got = train(art, "one_rank", 10)
    losses = [r["loss"] for r in got]
    print("one_rank: losses " + " ".join(f"{x:.4f}" for x in losses))
    check(all(math.isfinite(x) for x in losses), "a loss is not finite")
    check(losses[-1] < 0.9 * losses[0], f"the loss did not fall: {losses[0]:.4f} -> {losses[-1]:.4f}")


def case_tp2():
    e2e_common.need_mpi(ARGS.bin)
    src = open(model()).read()
    col = src.replace("router = Linear(C, E, bias = false)", "router = Linear(C, E, bias = false, split = column)")
    check(col != src, "router line not found in router-tiny.hpd")
    os.makedirs(ARGS.work, exist_ok=True)
    path = os.path.join(ARGS.work, "router-col.hpd")
    with open(path, "w") as f:
        f.write(col)
    res = {}
    for tp in (1, 2):
        art = work(f"art-col-tp{tp}")
        run([tool("hpdlc"), "compile", path, "--tp", str(tp), "--executor", "interp", "-o", art])
        res[tp] = train(art, f"tp{tp}", 5)
    for key, step, tol in (("loss", 0, 1e-9), ("grad_norm", 0, 1e-9), ("loss", 4, 1e-7)):
        a, b = res[2][step][key], res[1][step][key]
        print(f"tp2: step {step + 1} {key} {a:.12f}, one rank {b:.12f}")
        check(abs(a - b) <= tol * abs(b), f"tp2 step {step + 1} {key} {a} differs from one rank's {b}")


CASES = {"phases": case_phases, "one_rank": case_one_rank, "tp2": case_tp2}


def main():
    global ARGS
    ARGS = e2e_common.case_args(CASES)
    os.environ.setdefault("HPDL_STDLIB", os.path.join(ARGS.source, "stdlib"))
    return e2e_common.run_case(CASES, ARGS.case)


if __name__ == "__main__":
    sys.exit(main())
