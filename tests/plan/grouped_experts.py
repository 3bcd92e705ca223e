#!/usr/bin/env python3
"""grouped_experts.py - the experts' grouped GEMMs priced as the device path runs them
(CTest: plan.grouped_experts).

    grouped_experts.py HPDLC SOURCE_DIR

Without expert parallelism a dropless MoE layer runs its experts' GEMMs over exactly the
rows routed to each (`grouped_mm`, moepack.c), and the device path runs one GEMM a run of
one expert's rows, one launch after another, after reading the rows' experts back to the
host (runtime/device/devexec.c, grouped_run). Qwen3-30B-A3B's layer on 8 H100 (8 layers, a
sequence a GPU, routing balanced) with the same FLOPs and parameters cut into 64, 128 and
256 experts (top 4, 8, 16 of width 1536, 768, 384): each expert then has the same rows and
half the columns of the one before, so at ep = 1 the GEMMs fill half the tiles twice as
often and must cost more each time the experts double (priced as one batched GEMM before
2026-12-06 they cost the same within 10%); under expert parallelism (ep 8, the slots one
batched GEMM of each rank's experts) they must stay within 25%. The report shows them apart
at ep 1 - JSON time.grouped_gemm_s (over a quarter of that step), --explain's term and the limit
line naming expert parallelism - and at ep 8 none of them. Exit 0 pass, 1 fail."""
import sys

from plan_checks import bind, verdict

MODEL = ["-D", "layers=8", "-D", "capacity_factor=1.0"]
LAYOUT = ["--gpus", "8", "--dp", "8", "--tp", "1", "--pp", "1", "--micro-batch", "1", "--global-batch", "8",
          "--cluster", "dgx-h100"]
CUTS = [(64, 4, 1536), (128, 8, 768), (256, 16, 384)]


def main():
    hpdlc, src = sys.argv[1], sys.argv[2]
    run, plan = bind(hpdlc, f"{src}/samples/qwen3-moe.hpd", *MODEL)
    gemm = {}
    for ep in (1, 8):
        for e, k, f in CUTS:
            p = plan(["-D", f"experts={e}", "-D", f"top_k={k}", "-D", f"ffn={f}", *LAYOUT, "--ep", str(ep)])
            if p is None:
                return verdict([(False, f"the plan of {e} experts at ep {ep}")])
            gemm[ep, e] = p["time"]["gemm_s"]
            print(f"ep {ep}, {e:3d} experts of {f:4d}, top {k:2d}: GEMMs {gemm[ep, e] * 1e3:8.2f} ms a step, "
                  f"step {p['time']['step_s'] * 1e3:8.2f} ms")
    checks = []
    for (e0, _, _), (e1, _, _) in zip(CUTS, CUTS[1:]):
        r = gemm[1, e1] / gemm[1, e0]
        checks.append((r > 1.15, f"ep 1: {e1} experts' GEMMs {r:.2f}x {e0}'s (more, narrower launches: over 1.15x)"))
    r = max(gemm[8, e] for e, _, _ in CUTS) / min(gemm[8, e] for e, _, _ in CUTS)
    checks.append((r < 1.25, f"ep 8: the slots' batched GEMMs within {r:.2f}x of each other (under 1.25x)"))
    checks.append((gemm[1, 128] > 1.5 * gemm[8, 128], "ep 1's launches an expert cost more than ep 8's batched slots"))
    # the report: JSON time.grouped_gemm_s, --explain's term and the limit line at ep 1; none of them at ep 8
    for ep, e, k, f in ((1, 128, 8, 768), (8, 128, 8, 768)):
        args = ["-D", f"experts={e}", "-D", f"top_k={k}", "-D", f"ffn={f}", *LAYOUT, "--ep", str(ep)]
        p, text = plan(args), run([*args, "--explain"])
        if p is None:
            return verdict([*checks, (False, f"the plan at ep {ep}")])
        grouped = p["time"].get("grouped_gemm_s", -1)
        term = "experts' grouped GEMMs (a launch an expert)" in text.stdout
        limit = "limit: the experts' grouped GEMMs take" in text.stdout and "ep > 1" in text.stdout
        if ep == 1:
            checks.append((0.25 * p["time"]["step_s"] < grouped <= p["time"]["gemm_s"],
                           f"ep 1: time.grouped_gemm_s {grouped} a share of the GEMMs and over a quarter of the step"))
            checks.append((term and limit, f"ep 1: --explain names the grouped GEMMs and the limit line says why: {text.stdout}"))
        else:
            checks.append((grouped == 0 and not term and not limit, f"ep 8: no grouped GEMMs reported ({grouped})"))
    return verdict(checks)


if __name__ == "__main__":
    sys.exit(main())
