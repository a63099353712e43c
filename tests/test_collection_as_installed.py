"""The collection as users get it (issue 37 part 3): `ansible-galaxy collection build`, the tarball installed with
`ansible-galaxy collection install TARBALL -p DIR`, and a real ansible-playbook run of it on localhost (local
connection) against the recorded H200 tree, with nothing but DIR on Ansible's collection paths (helpers.collection:
the checkout's own link is kept out). One job each for the lowest and the newest ansible-core of the supported range
(meta/runtime.yml's requires_ansible, README.md's Development section), each in a venv of its own (cached, PyPI).
"""

from __future__ import annotations

import json
import shutil

import pytest
from helpers import collection

# The collection's own verify playbook (roles, argument specs, the ladder module and its module_utils) by its
# FQCN, its static phase; then two modules of the installed collection, their results kept for the test to read.
PLAYBOOK = """\
---
- name: The collection's verify playbook, its static phase
  ansible.builtin.import_playbook: rigbook.homelab.verify

- name: Modules of the installed collection on the recorded tree
  hosts: all
  gather_facts: false
  tasks:
    - name: The GPUs the tree shows
      rigbook.homelab.gpu_inventory:
        root: "{{ rigbook_evidence_root }}"
        expected_count: 1
        expected_vendor: nvidia
      register: inventory

    - name: The static ladder
      rigbook.homelab.ladder:
        root: "{{ rigbook_evidence_root }}"
        phase: static
      register: ladder

    - name: Keep what they returned
      ansible.builtin.copy:
        content: "{{ {'gpus': inventory.gpus, 'ladder': ladder.ladder} | to_json }}"
        dest: "{{ result_file }}"
        mode: "0600"
"""

STATIC_LAYERS = ["firmware", "pcie_link", "dma_window", "kernel_state", "driver_state"]


@pytest.fixture(scope="module")
def tarball(tmp_path_factory):
    return collection.build(tmp_path_factory.mktemp("built"))


def _run_installed(version, tarball, work, fixtures):
    # ansible-core and what the collection says it needs on the controller (jsonschema), nothing else
    bin_dir = collection.ansible_core(version, tuple(collection.requirements(tarball)))
    home = work / "home"
    installed = collection.install(tarball, work / "collections", bin_dir, home)
    # what this ansible-core sees: the installed copy, nowhere else
    listed = collection.collection_list(bin_dir, installed, home)
    where = {path: names for path, names in listed.items() if "rigbook.homelab" in names}
    assert list(where) == [str(installed / "ansible_collections")], listed

    tree = work / "tree"
    shutil.copytree(fixtures / "evidence" / "h200-vm", tree, symlinks=True)
    (work / "play.yml").write_text(PLAYBOOK)
    result = work / "result.json"
    extra = {"rigbook_evidence_root": str(tree), "rigbook_run_dir": str(work / "run"), "result_file": str(result),
             "p2p_verify_phases": ["static"], "ansible_python_interpreter": str(bin_dir / "python")}
    (work / "vars.json").write_text(json.dumps(extra))
    proc = collection.run([bin_dir / "ansible-playbook", "-i", "localhost,", "-c", "local", "-e", "@vars.json",
                           "play.yml"], cwd=work, env=collection.isolated_env(installed, home), timeout=300)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    assert "ERROR" not in output and "could not resolve module" not in output.lower(), output
    # the verify playbook's static phase ran (a role task of the installed collection, by its name)
    assert "rigbook.homelab.p2p_verify : Ladder 1-5" in output, output
    assert "failed=0" in output, output
    return json.loads(result.read_text())


@pytest.mark.parametrize("version", [collection.LOWEST, collection.NEWEST], ids=["lowest", "newest"])
def test_installed_collection_runs_a_playbook(version, tarball, tmp_path, fixtures):
    got = _run_installed(version, tarball, tmp_path, fixtures)
    assert [(g["slot"], g["vendor"]) for g in got["gpus"]] == [("0000:00:06.0", "nvidia")]
    verdicts = {v["layer"]: v["status"] for v in got["ladder"]}
    assert list(verdicts) == STATIC_LAYERS, got["ladder"]
    # the real H200 capture: its link reads, its kernel and driver are what they are (nothing pinned: no fail)
    assert verdicts["pcie_link"] == "pass" and "fail" not in verdicts.values(), got["ladder"]


def test_the_supported_range_is_stated_where_users_read_it(repo):
    """meta/runtime.yml's lower bound is the lowest release tested; README.md names both ends."""
    assert collection.requires_ansible() == f">={collection.LOWEST}"
    readme = (repo / "README.md").read_text()
    assert f"ansible-core {collection.LOWEST}" in readme and collection.NEWEST in readme
