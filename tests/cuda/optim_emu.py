#!/usr/bin/env python3
"""optim_emu.py - kernels/hpdl_optim.cuh, the multi-tensor AdamW / SGD kernels
(CTest: cuda.optim.CASE, tests/cuda_optim.cmake).

    optim_emu.py --source REPO --work DIR --cc CC --cflags FLAGS --warnings FLAGS
                 [--cuda-home DIR] CASE

  adamw, sgd  tests/cuda/optim_emu.cpp with the header, compiled at test time as
              tests/cuda_emu/run_emu.py compiles kernels (the system C++ compiler,
              $HPDL_CXX, else $CXX, else c++, g++, clang++; -x c++, kernels/cuda_emu.h
              forced in; UBSan's alignment check where it links, so that a misaligned
              float4 fails as it faults on the GPU) and linked with runtime/optim.c and
              par.c compiled as the project compiles them (CC, the build type's flags,
              -std=c11, -fno-math-errno as runtime/CMakeLists.txt gives optim.c) and
              tests/cuda/optim_emu_c.c (the header from plain C11, the project's
              warnings); run under HPDL_EMU_ORDER forward, reverse and random: every
              value bit for bit optim.c's.
  mutation    the header with one deliberate slip at a time (an operation reordered, a
              fused multiply-add, eps inside the square root, a float4 lane swapped, a
              head off by one, the tail short by one, the decay flags swapped, the clip
              scale or SGD's first step forgotten, the float4 momentum not stored, the
              bf16-moment kernels' four-wide lanes, head and stores): the test must
              fail on each.
  sm_80, sm_90  the header through nvcc (-cubin -Xptxas -v; -ptx) and NVRTC for the arch:
              no warning, no spill, no stack frame, registers printed; the PTX keeps every
              operation apart (no fma / mad on f32, no .ftz, div.rn and sqrt.rn), has the
              128-bit path; NVRTC with --use_fast_math is refused by the header.

Exit 0 pass, 1 fail, 77 skip (no C++ compiler; no CUDA toolkit for sm_XX).
"""
import argparse
import ctypes
import glob
import os
import re
import shlex
import shutil
import subprocess
import sys

SKIP = 77
HERE = os.path.dirname(os.path.abspath(__file__))
ORDERS = [("forward", None), ("reverse", None), ("random", "1")]
RUN_TIMEOUT = 300


# The harness's own test driver: its compiler search, subprocess runner and
# failure type (one copy of each).
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "cuda_emu"))
from run_emu import Emu, Fail, compile_checked, run_ordered, sh  # noqa: E402


