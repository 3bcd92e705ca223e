#!/usr/bin/env python3
"""gpu_gemm_sustained.py - how much of its peak a GPU holds under a long run of
large GEMMs, in BF16 and in FP8, with its SM clock and power beside each second.

The planner prices a GEMM at the device's benchmark ceiling x its generation's
sustained share (docs/planner.md sec. 3.2 and 14), one share for every
precision. Published pairs of runs (sec. 16, the DGX Cloud set) say FP8 gains
less over BF16 in training than that prices; a GPU that holds a lower clock
under FP8 GEMMs than under BF16 ones (the power limit) would explain it. This
measures it: back-to-back M x N x K GEMMs (cuBLAS through torch.mm in BF16,
torch._scaled_mm with tensor-wise scales in FP8 E4M3) for --seconds each, the
achieved TFLOP/s of every window of about one second, the SM clock, board
power and whether the power cap holds the clock down, read by nvidia-smi while
that window's GEMMs run, then the first
window's rate, the mean of the last half and their ratio (sustained / burst)
for each precision, and the FP8 share of its peak over the BF16 share.

    python3 bench/gpu_gemm_sustained.py [--seconds 20] [--m 8192 --n 8192 --k 8192]

Needs PyTorch with CUDA (exit 2, saying so, without); FP8 needs compute
capability 8.9 or newer (skipped, saying so, before)."""
import argparse
import os
import subprocess
import sys
import time

# dense peaks (TFLOP/s) by a name nvidia-smi reports: BF16, FP8 (docs/planner.md's catalog)
PEAKS = [("GB200", 2500.0, 5000.0), ("B200", 2250.0, 4500.0), ("H200", 989.4, 1978.9),
         ("H100 PCIe", 756.0, 1513.0), ("H100", 989.4, 1978.9), ("A100", 312.0, None)]


def peaks(name):
    for key, bf16, fp8 in PEAKS:
        if key in name:
            return bf16, fp8
    return None, None


def clocks_power(index):
    """The SM clock (MHz), board power (W) and whether the power cap holds the
    clock down now ("Active" / "Not Active"; older drivers name the field
    clocks_throttle_reasons), each None where nvidia-smi cannot say."""
    for fields in ("clocks.sm,power.draw,clocks_event_reasons.sw_power_cap",
                   "clocks.sm,power.draw,clocks_throttle_reasons.sw_power_cap", "clocks.sm,power.draw"):
        try:
            out = subprocess.run(["nvidia-smi", "-i", str(index), "--query-gpu=" + fields, "--format=csv,noheader,nounits"],
                                 capture_output=True, text=True, timeout=5)
            if out.returncode != 0:
                continue
            parts = [x.strip() for x in out.stdout.strip().split(",")]
            return float(parts[0]), float(parts[1]), parts[2] if len(parts) > 2 else None
        except (OSError, ValueError, IndexError, subprocess.SubprocessError):
            continue
    return None, None, None


def measure(torch, label, gemm, flops, seconds, index, peak):
    torch.cuda.synchronize()
    # calibrate: about one second of GEMMs a window
    t0 = time.perf_counter()
    for _ in range(10):
        gemm()
    torch.cuda.synchronize()
    per = max((time.perf_counter() - t0) / 10, 1e-6)
    count = max(1, int(1.0 / per))
    rows = []
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        t0 = time.perf_counter()
        for _ in range(count):
            gemm()
        sm, watts, capped = clocks_power(index)  # read while the window's GEMMs run
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        rows.append((time.perf_counter() - start, count * flops / dt / 1e12, sm, watts, capped))
    print(f"{label}: {len(rows)} windows of {count} GEMMs")
    print("      t (s)   TFLOP/s   of peak   SM MHz   power W   power cap")
    for t, rate, sm, watts, capped in rows:
        share = f"{rate / peak:8.1%}" if peak else "       -"
        print(f"   {t:8.1f}  {rate:8.1f}  {share}  {sm or 0:7.0f}  {watts or 0:8.1f}   {capped or '-'}")
    burst = rows[0][1]
    tail = rows[len(rows) // 2:]
    sustained = sum(r[1] for r in tail) / len(tail)
    clock = [r[2] for r in tail if r[2]]
    capped = sum(1 for r in tail if r[4] == "Active")
    print(f"{label}: first window {burst:.1f} TFLOP/s, last half {sustained:.1f} TFLOP/s "
          f"(sustained / burst {sustained / burst:.3f})"
          + (f", {sustained / peak:.1%} of the {peak:.0f} TFLOP/s peak" if peak else "")
          + (f", SM clock {sum(clock) / len(clock):.0f} MHz" if clock else "")
          + (f", held by the power cap in {capped} of {len(tail)} windows" if any(r[4] for r in tail) else ""))
    return sustained


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=20.0, help="how long each precision runs (default 20)")
    ap.add_argument("--m", type=int, default=8192)
    ap.add_argument("--n", type=int, default=8192)
    ap.add_argument("--k", type=int, default=8192)
    args = ap.parse_args()
    try:
        import torch
    except ImportError:
        print("gpu_gemm_sustained: PyTorch is not installed (pip install torch); nothing measured", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("gpu_gemm_sustained: PyTorch finds no CUDA device; nothing measured", file=sys.stderr)
        return 2
    index = torch.cuda.current_device()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    smi_index = int(visible.split(",")[index]) if visible and visible.split(",")[index].isdigit() else index
    name = torch.cuda.get_device_name(index)
    bf16_peak, fp8_peak = peaks(name)
    m, n, k = args.m, args.n, args.k
    flops = 2.0 * m * n * k
    print(f"device: {name}; torch {torch.__version__}; {m} x {n} x {k}, {args.seconds:.0f} s a precision")
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    c = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    s16 = measure(torch, "bf16", lambda: torch.mm(a, b, out=c), flops, args.seconds, smi_index, bf16_peak)
    if torch.cuda.get_device_capability(index) < (8, 9) or not hasattr(torch, "float8_e4m3fn"):
        print("fp8: skipped, the device or this PyTorch has no FP8 GEMM")
        return 0
    a8 = a.to(torch.float8_e4m3fn)
    b8 = b.t().contiguous().to(torch.float8_e4m3fn).t()  # column-major, as _scaled_mm wants
    one = torch.ones((), device="cuda", dtype=torch.float32)
    try:  # a private API: its signature has changed between releases
        torch._scaled_mm(a8, b8, one, one, out_dtype=torch.bfloat16)
    except (RuntimeError, TypeError) as e:
        print(f"fp8: skipped, torch._scaled_mm failed in this PyTorch: {e}")
        return 0
    s8 = measure(torch, "fp8", lambda: torch._scaled_mm(a8, b8, one, one, out_dtype=torch.bfloat16),
                 flops, args.seconds, smi_index, fp8_peak)
    if bf16_peak and fp8_peak:
        print(f"fp8's sustained share of its peak over bf16's: {(s8 / fp8_peak) / (s16 / bf16_peak):.3f} "
              "(1 is what the planner assumes: one sustained share for every precision)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
