#!/usr/bin/env bash
# setup.sh - installs what hpdl needs to build and test on Debian or Ubuntu.
#
# Safe to run twice: it asks dpkg what is present, installs only what is
# missing (saying what and why), and runs `apt-get update` only when it has
# something to install. Uses sudo only when not run as root.
# The CUDA toolkit is optional (found in $CUDA_HOME or /usr/local/cuda) and is
# not installed here.
set -euo pipefail

export DEBIAN_FRONTEND=noninteractive

say() { printf 'setup: %s\n' "$*"; }
die() { printf 'setup: error: %s\n' "$*" >&2; exit 1; }

if ! command -v dpkg-query >/dev/null 2>&1 || ! command -v apt-get >/dev/null 2>&1; then
  die "this script needs a Debian or Ubuntu system (dpkg and apt-get); install by hand:
  flex bison cmake make gcc clang pkg-config LLVM (dev) libffi Open MPI OpenBLAS jansson python3
  (python3-yaml slurm-wlm munge for the launch tests)"
fi


installed() { # installed PACKAGE: true when dpkg has it installed
  local out  # (no pipe into grep -q: with pipefail, dpkg's SIGPIPE would fail it)
  out=$(dpkg -s "$1" 2>/dev/null) || return 1
  [[ $out == *"Status: install ok installed"* ]]
}

installed_like() { # installed_like GLOB: the installed packages matching GLOB
  dpkg-query -W -f='${Package} ${db:Status-Abbrev}\n' "$1" 2>/dev/null |
    awk '$2 ~ /^ii/ { print $1 }'
}

available() { # available PACKAGE: true when apt knows an installable version
  local cand
  cand=$(apt-cache policy "$1" 2>/dev/null | awk '/Candidate:/ { print $2 }')
  [ -n "$cand" ] && [ "$cand" != "(none)" ]
}

newest_available() { # newest_available PREFIX SUFFIX: e.g. llvm- -dev -> llvm-16-dev
  apt-cache pkgnames "$1" 2>/dev/null | grep -E "^$1[0-9]+$2\$" |
    sed -E "s/^$1([0-9]+)$2\$/\\1/" | sort -n | tail -n 1 | sed "s/^/$1/; s/\$/$2/"
}

# Packages wanted by name: "package|why".
plain=(
  "flex|the scanner generator (grammar/lexer.l)"
  "bison|the parser generator (grammar/parser.y)"
  "cmake|the build"
  "make|the build"
  "gcc|the C compiler"
  "libc6-dev|the C library headers"
  "pkg-config|finding libraries"
  "libffi-dev|calls into native functions named by extern declarations"
  "libopenmpi-dev|MPI collectives on CPU ranks"
  "openmpi-bin|mpirun, to run jobs on several CPU ranks"
  "libopenblas-dev|CPU matrix multiplication"
  "libjansson-dev|JSON (plan reports, safetensors headers)"
  "python3|test-input generators"
  "python3-yaml|the MPIJob tests read YAML (tests/launch)"
  "valgrind|memcheck over the planner (plan.memcheck: reads of memory never written)"
  "slurm-wlm|SLURM (slurmctld, slurmd, sbatch, srun): the sbatch script run end to end (launch.slurm_e2e)"
  "munge|SLURM's authentication daemon (launch.slurm_e2e)"
)

missing=()   # requirement keys still to resolve to package names
for entry in "${plain[@]}"; do
  pkg=${entry%%|*}
  if installed "$pkg"; then
    say "have $pkg"
  else
    say "missing $pkg (${entry#*|})"
    missing+=("$pkg")
  fi
done

# clang: the libFuzzer target needs it; any installed clang-N will do.
have_clang=$(installed_like 'clang-[0-9]*' | head -n 1)
if installed clang || [ -n "$have_clang" ]; then
  say "have clang${have_clang:+ ($have_clang)}"
else
  say "missing clang (the fuzzer build)"
  missing+=("@clang")
fi

# LLVM development files (the LLVM C API, for code generation): llvm-dev or
# any versioned llvm-N-dev.
have_llvm=$(installed_like 'llvm-[0-9]*-dev' | head -n 1)
if installed llvm-dev || [ -n "$have_llvm" ]; then
  say "have LLVM development files${have_llvm:+ ($have_llvm)}"
else
  say "missing LLVM development files (code generation through the LLVM C API)"
  missing+=("@llvm")
fi

