#!/usr/bin/env python3
"""check_html.py - the HTML report of `hpdlc plan` (docs/planner.md sec. 15.1).

    check_html.py HPDLC SOURCE_DIR WORKDIR             (CTest plan.html)
    check_html.py --screenshot HPDLC SOURCE_DIR WORKDIR (CTest plan.html_screenshot)

plan.html writes the report of samples/gpt2.hpd at dp=2 pp=4 (micro batch 32,
so 8 micro-batches) with --search --top 5 and --scaling 8,16,32,64, and the
same command's --format json, and checks:
  - the page is well formed (every opened tag closed, in order) and
    self-contained (no <script>, <link>, <iframe>, no http in src / href);
  - the header names the model, the cluster, the layout, the limit, fits;
  - #memory-chart: one bar per pipeline rank; each part's labelled GiB value
    equals the JSON's stages[rank].memory (and the fullest rank's equals
    memory_per_gpu) within the label's rounding; the capacity line's label
    equals memory_per_gpu.capacity;
  - #time-chart: its parts add up to time.step_s; the table's step row is it;
  - #timeline: pp rows, per row a forward and a backward box of every
    micro-batch (2 x num_micro_batches), labels, ticks in ms;
  - the folded text report equals --format text of the same command;
  - #search: --top rows, the first (only) the winner, step times as the JSON;
  - #scaling-chart: one strong and one weak point per GPU count with the
    JSON's speed-ups, the ideal line, the Amdahl and Gustafson fits, axes;
and for gpt2.hpd as the sample says (pp = 1): the pipeline note instead of a
timeline, one memory bar, no search table or scaling chart.

--screenshot renders the first page with chromium (or chromium-browser)
headless and checks the PNG is not blank (pixels differing from the
background, decoded with zlib here); exit 77 (skipped) without chromium.
"""
import html.parser
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import zlib

VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}
GIB = 1024.0**3
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL: " + what)
    return cond


class Node:
    def __init__(self, tag, attrs, parent):
        self.tag, self.attrs, self.parent = tag, dict(attrs), parent
        self.children, self.text = [], []

    def classes(self):
        return (self.attrs.get("class") or "").split()

    def all_text(self):
        return "".join(self.text + [c.all_text() for c in self.children])

    def walk(self):
        yield self
        for c in self.children:
            yield from c.walk()

    def find(self, tag=None, cls=None, id=None):
        return [
            n
            for n in self.walk()
            if (tag is None or n.tag == tag) and (cls is None or cls in n.classes()) and (id is None or n.attrs.get("id") == id)
        ]


