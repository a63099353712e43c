"""CLI resolution and exit codes for bad input (no host is contacted by any of these)."""

from __future__ import annotations

import json
import re
import shlex
from types import SimpleNamespace

import ansible_runner
import pytest
from helpers.cli import provision

from rigbook.cli import main
from rigbook.errors import UserError
from rigbook.run import resolve_inventory, resolve_playbook


def test_names_resolve_to_the_collection(repo):
    assert resolve_playbook("site.yml") == repo / "playbooks" / "site.yml"
    assert resolve_playbook("site") == repo / "playbooks" / "site.yml"
    assert resolve_inventory("homelab") == repo / "inventory" / "homelab"


def test_real_paths_win(tmp_path):
    book = tmp_path / "site.yml"
    book.write_text("---\n- hosts: all\n  tasks: []\n")
    assert resolve_playbook(str(book)) == book
    assert resolve_inventory(str(tmp_path)) == tmp_path


def test_unknown_names_list_what_exists():
    with pytest.raises(UserError, match="available: .*site.yml"):
        resolve_playbook("nope.yml")
    with pytest.raises(UserError, match="available: .*homelab"):
        resolve_inventory("nowhere")


@pytest.mark.parametrize(
    "args,words",
    [
        (["missing.yml", "-i", "homelab"], "playbook 'missing.yml' not found"),
        (["valdate"], "unknown command 'valdate': the commands are adopt, baseline, bootstrap, diagnose, diff, lab,"),
        (["bogus", "-i", "homelab"], "unknown command 'bogus'"),
        (["site.yml", "-i", "no-such-inventory"], "inventory 'no-such-inventory' not found"),
        (["site.yml", "-i", "homelab", "-e", "novalue"], "expected KEY=VALUE"),
        (["site.yml", "-i", "homelab", "-e", "@/nonexistent/vars.yml"], "does not exist"),
        (["validate", "-i", "nowhere"], "inventory 'nowhere' not found"),
    ],
)
def test_bad_input_exits_2_with_one_message(args, words):
    proc = provision(*args)
    assert proc.returncode == 2, proc.stderr
    assert words in proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stdout == ""


def test_usage_error_exits_2():
    proc = provision("site.yml")  # no -i
    assert proc.returncode == 2
    assert "-i/--inventory" in proc.stderr


def test_help_lists_commands_and_exit_codes():
    proc = provision("--help")
    assert proc.returncode == 0
    for word in ("validate", "runs", "lab", "parse", "130 interrupted"):
        assert word in proc.stdout


def test_validate_homelab_names_what_only_its_owners_can_supply():
    """Everything the two write-ups state is in inventory/homelab; what they do not publish is named, each with its
    key path, and nothing else (exit 2, no traceback); what must be on the boxes is listed first, then the values the
    inventory guessed (rigbook_unconfirmed), apart from the owners' inputs."""
    proc = provision("validate", "-i", "homelab")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    named = re.findall(r"host (rig-[0-9a-z]+): (rigbook_[a-z_.\[\]0-9]+): needed by the ([a-z_0-9]+) role: .+; how: .+",
                       proc.stderr)
    assert named == [
        ("rig-3080", "rigbook_pins.nvidia_driver.commit", "nvidia_p2p_driver"),
        ("rig-3080", "rigbook_pins.nvidia_driver.userspace_installer", "nvidia_p2p_driver"),
        ("rig-r9700", "rigbook_pins.kernel.debs", "kernel"),
        ("rig-r9700", "rigbook_pins.rocm.version", "amd_rocm"),
        ("rig-r9700", "rigbook_pins.rocm.repo", "amd_rocm"),
        ("rig-r9700", "rigbook_pins.rocm.dkms", "amd_rocm"),  # RDNA4 on a 6.8 kernel: said, not defaulted
        ("rig-r9700", "rigbook_pins.rccl.source", "rccl"),
        ("rig-r9700", "rigbook_pins.rccl.tests.source", "rccl"),
        ("rig-r9700", "rigbook_pins.sglang.patches[0].path", "sglang"),  # BF16 PV, the owner's
        ("rig-r9700", "rigbook_pins.sglang.patches[1].path", "sglang"),  # RDNA4 Patch065, the owner's
    ], proc.stderr
    assert "inventory is not ready: 10 inputs the play needs are missing (nothing was contacted)" in proc.stderr
    boxes, rest = proc.stderr.split("\nunconfirmed: ")
    guessed, _errors = rest.split("\nerror: ")
    for path in ("/srv/models/Qwen3.8-27B-AWQ ", "/srv/models/Qwen3.8-27B-DFlash2-W4A16 ",
                 "/srv/models/scales/qwen38-fp8-kv-scales-per-head.json ",
                 "/srv/wheels/sglang-0.5.18-rocm7.1 ", "/srv/models/Qwen3.8-27B-AWQ-MTP "):
        assert path in boxes, boxes
    assert guessed.startswith("21 values of the inventory guessed") and "needed by the" not in guessed
    assert "host rig-r9700: rigbook_serve[0].context_length = 196608: " in guessed


