#!/usr/bin/env python3
"""attention_emu.py - kernels/hpdl_attention.cuh, attention forward and backward
(CTest: cuda.attention.CASE, tests/cuda_attention.cmake).

    attention_emu.py --source REPO --work DIR --cc CC --cflags FLAGS --warnings FLAGS
                     [--cuda-home DIR] CASE

  emu         tests/cuda/attention_emu.cpp (with the kernels of attention_emu.cu) compiled
              at test time as tests/cuda_emu/run_emu.py compiles kernels (the system C++
              compiler, -x c++, kernels/cuda_emu.h forced in, UBSan's alignment and bounds
              checks where they link) and run under HPDL_EMU_ORDER forward, reverse and
              random (two seeds): every case within tolerance of the fp64 reference, and
              every order bit for bit the same (the program's digests). Then
              kernels/hpdl_attention_cfg.h from plain C11 (CC, the build's flags and the
              project's warnings): its launch rule the same as C++ sees it.
  mutation    the header with one deliberate slip at a time: each barrier of the three tile
              loops removed in turn (forward, dkdv, dq: the block-wide ones around the tile
              loads and the warp-wide P / dS handoff), and two slips of the causal tile skip;
              the program's multi-tile cases must fail under some order for each.
  sm_80, sm_90  attention_emu.cu (the rule's instantiations: D x Dv = 64 x 64, 128 x 128,
              128 x 64, 3 x 3, 200 x 200, 1 x 256) through NVRTC, as hpdlc compiles generated
              code (--ptxas-options=-v): no warning, no spill, no stack frame, at most 48 KB
              of shared memory a kernel; registers printed.

Exit 0 pass, 1 fail, 77 skip (no C++ compiler; no NVRTC for sm_XX).
"""
import argparse
import concurrent.futures
import ctypes
import glob
import os
import re
import shlex
import shutil
import sys

SKIP = 77
HERE = os.path.dirname(os.path.abspath(__file__))
RUN_TIMEOUT = 300

# The harness's own test driver: its compiler search, orders, subprocess runner and
# failure type (one copy of each).
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "cuda_emu"))
from run_emu import ORDERS, Emu, Fail, compile_checked, label, run_ordered, sh  # noqa: E402

# The kernels of each rule instantiation in attention_emu.cu (the NVRTC build leaves out the
# emulation-only small tiles).
RULE_CONFIGS = ["d64", "d128", "d128v64", "d3", "d200", "d1v256", "tc64", "tc16v40", "tc24v16", "h64bf", "h64f16", "h64bfs",
                "h16v40bf", "h24v16f16", "h128bfs", "h128f16s", "h72v112bf"]
KINDS = ["fwd", "dt", "dkdv", "dq"]
SMEM_LIMIT = 49152


class Build:
    """Compiles the emulated test program against a header folder (kernels/, or a mutant's)."""

    def __init__(self, args, sanitize=True, opt="-O2", defines=()):
        self.args = args
        self.defines = list(defines)
        emu = Emu(args)
        emu.usable()  # skips (77) or fails without a working C++ compiler; adds UBSan when it links
        self.cxx = emu.cxx
        # -Wno-unused-function: hpdl_cuda.cuh's helpers are static, and this program uses few
        flags = [f if f != "-O2" else opt for f in emu.flags] + ["-Wno-unused-function"]
        self.flags = [f for f in flags if sanitize or not f.startswith("-fsanitize") and
                      not f.startswith("-fno-sanitize")]

    def program(self, name, header_dir):
        exe = os.path.join(self.args.work, name)
        os.makedirs(os.path.dirname(exe), exist_ok=True)
        kernels = os.path.join(self.args.source, "kernels")
        compile_checked([*self.cxx, *self.flags, *self.defines, "-include", os.path.join(kernels, "cuda_emu.h"), "-I", header_dir,
                         "-I", kernels, "-x", "c++", os.path.join(HERE, "attention_emu.cpp"), "-lpthread", "-lm",
                         "-o", exe])
        return exe


def run(exe, what, order, seed):
    return run_ordered([exe, what], order, seed, RUN_TIMEOUT)


def digests(out):
    return [l for l in out.split("\n") if l.startswith("digest ")]


