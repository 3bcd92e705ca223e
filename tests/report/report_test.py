#!/usr/bin/env python3
"""report_test.py - `hpdlc report` end to end (CTest: report.CASE).

    report_test.py --bin BUILD/bin --source REPO --work DIR [--replay replay_metrics] CASE

The metrics files are real: samples/gpt2-tiny.hpd compiled small (-D C=32 -D T=16 -D L=2
-D H=4) and trained by hpdlrun on generated text, 30 steps (a.jsonl, seed 1) and 40 steps
(b.jsonl, seed 7). The reports are read back with a parser (html.parser for the page,
xml.etree for the SVG), never with a regular expression over the text:

  charts      hpdlc report a.jsonl b.jsonl -o x.html and -o x.svg: 4 charts (loss, lr,
              grad_norm, tokens_per_s) of 2 series each named by their files, the legend,
              the axis titles, tick labels; every point of every line, mapped back through
              the axis (the linear map the tick labels and their positions define), is
              its record's step and value; the page needs nothing outside itself (no
              script, no link but the SVG namespace); the table counts 30 and 40 records.
  gaps        null values split a line: a file with nulls gives one polyline per run
              of values between them, and a lone value a dot.
  downsample  100,000 records with one spike: at most 4 points a pixel column, the
              first and last points exact, the spike drawn at its value.
  resume      a.jsonl's first 13 records, then b.jsonl's records from step 11 on (a run
              resumed from step 10's checkpoint): read as a resume, the later records
              win (steps 1-10 from a, 11-40 from b), a note on stderr, the table says so.
  cap         --max-records 35: a.jsonl whole, b.jsonl's first 5 records, a warning
              naming b.jsonl's line 6.
  errors      the golden malformed files of tests/report/errors/ (NAME.jsonl, NAME.err:
              the whole of stderr), exit 1, nothing written; a line longer than 64 KiB;
              a missing file; the errors of two bad files together, the good one silent.
  cli         bad command lines exit 2 with a message; --help; an unwritable output
              exits 1.
  screenshot  chromium --headless renders the page: both series' colours cover pixels
              of the picture (skipped without chromium).
  replay      replay_metrics (fuzz/fuzz_metrics.c without libFuzzer: the memory and
              file readers agree, the records keep the reader's promises, the drawing
              holds no nan or inf) over the golden files and a.jsonl, b.jsonl.
Exit 0 pass, 1 fail, 77 skip.
"""
import argparse
import html.parser
import math
import os
import re
import shutil
import struct
import subprocess
import sys
import xml.etree.ElementTree as ET
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
import e2e_common  # noqa: E402
from e2e_common import SKIP, Fail, check, metrics  # noqa: E402

ARGS = None
DEFS = ["-D", "C=32", "-D", "T=16", "-D", "L=2", "-D", "H=4"]
CHARTS = [("loss", "loss"), ("lr", "learning rate"), ("grad_norm", "gradient norm"), ("tokens_per_s", "tokens/s")]


def run(args, expect=0, cwd=None):
    return e2e_common.run(args, expect, None, cwd, timeout=120)


def tool(name):
    return os.path.join(ARGS.bin, name)


def hpdlc(*args, expect=0, cwd=None):
    return run([tool("hpdlc"), *args], expect=expect, cwd=cwd or ARGS.work)


def work(*parts):
    return os.path.join(ARGS.work, *parts)


def make_runs():
    """a.jsonl (30 steps) and b.jsonl (40 steps, another seed) in the work folder."""
    if os.path.exists(work("b.jsonl")):
        return
    data = work("d", "tiny")
    run([tool("hpdl-data"), "--synthetic", "300000", "--seed", "3", "-o", data])
    hpdlc("compile", os.path.join(ARGS.source, "samples", "gpt2-tiny.hpd"), *DEFS, "-q", "-o", work("art"))
    for name, steps, seed in (("a", 30, 1), ("b", 40, 7)):
        run([tool("hpdlrun"), work("art"), "--data", data + "_train_*.bin", "--steps", str(steps), "--seed", str(seed),
             "--metrics", work(name + ".jsonl"), "--checkpoint-dir", work("ck-" + name), "--progress", "quiet"])
    check(len(metrics(work("a.jsonl"))) == 30 and len(metrics(work("b.jsonl"))) == 40, "hpdlrun's metrics files")


