#!/usr/bin/env python3
"""nvrtc_samples.py - every kernel of every sample, compiled by NVRTC
(CTest: cuda.nvrtc.<case>).

Runs `hpdlc compile FILE --target cuda --arch ARCH` for one sample and
layout and checks what it wrote: the manifest names the cuda target and the
arch; per stage the cubin is a CUDA ELF (e_machine 190) for that SM (e_flags
bits 8-15 in CUDA 13's ABI version 8, bits 0-7 before), the PTX targets it,
and every launch of stageS.kernels.json has its ptxas resources, no
spills, and a launch shape. A fresh NVRTC cache each run, so the compile is
real. Exits 77 (CTest's skip) when NVRTC cannot be loaded.

With --broken-header the device functions' header is given with
hpdl_block_sum renamed, so the generated code does not compile: the error must name the
generated line, its kernel, the IR ops and the .hpd lines it comes from,
and the whole NVRTC log must be written beside the artifact.

usage: nvrtc_samples.py --hpdlc BIN --sample FILE --arch sm_80 [--broken-header] [-- FLAGS...]
"""
import argparse
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def elf_sm(path):
    with open(path, "rb") as f:
        head = f.read(64)
    if len(head) < 64 or head[:4] != b"\x7fELF" or head[4] != 2:
        fail(f"{path}: not a 64-bit ELF")
    machine = struct.unpack_from("<H", head, 18)[0]
    if machine != 190:
        fail(f"{path}: e_machine {machine}, not EM_CUDA (190)")
    flags = struct.unpack_from("<I", head, 48)[0]
    abi = head[8]
    return (flags >> 8) & 0xFF if abi >= 8 else flags & 0xFF


def ptx_entry(ptx, name):
    i = ptx.find(f".entry {name}(")
    if i < 0:
        fail(f"{name}: no .entry in the PTX")
    j = ptx.find(".entry ", i + 8)
    return ptx[i:j if j > 0 else len(ptx)]


