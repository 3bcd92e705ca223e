#!/usr/bin/env python3
"""vision_e2e.py - image classification end to end (CTest: vision.CASE).

    vision_e2e.py --bin BUILD/bin --source REPO --work DIR CASE

Each case makes its images with hpdl-data --synthetic-images, compiles
tests/vision/mlp-images.hpd (3x32x32 images flattened, a hidden layer of 64,
10 classes; a global batch of 32 in micro-batches of 8) with hpdlc compile and
trains it with hpdlrun, checking what came out with code written here: a reader
of the image format following docs/runtime.md ("Image data").

  data_tool      hpdl-data --synthetic-images: the files' names, sizes and header
      fields read independently, labels below K, the same bytes again for the same
      seed and others for another, --info's line with the images per class counted
      here, --info of a token shard still, the usage errors of the new options.
  bad_files      hpdlrun on a wrong magic, a truncated file (the first missing image
      named), a label out of range (met mid-run: image and byte named), images of
      another shape than the model's (both shapes named), a token shard for the image
      model, more classes than the model's: one golden message each, exit 1.
  compile_errors hpdlc compile on models whose inputs the runtime cannot feed (three
      inputs, float labels, labels of rank 2, bf16 images, images without a dimension
      after the batch): golden messages; the manifest's inputs of the image model.
  one_rank       30 steps on one rank: the step-1 loss near ln 10, step 30 below 0.7 x
      step 1; the start-up line counts images (32 images/step, the files' images
      and shape), the progress line img/s, the metrics images_per_s; the reference
      executor (HPDL_EXECUTOR=interp) on the same artifact within 1e-4 at every step.
  dp2            the artifact at dp = 2 under mpirun -np 2: every step's loss within
      1e-4 of one rank's (the same global batch: the same images each step); a
      checkpoint of step 15 at dp 2 resumed at dp 1 gives steps 16-30 of the
      straight run within 1e-4 (resuming is seeking).
  resnet_tiny    a convolutional network: tests/vision/resnet-tiny.hpd (convolutions, batch
      norm synchronised over dp, residual blocks, pooling; -D size=6 -D classes=5) on 6x6
      images, 20 steps: dp 2 with micro-batches of 4 and pp 2 within 1e-4 of one rank
      with micro-batches of 8 at every step (sync batch norm normalises over the
      dp-wide micro-batch: the same 8 images), and the loss of the last 5 steps below
      the first 5's.
  emulate        --target cuda --emulate run on the emulated device (hpdlrun --device
      emulate): within 1e-4 of the CPU program at every step (skipped without NVRTC or
      a C++ compiler).
Exit 0 pass, 1 fail, 77 skip.
"""
import glob
import json
import math
import os
import shutil
import struct
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
import e2e_common  # noqa: E402
from e2e_common import SKIP, Fail, check, metrics  # noqa: E402

ARGS = None
MAGIC = 20261127
STEPS = 30


def run(args, expect=0, env=None):
    return e2e_common.run(args, expect, env, timeout=110)


def tool(name):
    return os.path.join(ARGS.bin, name)


def work(name):
    return e2e_common.work_of(ARGS, name)


def model():
    return os.path.join(HERE, "mlp-images.hpd")


def read_images(path):
    """(header ints, [(label, pixel bytes)]) of an image file, checking its size."""
    raw = open(path, "rb").read()
    check(len(raw) >= 64, f"{path}: shorter than the header")
    h = struct.unpack("<16i", raw[:64])
    check(h[0] == MAGIC and h[1] == 1, f"{path}: magic/version {h[:2]}")
    check(all(x == 0 for x in h[7:]), f"{path}: reserved fields {h[7:]}")
    n, c, hh, w = h[2], h[3], h[4], h[5]
    rec = 1 + c * hh * w
    check(len(raw) == 64 + n * rec, f"{path}: {len(raw)} bytes, the header says {64 + n * rec}")
    return h, [(raw[64 + i * rec], raw[65 + i * rec:64 + (i + 1) * rec]) for i in range(n)]


