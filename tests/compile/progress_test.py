#!/usr/bin/env python3
"""progress_test.py HPDLC SAMPLES WORK - hpdlc's progress line (core/progress.h):

- `compile --progress plain` prints each phase in order on stderr, a line each,
  and the summary on stdout as without it;
- auto, when stderr is not a terminal: nothing on stderr;
- -q: nothing, whatever --progress says;
- `--progress tty` on a pseudo-terminal: the line redrawn in place (carriage
  return, erase to the end of the line) and cleared at the end, so the
  terminal is left clean; the same for `plan --search`;
- a bad mode: exit 2 and a message."""
import os
import pty
import re
import select
import subprocess
import sys

hpdlc, samples, work = sys.argv[1:4]
tiny = os.path.join(samples, "gpt2-tiny.hpd")
fails = []
passes = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    (passes if cond else fails).append(what)


def run(args):
    return subprocess.run([hpdlc, *args], capture_output=True, text=True, timeout=300)


def run_pty(args):
    """stderr on a pseudo-terminal (stdout a pipe); returns (status, stdout, the terminal's bytes)."""
    master, slave = pty.openpty()
    p = subprocess.Popen([hpdlc, *args], stdout=subprocess.PIPE, stderr=slave, stdin=subprocess.DEVNULL,
                         env={**os.environ, "TERM": "xterm"})
    os.close(slave)
    tty = b""
    while True:
        r, _, _ = select.select([master], [], [], 0.1)
        if r:
            try:
                chunk = os.read(master, 4096)
            except OSError:
                break
            if not chunk:
                break
            tty += chunk
        elif p.poll() is not None:
            break
    out = p.stdout.read().decode()
    p.wait(timeout=300)
    os.close(master)
    return p.returncode, out, tty.decode(errors="replace")


art = os.path.join(work, "art")
base = ["compile", tiny, "-o", art, "--pp", "2"]

p = run(base + ["--progress", "plain"])
lines = [l for l in p.stderr.splitlines() if l.startswith("hpdlc compile: ")]
phases = [re.sub(r" \(\d+\.\d s\)$", "", l[len("hpdlc compile: "):]) for l in lines]
want = ["lowering and partitioning (tp 1, cp 1, pp 2)",
        "chunk 1/2: differentiating, fusing, planning memory",
        "chunk 2/2: differentiating, fusing, planning memory",
        "stage 1/2: kernels (LLVM)", "stage 2/2: kernels (LLVM)"]
check(p.returncode == 0 and phases == want, f"plain: the phases in order: {phases}")
check(all(re.search(r" \(\d+\.\d s\)$", l) for l in lines), "plain: each phase with its time")
check("compiled GPT2Tiny for cpu" in p.stdout, "plain: the summary on stdout")

p = run(base)
check(p.returncode == 0 and p.stderr == "", f"auto, stderr not a terminal: nothing on stderr ({p.stderr[:80]!r})")
p = run(base + ["-q", "--progress", "plain"])
check(p.returncode == 0 and p.stderr == "" and p.stdout == "", "-q: nothing")

rc, out, tty = run_pty(base + ["--progress", "tty"])
check(rc == 0, f"tty: exit {rc}")
check("\r\x1b[Khpdlc compile: lowering and partitioning" in tty, "tty: the line is drawn in place")
check(tty.endswith("\r\x1b[K"), f"tty: cleared at the end ({tty[-40:]!r})")
check("\n" not in tty, "tty: no line feed on the terminal")
check("compiled GPT2Tiny" in out, "tty: the summary on stdout")

rc, out, tty = run_pty(["plan", os.path.join(samples, "gpt.hpd"), "--search", "--progress", "tty"])
check(rc == 0 and "hpdlc plan --search: pricing every layout on 32 GPUs" in tty and tty.endswith("\r\x1b[K"),
      f"plan --search, tty: drawn and cleared ({tty[-60:]!r})")
check("search" in out or "rank" in out.lower(), "plan --search: the report on stdout")

p = run(base + ["--progress", "loud"])
check(p.returncode == 2 and "--progress takes auto, tty, plain or quiet, not 'loud'" in p.stderr, f"bad mode: {p.stderr.strip()}")

print(f"{len(passes)} passed, {len(fails)} failed")
sys.exit(1 if fails else 0)
