#!/usr/bin/env python3
"""run_robustness.py - hostile inputs for the front end.

    run_robustness.py HPDLC CASE WORKDIR [VERB...]

Generates the input of CASE into WORKDIR (deterministically: fixed seeds, so
a failure reproduces), runs `hpdlc VERB FILE` (default verb: check) and
passes when hpdlc exits with 0 or 1: never a signal (crash, stack overflow,
abort), never another status, within the time limit, and without growing
beyond MAX_RSS. `run_robustness.py --list` prints the case names.
"""
import os
import random
import resource
import subprocess
import sys
import time

TIME_LIMIT_S = 50
MAX_RSS_BYTES = 3 << 30
MB = 1 << 20


def big_decls(f):
    """~10 MB of valid, distinct layer declarations, one per few lines."""
    i = 0
    while f.tell() < 10 * MB:
        f.write(("layer L%d(n = 4, m = 2 * n) {\n"
                 "  param w : [n, m] init normal(0, 0.02) shard column\n"
                 "  forward(x) {\n    return x @ w + %d\n  }\n}\n" % (i, i)).encode())
        i += 1


def long_line(f):
    """A 10 MB model body on one line."""
    f.write(b"model M {")
    i = 0
    while f.tell() < 10 * MB:
        f.write(b" x%d = %d" % (i, i))
        i += 1
    f.write(b" }\n")


def long_string(f):
    """A 10 MB string literal."""
    f.write(b'train {\n  data = "' + b"d" * (10 * MB) + b'"\n}\n')


def long_comment(f):
    f.write(b"# " + b"c" * (10 * MB) + b"\n")


def long_name(f):
    f.write(b"model " + b"N" * (1 * MB) + b" {\n}\n")


def garbage_bytes(f):
    rng = random.Random(20240101)
    f.write(bytes(rng.getrandbits(8) for _ in range(1 * MB)))


def garbage_ascii(f):
    rng = random.Random(7)
    alphabet = b"(){}[]<>=+-*/%@,:;.\"\\#!&|'$?`~^ \n\t0123456789eE_abcxyzABC"
    f.write(bytes(rng.choice(alphabet) for _ in range(1 * MB)))


TOKENS = ("import layer model param input forward return if else repeat train parallel "
          "cluster extern init shard true false and or not -> ** == != <= >= ( ) [ ] { } "
          "- + * / % @ < > = , : ; . 1 2.5 1e3 80GiB 900GB/s \"s\" x y C B T f32 i32 "
          "relu gelu sum Linear 1f1b auto").split()


def token_soup(f):
    """Random sequences of valid tokens: gets deeper into the parser than bytes."""
    rng = random.Random(42)
    out = []
    for i in range(200000):
        out.append(rng.choice(TOKENS))
        out.append("\n" if rng.random() < 0.1 else " ")
    f.write("".join(out).encode())


def nul_bytes(f):
    f.write(b"\0" * (10 * MB))


def bad_utf8(f):
    f.write(b"model M {\n" + b"\xff\xfe\xc3(" * (2 * MB) + b"\n}\n")


def many_errors(f):
    """A million broken declarations: errors are capped, the run stays fast."""
    f.write(b"layer {\n" * 1000000)


def many_imports(f):
    f.write(b'import "no_such_module"\n' * 200000)


def deep_parens(f):
    n = 100000
    f.write(b"model M {\n  x = " + b"(" * n + b"1" + b")" * n + b"\n}\n")


def deep_brackets_unclosed(f):
    f.write(b"model M {\n  x = " + b"[" * 100000 + b"\n")


def deep_blocks(f):
    n = 100000
    f.write(b"model M {\n" + b"if true {\n" * n + b"}\n" * n + b"}\n")


def plus_1e6(f):
    n = 1000000
    f.write(b"model M {\n  x = " + b" + ".join([b"1"] * n) + b"\n}\n")


def minus_1e6(f):
    """A million unary minuses: right recursion in the grammar."""
    f.write(b"model M {\n  x = " + b"- " * 1000000 + b"1\n}\n")


def not_1e6(f):
    f.write(b"model M(a = true) {\n  if " + b"not " * 1000000 + b"a {\n  }\n}\n")


def pow_chain(f):
    f.write(b"model M {\n  x = " + b" ** ".join([b"1"] * 1000000) + b"\n}\n")


def member_chain(f):
    f.write(b"model M {\n  forward {\n    loss = x" + b".a" * 1000000 + b"\n  }\n}\n")


def call_chain(f):
    f.write(b"model M {\n  forward {\n    loss = f" + b"()" * 1000000 + b"\n  }\n}\n")


def index_chain(f):
    f.write(b"model M {\n  forward {\n    loss = x" + b"[0]" * 1000000 + b"\n  }\n}\n")


def long_args(f):
    f.write(b"model M {\n  x = max(" + b", ".join([b"1"] * 1000000) + b")\n}\n")


def long_list(f):
    f.write(b"model M {\n  x = [" + b", ".join([b"1"] * 1000000) + b"]\n}\n")


def many_params(f):
    f.write(b"model M(" + b", ".join(b"p%d = %d" % (i, i) for i in range(200000)) + b") {\n}\n")


def empty(f):
    pass


CASES = {name: fn for name, fn in list(globals().items())
         if callable(fn) and fn.__module__ == "__main__" and fn.__code__.co_argcount == 1
         and name not in ("main",)}


def main():
    if len(sys.argv) == 2 and sys.argv[1] == "--list":
        print("\n".join(CASES))
        return 0
    if len(sys.argv) < 4 or sys.argv[2] not in CASES:
        print(__doc__, file=sys.stderr)
        print("cases: " + " ".join(CASES), file=sys.stderr)
        return 2
    hpdlc, case, workdir = sys.argv[1], sys.argv[2], sys.argv[3]
    verb = sys.argv[4:] or ["check"]
    os.makedirs(workdir, exist_ok=True)
    path = os.path.join(workdir, case + ".hpd")
    if not os.path.exists(path):
        tmp = path + ".tmp%d" % os.getpid()
        with open(tmp, "wb") as f:
            CASES[case](f)
        os.replace(tmp, path)
    size = os.path.getsize(path)
    cmd = [hpdlc] + verb + [path]
    start = time.monotonic()
    try:
        p = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                           timeout=TIME_LIMIT_S)
    except subprocess.TimeoutExpired:
        print("FAIL: %s did not finish within %d s" % (" ".join(cmd), TIME_LIMIT_S))
        return 1
    elapsed = time.monotonic() - start
    rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    err = p.stderr.decode("utf-8", "replace")
    lines = err.splitlines()
    print("%s: %d bytes, %s exited with %d in %.2f s, max RSS %.0f MiB, %d lines on stderr"
          % (case, size, " ".join(verb), p.returncode, elapsed, rss / MB, len(lines)))
    for line in lines[:6]:
        print("  | " + line[:200])
    if p.returncode < 0:
        print("FAIL: killed by signal %d" % -p.returncode)
        print("\n".join(line[:300] for line in lines[-40:]))
        return 1
    if p.returncode not in (0, 1):
        print("FAIL: exit status %d (expected 0 or 1)" % p.returncode)
        print("\n".join(line[:300] for line in lines[-40:]))
        return 1
    if rss > MAX_RSS_BYTES:
        print("FAIL: used %.0f MiB of memory (limit %d MiB)" % (rss / MB, MAX_RSS_BYTES // MB))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