class Build:
    """Compiles the emulated test program from a header folder (kernels/, or a mutant's)."""

    def __init__(self, args):
        self.args = args
        emu = Emu(args)
        emu.usable()  # skips (77) or fails without a working C++ compiler; adds UBSan when it links
        self.cxx = emu.cxx
        ubsan = [f for f in emu.flags if f.startswith("-fsanitize") or f.startswith("-fno-sanitize")]
        # -ffp-contract=off: the harness maps __fmul_rn and friends to plain float
        # operations, which g++ in C++ mode may contract where the target has FMA
        self.cxxflags = ["-std=c++17", "-O2", "-fno-strict-aliasing", "-ffp-contract=off", "-Wall", "-Wextra", *ubsan]
        self.ldflags = ubsan
        self.cc = shlex.split(args.cc) if args.cc else [shutil.which("cc") or "cc"]
        self.cflags = ["-std=c11", *shlex.split(args.cflags), "-D_POSIX_C_SOURCE=200809L", "-D_XOPEN_SOURCE=700"]
        self.warnings = shlex.split(args.warnings)
        print("C: %s %s\nC++: %s %s" % (" ".join(self.cc), " ".join(self.cflags), " ".join(self.cxx),
                                         " ".join(self.cxxflags)))
        runtime = os.path.join(args.source, "runtime")
        self.objs = []
        # optim.c and par.c exactly as libhpdlrt builds them (optim.c: -fno-math-errno; half.h's
        # inline bf16 rounding from core/numeric)
        numeric = os.path.join(args.source, "core", "numeric")
        for src, extra in (("optim.c", ["-fno-math-errno", "-I", numeric]), ("par.c", [])):
            obj = os.path.join(args.work, src + ".o")
            self.compile_c([*self.cflags, *self.warnings, *extra, "-c", os.path.join(runtime, src), "-o", obj])
            self.objs.append(obj)

    def compile_c(self, cmd):
        rc, out = sh([*self.cc, *cmd], 300)
        if rc != 0 or out.strip():
            raise Fail("C compile %s: %s\n%s" % ("failed" if rc else "warned", " ".join([*self.cc, *cmd]), out))

    def program(self, name, header_dir):
        exe = os.path.join(self.args.work, name)
        cobj = exe + "_c.o"
        self.compile_c([*self.cflags, *self.warnings, "-I", header_dir, "-c", os.path.join(HERE, "optim_emu_c.c"),
                        "-o", cobj])
        cmd = [*self.cxx, *self.cxxflags, "-include", os.path.join(self.args.source, "kernels", "cuda_emu.h"),
               "-I", header_dir, "-I", os.path.join(self.args.source, "runtime"),
               "-I", os.path.join(self.args.source, "core", "numeric"), "-DHPDL_OPTIM_MOMENTS16", "-x", "c++",
               os.path.join(HERE, "optim_emu.cpp"), "-x", "none", cobj, *self.objs, *self.ldflags, "-lpthread", "-lm",
               "-o", exe]
        compile_checked(cmd)
        return exe


def run(exe, what, order, seed, timeout=RUN_TIMEOUT):
    return run_ordered([exe, what], order, seed, timeout)


def case_program(args, what):
    b = Build(args)
    exe = b.program("optim_emu", os.path.join(args.source, "kernels"))
    failed = []
    for order, seed in ORDERS:
        rc, out = run(exe, what, order, seed)
        label = order + (" seed " + seed if seed else "")
        print("=== %s, HPDL_EMU_ORDER=%s: %s" % (what, label, "timed out" if rc is None else "exit %d" % rc))
        print(out.rstrip())
        if rc != 0:
            failed.append(label)
    if failed:
        raise Fail("%s failed under: %s" % (what, ", ".join(failed)))


