#!/usr/bin/env python3
"""experts_cp_routing.py - the experts under context parallelism, as the planner prices the
program `compile` builds (CTest: plan.experts_cp_routing).

    experts_cp_routing.py HPDLC SOURCE_DIR

A dropless layer's context ranks route their own tokens, over slots too (docs/compiler.md,
spmd.c's cp_local_slots): Mixtral 8x7B (drop = false) at tp 2, ep 8 on 64 H100 moves the same
all-to-all bytes a GPU at cp 2 x dp 16 as at cp 1 x dp 32 (each rank holds the same tokens), its
GEMM time within 5% of cp 1's, JSON comm_per_step.ep > 0 and parallel.expert_routing
own_tokens, no `experts:` line in the text report (nor JSON notes.experts); folded (--etp 1, each
tensor rank routing its piece of its context chunk) half those bytes. A layer that drops tokens (moe-tiny's,
capacity 1.5 x the even share) keeps each sequence whole on every context rank: at dp 2 x cp 2
x ep 2 twice the all-to-all bytes of dp 4 x ep 2, expert_routing whole_sequence, and the text
report's `experts:` line says so, JSON notes.experts and the HTML report's facts the same. Until 2026-12-07 the dropless layer was routed whole too
(Mixtral: 840 GiB a GPU a step at cp 2 where cp 1 exchanges 420). Exit 0 pass, 1 fail."""
import sys

from plan_checks import bind, rel, verdict

MIXTRAL = ["--cluster", "dgx-h100", "--gpus", "64", "--tp", "2", "--pp", "1", "--ep", "8", "--recompute", "full"]
TINY = ["--gpus", "4", "--ep", "2", "--micro-batch", "2"]


def html_text(s):
    """s as the HTML report writes text (plan_html.c's esc)."""
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")


def main():
    hpdlc, src = sys.argv[1], sys.argv[2]
    mrun, mplan = bind(hpdlc, f"{src}/samples/mixtral.hpd")
    trun, tplan = bind(hpdlc, f"{src}/samples/moe-tiny.hpd")
    m1, m2 = mplan([*MIXTRAL, "--cp", "1", "--dp", "32"]), mplan([*MIXTRAL, "--cp", "2", "--dp", "16"])
    t1, t2 = tplan([*TINY, "--cp", "1", "--dp", "4"]), tplan([*TINY, "--cp", "2", "--dp", "2"])
    mf = mplan([*MIXTRAL, "--cp", "2", "--dp", "16", "--etp", "1"])
    if None in (m1, m2, t1, t2, mf):
        return verdict([(False, "the plans")])
    mtext = mrun([*MIXTRAL, "--cp", "2", "--dp", "16"]).stdout
    ttext = trun([*TINY, "--cp", "2", "--dp", "2"]).stdout
    thtml = trun([*TINY, "--cp", "2", "--dp", "2", "--format", "html"]).stdout
    note = next((line[len("experts: "):] for line in ttext.splitlines() if line.startswith("experts: ")), None)
    me1, me2 = m1["comm_per_step"]["ep"], m2["comm_per_step"]["ep"]
    te1, te2 = t1["comm_per_step"]["ep"], t2["comm_per_step"]["ep"]
    print(f"mixtral tp 2 ep 8: all-to-all {me1 / 2**30:.2f} GiB a GPU at cp 1, {me2 / 2**30:.2f} GiB at cp 2; "
          f"GEMM {m1['time']['gemm_s']:.2f} s, {m2['time']['gemm_s']:.2f} s; routing {m2['parallel']['expert_routing']}")
    print(f"moe-tiny (drops tokens) ep 2: all-to-all {te1:.0f} B at cp 1, {te2:.0f} B at cp 2; "
          f"routing {t2['parallel']['expert_routing']}")
    mef = mf["comm_per_step"]["ep"]
    print(f"mixtral tp 2 cp 2 ep 8 folded (etp 1): all-to-all {mef / 2**30:.2f} GiB a GPU, step {mf['time']['step_s']:.2f} s "
          f"(unfolded {m2['time']['step_s']:.2f} s)")
    return verdict([
        (me1 > 0 and rel(me2, me1) < 1e-9, "dropless Mixtral: the same all-to-all bytes a GPU at cp 2 as at cp 1"),
        (rel(mef, me2 / 2) < 1e-9 and mf["parallel"]["expert_routing"] == "own_tokens",
         "dropless Mixtral folded under cp 2: half the unfolded all-to-all bytes (each tensor rank its piece), own tokens"),
        (rel(m2["time"]["gemm_s"], m1["time"]["gemm_s"]) < 0.05, "dropless Mixtral: cp 2's GEMM time within 5% of cp 1's"),
        (m2["parallel"]["expert_routing"] == "own_tokens", "dropless Mixtral at cp 2: expert_routing own_tokens"),
        ("experts: each sequence routed whole" not in mtext, "dropless Mixtral at cp 2: no `experts:` line"),
        (te1 > 0 and rel(te2, 2 * te1) < 1e-9, "dropping moe-tiny: twice the all-to-all bytes at cp 2"),
        (t2["parallel"]["expert_routing"] == "whole_sequence", "dropping moe-tiny at cp 2: expert_routing whole_sequence"),
        (note is not None and note.startswith("each sequence routed whole on every context rank") and "cp = 2 times" in note,
         "dropping moe-tiny at cp 2: the text report's `experts:` line"),
        (note is not None and t2.get("notes", {}).get("experts") == note and "experts" not in m2.get("notes", {"experts": 1}),
         "JSON notes.experts: the text's line (dropping moe-tiny), none for dropless Mixtral"),
        (note is not None and f"<tr><th>experts</th><td>{html_text(note)}</td></tr>" in thtml,
         "the HTML report's facts: an experts row with the text's line"),
    ])


if __name__ == "__main__":
    sys.exit(main())
