#!/usr/bin/env python3
"""extern_e2e.py - `extern` native ops through hpdlc compile and hpdlrun (CTest: extern.CASE).

    extern_e2e.py --bin BUILD/bin --dir BUILD/tests/extern --source REPO --work DIR [--update] CASE

--dir holds the test library (libhpdl_testops.so, from tests/extern/testops.c) and
ext_lm.hpd beside it (tests/extern.cmake puts them there). The model's MLP computes
gelu(x + b) with the native bias_gelu (-D mode=0) or with builtins (-D mode=1); the
two artifacts train on the same generated data from the same initial weights.

  one_rank  both models compiled (executor auto: generated kernels when the CPU back
            end is built) and trained 20 steps on one rank: every step's loss within
            1e-5 relative; the artifact carries its copy of the library (extern/) and
            the manifest lists it.
            HPDL_EXECUTOR=interp on the same artifact (the reference executor's libffi
            call) agrees too.
  tp2       the same at tensor parallelism 2 (2 ranks; the extern's arguments are
            gathered whole and every rank calls it), against the builtin model at tp=2
            and against one rank; and at pipeline parallelism 2 (the block graph with
            the extern split over two stages).
  moved     the artifact compiled in a scratch folder, which is then deleted (the
            source and its library gone), moved elsewhere: it still trains, with the
            same losses; with its copy of the library changed (one bit) or removed,
            hpdlrun fails with one message naming the file (exit 1) before loading it. A library named
            without a slash is not copied: found on LD_LIBRARY_PATH at run time.
  errors    hpdlc compile of tests/extern/errors/*.hpd (a library that does not load,
            a missing function or gradient function, a call whose shapes do not fit,
            a non-f32 argument; consent_*.hpd compiled without --allow-native): stderr
            equals NAME.err, exit status 1. --update rewrites the .err files (read the
            diff before committing). And hpdlrun refuses an artifact with an extern
            library unless given --allow-native.
Exit 0 pass, 1 fail, 77 skip (no mpirun for tp2).
"""
import argparse
import glob
import json
import os
import shutil
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import e2e_common  # noqa: E402
from e2e_common import Fail, check, metrics  # noqa: E402

STEPS = 20
ARGS = None


def run(args, expect=0, env=None, cwd=None):
    return e2e_common.run(args, expect, env, cwd, timeout=250)


def tool(name):
    return os.path.join(ARGS.bin, name)


def work(*parts):
    return os.path.join(ARGS.work, *parts)


def scratch(name):
    """A fresh folder holding the model and the library, as a user's project would."""
    d = work(name)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    for f in ("ext_lm.hpd", "libhpdl_testops.so"):
        shutil.copy(os.path.join(ARGS.dir, f), d)
    return d


def data():
    prefix = work("data", "tiny")
    if not os.path.exists(prefix + "_train_000000.bin"):
        os.makedirs(work("data"), exist_ok=True)
        run([tool("hpdl-data"), "--synthetic", "100000", "--seed", "3", "-o", prefix])
    return prefix + "_train_*.bin"


def compile_art(src_dir, out, mode, flags=()):
    shutil.rmtree(out, ignore_errors=True)
    run([tool("hpdlc"), "compile", "ext_lm.hpd", "-D", f"mode={mode}", "--allow-native", *flags, "-o", out], cwd=src_dir)
    return out


def train(art, tag, expect=0, env=None, native=True):
    m = work(tag + ".jsonl")
    if os.path.exists(m):
        os.remove(m)
    p = run([tool("hpdlrun"), art, "--data", data(), "--steps", str(STEPS), "--metrics", m, "--progress", "plain"]
            + (["--allow-native"] if native else []), expect=expect, env=env)
    losses = [r["loss"] for r in metrics(m)] if os.path.exists(m) else []
    return losses, p


