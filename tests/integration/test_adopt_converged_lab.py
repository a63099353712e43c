"""`provision adopt` of the converged lab (marker: lab): each host, converged by site.yml from inventory/lab, adopted
back into pins; what the pins mean to rigbook (the host model every role and the ladder read:
plugins/module_utils/host_model.build) equals what the lab inventory's own pins mean, once the items adopt lists as
not pinned are filled in as that list says. What differs in form and why:

- lab-r9700's kernel: inventory/lab installs the Debian archive's .debs from the artifact folder (source: debs);
  the archive offers those very versions, so adopt pins them by name (source: distro) and names each .deb it found
  in --debs-dir with its sha256, which must be the lab's.
- lab-r9700's ROCm key: adopt pins the keyring the box holds (file:///etc/apt/keyrings/...) with the same sha256.
- the SGLang lock: adopt writes one per host (locks/HOST-sglang-VER.txt); its requirement lines equal the lab's.

Only 127.0.0.0/8 is contacted.
"""

from __future__ import annotations

import copy
import re
import shutil

import pytest
from helpers.cli import REPO, provision
from helpers.lab_host import LAB_MARKS

from rigbook import inventory
from rigbook.adopt import emit
from rigbook.lab import state
from rigbook.paths import link_collection

link_collection()
from ansible_collections.rigbook.homelab.plugins.module_utils import host_model  # noqa: E402

pytestmark = [*LAB_MARKS, pytest.mark.usefixtures("converged_lab")]
ARTIFACTS = "/var/cache/rigbook/artifacts"
ADOPT_FLAGS = ["--debs-dir", f"{ARTIFACTS}/kernel", "--wheels-dir", f"{ARTIFACTS}/wheels/sglang-0.5.23",
               "--wheels-dir", f"{ARTIFACTS}/wheels/cuda-13.0.88"]


def _owners_inventory(tmp_path):
    """The lab's inventory as an owner keeps it: the generated hosts and real copies of group_vars and locks (adopt
    writes its lock beside them)."""
    generated = state.lab_dir() / "inventory"
    inv = tmp_path / "inv"
    inv.mkdir()
    shutil.copy(generated / "hosts.yml", inv / "hosts.yml")
    shutil.copytree(REPO / "inventory/lab/group_vars", inv / "group_vars")
    shutil.copytree(REPO / "inventory/lab/locks", inv / "locks")
    return generated, inv


def _adopt(host, inv, out, missing=()):
    """Adopt HOST into OUT; its closing check reads OUT as the host's host_vars, so the inputs MISSING (those a box
    cannot tell: the RCCL tarballs' paths) are all it still names (exit 1), or none (exit 0)."""
    proc = provision("adopt", host, "-i", inv, "-o", out, *ADOPT_FLAGS, timeout=600)
    assert proc.returncode == (1 if missing else 0), proc.stdout[-3000:] + proc.stderr[-3000:]
    named = re.findall(rf"host {re.escape(host)}: (rigbook_[\w.\[\]]+): needed by", proc.stderr)
    assert sorted(named) == sorted(missing), proc.stderr[-3000:]
    return proc.stdout, emit.load(out.read_text())


def _requirements(path):
    return sorted(line for line in path.read_text().splitlines() if line and not line.startswith("#"))


def _filled(adopted, lab_vars, fill):
    """LAB_VARS with the adopted pins and serve profiles, then FILL(pins, serve): what the owner adds as the "not
    pinned" list says."""
    pins, serve = copy.deepcopy(adopted["rigbook_pins"]), copy.deepcopy(adopted["rigbook_serve"])
    fill(pins, serve, copy.deepcopy(lab_vars["rigbook_pins"]), lab_vars["rigbook_serve"])
    return dict(lab_vars, rigbook_pins=pins, rigbook_serve=serve)


def _lab_wait(serve, lab_serve):
    """startup_timeout_s is how long rigbook waits for the engine: rigbook's setting, not read from any process."""
    for mine, lab in zip(serve, lab_serve):
        mine["startup_timeout_s"] = lab["startup_timeout_s"]