def write_images(path, n, c, h, w, k, records, count=None, cut=0):
    """An image file from (label, pixels) records; count overrides the header's N, cut drops bytes."""
    body = b"".join(bytes([y]) + px for y, px in records)
    raw = struct.pack("<16i", MAGIC, 1, n if count is None else count, c, h, w, k, *([0] * 9)) + body
    with open(path, "wb") as f:
        f.write(raw[:len(raw) - cut])


def images(name="img", n=2000, seed=1, extra=()):
    """The glob of synthetic training images under WORK/data (made once)."""
    prefix = os.path.join(work("data"), name)
    if not os.path.exists(prefix + "_train_000000.img"):
        run([tool("hpdl-data"), "--synthetic-images", str(n), "--seed", str(seed), *extra, "-o", prefix])
    return prefix + "_train_*.img"


def compile_model(name, flags=(), src=None, expect=0):
    d = e2e_common.fresh_dir(ARGS.work, name)
    p = run([tool("hpdlc"), "compile", src or model(), *flags, "-o", d], expect=expect)
    return d, p


def train(art, tag, extra=(), env=None, expect=0, np_=None, data=None):
    """hpdlrun on the artifact (under mpirun -np np_ when given) and the images (the test model's
    by default); its metrics and the process."""
    m = os.path.join(ARGS.work, tag + ".jsonl")
    if os.path.exists(m):
        os.remove(m)
    cmd = [tool("hpdlrun"), art, "--data", data or images(), "--metrics", m, "--progress", "plain", *extra]
    if np_:
        e2e_common.need_mpi(ARGS.bin)
        cmd = ["mpirun", "--oversubscribe"] + (["--allow-run-as-root"] if os.geteuid() == 0 else []) + ["-np", str(np_)] + cmd
    p = run(cmd, env=env, expect=expect)
    return (metrics(m) if os.path.exists(m) else []), p


def same_losses(a, b, what, tol=1e-4):
    check(len(a) == len(b) and len(a) > 0, f"{what}: {len(a)} and {len(b)} steps")
    for x, y in zip(a, b):
        check(x["step"] == y["step"], f"{what}: steps {x['step']} and {y['step']}")
        check(abs(x["loss"] - y["loss"]) <= tol, f"{what}: step {x['step']} loss {x['loss']} vs {y['loss']}")


def one_error(p, *needles):
    """Exit 1 and exactly one error line on stderr, holding every needle."""
    lines = [ln for ln in p.stderr.splitlines() if "error" in ln]
    check(p.returncode == 1, f"exit status {p.returncode}: {p.stderr}")
    check(len(lines) == 1, f"one error line, got: {p.stderr}")
    for n in needles:
        check(n in lines[0], f"'{n}' not in: {lines[0]}")


# ---- cases -------------------------------------------------------------------