def same_losses(name, got, want, tol=1e-5):
    check(len(got) == STEPS and len(want) == STEPS, f"{name}: {len(got)} and {len(want)} steps, not {STEPS}")
    worst = max(abs(a - b) / abs(b) for a, b in zip(got, want))
    print(f"{name}: loss {got[0]:.7f} -> {got[-1]:.7f} (other {want[0]:.7f} -> {want[-1]:.7f}), "
          f"worst step {worst:.1e} relative")
    check(worst <= tol, f"{name}: losses differ by {worst:.2e} relative")
    check(got[-1] < got[0], f"{name}: the loss did not fall")


def executor(art):
    return json.load(open(os.path.join(art, "manifest.json")))["program"]["executor"]


# ---- cases --------------------------------------------------------------------

def case_one_rank():
    d = scratch("one_rank")
    a = compile_art(d, work("one_rank", "art-extern"), 0)
    b = compile_art(d, work("one_rank", "art-builtin"), 1)
    man = json.load(open(os.path.join(a, "manifest.json")))
    ext = man["externs"]
    check(len(ext) == 1 and ext[0]["name"] == "bias_gelu" and ext[0]["file"] == "extern/libhpdl_testops.so",
          f"manifest externs: {ext}")
    check(os.path.isfile(os.path.join(a, "extern", "libhpdl_testops.so")), "the library was not copied into the artifact")
    check(json.load(open(os.path.join(b, "manifest.json")))["externs"] == [], "the builtin model lists externs")
    ga, _ = train(a, "one_rank-extern")
    gb, _ = train(b, "one_rank-builtin")
    same_losses(f"one_rank ({executor(a)})", ga, gb)
    gi, _ = train(a, "one_rank-interp", env={"HPDL_EXECUTOR": "interp"})
    same_losses("one_rank (HPDL_EXECUTOR=interp)", gi, gb)


def case_tp2():
    e2e_common.need_mpi(ARGS.bin)
    d = scratch("tp2")
    a = compile_art(d, work("tp2", "art-extern"), 0, ["--tp", "2", "--gpus-per-node", "2"])
    b = compile_art(d, work("tp2", "art-builtin"), 1, ["--tp", "2", "--gpus-per-node", "2"])
    one = compile_art(d, work("tp2", "art-one"), 0)
    ga, _ = train(a, "tp2-extern")
    gb, _ = train(b, "tp2-builtin")
    g1, _ = train(one, "tp2-one")
    same_losses(f"tp2 ({executor(a)}) against the builtin model at tp2", ga, gb)
    same_losses("tp2 against one rank", ga, g1)
    p = compile_art(d, work("tp2", "art-pp2"), 0, ["--pp", "2", "--gpus-per-node", "2"])
    gp, _ = train(p, "pp2-extern")
    same_losses(f"pp2 ({executor(p)}) against one rank", gp, g1)