# ---- the documents as trees --------------------------------------------------

class Node:
    def __init__(self, tag, attrs):
        self.tag, self.attrs, self.children, self.text = tag, attrs, [], ""

    def cls(self):
        return self.attrs.get("class", "").split()

    def walk(self):
        yield self
        for c in self.children:
            yield from c.walk()

    def find(self, tag=None, cls=None):
        return [n for n in self.walk() if (tag is None or n.tag == tag) and (cls is None or cls in n.cls())]


class HtmlTree(html.parser.HTMLParser):
    VOID = {"meta", "link", "br", "img", "input", "hr"}

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.root = Node("#root", {})
        self.stack = [self.root]

    def handle_starttag(self, tag, attrs):
        n = Node(tag, dict(attrs))
        self.stack[-1].children.append(n)
        if tag not in self.VOID:
            self.stack.append(n)

    def handle_startendtag(self, tag, attrs):
        self.stack[-1].children.append(Node(tag, dict(attrs)))

    def handle_endtag(self, tag):
        for i in range(len(self.stack) - 1, 0, -1):
            if self.stack[i].tag == tag:
                del self.stack[i:]
                return
        raise Fail(f"</{tag}> closes nothing")

    def handle_data(self, data):
        self.stack[-1].text += data


def parse_html(path):
    p = HtmlTree()
    p.feed(open(path, encoding="utf-8").read())
    p.close()
    check(len(p.stack) == 1, f"{path}: unclosed elements: {[n.tag for n in p.stack[1:]]}")
    return p.root


def parse_svg(path):
    def conv(e):
        n = Node(e.tag.split("}")[-1], dict(e.attrib))
        n.text = e.text or ""
        n.children = [conv(c) for c in e]
        return n
    return conv(ET.parse(path).getroot())


def number(label):
    """A tick label's value: 5.5, 0.0004, 300k, 1.5M, 1e-05."""
    m = re.fullmatch(r"(-?[0-9.]+(?:e[-+]?[0-9]+)?)([kMGT]?)", label.strip())
    check(m is not None, f"tick label {label!r} is not a number")
    return float(m.group(1)) * {"": 1, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}[m.group(2)]


def axis_map(chart, axis):
    """The linear map pixel -> value of an axis, from its tick labels and positions."""
    ticks = [(float(t.attrs["data-" + axis]), number(t.text)) for g in chart.find("g", axis) for t in g.find("text", "tick")]
    check(len(ticks) >= 2, f"chart {chart.attrs.get('data-metric')}: {len(ticks)} {axis} ticks")
    (p0, v0), (p1, v1) = ticks[0], ticks[-1]
    scale = (v1 - v0) / (p1 - p0)
    for p, v in ticks:  # the ticks lie on one line: evenly placed, the labels right
        check(abs(v0 + (p - p0) * scale - v) <= 0.015 * abs(scale),  # positions are printed to 0.01 px
              f"{axis} tick {v} at {p} is off the axis's line")
    return lambda p: v0 + (p - p0) * scale, abs(v1 - v0) / abs(p1 - p0)


def points(series):
    """[(x, y), ...] of each polyline, in order; a dot is a line of one point."""
    lines = []
    for n in series.walk():
        if n.tag == "polyline":
            lines.append([tuple(map(float, xy.split(","))) for xy in n.attrs["points"].split()])
        elif n.tag == "circle":
            pt = (float(n.attrs["cx"]), float(n.attrs["cy"]))
            check(lines and lines[-1] == [pt], "a dot that is not a lone point")
    return lines


