#!/usr/bin/env python3
"""gpu_tests.py - the suite's GPU tests (CTest's cuda.gpu.*, cuda.run.cuda.*,
cuda.layout.cuda.*, which skip where there is no GPU) taken to a GPU machine
that has none of this project's build dependencies (bench/gpu_bundle.sh's
tools: no LLVM, so no CPU target there).

  gpu_tests.py prepare --build BUILD --bundle BUNDLE [-j N] [--regex R]
      here, beside a full build: reads BUILD's tests (ctest --show-only), runs
      the CPU half of each run_device.py test (--cpu-only), writing its
      metrics to BUNDLE/cpu-metrics/NAME.jsonl, and writes the list of tests
      with their commands made relative to the checkout and the bundle
      (BUNDLE/gpu_tests.json).
  gpu_tests.py run --bundle BUNDLE [-j N] [--deadline S] [--logs DIR] [--regex R]
      there: each listed test, N at a time (the ranks of all of them share
      the GPUs), its device half against the CPU metrics; one line a test
      (PASS / FAIL / SKIP, seconds, its last line), a failure's log's tail;
      tests not started by the deadline are listed as not run. Exits with
      the number of failures. --device emulate rehearses the list where
      there is no GPU (the bundle's tools built with --emulate's support).

Tests that need the CPU back end on the GPU machine (a half resumed by the
CPU artifact, device_memory.py's several runs, run_conv.py's images) are
listed as left out, with why."""
import argparse
import concurrent.futures
import json
import os
import re
import shlex
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SELECT = r"^cuda\.(gpu\.|run\.cuda\.|layout\.cuda\.)"


def prop(test, name, default=None):
    for p in test.get("properties", []):
        if p["name"] == name:
            return p["value"]
    return default


def relative(word, build, bundle_bins):
    """A command word with the checkout's and the build's paths as @ROOT@ and @BUNDLE@."""
    for tool in bundle_bins:
        for where in (f"{build}/bin/{tool}", f"{build}/tests/{tool}"):
            if word == where:
                return f"@BUNDLE@/bin/{tool}"
    if word == f"{build}/tests/cuda-artifacts":  # the tests' shared artifacts: one folder a machine
        return "/tmp/hpdl-cuda-artifacts"
    if word.startswith(f"{build}/tests/extern/"):
        return "@BUNDLE@/extern/" + word[len(f"{build}/tests/extern/"):]
    if word.startswith(build + "/"):
        return None  # something of the build the bundle does not carry
    word = word.replace(ROOT + "/", "@ROOT@/")
    return word


def prepare(a):
    build = os.path.realpath(a.build)
    bundle = os.path.realpath(a.bundle)
    shown = subprocess.run(["ctest", "--show-only=json-v1"], cwd=build, stdout=subprocess.PIPE, text=True, check=True)
    tests = [t for t in json.loads(shown.stdout)["tests"] if re.search(SELECT, t["name"]) and re.search(a.regex, t["name"])]
    bins = ("hpdlc", "hpdlrun", "hpdl-data", "test_device")
    listed, left, cpu_jobs = [], [], []
    os.makedirs(f"{bundle}/cpu-metrics", exist_ok=True)
    for t in tests:
        cmd = t["command"]
        script = os.path.basename(cmd[1]) if len(cmd) > 1 else ""
        if script in ("run_conv.py", "device_memory.py"):
            left.append({"name": t["name"], "why": f"{script} runs the CPU target beside the device (no CPU back end there)"})
            continue
        if script == "run_device.py" and "--halves" in cmd and "cpu" in cmd[cmd.index("--halves") + 1]:
            left.append({"name": t["name"], "why": "a half on the CPU artifact (no CPU back end there)"})
            continue
        argv = [relative(w, build, bins) for w in cmd]
        if None in argv:
            left.append({"name": t["name"], "why": f"uses {cmd[argv.index(None)]}, which the bundle does not carry"})
            continue
        if argv[0].endswith("python3") or os.path.basename(argv[0]).startswith("python"):
            argv[0] = "python3"
        env = [e for e in prop(t, "ENVIRONMENT", []) if not e.startswith(("ASAN_", "LSAN_", "UBSAN_"))]
        entry = {"name": t["name"], "argv": argv, "env": [relative(e, build, bins) or e for e in env],
                 "timeout": prop(t, "TIMEOUT", 600)}
        if script == "run_device.py":
            metrics = f"{bundle}/cpu-metrics/{t['name']}.jsonl"
            entry["cpu_metrics"] = f"@BUNDLE@/cpu-metrics/{t['name']}.jsonl"
            cpu = [sys.executable, *cmd[1:], "--cpu-only", "--cpu-metrics", metrics]
            if not os.path.exists(metrics) or os.path.getsize(metrics) == 0:
                cpu_jobs.append((t["name"], cpu, dict(os.environ, **dict(e.split("=", 1) for e in env))))
        listed.append(entry)

    def cpu_run(job):
        name, cmd, env = job
        t0 = time.time()
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=build)
        return name, r.returncode, time.time() - t0, r.stdout

    failed = 0
    print(f"gpu_tests: {len(listed)} tests listed, {len(left)} left out; the CPU half of {len(cpu_jobs)} to run here")
    with concurrent.futures.ThreadPoolExecutor(a.jobs) as pool:
        for name, rc, secs, out in pool.map(cpu_run, cpu_jobs):
            print(f"  cpu {name}: {'ok' if rc == 0 else f'FAILED (exit {rc})'} {secs:.0f} s", flush=True)
            if rc:
                failed += 1
                print("\n".join("    " + l for l in out.splitlines()[-8:]))
    with open(f"{bundle}/gpu_tests.json", "w") as f:
        json.dump({"tests": listed, "left_out": left}, f, indent=1)
    for t in left:
        print(f"  left out {t['name']}: {t['why']}")
    print(f"gpu_tests: wrote {bundle}/gpu_tests.json")
    return 1 if failed else 0