def row_cache(name, src, ptx):
    """A warp's row kept in registers (codegen_cuda.c's row_cache): each kept
    vector c<x>_ is loaded from memory in one sweep and read from registers in
    a later one; the sweeps are unrolled whole (each vector load of the text
    is nit loads of the PTX, none again), and nothing is in local memory.
    Returns 1 where the kernel keeps a row, else 0."""
    m = re.search(r"/\* " + re.escape(name) + r":.*?\n}\n", src, re.S)
    if not m:
        fail(f"{name}: not in the generated source")
    text = m.group(0)
    kept = re.findall(r"\b(?:float4|uint2) c(\d+)_\[(\d+)\];", text)
    if not kept:
        return 0
    nit = int(kept[0][1])
    for x, n in kept:
        filled = len(re.findall(rf"\bc{x}_\[it_\] = q{x};", text))
        reread = len(re.findall(rf"= c{x}_\[it_\];", text))
        if filled != 1 or reread < 1 or int(n) != nit:
            fail(f"{name}: c{x}_ filled {filled} times, read back {reread} times (want 1 and at least 1)")
    vec_text = len(re.findall(r"= \*\(const (?:float4|uint2) \*\)\(p\d+", text))
    body = ptx_entry(ptx, name)
    vec_ptx = len(re.findall(r"ld\.global(?:\.nc)?\.v(?:4\.f32|2\.u32)", body))
    if vec_ptx != nit * vec_text:
        fail(f"{name}: {vec_ptx} vector loads in the PTX, want {nit} steps x {vec_text} of the source (a kept row loaded again?)")
    if re.search(r"\.local|ld\.local|st\.local", body):
        fail(f"{name}: local memory in the PTX (the kept row not in registers)")
    return 1


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hpdlc", required=True)
    ap.add_argument("--sample", required=True)
    ap.add_argument("--arch", required=True)
    ap.add_argument("--broken-header", action="store_true")
    ap.add_argument("flags", nargs="*")
    a = ap.parse_args()
    if a.broken_header:
        broken_header(a)
        return
    sm = int(a.arch[3:].rstrip("af"))
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "art")
        env = dict(os.environ, HPDL_CACHE=os.path.join(tmp, "cache"))
        cmd = [a.hpdlc, "compile", a.sample, "--target", "cuda", "--arch", a.arch, "-o", out, "-q", *a.flags]
        p = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if p.returncode != 0:
            if "NVRTC not found" in p.stderr:
                print("skipped: " + p.stderr.strip().splitlines()[-1])
                sys.exit(77)
            fail(f"{' '.join(cmd)}: exit {p.returncode}\n{p.stderr}")
        man = json.load(open(os.path.join(out, "manifest.json")))
        if man.get("target") != "cuda" or man.get("cuda", {}).get("arch") != a.arch:
            fail(f"manifest: target {man.get('target')}, cuda {man.get('cuda')}")
        stages = sorted(f[:-len(".kernels.json")] for f in os.listdir(out) if f.endswith(".kernels.json"))
        if not stages:
            fail("no stageS.kernels.json written")
        kernels = gemms = bare16 = kept_rows = 0
        epilogues = {}
        worst_regs = (0, "")
        for st in stages:
            got = elf_sm(os.path.join(out, st + ".cubin"))
            if got != sm:
                fail(f"{st}.cubin is for sm_{got}, not sm_{sm}")
            ptx = open(os.path.join(out, st + ".ptx")).read()
            if f".target sm_{sm}" not in ptx:
                fail(f"{st}.ptx does not target sm_{sm}")
            src = open(os.path.join(out, st + ".cu")).read()
            k = json.load(open(os.path.join(out, st + ".kernels.json")))
            if k["arch"] != a.arch or not k["nvrtc"] or not k["source_sha256"]:
                fail(f"{st}.kernels.json: arch {k['arch']}, nvrtc {k['nvrtc']}")
            for l in k["launches"]:
                if l["kind"] == "gemm":
                    g = l["gemm"]
                    if min(g["m"], g["n"], g["k"]) < 1:
                        fail(f"{l['name']}: gemm shape {g}")
                    e = g.get("epilogue")
                    if g.get("c_type", "f32") not in ("f32", "bf16"):
                        fail(f"{l['name']}: c_type {g['c_type']}")
                    if g.get("c_type") == "bf16":
                        # a bf16 D: bf16 operands, and a bias epilogue or none (the bare product rounded)
                        if g.get("ab_type") != "bf16" or (e and e["kind"] != "bias"):
                            fail(f"{l['name']}: a bf16 D from {g.get('ab_type')} operands with epilogue {e}")
                        if not e:
                            bare16 += 1
                    if e:
                        if e["kind"] not in ("bias", "bias_relu", "bias_gelu", "bgrad_a", "bgrad_b") or e["bias"] < 0:
                            fail(f"{l['name']}: epilogue {e}")
                        if e["kind"].startswith("bgrad") and (g.get("batch", 1) > 1 or e["aux"] >= 0):
                            fail(f"{l['name']}: a bias-gradient epilogue over a batch or with aux: {g}")
                        epilogues[e["kind"]] = epilogues.get(e["kind"], 0) + 1
                    gemms += 1
                    continue
                kernels += 1
                if "registers" not in l:
                    fail(f"{l['name']}: no ptxas resources (is it in the cubin?)")
                if l["spill_bytes"]:
                    fail(f"{l['name']} ({l['kind']}) spills {l['spill_bytes']} bytes")
                if l["grid"] < 1 or not (1 <= l["block"] <= 1024) or l["block"] % 32:
                    fail(f"{l['name']}: launch {l['grid']} x {l['block']}")
                worst_regs = max(worst_regs, (l["registers"], l["name"]))
                if l["kind"] == "wrow4":
                    kept_rows += row_cache(l["name"], src, ptx)
        # gpt2-tiny's linear layers have biases: in fp32 their gradients ride on
        # the weight gradients' GEMMs (fusion rule 8, cuBLASLt's BGRADA / BGRADB;
        # under bf16, gpt2.hpd's, the product reads dy's bf16 copy, the sum the fp32 dy)
        if os.path.basename(a.sample).startswith("gpt2-tiny") and not epilogues.get("bgrad_a", 0) + epilogues.get("bgrad_b", 0):
            fail(f"no bias-gradient epilogue among {gemms} GEMMs ({epilogues})")
        # gpt2.hpd trains in bf16: the backward's data gradients that only kernels
        # loading any type read are the GEMMs' bf16 D (compiler/ir/precision.c)
        if os.path.basename(a.sample) == "gpt2.hpd" and not bare16:
            fail(f"no GEMM writes its bare product in bf16 among {gemms} GEMMs")
        # GPT-2's LayerNorms (768 values a row, 6 vector steps a lane) keep their rows in registers
        if os.path.basename(a.sample) == "gpt2.hpd" and not kept_rows:
            fail("no LayerNorm kernel keeps its row in registers")
        epi = ", ".join(f"{n} {k}" for k, n in sorted(epilogues.items()))
        print(f"ok: {os.path.basename(a.sample)} {' '.join(a.flags)} {a.arch}: {len(stages)} stage(s), {kernels} kernels "
              f"(sm_{sm} ELF, PTX, no spills; most registers {worst_regs[0]} in {worst_regs[1]}), {gemms} GEMMs for cuBLASLt "
              f"(epilogues: {epi or 'none'}; {bare16} bare products into bf16; "
              f"{kept_rows} kernels keep a row in registers)")


