"""src/rigbook/lab/supervisor.py: the loop that keeps a lab host's container running, with a stand-in for nspawn
(no root, no container): a reboot (exit 133) boots it again, any other exit ends the loop."""

from __future__ import annotations

import json
import subprocess
import sys

from rigbook.lab.tracking import SUPERVISOR
from rigbook.paths import link_collection

# Boot 1 exits as a reboot does (133), boot 2 as a poweroff; each prints the locale it was started with.
STANDIN = """
import os, pathlib, sys
count = pathlib.Path(sys.argv[1])
boots = int(count.read_text()) + 1 if count.exists() else 1
count.write_text(str(boots))
print("standin boot", boots, "LC_ALL=" + os.environ.get("LC_ALL", ""), "stdin=" + repr(sys.stdin.read()), flush=True)
sys.exit(133 if boots == 1 else 0)
"""


def test_the_supervisor_boots_again_after_a_reboot_and_records_each_boot(tmp_path):
    host = tmp_path / "host"
    host.mkdir()
    spec = {"dir": str(host), "cgroups": [], "console": str(host / "console.log"),
            "nspawn": [sys.executable, "-c", STANDIN, str(tmp_path / "count")],
            "collections": str(link_collection())}
    (host / "supervisor.json").write_text(json.dumps(spec))
    proc = subprocess.run([sys.executable, "-I", str(SUPERVISOR), str(host / "supervisor.json")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    console = (host / "console.log").read_text()
    assert "=== rigbook lab: boot 1 at " in console and "=== rigbook lab: nspawn exited 133 ===" in console
    assert "=== rigbook lab: boot 2 at " in console and "=== rigbook lab: nspawn exited 0 ===" in console
    assert "standin boot 2 LC_ALL=C stdin=''" in console  # started through facts/runner.spawn
    assert (host / "boots").read_text() == "2\n" and (host / "exit").read_text() == "0\n"
    assert (host / "nspawn.pid").read_text().strip().isdigit()
    assert sorted(p.name for p in host.iterdir()) == ["boots", "console.log", "exit", "nspawn.pid", "supervisor.json"]
