#!/usr/bin/env python3
"""check_layers.py - the house rules of docs/architecture.md, checked on the
source tree (CTest: house.layers).

1. Every folder includes only headers of its own folder and of the folders
   below it (LAYERS, bottom up); the runtime never includes the compiler's
   or the grammar's headers.
2. No circle between the modules of one folder: module A depends on B when
   A.c or A.h includes B.h; a header without a .c of its own (an interface
   such as plan_internal.h) is followed through to what it includes.
3. No folder holds more than MAX_SOURCES .c files.
4. Every #include "..." names a header that exists.

Exit 0 when all hold; otherwise each violation is printed and the exit is 1.
`--self-test` builds small trees that break each rule and checks that every
break is reported (CTest: house.layers_self_test).
"""
import os
import re
import sys

# Bottom up: a folder may include headers of the folders listed before it.
# The runtime sits on the core only.
LAYERS = [
    "core/numeric",
    "core",
    "grammar",
    "compiler/front",
    "compiler/ir",
    "compiler/parallel",
    "compiler/plan",
    "compiler/codegen",
    "compiler/driver",
]
RUNTIME = {  # the core library holds core/numeric (half.h's conversions, the host ops' arithmetic)
    "kernels": [],
    "runtime/prof": [],
    "runtime/device": ["core", "core/numeric", "kernels"],
    "runtime": ["core", "core/numeric", "runtime/device", "runtime/prof"],
    "runtime/tools": ["core", "core/numeric", "runtime/device", "runtime/prof", "runtime"],
}
# The CUDA back end generates calls of the kernels' templates and launches
# them by their rule (kernels/hpdl_attention_cfg.h): it may read kernels/,
# a leaf that includes nothing of the compiler.
COMPILER_KERNELS = ["compiler/codegen", "compiler/driver"]
MAX_SOURCES = 15
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def main():
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", ".."))
    problems = check(root)
    for p in problems:
        print("house: " + p)
    if problems:
        print(f"house: {len(problems)} problem(s)")
        return 1
    return 0


def check(root, quiet=False):
    allowed = {d: LAYERS[: i + 1] for i, d in enumerate(LAYERS)}
    for d, below in RUNTIME.items():
        allowed[d] = below + [d]
    for d in COMPILER_KERNELS:
        allowed[d] = allowed[d] + ["kernels"]
    folders = list(allowed)
    # header name -> folder; generated headers (parser.h) belong to grammar
    owner = {"parser.h": "grammar"}
    files = {}
    problems = []
    for d in folders:
        path = os.path.join(root, d)
        if not os.path.isdir(path):
            problems.append(f"{d}/: missing folder")
            continue
        names = sorted(os.listdir(path))
        # .inc: a generated table a source of the folder includes (plan_evidence_rows.inc)
        files[d] = [n for n in names if os.path.splitext(n)[1] in (".c", ".h", ".cuh", ".inc", ".l", ".y")]
        for n in files[d]:
            if n.endswith(".h") or n.endswith(".cuh") or n.endswith(".inc"):
                if n in owner and owner[n] != d:
                    problems.append(f"{d}/{n}: a header of this name is also in {owner[n]}/")
                owner[n] = d
        nsrc = sum(1 for n in names if n.endswith(".c"))
        if nsrc > MAX_SOURCES:
            problems.append(f"{d}/: {nsrc} source files (more than {MAX_SOURCES}); split the folder")

    includes = {}  # (folder, file) -> [header]
    for d, names in files.items():
        for n in names:
            with open(os.path.join(root, d, n), encoding="utf-8") as f:
                text = f.read()
            hs = []
            for h in INCLUDE.findall(text):
                h = os.path.basename(h) if h.startswith("../") else h
                if h not in owner:
                    problems.append(f"{d}/{n}: includes \"{h}\", which no folder of the house holds")
                    continue
                if owner[h] not in allowed[d]:
                    problems.append(f"{d}/{n}: includes {owner[h]}/{h}, above {d}/ (it may include {', '.join(allowed[d])})")
                hs.append(h)
            includes[(d, n)] = hs

    # module graph per folder
    for d, names in files.items():
        stems = {os.path.splitext(n)[0] for n in names if n.endswith(".c")}

        def module_of(h):
            s = os.path.splitext(h)[0]
            return s if owner.get(h) == d and s in stems else None

        def deps(n, seen):
            out = set()
            for h in includes.get((d, n), []):
                if owner.get(h) != d:
                    continue
                m = module_of(h)
                if m is not None:
                    out.add(m)
                elif h not in seen:  # an interface header: follow it
                    seen.add(h)
                    out |= deps(h, seen)
            return out

        graph = {}
        for s in stems:
            g = set()
            for ext in (".c", ".h"):
                if s + ext in names:
                    g |= deps(s + ext, set())
            g.discard(s)
            graph[s] = g
        for cycle in cycles(graph):
            problems.append(f"{d}/: modules include each other: {' -> '.join(cycle + [cycle[0]])}")

    if not problems and not quiet:
        counts = ", ".join(f"{d}/ {sum(1 for n in files[d] if n.endswith('.c'))}" for d in folders if d in files)
        print(f"house: {len(folders)} folders, layering and module graph without circles ({counts} source files)")
    return problems


