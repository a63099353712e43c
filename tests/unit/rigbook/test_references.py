"""rigbook.references: the shipped per-hardware-class figures (references/*.yml, from the seeds' write-ups) that judge
a box from its first run, until a baseline of its own or its group's exists (baselines.resolve)."""

from __future__ import annotations

import pytest
from ansible_collections.rigbook.homelab.plugins.module_utils.judges.collective_layers import judge_collectives
from ansible_collections.rigbook.homelab.plugins.module_utils.judges.peer_layers import judge_p2p_bandwidth
from helpers.cli import provision

from rigbook import baselines, references
from rigbook.errors import UserError
from rigbook.inventory import load

INVENTORY = """---
all:
  children:
    x99_r9700:
      vars:
        rigbook_reference: x99-r9700-pair
      hosts:
        box-a: {}
        box-b: {}
    plain:
      hosts:
        box-c: {}
"""
# what the lab's R9700 twin measures (src/rigbook/lab/rigs/x99-r9700.yml, seed 004's figures)
PROBE = {"available": True, "api": "hip", "devices": [{"index": 0}, {"index": 1}],
         "pairs": [{"src": 0, "dst": 1, "can_access_peer": True, "enable_peer": "ok", "peer_gbs": 10.29,
                    "host_staged_gbs": 6.9},
                   {"src": 1, "dst": 0, "can_access_peer": True, "enable_peer": "ok", "peer_gbs": 10.29,
                    "host_staged_gbs": 6.9}],
         "bidir": [{"a": 0, "b": 1, "gbs": 19.7}]}
VIEW = {"gpu": {"vendor": "amd", "count": 2, "pcie": {"gen": 3, "width": 16}}, "p2p": {"expected": True}}


@pytest.fixture
def inv(tmp_path, monkeypatch):
    monkeypatch.setenv("RIGBOOK_STATE_DIR", str(tmp_path / "state"))
    path = tmp_path / "hosts.yml"
    path.write_text(INVENTORY)
    return load(path)


def test_every_shipped_reference_cites_its_source_and_holds_figures():
    assert references.names() == ["x99-3080-pair", "x99-r9700-pair"]
    for name in references.names():
        reference = references.load(name)
        assert reference["metrics"] and all(isinstance(v, float) for v in reference["metrics"].values())
        assert reference["source"].startswith("Seed 00") and reference["describes"]
    assert references.load("x99-3080-pair")["metrics"]["peer_gbs_0_1"] == 6.0  # seed 000: 6.0 GB/s, host-staged
    assert references.load("x99-r9700-pair")["metrics"]["sendrecv_busbw_gbs"] == 9.75  # seed 004


def test_a_box_without_a_baseline_is_judged_by_its_reference_and_its_own_wins_later(inv):
    assert baselines.resolve("box-a", inv)[0] == "reference x99-r9700-pair"
    assert baselines.resolve("box-c", inv) == ("none", None)
    given = baselines.extra_vars(["box-a", "box-c"], inv)["rigbook_baselines"]
    assert given["box-a"]["source"] == "reference x99-r9700-pair" and given["box-a"]["at"] is None
    assert "box-c" not in given
    assert baselines.judged_text("reference x99-r9700-pair", inv.path).startswith(
        "reference x99-r9700-pair (shipped figures of its hardware class")
    baselines.record("box-a", [{"layer": "collectives", "status": "pass", "metrics": {"sendrecv_busbw_gbs": 9.0}}],
                     "/runs/x", inv)
    assert baselines.resolve("box-a", inv)[0] == "host box-a"
    baselines.record_groups(inv, {"box-a": baselines.load("box-a", inv)["recorded"]}, "*")
    assert baselines.resolve("box-b", inv)[0] == "group x99_r9700"


def test_the_reference_passes_a_healthy_box_on_its_first_run_and_fails_a_halved_twin():
    held = references.load("x99-r9700-pair")["metrics"]
    healthy = judge_p2p_bandwidth(PROBE, VIEW, held)
    assert healthy["status"] == "pass" and "peer_gbs_0_1 10.29 vs baseline 10.29 (1.00x)" in healthy["why"]
    halved = dict(PROBE, pairs=[dict(p, peer_gbs=p["peer_gbs"] / 2) for p in PROBE["pairs"]],
                  bidir=[dict(PROBE["bidir"][0], gbs=9.85)])
    failed = judge_p2p_bandwidth(halved, VIEW, held)
    assert failed["status"] == "fail" and "fell against the baseline" in failed["why"]
    results = [{"op": op, "busbw_gbs": held[f"{op}_busbw_gbs"] * 0.5, "wrong": 0}
               for op in ("sendrecv", "all_reduce", "all_gather", "reduce_scatter")]
    collectives = judge_collectives({"available": True, "results": results}, VIEW, held)
    assert collectives["status"] == "fail"


def test_a_reference_that_is_not_shipped_is_named_by_validate(tmp_path):
    path = tmp_path / "hosts.yml"
    path.write_text(INVENTORY.replace("x99-r9700-pair", "x99-nope"))
    proc = provision("validate", "-i", str(path))
    assert proc.returncode == 2 and "rigbook_reference" in proc.stdout + proc.stderr
    assert "'x99-nope' is no shipped reference (shipped: x99-3080-pair, x99-r9700-pair" in proc.stdout + proc.stderr


@pytest.mark.parametrize("text, words", [
    ("name: other\nmetrics: {a: 1.0}\n", "not a reference"),
    ("name: bad\nmetrics: [1, 2]\n", "not a reference"),
    ("name: bad\nmetrics: {a: '{{ lookup(\"pipe\", \"id\") }}'}\n", "holds no figure"),
    ("name: bad\nmetrics: {a: 1.0\n", "not readable as YAML"),
])
def test_a_reference_file_is_data_checked_where_it_is_read(tmp_path, monkeypatch, text, words):
    (tmp_path / "references").mkdir()
    (tmp_path / "references" / "bad.yml").write_text(text)
    monkeypatch.setattr(references, "folder", lambda: tmp_path / "references")
    with pytest.raises(UserError, match=words):
        references.load("bad")
    with pytest.raises(UserError, match="no such reference"):
        references.load("../bad")
