#!/usr/bin/env python3
"""Every table of the results pages is printed by a committed script from committed
JSON: this test runs each script and compares its output with the page.

    python3 tests/scripts/results_tables/check_tables.py SOURCE_ROOT [--write]

A results page (experiments/*/RESULTS.md, the memory traffic page
experiments/sweep/TRAFFIC.md and the cluster page experiments/sweep/CLUSTER.md) marks
each printed block as

    Printed by `python3 SCRIPT ARGS...`:

    ...the script's output, verbatim...
    <!-- end of printed output -->

The command runs from SOURCE_ROOT with this python3 (only python3 scripts under
experiments/ are allowed, reading files of the repository); its standard output must
equal the block (trailing whitespace of the block ignored). A block that differs, a
command that fails, a marker without its end, or a page with no printed block is a
failure: exit status 1 with a line per problem.

--write (by hand, after new runs or a script's change; never in the test): each block
that a script prints otherwise is replaced on its page by what the script prints, and
named on stdout; a command that fails is reported and its block left as it is.
Standard library only.
"""
import glob
import os
import re
import shlex
import subprocess
import sys

BLOCK = re.compile(r"^Printed by `([^`]+)`:\n\n(.*?)^<!-- end of printed output -->$", re.S | re.M)
MARK = re.compile(r"^Printed by `", re.M)


def check_page(root, page, write=False):
    text = open(page, encoding="utf-8").read()
    new_text = text
    rel = os.path.relpath(page, root)
    problems = []
    blocks = BLOCK.findall(text)
    if len(blocks) != len(MARK.findall(text)):
        problems.append(f"{rel}: a 'Printed by' line without its '<!-- end of printed output -->'")
    if not blocks:
        problems.append(f"{rel}: no printed block")
    for cmd, want in blocks:
        argv = shlex.split(cmd)
        if len(argv) < 2 or argv[0] != "python3" or not argv[1].startswith("experiments/") or not argv[1].endswith(".py"):
            problems.append(f"{rel}: '{cmd}' is not 'python3 experiments/...py ARGS'")
            continue
        run = subprocess.run([sys.executable] + argv[1:], cwd=root, capture_output=True, text=True)
        if run.returncode != 0:
            problems.append(f"{rel}: '{cmd}' failed (exit {run.returncode}): {run.stderr.strip()[:300]}")
            continue
        got, want = run.stdout.rstrip(), want.rstrip()
        if got != want and write:
            old = f"Printed by `{cmd}`:\n\n{want}"
            i = new_text.index(old)
            j = new_text.index("<!-- end of printed output -->", i + len(old))
            new_text = new_text[:i] + f"Printed by `{cmd}`:\n\n{got}\n" + new_text[j:]
            print(f"{rel}: rewrote the block of '{cmd[:100]}'")
        elif got != want:
            gl, wl = got.split("\n"), want.split("\n")
            i = next((k for k in range(min(len(gl), len(wl))) if gl[k] != wl[k]), min(len(gl), len(wl)))
            problems.append(f"{rel}: '{cmd}' prints otherwise, first at line {i + 1} of the block:\n"
                            f"    page:   {wl[i] if i < len(wl) else '(end)'}\n"
                            f"    script: {gl[i] if i < len(gl) else '(end)'}")
    if new_text != text:
        with open(page, "w", encoding="utf-8") as f:
            f.write(new_text)
    return len(blocks), problems


def main(argv):
    write = "--write" in argv
    argv = [a for a in argv if a != "--write"]
    if len(argv) != 1:
        print("usage: check_tables.py SOURCE_ROOT [--write]", file=sys.stderr)
        return 2
    root = argv[0]
    pages = sorted(glob.glob(os.path.join(root, "experiments", "*", "RESULTS.md")) +
                   glob.glob(os.path.join(root, "experiments", "*", "TRAFFIC.md")) +
                   glob.glob(os.path.join(root, "experiments", "*", "CLUSTER.md")))
    if not pages:
        print("check_tables: no experiments/*/RESULTS.md", file=sys.stderr)
        return 1
    total, problems = 0, []
    for p in pages:
        n, pr = check_page(root, p, write)
        total += n
        problems += pr
    for p in problems:
        print(p)
    print(f"check_tables: {total} printed blocks in {len(pages)} pages, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
