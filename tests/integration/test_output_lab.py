"""What a CI user reads (marker: lab): `provision verify -i lab` with stdout a pipe prints every figure of the run's
summary in full - the same summary `--json` prints, kept in the run's record - never cut to a terminal's width."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from helpers.cli import provision
from helpers.lab_host import LAB_MARKS
from helpers.report import leaves

pytestmark = [*LAB_MARKS, pytest.mark.usefixtures("converged_lab")]


def test_verify_in_a_pipe_prints_every_measured_figure_uncut():
    proc = provision("verify", "-i", "lab", timeout=900)  # stdout and stderr are pipes here
    text = proc.stdout + proc.stderr
    assert proc.returncode in (0, 1), text[-3000:]
    assert "…" not in text
    run_dir = re.search(r"^run artifacts: (\S+)$", text, re.M).group(1)
    hosts = json.loads((Path(run_dir) / "run.json").read_text())["hosts"]
    checked = 0
    for host, summary in hosts.items():
        assert summary["ladder"], host
        for verdict in summary["ladder"]:
            assert f"  {verdict['layer']}: {verdict['status']}" in text, (host, verdict["layer"])
            for key in ("measured", "expected", "metrics", "why", "remedy"):
                for leaf in leaves(verdict.get(key)):
                    assert leaf in text, (host, verdict["layer"], key, leaf)
                    checked += 1
    assert set(hosts) == {"lab-3080", "lab-r9700"} and checked > 100, checked
