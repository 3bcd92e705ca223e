#!/usr/bin/env python3
"""no_fit.py - a plan that cannot be made still reports what was asked (CTest: plan.no_fit).

    no_fit.py HPDLC SOURCE_DIR

GPT-OSS-120B with 16 pipeline stages on 2 H100s, the tensor size left to the planner, has
no layout; so has Qwen3-30B-A3B's --search over 256 CPU nodes at micro-batch 16 (at 8, cp 16 x
ep 8 has fitted since a context rank's experts take its own tokens only). Each report still gives the
model's parameters (its whole and active counts, as a valid plan of the same model gives
them), its sequence and global batch, and the GPUs asked for - in the text header, the JSON
`model` and `cluster`, and the HTML facts - with the reason, and exits 1. (They once said
"0 parameters, -111104317440 active per token" and "0 x h100-sxm (0 nodes of 8)".)
A --search that finds nothing says which gate left nothing: no valid layout fitted the memory
(how many were valid, and the memory a GPU), none could be made for the model (gpt2-tiny on 6
GPUs: the first refused layout and its reason), or no degrees to try at all (GPT-2 over a
million GPUs: the bounds). At the bound of --gpus, 2^32 CPU nodes (tensor over nodes) and a
prime just under it: the refusal is the parameter that does not divide (it was "internal
error partitioning param: dimensions must be positive", the refused split carried on at
zero rows), and the search steps through the divisors of the GPUs, not every number up to
them (a minute each before; here a CTest timeout would fail it). A 77B GPT on 64 A100s with cp = auto, where nothing fits: the search shows the layout that
needs the least memory and names the ZeRO stage that would bring its model states down (the
explanation read the stages of a result the search had copied, and crashed).
Exit 0 pass, 1 fail."""
import json
import re
import sys

from plan_checks import plan_run, verdict

NO_LAYOUT = ["--gpus", "2", "--tp", "auto", "--pp", "16", "--zero", "2", "--micro-batch", "2", "--cluster", "dgx-h100"]


