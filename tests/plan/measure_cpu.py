#!/usr/bin/env python3
"""measure_cpu.py - `hpdlc plan --measure-cpu` (CTest: plan.measure_cpu).

    measure_cpu.py HPDLC SOURCE_DIR

Times this machine and plans the cpu device with what it measured: the line on stderr
names each figure (sgemm GFLOP/s with its library and threads, the triad's GB/s, the
memory, the bf16 GEMM's GFLOP/s and how it ran), and the JSON report's cluster carries
them - peak_flops the sgemm rate in fp32 and the bf16 GEMM's under precision = bf16,
hbm_bytes_per_s the triad, memory_bytes the machine's memory - where the catalog's cpu
device has its laptop defaults (768 GFLOP/s, 50 GB/s, 16 GiB) without the option. On a
cluster of other devices the option is refused (exit 2), as the figures would not be used.
Exit 0 pass, 1 fail."""
import json
import re
import sys

from plan_checks import plan_run, verdict

LINE = (r"measured cpu: sgemm ([0-9.]+) GFLOP/s \((OpenBLAS|plain C, OpenBLAS not found), (\d+) threads?\), "
        r"triad ([0-9.]+) GB/s, ([0-9.]+) GiB; bf16 GEMM ([0-9.]+) GFLOP/s \(([^)]*\)?)\)")


def near(a, b, step):
    """a (from JSON) equals b (printed to `step`) within the print's rounding"""
    return abs(a - b) <= step / 2 + 1e-9 * abs(b)


def main():
    hpdlc, src = sys.argv[1], sys.argv[2]
    tiny = f"{src}/samples/gpt2-tiny.hpd"
    fp32 = plan_run(hpdlc, tiny, ["--cluster", "cpu", "--measure-cpu", "--format", "json"])
    bf16 = plan_run(hpdlc, tiny, ["--cluster", "cpu", "--measure-cpu", "--precision", "bf16", "--format", "json"])
    default = plan_run(hpdlc, tiny, ["--cluster", "cpu", "--format", "json"])
    other = plan_run(hpdlc, tiny, ["--cluster", "dgx-h100", "--gpus", "1", "--measure-cpu"])
    print(fp32.stderr.strip())
    print(bf16.stderr.strip())
    m32, m16 = re.search(LINE, fp32.stderr), re.search(LINE, bf16.stderr)
    ok = fp32.returncode == 0 and bf16.returncode == 0 and default.returncode == 0 and m32 is not None and m16 is not None
    checks = [(ok, "both plans made, each with its measured line")]
    if ok:
        c32, c16 = json.loads(fp32.stdout)["cluster"], json.loads(bf16.stdout)["cluster"]
        cdef = json.loads(default.stdout)["cluster"]
        sgemm, triad, gib, bf = float(m32.group(1)), float(m32.group(4)), float(m32.group(5)), float(m16.group(6))
        checks += [
            (all(float(m.group(i)) > 0 for m in (m32, m16) for i in (1, 3, 4, 5, 6)), "every figure positive"),
            (near(c32["peak_flops"] / 1e9, sgemm, 0.1), f"fp32: the device's peak is the sgemm rate ({c32['peak_flops']} vs {sgemm} G)"),
            (near(c32["hbm_bytes_per_s"] / 1e9, triad, 0.1), f"its bandwidth the triad's ({c32['hbm_bytes_per_s']} vs {triad} G)"),
            (near(c32["memory_bytes"] / 2**30, gib, 0.1), f"its memory the machine's ({c32['memory_bytes']} vs {gib} GiB)"),
            (near(c16["peak_flops"] / 1e9, bf, 0.1), f"bf16: the device's peak is the bf16 GEMM's ({c16['peak_flops']} vs {bf} G)"),
            ((cdef["peak_flops"], cdef["hbm_bytes_per_s"], cdef["memory_bytes"]) == (768e9, 50e9, 17179869180.0),
             f"without the option the catalog's cpu figures: {cdef}"),
        ]
    checks.append((other.returncode == 2 and "--measure-cpu measures this machine for the cpu device, but cluster dgx-h100 has "
                   "h100-sxm devices" in other.stderr and "measured cpu" not in other.stderr,
                   f"refused on a cluster of other devices, before measuring: {other.stderr.strip()}"))
    return verdict(checks)


if __name__ == "__main__":
    sys.exit(main())
