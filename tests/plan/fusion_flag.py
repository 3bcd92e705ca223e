#!/usr/bin/env python3
"""fusion_flag.py - `hpdlc plan --fusion off` (CTest: plan.fusion_flag).

    fusion_flag.py HPDLC SOURCE_DIR

torchtitan's eager Llama 3.1 8B row (8 H100, FSDP, selective recomputation, FlashAttention-2;
docs/planner.md 9.7): the program priced a kernel an op, as PyTorch's eager mode runs it.
Fusion moves bytes, not FLOPs, so the GEMMs and the attention must price alike; the
memory-bound kernels must cost more (each op reads its inputs from memory and writes its
output), and the step by what they add. The reports must say it (the text layout line,
JSON model.fusion, --explain's source), the CPU device must price it too, and a bad value
is refused. Exit 0 pass, 1 fail."""
import sys

from plan_checks import LLAMA31_8B, bind, rel, verdict

MODEL = [*LLAMA31_8B, "-D", "seq=8192"]
LAYOUT = ["--gpus", "8", "--tp", "1", "--dp", "8", "--zero", "3", "--micro-batch", "2", "--global-batch", "16",
          "--recompute", "ops", "--precision", "bf16", "--cluster", "dgx-h100", "--attention", "flash2"]


def main():
    hpdlc, src = sys.argv[1], sys.argv[2]
    run, plan = bind(hpdlc, f"{src}/samples/llama.hpd", *MODEL)
    on = plan([*LAYOUT, "--fusion", "on"])
    off = plan([*LAYOUT, "--fusion", "off"])
    default = plan(LAYOUT)
    text = run([*LAYOUT, "--fusion", "off", "--explain"])
    cpu_args = ["-D", "layers=2", "-D", "hidden=256", "-D", "heads=4", "-D", "kv_heads=2", "-D", "ffn=512", "-D", "vocab=1000",
                "-D", "seq=128", "--gpus", "1", "--tp", "1", "--dp", "1", "--micro-batch", "1", "--global-batch", "1",
                "--cluster", "cpu"]
    cpu_on, cpu_off = plan(cpu_args), plan([*cpu_args, "--fusion", "off"])
    bad = run([*LAYOUT, "--fusion", "eager"])
    if None in (on, off, default, cpu_on, cpu_off):
        return verdict([(False, "the plans")])
    t_on, t_off = on["time"], off["time"]
    print(f"fusion on:  step {t_on['step_s']:.4f} s, GEMM {t_on['gemm_s']:.4f} s, attention {t_on['attention_s']:.4f} s, "
          f"memory-bound {t_on['memory_bound_s']:.4f} s")
    print(f"fusion off: step {t_off['step_s']:.4f} s, GEMM {t_off['gemm_s']:.4f} s, attention {t_off['attention_s']:.4f} s, "
          f"memory-bound {t_off['memory_bound_s']:.4f} s")
    print(f"cpu: memory-bound {cpu_on['time']['memory_bound_s'] * 1e3:.3f} ms on, {cpu_off['time']['memory_bound_s'] * 1e3:.3f} ms off")
    layout_line = next((line for line in text.stdout.splitlines() if line.startswith("layout:")), "")
    memory_term = next((line for line in text.stdout.splitlines() if line.strip().startswith("memory-bound kernels")), "")
    print(layout_line)
    print(memory_term)
    added = t_off["step_s"] - t_on["step_s"]
    extra = t_off["compute_s"] - t_on["compute_s"]
    return verdict([
        (on["model"]["fusion"] == "on" and off["model"]["fusion"] == "off" and default["model"]["fusion"] == "on",
         "JSON model.fusion: on by default, off under --fusion off"),
        (rel(t_off["gemm_s"], t_on["gemm_s"]) < 1e-9, "the GEMMs price alike (fusion moves bytes, not FLOPs)"),
        (rel(t_off["attention_s"], t_on["attention_s"]) < 1e-9, "the attention prices alike (one kernel either way)"),
        (t_off["memory_bound_s"] > 1.3 * t_on["memory_bound_s"], "the memory-bound kernels cost over 1.3 x the fused ones"),
        (t_off["step_s"] > t_on["step_s"] and extra > 0 and rel(added, extra) < 0.1,
         "the step grows by what the kernels add (within 10%: the FSDP gathers hide under compute either way)"),
        (rel(default["time"]["step_s"], t_on["step_s"]) < 1e-12, "--fusion on is the default"),
        (layout_line.endswith("; fusion off"), "the text report's layout line says fusion off"),
        ("9.7" in memory_term and "a kernel an op" in memory_term, "--explain cites a kernel an op (docs/planner.md 9.7)"),
        (cpu_off["time"]["memory_bound_s"] > cpu_on["time"]["memory_bound_s"] and cpu_off["model"]["fusion"] == "off",
         "the CPU device prices the unfused program too"),
        (bad.returncode == 2 and "--fusion takes on or off, not 'eager'" in bad.stderr, "a bad value refused (exit 2)"),
    ])


if __name__ == "__main__":
    sys.exit(main())
