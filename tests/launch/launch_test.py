#!/usr/bin/env python3
"""launch_test.py - hpdlrun --sbatch and --k8s (docs/runtime.md, "Clusters").

  launch_test.py --bin BUILD/bin --work DIR [--update] CASE

Each case compiles samples/gpt2-tiny.hpd at a layout into DIR, runs hpdlrun
there (so paths are DIR-relative), and compares what it wrote (the script or
manifest, and hpdlrun's messages and status) with tests/launch/expected/CASE.txt;
the work folder and the hpdlrun path read as @WORK@ and @HPDLRUN@ in it.
--update writes the expected file instead. The MPIJob cases also validate the
manifest against our description of the MPI operator's v2beta1 API
(mpijob_api.py, checked by validate_mpijob.py).
"""
import argparse
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(os.path.dirname(HERE))
SAMPLE = os.path.join(SRC, "samples", "gpt2-tiny.hpd")
sys.path.insert(0, HERE)
import validate_mpijob  # noqa: E402

A = None  # the parsed arguments


def compile_art(name, *flags):
    out = os.path.join(A.work, name)
    p = subprocess.run([os.path.join(A.bin, "hpdlc"), "compile", SAMPLE, "-q", "-o", out, *flags], capture_output=True, text=True)
    if p.returncode != 0 and "--target" in flags and "nvrtc" in p.stderr.lower():
        print(f"skipped: a --target cuda artifact needs NVRTC (no GPU), which this machine lacks:\n{p.stderr}")
        sys.exit(77)
    if p.returncode != 0:
        sys.exit(f"FAIL: hpdlc compile {' '.join(flags)}: {p.stderr}")
    return name


# one rank on the CPU; dp=2 x tp=2 for GPUs of a multi-node cluster (2 GPUs a
# node: 2 nodes); the same 4 ranks on 3 a node (2 nodes, the last with 1)
def art_one():
    return compile_art("art-one")


def art_cuda4():
    return compile_art("art-cuda4", "--target", "cuda", "--cluster", "dgx-h100", "--dp", "2", "--tp", "2", "--gpus", "4",
                       "--gpus-per-node", "2")


def art_uneven():
    return compile_art("art-uneven", "--cluster", "dgx-h100", "--dp", "2", "--tp", "2", "--gpus", "4", "--gpus-per-node", "3")


def hpdlrun(*args, env=None):
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run([os.path.join(A.bin, "hpdlrun"), *args], cwd=A.work, capture_output=True, text=True, env=e)


def scrub(text):
    text = text.replace(os.path.realpath(os.path.join(A.bin, "hpdlrun")), "@HPDLRUN@")
    return text.replace(os.path.realpath(A.work), "@WORK@").replace(A.work, "@WORK@")


def record(log, title, p, file=None):
    log.append(f"$ {title}")
    if p.stdout:
        log.append(p.stdout.rstrip("\n"))
    if p.stderr:
        log.append("[stderr] " + p.stderr.rstrip("\n").replace("\n", "\n[stderr] "))
    log.append(f"[status {p.returncode}]")
    if file:
        with open(os.path.join(A.work, file)) as f:
            log.append(f"--- {file}")
            log.append(f.read().rstrip("\n"))
    log.append("")


def validate(path, want_valid=True):
    v = validate_mpijob.load_validator()
    import yaml
    with open(path) as f:
        doc = yaml.safe_load(f)
    found = validate_mpijob.problems(doc, v)
    if want_valid and found:
        sys.exit(f"FAIL: {path} is not a valid MPIJob:\n  " + "\n  ".join(found))
    return found


def case_sbatch_one_rank(log):
    art = art_one()
    record(log, f"hpdlrun --sbatch {art}", hpdlrun("--sbatch", art))