def case_data_tool():
    d = work("tool")
    prefix = os.path.join(d, "sub", "syn")
    p = run([tool("hpdl-data"), "--synthetic-images", "500", "--seed", "4", "--classes", "7", "--size", "1x12x10", "-o", prefix])
    check(f"wrote {prefix}_train_000000.img (450 images)" in p.stdout, p.stdout)
    check(f"wrote {prefix}_val_000000.img (50 images)" in p.stdout, p.stdout)
    check("450 train images in 1 file, 50 validation images in 1 file (1x12x10, 7 classes)" in p.stdout, p.stdout)
    h, recs = read_images(prefix + "_train_000000.img")
    check(h[:7] == (MAGIC, 1, 450, 1, 12, 10, 7), f"header {h[:7]}")
    check(all(y < 7 for y, _ in recs), "labels below 7")
    counts = [sum(1 for y, _ in recs if y == k) for k in range(7)]
    check(min(counts) > 30, f"every class present: {counts}")
    hv, _ = read_images(prefix + "_val_000000.img")
    check(hv[2] == 50, f"validation images {hv[2]}")
    # the class shows in the pixels: a class's mean grey level is its own
    means = [sum(sum(px) for y, px in recs if y == k) / (120.0 * counts[k]) for k in range(7)]
    check(all(means[k + 1] > means[k] + 5 for k in range(6)), f"class means rise with the class: {means}")
    # deterministic: the same bytes for the same seed, others for another
    first = open(prefix + "_train_000000.img", "rb").read()
    run([tool("hpdl-data"), "--synthetic-images", "500", "--seed", "4", "--classes", "7", "--size", "1x12x10", "-o", prefix])
    check(open(prefix + "_train_000000.img", "rb").read() == first, "the same seed gives the same file")
    other = os.path.join(d, "other")
    run([tool("hpdl-data"), "--synthetic-images", "500", "--seed", "5", "--classes", "7", "--size", "1x12x10", "-o", other])
    check(open(other + "_train_000000.img", "rb").read() != first, "another seed gives another file")
    # several files: --shard-images
    run([tool("hpdl-data"), "--synthetic-images", "100", "--shard-images", "40", "-o", os.path.join(d, "sh")])
    for i, n in enumerate([40, 40, 10]):
        hs, _ = read_images(os.path.join(d, "sh_train_%06d.img" % i))
        check(hs[2] == n and hs[3:7] == (3, 32, 32, 10), f"shard {i}: {hs[:7]}")
    # --info: the header and the images per class, counted here
    p = run([tool("hpdl-data"), "--info", prefix + "_train_000000.img"])
    want = (f"{prefix}_train_000000.img: image file version 1, 450 images of 1x12x10 (uint8, CHW), 7 classes; "
            f"images per class: {' '.join(map(str, counts))}")
    check(p.stdout.strip() == want, f"--info: {p.stdout!r}, want {want!r}")
    tok = os.path.join(d, "tok")
    run([tool("hpdl-data"), "--synthetic", "3000", "-o", tok])
    p = run([tool("hpdl-data"), "--info", tok + "_train_000000.bin"])
    check("version 1 (uint16 tokens), 2700 tokens" in p.stdout, p.stdout)
    # usage
    p = run([tool("hpdl-data"), "--help"])
    check("--synthetic-images N" in p.stdout and "--size CxHxW" in p.stdout and "--classes K" in p.stdout, p.stdout)
    for args, msg in [(["--synthetic-images", "10", "--size", "3x32", "-o", prefix], "--size wants CxHxW"),
                      (["--synthetic-images", "10", "--size", "3x0x4", "-o", prefix], "--size wants CxHxW"),
                      (["--synthetic-images", "10", "--classes", "1", "-o", prefix], "--classes is from 2 to 256"),
                      (["--synthetic-images", "10", "--classes", "300", "-o", prefix], "--classes is from 2 to 256"),
                      (["--synthetic-images", "10"], "--synthetic-images needs -o PREFIX"),
                      (["--synthetic-images", "10", "--synthetic", "10", "-o", prefix], "give one"),
                      (["--synthetic-images", "-3", "-o", prefix], "--synthetic-images wants a number >= 0")]:
        p = run([tool("hpdl-data"), *args], expect=2)
        check(msg in p.stderr, f"{args}: {p.stderr}")
    p = run([tool("hpdl-data"), "--synthetic-images", "0", "-o", prefix], expect=1)
    check("hpdl-data: error: 0 images leave none to train on" in p.stderr, p.stderr)


