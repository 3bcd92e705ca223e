#!/usr/bin/env python3
"""e2e.py - end-to-end tests of hpdlrun and hpdl-data (CTest: runtime.CASE).

    e2e.py --bin BUILD/bin --plugin unigram.so --work DIR CASE

Each case builds its artifacts (DIR/manifest.json with the builtin bigram
program, or the unigram plugin), its data (with hpdl-data), runs hpdlrun,
and checks what came out with code written here independently of the
runtime: a safetensors reader following the format's description, a
CRC-32C, the learning-rate schedule's formulas, and the tensors' values.
Exit 0 pass, 1 fail, 77 skip (no mpirun for a case that needs it).
"""
import argparse
import array
import json
import math
import os
import re
import shutil
import struct
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import e2e_common  # noqa: E402
from e2e_common import Fail, check, metrics, run  # noqa: E402

ARGS = None


# ---- independent readers ----------------------------------------------------

def _crc_table():
    t = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        t.append(c)
    return t


_CRC = _crc_table()


def crc32c(data):
    c = 0xFFFFFFFF
    for b in data:
        c = (c >> 8) ^ _CRC[(c ^ b) & 0xFF]
    return c ^ 0xFFFFFFFF


DTYPE_SIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1,
              "U64": 8, "U32": 4, "U16": 2, "U8": 1, "BOOL": 1}


def read_safetensors(path):
    """name -> (dtype, shape, raw bytes), checking the format's rules."""
    raw = open(path, "rb").read()
    check(len(raw) >= 8, f"{path}: shorter than 8 bytes")
    (n,) = struct.unpack("<Q", raw[:8])
    check(8 + n <= len(raw), f"{path}: header runs past the end")
    check((8 + n) % 8 == 0, f"{path}: the byte buffer does not start 8-aligned")
    header = json.loads(raw[8:8 + n])
    buf = raw[8 + n:]
    spans, out = [], {}
    for name, v in header.items():
        if name == "__metadata__":
            check(all(isinstance(x, str) for x in v.values()), "metadata values are strings")
            continue
        b, e = v["data_offsets"]
        numel = 1
        for d in v["shape"]:
            numel *= d
        check(e - b == numel * DTYPE_SIZE[v["dtype"]], f"{name}: offsets do not match the shape")
        spans.append((b, e))
        out[name] = (v["dtype"], v["shape"], buf[b:e])
    spans.sort()
    at = 0
    for b, e in spans:
        check(b == at, f"{path}: hole or overlap at {b}")
        at = e
    check(at == len(buf), f"{path}: the buffer is not covered exactly")
    return out


def floats(raw):
    a = array.array("f")
    a.frombytes(raw)
    return a


def verify_checkpoint(manifest_path):
    """Checks a checkpoint as an outside tool would: the manifest's size and
    CRC-32C of the header and of every tensor. Returns name -> floats."""
    man = json.load(open(manifest_path))
    check(man["format"] == "hpdl-checkpoint" and man["checksum"] == "crc32c", "manifest format")
    path = os.path.join(os.path.dirname(manifest_path), man["tensors_file"])
    raw = open(path, "rb").read()
    check(len(raw) == man["file_bytes"], "file size matches the manifest")
    (n,) = struct.unpack("<Q", raw[:8])
    check("%08x" % crc32c(raw[:8 + n]) == man["header_crc32c"], "header CRC-32C")
    tensors = read_safetensors(path)
    check(set(tensors) == set(man["tensors"]), "the manifest lists every tensor")
    out = {}
    for name, (dt, shape, data) in tensors.items():
        m = man["tensors"][name]
        check(m["dtype"] == dt and m["shape"] == shape, f"{name}: dtype and shape")
        check("%08x" % crc32c(data) == m["crc32c"], f"{name}: CRC-32C")
        out[name] = floats(data)
    return out


def max_diff(a, b, names=None):
    worst = 0.0
    for k in (names or a):
        check(k in b, f"tensor {k} missing")
        check(len(a[k]) == len(b[k]), f"tensor {k}: sizes differ")
        for x, y in zip(a[k], b[k]):
            worst = max(worst, abs(x - y))
    return worst


# ---- running things ---------------------------------------------------------

def need_mpi():
    e2e_common.need_mpi(ARGS.bin)


def hpdlrun(*args, **kw):
    return run([os.path.join(ARGS.bin, "hpdlrun"), *args], **kw)


def hpdl_data(*args, **kw):
    return run([os.path.join(ARGS.bin, "hpdl-data"), *args], **kw)


def work(name):
    d = os.path.join(ARGS.work, name)
    os.makedirs(d, exist_ok=True)
    return d


def make_data(nbytes=120000):
    d = work("data")
    prefix = os.path.join(d, "tiny")
    if not os.path.exists(prefix + "_train_000000.bin"):
        hpdl_data("--synthetic", str(nbytes), "--seed", "5", "-o", prefix)
    return prefix + "_train_*.bin"


def make_artifact(name, dp=1, tp=1, mb=4, nmicro=2, seq=32, steps=30, data=None, program=None, params=None,
                  optimizer=None, layout_extra=None, arena=1 << 20, clip=1.0):
    d = work(name)
    world = dp * tp
    layout = {"dp": dp, "tp": tp, "pp": 1, "cp": 1, "micro_batch": mb, "num_micro_batches": nmicro}
    layout.update(layout_extra or {})
    man = {
        "format": "hpdl-artifact", "version": 1, "model": "Bigram", "target": "cpu", "world_size": world,
        "layout": layout,
        "inputs": {"seq_len": seq, "vocab": 256},
        "train": {"steps": steps, "seed": 11, "log_every": 10, "data": data or make_data(),
                  "optimizer": optimizer or {"kind": "adamw", "lr": 0.05, "betas": [0.9, 0.95], "eps": 1e-8,
                                             "weight_decay": 0.01, "warmup": 5, "decay": "cosine", "min_lr": 0.005},
                  "clip": clip},
        "program": program or {"kind": "builtin", "name": "bigram"},
        "ranks": [{"arena_bytes": arena} for _ in range(world)],
        "params": params or [
            {"name": "bigram.weight", "shape": [256, 256], "init": {"kind": "normal", "a": 0, "b": 0.02},
             "split": {"axis": 1, "group": "tp"}},
            {"name": "bigram.bias", "shape": [256], "init": {"kind": "zeros"}, "split": {"axis": 0, "group": "tp"}},
        ],
    }
    with open(os.path.join(d, "manifest.json"), "w") as f:
        json.dump(man, f, indent=1)
    return d


def latest(ckdir):
    steps = sorted(int(f[5:-5]) for f in os.listdir(ckdir) if f.startswith("step-") and f.endswith(".json"))
    return steps[-1] if steps else None


def ckpt(ckdir, step):
    return verify_checkpoint(os.path.join(ckdir, "step-%08d.json" % step))


def lr_at(step, lr=0.05, min_lr=0.005, warmup=5, total=30):
    """The schedule's definition (docs/runtime.md), step from 0."""
    if step < warmup:
        return lr * (step + 1) / warmup
    q = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_lr + (lr - min_lr) * 0.5 * (1 + math.cos(math.pi * q))


# ---- cases --------------------------------------------------------------------

