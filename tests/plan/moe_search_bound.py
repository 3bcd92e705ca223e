#!/usr/bin/env python3
"""moe_search_bound.py - the search's model-state bound counts the experts over the expert
group (CTest: plan.moe_search_bound).

    moe_search_bound.py HPDLC SOURCE_DIR

`hpdlc plan --search` drops a layout unbuilt when a lower bound of its fullest rank's model
states exceeds the device's memory (compiler/plan/plan_search.c). The bound divided all the
parameters by tp x pp, so an MoE layout whose experts are split 64 ways was bounded as if
each rank held all of a stage's experts: DeepSeek-V3 (671B, 256 experts) at ZeRO 1 on its
2048 H800 kept only pp 16 (42.64 s a step), its pp 2-8 layouts dropped though they fit. The
bound now takes the experts over ep (and tp unless folded). Checked: the best ZeRO-1 layout
has expert parallelism, fits, and is one that the old bound (its parameters over tp x pp,
bf16 weights and gradients, 0.9 of them) would have dropped; and a dense model's search is
the same as before (Llama 2 7B on 64 GPUs: every count and the best layout). Exit 0 pass,
1 fail."""
import sys

from plan_checks import bind, verdict

GIB = 1024.0 ** 3


def main():
    hpdlc, src = sys.argv[1], sys.argv[2]
    _, plan = bind(hpdlc, f"{src}/samples/deepseek-v3.hpd")
    p = plan(["--search", "--zero", "1", "--top", "1"])
    if p is None:
        return verdict([(False, "DeepSeek-V3's ZeRO-1 search")])
    L, m = p["parallel"], p["model"]
    cap = p["cluster"]["memory_bytes"]
    old_bound = m["params"] / (L["tp"] * L["pp"]) * 0.9 * 4  # bf16 weights and gradients alone
    print(f"best: dp {L['dp']} tp {L['tp']} pp {L['pp']} ep {L['ep']}, step {p['time']['step_s']:.2f} s, "
          f"{p['memory_per_gpu']['total'] / GIB:.2f} GiB; the old bound {old_bound / GIB:.1f} GiB of {cap / GIB:.0f}")
    _, dense = bind(hpdlc, f"{src}/samples/llama.hpd")
    d = dense(["--gpus", "64", "--search", "--top", "1"])
    s = d["search"] if d else {}
    return verdict([
        (L["ep"] > 1 and p["valid"] and p["memory_per_gpu"]["total"] <= cap, "the best ZeRO-1 layout has experts split and fits"),
        (old_bound > cap, "the old bound (all the parameters over tp x pp) would have dropped it"),
        (p["time"]["step_s"] < 42.0, "faster than the old search's best (pp 16, 42.64 s)"),
        (d is not None and (s.get("enumerated"), s.get("valid"), s.get("fit")) == (48313, 48288, 34165)
         and (d["parallel"]["tp"], d["parallel"]["pp"], d["parallel"]["dp"]) == (1, 1, 64),
         "a dense model's search unchanged (Llama 2 7B, 64 GPUs)"),
    ])


if __name__ == "__main__":
    sys.exit(main())
