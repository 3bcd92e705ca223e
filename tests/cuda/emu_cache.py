#!/usr/bin/env python3
"""emu_cache.py - the emulation library's cache (CTest: cuda.emu_cache).

`hpdlc compile --target cuda --emulate` compiles each stage's kernels as C++
(seconds a stage) and keeps the library in $HPDL_CACHE/emu/ (beside NVRTC's
entries, under one size limit), keyed by the
compiler, its flags, the kernels folder and the stage's source. Checks, on a
fresh cache:
  1. a first compile builds the library and stores it (one entry, the same
     bytes as the artifact's stage0.emu.so);
  2. another layout with the same stage source (dp 2) takes it from the cache,
     byte for byte;
  3. a changed kernels folder (a comment added to cuda_emu.h) builds again;
  4. a damaged entry is built again and replaced, never shipped;
  5. at HPDL_CACHE_SIZE a store trims the cache to 80% of it, the least
     recently used entries first, and leaves alone what is not an entry.
Exits 77 (CTest's skip) when NVRTC cannot be loaded (the compile needs it).

usage: emu_cache.py --hpdlc BIN --sample FILE --kernels DIR
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hpdlc", required=True)
    ap.add_argument("--sample", required=True)
    ap.add_argument("--kernels", required=True)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cache = os.path.join(tmp, "cache")
        emu = os.path.join(cache, "emu")

        def compile_once(name, extra, kernels=None, env_more=None):
            env = dict(os.environ, HPDL_CACHE=cache, **(env_more or {}))
            if kernels:
                env["HPDL_KERNELS_DIR"] = kernels
            out = os.path.join(tmp, name)
            cmd = [a.hpdlc, "compile", a.sample, "--target", "cuda", "--emulate", "-v", "--micro-batch", "64", "-o", out,
                   *extra]
            p = subprocess.run(cmd, capture_output=True, text=True, env=env)
            if "NVRTC not found" in p.stderr:
                print("skipped: " + p.stderr.strip().splitlines()[-1])
                sys.exit(77)
            if p.returncode:
                fail(f"{' '.join(cmd)} exited {p.returncode}:\n{p.stderr}")
            said = [l.strip() for l in p.stderr.splitlines() if "emulation library" in l]
            if len(said) != 1:
                fail(f"{name}: expected one 'emulation library' line in -v, got {said}")
            with open(os.path.join(out, "stage0.emu.so"), "rb") as f:
                return said[0], f.read()

        def entries():
            return sorted(os.listdir(emu)) if os.path.isdir(emu) else []

        said, first = compile_once("one", ["--global-batch", "64"])
        if "C++ compile" not in said:
            fail(f"a fresh cache: {said!r}, not a C++ compile")
        if len(entries()) != 1:
            fail(f"a fresh cache after one compile holds {entries()}, not one library")
        entry = os.path.join(emu, entries()[0])
        if open(entry, "rb").read() != first:
            fail("the cached library differs from the artifact's stage0.emu.so")
        print(f"1. built and stored: {said}")

        said, second = compile_once("dp2", ["--global-batch", "128", "--dp", "2"])
        if "from the cache" not in said or second != first or len(entries()) != 1:
            fail(f"dp 2, the same stage source: {said!r}, {len(entries())} entries, "
                 f"{'the same' if second == first else 'other'} bytes")
        print(f"2. another layout of the same source: {said}")

        kdir = os.path.join(tmp, "kernels")
        shutil.copytree(a.kernels, kdir)
        with open(os.path.join(kdir, "cuda_emu.h"), "a") as f:
            f.write("\n/* a changed header: another key */\n")
        said, third = compile_once("edited", ["--global-batch", "64"], kernels=kdir)
        if "C++ compile" not in said or len(entries()) != 2:
            fail(f"a changed kernels folder: {said!r} with {len(entries())} entries (expected a build and 2)")
        print(f"3. a changed kernels folder: {said}")

        with open(entry, "wb") as f:
            f.write(b"damaged on disk")
        said, fourth = compile_once("damaged", ["--global-batch", "64"])
        if "C++ compile" not in said or fourth[:4] != b"\x7fELF":
            fail(f"a damaged entry: {said!r}, the artifact's library starts {fourth[:4]!r}")
        if open(entry, "rb").read() != fourth:
            fail("the damaged entry was not replaced by the new build")
        print(f"4. a damaged entry: {said}, replaced")

        # 5. the size limit: another model's stage stored into a cache already at its limit
        # (NVRTC's entry, then the emulation's: each store that passes the limit trims to 80%
        # of it) leaves the cache within it, the least recently used entries gone (the
        # first compile's, untouched since step 2; the damaged one's replacement, used last,
        # stays), and the files of the folder that are not entries untouched
        # two more models' stages, so that the limit below is met by dropping some of the
        # older entries, not all of them (an artifact folder of its own per compile no
        # longer means an NVRTC entry of its own: the cache keys headers by content)
        for h in (48, 80):
            compile_once(f"hidden{h}", ["--global-batch", "64", "-D", f"hidden={h}"])

        def cache_files():
            return {os.path.join(r, f): os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(cache) for f in fs}
        with open(os.path.join(cache, "notes.txt"), "w") as f:
            f.write("not an entry: the trim leaves it\n")
        with open(os.path.join(emu, "README"), "w") as f:
            f.write("not an entry either\n")
        import time
        time.sleep(0.05)
        os.utime(entry)  # the damaged entry's replacement: used most recently of the old ones
        before = cache_files()
        entries = {p: n for p, n in before.items() if p.endswith((".so", ".hnvc"))}
        limit = sum(entries.values()) + 1
        oldest = min((os.path.getmtime(p), p) for p in entries)[1]
        said, _ = compile_once("limited", ["--global-batch", "64", "-D", "hidden=96"], env_more={"HPDL_CACHE_SIZE": str(limit)})
        after = cache_files()
        kept = sum(n for p, n in after.items() if p.endswith((".so", ".hnvc")))
        if "C++ compile" not in said or kept > limit:
            fail(f"a cache at its limit of {limit} bytes: {said!r}, {kept} bytes of entries after the store")
        if oldest in after or entry not in after:
            fail(f"the trim's order: the oldest entry {'kept' if oldest in after else 'gone'}, "
                 f"the most recently used {'kept' if entry in after else 'gone'} "
                 f"(entries before, bytes by age: {sorted((os.path.getmtime(p) if p in after else 0, n) for p, n in entries.items())}; "
                 f"after: {sorted(n for p, n in after.items() if p.endswith(('.so', '.hnvc')))})")
        if not os.path.exists(os.path.join(cache, "notes.txt")) or not os.path.exists(os.path.join(emu, "README")):
            fail("the trim removed files that are not cache entries")
        gone = len([p for p in entries if p not in after])
        print(f"5. a limit of {limit} bytes: {gone} of {len(entries)} older entries removed, {kept} bytes of entries kept")
        print("ok")


if __name__ == "__main__":
    main()