def case_data_tool():
    d = work("tool")
    text = os.path.join(d, "story.txt")
    with open(text, "wb") as f:
        f.write(b"Once upon a time there was a tiny model. " * 100)  # 4100 bytes
    p = hpdl_data("--val-fraction", "0.2", "--shard-tokens", "1000", "-o", os.path.join(d, "story"), text)
    check("3280 train tokens in 4 shards, 820 validation tokens in 1 shard" in p.stdout, p.stdout)
    raw = open(os.path.join(d, "story_train_000003.bin"), "rb").read()
    magic, version, count = struct.unpack("<3i", raw[:12])
    check((magic, version, count) == (20240520, 1, 280), "header of the last train shard")
    check(len(raw) == 1024 + 2 * 280, "size of the last train shard")
    toks = array.array("H")
    toks.frombytes(raw[1024:])
    source = open(text, "rb").read()
    check(list(toks) == list(source[3000:3280]), "tokens are the text's bytes")
    p = hpdl_data("--info", os.path.join(d, "story_val_000000.bin"))
    check("version 1 (uint16 tokens), 820 tokens" in p.stdout, p.stdout)
    # the default prefix is the file without its extension
    hpdl_data(text)
    check(os.path.exists(os.path.join(d, "story_train_000000.bin")), "default prefix")
    p = hpdl_data(os.path.join(d, "absent.txt"), expect=1)
    check("absent.txt: cannot open" in p.stderr, p.stderr)
    p = hpdl_data("--bogus", expect=2)
    check("unknown option --bogus" in p.stderr, p.stderr)
    p = hpdl_data("--synthetic", "--seed", "3", expect=2)
    check("--synthetic needs a value" in p.stderr, p.stderr)
    # synthetic text: deterministic
    hpdl_data("--synthetic", "5000", "--seed", "3", "-o", os.path.join(d, "a"))
    hpdl_data("--synthetic", "5000", "--seed", "3", "-o", os.path.join(d, "b"))
    check(open(os.path.join(d, "a.txt"), "rb").read() == open(os.path.join(d, "b.txt"), "rb").read(), "same text")
    # a prefix in folders that do not exist yet: they are made; one that cannot be is an error
    p = hpdl_data("--synthetic", "5000", "-o", os.path.join(d, "new", "sub", "c"))
    check(os.path.exists(os.path.join(d, "new", "sub", "c_train_000000.bin")), "prefix folder made")
    blocker = os.path.join(d, "file")
    open(blocker, "w").close()
    p = hpdl_data("--synthetic", "5000", "-o", os.path.join(blocker, "c"), expect=1)
    check("file: exists and is not a folder" in p.stderr, p.stderr)


def case_one_rank():
    art = make_artifact("one", dp=1, mb=8)
    m = os.path.join(work("one"), "m.jsonl")
    p = hpdlrun(art, "--metrics", m, "--progress", "plain")
    rows = metrics(m)
    check(len(rows) == 30, "30 metric lines")
    check(abs(rows[0]["loss"] - math.log(256)) < 0.01, "the first loss is about ln 256")
    check(rows[-1]["loss"] < rows[0]["loss"] - 1.5, "the loss falls")
    check("hpdlrun: done: steps 1..30" in p.stdout, p.stdout)
    # --eval-every: the validation loss (the _val_ shards by default) in the log and the
    # metrics, training untouched; --eval-data another set (here the training shards)
    ev = os.path.join(work("one"), "eval.jsonl")
    p = hpdlrun(art, "--metrics", ev, "--eval-every", "10", "--eval-steps", "2", "--progress", "plain")
    erows = metrics(ev)
    val = {r["step"]: r["val_loss"] for r in erows if r.get("val_loss") is not None}
    check(sorted(val) == [10, 20, 30] and all(math.isfinite(v) and v > 0 for v in val.values()), f"val_loss at 10, 20, 30: {val}")
    check(p.stdout.count("(2 steps of validation data, evaluation mode)") == 3 and "step 10/30 | val loss" in p.stdout, p.stdout)
    check([r["loss"] for r in erows] == [r["loss"] for r in rows], "evaluation leaves the training losses as they were")
    et = os.path.join(work("one"), "eval_train.jsonl")
    hpdlrun(art, "--metrics", et, "--eval-every", "10", "--eval-steps", "2", "--eval-data", make_data(), "--progress", "quiet")
    tval = {r["step"]: r["val_loss"] for r in metrics(et) if r.get("val_loss") is not None}
    check(sorted(tval) == [10, 20, 30] and all(tval[k] != val[k] for k in tval), f"--eval-data's set, not the default: {tval}")
    nomatch = os.path.join(work("one"), "nomatch_*.bin")
    p = hpdlrun(art, "--eval-every", "10", "--eval-data", nomatch, "--progress", "quiet", expect=1)
    # (once "the validation data (--eval-every): the validation data (--eval-every): tches": the
    # message formatted over itself)
    check(p.stderr.strip() == f"hpdlrun: error: the validation data (--eval-every): {nomatch}: no token file matches", p.stderr)


def case_dp2():
    need_mpi()
    art = make_artifact("dp2", dp=2, mb=4)
    d = work("dp2")
    m, ck = os.path.join(d, "m.jsonl"), os.path.join(d, "ck")
    p = hpdlrun("-np", "2", art, "--metrics", m, "--checkpoint-dir", ck, "--checkpoint-every", "10",
                "--progress", "plain")
    rows = metrics(m)
    check([r["step"] for r in rows] == list(range(1, 31)), "a line per step")
    for r in rows:
        for k in ("step", "loss", "lr", "tokens_per_s", "grad_norm"):
            check(k in r, f"metrics key {k}")
        check(r["tokens_per_s"] > 0, "tokens/s")
        check(abs(r["lr"] - lr_at(r["step"] - 1)) < 1e-8 * lr_at(r["step"] - 1), f"lr at step {r['step']}")
    check(rows[-1]["loss"] < rows[0]["loss"] - 1.5, "the loss falls")
    check(p.stdout.count("step ") >= 4 and "\r" not in p.stdout, "plain lines when not a terminal")
    check(sorted(os.listdir(ck)) == ["step-%08d.%s" % (s, x) for s in (10, 20, 30) for x in ("json", "safetensors")],
          "checkpoints at 10, 20, 30")
    t = ckpt(ck, 30)
    check(set(t) == {"bigram.weight", "bigram.bias", "opt.m.bigram.weight", "opt.v.bigram.weight",
                     "opt.m.bigram.bias", "opt.v.bigram.bias"}, "tensor names")
    # the same global batch on one rank (dp=1, micro-batch 8) gives the same weights
    one = make_artifact("dp2_ref", dp=1, mb=8)
    ck1 = os.path.join(work("dp2_ref"), "ck")
    hpdlrun(one, "--checkpoint-dir", ck1, "--progress", "quiet")
    diff = max_diff(t, ckpt(ck1, 30))
    check(diff < 1e-5, f"dp=2 and one rank agree (max diff {diff})")