def case_moved():
    d = scratch("moved-src")
    art = compile_art(d, os.path.join(d, "art"), 0)
    want, _ = train(art, "moved-before")
    dst = work("moved-elsewhere")
    shutil.rmtree(dst, ignore_errors=True)
    shutil.move(art, dst)
    shutil.rmtree(d)  # the source, its library and the old folder are gone
    got, _ = train(dst, "moved-after")
    same_losses("moved", got, want, tol=0)
    # the artifact's files are checked before anything is loaded: the library changed, then gone
    lib = os.path.join(dst, "extern", "libhpdl_testops.so")
    with open(lib, "r+b") as f:
        f.seek(100)
        b = f.read(1)
        f.seek(100)
        f.write(bytes([b[0] ^ 1]))
    _, p = train(dst, "moved-changed", expect=1)
    check(len(p.stderr.strip().splitlines()) == 1 and "extern/libhpdl_testops.so: corrupted: CRC-32C" in p.stderr and "the manifest recorded" in p.stderr,
          f"moved: unclear message with the library changed: {p.stderr}")
    print("moved: the library changed: " + p.stderr.strip())
    os.remove(lib)
    _, p = train(dst, "moved-nolib", expect=1)
    msg = p.stderr.strip().splitlines()
    check(len(msg) == 1 and "extern/libhpdl_testops.so: missing artifact file" in msg[0],
          f"moved: unclear message without the library: {p.stderr}")
    print("moved: without the library: " + msg[0])
    # a bare library name is refused, even where the dlopen search path has it: native
    # code only from paths relative to the file (docs/language.md, "Extern")
    d = scratch("bare")
    text = open(os.path.join(d, "ext_lm.hpd")).read().replace('"./libhpdl_testops.so"', '"libhpdl_testops.so"')
    open(os.path.join(d, "ext_lm.hpd"), "w").write(text)
    env = {"LD_LIBRARY_PATH": d + os.pathsep + os.environ.get("LD_LIBRARY_PATH", "")}
    art = work("bare", "art")
    p = run([tool("hpdlc"), "compile", "ext_lm.hpd", "--allow-native", "-o", art], cwd=d, env=env, expect=1)
    check('library "libhpdl_testops.so" is a bare name' in p.stderr and not os.path.exists(os.path.join(art, "manifest.json")),
          f"a bare library name: {p.stderr}")
    print("moved: a bare name: " + p.stderr.strip().splitlines()[0])


def case_errors():
    files = sorted(glob.glob(os.path.join(ARGS.source, "tests", "extern", "errors", "*.hpd")))
    check(len(files) >= 5, "no error cases found")
    d = work("errors")
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    shutil.copy(os.path.join(ARGS.dir, "libhpdl_testops.so"), d)
    bad = 0
    for f in files:
        name = os.path.basename(f)
        shutil.copy(f, d)
        # consent_*.hpd: compiled without --allow-native
        consent = [] if name.startswith("consent_") else ["--allow-native"]
        p = run([tool("hpdlc"), "compile", name, *consent, "-o", "art"], expect=None, cwd=d)
        golden = f[:-4] + ".err"
        if ARGS.update:
            open(golden, "w").write(p.stderr)
            print(f"updated {golden} (exit {p.returncode})")
            continue
        want = open(golden).read() if os.path.exists(golden) else None
        if p.returncode != 1 or p.stderr != want:
            bad += 1
            sys.stderr.write(f"{name}: exit {p.returncode} (want 1)\n--- got\n{p.stderr}--- want\n{want}\n")
        check(not os.path.exists(os.path.join(d, "art", "manifest.json")), f"{name}: an artifact was written")
    check(bad == 0, f"{bad} of {len(files)} error cases differ from their golden text")
    if not ARGS.update:  # hpdlrun refuses an artifact with extern libraries without --allow-native
        src = scratch("consent")
        art = compile_art(src, work("consent", "art"), 0)
        _, p = train(art, "consent", expect=1, native=False)
        check(len(p.stderr.strip().splitlines()) == 1 and "the artifact calls native code of its own (extern bias_gelu in "
              "extern/libhpdl_testops.so)" in p.stderr and "only with --allow-native" in p.stderr,
              f"hpdlrun without --allow-native: {p.stderr}")
        print("errors: hpdlrun without --allow-native: " + p.stderr.strip())
    if not ARGS.update:
        print(f"errors: {len(files)} cases match their golden text")


def main():
    global ARGS
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--dir", required=True)
    ap.add_argument("--source", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--update", action="store_true")
    ap.add_argument("case")
    ARGS = ap.parse_args()
    os.makedirs(ARGS.work, exist_ok=True)
    cases = {"one_rank": case_one_rank, "tp2": case_tp2, "moved": case_moved, "errors": case_errors}
    if ARGS.case not in cases:
        print(f"unknown case {ARGS.case}")
        return 2
    try:
        cases[ARGS.case]()
    except Fail as e:
        print(f"FAIL: {e}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