class Parser(html.parser.HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.root = Node("#root", [], None)
        self.cur = self.root
        self.errors = []
        self.urls = []

    def _attrs(self, tag, attrs):
        for k, v in attrs:
            if k in ("src", "href", "xlink:href", "action") and v and "http" in v:
                self.urls.append(f"<{tag} {k}={v}>")
        if tag in ("script", "link", "iframe", "object", "embed", "img"):
            self.errors.append(f"<{tag}> in a self-contained page")

    def handle_starttag(self, tag, attrs):
        self._attrs(tag, attrs)
        n = Node(tag, attrs, self.cur)
        self.cur.children.append(n)
        if tag not in VOID:
            self.cur = n

    def handle_startendtag(self, tag, attrs):
        self._attrs(tag, attrs)
        self.cur.children.append(Node(tag, attrs, self.cur))

    def handle_endtag(self, tag):
        if tag in VOID:
            return
        if self.cur.tag != tag:
            self.errors.append(f"</{tag}> closes <{self.cur.tag}>")
            # recover: close up to the matching tag if any
            n = self.cur
            while n is not None and n.tag != tag:
                n = n.parent
            if n is not None:
                self.cur = n.parent
            return
        self.cur = self.cur.parent

    def handle_data(self, data):
        self.cur.text.append(data)


def parse(path):
    p = Parser()
    with open(path, encoding="utf-8") as f:
        p.feed(f.read())
    p.close()
    check(not p.errors, f"{path}: well formed: {p.errors[:5]}")
    check(p.cur is p.root, f"{path}: unclosed tags at the end: <{p.cur.tag}>")
    check(not p.urls, f"{path}: external URLs: {p.urls[:5]}")
    return p.root


def run(hpdlc, src, args, out):
    r = subprocess.run([hpdlc, "plan"] + args + ["-o", out], cwd=src, capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        print(r.stdout, r.stderr)
        sys.exit(f"hpdlc plan {' '.join(args)} exited {r.returncode}")


def gib_of(text):
    m = re.search(r"([0-9]+(?:\.[0-9]+)?) GiB", text)
    return float(m.group(1)) if m else None


def ms_of(text):
    m = re.search(r"([0-9]+(?:\.[0-9]+)?) ms", text)
    return float(m.group(1)) if m else None


def check_memory(root, js):
    svg = root.find("svg", id="memory-chart")
    if not check(len(svg) == 1, "one #memory-chart"):
        return
    svg = svg[0]
    ranks = svg.find("g", cls="mem-rank")
    stages = js.get("stages") or [{"rank": 0, "memory": js["memory_per_gpu"]}]
    check(len(ranks) == len(stages), f"memory bars: {len(ranks)} ranks, JSON {len(stages)}")
    parts = {
        "weights": lambda m: m["params"],
        "gradients": lambda m: m["grads"],
        "optimizer": lambda m: m["optimizer"],
        "activations": lambda m: m["activations"],
        "rest": lambda m: m["temporaries"] + m["comm_buffers"] + m["workspace"],
    }
    worst = js["memory_per_gpu"]["pipeline_rank"]
    compared = 0
    for g in ranks:
        rank = int(g.attrs["data-rank"])
        mem = stages[rank]["memory"]
        vals = {t.attrs["data-part"]: gib_of(t.all_text()) for t in g.find("text", cls="mem-val")}
        check(set(vals) == set(parts), f"rank {rank}: labelled parts {sorted(vals)}")
        check(len(g.find("rect", cls="mem-seg")) == 5, f"rank {rank}: 5 stacked segments")
        for name, get in parts.items():
            v = vals.get(name)
            want = get(mem) / GIB
            if check(v is not None, f"rank {rank} {name}: a GiB label"):
                check(abs(v - want) <= 0.0051, f"rank {rank} {name}: label {v} GiB, JSON {want:.4f} GiB")
                compared += 1
            if rank == worst:
                check(abs(get(mem) - get(js["memory_per_gpu"])) < 1, f"rank {rank} is memory_per_gpu ({name})")
                if v is not None:
                    check(abs(v - get(js["memory_per_gpu"]) / GIB) <= 0.0051, f"memory_per_gpu {name} vs the fullest bar")
        tot = g.find("text", cls="mem-total")
        if check(len(tot) == 1, f"rank {rank}: a total label"):
            check(abs(gib_of(tot[0].all_text()) - mem["total"] / GIB) <= 0.0051, f"rank {rank}: total label")
    cap = svg.find("text", cls="cap-label")
    if check(len(cap) == 1 and len(svg.find("line", cls="cap")) == 1, "a capacity line and its label"):
        check(abs(gib_of(cap[0].all_text()) - js["memory_per_gpu"]["capacity"] / GIB) <= 0.0051, "capacity label")
    check(any("GiB" in t.all_text() for t in svg.find("text", cls="axis")), "memory axis labelled in GiB")
    check(len(svg.find("text", cls="tick")) >= 3, "memory axis ticks")
    print(f"memory: {len(ranks)} ranks, {compared} labelled values match the JSON")


def check_time(root, js):
    svg = root.find("svg", id="time-chart")
    if not check(len(svg) == 1, "one #time-chart"):
        return
    segs = svg[0].find("rect", cls="time-seg")
    total = sum(float(s.attrs["data-seconds"]) for s in segs)
    step = js["time"]["step_s"]
    check(abs(total - step) <= 1e-6 + 1e-3 * step, f"time parts add up to {total}, step {step}")
    names = [s.attrs["data-part"] for s in segs]
    check("compute: GEMM" in names and "compute: memory-bound" in names and "optimizer step" in names, f"time parts {names}")
    if js["parallel"]["pp"] > 1:
        check("pipeline bubble" in names, "a bubble part with pp > 1")
    table = root.find("table", id="time-table")
    if check(len(table) == 1, "the time table"):
        rows = table[0].find("tr")
        step_row = [r for r in rows if "total" in r.classes()]
        if check(len(step_row) == 1, "a step row"):
            v = ms_of(step_row[0].all_text())
            check(v is not None and abs(v - step * 1e3) <= 0.051 * max(1, step * 1e3 / 100), f"step row {v} ms vs {step * 1e3}")
        check(all("%" in r.all_text() for r in rows[1:]), "every part with a share in %")
    print(f"time: {len(segs)} parts, step {step * 1e3:.1f} ms")


def check_timeline(root, js):
    pp = js["parallel"]["pp"]
    m = js["parallel"]["num_micro_batches"]
    v = js["parallel"]["virtual_stages"]
    svg = root.find("svg", id="timeline")
    if pp == 1:
        check(not svg, "no timeline with pp = 1")
        check(len(root.find(id="timeline-note")) == 1, "the pp = 1 note")
        print("timeline: pp = 1, the note")
        return
    if not check(len(svg) == 1, "one #timeline"):
        return
    svg = svg[0]
    fwd, bwd = svg.find("rect", cls="tl-fwd"), svg.find("rect", cls="tl-bwd")
    rows = sorted({int(r.attrs["data-rank"]) for r in fwd + bwd})
    check(rows == list(range(pp)), f"timeline rows {rows}, pp {pp}")
    for rk in range(pp):
        f = [r for r in fwd if int(r.attrs["data-rank"]) == rk]
        b = [r for r in bwd if int(r.attrs["data-rank"]) == rk]
        check(len(f) + len(b) == 2 * m * v, f"rank {rk}: {len(f) + len(b)} boxes, want 2 x {m} x {v}")
        check(sorted(int(r.attrs["data-mb"]) for r in f) == sorted(list(range(1, m + 1)) * v), f"rank {rk}: forwards 1..{m}")
        check(sorted(int(r.attrs["data-mb"]) for r in b) == sorted(list(range(1, m + 1)) * v), f"rank {rk}: backwards 1..{m}")
    labels = svg.find("text", cls="tl-label")
    check(len(labels) > 0 and all(t.all_text().strip().isdigit() for t in labels), "boxes labelled with micro-batch numbers")
    check(any("ms" in t.all_text() for t in svg.find("text", cls="axis")), "time axis in ms")
    check(len(svg.find("text", cls="tick")) >= 3, "time axis ticks")
    print(f"timeline: {pp} rows x {2 * m * v} boxes, {len(labels)} labels")


def check_text(root, hpdlc, src, args, work):
    """the folded text report is --format text of the same command"""
    txt = os.path.join(work, "plan.txt")
    run(hpdlc, src, args + ["--format", "text"], txt)
    pre = root.find(id="text-report")
    pre = pre[0].find("pre") if pre else []
    check(len(pre) == 1 and pre[0].all_text() == open(txt).read(), "the folded text report is --format text")


def check_search(root, js, top):
    table = root.find("table", id="search")
    if not check(len(table) == 1, "the search table"):
        return
    rows = table[0].find("tbody")[0].find("tr")
    want = js["search"]["top"]
    check(len(rows) == top and len(want) == top, f"search rows {len(rows)}, JSON {len(want)}, --top {top}")
    check(["winner" in r.classes() for r in rows] == [i == 0 for i in range(len(rows))], "the first row (only) the winner")
    for r, w in zip(rows, want):
        cells = [c.all_text() for c in r.find("td")]
        check(len(cells) == 8, f"search row: 8 cells, got {len(cells)}")
        v = ms_of(cells[2])
        check(v is not None and abs(v - w["time"]["step_s"] * 1e3) <= 0.051, f"search step {v} vs {w['time']['step_s']}")
        check(cells[5].strip() == "%.1f%%" % (w["throughput"]["mfu"] * 100), f"search MFU {cells[5]}")
        check(gib_of(cells[6]) is not None, "search memory in GiB")
    print(f"search: {len(rows)} rows")


def check_scaling(root, js, counts):
    svg = root.find("svg", id="scaling-chart")
    if not check(len(svg) == 1, "one #scaling-chart"):
        return
    svg = svg[0]
    strong = {int(c.attrs["data-gpus"]): float(c.attrs["data-speedup"]) for c in svg.find("circle", cls="pt-strong")}
    weak = {int(c.attrs["data-gpus"]): float(c.attrs["data-speedup"]) for c in svg.find("rect", cls="pt-weak")}
    check(len(svg.find("circle", cls="pt-strong")) == len(counts), "one strong point per GPU count")
    check(sorted(strong) == counts and sorted(weak) == counts, f"points at {sorted(strong)} / {sorted(weak)}, want {counts}")
    for p in js["scaling"]["strong"]:
        check(abs(strong.get(p["gpus"], -1) - p["speedup"]) < 1e-3, f"strong speed-up at {p['gpus']}")
    for p in js["scaling"]["weak"]:
        check(abs(weak.get(p["gpus"], -1) - p["scaled_speedup"]) < 1e-3, f"weak speed-up at {p['gpus']}")
    for cls in ("ideal", "fit-amdahl", "fit-gustafson", "strong-line", "weak-line"):
        pl = svg.find("polyline", cls=cls)
        check(len(pl) == 1 and len(pl[0].attrs.get("points", "").split()) >= 2, f"the {cls} line")
    axes = " ".join(t.all_text() for t in svg.find("text", cls="axis"))
    check("GPUs" in axes and "speed-up" in axes, f"axis labels: {axes}")
    ticks = [t.all_text() for t in svg.find("text", cls="tick")]
    check(all(str(c) in ticks for c in counts), f"x ticks at every GPU count: {ticks}")
    legend = svg.find("g", cls="legend")
    text = legend[0].all_text() if legend else ""
    check(all(w in text for w in ("strong", "weak", "ideal", "Amdahl", "Gustafson")), f"legend: {text}")
    print(f"scaling: {len(strong)} strong, {len(weak)} weak points")


def structure(hpdlc, src, work):
    os.makedirs(work, exist_ok=True)
    counts = [8, 16, 32, 64]
    top = 5
    args = ["samples/gpt2.hpd", "--dp", "2", "--pp", "4", "--micro-batch", "32", "--search", "--top", str(top),
            "--scaling", ",".join(map(str, counts))]
    page, js_path = os.path.join(work, "plan_pp4.html"), os.path.join(work, "plan_pp4.json")
    run(hpdlc, src, args + ["--format", "html"], page)
    run(hpdlc, src, args + ["--format", "json"], js_path)
    js = json.load(open(js_path))
    check(js["parallel"]["pp"] == 4, f"the pp=4 case has pp {js['parallel']['pp']}")
    root = parse(page)
    head = root.find(id="summary")
    if check(len(head) == 1, "a summary header"):
        t = head[0].all_text()
        for w in ("GPT2", "parameters", "dgx-a100-80gb", "pp=4", "limit", js["limit"][:30], "fits"):
            check(w in t, f"header mentions {w!r}")
    check_memory(root, js)
    check_time(root, js)
    check_timeline(root, js)
    check_text(root, hpdlc, src, args, work)
    check_search(root, js, top)
    check_scaling(root, js, counts)

    # pp = 1, no search, no scaling
    page1, js1 = os.path.join(work, "plan_pp1.html"), os.path.join(work, "plan_pp1.json")
    run(hpdlc, src, ["samples/gpt2.hpd", "--format", "html"], page1)
    run(hpdlc, src, ["samples/gpt2.hpd", "--format", "json"], js1)
    js = json.load(open(js1))
    root = parse(page1)
    check(js["parallel"]["pp"] == 1, "the pp=1 case")
    check_memory(root, js)
    check_time(root, js)
    check_timeline(root, js)
    check(not root.find(id="search") and not root.find(id="scaling-chart"), "no search or scaling without the options")


# ---- screenshot ----


def png_pixels(path):
    data = open(path, "rb").read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG")
    pos, idat, w = 8, b"", None
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos : pos + 8])
        body = data[pos + 8 : pos + 8 + n]
        if kind == b"IHDR":
            w, h, depth, ctype, _, _, interlace = struct.unpack(">IIBBBBB", body)
            if depth != 8 or ctype not in (2, 6) or interlace:
                raise ValueError(f"PNG depth {depth} colour type {ctype} interlace {interlace}")
            bpp = 3 if ctype == 2 else 4
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    raw = zlib.decompress(idat)
    stride = w * bpp
    prev = bytearray(stride)
    rows = []
    for y in range(h):
        ft = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b = prev[i]
            c = prev[i - bpp] if i >= bpp else 0
            if ft == 1:
                line[i] = (line[i] + a) & 255
            elif ft == 2:
                line[i] = (line[i] + b) & 255
            elif ft == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif ft == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(bytes(line))
        prev = line
    return w, h, bpp, rows