def test_adopt_of_the_converged_lab_gives_pins_equal_in_meaning_to_the_lab_inventorys(tmp_path):
    generated, inv = _owners_inventory(tmp_path)
    lab = inventory.load(generated)

    # lab-3080: the NVIDIA box
    said, adopted = _adopt("lab-3080", inv, tmp_path / "lab-3080.yml")
    assert "rigbook_pins.nvidia_driver.source and userspace_installer" in said  # files on the owner's side
    assert "are the ones rigbook's patches of its stamp change: pinned by name" in said
    assert "rigbook_pins.nccl_tests: which nccl-tests the box runs is not read" in said
    lab_vars = lab.host_vars("lab-3080")

    def fill_3080(pins, serve, lab_pins, lab_serve):
        for key in ("source", "userspace_installer"):
            pins["nvidia_driver"][key] = lab_pins["nvidia_driver"][key]
        pins["nccl_tests"] = lab_pins["nccl_tests"]  # files on the box no process shows: listed as not read
        pins["sglang"]["import_check"] = False  # the lab has no GPU to import SGLang's kernels on (inventory/lab)
        _lab_wait(serve, lab_serve)

    want, mine = host_model.build(lab_vars), host_model.build(_filled(adopted, lab_vars, fill_3080))
    assert _requirements(inv / mine["pins"]["sglang"]["lock"]) == _requirements(inv / want["pins"]["sglang"]["lock"])
    for model in (want, mine):
        model["pins"]["sglang"].pop("lock")
    assert mine["pins"] == want["pins"]
    assert mine["serve"] == want["serve"] and mine["roles"] == want["roles"]
    assert mine["artifacts"] == want["artifacts"]

    # lab-r9700: the AMD box, its RCCL read from the library the engine has mapped
    said, adopted = _adopt("lab-r9700", inv, tmp_path / "lab-r9700.yml",
                           missing=("rigbook_pins.rccl.source", "rigbook_pins.rccl.tests.source"))
    lab_vars = lab.host_vars("lab-r9700")
    lab_pins = lab_vars["rigbook_pins"]
    for deb in lab_pins["kernel"]["debs"]:  # the lab's .debs, named with the lab's sha256
        assert f"{deb['path']} (sha256 {deb['sha256']})" in said
    assert f"the tarball of sha256 {lab_pins['rccl']['source']['sha256']}" in said
    assert f"the tarball of sha256 {lab_pins['rccl']['tests']['source']['sha256']}" in said
    assert re.search(r"p2pdma_allow: the GPUs sit on different root ports behind host bridge 8086:6f00", said)

    def fill_r9700(pins, serve, lab_pins, lab_serve):
        pins["rccl"]["source"] = lab_pins["rccl"]["source"]  # the tarballs of the sha256 the build stamp names
        pins["rccl"]["tests"] = lab_pins["rccl"]["tests"]
        pins["kernel"]["p2pdma_allow"] = lab_pins["kernel"]["p2pdma_allow"]
        pins["sglang"]["import_check"] = False
        _lab_wait(serve, lab_serve)

    want, mine = host_model.build(lab_vars), host_model.build(_filled(adopted, lab_vars, fill_r9700))
    assert _requirements(inv / mine["pins"]["sglang"]["lock"]) == _requirements(inv / want["pins"]["sglang"]["lock"])
    assert mine["pins"]["rocm"]["repo"]["key_sha256"] == want["pins"]["rocm"]["repo"]["key_sha256"]
    assert (mine["pins"]["kernel"]["source"], want["pins"]["kernel"]["source"]) == ("distro", "debs")
    for model in (want, mine):
        model["pins"]["sglang"].pop("lock")
        model["pins"]["rocm"]["repo"].pop("key_url")
        for key in ("source", "debs", "packages", "unattended_blacklist"):  # the last: the packages' names
            model["pins"]["kernel"].pop(key)
    assert mine["pins"] == want["pins"]
    assert mine["serve"] == want["serve"] and mine["roles"] == want["roles"]