def case_sbatch_dp2_tp2(log):
    art = art_cuda4()
    args = ["--sbatch", art, "-o", "job.sbatch", "--partition", "gpu", "--time", "02:00:00", "--job-name", "tiny", "--account",
            "ml", "--steps", "100", "--data", "data/tiny shakespeare_*.bin", "--checkpoint-dir", "ck", "--checkpoint-every", "50"]
    record(log, "hpdlrun " + " ".join(args), hpdlrun(*args), "job.sbatch")


def case_sbatch_uneven(log):
    art = art_uneven()
    args = ["--sbatch", art, "--cpus-per-node", "16", "--mpi", "pmix", "--hpdlrun", "/opt/hpdl/bin/hpdlrun", "--signal-before",
            "300"]
    record(log, "hpdlrun " + " ".join(args), hpdlrun(*args))


def case_k8s_one_rank(log):
    art = art_one()
    p = hpdlrun("--k8s", art, "-o", "one.yaml")
    record(log, f"hpdlrun --k8s {art} -o one.yaml", p, "one.yaml")
    validate(os.path.join(A.work, "one.yaml"))


def case_k8s_dp2_tp2(log):
    art = art_cuda4()
    args = ["--k8s", art, "-o", "job.yaml", "--image", "registry.example.com/hpdl:1.0", "--name", "tiny-dp2-tp2", "--namespace",
            "ml-team", "--claim", "team-runs", "--mount", "/runs", "--steps", "100", "--metrics", "metrics \"a\" $(HOME).jsonl"]
    record(log, "hpdlrun " + " ".join(args), hpdlrun(*args), "job.yaml")
    validate(os.path.join(A.work, "job.yaml"))