def case_bad_files():
    art, _ = compile_model("bad_art")
    d = work("bad")
    _, recs = read_images(images().replace("*", "000000"))
    recs = recs[:40]

    # a wrong magic: the file rewritten with another first int
    path = os.path.join(d, "magic.img")
    write_images(path, len(recs), 3, 32, 32, 10, recs)
    raw = bytearray(open(path, "rb").read())
    raw[0:4] = struct.pack("<i", 123)
    open(path, "wb").write(raw)
    p = run([tool("hpdlrun"), art, "--data", path, "--progress", "quiet"], expect=None)
    one_error(p, f"{path}: not an image file: magic 123 at byte 0, expected 20261127")
    # truncated: 40 announced, 26 whole (64 + 26 x 3073 = 79962 bytes) and a part of the 27th there
    path = os.path.join(d, "short.img")
    write_images(path, len(recs), 3, 32, 32, 10, recs, cut=122984 - 80000)
    p = run([tool("hpdlrun"), art, "--data", path, "--progress", "quiet"], expect=None)
    one_error(p, f"{path}: truncated: the header (byte 8) announces 40 images of 3073 bytes (a label byte and 3x32x32 "
                 "pixels), which end at byte 122984, but the file ends at byte 80000 (image 26, at byte 79962, is the first "
                 "missing one)")
    # a label out of range: met when read (mid-run), naming the image and its byte
    recs_bad = list(recs)
    recs_bad[37] = (12, recs[37][1])
    path = os.path.join(d, "label.img")
    write_images(path, len(recs_bad), 3, 32, 32, 10, recs_bad)
    # in file order, so that image 37 comes in step 2 (images 32-63)
    man = os.path.join(art, "manifest.json")
    text = open(man).read()
    check('"shuffle": true' in text, "the manifest says shuffle")
    open(man, "w").write(text.replace('"shuffle": true', '"shuffle": false'))
    p = run([tool("hpdlrun"), art, "--data", path, "--steps", "3", "--progress", "plain"], expect=None)
    open(man, "w").write(text)
    check("step 1/3" in p.stdout.replace("  ", " ") and "step 2/3" not in p.stdout.replace("  ", " "),
          f"step 1 trains, step 2 fails: {p.stdout}")
    check(p.returncode != 0, "a bad label fails the run")
    check(f"{path}: image 37 (its label at byte {64 + 37 * 3073}) has label 12, not below the 10 classes of the header (byte 24)"
          in p.stderr, p.stderr)
    # another shape than the model's
    small = os.path.join(d, "small.img")
    write_images(small, 3, 3, 16, 16, 10, [(1, bytes(768))] * 3)
    p = run([tool("hpdlrun"), art, "--data", small, "--progress", "quiet"], expect=None)
    one_error(p, f"{small}: images of 3x16x16 (C, H, W at bytes 12, 16, 20), but the model's input x is [B, 3, 32, 32]")
    # more classes than the model's logits
    many = os.path.join(d, "many.img")
    write_images(many, 3, 3, 32, 32, 20, [(15, bytes(3072))] * 3)
    p = run([tool("hpdlrun"), art, "--data", many, "--progress", "quiet"], expect=None)
    one_error(p, f"{many}: 20 classes (byte 24), more than the model's 10 (the last dimension of the logits its cross_entropy reads)")
    # a token shard for the image model
    tok = os.path.join(d, "tok")
    run([tool("hpdl-data"), "--synthetic", "5000", "-o", tok])
    p = run([tool("hpdlrun"), art, "--data", tok + "_train_000000.bin", "--progress", "quiet"], expect=None)
    one_error(p, f"{tok}_train_000000.bin: a token shard (magic 20240520 at byte 0), but the model takes images "
                 "(x: [B, 3, 32, 32]) with labels")
    p = run([tool("hpdlrun"), art, "--data", os.path.join(d, "none_*.img"), "--progress", "quiet"], expect=None)
    one_error(p, "none_*.img: no image file matches")


def case_compile_errors():
    d = work("models")
    base = open(model()).read()
    cases = [
        ("three", base.replace("input labels : i32[B]", "input labels : i32[B]\n  input extra : i32[B]"),
         "the runtime feeds token windows (two integer [B, T] inputs: the tokens and the targets) or labelled images (a float "
         "[B, C, H, W] input and an integer [B] input, the labels); the model takes 3 inputs"),
        ("float_labels", base.replace("input labels : i32[B]", "input labels : f32[B]").replace(
            "loss = cross_entropy(fc2(h), labels)", "d = sum(fc2(h), axis = -1) - labels\n    loss = mean(d * d)"),
         "the model's inputs are x: f32[8, 3, 32, 32] and labels: f32[8]"),
        ("labels_rank2", base.replace("input labels : i32[B]", "input labels : i32[B, 1]").replace(
            "cross_entropy(fc2(h), labels)", "cross_entropy(fc2(h), reshape(labels, [B]))"),
         "the runtime feeds labelled images: the integer input, the labels, must be i32[B] (B the micro batch, 8); it is "
         "labels: i32[8, 1]"),
        ("bf16_images", base.replace("input x : f32[B, C, H, W]", "input x : bf16[B, C, H, W]"),
         "the runtime feeds labelled images: the float input must be f32[B, ...] (B the micro batch, 8, then an image's "
         "dimensions, as f32[B, 3, 32, 32]); it is x: bf16[8, 3, 32, 32]"),
        ("rank1_images", base.replace("input x : f32[B, C, H, W]", "input x : f32[B]").replace(
            "reshape(x, [B, C * H * W])", "reshape(x, [B, 1])").replace("Linear(C * H * W, hidden)", "Linear(1, hidden)"),
         "it is x: f32[8]"),
    ]
    for name, src, msg in cases:
        path = os.path.join(d, name + ".hpd")
        open(path, "w").write(src)
        out = os.path.join(d, name + "_art")
        shutil.rmtree(out, ignore_errors=True)
        p = run([tool("hpdlc"), "compile", path, "-o", out], expect=None)
        check(p.returncode == 1, f"{name}: exit status {p.returncode}: {p.stderr}")
        check(msg in p.stderr, f"{name}: '{msg}' not in: {p.stderr}")
    art, _ = compile_model("manifest")
    man = json.load(open(os.path.join(art, "manifest.json")))
    check(man["inputs"] == {"kind": "images", "image": "x", "labels": "labels", "shape": [3, 32, 32], "classes": 10},
          f"manifest inputs {man['inputs']}")


