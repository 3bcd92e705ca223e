#!/usr/bin/env python3
"""check_link.py MAP... - the runtime's programs link no object of the
compiler (CTest: house.runtime_link). Each MAP is a GNU ld map file
(-Wl,-Map); every archive member it pulled in must come from the runtime's
or the core's library, and no object may be a file of compiler/ or grammar/.
"""
import re
import sys

ALLOWED = {"libhpdlrt.a", "libhpdldevice.a", "libhpdlprof.a", "libhpdlcore.a"}
MEMBER = re.compile(r"^(\S*?lib[^/\s()]+\.a)\(([^)]+)\)")


def main(paths):
    bad = 0
    for path in paths:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
        start = text.find("Archive member included")
        end = text.find("\n\n", text.find("\n", start) + 1) if start >= 0 else -1
        section = text[start:end] if start >= 0 else ""
        libs = {}
        for line in section.splitlines():
            m = MEMBER.match(line.strip())
            if m and "/libhpdl" in "/" + m.group(1):
                lib = m.group(1).rsplit("/", 1)[-1]
                libs.setdefault(lib, set()).add(m.group(2))
        for lib, members in sorted(libs.items()):
            if lib not in ALLOWED:
                print(f"{path}: links {lib} ({', '.join(sorted(members))}): a part of the compiler")
                bad += 1
        for obj in re.findall(r"\S*/(?:compiler|grammar)/\S*\.o\b", text):
            print(f"{path}: links {obj}")
            bad += 1
        if not libs:
            print(f"{path}: no member of the runtime's libraries: is this a link map of the runtime?")
            bad += 1
        if not bad:
            pulled = ", ".join(f"{lib}: {len(m)}" for lib, m in sorted(libs.items()))
            print(f"{path}: ok ({pulled} objects)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]) if len(sys.argv) > 1 else 2)