# libFuzzer's runtime, which ships with clang's compiler-rt: present when the
# fuzzer archive for this machine's architecture is in clang's runtime folder.
fuzzer_lib() {
  local arch dirs d f
  arch=$(uname -m)
  dirs=()
  if command -v clang >/dev/null 2>&1; then
    dirs+=("$(clang --print-runtime-dir 2>/dev/null || true)")
  fi
  for d in /usr/lib/llvm-*/lib/clang/*/lib/*; do dirs+=("$d"); done
  for d in "${dirs[@]}"; do
    for f in "$d/libclang_rt.fuzzer-$arch.a" "$d/libclang_rt.fuzzer.a"; do
      if [ -f "$f" ]; then printf '%s' "$f"; return; fi
    done
  done
}
if [ -n "$(fuzzer_lib)" ]; then
  say "have the libFuzzer runtime ($(fuzzer_lib))"
else
  say "missing the libFuzzer runtime (clang's compiler-rt)"
  missing+=("@fuzzer")
fi

# chromium: optional, the headless browser of the test report.screenshot (a
# picture of hpdlc report's page must not be blank); the test skips without
# it, and so does this script where apt has no chromium (Ubuntu ships a snap).
if installed chromium || command -v chromium >/dev/null 2>&1; then
  say "have chromium"
elif available chromium; then
  say "missing chromium (optional: the screenshot test of hpdlc report)"
  missing+=("@chromium")
else
  say "no chromium package here; the screenshot test of hpdlc report will skip"
fi

# oneDNN: optional, the bf16 GEMMs of the CPU back end (train { precision =
# bf16 }: about twice sgemm's FLOP/s on a CPU with AVX512-BF16); without it
# they widen their operands to fp32 for sgemm.
if installed libdnnl-dev; then
  say "have libdnnl-dev"
elif available libdnnl-dev; then
  say "missing libdnnl-dev (optional: oneDNN for bf16 GEMMs on the CPU)"
  missing+=("@dnnl")
else
  say "no libdnnl-dev package here; bf16 GEMMs on the CPU will widen to fp32"
fi

if [ ${#missing[@]} -eq 0 ]; then
  say "everything is installed; nothing to do"
  exit 0
fi

SUDO=()
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null 2>&1 ||
    die "not root and no sudo: run as root, or install the packages above by hand"
  SUDO=(sudo)
fi

say "updating the package lists (apt-get update)"
"${SUDO[@]}" apt-get update -q

# Major version of the clang that is (or will be) installed, to pick the
# matching compiler-rt package.
clang_major() {
  local v
  v=$(installed_like 'clang-[0-9]*' | sed -E 's/^clang-([0-9]+).*/\1/' | sort -n | tail -n 1)
  if [ -z "$v" ]; then
    v=$(apt-cache policy clang 2>/dev/null | awk '/Candidate:/ { print $2 }' |
        sed -E 's/^[0-9]+://; s/^([0-9]+).*/\1/')
  fi
  printf '%s' "$v"
}

to_install=()
for req in "${missing[@]}"; do
  case $req in
    @clang)
      to_install+=(clang) ;;
    @llvm)
      if available llvm-dev; then
        to_install+=(llvm-dev)
      else
        pkg=$(newest_available llvm- -dev)
        [ -n "$pkg" ] || die "no LLVM development package (llvm-dev, llvm-N-dev) is available"
        to_install+=("$pkg")
      fi ;;
    @fuzzer)
      major=$(clang_major)
      picked=""
      for cand in "libclang-rt-$major-dev" libclang-rt-dev "libclang-common-$major-dev"; do
        if [ -n "$major" ] || [ "$cand" = libclang-rt-dev ]; then
          if available "$cand"; then picked=$cand; break; fi
        fi
      done
      [ -n "$picked" ] || die "no package with libFuzzer's runtime (libclang-rt-$major-dev) is available"
      to_install+=("$picked") ;;
    @chromium)
      to_install+=(chromium) ;;
    @dnnl)
      to_install+=(libdnnl-dev) ;;
    *)
      available "$req" || die "package $req is not available from apt on this system"
      to_install+=("$req") ;;
  esac
done

say "installing: ${to_install[*]}"
"${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive \
  apt-get install -y -q --no-install-recommends "${to_install[@]}"

if [ -z "$(fuzzer_lib)" ]; then
  say "warning: libFuzzer's runtime is still not found; the fuzz step of scripts/test.sh will fail"
fi
say "done"
