#!/usr/bin/env python3
"""balance_ends.py - `balance = ends` in the planner (CTest: plan.balance_ends).

    balance_ends.py HPDLC SOURCE_DIR

Llama 3 405B's pipeline (arXiv 2407.21783 sec. 3.3.2): 126 layers in 16 stages x 8 virtual
chunks, the embeddings alone on the first chunk and the head alone on the last. The plan
must split it so (the stages' layers 7, 8 x 14, 7), price its bubble below the 4-chunk
split's (the interleaved bubble is (p - 1) / (v m)), refuse a split that does not divide
layers + 2 with the checker's message, and the search must reach 8 virtual stages, which
balance = cost cannot (126 layers < 128 chunks). Exit 0 pass, 1 fail."""
import sys

from plan_checks import plan_json, plan_run, verdict

MODEL = ["-D", "layers=126", "-D", "hidden=16384", "-D", "heads=128", "-D", "kv_heads=8", "-D", "ffn=53248",
         "-D", "vocab=128256", "-D", "seq=8192"]
LAYOUT = ["--gpus", "8192", "--tp", "8", "--pp", "16", "--dp", "64", "--sp", "on", "--micro-batch", "1",
          "--global-batch", "2048", "--zero", "2", "--cluster", "dgx-h100", "--precision", "bf16", "--schedule", "interleaved"]


def run(hpdlc, src, args):
    return plan_run(hpdlc, f"{src}/samples/llama.hpd", [*MODEL, *args])


def plan(hpdlc, src, args):
    return plan_json(hpdlc, f"{src}/samples/llama.hpd", [*MODEL, *LAYOUT, *args])


def main():
    hpdlc, src = sys.argv[1], sys.argv[2]
    v8 = plan(hpdlc, src, ["--balance", "ends", "--virtual-stages", "8"])
    v4 = plan(hpdlc, src, ["--balance", "ends", "--virtual-stages", "4"])
    cost8 = run(hpdlc, src, [*LAYOUT, "--balance", "cost", "--virtual-stages", "8"])
    bad = run(hpdlc, src, [*LAYOUT, "--balance", "ends", "--virtual-stages", "3"])
    search = run(hpdlc, src, ["--gpus", "8192", "--tp", "8", "--pp", "16", "--virtual-stages", "8", "--schedule", "interleaved",
                              "--micro-batch", "1", "--global-batch", "2048", "--cluster", "dgx-h100", "--precision", "bf16",
                              "--recompute", "full", "--balance", "ends", "--search", "--top", "1", "--progress", "quiet"])
    if v8 is None or v4 is None:
        return verdict([(False, "the v = 8 and v = 4 plans under balance = ends")])
    layers8 = v8["parallel"]["stage_layers"]
    b8, b4 = v8["time"]["bubble_fraction"], v4["time"]["bubble_fraction"]
    print(f"balance = ends, v 8: stages {'+'.join(map(str, layers8))} layers, step {v8['time']['step_s']:.3f} s, "
          f"bubble {b8:.4f}; v 4: step {v4['time']['step_s']:.3f} s, bubble {b4:.4f}")
    print("balance = cost, v 8:", cost8.stderr.strip().splitlines()[0] if cost8.stderr.strip() else cost8.returncode)
    print("balance = ends, v 3:", bad.stderr.strip().splitlines()[0] if bad.stderr.strip() else bad.returncode)
    top = [line for line in search.stdout.splitlines() if line.strip().startswith("1 ") and "dp=" in line]
    print("search, v 8 fixed:", top[0].strip() if top else search.stdout[-300:] + search.stderr[-300:])
    checks = [
        (v8["parallel"]["balance"] == "ends", "the report's parallel.balance"),
        (layers8 == [7] + [8] * 14 + [7], "16 stages of 7, 8 x 14, 7 layers (a chunk of none on the first and the last)"),
        (sum(v4["parallel"]["stage_layers"]) == 126, "v 4: every layer on a stage"),
        # interleaved 1F1B: (p - 1) / (v m + p - 1) of the pipeline idle, m = 32 micro-batches (the
        # simulator adds the transfers, v times as many at v chunks a stage): 0.105 at v 4, 0.055 at v 8
        (abs(b4 - 15 / (4 * 32 + 15)) < 0.02 and b8 < 0.7 * b4, "the bubble near (p-1)/(v m + p-1), smaller at v 8"),
        (v8["time"]["step_s"] < v4["time"]["step_s"], "v 8 faster than v 4"),
        (cost8.returncode == 1 and "cannot be split into pipeline x virtual = 16 x 8" in cost8.stderr,
         "balance = cost refuses 126 layers in 128 chunks"),
        (bad.returncode == 1 and "126 layers and the two ends (embeddings, head) cannot be split equally into pipeline x "
         "virtual = 16 x 3 stages" in bad.stderr, "balance = ends refuses 16 x 3 chunks with the checker's message"),
        (search.returncode == 0 and bool(top) and "interleaved/v8" in top[0], "the search reaches 8 virtual stages"),
    ]
    return verdict(checks)


if __name__ == "__main__":
    sys.exit(main())