def check_report(root, files, what):
    """The checks of both formats: charts, series, axes, legend, every point."""
    rows = {f: metrics(work(f)) for f in files}
    charts = root.find("svg", "chart")
    check([c.attrs.get("data-metric") for c in charts] == [m for m, _ in CHARTS],
          f"{what}: charts {[c.attrs.get('data-metric') for c in charts]}")
    legend = [t.text for t in root.find("text", "legend-name")]
    check(legend == files, f"{what}: legend {legend}")
    for chart, (metric, ylabel) in zip(charts, CHARTS):
        xl = [t.text for t in chart.find("text", "axis-label") if "x" in t.cls()]
        yl = [t.text for t in chart.find("text", "axis-label") if "y" in t.cls()]
        check(xl == ["step"] and yl == [ylabel], f"{what}: {metric}: axis titles {xl} {yl}")
        check(chart.find("text", "chart-title"), f"{what}: {metric}: no title")
        series = chart.find("g", "series")
        check([s.attrs.get("data-file") for s in series] == files, f"{what}: {metric}: series {[s.attrs.get('data-file') for s in series]}")
        fx, per_px_x = axis_map(chart, "x")
        fy, per_px = axis_map(chart, "y")
        for s, f in zip(series, files):
            pts = [p for line in points(s) for p in line]
            want = [(r["step"], r[metric]) for r in rows[f] if r[metric] is not None]
            check(len(pts) == len(want), f"{what}: {metric} of {f}: {len(pts)} points for {len(want)} records")
            for (x, y), (step, v) in zip(pts, want):
                check(abs(fx(x) - step) <= per_px_x * 0.02, f"{what}: {metric} of {f}: a point at step {fx(x)}, not {step}")
                # (coordinates are printed to 0.01 px: 0.02 px covers the rounding of a point and of the ticks)
                check(abs(fy(y) - v) <= per_px * 0.02, f"{what}: {metric} of {f} at step {step}: {fy(y)}, not {v}")
            print(f"{what}: {metric} of {f}: {len(pts)} points, first {fy(pts[0][1]):.6g} (file {want[0][1]:.6g}), "
                  f"last {fy(pts[-1][1]):.6g} (file {want[-1][1]:.6g})")
    return charts


def self_contained(path):
    text = open(path, encoding="utf-8").read()
    check("<script" not in text.lower(), f"{path}: a script")
    links = set(re.findall(r"https?://[^\s\"'<>)]*", text))
    check(links <= {"http://www.w3.org/2000/svg"}, f"{path}: links outside the file: {links}")


def case_charts():
    make_runs()
    p = hpdlc("report", "a.jsonl", "b.jsonl", "-o", "x.html")
    check("x.html: 4 charts of 2 runs, 70 records" in p.stdout, p.stdout)
    hpdlc("report", "a.jsonl", "b.jsonl", "-o", "x.svg", "-q")
    page = parse_html(work("x.html"))
    check_report(page, ["a.jsonl", "b.jsonl"], "html")
    table = page.find("table", "summary")[0]
    counts = [tr.find("td")[1].text for tr in table.find("tr")[1:]]
    check(counts == ["30", "40"], f"the table's records: {counts}")
    self_contained(work("x.html"))
    check_report(parse_svg(work("x.svg")), ["a.jsonl", "b.jsonl"], "svg")
    self_contained(work("x.svg"))


def write_rows(path, rows):
    with open(path, "w") as f:
        for step, loss in rows:
            f.write('{"step": %d, "loss": %s, "lr": 0.001, "grad_norm": 1.5, "tokens_per_s": 1000}\n'
                    % (step, "null" if loss is None else repr(loss)))


def case_gaps():
    write_rows(work("g.jsonl"), [(1, 5.0), (2, 4.8), (3, None), (4, 4.5), (5, None), (6, None), (7, 4.1), (8, 4.0), (9, 3.9)])
    hpdlc("report", "g.jsonl", "-o", "g.svg")
    chart = parse_svg(work("g.svg")).find("svg", "chart")[0]
    lines = points(chart.find("g", "series")[0])
    check([len(l) for l in lines] == [2, 1, 3], f"null-separated lines of {[len(l) for l in lines]} points, not [2, 1, 3]")
    check(len(chart.find("circle")) == 1, "the lone value at step 4 is not a dot")
    fy, per_px = axis_map(chart, "y")
    check(abs(fy(lines[1][0][1]) - 4.5) <= per_px * 0.02, "the lone value's height")