def screenshot(hpdlc, src, work):
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if not browser:
        print("skipped: neither chromium nor chromium-browser is on PATH")
        return 77
    os.makedirs(work, exist_ok=True)
    page = os.path.abspath(os.path.join(work, "shot.html"))
    png = os.path.abspath(os.path.join(work, "shot.png"))
    run(hpdlc, src, ["samples/gpt2.hpd", "--dp", "2", "--pp", "4", "--micro-batch", "32", "--search", "--top", "5",
                     "--scaling", "8,16,32,64", "--format", "html"], page)
    if os.path.exists(png):
        os.remove(png)
    cmd = [browser, "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={os.path.join(os.path.abspath(work), 'chromium-profile')}",
           f"--screenshot={png}", "--window-size=1200,2400", "file://" + page]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if not check(os.path.exists(png), f"chromium wrote {png} (exit {r.returncode}: {r.stderr[-500:]})"):
        return 1
    w, h, bpp, rows = png_pixels(png)
    bg = rows[0][:3]
    differ, colours = 0, set()
    for y in range(0, h, 2):
        row = rows[y]
        for x in range(0, w * bpp, 2 * bpp):
            px = row[x : x + 3]
            if px != bg:
                differ += 1
                if len(colours) < 1000:
                    colours.add(px)
    share = differ / ((h + 1) // 2 * ((w + 1) // 2))
    print(f"screenshot {w}x{h}: {share * 100:.1f}% of the pixels differ from the background, {len(colours)} colours")
    check(share > 0.03, "the screenshot is not blank")
    check(len(colours) >= 8, "the screenshot has the charts' colours")
    return 0


def main():
    argv = sys.argv[1:]
    shot = argv[:1] == ["--screenshot"]
    if shot:
        argv = argv[1:]
    if len(argv) != 3:
        sys.exit(__doc__)
    hpdlc, src, work = os.path.abspath(argv[0]), argv[1], argv[2]
    rc = screenshot(hpdlc, src, work) if shot else structure(hpdlc, src, work)
    if rc == 77:
        return 77
    if failures:
        print(f"{len(failures)} check(s) failed")
        return 1
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