# (name, program case, text in the header, its replacement)
MUTANTS = [
    ("vi reassociated: (1 - b2) * (g * g)", "adamw",
     "__fmul_rn(__fmul_rn(omb2, gi), gi)", "__fmul_rn(omb2, __fmul_rn(gi, gi))"),
    ("mi as one fused multiply-add", "adamw",
     "__fadd_rn(__fmul_rn(a.beta1, m), __fmul_rn(omb1, gi))", "__fmaf_rn(a.beta1, m, __fmul_rn(omb1, gi))"),
    ("eps inside the square root", "adamw",
     "__fadd_rn(__fsqrt_rn(vhat), a.eps)", "__fsqrt_rn(__fadd_rn(vhat, a.eps))"),
    ("step * (mhat / denominator)", "adamw",
     "__fdiv_rn(__fmul_rn(a.lr, mhat), __fadd_rn(__fsqrt_rn(vhat), a.eps))",
     "__fmul_rn(a.lr, __fdiv_rn(mhat, __fadd_rn(__fsqrt_rn(vhat), a.eps)))"),
    ("float4 lane y reads lane z's gradient (both AdamW kernels)", "adamw",
     "hpdl_adamw_elem(P.y, G.y,", "hpdl_adamw_elem(P.y, G.z,"),
    ("head one element too long (misaligned float4)", "adamw",
     "int head = (int)(((16ull - (a & 15ull)) & 15ull) >> 2);",
     "int head = (int)(((16ull - (a & 15ull)) & 15ull) >> 2) + 1;"),
    ("tail one element short", "adamw",
     "for (int i = head + 4 * n4 + (int)threadIdx.x; i < k.count; i += blockDim.x)\n      hpdl_adamw_elem",
     "for (int i = head + 4 * n4 + (int)threadIdx.x; i < k.count - 1; i += blockDim.x)\n      hpdl_adamw_elem"),
    ("decay flags swapped", "adamw",
     "(k.flags & HPDL_OPTIM_DECAY) ? a.decay[1] : a.decay[0]",
     "(k.flags & HPDL_OPTIM_DECAY) ? a.decay[0] : a.decay[1]"),
    ("clip scale forgotten", "adamw",
     "const float gi = __fmul_rn(g, a.gscale);", "const float gi = g;"),
    ("sgd: first step reads the buffer", "sgd",
     "gi = a.first ? gi : __fadd_rn", "gi = __fadd_rn"),
    ("sgd: float4 momentum not stored", "sgd",
     "      if (mom) b4[i] = B;\n", "\n"),
    ("bf16 moments truncated, not rounded", "adamw",
     "const unsigned rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;", "const unsigned rounded = x >> 16;"),
    ("bf16 kernel: v stored from m", "adamw",
     "  v[i] = hpdl_optim_bf16_rn(vi);", "  v[i] = hpdl_optim_bf16_rn(mi);"),
    ("sgd bf16: momentum not stored", "sgd",
     "  if (mom) b[i] = hpdl_optim_bf16_rn(bi);\n", "\n"),
    ("bf16 four-wide: v stored from m", "adamw",
     "v4[i] = hpdl_optim_bf16_rn4(V);", "v4[i] = hpdl_optim_bf16_rn4(M);"),
    ("bf16 four-wide: the moments' lanes unpacked out of order", "adamw",
     "return make_float4(hpdl_optim_bf16_get(h.x), hpdl_optim_bf16_get(h.y),",
     "return make_float4(hpdl_optim_bf16_get(h.y), hpdl_optim_bf16_get(h.x),"),
    ("bf16 head: the moments' place in their groups not checked", "adamw",
     "((b ^ c) & 7ull) != 0 || (b & 7ull) != ((a & 15ull) >> 1)) {", "((b ^ c) & 7ull) != 0) {"),
    ("bf16 head one element too long", "adamw",
     "  return hpdl_optim_head(p, g, p, p, count, n4);\n}",
     "  const int head = hpdl_optim_head(p, g, p, p, count, n4);\n  return head < count ? head + 1 : head;\n}"),
    ("sgd bf16: four-wide momentum not stored", "sgd",
     "      if (mom) b4[i] = hpdl_optim_bf16_rn4(B);\n", "\n"),
    ("sgd: weight decay times the gradient", "sgd",
     "float gi = __fadd_rn(__fmul_rn(g, a.gscale), __fmul_rn(w, p));",
     "float gi = __fadd_rn(__fmul_rn(g, a.gscale), __fmul_rn(w, g));"),
]


def case_mutation(args):
    b = Build(args)
    header = open(os.path.join(args.source, "kernels", "hpdl_optim.cuh")).read()
    missed = []
    for k, (name, what, old, new) in enumerate(MUTANTS):
        if header.count(old) != 1:
            raise Fail("mutant %d (%s): the header no longer has exactly one '%s'" % (k, name, old))
        d = os.path.join(args.work, "mut%d" % k)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "hpdl_optim.cuh"), "w") as f:
            f.write(header.replace(old, new))
        exe = b.program("mut%d/optim_emu" % k, d)
        rc, out = run(exe, what, "forward", None)
        if rc is None:
            raise Fail("mutant %d (%s) hung" % (k, name))
        fails = [l for l in out.split("\n") if "FAIL" in l or "hpdl_emu" in l or "runtime error" in l]
        print("mutant %2d %-48s %s: exit %d%s" % (k, name, what, rc, "; first failure: " + fails[0].strip()[:150]
                                                 if fails else ""))
        if rc == 0:
            missed.append(name)
    if missed:
        raise Fail("mutants not caught: " + "; ".join(missed))
    print("all %d mutants caught" % len(MUTANTS))


