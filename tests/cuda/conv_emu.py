#!/usr/bin/env python3
"""conv_emu.py - kernels/hpdl_conv.cuh, convolution and pooling forward and backward
(CTest: cuda.conv.CASE, tests/cuda_conv.cmake).

    conv_emu.py --source REPO --work DIR --cc CC --cflags FLAGS --warnings FLAGS
                [--cuda-home DIR] CASE

  emu         tests/cuda/conv_emu.cpp (with the kernels of conv_emu.cu) compiled at test time
              as tests/cuda_emu/run_emu.py compiles kernels (the system C++ compiler, -x c++,
              kernels/cuda_emu.h forced in, UBSan's alignment and bounds checks where they
              link), linked with core/numeric/conv.c and attn.c compiled as C (CC, the build's
              flags, the project's warnings): the reference is conv.c's fp64 loops. Run
              under HPDL_EMU_ORDER forward, reverse and random (two seeds): every case
              within 1e-5 of the reference, and every order bit for bit the same (the
              program's digests). Then the launch rule (hpdl_conv_plan) from plain C11
              (tests/cuda/conv_emu_plan.h, -Werror): the same as C++ sees it.
  mutation    the header with one deliberate slip at a time (a barrier of the tile loop
              removed, the padding off by one, a group's channels at the wrong offset, the
              stride's divisibility or the dilation forgotten, a split short of its last
              reduction, the split sum short of its last split, the last max taken instead of
              the first, the padding left out of an average, an adaptive window's ceiling
              taken as a floor, a pooled input's first window missed): each must fail a case
              under some order.
  sm_80, sm_90  conv_emu.cu (every tile tier of the three convolutions, the split sum, the
              two poolings) through NVRTC as hpdlc compiles generated code
              (--ptxas-options=-v): no warning, no spill, no stack frame, at most 48 KB of
              static shared memory a kernel; registers printed.

Exit 0 pass, 1 fail, 77 skip (no C++ compiler; no NVRTC for sm_XX).
"""
import argparse
import concurrent.futures
import os
import re
import shlex
import shutil
import sys

SKIP = 77
HERE = os.path.dirname(os.path.abspath(__file__))
RUN_TIMEOUT = 300
SMEM_LIMIT = 49152

# The harness's own test driver (compiler search, orders, runner, failure type) and the
# attention test's NVRTC finder: one copy of each.
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "cuda_emu"))
sys.path.insert(0, HERE)
from run_emu import ORDERS, Emu, Fail, compile_checked, label, run_ordered, sh  # noqa: E402
from attention_emu import nvrtc_check  # noqa: E402

KERNELS = (["conv_%s_t%d" % (op, t) for op in ("fwd", "bwd_data", "bwd_filter") for t in range(5)] +
           ["conv_sum_splits", "pool_fwd", "pool_bwd"])


class Build:
    """Compiles the emulated test program against a header folder (kernels/, or a mutant's),
    with core/numeric/conv.c and attn.c compiled once as the project compiles C."""

    def __init__(self, args, sanitize=True, opt="-O2"):
        self.args = args
        emu = Emu(args)
        emu.usable()  # skips (77) or fails without a working C++ compiler; adds UBSan when it links
        self.cxx = emu.cxx
        # -Wno-unused-function: hpdl_cuda.cuh's helpers are static, and this program uses few
        flags = [f if f != "-O2" else opt for f in emu.flags] + ["-Wno-unused-function"]
        self.flags = [f for f in flags if sanitize or not f.startswith("-fsanitize") and
                      not f.startswith("-fno-sanitize")]
        self.ubsan = [f for f in self.flags if f.startswith("-fsanitize") or f.startswith("-fno-sanitize")]
        self.cc = shlex.split(args.cc) if args.cc else [shutil.which("cc") or "cc"]
        self.cflags = ["-std=c11", *shlex.split(args.cflags), "-D_POSIX_C_SOURCE=200809L", "-D_XOPEN_SOURCE=700"]
        self.core = os.path.join(args.source, "core", "numeric")
        os.makedirs(args.work, exist_ok=True)
        self.objs = []
        for src in ("conv.c", "attn.c"):
            obj = os.path.join(args.work, src + ".o")
            self.compile_c([*self.cflags, *shlex.split(args.warnings), "-c", os.path.join(self.core, src), "-o", obj])
            self.objs.append(obj)

    def compile_c(self, cmd):
        rc, out = sh([*self.cc, *cmd], 300)
        if rc != 0 or out.strip():
            raise Fail("C compile %s: %s\n%s" % ("failed" if rc else "warned", " ".join([*self.cc, *cmd]), out))

    def program(self, name, header_dir):
        exe = os.path.join(self.args.work, name)
        os.makedirs(os.path.dirname(exe), exist_ok=True)
        kernels = os.path.join(self.args.source, "kernels")
        compile_checked([*self.cxx, *self.flags, "-include", os.path.join(kernels, "cuda_emu.h"), "-I", header_dir,
                         "-I", kernels, "-I", self.core, "-x", "c++", os.path.join(HERE, "conv_emu.cpp"), "-x", "none",
                         *self.objs, *self.ubsan, "-lpthread", "-lm", "-o", exe])
        return exe