CFG_C11 = r"""/* written by tests/cuda/attention_emu.py: kernels/hpdl_attention_cfg.h from plain C11 */
#include <stdio.h>

#include "hpdl_attention_cfg.h"

int main(void) {
  static const int sizes[][2] = {{1, 1}, {3, 3}, {64, 64}, {65, 64}, {128, 64}, {128, 128}, {129, 1}, {1, 256},
                                 {200, 200}, {256, 256}};
  hpdl_attn_launch L = {0};
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    int rc = hpdl_attn_plan(sizes[i][0], sizes[i][1], 3, 6, 2, 1000, 777, &L);
    printf("cfg %d %d: rc %d threads %d fwd %dx%d dkdv %dx%d dq %dx%d grids %lld %lld %lld %lld scratch %lld\n",
           sizes[i][0], sizes[i][1], rc, L.threads, L.fwd_bq, L.fwd_bk, L.dkdv_bq, L.dkdv_bk, L.dq_bq, L.dq_bk,
           L.grid_fwd, L.grid_dt, L.grid_dkdv, L.grid_dq, L.scratch_floats);
  }
  printf("cfg refused: %d %d %d %d\n", hpdl_attn_plan(0, 64, 1, 1, 1, 1, 1, &L),
         hpdl_attn_plan(64, 257, 1, 1, 1, 1, 1, &L), hpdl_attn_plan(64, 64, 1, 6, 4, 1, 1, &L),
         hpdl_attn_plan(64, 64, 1, 1, 1, 1LL << 40, 1, &L));
  /* the macros are constant expressions in C too (an array size; -Wvla would say otherwise) */
  static const char tiles[HPDL_ATTN_FWD_BQ(64, 64) * HPDL_ATTN_DQ_BK(128, 128)];
  return sizeof tiles > 0 ? 0 : 1;
}
"""


def case_emu(args):
    b = Build(args)
    print("C++: %s %s" % (" ".join(b.cxx), " ".join(b.flags)))
    exe = b.program("attention_emu", os.path.join(args.source, "kernels"))
    failed, first = [], None
    for order, seed in ORDERS:
        rc, out = run(exe, "all", order, seed)
        lab = label(order, seed)
        print("=== all, HPDL_EMU_ORDER=%s: %s" % (lab, "timed out" if rc is None else "exit %d" % rc))
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
    src = os.path.join(args.work, "cfg_c11.c")
    with open(src, "w") as f:
        f.write(CFG_C11)
    cc = shlex.split(args.cc) if args.cc else [shutil.which("cc") or "cc"]
    cexe = os.path.join(args.work, "cfg_c11")
    cmd = [*cc, "-std=c11", *shlex.split(args.cflags), *shlex.split(args.warnings), "-Werror", "-I",
           os.path.join(args.source, "kernels"), src, "-o", cexe]
    rc, out = sh(cmd, 300)
    if rc != 0 or out.strip():
        raise Fail("hpdl_attention_cfg.h from C11 %s: %s\n%s" % ("failed" if rc else "warned", " ".join(cmd), out))
    rc, c_out = sh([cexe], 60)
    rc2, cxx_out = sh([exe, "cfg"], 60)
    if rc != 0 or rc2 != 0 or c_out != cxx_out:
        raise Fail("the launch rule differs between C11 (exit %s) and C++ (exit %s):\nC11:\n%sC++:\n%s" %
                   (rc, rc2, c_out, cxx_out))
    print("launch rule, the same from C11 (%s) and C++:\n%s" % (" ".join(cc), c_out.rstrip()))


def barrier(what):
    kernel, why = re.match(r".*/\* (\w+): (.*?)(?: \(.*)? \*/$", what).groups()
    return ("%s: the barrier '%s' removed" % (kernel, why), what, "/* removed by the mutation test */")