def case_downsample():
    n = 100000
    rows = [(i, 2.0 + math.sin(i / 5000.0)) for i in range(1, n + 1)]
    rows[61234] = (61235, 9.75)  # one spike
    write_rows(work("big.jsonl"), rows)
    p = hpdlc("report", "big.jsonl", "-o", "big.svg")
    check("100000 records" in p.stdout, p.stdout)
    chart = parse_svg(work("big.svg")).find("svg", "chart")[0]
    pts = [q for line in points(chart.find("g", "series")[0]) for q in line]
    fx, per_px_x = axis_map(chart, "x")
    fy, per_px = axis_map(chart, "y")
    columns = {}
    for x, _y in pts:
        columns[math.floor(x)] = columns.get(math.floor(x), 0) + 1
    print(f"downsample: {n} records drawn as {len(pts)} points in {len(columns)} pixel columns")
    check(len(pts) < n / 20 and max(columns.values()) <= 5, f"{len(pts)} points, {max(columns.values())} in one column")
    check(abs(fx(pts[0][0]) - 1) <= per_px_x * 0.02 and abs(fy(pts[0][1]) - rows[0][1]) <= per_px * 0.02, "the first point")
    check(abs(fx(pts[-1][0]) - n) <= per_px_x * 0.02 and abs(fy(pts[-1][1]) - rows[-1][1]) <= per_px * 0.02, "the last point")
    top = min(pts, key=lambda q: q[1])
    check(abs(fy(top[1]) - 9.75) <= per_px * 0.02 and abs(fx(top[0]) - 61235) <= per_px_x * 0.02,
          f"the spike: drawn at step {fx(top[0])}, value {fy(top[1])}")
    # the table is not thinned: the lowest loss of all records
    hpdlc("report", "big.jsonl", "-o", "big.html", "-q")
    tds = parse_html(work("big.html")).find("table", "summary")[0].find("tr")[1].find("td")
    check(tds[1].text == str(n), f"the table counts {tds[1].text} records")


def case_resume():
    make_runs()
    a = open(work("a.jsonl")).read().splitlines(True)
    b = open(work("b.jsonl")).read().splitlines(True)
    with open(work("r.jsonl"), "w") as f:
        f.writelines(a[:13] + b[10:])
    p = hpdlc("report", "r.jsonl", "-o", "r.html")
    note = ("r.jsonl:14: note: the step goes back (1 time in the file): read as a resumed run; "
            "3 earlier records replaced by the later ones of the same steps")
    check(note in p.stderr, p.stderr)
    ra, rb = metrics(work("a.jsonl")), metrics(work("b.jsonl"))
    with open(work("r_expect.jsonl"), "w") as f:  # what the report must show: a's 1-10, then b's 11-40
        f.writelines(a[:10] + b[10:])
    page = parse_html(work("r.html"))
    chart = page.find("svg", "chart")[0]
    fy, per_px = axis_map(chart, "y")
    pts = [q for line in points(chart.find("g", "series")[0]) for q in line]
    want = [r["loss"] for r in ra[:10]] + [r["loss"] for r in rb[10:]]
    check(len(pts) == 40, f"{len(pts)} points, not 40")
    for (_, y), v in zip(pts, want):
        check(abs(fy(y) - v) <= per_px * 0.02, f"loss {fy(y)} drawn, the later record says {v}")
    notes = page.find("table", "summary")[0].find("tr")[1].find("td")[-1].text
    check(notes == "1 resume, 3 records replaced", f"the table's notes: {notes!r}")


def case_cap():
    make_runs()
    p = hpdlc("report", "a.jsonl", "b.jsonl", "--max-records", "35", "-o", "c.svg")
    check("b.jsonl:6: warning: --max-records 35 reached: the records from this line on are left out" in p.stderr, p.stderr)
    charts = parse_svg(work("c.svg")).find("svg", "chart")
    got = [sum(len(line) for line in points(s)) for s in charts[0].find("g", "series")]
    check(got == [30, 5], f"points per series {got}, not [30, 5]")
    p = hpdlc("report", "a.jsonl", "b.jsonl", "--max-records", "30", "-o", "c.svg", expect=1)
    check("hpdlc: report: b.jsonl: not read: --max-records 30 reached in the files before it" in p.stderr, p.stderr)