def main():
    hpdlc, src = sys.argv[1], sys.argv[2]
    oss = f"{src}/samples/gpt-oss.hpd"
    valid = json.loads(plan_run(hpdlc, oss, ["--format", "json"]).stdout)
    text = plan_run(hpdlc, oss, NO_LAYOUT)
    js = plan_run(hpdlc, oss, [*NO_LAYOUT, "--format", "json"])
    html = plan_run(hpdlc, oss, [*NO_LAYOUT, "--format", "html"])
    search = plan_run(hpdlc, f"{src}/samples/qwen3-moe.hpd",
                      ["--gpus", "256", "--pp", "auto", "--micro-batch", "16", "--recompute", "act", "--cluster", "cpu", "--search"])
    none = plan_run(hpdlc, f"{src}/samples/gpt2.hpd", ["--gpus", "1048576", "--search"])
    refused = plan_run(hpdlc, f"{src}/samples/gpt2-tiny.hpd", ["--gpus", "6", "--tp", "auto", "--dp", "auto", "--search"])
    huge = plan_run(hpdlc, f"{src}/samples/gpt2-tiny.hpd", ["--gpus", "4294967296", "--cluster", "cpu", "--search"])
    states = plan_run(hpdlc, f"{src}/samples/deepseek-v3.hpd", ["--gpus", "8", "--zero", "1", "--ep", "1",
                                                              "--cluster", "dgx-a100-40gb", "--search"])
    experts = plan_run(hpdlc, f"{src}/samples/deepseek-v3.hpd", ["--gpus", "16", "--cluster", "dgx-a100-40gb", "--search"])
    prime = plan_run(hpdlc, f"{src}/samples/gpt2-tiny.hpd", ["--gpus", "4294967291", "--cluster", "cpu", "--search"])
    big = plan_run(hpdlc, f"{src}/samples/gpt.hpd", ["-D", "layers=24", "-D", "hidden=16384", "-D", "heads=8", "-D", "seq=512",
                                                   "--gpus", "64", "--tp", "1", "--pp", "2", "--cp", "auto"])
    print(text.stdout.strip())
    print(search.stdout.strip().splitlines()[0] if search.stdout.strip() else search.stderr)
    d = json.loads(js.stdout) if js.stdout.strip().startswith("{") else {}
    m, cl = d.get("model", {}), d.get("cluster", {})
    vm = valid["model"]
    return verdict([
        (text.returncode == 1 and js.returncode == 1 and html.returncode == 1 and search.returncode in (0, 1),
         "exit 1 where the plan cannot be made"),
        ("layout: not valid: no layout of 2 GPUs to price: the settings given (data 32 x pipeline 16 x context 1 = 512 GPUs)"
         " need more; leave one of them auto or plan a multiple of 512 GPUs" in text.stdout,
         "the reason: the degrees given (the file's data, the command line's pipeline) and their product"),
        ("model GptOss, 116.83B parameters, 5.72B active per token" in text.stdout, "the text header's parameters"),
        ("cluster: dgx-h100, 2 x h100-sxm (1 node of 8), bf16" in text.stdout, "the text header's GPUs asked for"),
        (d.get("valid") is False and m.get("params") == vm["params"] and m.get("active_params") == vm["active_params"],
         "JSON model.params and active_params as a valid plan's"),
        (m.get("seq_len") == vm["seq_len"] and m.get("global_batch") == vm["global_batch"], "JSON sequence and global batch"),
        (cl.get("gpus") == 2, "JSON cluster.gpus"),
        (re.search(r"5\.72B active per token\), sequence 4096, global batch 1024", html.stdout) is not None
         and ": 2 x h100-sxm" in html.stdout and "1 node of 8" in html.stdout, "the HTML facts"),
        (big.returncode >= 0 and "no choice of the auto settings fits" in big.stdout
         and "ZeRO stage 3 would need 29.66 GiB" in big.stdout, "nothing fits with cp = auto: the least memory, and ZeRO's fix"),
        ("model Qwen3MoE, 30.53B parameters, 3.35B active per token" in search.stdout
         and "cluster: cpu, 256 x cpu (256 nodes of 1)" in search.stdout and "no layout fits" in search.stdout,
         "--search without a fit: the same header"),
        (re.search(r"no layout fits 256 GPUs: [1-9][0-9]* valid, none within 16\.00 GiB a GPU", search.stdout) is not None,
         "--search without a fit: how many layouts were valid, and the memory none fitted"),
        (refused.returncode == 1 and re.search(r"none of the [1-9][0-9]* layouts of 6 GPUs the search tried can be made for "
                                                r"this model; the first, dp=\d+ tp=\d+ [^:]*: .*(does not|cannot|not divisible)",
                                                refused.stdout) is not None,
         "--search where the model takes no layout: the first refused and why"),
        (none.returncode == 1 and "search: 0 layouts enumerated" in none.stdout
         and "no layout of 1048576 GPUs to price: dp x tp x pp x cp must be 1048576, with dp dividing the global batch (512)"
         in none.stdout, "--search with no layout to try: the bounds that left none"),
        (states.returncode == 1 and "search: 70 layouts enumerated, 0 valid" in states.stdout
         and "no layout fits 8 GPUs: the model states alone (weights, gradients, optimizer state) of each of the 70 "
             "layouts tried exceed the 40.00 GiB of a GPU" in states.stdout,
         "--search where every layout's model states alone exceed the memory: that gate, not a refusal without a reason"),
        (experts.returncode == 1 and "no layout of 16 GPUs to price: the settings given (data a multiple of expert 64 = 64 GPUs) "
                                     "need more; leave one of them auto or plan a multiple of 64 GPUs" in experts.stdout,
         "--search where the file's expert degree needs more GPUs: named"),
        (huge.returncode == 1 and "internal error" not in huge.stdout + huge.stderr
         and re.search(r"none of the 792 layouts of 4294967296 GPUs the search tried can be made for this model; the first, "
                       r"dp=32 tp=67108864 pp=2 [^:]*: the model does not partition over tp=67108864 cp=1: parameter "
                       r"blocks\.\{i\}\.attn\.q_proj\.weight: dimension 1 \(64\) does not divide over tensor = 67108864",
                       huge.stdout) is not None,
         "--search over 2^32 GPUs: the parameter that does not divide, no internal error"),
        (prime.returncode == 1 and "internal error" not in prime.stdout + prime.stderr
         and "none of the 24 layouts of 4294967291 GPUs the search tried" in prime.stdout,
         "--search over a prime number of GPUs near 2^32: its 24 layouts"),
    ])


if __name__ == "__main__":
    sys.exit(main())