def run(exe, what, order, seed):
    return run_ordered([exe, what], order, seed, RUN_TIMEOUT)


def digests(out):
    return [l for l in out.split("\n") if l.startswith("digest ")]


PLAN_C11 = r"""/* written by tests/cuda/conv_emu.py: kernels/hpdl_conv.cuh's launch rule from plain C11 */
#include "conv_emu_plan.h"

int main(void) {
  conv_emu_print_plan();
  return 0;
}
"""


def case_emu(args):
    b = Build(args)
    print("C++: %s %s" % (" ".join(b.cxx), " ".join(b.flags)))
    exe = b.program("conv_emu", os.path.join(args.source, "kernels"))
    failed, first = [], None
    for order, seed in ORDERS:
        rc, out = run(exe, "all", order, seed)
        lab = label(order, seed)
        print("=== all, HPDL_EMU_ORDER=%s: %s" % (lab, "timed out" if rc is None else "exit %d" % rc))
        if first is None or rc != 0:
            print("\n".join(l for l in out.rstrip().split("\n") if not l.startswith("digest ")))
        if rc != 0:
            failed.append(lab)
        elif first is None:
            first = (lab, digests(out))
        elif digests(out) != first[1]:
            failed.append(lab + " (results differ in bits from " + first[0] + ")")
    if failed:
        raise Fail("failed under: %s" % ", ".join(failed))
    print("every order: the same bits in all %d cases" % len(first[1]))

    # the launch rule from C11, with the project's warnings
    src = os.path.join(args.work, "plan_c11.c")
    with open(src, "w") as f:
        f.write(PLAN_C11)
    cexe = os.path.join(args.work, "plan_c11")
    cmd = [*b.cc, "-std=c11", *shlex.split(args.cflags), *shlex.split(args.warnings), "-Werror", "-I",
           os.path.join(args.source, "kernels"), "-I", HERE, src, "-o", cexe]
    rc, out = sh(cmd, 300)
    if rc != 0 or out.strip():
        raise Fail("hpdl_conv.cuh from C11 %s: %s\n%s" % ("failed" if rc else "warned", " ".join(cmd), out))
    rc, c_out = sh([cexe], 60)
    rc2, cxx_out = sh([exe, "plan"], 60)
    if rc != 0 or rc2 != 0 or c_out != cxx_out or "rc -1" not in c_out:
        raise Fail("the launch rule differs between C11 (exit %s) and C++ (exit %s), or refuses nothing:\nC11:\n%sC++:\n%s"
                   % (rc, rc2, c_out, cxx_out))
    print("launch rule, the same from C11 (%s) and C++:\n%s" % (" ".join(b.cc), c_out.rstrip()))


def barrier(what):
    why = re.match(r".*/\* igemm: (.*) \*/$", what).group(1)
    return ("the tile loop's barrier '%s' removed" % why, what, "/* removed by the mutation test */")