# (name, text in the header, its replacement): every barrier of the three tile loops, and
# the causal tile skip's bounds
MUTANTS = [
    barrier("__syncthreads(); /* fwd: the previous tile's Ks, Vs, Ps are read */"),
    barrier("__syncthreads(); /* fwd: the tile is loaded */"),
    barrier("__syncwarp(0xffffffffu); /* fwd: the row's P is written (its lanes are in this warp) */"),
    barrier("__syncthreads(); /* dkdv: the previous tile's Qs, Gs, Ls, Ds, Rp are read */"),
    barrier("__syncthreads(); /* dkdv: the tile is loaded */"),
    barrier("__syncwarp(0xffffffffu); /* dkdv: key j's P and dS are written (its lanes are in this warp) */"),
    barrier("__syncthreads(); /* dq: the previous tile's Ks, Vs, Cp are read */"),
    barrier("__syncthreads(); /* dq: the tile is loaded */"),
    barrier("__syncwarp(0xffffffffu); /* dq: the row's dS is written (its lanes are in this warp) */"),
    ("the key tile skip off by one (a tile with one allowed pair skipped)",
     "return hpdl_attn_colpos_min(j0, j0 + nk, Sc, col_rank, col_size) > rmax;",
     "return hpdl_attn_colpos_min(j0, j0 + nk, Sc, col_rank, col_size) >= rmax;"),
    ("tile skip: the ring's blocks taken as one increasing run",
     "for (int j = j0; j < j1; j += len - j % len) {", "for (int j = j0; j < j1; j = j1 + 0 * len) {"),
    ("the window's key tile skip one key short (a tile with an allowed pair skipped)",
     "rmin - hpdl_attn_colpos_max(j0, j0 + nk, Sc, col_rank, col_size) >= window) return true;",
     "rmin - hpdl_attn_colpos_max(j0, j0 + nk, Sc, col_rank, col_size) >= window - 1) return true;"),
    barrier("__syncthreads(); /* fwd_tc: the previous tile's Ks, Vs, Cp are read */"),
    barrier("__syncthreads(); /* fwd_tc: the tile is loaded */"),
    barrier("__syncthreads(); /* dkdv_tc: the previous tile's Qs, Gs, Ls, Ds, Rp are read */"),
    barrier("__syncthreads(); /* dkdv_tc: the tile is loaded */"),
    barrier("__syncthreads(); /* dq_tc: the previous tile's Ks, Vs, Cp are read */"),
    barrier("__syncthreads(); /* dq_tc: the tile is loaded */"),
    ("tensor cores: the P fragment's k order not the accumulators' (2t, 2t + 1 as t, t + 4)",
     "const float a[4] = {p[js][0], p[js][2], p[js][1], p[js][3]};",
     "const float a[4] = {p[js][0], p[js][1], p[js][2], p[js][3]};"),
    ("tensor cores: 3xTF32 without its small terms (TF32 where fp32 is asked for)",
     "    hpdl_mma_tf32(c, al, bh);\n    hpdl_mma_tf32(c, ah, bl);\n", "    (void)al;\n    (void)bl;\n"),
    ("dkdv_tc: a warp's tile skip off by one (a tile with one allowed pair skipped)",
     "hpdl_attn_rowpos_max(t0, t0 + nrows, T, row_rank, row_size) < wkmin)",
     "hpdl_attn_rowpos_max(t0, t0 + nrows, T, row_rank, row_size) <= wkmin)"),
    barrier("__syncthreads(); /* key_tiles: the tile's Ks, Vs, Cp are read */"),
    ("key tiles (fwd_h, dq_h): cp.async, the tile computed before its copies landed (wait_group NB, not NB - 1)",
     "hpdl_attn_cp_wait<NB - 1>(); /* key_tiles: this tile's copies", "hpdl_attn_cp_wait<NB>(); /* key_tiles: this tile's copies"),
    ("key tiles (fwd_h, dq_h): cp.async, the next tile copied into the buffer being computed",
     "if (NB == 2 && async && jn < S) load(b ^ 1, jn, true);", "if (NB == 2 && async && jn < S) load(b, jn, true);"),
    ("key tiles, one buffer (heads over 64): the tile computed before its copies landed",
     "hpdl_attn_cp_wait<NB - 1>(); /* key_tiles: this tile's copies", "hpdl_attn_cp_wait<1>(); /* key_tiles: this tile's copies"),
    barrier("__syncthreads(); /* key_tiles: the tile is loaded */"),
    barrier("__syncthreads(); /* dkdv_h: the previous tile's Qs, Gs, Ls, Ds, Rp are read */"),
    barrier("__syncthreads(); /* dkdv_h: the tile is loaded */"),
    ("16-bit tensor cores: a P fragment's two keys packed the wrong way round",
     "{hpdl_attn_pack<E>(p[2 * js][0], p[2 * js][1]),", "{hpdl_attn_pack<E>(p[2 * js][1], p[2 * js][0]),"),
    ("16-bit tensor cores: the B fragments' second matrix at k + 0, not k + 8 (ldmatrix rows)",
     "hpdl_attn_ldsm<0, 4>(b, &X[8 * n + (lane & 7) + 8 * (lane >> 4)][k0 + 8 * ((lane >> 3) & 1)]);",
     "hpdl_attn_ldsm<0, 4>(b, &X[8 * n + (lane & 7) + 8 * (lane >> 4)][k0]);"),
    ("16-bit tensor cores: P v's B fragments read untransposed (ldmatrix without .trans)",
     "hpdl_attn_ldsm<1, 4>(b, row + 8 * n + 8 * (lane >> 4));", "hpdl_attn_ldsm<0, 4>(b, row + 8 * n + 8 * (lane >> 4));"),
    ("16-bit tensor cores: the A fragment's rows 8 .. 15 from rows 0 .. 7 (ldmatrix rows)",
     "hpdl_attn_ldsm<0, 4>(a, &X[r0 + (lane & 15)][16 * kk + 8 * (lane >> 4)]);",
     "hpdl_attn_ldsm<0, 4>(a, &X[r0 + (lane & 7)][16 * kk + 8 * (lane >> 4)]);"),
    ("dkdv_h: a warp's tile skip off by one (a tile with one allowed pair skipped)",
     "wkmin > hpdl_attn_rowpos_max(t0, t0 + nrows, T, row_rank, row_size)",
     "wkmin >= hpdl_attn_rowpos_max(t0, t0 + nrows, T, row_rank, row_size)"),
    ("the window one key wider than asked",
     "return cp <= rp && (window <= 0 || rp - cp < window);", "return cp <= rp && (window <= 0 || rp - cp <= window);"),
]