def case_one_rank():
    art, _ = compile_model("one")
    m, p = train(art, "one")
    check(len(m) == STEPS, f"{len(m)} steps")
    check(abs(m[0]["loss"] - math.log(10)) < 0.05, f"step-1 loss {m[0]['loss']}, about ln 10")
    check(m[-1]["loss"] < 0.7 * m[0]["loss"], f"step {STEPS} loss {m[-1]['loss']} not below 0.7 x {m[0]['loss']}")
    check("32 images/step" in p.stdout and "(1800 images of 3x32x32, 10 classes)" in p.stdout, p.stdout)
    check(" img/s | " in p.stdout and "images/s" in p.stdout, p.stdout)
    check(all(r["images_per_s"] > 0 and r["images_per_s"] == r["tokens_per_s"] for r in m), "images_per_s in the metrics")
    ref, _ = train(art, "one_interp", env={"HPDL_EXECUTOR": "interp"})
    same_losses(ref, m, "the reference executor")


def case_dp2():
    one, _ = compile_model("dp1")
    two, _ = compile_model("dp2", ["--dp", "2"])
    m1, _ = train(one, "dp1")
    m2, p = train(two, "dp2", np_=2)
    check("2 ranks (dp=2" in p.stdout and p.stdout.count("hpdlrun: done") == 1, p.stdout)
    same_losses(m2, m1, "dp 2 against one rank")
    check(m1[-1]["loss"] < 0.7 * m1[0]["loss"], "the loss falls")
    # a checkpoint of step 15 at dp 2, resumed at dp 1
    ck = os.path.join(ARGS.work, "ck")
    shutil.rmtree(ck, ignore_errors=True)
    train(two, "dp2_half", ["--checkpoint-dir", ck, "--stop-at", "15"], np_=2)
    m3, _ = train(one, "dp1_resumed", ["--checkpoint-dir", ck, "--resume"])
    check([r["step"] for r in m3] == list(range(16, STEPS + 1)), f"resumed steps {[r['step'] for r in m3]}")
    same_losses(m3, m1[15:], "resumed at dp 1")


def case_resnet_tiny():
    src = os.path.join(HERE, "resnet-tiny.hpd")
    defs = ["-D", "size=6", "-D", "classes=5", "-D", "sync=true"]
    data = images("r6", n=600, seed=2, extra=["--size", "3x6x6", "--classes", "5"])
    runs = {}
    for tag, flags, np_ in [("one", ["--micro-batch", "8"], None), ("dp2", ["--dp", "2", "--micro-batch", "4"], 2),
                            ("pp2", ["--pp", "2", "--micro-batch", "8"], 2)]:
        art, _ = compile_model("resnet_" + tag, [*defs, *flags, "--global-batch", "8"], src=src)
        runs[tag], _ = train(art, "resnet_" + tag, ["--steps", "20"], np_=np_, data=data)
    one = runs["one"]
    check(len(one) == 20 and all(math.isfinite(r["loss"]) for r in one), "20 finite losses")
    check(sum(r["loss"] for r in one[-5:]) < sum(r["loss"] for r in one[:5]), f"the loss falls: {[r['loss'] for r in one]}")
    same_losses(runs["dp2"], one, "resnet dp 2 against one rank")
    same_losses(runs["pp2"], one, "resnet pp 2 against one rank")


