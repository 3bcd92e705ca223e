"""plan_checks.py - what the tests/plan/*_flag.py style scripts share: running `hpdlc plan`
on a sample (text or JSON), and the verdict of a list of (good, what) checks, each failing
one printed as `FAIL: what`, as the exit status to return (0 all good, 1 otherwise)."""
import json
import subprocess


def plan_run(hpdlc, sample, args):
    """`hpdlc plan SAMPLE ARGS...`, its output captured (text)."""
    return subprocess.run([hpdlc, "plan", sample, *args], capture_output=True, text=True)


def plan_json(hpdlc, sample, args):
    """The JSON report of `hpdlc plan SAMPLE ARGS... --format json`, or None (its errors printed)."""
    p = plan_run(hpdlc, sample, [*args, "--format", "json"])
    if p.returncode != 0:
        print(p.stderr)
        return None
    return json.loads(p.stdout)


def bind(hpdlc, sample, *fixed):
    """plan_run and plan_json of one sample with arguments that come first in every call
    (the model's -D sizes): run(args), plan(args)."""
    return (lambda args: plan_run(hpdlc, sample, [*fixed, *args]), lambda args: plan_json(hpdlc, sample, [*fixed, *args]))


# Llama 3.1 8B's shapes (torchtitan's llama3_configs) for samples/llama.hpd, less the sequence
LLAMA31_8B = ["-D", "layers=32", "-D", "hidden=4096", "-D", "heads=32", "-D", "kv_heads=8", "-D", "ffn=14336",
              "-D", "vocab=128256"]


def trace_events(path):
    """The events of a `hpdlc plan --trace` file (Chrome trace event JSON)."""
    with open(path) as f:
        return json.load(f)["traceEvents"]


def trace_end_s(events):
    """When a trace's last event ends, in seconds (its times are in microseconds)."""
    return max(e.get("ts", 0) + e.get("dur", 0) for e in events) / 1e6


def rel(a, b):
    """|a - b| relative to b."""
    return abs(a - b) / max(abs(b), 1e-30)


def verdict(checks):
    bad = [what for good, what in checks if not good]
    for what in bad:
        print(f"FAIL: {what}")
    return 1 if bad else 0