# (name, text in the header, its replacement)
MUTANTS = [
    barrier("__syncthreads(); /* igemm: the tile is loaded */"),
    barrier("__syncthreads(); /* igemm: the tile is read before the next is loaded */"),
    ("fwd: the padding off by one",
     "ld.hb = p / s.Wo * s.sh - s.ph; /* fwd: the window's top row */",
     "ld.hb = p / s.Wo * s.sh - s.ph + 1;"),
    ("bwd_data: the padding off by one",
     "ld.wp = p % s.W + s.pw;", "ld.wp = p % s.W + s.pw - 1;"),
    ("bwd_filter: the padding off by one",
     "ld.hoff = ki * s.dh - s.ph; /* bwd_filter: the tap's row offset */", "ld.hoff = ki * s.dh - s.ph - 1;"),
    ("fwd: the group's input channels at the output channels' offset",
     "ld.xc = x + ((long long)n * s.C + g * Cg) * s.H * s.W; /* fwd: the group's first input channel */",
     "ld.xc = x + ((long long)n * s.C + g * Og) * s.H * s.W;"),
    ("bwd_data: the group's dy channels at the input channels' offset",
     "ld.dyc = dy + ((long long)n * s.O + g * Og) * s.Ho * s.Wo; /* bwd_data: the group's first output channel */",
     "ld.dyc = dy + ((long long)n * s.O + g * Cg) * s.Ho * s.Wo;"),
    ("bwd_filter: the group's x channels at the output channels' offset",
     "ld.xc = x + ((long long)g * Cg + c) * s.H * s.W; /* bwd_filter: the group's input channel c */",
     "ld.xc = x + ((long long)g * Og + c) * s.H * s.W;"),
    ("bwd_data: taps between the strides taken",
     "if (th < 0 || tw < 0 || th % s.sh || tw % s.sw) return 0.0f;", "if (th < 0 || tw < 0) return 0.0f;"),
    ("fwd: the dilation forgotten",
     "return hpdl_conv_x_at(xc, s, c, hb + ki * s.dh, wb + kj * s.dw);", "return hpdl_conv_x_at(xc, s, c, hb + ki, wb + kj);"),
    ("bwd_filter: a split one reduction short",
     "k1 = k0 + chunk < red ? k0 + chunk : red; /* the split's reductions */",
     "k1 = k0 + chunk - 1 < red ? k0 + chunk - 1 : red;"),
    ("the split sum one split short",
     "for (int q = 1; q < splits; q++) v += part[q * n + e];", "for (int q = 1; q < splits - 1; q++) v += part[q * n + e];"),
    ("max pooling: the last max, not the first",
     "if (at < 0 || v > best || (v != v && best == best)) { /* pool: the first max wins */",
     "if (at < 0 || v >= best || (v != v && best == best)) {"),
    ("avg pooling: the padding not counted",
     "count = b - a; /* pool: the padding counted */", "count = (b > L ? L : b) - (a < 0 ? 0 : a);"),
    ("adaptive pooling: the window's end rounded down",
     "hi = (int)(((long long)(i + 1) * L + out - 1) / out); /* adaptive: the ceiling */",
     "hi = (int)(((long long)(i + 1) * L) / out);"),
    ("pool backward: an input's first window missed",
     "const int lo = h + p - k + 1; /* a window [i st - p, i st - p + k) holds h */", "const int lo = h + p - k + 2;"),
]


def case_mutation(args):
    # no UBSan, -O1: a slip shows in the values, not as undefined behaviour
    b = Build(args, sanitize=False, opt="-O1")
    header = open(os.path.join(args.source, "kernels", "hpdl_conv.cuh")).read()
    jobs = [("base", os.path.join(args.source, "kernels"))]
    for k, (name, old, new) in enumerate(MUTANTS):
        if header.count(old) != 1:
            raise Fail("mutant %d (%s): the header no longer has exactly one '%s'" % (k, name, old))
        d = os.path.join(args.work, "mut%d" % k)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "hpdl_conv.cuh"), "w") as f:
            f.write(header.replace(old, new))
        jobs.append(("mut%d" % k, d))
    with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        exes = list(pool.map(lambda j: b.program(j[0] + "/conv_emu", j[1]), jobs))
    for order, seed in ORDERS:
        rc, out = run(exes[0], "all", order, seed)
        if rc != 0:
            raise Fail("the unmutated header fails under %s:\n%s" % (label(order, seed), out))
    print("unmutated: every case passes under every order")
    missed = []
    for k, (name, _, _) in enumerate(MUTANTS):
        caught = None
        for order, seed in ORDERS:
            rc, out = run(exes[k + 1], "all", order, seed)
            if rc is None:
                raise Fail("mutant %d (%s) hung under %s" % (k, name, label(order, seed)))
            if rc != 0:
                fails = [l for l in out.split("\n") if "FAIL" in l or "hpdl_emu" in l]
                caught = "%s, exit %d%s" % (label(order, seed), rc, "; first failure: " + fails[0].strip()[:110]
                                            if fails else "")
                break
        print("mutant %2d %-62s %s" % (k, name, "caught under " + caught if caught else "NOT CAUGHT"))
        if not caught:
            missed.append(name)
    if missed:
        raise Fail("mutants not caught: " + "; ".join(missed))
    print("all %d mutants caught" % len(MUTANTS))


def case_nvrtc(args, arch):
    nvrtc_check(args, arch, "conv_emu.cu", KERNELS, SMEM_LIMIT, 20)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--source", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--cc", default="")
    ap.add_argument("--cflags", default="-O2")
    ap.add_argument("--warnings", default="")
    ap.add_argument("--cuda-home", default="")
    ap.add_argument("case", choices=["emu", "mutation", "sm_80", "sm_90"])
    args = ap.parse_args()
    try:
        if args.case == "emu":
            case_emu(args)
        elif args.case == "mutation":
            case_mutation(args)
        else:
            case_nvrtc(args, args.case)
    except Fail as e:
        print("FAIL: %s" % e)
        return 1
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
