"""rigbook.snapshots' replay as the real single-GPU run met it (docs real-gpu-run.md, defect 12): the replay shows the
layers a live `provision verify` of the host shows, and names the paths inside the snapshot, never the temporary
folder it was unpacked into (deleted when the replay ends)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile

import yaml
from ansible_collections.rigbook.homelab.plugins.module_utils.ladder import registry
from helpers.cli import REPO
from jinja2.nativetypes import NativeEnvironment

from rigbook.snapshots import OLD_LADDER_VIEW_FILE, replay_tree

SNAPSHOT = "device/h200-snapshot.tar.gz"  # taken with `provision snapshot` on the real H200 VM (no serve profile)


def _replay(*args):
    return subprocess.run([sys.executable, "-m", "rigbook", "verify", "--replay", *map(str, args)],
                          capture_output=True, text=True, timeout=120)


def _live_layers(serve: list) -> list:
    """The layers a live verify of a host with the serve profiles SERVE judges: those of the phases the p2p_verify
    role's default p2p_verify_phases names (its Jinja2 expression rendered to a list, as Ansible's native types do),
    in ladder order."""
    default = yaml.safe_load((REPO / "roles/p2p_verify/defaults/main.yml").read_text())["p2p_verify_phases"]
    phases = NativeEnvironment().from_string(default).render(rigbook_host={"serve": serve})
    assert set(phases) <= {"static", "runtime", "serving"}, phases
    return [name for phase in phases for name in registry.names(phase)]


def test_a_replay_of_the_real_snapshot_names_paths_inside_it_not_its_temporary_folder(fixtures):
    snapshot = fixtures / SNAPSHOT
    as_json, plain = _replay(snapshot, "--json"), _replay(snapshot)
    assert as_json.returncode == plain.returncode == 0, plain.stderr
    for out in (as_json.stdout, plain.stdout):
        # the snapshot's own path may lie under /tmp (a checkout there): no other temporary path is named
        assert "rigbook-replay-" not in out and "/tmp/" not in out.replace(str(snapshot), "SNAPSHOT")
    ladder = {v["layer"]: v for v in json.loads(as_json.stdout)["hosts"]["h200"]["ladder"]}
    assert ladder["collectives"]["why"] == ("one GPU: no collective between GPUs (no recorded collectives.json or "
                                            f"nccl-tests output under {snapshot}:h200/tree)")
    assert f"no recorded collectives.json or nccl-tests output under {snapshot}:h200/tree" in plain.stdout


def test_a_replay_of_a_folder_names_the_folder_as_it_is(fixtures, tmp_path):
    """A folder given to --replay is not unpacked anywhere: its own paths are the ones to name."""
    with tarfile.open(fixtures / SNAPSHOT) as tar:
        tar.extractall(tmp_path / "snap", filter="data")
    proc = _replay(tmp_path / "snap", "--json")
    assert proc.returncode == 0, proc.stderr
    ladder = {v["layer"]: v for v in json.loads(proc.stdout)["hosts"]["h200"]["ladder"]}
    assert f"under {tmp_path / 'snap' / 'h200' / 'tree'})" in ladder["collectives"]["why"]


def test_a_replay_shows_the_layers_a_live_verify_shows(fixtures, tmp_path):
    """Live, the serving phase runs only on a host with serve profiles: without one a verify prints the nine layers of
    the static and runtime phases, and so does the replay of its snapshot (it printed a tenth, `serving: skip`). A
    host whose ladder view expects the serving layer (serve profiles) has it in both."""
    with tarfile.open(fixtures / SNAPSHOT) as tar:
        tar.extractall(tmp_path, filter="data")
    host = tmp_path / "h200"
    view = json.loads((host / OLD_LADDER_VIEW_FILE).read_text())  # taken before the file's rename
    assert not (view.get("measure") or {}).get("serving")
    replayed = [v["layer"] for v in replay_tree(str(host / "tree"), view)]
    assert replayed == _live_layers([]) and len(replayed) == 9 and "serving" not in replayed
    serving = {**view, "measure": {**view.get("measure", {}), "serving": True}}
    replayed = [v["layer"] for v in replay_tree(str(host / "tree"), serving)]
    assert replayed == _live_layers([{"name": "chat"}]) == registry.names()


def test_the_cli_replay_prints_the_live_layer_set(fixtures, tmp_path):
    copy = tmp_path / "h200-snapshot.tar.gz"
    shutil.copy(fixtures / SNAPSHOT, copy)
    proc = _replay(copy, "--json")
    assert proc.returncode == 0, proc.stderr
    assert [v["layer"] for v in json.loads(proc.stdout)["hosts"]["h200"]["ladder"]] == _live_layers([])


def test_a_snapshot_changes_nothing_and_says_so(tmp_path):
    """`provision snapshot` only reads: on this machine (the shipped localhost inventory, a local connection) every
    task of playbooks/snapshot.yml reports ok, none changed (fetching the archive into the command's own staging
    folder reported a change: `h200 | changed | 3 | 1`)."""
    out = tmp_path / "localhost-snapshot.tar.gz"
    proc = subprocess.run([sys.executable, "-m", "rigbook", "snapshot", "-i", "localhost", "-o", str(out), "--json"],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env={**os.environ, "RIGBOOK_STATE_DIR": str(tmp_path / "state")})
    assert proc.returncode == 0, proc.stderr[-2000:]
    host = json.loads(proc.stdout)["hosts"]["localhost"]
    assert (host["state"], host["changed"], host["ok"]) == ("ok", 0, 3), host
    assert out.is_file()