def case_cuda(args, arch):
    home = args.cuda_home or os.environ.get("CUDA_HOME") or ""
    nvcc = os.path.join(home, "bin", "nvcc") if home else shutil.which("nvcc")
    if not nvcc or not os.path.exists(nvcc):
        print("skipped: no CUDA toolkit (nvcc) found; set CUDA_HOME or HPDL_CUDA_HOME")
        sys.exit(SKIP)
    home = home or os.path.dirname(os.path.dirname(nvcc))
    os.makedirs(args.work, exist_ok=True)
    src = os.path.join(args.source, "kernels", "hpdl_optim.cuh")
    cubin = os.path.join(args.work, "hpdl_optim.%s.cubin" % arch)
    ptx = os.path.join(args.work, "hpdl_optim.%s.ptx" % arch)
    # the 16-bit moments' kernels too, as hpdlc compiles them for such a run
    cmd = [nvcc, "-arch=" + arch, "-DHPDL_OPTIM_MOMENTS16", "-cubin", "-Xptxas", "-v", "-x", "cu", src, "-o", cubin]
    rc, out = sh(cmd, 300)
    if rc != 0:
        raise Fail("nvcc failed: %s\n%s" % (" ".join(cmd), out))
    other = [l for l in out.split("\n") if l.strip() and not l.startswith("ptxas info") and
             not re.match(r"\s+\d+ bytes stack frame", l)]
    if other:
        raise Fail("nvcc warned: %s\n%s" % (" ".join(cmd), out))
    kernels = {}
    cur = None
    for line in out.split("\n"):
        m = re.search(r"Function properties for (\w+)", line) or re.search(r"Compiling entry function '(\w+)'", line)
        if m:
            cur = kernels.setdefault(m.group(1), {})
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m and cur is not None:
            cur["stack"], cur["spill_st"], cur["spill_ld"] = (int(x) for x in m.groups())
        m = re.search(r"Used (\d+) registers", line)
        if m and cur is not None:
            cur["regs"] = int(m.group(1))
    want = ["hpdl_adamw_bf16m", "hpdl_adamw_f32", "hpdl_sgd_bf16m", "hpdl_sgd_f32", "hpdl_sumsq_f32"]
    if sorted(kernels) != want:
        raise Fail("nvcc: expected the kernels %s, ptxas reported %s:\n%s" % (", ".join(want), sorted(kernels), out))
    for name, r in sorted(kernels.items()):
        print("nvcc -arch=%s: %-16s %3d registers, %d bytes stack, %d / %d bytes spill stores / loads" %
              (arch, name, r.get("regs", -1), r.get("stack", -1), r.get("spill_st", -1), r.get("spill_ld", -1)))
        if r.get("spill_st") != 0 or r.get("spill_ld") != 0 or r.get("stack") != 0 or "regs" not in r:
            raise Fail("%s spills or has a stack frame for %s:\n%s" % (name, arch, out))
        if r["regs"] > 64:
            raise Fail("%s uses %d registers for %s (more than 64: under half occupancy)" % (name, r["regs"], arch))
    with open(cubin, "rb") as f:
        if f.read(4) != b"\x7fELF":
            raise Fail("%s is not an ELF file" % cubin)
    # the PTX: every float operation rounded on its own
    cmd = [nvcc, "-arch=" + arch, "-DHPDL_OPTIM_MOMENTS16", "-ptx", "-x", "cu", src, "-o", ptx]
    rc, out = sh(cmd, 300)
    if rc != 0 or out.strip():
        raise Fail("nvcc -ptx %s: %s\n%s" % ("failed" if rc else "warned", " ".join(cmd), out))
    text = open(ptx).read()
    ops = re.findall(r"^\s+([a-z]+[a-z0-9._]*)", text, re.M)
    count = lambda pred: sum(1 for o in ops if pred(o))
    fused = count(lambda o: (o.startswith("fma.") or o.startswith("mad.")) and o.endswith("f32"))
    ftz = count(lambda o: ".ftz" in o)
    approx = count(lambda o: ".approx" in o and o.endswith("f32"))
    facts = {
        "fma/mad f32": fused, ".ftz": ftz, ".approx f32": approx,
        "div.rn.f32": count(lambda o: o == "div.rn.f32"), "sqrt.rn.f32": count(lambda o: o == "sqrt.rn.f32"),
        "mul.rn.f32": count(lambda o: o == "mul.rn.f32"), "128-bit loads": count(lambda o: ".v4.f32" in o and
                                                                                 o.startswith("ld")),
        "128-bit stores": count(lambda o: ".v4.f32" in o and o.startswith("st")),
    }
    print("PTX %s: %s" % (arch, ", ".join("%s %d" % kv for kv in facts.items())))
    if fused or ftz or approx:
        raise Fail("the PTX for %s contracts or approximates float operations (would differ from optim.c)" % arch)
    if not facts["div.rn.f32"] or not facts["sqrt.rn.f32"] or not facts["128-bit loads"] or \
            not facts["128-bit stores"]:
        raise Fail("the PTX for %s lacks the IEEE division / square root or the 128-bit path" % arch)
    # NVRTC, as hpdlc compiles generated code
    libs = sorted(glob.glob(os.path.join(home, "lib64", "libnvrtc.so*")) +
                  glob.glob(os.path.join(home, "lib", "libnvrtc.so*")))
    libs = [l for l in libs if "builtins" not in l and ".alt." not in l]
    if not libs:
        print("NVRTC: no libnvrtc.so under %s; nvcc only" % home)
        return
    nvrtc = ctypes.CDLL(libs[0])
    text = open(src, "rb").read()

    def nvrtc_compile(opts):
        prog = ctypes.c_void_p()
        if nvrtc.nvrtcCreateProgram(ctypes.byref(prog), text, b"hpdl_optim.cuh", 0, None, None) != 0:
            raise Fail("nvrtcCreateProgram failed")
        arr = (ctypes.c_char_p * len(opts))(*opts)
        rc = nvrtc.nvrtcCompileProgram(prog, len(opts), arr)
        size = ctypes.c_size_t()
        nvrtc.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value)
        nvrtc.nvrtcGetProgramLog(prog, log)
        elf = b""
        if rc == 0:
            n = ctypes.c_size_t()
            if nvrtc.nvrtcGetCUBINSize(prog, ctypes.byref(n)) == 0 and n.value:
                buf = ctypes.create_string_buffer(n.value)
                nvrtc.nvrtcGetCUBIN(prog, buf)
                elf = buf.raw[:4]
        nvrtc.nvrtcDestroyProgram(ctypes.byref(prog))
        return rc, log.value.decode(errors="replace"), elf

    rc, log, elf = nvrtc_compile([("--gpu-architecture=" + arch).encode(), b"-DHPDL_OPTIM_MOMENTS16"])
    print("NVRTC --gpu-architecture=%s: %s" % (arch, "ok, cubin" if rc == 0 and elf == b"\x7fELF" else "FAILED"))
    if rc != 0 or log.strip() or elf != b"\x7fELF":
        raise Fail("NVRTC %s:\n%s" % ("failed" if rc else "warned or gave no cubin", log))
    rc, log, _ = nvrtc_compile([("--gpu-architecture=" + arch).encode(), b"--use_fast_math"])
    print("NVRTC --use_fast_math: %s" % ("refused by the header" if rc != 0 and "use_fast_math" in log else
                                          "NOT refused"))
    if rc == 0 or "use_fast_math" not in log:
        raise Fail("the header should refuse NVRTC's --use_fast_math:\n%s" % log)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--source", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--cc", default="")
    ap.add_argument("--cflags", default="-O2")
    ap.add_argument("--warnings", default="")
    ap.add_argument("--cuda-home", default="")
    ap.add_argument("case", choices=["adamw", "sgd", "mutation", "sm_80", "sm_90"])
    args = ap.parse_args()
    try:
        if args.case in ("adamw", "sgd"):
            case_program(args, args.case)
        elif args.case == "mutation":
            case_mutation(args)
        else:
            case_cuda(args, args.case)
    except Fail as e:
        print("FAIL: %s" % e)
        return 1
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