def case_mutation(args):
    # a build a mutant: no UBSan, -O1 and only the configurations of the multi-tile cases
    # (ATTN_EMU_FEW); a slip shows in the values, not as undefined behaviour
    b = Build(args, sanitize=False, opt="-O1", defines=["-DATTN_EMU_FEW"])
    header = open(os.path.join(args.source, "kernels", "hpdl_attention.cuh")).read()
    jobs = [("base", os.path.join(args.source, "kernels"))]
    for k, (name, old, new) in enumerate(MUTANTS):
        if header.count(old) != 1:
            raise Fail("mutant %d (%s): the header no longer has exactly one '%s'" % (k, name, old))
        d = os.path.join(args.work, "mut%d" % k)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "hpdl_attention.cuh"), "w") as f:
            f.write(header.replace(old, new))
        jobs.append(("mut%d" % k, d))
    with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        exes = list(pool.map(lambda j: b.program(j[0] + "/attention_emu", j[1]), jobs))
    for order, seed in ORDERS:
        rc, out = run(exes[0], "mutation", order, seed)
        if rc != 0:
            raise Fail("the unmutated header fails the mutation cases under %s:\n%s" % (label(order, seed), out))
    print("unmutated: the multi-tile cases pass under every order")
    missed = []
    for k, (name, _, _) in enumerate(MUTANTS):
        caught = None
        for order, seed in ORDERS:
            rc, out = run(exes[k + 1], "mutation", order, seed)
            if rc is None:
                raise Fail("mutant %d (%s) hung under %s" % (k, name, label(order, seed)))
            if rc != 0:
                fails = [l for l in out.split("\n") if "FAIL" in l or "hpdl_emu" in l]
                caught = "%s, exit %d%s" % (label(order, seed), rc, "; first failure: " + fails[0].strip()[:110]
                                            if fails else "")
                break
        print("mutant %2d %-60s %s" % (k, name, "caught under " + caught if caught else "NOT CAUGHT"))
        if not caught:
            missed.append(name)
    if missed:
        raise Fail("mutants not caught: " + "; ".join(missed))
    print("all %d mutants caught" % len(MUTANTS))


def find_nvrtc(home):
    libs = sorted(glob.glob(os.path.join(home, "lib64", "libnvrtc.so*")) +
                  glob.glob(os.path.join(home, "lib", "libnvrtc.so*")))
    libs = [l for l in libs if "builtins" not in l and ".alt." not in l]
    return libs[0] if libs else None