def case_resnet18_pp():
    """samples/resnet18.hpd (width 4, the CIFAR stem, synchronised batch norm) over a pipeline:
    its stages repeat one block each, so the compiler cuts the forward where one activation
    crosses (pipeline.h). Under the fp64 reference executor pp 2 and dp 2 x pp 2 give the one
    rank's losses to every printed digit for 6 steps; the generated fp32 programs agree within
    1e-4 for 5 steps. (Further on, fp32 rounding moves a channel of layer4, whose 4x4 maps at
    width 4 are nearly constant, across ReLU's kink: any two fp32 programs part there, the one
    rank's against the fp64 reference too.)"""
    # the sample with a learning rate of 0.01 instead of 0.1, which parts two fp32 programs sooner
    text = open(os.path.join(ARGS.source, "samples", "resnet18.hpd")).read()
    check("lr = 0.1," in text, "samples/resnet18.hpd's optimizer changed: update this test")
    src = os.path.join(ARGS.work, "resnet18-lr.hpd")
    open(src, "w").write(text.replace("lr = 0.1,", "lr = 0.01,"))
    defs = ["-D", "width=4", "-D", "stem=cifar", "-D", "classes=5", "-D", "sync=true", "--global-batch", "8"]
    data = images("r32", n=400, seed=3, extra=["--size", "3x32x32", "--classes", "5"])
    # batch norm's statistics are a micro-batch's (over the data-parallel ranks): 8 images everywhere
    layouts = [("one", ["--micro-batch", "8"], None), ("pp2", ["--pp", "2", "--micro-batch", "8"], 2),
               ("dp2pp2", ["--dp", "2", "--pp", "2", "--micro-batch", "4"], 4)]
    for executor, steps, tol in [("interp", 6, 2e-8), ("native", 5, 1e-4)]:
        runs = {}
        for tag, flags, np_ in layouts:
            name = f"resnet18_{executor}_{tag}"
            art, p = compile_model(name, [*defs, *flags, "--executor", executor], src=src)
            if tag != "one":
                check("pieces" in p.stdout, f"no pieces in the compile summary: {p.stdout}")
                man = json.load(open(os.path.join(art, "manifest.json")))
                pieces = man["layout"].get("stage_pieces")
                check(pieces and len(pieces) == 2 and min(pieces) >= 1, f"stage_pieces {pieces}")
            runs[tag], _ = train(art, name, ["--steps", str(steps)], np_=np_, data=data)
        one = runs["one"]
        check(len(one) == steps and all(math.isfinite(r["loss"]) for r in one), f"{steps} finite losses")
        same_losses(runs["pp2"], one, f"resnet18 pp 2 against one rank ({executor})", tol)
        same_losses(runs["dp2pp2"], one, f"resnet18 dp 2 x pp 2 against one rank ({executor})", tol)


def case_profile():
    """hpdlrun --profile of samples/resnet18.hpd (width 8): the convolutions lead the op table
    (the field guide's profile: aten::conv2d first) and hold most of the kernels' time, and the
    peak memory is reported."""
    art, _ = compile_model("resnet18", ["-D", "width=8", "--micro-batch", "16", "--global-batch", "16"],
                           src=os.path.join(ARGS.source, "samples", "resnet18.hpd"))
    trace = os.path.join(ARGS.work, "resnet18.trace.json")
    m, p = train(art, "resnet18", ["--steps", "3", "--profile", trace])
    check(len(m) == 3 and all(math.isfinite(r["loss"]) for r in m), "3 finite losses")
    ops = [ln.split() for ln in p.stdout.splitlines() if ln.startswith("  program ") and ".k" in ln]
    check(ops and ops[0][1].endswith(".conv"), f"the first op is not a convolution: {ops[:3]}")
    peak = [ln.split() for ln in p.stdout.splitlines() if ln.startswith("  0 ") and "dp 0" in ln]
    check(peak and float(peak[0][-3]) > 1, f"no peak memory row: {p.stdout}")
    ev = json.load(open(trace))
    ev = ev["traceEvents"] if isinstance(ev, dict) else ev
    kern = [e for e in ev if e.get("ph") == "X" and ".k" in e.get("name", "")]
    conv = sum(e["dur"] for e in kern if e["name"].endswith(".conv"))
    share = conv / max(1, sum(e["dur"] for e in kern))
    print(f"convolutions {share:.0%} of the kernels' time; peak {peak[0][-3]} MiB")
    check(share > 0.5, f"convolutions only {share:.0%} of the kernels' time")


