#!/usr/bin/env python3
"""plan.field_guide_resnet18: hpdlc plan of the field guide's profiled ResNet-18
(tests/vision/resnet18-t4.hpd) against its torch.profiler figures
(tests/vision/field_guide.json, docs/planner.md sec. 9.5): the GEMMs (the
convolutions and the classifier) take 60-85% of the step (profile: convolutions
70.6%), memory-bound kernels 10-30% (batch norm 11.6% + ReLU 9.6%), and the
model states and activations 0.15-0.35 GB (peak memory 0.273 GB).

    field_guide.py HPDLC TESTS_DIR
"""
import json
import subprocess
import sys


def main():
    hpdlc, tests = sys.argv[1], sys.argv[2]
    ref = json.load(open(f"{tests}/vision/field_guide.json"))
    out = subprocess.run([hpdlc, "plan", "--format", "json", f"{tests}/vision/resnet18-t4.hpd"],
                         capture_output=True, text=True, check=True).stdout
    p = json.loads(out)
    t, m = p["time"], p["memory_per_gpu"]
    gemm, mem = t["gemm_s"] / t["step_s"], t["memory_bound_s"] / t["step_s"]
    states = (m["params"] + m["grads"] + m["optimizer"] + m["activations"]) / 1e9
    conv = ref["cuda_time_share"]["aten::conv2d"]
    norm = ref["cuda_time_share"]["aten::batch_norm"] + ref["cuda_time_share"]["aten::relu_"]
    print(f"GEMMs {gemm:.1%} of the step (profile: convolutions {conv:.1%}); memory-bound {mem:.1%} "
          f"(profile: batch norm + ReLU {norm:.1%}); states + activations {states:.3f} GB "
          f"(profile: peak {ref['peak_gpu_memory_gb']} GB)")
    bad = []
    if not 0.60 <= gemm <= 0.85:
        bad.append(f"GEMM share {gemm:.1%} outside [60%, 85%]")
    if not 0.10 <= mem <= 0.30:
        bad.append(f"memory-bound share {mem:.1%} outside [10%, 30%]")
    if not 0.15 <= states <= 0.35:
        bad.append(f"states + activations {states:.3f} GB outside [0.15, 0.35]")
    if p["model"]["params"] != 11181642:
        bad.append(f"parameters {p['model']['params']:.0f}, torchvision's resnet18(num_classes=10) has 11181642")
    for b in bad:
        print("FAIL:", b)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