def test_validate_the_lab_is_ready():
    proc = provision("validate", "-i", "lab")
    assert proc.returncode == 0, proc.stderr
    assert "valid and ready for site.yml (2 hosts; groups: lab, x99_3080, x99_r9700)" in proc.stdout


def test_runs_with_no_history(tmp_path):
    proc = provision("runs", env={"RIGBOOK_STATE_DIR": str(tmp_path)})
    assert proc.returncode == 0
    assert "no runs yet" in proc.stdout


@pytest.mark.parametrize("raw,problem", [
    (b'"a string"', "not a JSON object but str"),
    (b'["a", "list"]', "not a JSON object but list"),
    (b'{"hosts": ["rig-a"]}', "hosts is not an object but list"),
    (b'{"hosts": {"rig-a": "ok"}}', "hosts.rig-a is not an object but str"),
    (b'{"hosts": {"rig-a": {"state": ["failed"]}}}', "hosts.rig-a.state is not a string but list"),
    (b'{"hosts": {"rig-a": {"failures": "boom"}}}', "hosts.rig-a.failures is not a list of objects"),
    (b'{"hosts": {"rig-a": {"ladder": [{"layer": "x", "status": ["fail"]}]}}}',
     "hosts.rig-a.ladder[0].status is not a string but list"),
    (b'{"exit_code": [1]}', "exit_code is not a whole number but list"),
    (b'{"started": 5}', "started is not a string but int"),
    (b"{not json", "not valid JSON"),
    (b"\xff\xfe{}", "not UTF-8 text"),
], ids=lambda value: value if isinstance(value, str) else None)
def test_runs_names_a_bad_run_record_and_lists_the_others(tmp_path, raw, problem):
    """`provision runs` over a run.json of the wrong shape: a warning line naming the file and what is wrong, the run
    listed as a bad record, the other runs listed as before; exit 0, no traceback."""
    runs = tmp_path / "runs"
    good, bad = runs / "20250101-000000-site-aaaaaa", runs / "20250102-000000-site-bbbbbb"
    good.mkdir(parents=True)
    bad.mkdir()
    (good / "run.json").write_text('{"started": "2025-01-01 00:00:00", "playbook": "site.yml", "inventory": "lab", '
                                   '"exit_code": 1, "hosts": {"rig-a": {"state": "failed"}}}')
    (bad / "run.json").write_bytes(raw)
    proc = provision("runs", env={"RIGBOOK_STATE_DIR": str(tmp_path)})
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.startswith(f"warning: run record {bad / 'run.json'} is unusable: {problem}")
    assert proc.stderr.count("\n") == 1 and proc.stderr.endswith("; listed as a bad record\n")
    assert proc.stdout.splitlines() == ["?  bad record  ? -i ?  hosts=0", f"    {bad}",
                                        "2025-01-01 00:00:00  failed      site.yml -i lab  hosts=1  failed: rig-a",
                                        f"    {good}"]


def test_runs_names_a_run_record_that_cannot_be_read(tmp_path):
    (tmp_path / "runs" / "20250102-000000-site-bbbbbb" / "run.json").mkdir(parents=True)
    proc = provision("runs", env={"RIGBOOK_STATE_DIR": str(tmp_path)})
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert "run.json is unusable: cannot read: Is a directory" in proc.stderr


@pytest.mark.parametrize("flags, verify, runs", [
    ([], False, 1),
    (["--verify-builds"], True, 1),
    (["--verify-builds", "--rolling"], True, 2),  # each batch's run: the canary and the other lab host
])
def test_verify_builds_reaches_every_run_as_rigbook_verify_builds(tmp_path, monkeypatch, flags, verify, runs):
    """`--verify-builds` is the extra variable rigbook_verify_builds of each playbook run (roles/group_build reads
    it), beside the builds folder the controller keeps the archives and their provenance records in."""
    monkeypatch.setenv("RIGBOOK_STATE_DIR", str(tmp_path / "state"))
    seen = []

    def finished(**kwargs):
        words = shlex.split(kwargs["cmdline"])
        seen.append([json.loads(v) for v in words[1::2] if v.startswith("{")])
        return SimpleNamespace(status="successful", rc=0, stdout=None)

    monkeypatch.setattr(ansible_runner, "run", finished)
    main(["site.yml", "-i", "lab", *flags])
    assert len(seen) == runs
    for extra in seen:
        [ours] = [e for e in extra if "rigbook_builds_dir" in e]
        assert ours["rigbook_verify_builds"] is verify
        assert ours["rigbook_builds_dir"] == str(tmp_path / "state" / "builds")


def test_verify_builds_is_in_the_help():
    proc = provision("site.yml", "--help")
    assert proc.returncode == 0 and "--verify-builds" in proc.stdout and "naming both boxes" in proc.stdout
