#!/usr/bin/env python3
"""cp_comm_flag.py - `parallel.cp_comm` in the planner (CTest: plan.cp_comm_flag).

    cp_comm_flag.py HPDLC SOURCE_DIR

Context parallelism's keys and values reach the attention in one of two ways (docs/planner.md
9.2): `allgather` (the default; hpdl's compiled program, Llama 3's and PyTorch's context
parallelism) gathers them before the attention, so the whole exchange waits; `ring`
(Megatron-LM's p2p ring, and hpdl's compiled ring) sends each block while the attention
works on the one before, so up to (cp - 1) / cp of the attention hides it. The planner prices
the program `compile` builds for each: the ring's is one attention a block, merged
(attn_merge), its keys and values packed into one message a step. On Llama 3.1 8B at 131072
tokens, cp 4 over one H100 host: the same bytes exchanged under both (the ring's time within
5% of the gather's), allgather exposes all of it, ring hides all of it but the first transfer
of the backward's repeat of the exchange (under recomputation the blocks are received again,
not kept: autodiff.c's cp_rereceive; under full recomputation the forward's way, each under the
recomputed attention before it; forward, repeat and gradients are 9 transfers a layer at cp 4,
1 waits) and at most (cp - 1) / cp of the attention (under recompute none all of it hidden;
under selective the backward receives the blocks the other way round, the order it reads them,
again 1 of 9 waiting, and the activations are fewer than none's), and the ring pays for its merges and messages' copies in
memory-bound time (more than the gathered program's, by under 2% of the attention). The
reports say which (JSON parallel.cp_comm, the text layout line and --explain's source), and
at cp 1 the setting changes nothing. `cp_comm = auto` prices both programs and keeps the
faster: with every other setting fixed, the faster of the two above (here the gathered
one); in --search over 64 GPUs at 131072 tokens, the table holds layouts of both programs
(a ring's row says `ring`), the fastest first, and the winner planned alone under its own
cp_comm takes the step time the table gives it. Exit 0 pass, 1 fail."""
import re
import sys

from plan_checks import LLAMA31_8B, bind, rel, verdict

MODEL = [*LLAMA31_8B, "-D", "seq=131072"]
LAYOUT = ["--gpus", "8", "--tp", "1", "--cp", "4", "--dp", "2", "--zero", "3", "--micro-batch", "1", "--global-batch", "2",
          "--recompute", "full", "--precision", "bf16", "--cluster", "dgx-h100"]


