#!/usr/bin/env python3
"""device_figures.py - a cluster that describes its own device (CTest: plan.device_figures).

    device_figures.py HPDLC SOURCE_DIR

A GPU the catalog lacks is planned by naming the catalog device it is most like and giving
the figures that differ (docs/language.md, Cluster; docs/catalog.md): memory, memory_bandwidth,
sms and the dense peaks fp64 ... fp4. Checked on Llama 3.1 8B at 4096 tokens, 8 GPUs:
  - an H20 (a Hopper part: 96 GiB at 4.0 TB/s, 78 SMs, 148 bf16 TFLOP/s): the JSON's
    cluster figures are the file's (peak, memory, bandwidth, device_figures), the text and
    HTML reports name them, the step is longer than the H100's by at least the peaks' ratio
    on the GEMMs;
  - a cluster that restates the H100 SXM's catalog figures plans to the bit as dgx-h100;
  - compute_scale and memory_scale apply on top of the file's figures;
  - samples/clusters/h100-nvl.hpd (the H100 NVL from its datasheet) plans with its figures;
  - fp8 = 0: an fp8 plan falls back to bf16 (the report says so), its step bf16's to the bit;
  - memory = 16GiB: the model does not fit (63.24 GiB of 16.00 GiB, the report says);
  - clear errors for a figure of another unit, an implausible one, and figures on a shared
    (CPU) device; exit 1.
Exit 0 pass, 1 fail."""
import os
import subprocess
import sys
import tempfile

from plan_checks import LLAMA31_8B, bind, rel, verdict

# what every cluster here shares: dgx-h100's node and network
NODE = {"device": "h100_sxm", "gpus_per_node": "8", "nics_per_node": "8", "inter_bandwidth": "400Gb/s"}
# an H20 (a Hopper part with fewer SMs, more and faster memory; figures as reported for it)
H20 = {"memory": "96GiB", "memory_bandwidth": "4.0TB/s", "sms": "78", "fp64": "1TFLOP/s", "fp32": "44TFLOP/s",
       "tf32": "74TFLOP/s", "bf16": "148TFLOP/s", "fp16": "148TFLOP/s", "fp8": "296TFLOP/s"}
# dgx-h100 written out, with the h100-sxm entry's own figures (docs/catalog.md)
H100_AGAIN = {"intra_bandwidth": "450GB/s", "intra_latency": "2us", "inter_latency": "5us", "memory": "80GiB",
              "memory_bandwidth": "3350GB/s", "sms": "132", "fp64": "66.9TFLOP/s", "fp32": "66.9TFLOP/s",
              "tf32": "494.7TFLOP/s", "bf16": "989.4TFLOP/s", "fp16": "989.4TFLOP/s", "fp8": "1978.9TFLOP/s", "fp4": "0"}


def cluster(name, settings):
    """A cluster block: NODE's settings, then `settings` (a later key replaces an earlier one)."""
    body = "".join(f"  {k} = {v}\n" for k, v in {**NODE, **settings}.items())
    return f"cluster {name} {{\n{body}}}\n"


def write(d, name, text):
    path = os.path.join(d, name)
    with open(path, "w") as f:
        f.write(text)
    return path


