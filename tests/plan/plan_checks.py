"""plan_checks.py - the verdict of the tests/plan/*_flag.py style scripts: a list of
(good, what) checks, each failing one printed as `FAIL: what`; the exit status to return
(0 all good, 1 otherwise)."""


def verdict(checks):
    bad = [what for good, what in checks if not good]
    for what in bad:
        print(f"FAIL: {what}")
    return 1 if bad else 0