def self_test():
    """Each broken tree must give exactly the expected complaint."""
    import tempfile

    def tree(root, extra):
        base = {d: {} for d in LAYERS + list(RUNTIME)}
        base["core"]["ir.h"] = ""
        base["core"]["ir.c"] = '#include "ir.h"\n'
        base["compiler/plan"]["plan.h"] = '#include "ir.h"\n'
        base["compiler/plan"]["plan.c"] = '#include "plan.h"\n'
        base["runtime"]["rt.c"] = '#include "ir.h"\n'
        for (d, n), text in extra.items():
            base[d][n] = text
        for d, fs in base.items():
            os.makedirs(os.path.join(root, d), exist_ok=True)
            for n, text in fs.items():
                with open(os.path.join(root, d, n), "w") as f:
                    f.write(text)

    cases = [
        ("clean", {}, None),
        ("runtime includes the compiler", {("runtime", "rt.c"): '#include "plan.h"\n'}, "above runtime/"),
        ("core includes a higher phase", {("core", "ir.c"): '#include "plan.h"\n'}, "above core/"),
        ("two modules include each other",
         {("compiler/plan", "memplan.h"): '#include "plan.h"\n', ("compiler/plan", "memplan.c"): "",
          ("compiler/plan", "plan.c"): '#include "plan.h"\n#include "memplan.h"\n'},
         "modules include each other: memplan -> plan -> memplan"),
        ("a circle through an interface header",
         {("compiler/plan", "plan_internal.h"): '#include "search.h"\n', ("compiler/plan", "search.h"): "",
          ("compiler/plan", "search.c"): '#include "plan.h"\n', ("compiler/plan", "plan.c"): '#include "plan_internal.h"\n'},
         "modules include each other: plan -> search -> plan"),
        ("a missing header", {("core", "ir.c"): '#include "nope.h"\n'}, "which no folder of the house holds"),
        ("too many sources", {("compiler/ir", f"p{i}.c"): "" for i in range(MAX_SOURCES + 1)}, "source files (more than"),
    ]
    failed = 0
    for name, extra, want in cases:
        with tempfile.TemporaryDirectory() as root:
            tree(root, extra)
            got = check(root, quiet=True)
        ok = (not got) if want is None else (len(got) == 1 and want in got[0])
        print(f"{'ok  ' if ok else 'FAIL'} {name}: {got if got else 'no problems'}")
        failed += not ok
    return 1 if failed else 0


def cycles(graph):
    """One representative cycle per strongly connected component (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


if __name__ == "__main__":
    sys.exit(main())