def ema_stats(groups, momentum=0.25):
    """running_mean, running_var after one update per group of images (each a list of
    [3][pixels] images as floats): PyTorch's rule, the variance unbiased."""
    rm, rv = [0.0] * 3, [1.0] * 3
    for g in groups:
        for c in range(3):
            v = [p for img in g for p in img[c]]
            mu = sum(v) / len(v)
            var = sum((p - mu) ** 2 for p in v) / (len(v) - 1)
            rm[c] = (1 - momentum) * rm[c] + momentum * mu
            rv[c] = (1 - momentum) * rv[c] + momentum * var
    return rm, rv


def case_running_stats():
    """Batch norm's running statistics (tests/vision/bn-stats.hpd: batch norm on the images,
    so the statistics are the images') in the step-3 checkpoint, against the average
    computed here from the image file: one rank (two micro-batches a step), dp 2 per rank
    (member 0's micro-batch, broadcast as DDP does) and dp 2 synchronised (the whole step's
    images); the statistics are not parameters (the count leaves them out)."""
    data = images("s8", n=200, seed=3, extra=["--size", "3x8x8"])
    _, recs = read_images(glob.glob(data)[0])
    imgs = [[[b / 255 - 0.5 for b in px[c * 64:(c + 1) * 64]] for c in range(3)] for _, px in recs]
    src = os.path.join(HERE, "bn-stats.hpd")
    p = run([tool("hpdlc"), "check", src])
    check("(1936)" in p.stdout, f"the parameters are the linear layer's and batch norm's weight and bias: {p.stdout}")
    cases = [("one", [], None, [imgs[4 * k:4 * k + 4] for k in range(6)]),
             ("dp2", ["--dp", "2"], 2, [[imgs[8 * s + 2 * b] for b in range(4)] for s in range(3)]),
             ("sync", ["--dp", "2", "-D", "sync=true"], 2, [imgs[8 * s:8 * s + 8] for s in range(3)])]
    for tag, flags, np_, groups in cases:
        art, _ = compile_model("bn_" + tag, flags, src=src)
        e2e_common.in_file_order(art)
        ck = os.path.join(ARGS.work, "ck_" + tag)
        shutil.rmtree(ck, ignore_errors=True)
        train(art, "bn_" + tag, ["--checkpoint-dir", ck, "--checkpoint-every", "3"], np_=np_, data=data)
        t = e2e_common.safetensors_f32(os.path.join(ck, "step-00000003.safetensors"))
        rm, rv = ema_stats(groups)
        for name, want in (("bn.running_mean", rm), ("bn.running_var", rv)):
            got = t[name]
            check(all(abs(a - b) <= 1e-5 * max(1.0, abs(b)) for a, b in zip(got, want)), f"{tag}: {name} {got}, expected {want}")
        print(f"{tag}: running_mean {[round(x, 6) for x in t['bn.running_mean']]}, "
              f"running_var {[round(x, 6) for x in t['bn.running_var']]}")


def bn_linear_loss(t, batch, labels, stats=None, eps=1e-5):
    """Mean cross-entropy of bn-stats.hpd on a batch of [3][64] images: batch norm with the
    running statistics of checkpoint t (stats None) or with the batch's own, then the linear layer."""
    if stats is None:
        stats = t["bn.running_mean"], t["bn.running_var"]
    mean, var = stats
    w, fb = t["fc.weight"], t["fc.b"]
    total = 0.0
    for img, y in zip(batch, labels):
        flat = [(img[c][i] - mean[c]) / math.sqrt(var[c] + eps) * t["bn.weight"][c] + t["bn.bias"][c]
                for c in range(3) for i in range(64)]
        logits = [sum(flat[i] * w[i * 10 + j] for i in range(192)) + fb[j] for j in range(10)]
        m = max(logits)
        total += m + math.log(sum(math.exp(z - m) for z in logits)) - logits[y]
    return total / len(batch)