def nvrtc_check(args, arch, src_name, want, smem_limit, width=18, cubin=None):
    """NVRTC compiles tests/cuda/SRC_NAME (the kernels' header folder on the include path) for arch
    as compiler/codegen/cudacc.c compiles generated code, with ptxas -v: no warning, a cubin, and
    for each kernel of `want` no spill, no stack frame and at most smem_limit bytes of static
    shared memory, each printed with its registers. Exits 77 without an NVRTC; cubin: a path to
    keep the cubin at. Shared by attention_emu.py and conv_emu.py."""
    home = args.cuda_home or os.environ.get("CUDA_HOME") or ""
    if not home:
        nvcc = shutil.which("nvcc")
        home = os.path.dirname(os.path.dirname(nvcc)) if nvcc else ""
    lib = find_nvrtc(home) if home else None
    if not lib:
        print("skipped: no CUDA toolkit with NVRTC (libnvrtc.so) found%s; set CUDA_HOME or HPDL_CUDA_HOME" %
              (" under " + home if home else ""))
        sys.exit(SKIP)
    os.makedirs(args.work, exist_ok=True)
    nvrtc = ctypes.CDLL(lib)
    src = os.path.join(HERE, src_name)
    # as compiler/codegen/cudacc.c compiles generated code: the architecture, C++17, ptxas -v;
    # the headers' folder on the include path, as hpdlc copies the headers beside the .cu
    opts = [("--gpu-architecture=" + arch).encode(), b"--std=c++17", b"--ptxas-options=-v",
            ("--include-path=" + os.path.join(args.source, "kernels")).encode()]
    prog = ctypes.c_void_p()
    if nvrtc.nvrtcCreateProgram(ctypes.byref(prog), open(src, "rb").read(), src_name.encode(), 0, None, None):
        raise Fail("nvrtcCreateProgram failed")
    arr = (ctypes.c_char_p * len(opts))(*opts)
    rc = nvrtc.nvrtcCompileProgram(prog, len(opts), arr)
    size = ctypes.c_size_t()
    nvrtc.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    buf = ctypes.create_string_buffer(size.value)
    nvrtc.nvrtcGetProgramLog(prog, buf)
    log = buf.value.decode(errors="replace")
    elf = b""
    if rc == 0:
        n = ctypes.c_size_t()
        if nvrtc.nvrtcGetCUBINSize(prog, ctypes.byref(n)) == 0 and n.value:
            code = ctypes.create_string_buffer(n.value)
            nvrtc.nvrtcGetCUBIN(prog, code)
            elf = code.raw[:4]
            if cubin:
                with open(cubin, "wb") as f:
                    f.write(code.raw)
    nvrtc.nvrtcDestroyProgram(ctypes.byref(prog))
    print("NVRTC (%s) %s: %s" % (os.path.basename(lib), " ".join(o.decode() for o in opts),
                                 "ok, cubin" if rc == 0 and elf == b"\x7fELF" else "FAILED"))
    if rc != 0 or elf != b"\x7fELF":
        raise Fail("NVRTC failed or gave no cubin:\n%s" % log)
    other = [l for l in log.split("\n") if l.strip() and not l.startswith("ptxas")]
    if other:
        raise Fail("NVRTC warned:\n%s" % log)
    kernels, cur = {}, None
    for line in log.split("\n"):
        m = re.search(r"Function properties for (\w+)", line) or re.search(r"Compiling entry function '(\w+)'", line)
        if m:
            cur = kernels.setdefault(m.group(1), {})
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m and cur is not None:
            cur["stack"], cur["spill_st"], cur["spill_ld"] = (int(x) for x in m.groups())
        m = re.search(r"Used (\d+) registers", line)
        if m and cur is not None:
            cur["regs"] = int(m.group(1))
            s = re.search(r"(\d+) bytes smem", line)
            cur["smem"] = int(s.group(1)) if s else 0
    missing = [k for k in want if k not in kernels]
    if missing:
        raise Fail("ptxas reported no %s:\n%s" % (", ".join(missing), log))
    bad = []
    for name in want:
        r = kernels[name]
        print("%s %-*s %3d registers, %5d bytes smem, %d bytes stack, %d / %d bytes spill stores / loads" %
              (arch, width, name, r.get("regs", -1), r.get("smem", -1), r.get("stack", -1), r.get("spill_st", -1),
               r.get("spill_ld", -1)))
        if r.get("spill_st") != 0 or r.get("spill_ld") != 0 or r.get("stack") != 0 or "regs" not in r:
            bad.append(name + " spills or has a stack frame")
        if r.get("smem", smem_limit + 1) > smem_limit:
            bad.append(name + " has over %d KB of static shared memory" % (smem_limit // 1024))
    if bad:
        raise Fail("%s:\n%s" % ("; ".join(bad), log))


def case_nvrtc(args, arch):
    want = ["attn_%s_%s" % (k, c) for c in RULE_CONFIGS for k in KINDS]
    nvrtc_check(args, arch, "attention_emu.cu", want, SMEM_LIMIT, 18,
                os.path.join(args.work, "attention_emu.%s.cubin" % arch))


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