def case_errors():
    d = os.path.join(HERE, "errors")
    names = sorted(f[:-6] for f in os.listdir(d) if f.endswith(".jsonl"))
    check(len(names) >= 14, f"{len(names)} golden files")
    out = work("bad.html")
    for name in names:
        p = run([tool("hpdlc"), "report", name + ".jsonl", "-o", out], expect=1, cwd=d)
        want = open(os.path.join(d, name + ".err")).read()
        check(p.stderr == want, f"{name}: stderr\n{p.stderr}\nnot\n{want}")
        check(not os.path.exists(out), f"{name}: an output was written")
        print(f"errors: {p.stderr.strip()}")
    rec = '{"step": 1, "loss": 5.5, "lr": 0.001, "grad_norm": 1.5, "tokens_per_s": 1000}\n'
    with open(work("long.jsonl"), "w") as f:
        f.write(rec + '{"step": 2, "note": "' + "x" * 70000 + '"}\n' + rec)
    p = hpdlc("report", "long.jsonl", "-o", out, expect=1)
    check(p.stderr == "long.jsonl:2: error: a line of more than 65536 bytes: not a metrics record\n", p.stderr)
    p = hpdlc("report", "nope.jsonl", "-o", out, expect=1)
    check(p.stderr == "nope.jsonl: error: cannot open: No such file or directory\n", p.stderr)
    with open(work("good.jsonl"), "w") as f:
        f.write(rec)
    p = run([tool("hpdlc"), "report", os.path.join(d, "nan.jsonl"), work("good.jsonl"),
             os.path.join(d, "step_zero.jsonl"), "-o", out], expect=1, cwd=d)
    want = (os.path.join(d, "nan.jsonl") + open(os.path.join(d, "nan.err")).read()[len("nan.jsonl"):] +
            os.path.join(d, "step_zero.jsonl") + open(os.path.join(d, "step_zero.err")).read()[len("step_zero.jsonl"):])
    check(p.stderr == want, f"two bad files and a good one:\n{p.stderr}")
    check(not os.path.exists(out), "an output was written")


def case_cli():
    make_runs()
    bad = [
        ([], "no metrics file"),
        (["a.jsonl"], "no output: -o FILE.html or -o FILE.svg"),
        (["a.jsonl", "-o"], "-o needs a file name"),
        (["a.jsonl", "-o", "x.pdf"], "x.pdf: the kind of report is unknown"),
        (["a.jsonl", "-o", "x.pdf", "--format", "pdf"], "--format takes html or svg, not 'pdf'"),
        (["a.jsonl", "-o", "x.html", "--bogus"], "unknown option '--bogus'"),
        (["a.jsonl", "-o", "x.html", "--max-records", "0"], "--max-records takes a count from 1, not '0'"),
        (["a.jsonl", "-o", "x.html", "--max-records", "-3"], "--max-records takes a count from 1, not '-3'"),
        (["a.jsonl", "-o", "x.html", "--max-records"], "--max-records needs a value"),
        (["a.jsonl", "-o", "x.html", "--title"], "--title needs a value"),
        (["a.jsonl", "-o", "x.html", "--title", "--format", "svg"], "--title needs a value"),
        (["a.jsonl", "-o", "x.html", "--max-records", "--title", "t"], "--max-records needs a value"),
        (["a.jsonl"] * 65 + ["-o", "x.html"], "at most 64 metrics files"),
    ]
    for args, msg in bad:
        p = hpdlc("report", *args, expect=2)
        check(p.stderr.startswith("hpdlc: report: ") and msg in p.stderr, f"report {args[:4]}: {p.stderr}")
    p = hpdlc("report", "--help")
    check(p.stdout.startswith("usage: hpdlc report METRICS.jsonl") and "--max-records" in p.stdout, p.stdout)
    check("report METRICS.jsonl" in hpdlc("--help").stdout, "hpdlc --help lists report")
    check("did you mean 'report'" in hpdlc("reportt", expect=2).stderr, "a misspelt verb")
    p = hpdlc("report", "a.jsonl", "-o", "/nonexistent-dir/x.html", expect=1)
    check("hpdlc: report: /nonexistent-dir/x.html: cannot write: No such file or directory" in p.stderr, p.stderr)
    # --format over the extension, --title, --output=
    hpdlc("report", "a.jsonl", "--output=t.out", "--format", "svg", "--title", "gpt2 <tiny> & co")
    root = parse_svg(work("t.out"))
    check(root.find("text", "report-title")[0].text == "gpt2 <tiny> & co", "the title")


