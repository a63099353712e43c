"""`ansible-test sanity`, the Ansible collection ecosystem's own gate (issue 37 part 3), as a maintainer runs it:
compile, import, yamllint, pep8 (ansible-test's: pycodestyle, 160 columns), shebang and validate-modules, from a
collection at ansible_collections/rigbook/homelab, by the .venv's ansible-test (2.19) and by the newest ansible-core
(helpers.collection.NEWEST, its own venv).

Layout: the checkout's root is the collection's, but its tests/ is pytest's (unit and integration tests of the CLI
and the collection), not ansible-test's, and galaxy.yml's build_ignore leaves tests/, src/, scripts/, benchmarks/
out of what ships. So the sanity run is on what users get: the tarball `ansible-galaxy collection build` makes,
installed into a temporary ansible_collections tree, plus the checkout's tests/sanity/ (ansible-test's ignore files,
tests/sanity/ignore-X.Y.txt, where ansible-test looks for them) when there is one. There is none today: every test
passes with nothing ignored. An ignore file may only hold lines that say why (`PATH TEST:CODE  # reason`).

ansible-test creates a venv per sanity test and bootstraps pip in each with a script it downloads from
ci-files.testing.ansible.com (get-pip-X.Y.py), which this machine cannot reach; it uses a copy already in
~/.ansible/test/cache/get_pip_X_Y.py instead. `_bootstrap_stand_in()` puts a script there that calls `ensurepip`
(the pip bundled with that Python), then has that pip install the pip release ansible-test asked for, from PyPI
like the sanity requirements themselves. HOME is a cache folder of this test's (the sanity venvs are kept there
between runs), so the user's ~/.ansible is never touched.
"""

from __future__ import annotations

import fcntl
import re
import shutil
import sys
import time
from pathlib import Path

import pytest
from helpers import collection

TESTS = ["compile", "import", "yamllint", "pep8", "shebang", "validate-modules"]

STAND_IN = '''\
# Stand-in for ansible-test's pip bootstrap script (tests/test_ansible_test_sanity.py wrote it): ansible-test runs
# it in a new venv as `python get_pip_X_Y.py --disable-pip-version-check pip==X.Y [--no-setuptools] [--no-wheel]`.
# ensurepip installs the pip bundled with this Python instead of pip==X.Y (the sanity requirements install the same
# with it, and ansible-test removes pip from the venv once they are in); setuptools goes when it is not wanted.
import os
import subprocess
import sys

env = dict(os.environ, PIP_NO_COMPILE="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
subprocess.check_call([sys.executable, "-m", "ensurepip", "--default-pip"], env=env)
if "--no-setuptools" in sys.argv:
    subprocess.call([sys.executable, "-m", "pip", "uninstall", "-q", "-y", "setuptools"], env=env)
'''


def _bootstrap_stand_in(bin_dir, home):
    """Write the ensurepip stand-in where this ansible-test looks for its pip bootstrap script (the pip release it
    pins is in its python_requirements.get_venv_packages)."""
    python = bin_dir / "python"
    proc = collection.run([python, "-c", "import ansible_test, os; print(os.path.dirname(ansible_test.__file__))"])
    assert proc.returncode == 0, proc.stderr
    source = (Path(proc.stdout.strip()) / "_internal" / "python_requirements.py").read_text()
    match = re.search(r"pip='([0-9.]+)'", source)
    assert match, "no pinned pip release in ansible-test's python_requirements.py"
    cache = home / ".ansible" / "test" / "cache"
    cache.mkdir(parents=True, exist_ok=True)
    (cache / f"get_pip_{match.group(1).replace('.', '_')}.py").write_text(STAND_IN)


def _ignore_files_say_why(repo):
    for path in sorted((repo / "tests" / "sanity").glob("ignore-*.txt")):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            entry = line.split("#", 1)[0].strip()
            reason = line.split("#", 1)[1].strip() if "#" in line else ""
            assert reason or not entry, f"{path.name}:{number} ignores {entry!r} without saying why"


@pytest.mark.parametrize("which", ["venv", "newest"])
def test_ansible_test_sanity_passes(which, repo, tmp_path):
    _ignore_files_say_why(repo)
    tarball = collection.build(tmp_path / "built")
    if which == "venv":
        bin_dir, python = collection.BIN, sys.version_info[:2]
    else:  # the venv test_collection_as_installed.py runs the newest release in
        bin_dir = collection.ansible_core(collection.NEWEST, tuple(collection.requirements(tarball)))
        python = collection.python_for(collection.NEWEST)[1]
    home = collection.CACHE / "ansible-test-home"
    installed = collection.install(tarball, tmp_path / "collections", bin_dir, tmp_path / "home")
    root = installed / "ansible_collections" / "rigbook" / "homelab"
    if (repo / "tests" / "sanity").is_dir():
        shutil.copytree(repo / "tests" / "sanity", root / "tests" / "sanity")
    argv = [bin_dir / "ansible-test", "sanity", "--python", f"{python[0]}.{python[1]}", "--local", "--color", "no"]
    for name in TESTS:
        argv += ["--test", name]
    home.mkdir(parents=True, exist_ok=True)
    # one ansible-test at a time in the shared HOME (its sanity venvs are made there on first use)
    with open(str(home) + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        _bootstrap_stand_in(bin_dir, home)
        started = time.monotonic()
        proc = collection.run(argv, cwd=root, env=collection.isolated_env(installed, home), timeout=900)
        took = time.monotonic() - started
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    for name in TESTS:
        assert f'Running sanity test "{name}"' in output, output
    print(f"ansible-test sanity ({which}): {took:.0f} s")
