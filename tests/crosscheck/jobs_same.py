#!/usr/bin/env python3
"""xcheck.py --jobs J reports what one case at a time reports: the same calls, figures,
worst cases and verdict, in the same order (only the times differ).

    python3 tests/crosscheck/jobs_same.py ATTNBENCH [XCHECK ARGS...]

Runs 16 cases (seed 7) at --jobs 1 and at --jobs 4 and compares the two reports with
their times taken out. Exit status 0 when they agree, 1 when not (with the first
differing line), 77 when numpy is missing (xcheck.py's skip)."""
import os
import re
import subprocess
import sys

XCHECK = os.path.join(os.path.dirname(os.path.abspath(__file__)), "xcheck.py")
TIMES = re.compile(r"[0-9.]+ s \(reference self-test [0-9.]+ s\)")


def report(exe, jobs, extra):
    p = subprocess.run([sys.executable, XCHECK, exe, "--cases", "16", "--seed", "7", "--jobs", str(jobs)] + extra,
                       capture_output=True, text=True)
    if p.returncode == 77:
        print(p.stdout.strip())
        sys.exit(77)
    return p.returncode, [TIMES.sub("TIME", l) for l in p.stdout.splitlines()]


def main(argv):
    if not argv:
        print("usage: jobs_same.py ATTNBENCH [XCHECK ARGS...]", file=sys.stderr)
        return 2
    (rc1, one), (rc4, four) = report(argv[0], 1, argv[1:]), report(argv[0], 4, argv[1:])
    if rc1 != rc4 or one != four:
        i = next((k for k in range(min(len(one), len(four))) if one[k] != four[k]), min(len(one), len(four)))
        print("jobs_same: --jobs 4 reports otherwise than --jobs 1 (exit %d vs %d), first at line %d:\n"
              "  jobs 1: %s\n  jobs 4: %s" % (rc1, rc4, i + 1, one[i] if i < len(one) else "(end)",
                                             four[i] if i < len(four) else "(end)"))
        return 1
    if not any(l.startswith("crosscheck: 16 cases") for l in one):
        print("jobs_same: no summary line in xcheck.py's report:\n" + "\n".join(one[-5:]))
        return 1
    print("jobs_same: OK (%d lines alike, exit %d)" % (len(one), rc1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