def png_pixels(path):
    """(width, height, rows of (r, g, b)) of an 8-bit RGB or RGBA PNG, not interlaced."""
    data = open(path, "rb").read()
    check(data[:8] == b"\x89PNG\r\n\x1a\n", f"{path}: not a PNG")
    pos, idat, w = 8, b"", None
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            w, h, depth, ctype, _, _, interlace = struct.unpack(">IIBBBBB", body)
            check(depth == 8 and ctype in (2, 6) and interlace == 0, f"PNG kind {depth} {ctype} {interlace}")
            bpp = 3 if ctype == 2 else 4
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    raw, stride, rows, prev = zlib.decompress(idat), w * bpp, [], bytearray(w * bpp)
    for y in range(h):
        f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                pa, pb, pc = abs(b - c), abs(a - c), abs(a + b - 2 * c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append([tuple(line[x * bpp:x * bpp + 3]) for x in range(w)])
        prev = line
    return w, h, rows


def case_screenshot():
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if not chromium:
        print("skipped: no chromium (scripts/setup.sh installs it where apt has it)")
        sys.exit(SKIP)
    make_runs()
    hpdlc("report", "a.jsonl", "b.jsonl", "-o", "s.html", "-q")
    shot = work("s.png")
    if os.path.exists(shot):
        os.remove(shot)
    run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
         "--user-data-dir=" + work("chromium-profile"), "--screenshot=" + shot, "--window-size=1500,1400",
         "file://" + work("s.html")])
    w, h, rows = png_pixels(shot)
    near = lambda p, q: all(abs(a - b) <= 40 for a, b in zip(p, q))  # noqa: E731 (anti-aliased lines)
    blue, orange, ink = (0x1F, 0x77, 0xB4), (0xFF, 0x7F, 0x0E), 0
    nb = no = 0
    for row in rows:
        for p in row:
            if p != (255, 255, 255):
                ink += 1
            nb += near(p, blue)
            no += near(p, orange)
    print(f"screenshot: {w}x{h}, {ink} pixels not white, {nb} of a.jsonl's colour, {no} of b.jsonl's")
    check(ink > w * h // 50, "the page is (almost) blank")
    check(nb > 500 and no > 500, "a series' lines are missing from the picture")


def case_replay():
    if not ARGS.replay:
        raise Fail("--replay replay_metrics is needed")
    make_runs()
    d = os.path.join(HERE, "errors")
    golden = sorted(os.path.join(d, f) for f in os.listdir(d) if f.endswith(".jsonl"))
    p = run([ARGS.replay, *golden, work("a.jsonl"), work("b.jsonl")])
    check("FAILED" not in p.stdout and f"replay: {len(golden) + 2} inputs, ok" in p.stdout, p.stdout[-2000:])
    check("30 records, steps 1-30" in p.stdout and "40 records, steps 1-40" in p.stdout, p.stdout[-2000:])


def main():
    global ARGS
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--source", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--replay")
    ap.add_argument("case")
    ARGS = ap.parse_args()
    shutil.rmtree(ARGS.work, ignore_errors=True)
    os.makedirs(ARGS.work)
    cases = {k[5:]: v for k, v in globals().items() if k.startswith("case_")}
    if ARGS.case not in cases:
        print(f"unknown case {ARGS.case}; cases: {' '.join(cases)}")
        return 2
    return e2e_common.run_case(cases, ARGS.case)


if __name__ == "__main__":
    sys.exit(main())