def run(a):
    bundle = os.path.realpath(a.bundle)
    with open(f"{bundle}/gpu_tests.json") as f:
        manifest = json.load(f)
    logs = a.logs or os.path.join(bundle, "logs")
    os.makedirs(logs, exist_ok=True)
    sub = lambda w: w.replace("@ROOT@", ROOT).replace("@BUNDLE@", bundle)
    tests = [t for t in manifest["tests"] if re.search(a.regex, t["name"])]
    deadline = time.time() + a.deadline
    lock = threading.Lock()
    results = {}

    def one(t):
        if time.time() > deadline:
            return t["name"], "NOT RUN", 0.0, "the deadline passed first"
        argv = [sub(w) for w in t["argv"]]
        if a.device != "cuda":  # a rehearsal of the list where there is no GPU
            argv = [a.device if w == "cuda" and i and argv[i - 1] == "--device" else w for i, w in enumerate(argv)]
        if "cpu_metrics" in t:
            argv += ["--cpu-metrics", sub(t["cpu_metrics"])]
        env = dict(os.environ)
        env.update(dict(sub(e).split("=", 1) for e in t["env"]))
        limit = max(5.0, min(float(t["timeout"]), deadline + a.grace - time.time()))
        t0 = time.time()
        log = os.path.join(logs, t["name"] + ".log")
        with open(log, "w") as out:
            out.write("$ " + " ".join(shlex.quote(w) for w in argv) + "\n")
            out.flush()
            try:
                p = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=bundle,
                                     start_new_session=True)
                rc = p.wait(timeout=limit)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, 9)
                p.wait()
                rc = None
        secs = time.time() - t0
        with open(log) as f:
            lines = [l.rstrip() for l in f if l.strip()]
        status = "TIMEOUT" if rc is None else "PASS" if rc == 0 else "SKIP" if rc == 77 else f"FAIL({rc})"
        tail = lines[-1] if lines else ""
        with lock:
            print(f"{status:8s} {t['name']:44s} {secs:6.1f} s  {tail[:150]}", flush=True)
            if status not in ("PASS", "SKIP"):
                for l in lines[-12:]:
                    print(f"         | {l[:200]}")
        return t["name"], status, secs, tail

    print(f"gpu_tests: {len(tests)} tests, {a.jobs} at a time, deadline {a.deadline:.0f} s", flush=True)
    with concurrent.futures.ThreadPoolExecutor(a.jobs) as pool:
        for name, status, secs, tail in pool.map(one, tests):
            results[name] = status
    counts = {}
    for s in results.values():
        key = s.split("(")[0]
        counts[key] = counts.get(key, 0) + 1
    for t in manifest.get("left_out", []):
        print(f"LEFT OUT {t['name']}: {t['why']}")
    print("gpu_tests: " + ", ".join(f"{v} {k.lower()}" for k, v in sorted(counts.items())))
    return sum(v for k, v in counts.items() if k in ("FAIL", "TIMEOUT"))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sp = ap.add_subparsers(dest="mode", required=True)
    p = sp.add_parser("prepare")
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--bundle", required=True)
    p.add_argument("-j", "--jobs", type=int, default=2)
    p.add_argument("--regex", default="")
    r = sp.add_parser("run")
    r.add_argument("--bundle", required=True)
    r.add_argument("-j", "--jobs", type=int, default=4)
    r.add_argument("--deadline", type=float, default=3600, help="seconds after which no test starts")
    r.add_argument("--grace", type=float, default=60, help="seconds a test may run past the deadline")
    r.add_argument("--logs", default=None)
    r.add_argument("--regex", default="")
    r.add_argument("--device", default="cuda", help="emulate: rehearse the list on the emulated device (no GPU)")
    a = ap.parse_args()
    return prepare(a) if a.mode == "prepare" else run(a)


if __name__ == "__main__":
    sys.exit(main())
