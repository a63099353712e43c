"""build_lock: one build per install path on a host; a second run waits for the build a cut-short run left going."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import ansible_collections
from ansible_collections.rigbook.homelab.plugins.module_utils import build_lock

HOLDER = """
import sys, time
sys.path.insert(0, sys.argv[1])
from ansible_collections.rigbook.homelab.plugins.module_utils import build_lock
build_lock.LOCK_DIR = sys.argv[2]
build_lock.hold("/opt/rigbook/rccl/2.27.7-abc")
print("held", flush=True)
time.sleep(float(sys.argv[3]))
"""


def test_a_second_build_of_the_same_path_waits_for_the_first_process(tmp_path, monkeypatch):
    monkeypatch.setattr(build_lock, "LOCK_DIR", str(tmp_path / "locks"))
    monkeypatch.setattr(build_lock, "_HELD", {})
    root = str(Path(ansible_collections.__path__[0]).parent)  # where this test process finds the collection
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, root, str(tmp_path / "locks"), "1.5"],
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    notes = []
    started = time.monotonic()
    waited = build_lock.hold("/opt/rigbook/rccl/2.27.7-abc", notes.append)
    assert time.monotonic() - started >= 1.0 and waited >= 1.0, waited
    assert notes == ["waiting for another build of /opt/rigbook/rccl/2.27.7-abc to finish (a run cut short leaves "
                     "its build running)"]
    assert holder.wait(timeout=10) == 0
    # another path is not held by it; the same path again in this process does not wait on itself
    assert build_lock.hold("/opt/rigbook/sglang/0.5.23-stock") == 0.0
    assert build_lock.hold("/opt/rigbook/rccl/2.27.7-abc") == 0.0
    assert sorted(p.name for p in (tmp_path / "locks").iterdir()) == [
        "opt_rigbook_rccl_2.27.7-abc.lock", "opt_rigbook_sglang_0.5.23-stock.lock"]