def case_k8s_schema_rejects(log):
    """The API check fails on broken manifests: each mutation of a valid
    one must be refused, naming the fault."""
    import yaml
    art = art_uneven()  # a CPU artifact: no NVRTC needed
    p = hpdlrun("--k8s", art, "-o", "good.yaml")
    if p.returncode:
        sys.exit(f"FAIL: {p.stderr}")
    good = os.path.join(A.work, "good.yaml")
    validate(good)
    base = yaml.safe_load(open(good))

    def worker(d):
        return d["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]

    mutations = [
        ("a misspelt field", lambda d: d["spec"].__setitem__("slotPerWorker", d["spec"].pop("slotsPerWorker"))),
        ("slots as a string", lambda d: d["spec"].__setitem__("slotsPerWorker", "2")),
        ("an MPI the operator lacks", lambda d: d["spec"].__setitem__("mpiImplementation", "MVAPICH")),
        ("no replica specs", lambda d: d["spec"].pop("mpiReplicaSpecs")),
        ("a container without a name", lambda d: worker(d).pop("name")),
        ("a bad quantity", lambda d: worker(d)["resources"]["limits"].__setitem__("cpu", "two")),
        ("a command that is not a list of strings", lambda d: worker(d).__setitem__("command", "sshd -De")),
        ("replicas beyond int32", lambda d: d["spec"]["mpiReplicaSpecs"]["Worker"].__setitem__("replicas", 2**31)),
        ("an upper-case name", lambda d: d["metadata"].__setitem__("name", "Tiny")),
        ("a third replica type", lambda d: d["spec"]["mpiReplicaSpecs"].__setitem__("Server", {"replicas": 1})),
        ("two launchers", lambda d: d["spec"]["mpiReplicaSpecs"]["Launcher"].__setitem__("replicas", 2)),
    ]
    v = validate_mpijob.load_validator()
    for what, mutate in mutations:
        d = yaml.safe_load(yaml.safe_dump(base))
        mutate(d)
        found = validate_mpijob.problems(d, v)
        if not found:
            sys.exit(f"FAIL: the API check let {what} through")
        log.append(f"{what}: {found[0]}")
    # and the command-line validator's exit status on a broken file
    bad = os.path.join(A.work, "bad.yaml")
    with open(bad, "w") as f:
        f.write(open(good).read().replace("slotsPerWorker", "slotPerWorker"))
    p = subprocess.run([sys.executable, os.path.join(HERE, "validate_mpijob.py"), bad], capture_output=True, text=True)
    if p.returncode != 1:
        sys.exit(f"FAIL: validate_mpijob.py exits {p.returncode} on a broken manifest:\n{p.stdout}")
    log.append(scrub(p.stdout.rstrip("\n")))


# run options that YAML, a shell or an #SBATCH line could misread
ODD = ["--data", "a: b #c\n- d 'e' \"f\" $(HOME) ${X} `g` \\ \t\u00e9", "--metrics", "yes", "--checkpoint-dir", "0x1F: ~"]


def case_odd_strings(log):
    """Odd run options reach the ranks exactly: through the MPIJob's YAML
    (parsed back; Kubernetes' $(VAR) escaping undone) and through the sbatch
    script (run by bash with srun, scancel and scontrol stubbed)."""
    import yaml
    art = art_one()
    p = hpdlrun("--k8s", art, "-o", "odd.yaml", "--image", 'reg.io/a:"b"#c', *ODD)
    if p.returncode:
        sys.exit(f"FAIL: {p.stderr}")
    validate(os.path.join(A.work, "odd.yaml"))
    doc = yaml.safe_load(open(os.path.join(A.work, "odd.yaml")))
    c = doc["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]
    got = [w.replace("$$", "$") for w in c["command"][6:]]
    if got != ODD or c["image"] != 'reg.io/a:"b"#c':
        sys.exit(f"FAIL: the MPIJob's command reads back as {got!r}, image {c['image']!r}")
    log.append("k8s: the command and image read back exactly")
    p = hpdlrun("--sbatch", art, "-o", "odd.sbatch", *ODD)
    if p.returncode:
        sys.exit(f"FAIL: {p.stderr}")
    stubs = os.path.join(A.work, "stubs")
    os.makedirs(stubs, exist_ok=True)
    for name, body in (("srun", 'for a in "$@"; do printf "%s\\0" "$a"; done > "$ARGS_OUT"'), ("scancel", "exit 0"),
                       ("scontrol", "exit 0")):
        with open(os.path.join(stubs, name), "w") as f:
            f.write("#!/bin/bash\n" + body + "\n")
        os.chmod(os.path.join(stubs, name), 0o755)
    env = dict(os.environ, PATH=stubs + os.pathsep + os.environ["PATH"], SLURM_JOB_ID="7",
               ARGS_OUT=os.path.join(A.work, "args"))
    r = subprocess.run(["bash", os.path.join(A.work, "odd.sbatch")], env=env, capture_output=True, text=True, timeout=30)
    if r.returncode:
        sys.exit(f"FAIL: the script exits {r.returncode}: {r.stderr}")
    words = open(os.path.join(A.work, "args")).read().split("\0")[:-1]
    i = words.index("--resume")
    if words[i + 1:] != ODD or words[i - 1] != os.path.join(A.work, art):
        sys.exit(f"FAIL: srun got {words!r}")
    log.append("sbatch: srun got the run options exactly")


def case_mpirun_one_rank(log):
    """--mpirun (the MPIJob launcher's): a one-rank job goes through mpirun
    too, so that its rank runs on a worker; without it, in this process."""
    art = art_one()
    stub = os.path.join(A.work, "stub-mpirun")
    with open(stub, "w") as f:
        f.write("#!/bin/sh\necho \"stub mpirun: $1 $2\"\n")
    os.chmod(stub, 0o755)
    p = hpdlrun("--mpirun", art, "--steps", "0", env={"HPDL_MPIRUN": stub})
    if "stub mpirun: -np 1" not in p.stdout:
        sys.exit(f"FAIL: --mpirun did not start mpirun: {p.stdout} {p.stderr}")
    log.append(p.stdout.strip())
    p = hpdlrun(art, "--steps", "0", "--progress", "quiet", env={"HPDL_MPIRUN": stub})
    if "stub mpirun" in p.stdout + p.stderr:
        sys.exit(f"FAIL: a one-rank job without --mpirun went through mpirun: {p.stdout} {p.stderr}")
    log.append("without --mpirun: in this process")
    # Open MPI's session tree: a job of this machine alone gets its own
    # (concurrent mpiruns race on the shared one), removed after the job; a
    # tree the user placed, or a job with a host list, is left as given.
    with open(stub, "w") as f:
        f.write("#!/bin/sh\nb=\"$OMPI_MCA_orte_tmpdir_base\"\n"
                "if [ -d \"$b\" ]; then echo \"stub mpirun: base $b\"; else echo \"stub mpirun: no base [$b]\"; fi\n")
    tmp = os.path.join(A.work, "tmp")
    os.makedirs(tmp, exist_ok=True)
    # a test run inside an allocation must not see it: scrub what marks one
    managers = ("OMPI_MCA_orte_default_hostfile", "SLURM_JOB_ID", "PBS_NODEFILE", "LSB_MCPU_HOSTS", "PE_HOSTFILE")
    for m in managers + ("OMPI_MCA_orte_tmpdir_base", "HPDL_MPIRUN_ARGS"):
        os.environ.pop(m, None)
    p = hpdlrun("--mpirun", art, "--steps", "0", env={"HPDL_MPIRUN": stub, "TMPDIR": tmp})
    base = p.stdout.split("stub mpirun: base ")[-1].split()[0] if "stub mpirun: base " in p.stdout else ""
    if not base.startswith(os.path.join(tmp, "hpdlrun-ompi-")):
        sys.exit(f"FAIL: mpirun got no session tree of its own under TMPDIR: {p.stdout} {p.stderr}")
    if os.path.exists(base):
        sys.exit(f"FAIL: the job's session tree {base} is left after it")
    log.append("a job of this machine: a session tree of its own, removed after it")
    cases = [{"OMPI_MCA_orte_tmpdir_base": tmp}]
    cases += [{"HPDL_MPIRUN_ARGS": a} for a in ("--hostfile hosts", "--map-by node -H n1,n2", "--host n1:4,n2:4",
                                                 "-machinefile hosts", "--mca orte_default_hostfile hosts",
                                                 "--rankfile ranks")]
    cases += [{m: "x"} for m in managers]
    for extra in cases:
        p = hpdlrun("--mpirun", art, "--steps", "0", env=dict(extra, HPDL_MPIRUN=stub, TMPDIR=tmp))
        want = f"stub mpirun: base {tmp}" if "OMPI_MCA_orte_tmpdir_base" in extra else "stub mpirun: no base []"
        if want not in p.stdout:
            sys.exit(f"FAIL: with {extra}: {p.stdout} {p.stderr}")
        log.append(f"with {' '.join(f'{k}={v}' if k == 'HPDL_MPIRUN_ARGS' else k for k, v in extra.items())}: "
                   f"{want[len('stub mpirun: '):].replace(tmp, 'TMPDIR')}")
    # arguments that name no other machine keep the private tree
    p = hpdlrun("--mpirun", art, "--steps", "0",
                env={"HPDL_MPIRUN": stub, "TMPDIR": tmp, "HPDL_MPIRUN_ARGS": "--map-by slot --bind-to core --mca btl self,vader"})
    if "stub mpirun: base " + os.path.join(tmp, "hpdlrun-ompi-") not in p.stdout:
        sys.exit(f"FAIL: arguments naming no host lost the private tree: {p.stdout} {p.stderr}")
    log.append("with HPDL_MPIRUN_ARGS of this machine alone: a session tree of its own")


def case_errors(log):
    art = art_one()
    four = art_uneven()
    runs = [
        ["--k8s", art, "--name", "Tiny_GPT"],
        ["--k8s", art, "--name", "-tiny"],
        ["--k8s", art, "--name", "9tiny"],
        ["--k8s", art, "--name", "a" * 60],
        ["--k8s", art, "--namespace", "ml.team"],
        ["--k8s", art, "--image", "hpdl latest"],
        ["--k8s", "no-such-artifact"],
        ["--sbatch", "no-such-artifact"],
        ["--sbatch", art, "--job-name", "my job"],
        ["--sbatch", art, "--job-name", "x\ny"],
        ["--sbatch", art, "--partition", "gpu;rm"],
        ["--sbatch", art, "--time", "2h"],
        ["--sbatch", art, "--output", "logs/$USER.out"],
        ["--sbatch", art, "--resume-from", "ck"],
        ["--sbatch", art, "--stepz", "3"],
        ["--sbatch", art, "--steps", "-3"],
        ["--sbatch", four, "-np", "2"],
        ["--sbatch", four, "--ranks-per-node", "1"],
        ["--k8s", art, "--submit"],
        ["--sbatch", art, "--k8s", art],
        ["--sbatch", art, "--submit", "-o", "x.sbatch"],
    ]
    for args in runs:
        env = {"HPDL_SBATCH": "/nonexistent/sbatch"} if "--submit" in args else None
        record(log, "hpdlrun " + " ".join(repr(a) if (not a or set(a) & set(" \n;$")) else a for a in args), hpdlrun(*args, env=env))


def case_submit(log):
    art = art_one()
    fake = os.path.join(A.work, "fake-sbatch")
    with open(fake, "w") as f:
        f.write("#!/bin/sh\n# a stand-in for sbatch --parsable FILE\n[ \"$1\" = --parsable ] && [ -s \"$2\" ] || exit 3\n"
                "echo '4242;cluster'\n")
    os.chmod(fake, 0o755)
    record(log, f"HPDL_SBATCH=fake-sbatch hpdlrun --sbatch {art} --submit", hpdlrun("--sbatch", art, "--submit",
                                                                                     env={"HPDL_SBATCH": fake}))
    if not os.path.exists(os.path.join(A.work, "hpdl-GPT2Tiny.sbatch")):
        sys.exit("FAIL: --submit without -o wrote no hpdl-GPT2Tiny.sbatch")
    fail = os.path.join(A.work, "failing-sbatch")
    with open(fail, "w") as f:
        f.write("#!/bin/sh\necho 'sbatch: error: invalid partition specified: gpu' >&2\nexit 1\n")
    os.chmod(fail, 0o755)
    record(log, f"HPDL_SBATCH=failing-sbatch hpdlrun --sbatch {art} --submit -o j.sbatch",
           hpdlrun("--sbatch", art, "--submit", "-o", "j.sbatch", env={"HPDL_SBATCH": fail}))


CASES = {k[5:]: v for k, v in globals().items() if k.startswith("case_")}


def main():
    global A
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--update", action="store_true")
    ap.add_argument("case", choices=sorted(CASES))
    A = ap.parse_args()
    A.bin = os.path.abspath(A.bin)
    A.work = os.path.abspath(A.work)
    shutil.rmtree(A.work, ignore_errors=True)
    os.makedirs(A.work)
    log = []
    CASES[A.case](log)
    text = scrub("\n".join(log).rstrip("\n") + "\n")
    expected = os.path.join(HERE, "expected", A.case + ".txt")
    if A.update:
        with open(expected, "w") as f:
            f.write(text)
        print(f"wrote {expected}")
        return 0
    actual = os.path.join(A.work, "actual.txt")
    with open(actual, "w") as f:
        f.write(text)
    if not os.path.exists(expected):
        print(text)
        print(f"FAIL: {expected} is missing (create it with --update)")
        return 1
    p = subprocess.run(["diff", "-u", "--label", expected + " (expected)", "--label", "actual", expected, actual])
    if p.returncode:
        print(f"FAIL: the output of case {A.case} changed (if on purpose: launch_test.py --update)")
        return 1
    print(f"ok: {A.case}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
