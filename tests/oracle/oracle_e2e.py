#!/usr/bin/env python3
"""oracle_e2e.py - hpdl against Hugging Face `transformers` (issue 19), from goldens that
tools/hf_oracle.py wrote with transformers and torch (tests/oracle/FAMILY.*), so this test
needs neither.

A case compiles the family's sample at the golden's shapes (fp32), sets its optimizer to
SGD at rate 1 without momentum, decay or clipping, and runs one step under hpdlrun from
the golden's weights (--init-from) on the golden's batch (windows in file order). The
step's loss must equal transformers' within 1e-5 (relative), and the weights' change,
which is then minus the gradient, transformers' gradients within 1e-4 of each tensor's
largest; a state the golden gives a value after the step (after.NAME: DeepSeek-V3's routing
bias) must have it within 1e-6. Cases: FAMILY at one rank, FAMILY_tp2 (tensor parallelism
over two ranks), FAMILY_ep2 (the experts over two data-parallel ranks): llama, llama_tp2,
mixtral, mixtral_ep2, qwen3, qwen3_tp2, and qwen3_moe, gpt_oss, deepseek_v3 with both;
gpt_oss_keep, GPT-OSS without recomputation; deepseek_v3_groups and its _ep2, node-limited
routing (transformers 5.25.0's DeepseekV3 router with n_group 4, topk_group 2).
"""
import json
import os
import shutil
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import e2e_common  # noqa: E402
from e2e_common import check, metrics, run  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ARGS = None


def one_step(family, layout, dp=1):
    meta = json.load(open(os.path.join(HERE, family + ".json")))
    gold = e2e_common.safetensors_f32(os.path.join(HERE, family + ".safetensors"))
    defs = [x for k, v in meta["defines"].items() for x in ("-D", f"{k}={v}")]
    art = e2e_common.fresh_dir(ARGS.work, "art-" + "-".join([family, *layout]).replace("--", ""))
    run([os.path.join(ARGS.bin, "hpdlc"), "compile", os.path.join(ARGS.source, meta["sample"]), *defs, "--precision",
         "fp32", "--global-batch", str(meta["batch"]), "--micro-batch", str(meta["batch"] // dp), "--dp", str(dp), "--nodes", "1",
         "--cluster", "laptop", "--pp", "1", *layout, "-o", art])
    mf = os.path.join(art, "manifest.json")
    man = json.load(open(mf))
    man["train"]["optimizer"] = {"kind": "sgd", "lr": 1.0, "momentum": 0.0, "weight_decay": 0.0, "warmup": 0,
                                 "decay": "none"}
    man["train"]["clip"] = 0.0
    man["train"]["shuffle"] = False
    json.dump(man, open(mf, "w"))
    ck, m = os.path.join(art, "ck"), os.path.join(art, "m.jsonl")
    shutil.rmtree(ck, ignore_errors=True)
    run([os.path.join(ARGS.bin, "hpdlrun"), art, "--init-from", os.path.join(HERE, family + ".safetensors"), "--data",
         os.path.join(HERE, family + ".bin"), "--steps", "1", "--checkpoint-dir", ck, "--metrics", m, "--progress", "plain"])
    loss = metrics(m)[0]["loss"]
    print(f"{family} {' '.join(layout) or 'one rank'}: loss {loss:.8f}, transformers {meta['loss']:.8f}")
    check(abs(loss - meta["loss"]) <= 1e-5 * abs(meta["loss"]), f"loss {loss} against transformers' {meta['loss']}")
    after = e2e_common.safetensors_f32(os.path.join(ck, "step-00000001.safetensors"))
    worst, states = 0.0, 0
    for name, w0 in gold.items():
        if name.startswith("grad.") or name.startswith("after."):
            continue
        check(name in after, f"no {name} in the checkpoint")
        if "after." + name in gold:  # a state (DeepSeek-V3's routing bias): its value after the step
            d = max(abs(a - b) for a, b in zip(after[name], gold["after." + name]))
            check(d <= 1e-6, f"{name}: the state after the step differs from the update rule's by {d:.3g}")
            states += 1
            continue
        g = gold["grad." + name]
        big = max(abs(x) for x in g) or 1.0
        d = max(abs((a - b) - c) for a, b, c in zip(w0, after[name], g)) / big
        worst = max(worst, d)
        check(d <= 1e-4, f"{name}: the gradient differs from transformers' by {d:.3g} of its largest entry")
    print(f"  gradients of {sum(1 for n in gold if 'grad.' + n in gold)} tensors within {worst:.2g} of each one's largest"
          + (f"; {states} states as the update rule moves them" if states else ""))


def ep2(family):
    return one_step(family, ["--tp", "1", "--ep", "2", "--gpus-per-node", "2"], dp=2)


def tp2(family):
    return one_step(family, ["--tp", "2", "--gpus-per-node", "2"])


def mpi(case):
    return lambda: (e2e_common.need_mpi(ARGS.bin), case())


CASES = {
    "llama": lambda: one_step("llama", ["--tp", "1", "--gpus-per-node", "1"]),
    "llama_tp2": lambda: (e2e_common.need_mpi(ARGS.bin), one_step("llama", ["--tp", "2", "--gpus-per-node", "2"])),
    "mixtral": lambda: one_step("mixtral", ["--tp", "1", "--gpus-per-node", "1"]),
    "mixtral_ep2": lambda: (e2e_common.need_mpi(ARGS.bin), one_step("mixtral", ["--tp", "1", "--ep", "2", "--gpus-per-node", "2"], dp=2)),
}
for fam in ("qwen3", "qwen3_moe", "gpt_oss", "deepseek_v3"):
    CASES[fam] = lambda fam=fam: one_step(fam, ["--tp", "1", "--ep", "1", "--gpus-per-node", "1"])
    CASES[fam + "_tp2"] = mpi(lambda fam=fam: one_step(fam, ["--tp", "2", "--ep", "1", "--gpus-per-node", "2"]))
    if fam != "qwen3":
        CASES[fam + "_ep2"] = mpi(lambda fam=fam: ep2(fam))
# DeepSeek-V3's node-limited routing (8 experts in 4 blocks, a token's 2 within its best 2)
CASES["deepseek_v3_groups"] = lambda: one_step("deepseek_v3_groups", ["--tp", "1", "--ep", "1", "--gpus-per-node", "1"])
CASES["deepseek_v3_groups_ep2"] = mpi(lambda: ep2("deepseek_v3_groups"))
# keeping every activation (the samples recompute): GPT-OSS's clamped SwiGLU made again in
# the backward from its GEMMs' outputs (autodiff.c's constant_chain_recompute)
CASES["gpt_oss_keep"] = lambda: one_step("gpt_oss", ["--tp", "1", "--ep", "1", "--gpus-per-node", "1", "--recompute", "none"])


def main():
    global ARGS
    ARGS = e2e_common.case_args(CASES)
    return e2e_common.run_case(CASES, ARGS.case)


if __name__ == "__main__":
    sys.exit(main())
