#!/usr/bin/env python3
"""catalog_cmd.py - `hpdlc catalog [NAME...] [--format text|json]` (CTest: plan.catalog_cmd).

    catalog_cmd.py HPDLC SOURCE_DIR

  - the listing has a row for every device and cluster of the JSON, which has every figure;
  - an entry in full: `hpdlc catalog h100` names the device, its aliases, its dense peaks and
    the planner's own figures (132 SMs, GEMM ceiling 0.820, family hopper);
  - the catalog and the planner agree: dgx-h100's bf16 peak, memory and bandwidth in the
    catalog's JSON are the plan's (cluster.peak_flops, memory_bytes, hbm_bytes_per_s);
  - every cluster's "as a cluster file" block, written to a file, plans GPT-2 on 16 GPUs to
    the bit as the catalog's cluster does (a start for one's own cluster file), and so does
    the block with its device's figures written out as `hpdlc catalog DEVICE` gives them
    (a start for a device the catalog lacks);
  - a name both a device and a cluster (cpu) shows both; an unknown name exits 1 with a
    "did you mean"; a bad option or --format exits 2; --help exits 0.
Exit 0 pass, 1 fail."""
import json
import os
import subprocess
import sys
import tempfile

from plan_checks import plan_json, verdict


def cat(hpdlc, *args):
    return subprocess.run([hpdlc, "catalog", *args], capture_output=True, text=True)


def main():
    hpdlc, src = sys.argv[1], sys.argv[2]
    checks = []
    listing, js = cat(hpdlc), cat(hpdlc, "--format", "json")
    data = json.loads(js.stdout)
    devs, clus = data["devices"], data["clusters"]
    rows = listing.stdout.splitlines()
    print(f"{len(devs)} devices, {len(clus)} clusters")
    names = [r.split()[0] for r in rows if r.startswith("  ") and not r.startswith("  name")]
    checks += [
        (listing.returncode == 0 and names == [d["name"] for d in devs] + [c["name"] for c in clus],
         "the listing: a row for every device and cluster, in the JSON's order"),
        (len(devs) >= 16 and len(clus) >= 11 and all(
            set(d) >= {"memory_bytes", "memory_bytes_per_s", "peak_flops", "sms", "gemm_ceiling", "family", "source"}
            for d in devs), "the JSON: every device with its figures"),
    ]
    h = cat(hpdlc, "h100")
    print(h.stdout.splitlines()[0] if h.stdout else h.stderr)
    checks.append((h.returncode == 0 and "device h100-sxm (aliases: h100 h100-sxm5" in h.stdout
                   and "fp8 1978.9 TFLOP/s; none in fp4" in h.stdout
                   and "planner             132 SMs, GEMM ceiling 0.820 of peak, family hopper" in h.stdout,
                   "hpdlc catalog h100: the device in full, the planner's figures beside the datasheet's"))
    one = json.loads(cat(hpdlc, "dgx-h100", "h100", "--format", "json").stdout)
    p = plan_json(hpdlc, f"{src}/samples/gpt2.hpd", ["--cluster", "dgx-h100", "--gpus", "8"])
    if p is None:
        return 1
    d = one["devices"][0]
    checks.append((p["cluster"]["peak_flops"] == d["peak_flops"]["bf16"] and p["cluster"]["memory_bytes"] == d["memory_bytes"]
                   and p["cluster"]["hbm_bytes_per_s"] == d["memory_bytes_per_s"] and one["clusters"][0]["device"] == d["name"],
                   "the catalog's figures are the plan's (dgx-h100, bf16)"))
    with tempfile.TemporaryDirectory() as t:
        for c in clus:
            if c["name"] == "cpu":
                continue  # its figures are this machine's: planned in the suite's other tests
            full = cat(hpdlc, c["name"]).stdout
            block = full[full.index("as a cluster file:") + len("as a cluster file:"):]
            path = os.path.join(t, c["name"] + ".hpd")
            with open(path, "w") as f:
                f.write("\n".join(line[4:] for line in block.splitlines() if line.strip()) + "\n")
            # 16 GPUs: two nodes of 8 (the network priced too), or 16 of a rack
            lay = ["--gpus", "16", "--dp", "16", "--global-batch", "1024"]
            a = plan_json(hpdlc, f"{src}/samples/gpt2.hpd", ["--cluster", c["name"], *lay])
            b = plan_json(hpdlc, f"{src}/samples/gpt2.hpd", ["--cluster", path, *lay])
            same = a is not None and b is not None and a["time"] == b["time"] and a["memory_per_gpu"] == b["memory_per_gpu"]
            checks.append((same, f"{c['name']}: its cluster block plans GPT-2 as the catalog's cluster, to the bit"))
            # the device's figures as `hpdlc catalog DEVICE` writes them, in place of its device line
            dev = cat(hpdlc, c["device"]).stdout
            figs = [line.strip() for line in dev[dev.index("in a cluster file:"):].splitlines()[1:] if line.strip()]
            with open(path) as f:
                lines = f.read().splitlines()
            with open(path, "w") as f:
                for line in lines:
                    f.write("\n".join("  " + x for x in figs) + "\n" if line.strip().startswith("device =") else line + "\n")
            d = plan_json(hpdlc, f"{src}/samples/gpt2.hpd", ["--cluster", path, *lay])
            same = a is not None and d is not None and a["time"] == d["time"] and a["memory_per_gpu"] == d["memory_per_gpu"]
            checks.append((same and d["cluster"].get("device_figures"),
                           f"{c['name']}: with its device's figures written out (hpdlc catalog {c['device']}), to the bit"))
    both = cat(hpdlc, "cpu")
    checks.append(("device cpu" in both.stdout and "cluster cpu" in both.stdout, "cpu: the device and the cluster"))
    bad = cat(hpdlc, "h10")
    print(bad.stderr.strip())
    checks += [
        (bad.returncode == 1 and "hpdlc: catalog: no device or cluster is named 'h10'; did you mean h100-sxm?" in bad.stderr
         and not bad.stdout, "an unknown name: exit 1, a did-you-mean, nothing on stdout"),
        (cat(hpdlc, "--format", "xml").returncode == 2 and cat(hpdlc, "--verbose").returncode == 2
         and cat(hpdlc, "--format").returncode == 2, "a bad option or format: exit 2"),
        (cat(hpdlc, "--help").returncode == 0 and "usage: hpdlc catalog" in cat(hpdlc, "--help").stdout, "--help"),
    ]
    return verdict(checks)


if __name__ == "__main__":
    sys.exit(main())