def main():
    hpdlc, src = sys.argv[1], sys.argv[2]
    run, plan = bind(hpdlc, f"{src}/samples/llama.hpd", *LLAMA31_8B, "-D", "seq=4096", "--gpus", "8", "--dp", "8",
                     "--tp", "1", "--pp", "1", "--zero", "1", "--micro-batch", "1", "--global-batch", "64")
    checks = []
    with tempfile.TemporaryDirectory() as d:
        h20 = write(d, "h20.hpd", cluster("h20_pod", H20))
        again = write(d, "h100_again.hpd", cluster("h100_again", H100_AGAIN))
        scaled = write(d, "h20_scaled.hpd", cluster("h20_pod", {**H20, "compute_scale": "0.5", "memory_scale": "0.25"}))
        nofp8 = write(d, "nofp8.hpd", cluster("h20_pod", {**H20, "fp8": "0"}))
        small = write(d, "small.hpd", cluster("h20_pod", {**H20, "memory": "16GiB"}))
        h, x = plan(["--cluster", h20]), plan(["--cluster", "dgx-h100"])
        a, s = plan(["--cluster", again]), plan(["--cluster", scaled])
        f8, b16 = plan(["--cluster", nofp8, "--precision", "fp8"]), plan(["--cluster", nofp8, "--precision", "bf16"])
        if None in (h, x, a, s, f8, b16):
            return 1
        cl = h["cluster"]
        print(f"h20: step {h['time']['step_s']:.3f} s (GEMMs {h['time']['gemm_s']:.3f}), h100: {x['time']['step_s']:.3f} s "
              f"({x['time']['gemm_s']:.3f}); peak {cl['peak_flops'] / 1e12:.0f} TFLOP/s, {cl['memory_bytes'] / 2**30:.0f} GiB "
              f"at {cl['hbm_bytes_per_s'] / 1e12:.1f} TB/s")
        checks += [
            (rel(cl["peak_flops"], 148e12) < 1e-9 and rel(cl["memory_bytes"], 96 * 2**30) < 1e-9
             and rel(cl["hbm_bytes_per_s"], 4e12) < 1e-9, "h20: the plan's peak, memory and bandwidth are the file's"),
            (cl["device"] == "h100-sxm" and cl.get("device_figures", {}).get("sms") == 78
             and sorted(cl["device_figures"]) == sorted(["memory", "memory_bandwidth", "sms", "fp64", "fp32", "tf32", "bf16",
                                                         "fp16", "fp8"]),
             "JSON cluster.device_figures: the figures the file gave"),
            ("device_figures" not in x["cluster"], "a catalog cluster has no device_figures"),
            (h["time"]["gemm_s"] > x["time"]["gemm_s"] * (989.4 / 148) * 0.9,
             "h20: the GEMMs priced at its own peak (about 989.4 / 148 x the H100's time)"),
            (a["time"] == x["time"] and a["memory_per_gpu"] == x["memory_per_gpu"] and a["comm_per_step"] == x["comm_per_step"],
             "the H100 SXM's figures written out: dgx-h100's plan to the bit"),
            (rel(s["cluster"]["peak_flops"], 74e12) < 1e-9 and rel(s["cluster"]["hbm_bytes_per_s"], 1e12) < 1e-9,
             "compute_scale and memory_scale apply on top of the file's figures"),
            (f8["time"]["step_s"] == b16["time"]["step_s"] and f8["model"]["gemm_format"] == "bf16",
             "fp8 = 0: an fp8 plan priced as bf16, to the bit"),
        ]
        text = run(["--cluster", h20]).stdout
        checks.append(("device: h100-sxm as cluster h20_pod describes it: memory 96.00 GiB, memory_bandwidth 4000 GB/s, "
                       "sms 78, fp64 1 TFLOP/s, fp32 44 TFLOP/s, tf32 74 TFLOP/s, bf16 148 TFLOP/s, fp16 148 TFLOP/s, "
                       "fp8 296 TFLOP/s" in text, "the text report names the device's figures"))
        html = run(["--cluster", h20, "--format", "html"]).stdout
        checks.append(("the device&#39;s figures from the cluster: memory 96.00 GiB" in html
                       or "the device's figures from the cluster: memory 96.00 GiB" in html, "the HTML report names them"))
        nvl = plan(["--cluster", f"{src}/samples/clusters/h100-nvl.hpd"])
        checks.append((nvl is not None and rel(nvl["cluster"]["peak_flops"], 835.5e12) < 1e-9
                       and rel(nvl["cluster"]["memory_bytes"], 94 * 2**30) < 1e-9,
                       "samples/clusters/h100-nvl.hpd: the H100 NVL's datasheet figures"))
        p = run(["--cluster", small])
        print(p.stdout.splitlines()[-1] if p.stdout else p.stderr)
        checks.append(("63.24 GiB  of 16.00 GiB: DOES NOT FIT" in p.stdout,
                       "memory = 16GiB: the 8B model does not fit, the report giving the device's 16 GiB"))
        cases = [
            ("memory = 96TB/s", "error: 'memory' is a size (GB, GiB, TB); this literal has another unit"),
            ("bf16 = 148GB", "error: 'bf16' is a rate (TFLOP/s, PFLOP/s); this literal has another unit"),
            ("bf16 = -3TFLOP/s", "error: 'bf16' must be a rate such as 989TFLOP/s (0: none), not -3e+12"),
            ("sms = 0", "error: 'sms' = 0 is implausible: a device has between 1 and 100000 streaming multiprocessors"),
            ("bf16 = 1e20", "error: 'bf16' = 1e+20 FLOP/s is implausible: a peak is 0 (no such precision) or between"),
            ("memory_bandwidth = 10B/s", "error: 'memory_bandwidth' = 10.0 B/s is implausible"),
            ("shared = true\n  bf16 = 1TFLOP/s", "error: cluster c gives its device's figures and shared = true"),
        ]
        for body, want in cases:
            bad = write(d, "bad.hpd", "cluster c {\n  device = h100_sxm\n  %s\n}\n" % body)
            p = subprocess.run([hpdlc, "plan", f"{src}/samples/gpt2-tiny.hpd", "--cluster", bad, "--gpus", "1"],
                               capture_output=True, text=True)
            got = [l for l in p.stderr.splitlines() if "error:" in l]
            print(f"{body.splitlines()[-1]!r}: exit {p.returncode}, {got[0] if got else p.stderr.strip()[:120]}")
            checks.append((p.returncode == 1 and any(want in l for l in got), f"{body!r}: {want}"))
    return verdict(checks)


if __name__ == "__main__":
    sys.exit(main())
