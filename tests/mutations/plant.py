"""Plant each bug of mutations.yml in turn, run the tests that must catch it, put the file back.

    python tests/mutations/plant.py [ID ...] [--list] [--markdown FILE] [-- PYTEST ARGS]

Run by hand from the checkout (with its .venv: `bash scripts/test` makes it), never beside another lab user: a
bug's tests may bring up the lab. For each bug: `find` must occur exactly once in its file; the file is rewritten
with `replace`, its tests run in one pytest process, and the file's original bytes are written back whatever
happens (a test failure, an error, Ctrl-C). A bug is CAUGHT when tests failed (exit 1) and none errored, MISSED
when every test passed (exit 0); anything else (a setup error such as a lab that did not come up, no tests, a
usage or collection error) is an ERROR, never a catch.
Prints one line per bug and the tests that failed; exit 0 only when every bug run was caught.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
LIST = Path(__file__).with_name("mutations.yml")


def load() -> list:
    data = yaml.safe_load(LIST.read_text())
    mutations = data["mutations"]
    ids = [m["id"] for m in mutations]
    if len(ids) != len(set(ids)):
        raise SystemExit(f"{LIST}: an id is used twice")
    return mutations


def outcomes(junit: Path) -> tuple:
    """([failed test], [errored test]) of a pytest JUnit XML file, as node names. A failure is an assertion of the
    test itself; an error is its setup or teardown breaking (a lab that did not come up), which catches nothing."""
    failed, errored = [], []
    if junit.is_file():
        for case in ET.parse(junit).getroot().iter("testcase"):
            name = f"{case.get('classname', '').replace('.', '/')}.py::{case.get('name')}"
            if case.find("failure") is not None:
                failed.append(name)
            elif case.find("error") is not None:
                errored.append(name)
    return failed, errored


def plant(mutation: dict, pytest_args: list) -> tuple:
    """(result, failed test names, seconds) of MUTATION planted; the file is restored before returning."""
    path = REPO / mutation["file"]
    original = path.read_bytes()
    text = original.decode()
    count = text.count(mutation["find"])
    if count != 1:
        return f"ERROR: `find` occurs {count} times in {mutation['file']}", [], 0.0
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        junit = Path(tmp) / "junit.xml"
        try:
            path.write_text(text.replace(mutation["find"], mutation["replace"]))
            proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                                   f"--junitxml={junit}", *mutation["tests"], *pytest_args], cwd=REPO)
        finally:
            path.write_bytes(original)
        failed, errored = outcomes(junit)
    elapsed = time.monotonic() - started
    if errored:
        return f"ERROR: {len(errored)} tests could not run ({errored[0]})", failed, elapsed
    if proc.returncode == 1 and failed:
        return "CAUGHT", failed, elapsed
    if proc.returncode == 0:
        return "MISSED", [], elapsed
    return f"ERROR: pytest exit {proc.returncode}", failed, elapsed


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("ids", nargs="*", help="the bugs to plant (default: all)")
    parser.add_argument("--list", action="store_true", help="list the bugs and their tests; plant nothing")
    parser.add_argument("--markdown", metavar="FILE", help="also write the results as a Markdown table to FILE")
    args, pytest_args = parser.parse_known_args(argv)
    pytest_args = [a for a in pytest_args if a != "--"]
    mutations = load()
    known = {m["id"] for m in mutations}
    unknown = [i for i in args.ids if i not in known]
    if unknown:
        print(f"unknown bug: {', '.join(unknown)} (known: {', '.join(sorted(known))})", file=sys.stderr)
        return 2
    chosen = [m for m in mutations if not args.ids or m["id"] in args.ids]
    if args.list:
        for m in chosen:
            print(f"{m['id']}: {m['bug']}\n  {m['file']}\n  " + "\n  ".join(m["tests"]))
        return 0
    rows = []
    for m in chosen:
        print(f"== planting {m['id']}: {m['bug']}", flush=True)
        result, failed, elapsed = plant(m, pytest_args)
        rows.append((m, result, failed, elapsed))
        print(f"== {m['id']}: {result} in {elapsed:.0f} s" + "".join(f"\n   caught by {t}" for t in failed),
              flush=True)
    print("\nresults:")
    for m, result, failed, elapsed in rows:
        print(f"  {m['id']:32s} {result} ({len(failed)} tests failed, {elapsed:.0f} s)")
    if args.markdown:
        lines = ["| bug | planted in | result | tests that failed |", "|---|---|---|---|"]
        for m, result, failed, elapsed in rows:
            shown = "<br>".join(f"`{t}`" for t in failed[:6]) + (f"<br>and {len(failed) - 6} more"
                                                                   if len(failed) > 6 else "")
            lines.append(f"| {m['id']}: {m['bug']} | `{m['file']}` | {result} ({elapsed:.0f} s) | {shown} |")
        Path(args.markdown).write_text("\n".join(lines) + "\n")
    return 0 if all(r == "CAUGHT" for _, r, _, _ in rows) else 1


if __name__ == "__main__":
    os.chdir(REPO)
    sys.exit(main())
