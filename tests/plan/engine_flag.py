#!/usr/bin/env python3
"""engine_flag.py - `hpdlc plan --engine hpdl|deepspeed` (parallel.engine; CTest: plan.engine_flag).

    engine_flag.py HPDLC SOURCE_DIR

A GPT of 24 layers on the Jean Zay cluster of the BLOOM set (4 Omni-Path links a node), bf16,
ZeRO 1. Under --engine deepspeed (DeepSpeed's PipelineEngine and BF16_Optimizer,
docs/planner.md sec. 11.1):
  - a pipeline transfer carries one tensor rank's piece of the activation and is gathered
    after: shorter than hpdl's whole one, longer than a tp-th of it; it holds both ranks, so
    the busiest rank's exposed pipeline communication grows by two transfers a micro-batch for
    each neighbour stage; under sequence parallelism the boundary is already split;
  - after every micro-batch's backward the bf16 gradients are added into fp32 copies and
    zeroed: 12 bytes a parameter a micro-batch at the device's memory bandwidth (x 0.9), and
    none of it in fp16;
  - the fp32 gradients are all-reduced (not reduce-scattered) after the last micro-batch:
    more data-parallel time than hpdl's, all of it exposed;
  - the breakdown still sums to the step, and the --trace of the step ends at it (the
    blocking transfers inside the pipeline, not again after it);
  - what the engine cannot run under pipeline parallelism is refused, saying why (ZeRO 2-3,
    GPipe, interleaving), and --search proposes only ZeRO 0-1 under 1F1B at pp 4, where hpdl's
    engine's best are interleaved. Exit 0 pass, 1 fail."""
import json
import os
import sys
import tempfile

from plan_checks import bind, rel, trace_end_s, trace_events, verdict

GPT = ["-D", "layers=24", "-D", "hidden=4096", "-D", "heads=32"]