def case_evaluation():
    """hpdlrun --eval-every: the validation loss in evaluation mode. bn-stats.hpd after 3 steps
    (checkpoint), then one step of validation data (two micro-batches of 4 images, file order):
    the loss computed here with the checkpoint's weights and batch norm's running statistics,
    within 1e-4, and not the loss with each micro-batch's own statistics (training mode); the
    evaluation leaves the statistics and weights as they were (a second run to step 3 without
    it writes the same checkpoint)."""
    data = images("s8", n=200, seed=3, extra=["--size", "3x8x8"])
    val = data.replace("_train_", "_val_")
    _, recs = read_images(glob.glob(val)[0])
    imgs = [[[b / 255 - 0.5 for b in px[c * 64:(c + 1) * 64]] for c in range(3)] for _, px in recs]
    labels = [y for y, _ in recs]
    art, _ = compile_model("bn_eval", [], src=os.path.join(HERE, "bn-stats.hpd"))
    ck, ck2 = os.path.join(ARGS.work, "ck_eval"), os.path.join(ARGS.work, "ck_noeval")
    for d in (ck, ck2):
        shutil.rmtree(d, ignore_errors=True)
    m, p = train(art, "bn_eval", ["--checkpoint-dir", ck, "--checkpoint-every", "3", "--eval-every", "3", "--eval-steps", "1"],
                 data=data)
    check("val loss" in p.stdout and "evaluation mode" in p.stdout, p.stdout)
    got = [r for r in m if "val_loss" in r]
    check([r["step"] for r in got] == [3], f"val_loss at steps {[r['step'] for r in got]}, expected [3]")
    t = e2e_common.safetensors_f32(os.path.join(ck, "step-00000003.safetensors"))
    want = (bn_linear_loss(t, imgs[0:4], labels[0:4]) + bn_linear_loss(t, imgs[4:8], labels[4:8])) / 2
    def own(g):
        flat = [[p for img in g for p in img[c]] for c in range(3)]
        mu = [sum(v) / len(v) for v in flat]
        return mu, [sum((p - mu[c]) ** 2 for p in flat[c]) / len(flat[c]) for c in range(3)]
    training = (bn_linear_loss(t, imgs[0:4], labels[0:4], own(imgs[0:4])) +
                bn_linear_loss(t, imgs[4:8], labels[4:8], own(imgs[4:8]))) / 2
    print(f"val_loss {got[0]['val_loss']:.6f}; with the running statistics {want:.6f}; with the batches' own {training:.6f}")
    check(abs(got[0]["val_loss"] - want) <= 1e-4 * max(1.0, abs(want)), f"val_loss {got[0]['val_loss']}, expected {want}")
    check(abs(training - want) > 1e-3, "the test cannot tell evaluation from training mode")
    train(art, "bn_noeval", ["--checkpoint-dir", ck2, "--checkpoint-every", "3"], data=data)
    check(e2e_common.safetensors_f32(os.path.join(ck2, "step-00000003.safetensors")) == t, "the evaluation changed the checkpoint")


def case_emulate():
    art = e2e_common.fresh_dir(ARGS.work, "cuda")
    p = run([tool("hpdlc"), "compile", model(), "--target", "cuda", "--emulate", "-o", art], expect=None)
    if p.returncode != 0:
        if "NVRTC not found" in p.stdout + p.stderr:
            print("skipped: no NVRTC to compile the CUDA artifact")
            sys.exit(SKIP)
        if "did not compile as C++" in p.stdout + p.stderr:
            print("skipped: no C++ compiler for the emulated kernels")
            sys.exit(SKIP)
        raise Fail(f"hpdlc compile --target cuda: {p.stderr}")
    cpu, _ = compile_model("cpu")
    mc, _ = train(cpu, "cpu")
    md, p = train(art, "device", ["--device", "emulate"])
    same_losses(md, mc, "the emulated device")


CASES = {n[5:]: f for n, f in globals().items() if n.startswith("case_")}


def main():
    global ARGS
    ARGS = e2e_common.case_args(CASES)
    try:
        sys.exit(e2e_common.run_case(CASES, ARGS.case))
    except subprocess.TimeoutExpired as e:
        print(f"FAIL {ARGS.case}: timed out: {e}")
        sys.exit(1)


if __name__ == "__main__":
    main()
