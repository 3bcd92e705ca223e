"""e2e_common.py - helpers shared by the end-to-end test scripts (runtime/e2e.py,
compile/compile_e2e.py, extern/extern_e2e.py, runtime/profile_e2e.py, plan/compare_e2e.py,
plan/calibrate_e2e.py, moe/router_e2e.py): the failure type, running a tool and checking its exit status, the
MPI skip test, the metrics reader, and the scripts' common command line.

A script imports it with its own folder's parent on sys.path:
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
"""
import argparse
import atexit
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

SKIP = 77  # CTest's SKIP_RETURN_CODE for these tests


class Fail(Exception):
    pass


def check(cond, what):
    if not cond:
        raise Fail(what)


_session_base = []


def _mpirun_session_base():
    """An Open MPI session tree of this script's own for the mpiruns it starts
    itself (hpdlrun makes one for those it starts): Open MPI 4's shared tree
    races between mpiruns that start and end at once, as CTest's do."""
    if not _session_base:
        _session_base.append(tempfile.mkdtemp(prefix="hpdl-test-ompi-"))
        atexit.register(shutil.rmtree, _session_base[0], True)
    return _session_base[0]


def run(args, expect=0, env=None, cwd=None, timeout=300):
    """Run a command; with expect not None, its exit status must be expect (else its output goes to stderr)."""
    e = dict(os.environ)
    # mpirun refuses root without these; CTest sets them, a hand run may not
    e.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
    e.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    if os.path.basename(args[0]) == "mpirun":
        e.setdefault("OMPI_MCA_orte_tmpdir_base", _mpirun_session_base())
    if env:
        e.update(env)
    p = subprocess.run(args, capture_output=True, text=True, env=e, timeout=timeout, cwd=cwd)
    if expect is not None and p.returncode != expect:
        sys.stderr.write(f"$ {' '.join(args)}\n--- stdout\n{p.stdout}\n--- stderr\n{p.stderr}\n")
        raise Fail(f"exit status {p.returncode}, expected {expect}")
    return p


def need_mpi(bin_dir):
    """Exit with SKIP unless mpirun is installed and BIN_DIR's hpdlrun was built with MPI."""
    if shutil.which("mpirun") is None:
        print("skipped: mpirun not found (scripts/setup.sh installs Open MPI)")
        sys.exit(SKIP)
    if "collectives: mpi" not in run([os.path.join(bin_dir, "hpdlrun"), "--version"]).stdout:
        print("skipped: this hpdlrun was built without MPI")
        sys.exit(SKIP)


def tool_of(args, name):
    """A tool of the build under test: ARGS.bin/NAME."""
    return os.path.join(args.bin, name)


def work_of(args, name):
    """ARGS.work/NAME, made if missing (a case's scratch folder)."""
    d = os.path.join(args.work, name)
    os.makedirs(d, exist_ok=True)
    return d


def fresh_dir(work, name):
    """WORK/NAME, emptied (an artifact folder a case writes again)."""
    d = os.path.join(work, name)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(work, exist_ok=True)
    return d


def synthetic_data(bin_dir, work, tokens=100000):
    """The glob of hpdl-data's synthetic token shards under WORK/data (made once, seed 3)."""
    prefix = os.path.join(work, "data", "tiny")
    if not os.path.exists(prefix + "_train_000000.bin"):
        os.makedirs(os.path.dirname(prefix), exist_ok=True)
        run([os.path.join(bin_dir, "hpdl-data"), "--synthetic", str(tokens), "--seed", "3", "-o", prefix])
    return prefix + "_train_*.bin"


def in_file_order(art):
    """Sets the artifact's train.shuffle to false: the data in file order, which a test can count."""
    mf = os.path.join(art, "manifest.json")
    man = json.load(open(mf))
    man["train"]["shuffle"] = False
    json.dump(man, open(mf, "w"))


def safetensors_f32(path):
    """{name: list of floats} of the F32 tensors of a safetensors file (checkpoints)."""
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    head = json.loads(raw[8:8 + n])
    out = {}
    for k, v in head.items():
        if k == "__metadata__" or v["dtype"] != "F32":
            continue
        a, b = v["data_offsets"]
        out[k] = list(struct.unpack(f"<{(b - a) // 4}f", raw[8 + n + a:8 + n + b]))
    return out


def metrics(path):
    """hpdlrun --metrics's records, one JSON object a line."""
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def run_case(cases, name):
    """Runs cases[name]; prints "ok NAME" or "FAIL NAME: why" and returns the exit status (0 or 1)."""
    try:
        cases[name]()
    except Fail as e:
        print(f"FAIL {name}: {e}")
        return 1
    print(f"ok {name}")
    return 0


def case_args(cases, *more):
    """The command line of a script of cases: --bin, --source, --work (made absolute,
    --work created), the options named in `more` (each required), and the case."""
    ap = argparse.ArgumentParser()
    for name in ("--bin", *more, "--source", "--work"):
        ap.add_argument(name, required=True)
    ap.add_argument("case", choices=sorted(cases))
    args = ap.parse_args()
    args.work = os.path.abspath(args.work)
    args.bin = os.path.abspath(args.bin)
    args.source = os.path.abspath(args.source)
    os.makedirs(args.work, exist_ok=True)
    return args