def case_under_mpirun():
    need_mpi()
    art = make_artifact("ext", dp=2, mb=4, steps=5)
    base = ["mpirun", "--oversubscribe"] + (["--allow-run-as-root"] if os.geteuid() == 0 else [])
    p = run(base + ["-np", "2", os.path.join(ARGS.bin, "hpdlrun"), art, "--progress", "plain"])
    check("2 ranks (dp=2" in p.stdout and "done: steps 1..5" in p.stdout, p.stdout)
    check(p.stdout.count("hpdlrun: done") == 1, "one rank reports")
    p = run(base + ["-np", "3", os.path.join(ARGS.bin, "hpdlrun"), art], expect=None)
    check(p.returncode != 0, "wrong world size fails")
    check(p.stderr.count("needs 2 ranks, but there are 3") == 1, p.stderr)


def threads_of(stdout):
    """The BLAS threads per rank of hpdlrun's start-up line, and what chose them."""
    m = re.search(r"^hpdlrun: .*?, (\d+) threads? per rank( \(([^)]*)\))?, steps", stdout, re.M)
    check(m is not None, "a start-up line with the threads per rank: " + stdout)
    return int(m.group(1)), m.group(3)


def case_threads():
    """BLAS threads per rank: cores / ranks on the node, unless --threads or
    OPENBLAS_NUM_THREADS / OMP_NUM_THREADS says otherwise."""
    cores = os.cpu_count() or 1
    clean = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")}

    def start(art, *args, env=None, np_=None):
        e = dict(clean)
        e.update(env or {})
        cmd = [os.path.join(ARGS.bin, "hpdlrun")] + (["-np", str(np_)] if np_ else []) + [art, "--steps", "1",
                                                                                           "--progress", "plain", *args]
        p = subprocess.run(cmd, capture_output=True, text=True, env=e, timeout=300)
        if p.returncode != 0:
            sys.stderr.write(f"$ {' '.join(cmd)}\n--- stdout\n{p.stdout}\n--- stderr\n{p.stderr}\n")
            raise Fail(f"exit status {p.returncode}")
        return threads_of(p.stdout)

    one = make_artifact("threads1", dp=1, mb=4, steps=1)
    check(start(one) == (cores, None), f"one rank gets all {cores} cores")
    check(start(one, "--threads", "3") == (3, "--threads"), "--threads sets it")
    check(start(one, env={"OPENBLAS_NUM_THREADS": "5"}) == (5, "OPENBLAS_NUM_THREADS"), "OPENBLAS_NUM_THREADS")
    check(start(one, env={"OMP_NUM_THREADS": "4"}) == (4, "OMP_NUM_THREADS"), "OMP_NUM_THREADS")
    check(start(one, env={"OPENBLAS_NUM_THREADS": "2", "OMP_NUM_THREADS": "7"}) == (2, "OPENBLAS_NUM_THREADS"),
          "OPENBLAS_NUM_THREADS before OMP_NUM_THREADS, as OpenBLAS reads them")
    check(start(one, "--threads", "2", env={"OPENBLAS_NUM_THREADS": "5"}) == (2, "--threads"),
          "--threads over the environment")
    check(start(one, env={"OPENBLAS_NUM_THREADS": "many"}) == (cores, None), "a value that is no number is ignored")
    p = hpdlrun(one, "--threads", "0", expect=2)
    check("--threads wants a number of threads >= 1, not 0" in p.stderr, p.stderr)
    need_mpi()
    two = make_artifact("threads2", dp=2, mb=2, steps=1)
    check(start(two, np_=2) == (max(1, cores // 2), None), f"two ranks on {cores} cores get {max(1, cores // 2)} each")
    check(start(two, "--threads", "2", np_=2) == (2, "--threads"), "--threads on two ranks")
    check(start(two, np_=2, env={"OPENBLAS_NUM_THREADS": "3"}) == (3, "OPENBLAS_NUM_THREADS"),
          "the environment reaches the ranks")


def compare_layout(name, dp, tp, mb):
    need_mpi()
    ref = make_artifact(name + "_ref", dp=1, mb=8)
    art = make_artifact(name, dp=dp, tp=tp, mb=mb)
    ck_ref, ck = os.path.join(work(name + "_ref"), "ck"), os.path.join(work(name), "ck")
    hpdlrun(ref, "--checkpoint-dir", ck_ref, "--progress", "quiet", "--steps", "20")
    hpdlrun(art, "--checkpoint-dir", ck, "--progress", "quiet", "--steps", "20")
    diff = max_diff(ckpt(ck_ref, 20), ckpt(ck, 20))
    check(diff < 1e-5, f"{name}: max diff {diff} against one rank")


def case_tp2():
    compare_layout("tp2", 1, 2, 8)


def case_dp2_tp2():
    compare_layout("dp2tp2", 2, 2, 4)


def case_resume_same_layout():
    need_mpi()
    art = make_artifact("res", dp=2, mb=4, steps=20)
    d = work("res")
    a, b = os.path.join(d, "straight"), os.path.join(d, "split")
    shutil.rmtree(a, ignore_errors=True)
    shutil.rmtree(b, ignore_errors=True)
    ma, mb = os.path.join(d, "a.jsonl"), os.path.join(d, "b.jsonl")
    hpdlrun(art, "--checkpoint-dir", a, "--progress", "quiet", "--metrics", ma)
    hpdlrun(art, "--checkpoint-dir", b, "--progress", "quiet", "--stop-at", "10", "--metrics", mb)
    check(latest(b) == 10, "stopped at 10 with a checkpoint")
    p = hpdlrun(art, "--checkpoint-dir", b, "--resume", "--progress", "plain", "--metrics", mb)
    check("resuming from" in p.stdout and "steps 11..20" in p.stdout, p.stdout)
    check(open(os.path.join(a, "step-00000020.safetensors"), "rb").read() ==
          open(os.path.join(b, "step-00000020.safetensors"), "rb").read(), "10 + 10 equals 20, bit for bit")
    # the metrics file is appended to on resume: the same steps, losses and rates
    check([(r["step"], r["loss"], r["lr"]) for r in metrics(ma)] == [(r["step"], r["loss"], r["lr"]) for r in metrics(mb)],
          "the same losses, step by step")
    # --resume with no checkpoint yet starts from step 0
    c = os.path.join(d, "fresh")
    shutil.rmtree(c, ignore_errors=True)
    p = hpdlrun(art, "--checkpoint-dir", c, "--resume", "--steps", "2", "--progress", "plain")
    check("no checkpoint in" in p.stdout and "steps 1..2" in p.stdout, p.stdout)


def case_init_from():
    """hpdlrun --init-from FILE starts a run at step 0 from given weights. The data repeat every two
    steps (windows in file order) and SGD without momentum keeps no state at a constant rate, so a
    run started from a straight run's step-2 weights takes that run's steps 3 and 4: the same losses
    and, after them, the same weights bit for bit. A file lacking a parameter, a wrong shape and
    --init-from with --resume are clear errors."""
    d = work("init")
    period = 256  # 8 windows of 32: two steps of 4
    toks = [(j % period * 37 + 11) % 256 for j in range(period * 10 + 1)]
    data = os.path.join(d, "periodic.bin")
    with open(data, "wb") as f:
        f.write(struct.pack("<3i", 20240520, 1, len(toks)) + bytes(1012) + struct.pack("<%dH" % len(toks), *toks))
    sgd = {"kind": "sgd", "lr": 0.5, "momentum": 0.0, "weight_decay": 0.0, "warmup": 0, "decay": "none"}
    art = make_artifact("init", mb=4, nmicro=1, steps=4, data=data, optimizer=sgd)
    e2e_common.in_file_order(art)
    a, c = os.path.join(d, "straight"), os.path.join(d, "started")
    for x in (a, c):
        shutil.rmtree(x, ignore_errors=True)
    ma, mc = os.path.join(d, "a.jsonl"), os.path.join(d, "c.jsonl")
    hpdlrun(art, "--checkpoint-dir", a, "--checkpoint-every", "2", "--progress", "quiet", "--metrics", ma)
    start = os.path.join(a, "step-00000002.safetensors")
    p = hpdlrun(art, "--init-from", start, "--steps", "2", "--checkpoint-dir", c, "--progress", "plain", "--metrics", mc)
    check("the parameters start from" in p.stdout and "steps 1..2" in p.stdout, p.stdout)
    la, lc = [r["loss"] for r in metrics(ma)], [r["loss"] for r in metrics(mc)]
    print(f"straight run's losses {la}; started from its step 2: {lc}")
    check(la[0] != la[2] and lc == la[2:], f"the started run's losses {lc} are not the straight run's steps 3-4 {la[2:]}")
    wa = read_safetensors(os.path.join(a, "step-00000004.safetensors"))
    wc = read_safetensors(os.path.join(c, "step-00000002.safetensors"))
    check(all(wa[k] == wc[k] for k in ("bigram.weight", "bigram.bias")), "the weights after the same two steps, bit for bit")
    # a file without every parameter, a shape that differs, and a conflict with --resume
    part = os.path.join(d, "partial.safetensors")
    head = json.dumps({"bigram.bias": {"dtype": "F32", "shape": [256], "data_offsets": [0, 1024]}}).encode()
    head += b" " * (-(8 + len(head)) % 8)
    with open(part, "wb") as f:
        f.write(struct.pack("<Q", len(head)) + head + bytes(1024))
    p = hpdlrun(art, "--init-from", part, expect=1)
    one_error(p, "partial.safetensors", "no tensor bigram.weight", "the manifest's params")
    wrong = os.path.join(d, "wrong.safetensors")
    head = json.dumps({"bigram.weight": {"dtype": "F32", "shape": [256, 255], "data_offsets": [0, 261120]},
                       "bigram.bias": {"dtype": "F32", "shape": [256], "data_offsets": [261120, 262144]}}).encode()
    head += b" " * (-(8 + len(head)) % 8)
    with open(wrong, "wb") as f:
        f.write(struct.pack("<Q", len(head)) + head + bytes(262144))
    p = hpdlrun(art, "--init-from", wrong, expect=1)
    one_error(p, "wrong.safetensors", "tensor bigram.weight is F32[256, 255]", "f32[256, 256]")
    p = hpdlrun(art, "--init-from", start, "--resume", expect=2)
    check("--init-from starts a run at step 0" in p.stderr, p.stderr)


def case_resume_other_layout():
    need_mpi()
    art2 = make_artifact("rol_dp2", dp=2, mb=4, steps=20)
    d = work("rol_dp2")
    a, b = os.path.join(d, "straight"), os.path.join(d, "split")
    for x in (a, b):
        shutil.rmtree(x, ignore_errors=True)
    hpdlrun(art2, "--checkpoint-dir", a, "--progress", "quiet")
    hpdlrun(art2, "--checkpoint-dir", b, "--progress", "quiet", "--stop-at", "10")
    # resume the dp=2 checkpoint at tp=2 (2 ranks), and another copy on one rank
    art_tp = make_artifact("rol_tp2", dp=1, tp=2, mb=8, steps=20)
    art_one = make_artifact("rol_one", dp=1, mb=8, steps=20)
    c = os.path.join(d, "one")
    shutil.rmtree(c, ignore_errors=True)
    shutil.copytree(b, c)
    hpdlrun(art_tp, "--checkpoint-dir", b, "--resume", "--progress", "quiet")
    hpdlrun(art_one, "--checkpoint-dir", c, "--resume", "--progress", "quiet")
    ref = ckpt(a, 20)
    for x in (b, c):
        diff = max_diff(ref, ckpt(x, 20))
        check(diff < 1e-5, f"resumed at another layout: max diff {diff}")


def case_compression():
    need_mpi()
    ref = ckpt_of_run("cmp_none", {})
    ref_loss = metrics(os.path.join(work("cmp_none"), "m.jsonl"))[-1]["loss"]
    for kind, tol, ltol in (("fp16", 2e-3, 0.01), ("bf16", 5e-3, 0.02), ("int8", None, 0.1), ("topk", None, None)):
        extra = {"compression": kind, "topk_ratio": 0.05, "error_feedback": True}
        t = ckpt_of_run("cmp_" + kind, extra)
        rows = metrics(os.path.join(work("cmp_" + kind), "m.jsonl"))
        check(rows[-1]["loss"] < rows[0]["loss"] - 1.0, f"{kind}: the loss falls ({rows[0]['loss']} -> {rows[-1]['loss']})")
        if ltol:
            check(abs(rows[-1]["loss"] - ref_loss) < ltol, f"{kind}: final loss {rows[-1]['loss']} near {ref_loss}")
        if tol:  # AdamW magnifies tiny gradient errors in rarely seen rows: weights only for fp16
            diff = max_diff(ref, t, ["bigram.weight", "bigram.bias"])
            check(diff < tol, f"{kind}: weights near the uncompressed run's (max diff {diff})")


def ckpt_of_run(name, extra):
    art = make_artifact(name, dp=2, mb=4, layout_extra=extra)
    d = work(name)
    ck = os.path.join(d, "ck")
    shutil.rmtree(ck, ignore_errors=True)
    hpdlrun(art, "--checkpoint-dir", ck, "--progress", "quiet", "--metrics", os.path.join(d, "m.jsonl"))
    return ckpt(ck, 30)


def case_progress():
    art = make_artifact("prog", dp=1, mb=8, steps=12)
    # bytes: text mode would turn the carriage returns into newlines
    raw = subprocess.run([os.path.join(ARGS.bin, "hpdlrun"), art, "--progress", "tty", "--log-every", "5"],
                         capture_output=True, timeout=300).stdout
    check(raw.count(b"\r\x1b[K") >= 12 and b"ETA" in raw and b"tok/s" in raw, "a live line on a terminal")
    check(raw.count(b"\n") == 6, "header, the lines of steps 1, 5, 10, 12, and the summary stay")
    p = hpdlrun(art, "--progress", "plain", "--log-every", "5")
    check("\r" not in p.stdout, "plain lines otherwise")
    lines = [l for l in p.stdout.splitlines() if l.startswith("step ")]
    check([l.split("/")[0] for l in lines] == ["step  1", "step  5", "step 10", "step 12"], p.stdout)
    p = hpdlrun(art, "--progress", "quiet")
    check(p.stdout == "", "quiet")


def case_checkpoint_options():
    need_mpi()
    art = make_artifact("ckopt", dp=2, mb=4, steps=30)
    d = work("ckopt")
    sync, asyn = os.path.join(d, "sync"), os.path.join(d, "async")
    for x in (sync, asyn):
        shutil.rmtree(x, ignore_errors=True)
    hpdlrun(art, "--checkpoint-dir", sync, "--checkpoint-every", "5", "--checkpoint-keep", "2", "--progress", "quiet")
    check(sorted(os.listdir(sync)) == ["step-00000025.json", "step-00000025.safetensors",
                                       "step-00000030.json", "step-00000030.safetensors"], "keep 2")
    p = hpdlrun(art, "--checkpoint-dir", asyn, "--checkpoint-every", "5", "--checkpoint-async", "--progress", "plain")
    check("in the background" in p.stdout, p.stdout)
    for s in (25, 30):
        check(max_diff(ckpt(sync, s), ckpt(asyn, s)) == 0, f"async checkpoint {s} equals the synchronous one")


def case_native_program():
    need_mpi()
    data = make_data()
    art = make_artifact("native", dp=2, mb=4, program={"kind": "native"},
                        params=[{"name": "unigram.logits", "shape": [256], "init": {"kind": "zeros"}}],
                        optimizer={"kind": "adamw", "lr": 0.3})
    man = json.load(open(os.path.join(art, "manifest.json")))
    man["ranks"] = [{"program": "unigram.so", "arena_bytes": 0} for _ in range(2)]
    json.dump(man, open(os.path.join(art, "manifest.json"), "w"))
    shutil.copy(ARGS.plugin, os.path.join(art, "unigram.so"))
    m = os.path.join(art, "m.jsonl")
    p = hpdlrun(art, "--metrics", m, "--progress", "plain", "--data", data)
    rows = metrics(m)
    check(abs(rows[0]["loss"] - math.log(256)) < 1e-6, "uniform logits: ln 256")
    check(rows[-1]["loss"] < 3.3, f"near the unigram entropy of the text ({rows[-1]['loss']})")
    check("unigram" in p.stdout, p.stdout)


# ---- bad input ----------------------------------------------------------------

def one_error(p, *needles):
    errs = [l for l in p.stderr.splitlines() if "error:" in l]
    check(len(errs) == 1, f"one error line, not {len(errs)}:\n{p.stderr}")
    for n in needles:
        check(n in p.stderr, f"'{n}' in: {p.stderr}")


def case_bad_data():
    need_mpi()
    d = work("baddata")
    bad = os.path.join(d, "bad_magic.bin")
    with open(bad, "wb") as f:
        f.write(struct.pack("<3i", 123, 1, 100) + bytes(1012) + bytes(200))
    art = make_artifact("baddata_art", dp=2, mb=4)
    p = hpdlrun(art, "--data", bad, expect=1)
    one_error(p, "bad_magic.bin", "magic 123 at byte 0")
    short = os.path.join(d, "short.bin")
    with open(short, "wb") as f:
        f.write(struct.pack("<3i", 20240520, 1, 1000) + bytes(1012) + bytes(300))
    p = hpdlrun(art, "--data", short, expect=1)
    one_error(p, "short.bin: truncated", "announces 1000 tokens")
    few = os.path.join(d, "few.bin")
    with open(few, "wb") as f:
        f.write(struct.pack("<3i", 20240520, 1, 20) + bytes(1012) + bytes(40))
    p = hpdlrun(art, "--data", few, expect=1)
    one_error(p, "few.bin: 20 tokens", "fewer than the 33")
    p = hpdlrun(art, "--data", os.path.join(d, "nothing_*.bin"), expect=1)
    one_error(p, "no token file matches")
    # a token past the vocabulary, met mid-run on one rank: a clear error and a non-zero exit
    big = os.path.join(d, "big.bin")
    toks = [i % 250 for i in range(5000)]
    toks[3000] = 300
    with open(big, "wb") as f:
        f.write(struct.pack("<3i", 20240520, 1, len(toks)) + bytes(1012) + struct.pack("<%dH" % len(toks), *toks))
    art_ns = make_artifact("baddata_ns", dp=2, mb=4)
    man = json.load(open(os.path.join(art_ns, "manifest.json")))
    man["train"]["shuffle"] = False
    json.dump(man, open(os.path.join(art_ns, "manifest.json"), "w"))
    p = hpdlrun(art_ns, "--data", big, expect=None)
    check(p.returncode != 0, "a bad token fails the run")
    check("token 300 at byte %d is outside the model's vocabulary of 256" % (1024 + 2 * 3000) in p.stderr, p.stderr)
    # the rank that met it said why: the launcher adds no "no rank reported an error"
    check("no rank reported" not in p.stderr, f"a rank's fatal error called unreported: {p.stderr}")


def case_bad_artifact():
    d = work("badart")
    p = hpdlrun(d, expect=1)
    one_error(p, "manifest.json: missing artifact file")
    p = hpdlrun(os.path.join(d, "nope"), expect=1)
    one_error(p, "not an artifact folder")
    art = make_artifact("badart_native", dp=2, program={"kind": "native"})
    man = json.load(open(os.path.join(art, "manifest.json")))
    man["ranks"] = [{"program": "rank%d.so" % r, "arena_bytes": 0} for r in range(2)]
    open(os.path.join(art, "rank0.so"), "w").close()
    json.dump(man, open(os.path.join(art, "manifest.json"), "w"))
    p = hpdlrun(art, expect=1)
    one_error(p, "missing artifact file", "rank1.so", "ranks[1].program")
    man["world_size"] = 3
    json.dump(man, open(os.path.join(art, "manifest.json"), "w"))
    p = hpdlrun(art, expect=1)
    one_error(p, "world_size: is 3, but dp x tp x pp x cp = 2")
    with open(os.path.join(art, "manifest.json"), "w") as f:
        f.write('{"format": "hpdl-artifact", "version": 1,\n "world_size": }')
    p = hpdlrun(art, expect=1)
    one_error(p, "manifest.json:2:", "not valid JSON")
    # a compression the runtime does not know: the error lists every one it does (bf16 too)
    art = make_artifact("badart_compression", dp=2, layout_extra={"compression": "fp8"})
    p = hpdlrun(art, expect=1)
    one_error(p, "layout.compression: must be one of none fp16 int8 topk bf16")
    # 16-bit moments are bf16
    art = make_artifact("badart_moments", dp=1)
    man = json.load(open(os.path.join(art, "manifest.json")))
    man["train"]["moments"] = "fp16"
    json.dump(man, open(os.path.join(art, "manifest.json"), "w"))
    p = hpdlrun(art, expect=1)
    one_error(p, "train.moments: must be fp32 or bf16")
    art = make_artifact("badart_arena", dp=1, arena=1000)
    p = hpdlrun(art, expect=1)
    one_error(p, "the arena has 1000 bytes", "ranks[0].arena_bytes")
    art = make_artifact("badart_np", dp=2)
    p = hpdlrun("-np", "3", art, expect=2)
    check("compiled for 2 ranks" in p.stderr and "hint: run with -np 2" in p.stderr, p.stderr)
    p = hpdlrun(art, "--frobnicate", expect=2)
    check("unknown option --frobnicate" in p.stderr, p.stderr)
    p = hpdlrun(art, "--steps", "x", expect=2)
    check("--steps wants a number" in p.stderr, p.stderr)
    # an option where a value belongs is not taken for the value
    p = hpdlrun(art, "--steps", "--seed", "3", expect=2)
    check("--steps needs a value" in p.stderr, p.stderr)


def prepare_checkpoint(name):
    art = make_artifact(name, dp=2, mb=4, steps=20)
    ck = os.path.join(work(name), "ck")
    shutil.rmtree(ck, ignore_errors=True)
    hpdlrun(art, "--checkpoint-dir", ck, "--stop-at", "10", "--progress", "quiet")
    return art, ck


def case_bad_checkpoint():
    need_mpi()
    art, ck = prepare_checkpoint("badck")
    t = os.path.join(ck, "step-00000010.safetensors")
    good = open(t, "rb").read()
    raw = bytearray(good)
    raw[-100] ^= 0x10
    open(t, "wb").write(raw)
    p = hpdlrun(art, "--checkpoint-dir", ck, "--resume", expect=1)
    one_error(p, "step-00000010.safetensors: corrupted: tensor", "CRC-32C")
    open(t, "wb").write(good[:len(good) // 2])
    p = hpdlrun(art, "--checkpoint-dir", ck, "--resume", expect=1)
    one_error(p, "truncated: the file has %d bytes" % (len(good) // 2))
    open(t, "wb").write(good)
    p = hpdlrun(art, "--resume-from", os.path.join(ck, "step-00000099.json"), expect=1)
    one_error(p, "step-00000099.json: cannot read the checkpoint manifest")
    # a checkpoint of another model
    other = make_artifact("badck_other", dp=2, mb=4, steps=20, params=[
        {"name": "bigram.weight", "shape": [256, 256], "init": {"kind": "zeros"}},
        {"name": "bigram.bias", "shape": [256], "init": {"kind": "zeros"}},
        {"name": "bigram.extra", "shape": [4], "init": {"kind": "zeros"}}])
    p = hpdlrun(other, "--checkpoint-dir", ck, "--resume", expect=1)
    one_error(p, "no tensor bigram.extra")


def case_killed_writer():
    need_mpi()
    art, ck = prepare_checkpoint("killed")
    # the next run is killed half-way through writing step 20's tensor file
    p = hpdlrun(art, "--checkpoint-dir", ck, "--resume", "--progress", "quiet",
                expect=None, env={"HPDL_FAULT": "ckpt-kill-after=300000"})
    check(p.returncode != 0, "the killed run fails")
    check(latest(ck) == 10, "the latest checkpoint is still step 10")
    check(any(".tmp." in f for f in os.listdir(ck)), "the killed writer left only a temporary")
    ckpt(ck, 10)  # and it is intact
    # killed between the tensor file and the manifest
    p = hpdlrun(art, "--checkpoint-dir", ck, "--resume", "--progress", "quiet",
                expect=None, env={"HPDL_FAULT": "ckpt-kill-before-manifest"})
    check(p.returncode != 0 and latest(ck) == 10, "a tensor file without manifest is not a checkpoint")
    # resuming now gives what an uninterrupted run gives
    hpdlrun(art, "--checkpoint-dir", ck, "--resume", "--progress", "quiet")
    straight = os.path.join(work("killed"), "straight")
    shutil.rmtree(straight, ignore_errors=True)
    hpdlrun(art, "--checkpoint-dir", straight, "--progress", "quiet")
    check(max_diff(ckpt(ck, 20), ckpt(straight, 20)) == 0, "resumed after the crash = straight")
    check(not any(".tmp." in f for f in os.listdir(ck)), "leftovers cleaned")


def case_failed_write():
    need_mpi()
    art, ck = prepare_checkpoint("failwrite")
    p = hpdlrun(art, "--checkpoint-dir", ck, "--resume", "--progress", "quiet", expect=1,
                env={"HPDL_FAULT": "ckpt-fail-after=1000"})
    one_error(p, "step-00000020.safetensors", "No space left on device")
    check(latest(ck) == 10 and not any(".tmp." in f for f in os.listdir(ck)), "nothing partial left")


def case_rank_dies():
    """Rank 1 of 4 (dp 2 x tp 2) is killed (SIGKILL) at step 3: every rank is out
    within seconds, hpdlrun exits non-zero saying a rank died of signal 9, and
    the checkpoint of step 2 stays the latest, intact."""
    need_mpi()
    import time
    art = make_artifact("rank_dies", dp=2, tp=2, steps=10)
    ck = os.path.join(work("rank_dies"), "ck")
    shutil.rmtree(ck, ignore_errors=True)
    t0 = time.time()
    p = hpdlrun(art, "--checkpoint-dir", ck, "--checkpoint-every", "2", "--progress", "quiet", expect=None,
                env={"HPDL_FAULT": "rank-die-step=3,rank-die-rank=1"})
    took = time.time() - t0
    check(p.returncode != 0, "the job failed")
    check("a rank died of signal 9 (Killed)" in p.stderr, f"the message: {p.stderr}")
    check(took < 30, f"the ranks took {took:.1f} s to stop")
    check(latest(ck) == 2, f"the latest checkpoint is {latest(ck)}")
    ckpt(ck, 2)
    print(f"rank_dies: out in {took:.1f} s: {p.stderr.strip().splitlines()[-1]}")


def case_unwritable_checkpoint():
    """A checkpoint folder that cannot be made (a file is in the way) fails before
    the first step, naming the path, on 2 ranks: no step is run to be lost."""
    need_mpi()
    art = make_artifact("unwritable", dp=2, steps=5)
    blocker = os.path.join(work("unwritable"), "not-a-folder")
    open(blocker, "w").write("x")
    mt = os.path.join(work("unwritable"), "m.jsonl")
    if os.path.exists(mt):
        os.remove(mt)
    p = hpdlrun(art, "--checkpoint-dir", os.path.join(blocker, "ck"), "--metrics", mt, "--progress", "plain", expect=1)
    one_error(p, blocker, "exists and is not a folder")
    check(not os.path.exists(mt) or not metrics(mt), "steps ran before the folder was checked")
    check("step " not in p.stdout, "steps ran before the folder was checked")


def case_mpirun_fails():
    """mpirun that fails by itself (here `false`, as an mpirun that cannot
    start its daemons would) is not a silent exit: hpdlrun names it and its
    status; a rank's own error is still the one error line."""
    need_mpi()
    art = make_artifact("mpirun_fails", dp=2, steps=5)
    p = hpdlrun(art, "--progress", "quiet", expect=1, env={"HPDL_MPIRUN": "false"})
    one_error(p, "false exited with status 1 and no rank reported an error", "HPDL_MPIRUN_QUIET=0")
    blocker = os.path.join(work("mpirun_fails"), "not-a-folder")
    open(blocker, "w").write("x")
    p = hpdlrun(art, "--checkpoint-dir", os.path.join(blocker, "ck"), "--progress", "quiet", expect=1)
    one_error(p, "exists and is not a folder")
    check("no rank reported" not in p.stderr, f"a reported error reported twice: {p.stderr}")


def case_too_big():
    """An artifact whose rank needs more memory than the machine has (an arena of
    2^50 bytes) is refused before anything is allocated, with the sizes and
    what to do; nothing is left running."""
    art = make_artifact("too_big", arena=1 << 50)
    p = hpdlrun(art, "--progress", "plain", expect=1)
    one_error(p, "this rank needs", "the program's arena 1048576.0 GiB", "more than the", "spread the model over more ranks")


def case_failed_write_async():
    """A checkpoint written in the background fails (disk full at step 12's): the
    run stops at the step it learns of it, long before the next save, with one
    message naming the file; step 10's checkpoint stays the latest, nothing partial."""
    need_mpi()
    art, ck = prepare_checkpoint("failwrite_async")
    mt = os.path.join(work("failwrite_async"), "m.jsonl")
    if os.path.exists(mt):
        os.remove(mt)
    p = hpdlrun(art, "--checkpoint-dir", ck, "--resume", "--checkpoint-async", "--checkpoint-every", "2", "--metrics", mt,
                "--progress", "quiet", expect=1, env={"HPDL_FAULT": "ckpt-fail-after=1000,step-sleep-ms=50"})
    one_error(p, "the checkpoint of step 12, written in the background", "step-00000012.safetensors", "No space left on device")
    last = metrics(mt)[-1]["step"]
    check(12 <= last < 14, f"the run went on to step {last} after the failed save of step 12")
    check(latest(ck) == 10 and not any(".tmp." in f for f in os.listdir(ck)), "nothing partial left")


def stop_mid_run(art, ck, mt, sig, after=4, extra=()):
    """Starts hpdlrun (each step slowed to 100 ms), sends `sig` once `after`
    steps are in the metrics file; returns the finished process and its output."""
    e = dict(os.environ)
    e.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
    e.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    e["HPDL_FAULT"] = "step-sleep-ms=100"
    for f in (mt,):
        if os.path.exists(f):
            os.remove(f)
    p = subprocess.Popen([os.path.join(ARGS.bin, "hpdlrun"), art, "--checkpoint-dir", ck, "--metrics", mt,
                          "--progress", "plain", *extra], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=e)
    import time
    t0 = time.time()
    while time.time() - t0 < 120 and p.poll() is None:
        if os.path.exists(mt) and len(metrics(mt)) >= after:
            break
        time.sleep(0.02)
    check(p.poll() is None, "the run was still going when the signal was due")
    p.send_signal(sig)
    try:
        out, _ = p.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        p.kill()
        raise Fail(f"no exit within 60 s of {sig.name}")
    return p.returncode, out


def preempt_layout(name, dp, tp):
    """SIGTERM mid-run: exit 143 after the step in flight, with its checkpoint;
    --resume then ends where a run never stopped ends, bit for bit."""
    import signal
    art = make_artifact(name, dp=dp, tp=tp, mb=4, steps=30)
    ck, mt = os.path.join(work(name), "ck"), os.path.join(work(name), "m.jsonl")
    shutil.rmtree(ck, ignore_errors=True)
    rc, out = stop_mid_run(art, ck, mt, signal.SIGTERM)
    done = metrics(mt)[-1]["step"]
    if rc != 143:
        sys.stderr.write(out)
    check(rc == 143, f"exit status {rc} after SIGTERM, expected 143")
    check(4 <= done < 30, f"stopped at step {done}")
    check(f"SIGTERM: stopped after step {done} of 30" in out, "the stop is reported with its step")
    check(latest(ck) == done, f"the checkpoint is of step {latest(ck)}, the last step run {done}")
    check(not any(".tmp." in f for f in os.listdir(ck)), "nothing partial left")
    hpdlrun(art, "--checkpoint-dir", ck, "--resume", "--progress", "quiet")
    straight = os.path.join(work(name), "straight")
    shutil.rmtree(straight, ignore_errors=True)
    hpdlrun(art, "--checkpoint-dir", straight, "--progress", "quiet")
    check(max_diff(ckpt(ck, 30), ckpt(straight, 30)) == 0, "stopped and resumed = never stopped, bit for bit")


def case_diverged():
    """A gradient gone NaN at step 3 (HPDL_FAULT grad-nan-step / grad-nan-param:
    the first value of each shard of bigram.bias, the second parameter): the run
    stops there on every rank at once (dp 2 x tp 2), with one message that names
    the step and the first gradient in the model's order holding values that
    are not finite, with their count over the shards (one a tp shard); the
    metrics stop before it."""
    need_mpi()
    art = make_artifact("diverged", dp=2, tp=2, steps=10)
    mt = os.path.join(work("diverged"), "m.jsonl")
    p = hpdlrun(art, "--metrics", mt, "--progress", "plain", expect=1,
                env={"HPDL_FAULT": "grad-nan-step=3,grad-nan-param=1"})
    lines = [l for l in p.stderr.splitlines() if l.strip()]
    check(len(lines) == 1, f"one error line, got {lines}")
    m = re.match(r"hpdlrun: error: step (\d+): the loss is (\S+) and the gradient norm (\S+) .*: the run diverged; "
                 r"the first gradient in the model's order with values that are not finite: (\S+) \((\d+) of them\)$", lines[0])
    check(m is not None, f"the message: {lines[0]}")
    step, norm, name, count = int(m.group(1)), m.group(3), m.group(4), int(m.group(5))
    check(step == 3 and norm == "nan" and name == "bigram.bias" and count == 2, f"step {step}, norm {norm}, {name}, {count}")
    check(len(metrics(mt)) == 2, f"{len(metrics(mt))} metrics lines before step 3")
    print(lines[0])


def fp16_artifact(name, dp=1, tp=1, steps=10, loss_scale=0.0):
    art = make_artifact(name, dp=dp, tp=tp, steps=steps)
    path = os.path.join(art, "manifest.json")
    man = json.load(open(path))
    man["train"]["precision"] = "fp16"
    man["train"]["loss_scale"] = loss_scale
    json.dump(man, open(path, "w"), indent=1)
    return art


def same_state(a, b):
    """Every tensor of two checkpoints (parameters and optimizer state), bit for bit."""
    return set(a) == set(b) and all(a[k][2] == b[k][2] for k in a)


def loss_scale_case(name, dp, tp):
    """fp16's dynamic loss scale (docs/runtime.md, "Loss scaling"):
    1. scaled by 2^16 and unscaled, the gradients are those of fp32 bit for
       bit (a power of two), so the losses, norms and weights are too;
    2. a gradient gone NaN at step 3 skips the step instead of stopping the
       run: the weights and optimizer state after it are those of step 2, the
       scale halves, and it doubles again after every 2 clean steps
       (HPDL_FAULT loss-scale-window=2);
    3. stopped at step 4 and resumed, the scale and the count of updates go
       on from the checkpoint: the same weights as a run never stopped;
    4. a dynamic scale that would fall below 1 ends the run as diverged."""
    steps = 10
    a32 = make_artifact(name + "_fp32", dp=dp, tp=tp, steps=steps)
    a16 = fp16_artifact(name, dp=dp, tp=tp, steps=steps)
    w = work(name)
    runs = {}
    for tag, art, env in (("fp32", a32, None), ("fp16", a16, None),
                          ("skip", a16, "grad-nan-step=3,grad-nan-param=1,loss-scale-window=2")):
        ck, mt = os.path.join(w, "ck_" + tag), os.path.join(w, tag + ".jsonl")
        shutil.rmtree(ck, ignore_errors=True)
        p = hpdlrun(art, "--checkpoint-dir", ck, "--checkpoint-every", "1", "--checkpoint-keep", "20", "--metrics", mt,
                    "--progress", "plain", env={"HPDL_FAULT": env} if env else None)
        runs[tag] = (ck, metrics(mt), p.stdout)
    m32, m16, msk = runs["fp32"][1], runs["fp16"][1], runs["skip"][1]
    # 1. fp16 = fp32
    for x, y in zip(m32, m16):
        check(x["loss"] == y["loss"] and x["grad_norm"] == y["grad_norm"],
              f"step {x['step']}: fp32 loss {x['loss']} norm {x['grad_norm']}, fp16 {y['loss']} {y['grad_norm']}")
        check(y["loss_scale"] == 65536 and y["skipped"] is False and "loss_scale" not in x, f"step {y['step']}: {y}")
    check(same_state(ckpt(runs["fp32"][0], steps), ckpt(runs["fp16"][0], steps)), "fp16's weights = fp32's, bit for bit")
    # 2. the skipped step
    scales = [m["loss_scale"] for m in msk]
    want = [65536, 65536, 131072, 65536, 65536, 131072, 131072, 262144, 262144, 524288]
    check(scales == want, f"the scales {scales}, expected {want}")
    check([m["skipped"] for m in msk] == [i == 2 for i in range(steps)], "step 3 alone is skipped")
    check(msk[2]["grad_norm"] is None and msk[2]["loss"] is not None, f"step 3: {msk[2]}")
    check("hpdlrun: step 3: gradients not finite at loss scale 131072: the step is skipped, the scale is now 65536"
          in runs["skip"][2], "the skip is reported")
    ck = runs["skip"][0]
    check(same_state(ckpt(ck, 2), ckpt(ck, 3)), "the weights and moments after the skipped step are those before it")
    info = json.load(open(os.path.join(ck, "step-%08d.json" % 3)))
    info = info.get("info", info)
    check(info.get("updates") == 2 and info.get("loss_scale", {}).get("scale") == 65536,
          f"checkpoint 3 records 2 updates and the halved scale: {info.get('updates')}, {info.get('loss_scale')}")
    # 3. stopped at 4, resumed
    rk, rm = os.path.join(w, "ck_resumed"), os.path.join(w, "resumed.jsonl")
    shutil.rmtree(rk, ignore_errors=True)
    env = {"HPDL_FAULT": "grad-nan-step=3,grad-nan-param=1,loss-scale-window=2"}
    hpdlrun(a16, "--checkpoint-dir", rk, "--metrics", rm, "--stop-at", "4", "--progress", "quiet", env=env)
    hpdlrun(a16, "--checkpoint-dir", rk, "--metrics", rm, "--resume", "--progress", "quiet", env=env)
    mr = metrics(rm)
    check([m["loss_scale"] for m in mr] == want and [m["loss"] for m in mr] == [m["loss"] for m in msk],
          f"resumed: scales {[m['loss_scale'] for m in mr]}")
    check(same_state(ckpt(rk, steps), ckpt(ck, steps)), "stopped at 4 and resumed = never stopped, bit for bit")
    # 4. below the smallest scale
    p = hpdlrun(a16, "--progress", "plain", expect=1,
                env={"HPDL_FAULT": "grad-nan-step=2,grad-nan-param=1,loss-scale-init=1"})
    check("the run diverged" in p.stderr and "the loss scale is 1, the smallest a dynamic scale takes, after 0 skipped steps"
          in p.stderr, f"the message: {p.stderr.strip()}")
    print(f"{name}: fp16 = fp32 over {steps} steps; scales {scales}; skipped step 3 left the state of step 2; resumed = straight")


def case_loss_scale():
    loss_scale_case("loss_scale", 1, 1)


def case_loss_scale_dp2_tp2():
    need_mpi()
    loss_scale_case("loss_scale_dp2_tp2", 2, 2)


def case_loss_scale_static():
    """A static scale (train.loss_scale = 1024) stays: a step whose gradients
    are not finite is skipped, and the next uses 1024 again."""
    art = fp16_artifact("loss_scale_static", steps=6, loss_scale=1024.0)
    mt = os.path.join(work("loss_scale_static"), "m.jsonl")
    if os.path.exists(mt):
        os.remove(mt)
    p = hpdlrun(art, "--metrics", mt, "--progress", "plain", env={"HPDL_FAULT": "grad-nan-step=2,grad-nan-param=1"})
    m = metrics(mt)
    check([x["loss_scale"] for x in m] == [1024] * 6 and [x["skipped"] for x in m] == [i == 1 for i in range(6)],
          f"static: {[(x['loss_scale'], x['skipped']) for x in m]}")
    check("the scale stays (static) 1024" in p.stdout, "the skip is reported")


def case_preempt_dp2():
    need_mpi()
    preempt_layout("preempt_dp2", 2, 1)


def case_preempt_dp2_tp2():
    need_mpi()
    preempt_layout("preempt_dp2_tp2", 2, 2)


def case_preempt_one_rank():
    """Ctrl-C (SIGINT) of a one-rank run: 130, saved; a second SIGTERM while
    stopping ends the process at once (143) with no partial checkpoint."""
    import signal
    art = make_artifact("preempt_one", steps=30)
    ck, mt = os.path.join(work("preempt_one"), "ck"), os.path.join(work("preempt_one"), "m.jsonl")
    shutil.rmtree(ck, ignore_errors=True)
    rc, out = stop_mid_run(art, ck, mt, signal.SIGINT)
    done = metrics(mt)[-1]["step"]
    check(rc == 130, f"exit status {rc} after SIGINT, expected 130")
    check("SIGINT: stopped after step" in out and latest(ck) == done, "saved at the step it stopped after")
    # without a checkpoint folder the stop says nothing was saved
    plain = make_artifact("preempt_nofolder", steps=30)
    e = {"HPDL_FAULT": "step-sleep-ms=100"}
    p = subprocess.Popen([os.path.join(ARGS.bin, "hpdlrun"), plain, "--progress", "plain"], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, env={**os.environ, **e})
    import time
    time.sleep(1.0)
    p.send_signal(signal.SIGTERM)
    out, _ = p.communicate(timeout=60)
    check(p.returncode == 143 and "nothing was saved" in out, f"no folder: exit {p.returncode}, output {out[-300:]!r}")
    # twice: at once
    p = subprocess.Popen([os.path.join(ARGS.bin, "hpdlrun"), art, "--checkpoint-dir", ck, "--resume", "--steps", "60",
                          "--progress", "quiet"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         env={**os.environ, "HPDL_FAULT": "step-sleep-ms=2000"})
    time.sleep(1.0)
    p.send_signal(signal.SIGTERM)
    time.sleep(0.1)
    p.send_signal(signal.SIGTERM)
    t0 = time.time()
    p.communicate(timeout=60)
    check(p.returncode == 143 and time.time() - t0 < 1.5, f"twice: exit {p.returncode} after {time.time() - t0:.1f} s")
    check(latest(ck) == done and not any(".tmp." in f for f in os.listdir(ck)), "the checkpoint before stays the latest")


CASES = {name[5:]: fn for name, fn in globals().items() if name.startswith("case_")}


def main():
    global ARGS
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--plugin", default="")
    ap.add_argument("--work", required=True)
    ap.add_argument("case", choices=sorted(CASES))
    ARGS = ap.parse_args()
    ARGS.work = os.path.abspath(ARGS.work)
    os.makedirs(ARGS.work, exist_ok=True)
    return e2e_common.run_case(CASES, ARGS.case)


if __name__ == "__main__":
    sys.exit(main())