def broken_header(a):
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with tempfile.TemporaryDirectory() as tmp:
        kdir = os.path.join(tmp, "kernels")
        os.mkdir(kdir)
        text = open(os.path.join(root, "kernels", "hpdl_cuda.cuh")).read()
        if "hpdl_block_sum(float v" not in text:
            fail("kernels/hpdl_cuda.cuh has no hpdl_block_sum(float v...) to break")
        open(os.path.join(kdir, "hpdl_cuda.cuh"), "w").write(text.replace("hpdl_block_sum(float v", "hpdl_block_sum_gone(float v"))
        # every other header as it is (the generated source includes them all)
        for header in sorted(os.listdir(os.path.join(root, "kernels"))):
            if header != "hpdl_cuda.cuh" and header.endswith((".cuh", ".h")):
                shutil.copy(os.path.join(root, "kernels", header), kdir)
        out = os.path.join(tmp, "art")
        env = dict(os.environ, HPDL_CACHE=os.path.join(tmp, "cache"), HPDL_KERNELS_DIR=kdir)
        cmd = [a.hpdlc, "compile", a.sample, "--target", "cuda", "--arch", a.arch, "-o", out, "-q", *a.flags]
        p = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if "NVRTC not found" in p.stderr:
            print("skipped: " + p.stderr.strip().splitlines()[-1])
            sys.exit(77)
        err = p.stderr.strip()
        if p.returncode != 1 or len(err.splitlines()) != 1:
            fail(f"expected one error line and exit 1, got {p.returncode}:\n{err}")
        for want in ['identifier "hpdl_block_sum" is undefined', "generated line", "of kernel hpd_", "it computes /* hpd_",
                     " of graph ", ".hpd:", "nvrtc.log"]:
            if want not in err:
                fail(f"the error lacks {want!r}: {err}")
        # the line quoted is the error's (not a warning's before it): it calls the lost function
        quoted = err.split("generated line", 1)[1].split("; it computes", 1)[0]
        if "hpdl_block_sum(" not in quoted:
            fail(f"the generated line quoted is not the error's: {quoted!r}")
        logs = [f for f in os.listdir(out) if f.endswith(".nvrtc.log")]
        if not logs or "error" not in open(os.path.join(out, logs[0])).read():
            fail(f"no NVRTC log with the error in {out}: {os.listdir(out)}")
        print("ok: " + err)


if __name__ == "__main__":
    main()