def main():
    hpdlc, src = sys.argv[1], sys.argv[2]
    run, plan = bind(hpdlc, f"{src}/samples/gpt.hpd", *GPT, "--cluster", f"{src}/tests/plan/jean_zay_a100.hpd",
                     "--gpus", "32", "--micro-batch", "1", "--global-batch", "64", "--zero", "1")
    pp4 = ["--tp", "4", "--pp", "4", "--dp", "2", "--precision", "bf16"]
    one = ["--tp", "4", "--dp", "8", "--precision", "bf16"]
    one16 = ["--tp", "4", "--dp", "8", "--precision", "fp16"]
    a, d, default = plan(pp4 + ["--engine", "hpdl"]), plan(pp4 + ["--engine", "deepspeed"]), plan(pp4)
    sp = plan(pp4 + ["--sp", "on", "--engine", "deepspeed"])
    one_a, one_d = plan(one + ["--engine", "hpdl"]), plan(one + ["--engine", "deepspeed"])
    h16, d16 = plan(one16 + ["--engine", "hpdl"]), plan(one16 + ["--engine", "deepspeed"])
    if None in (a, d, default, sp, one_a, one_d, h16, d16):
        return 1
    ta, td = a["time"], d["time"]
    t_whole, t_ds = td["p2p_transfer_s"], td.get("p2p_deepspeed_transfer_s", 0)
    m = d["parallel"]["num_micro_batches"]
    busiest = max(d["stages"], key=lambda s: s["busy_s"])
    links = (busiest["rank"] > 0) + (busiest["rank"] < 3)
    grown = d["comm_time_per_step"]["exposed_s"]["pp"] - a["comm_time_per_step"]["exposed_s"]["pp"]
    parts = td["compute_s"] + sum(d["comm_time_per_step"]["exposed_s"].values()) + td["bubble_s"] + td["optimizer_s"]
    # one stage: the fp32 gradient pass, 12 bytes a parameter a micro-batch
    m1 = one_d["parallel"]["num_micro_batches"]
    hbm = one_d["cluster"]["hbm_bytes_per_s"] * 0.9
    gpass = m1 * one_d["stages"][0]["params"] * 12 / hbm
    dpa, dpd = one_a["comm_time_per_step"], one_d["comm_time_per_step"]
    print(f"hpdl: step {ta['step_s']:.4f} s, one transfer {ta['p2p_transfer_s'] * 1e3:.3f} ms; deepspeed: step "
          f"{td['step_s']:.4f} s, one transfer {t_ds * 1e3:.3f} ms, busiest rank {busiest['rank']}, pipeline comm "
          f"+{grown:.4f} s over {m} micro-batches; one stage: compute {one_a['time']['compute_s']:.4f} -> "
          f"{one_d['time']['compute_s']:.4f} s (fp32 gradient pass {gpass:.4f} s), dp {dpa['total_s']['dp']:.4f} s "
          f"({dpa['exposed_s']['dp']:.4f} exposed) -> {dpd['total_s']['dp']:.4f} s ({dpd['exposed_s']['dp']:.4f})")
    checks = [
        (default["parallel"]["engine"] == "hpdl" and a["parallel"]["engine"] == "hpdl"
         and d["parallel"]["engine"] == "deepspeed", "the report's parallel.engine (hpdl the default)"),
        (default["time"]["step_s"] == ta["step_s"], "hpdl is the default"),
        ("p2p_deepspeed_transfer_s" not in ta, "hpdl: no DeepSpeed transfer in the report"),
        (t_whole / 4 < t_ds < t_whole, "deepspeed: a tensor rank's piece and the gather, between a quarter and the whole"),
        (rel(grown, 2 * links * t_ds * m) < 1e-6, "deepspeed: the busiest rank's transfers, two a micro-batch a neighbour, all exposed"),
        (td["step_s"] > ta["step_s"], "deepspeed: its engine's step is longer"),
        (rel(parts, td["step_s"]) < 1e-6, "deepspeed: compute + exposed communication + bubble + optimizer = step"),
        (rel(sp["time"].get("p2p_deepspeed_transfer_s", 0), sp["time"]["p2p_transfer_s"]) < 1e-9,
         "sequence parallelism: the boundary already split, DeepSpeed's transfer is hpdl's"),
        (rel(one_d["time"]["compute_s"] - one_a["time"]["compute_s"], gpass) < 1e-6,
         "bf16: the fp32 gradient pass, 12 bytes a parameter a micro-batch"),
        (rel(d16["time"]["compute_s"], h16["time"]["compute_s"]) < 1e-12, "fp16: no fp32 gradient pass"),
        (dpd["total_s"]["dp"] > dpa["total_s"]["dp"] and rel(dpd["exposed_s"]["dp"], dpd["total_s"]["dp"]) < 1e-12
         and dpa["exposed_s"]["dp"] < dpa["total_s"]["dp"],
         "bf16 ZeRO 1: the fp32 gradients all-reduced, after the backward (hpdl's reduce-scatter partly hidden)"),
    ]
    with tempfile.TemporaryDirectory() as tmp:
        trace = os.path.join(tmp, "trace.json")
        run(pp4 + ["--engine", "deepspeed", "--trace", trace])
        end = trace_end_s(trace_events(trace))
    checks.append((rel(end, td["step_s"]) < 1e-6, f"the trace ends at the step ({end:.6f} s)"))
    text = run(pp4 + ["--engine", "deepspeed"])
    checks.append(("engine deepspeed" in text.stdout and "blocking (DeepSpeed's" in text.stdout,
                   "the text report names the engine and the transfer"))
    checks.append(("overlap off (DeepSpeed's engine reduces after the backward)" in text.stdout
                   and "overlap on" in run(pp4).stdout, "the text report: no overlap under DeepSpeed's engine, whatever the flag"))
    # what DeepSpeed's pipeline engine cannot run is refused, naming why: ZeRO 2-3 or another
    # schedule than its TrainSchedule's 1F1B under pipeline parallelism (pp 1 keeps ZeRO 3)
    z3 = run(["--tp", "4", "--pp", "4", "--dp", "2", "--zero", "3", "--engine", "deepspeed"])
    il = run(pp4 + ["--schedule", "interleaved", "--virtual-stages", "2", "--engine", "deepspeed"])
    gp = run(pp4 + ["--schedule", "gpipe", "--engine", "deepspeed"])
    pp1 = plan(["--tp", "4", "--dp", "8", "--zero", "3", "--engine", "deepspeed"])
    checks += [
        (z3.returncode != 0 and "engine = deepspeed runs ZeRO stage 0 or 1 under pipeline parallelism, not 3"
         in z3.stderr and "refuses ZeRO-2 and ZeRO-3" in z3.stderr, "deepspeed: ZeRO 3 at pp 4 refused, saying why"),
        (il.returncode != 0 and "DeepSpeed's TrainSchedule (1F1B), not interleaved" in il.stderr
         and "virtual = 1" in il.stderr, "deepspeed: the interleaved schedule refused"),
        (gp.returncode != 0 and "not gpipe" in gp.stderr, "deepspeed: GPipe refused"),
        (pp1 is not None and pp1["parallel"]["zero"] == 3, "deepspeed: ZeRO 3 without a pipeline is its engine's"),
    ]
    # the search proposes only what the engine runs: at pp 4 hpdl's best are interleaved (some
    # at ZeRO 2), DeepSpeed's ZeRO 0-1 under its 1F1B
    def searched(engine):
        p = run(["--global-batch", "64", "--search", "--pp", "4", "--top", "20", "--format", "json", "--engine", engine])
        try:
            return [r["parallel"] for r in json.loads(p.stdout)["search"]["top"]]
        except (ValueError, KeyError, TypeError):
            return []
    s_hpdl, s_ds = searched("hpdl"), searched("deepspeed")
    runnable = lambda x: x["zero"] <= 1 and x["schedule"] == "1f1b" and x["virtual_stages"] == 1
    print(f"search at pp 4: hpdl {sum(not runnable(x) for x in s_hpdl)} of {len(s_hpdl)} layouts DeepSpeed cannot run, "
          f"deepspeed {sum(not runnable(x) for x in s_ds)} of {len(s_ds)}")
    checks += [
        (any(not runnable(x) for x in s_hpdl), "hpdl: the search's best at pp 4 include what DeepSpeed cannot run"),
        (len(s_ds) == 20 and all(runnable(x) and x["pp"] == 4 for x in s_ds),
         "deepspeed: the search's layouts are ZeRO 0-1 under 1F1B"),
    ]
    return verdict(checks)


if __name__ == "__main__":
    sys.exit(main())