def main():
    hpdlc, src = sys.argv[1], sys.argv[2]
    run, plan = bind(hpdlc, f"{src}/samples/llama.hpd", *MODEL)
    default = plan(LAYOUT)
    gather = plan([*LAYOUT, "--cp-comm", "allgather"])
    ring = plan([*LAYOUT, "--cp-comm", "ring"])
    cp1 = ["--gpus", "8", "--tp", "1", "--cp", "1", "--dp", "8", "--zero", "3", "--micro-batch", "1", "--global-batch", "8",
           "--recompute", "full", "--precision", "bf16", "--cluster", "dgx-h100", "-D", "seq=16384"]
    one = [plan([*cp1, "--cp-comm", m]) for m in ("allgather", "ring")]
    text = run([*LAYOUT, "--cp-comm", "ring", "--explain"])
    text_gather = run([*LAYOUT, "--explain"])
    bad = run([*LAYOUT, "--cp-comm", "p2p"])
    # the ring under the other policies: none keeps the blocks (all of it hidden); selective
    # receives them again the other way round, each under the attention before it but the
    # first (forward 3, again 3, gradients 3 a layer at cp 4: 1 of 9 waits)
    policy = {rc: plan([*[a if a != "full" else rc for a in LAYOUT], "--cp-comm", "ring"]) for rc in ("none", "selective")}
    auto = plan([*LAYOUT, "--cp-comm", "auto"])
    search = run(["--gpus", "64", "--search", "--top", "3", "--cp-comm", "auto", "--cluster", "dgx-h100"])
    rows = [m for m in (re.match(r"\s*\d+\s+(dp=.*?)\s+([\d.]+) s", line) for line in search.stdout.splitlines()) if m]
    win_ring, win_step = None, None
    if rows:
        words = rows[0].group(1).split()
        f = dict(w.split("=") for w in words if "=" in w)
        win_step = float(rows[0].group(2))
        win_ring = plan(["--gpus", "64", "--dp", f["dp"], "--tp", f["tp"], "--pp", f["pp"], "--cp", f["cp"], "--sp", f["sp"],
                         "--zero", f["zero"], "--micro-batch", f["mb"], "--recompute", f["rc"],
                         "--cp-comm", "ring" if "ring" in words else "allgather",
                         "--fused-ce", "on" if "fce" in words else "off", "--cluster", "dgx-h100"])
    if None in (default, gather, ring, auto, *one, *policy.values()):
        return verdict([(False, "the plans")])
    cg, cr = gather["comm_time_per_step"], ring["comm_time_per_step"]
    hidden = cr["total_s"]["cp"] - cr["exposed_s"]["cp"]
    attention = ring["time"]["attention_s"]
    merges = ring["time"]["memory_bound_s"] - gather["time"]["memory_bound_s"]
    print(f"allgather: exchange {cg['total_s']['cp'] * 1e3:.2f} ms, exposed {cg['exposed_s']['cp'] * 1e3:.2f} ms, "
          f"step {gather['time']['step_s']:.4f} s")
    print(f"ring:      exchange {cr['total_s']['cp'] * 1e3:.2f} ms, exposed {cr['exposed_s']['cp'] * 1e3:.2f} ms, "
          f"step {ring['time']['step_s']:.4f} s (attention {attention:.3f} s)")
    layout_line = next((line for line in text.stdout.splitlines() if line.startswith("layout:")), "")
    gather_line = next((line for line in text_gather.stdout.splitlines() if line.startswith("layout:")), "")
    print(layout_line)
    return verdict([
        (default["parallel"]["cp_comm"] == "allgather" and ring["parallel"]["cp_comm"] == "ring",
         "JSON parallel.cp_comm: allgather by default, ring under --cp-comm ring"),
        (rel(default["time"]["step_s"], gather["time"]["step_s"]) < 1e-12, "allgather is the default"),
        (gather["comm_per_step"]["cp"] > 0 and gather["comm_per_step"]["cp"] == ring["comm_per_step"]["cp"],
         "the same bytes exchanged under both"),
        (cg["total_s"]["cp"] > 0 and rel(cg["total_s"]["cp"], cr["total_s"]["cp"]) < 0.05,
         "the ring's sends take the gather's time within 5%"),
        (rel(cg["exposed_s"]["cp"], cg["total_s"]["cp"]) < 1e-12, "allgather: all of the exchange exposed"),
        (hidden > 0 and hidden <= attention * 3 / 4 * (1 + 1e-9), "ring: some of it hidden, at most (cp - 1) / cp of the attention"),
        (abs(cr["exposed_s"]["cp"] / cr["total_s"]["cp"] - 1 / 9) < 0.01,
         "ring, recompute full: what it exposes is the first transfer of the backward's repeat, 1 of 9"),
        (policy["none"]["comm_time_per_step"]["exposed_s"]["cp"] < 0.01 * policy["none"]["comm_time_per_step"]["total_s"]["cp"],
         "ring, recompute none: under 1% of its exchange exposed"),
        (abs(policy["selective"]["comm_time_per_step"]["exposed_s"]["cp"] /
             policy["selective"]["comm_time_per_step"]["total_s"]["cp"] - 1 / 9) < 0.01,
         "ring, recompute selective: the backward's first block of each layer waits, 1 of 9 exchanges"),
        (policy["selective"]["memory_per_gpu"]["activations"] < policy["none"]["memory_per_gpu"]["activations"],
         "ring, recompute selective: fewer activations than none (the blocks received again, not kept)"),
        (0 < merges < 0.02 * attention,
         f"ring: its merges and packed messages priced, {merges * 1e3:.1f} ms more memory-bound time than the gather's"),
        (layout_line.endswith("; cp_comm ring") and "cp_comm" not in gather_line, "the text layout line names a ring, not the default"),
        ("docs/planner.md 9.2: cp_comm = allgather, the keys and values gathered before the attention" in text_gather.stdout,
         "--explain cites the allgather's exposed exchange"),
        (rel(one[0]["time"]["step_s"], one[1]["time"]["step_s"]) < 1e-12, "at cp 1 the setting changes nothing"),
        (bad.returncode != 0 and "unknown cp_comm 'p2p'; it is allgather or ring" in bad.stderr, "a bad value refused"),
        (auto["parallel"]["cp_comm"] == "allgather" and
         rel(auto["time"]["step_s"], min(gather["time"]["step_s"], ring["time"]["step_s"])) < 1e-12,
         "auto, the rest fixed: the faster of the two programs, and JSON names it"),
        (len(rows) == 3 and any(" ring " in r.group(1) for r in rows) and any(" ring " not in r.group(1) for r in rows),
         "auto in --search: layouts of both programs in the table"),
        (all(float(rows[i].group(2)) <= float(rows[i + 1].group(2)) for i in range(len(rows) - 1)), "the fastest first"),
        (win_ring is not None and abs(win_step - win_ring["time"]["step_s"]) < 0.01,
         "the winner planned alone under its cp_comm: the table's step time"),
    ])


if __name__ == "__main__":
    sys.exit(main())
