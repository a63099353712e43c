"""Pieces of the NVIDIA host roles that need no lab: stand-in artifacts, DKMS status parsing, the BIOS checklist,
the cuda_toolchain pin schema, and choosing the mitogen strategy (both paths)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest
import yaml
from ansible_collections.rigbook.homelab.plugins.module_utils.collect import static_evidence as evidence
from ansible_collections.rigbook.homelab.plugins.module_utils.judges import bios_checklist
from ansible_collections.rigbook.homelab.plugins.module_utils.judges import static_layers as ladder_static
from ansible_collections.rigbook.homelab.plugins.modules import dkms_module

from rigbook import run
from rigbook.lab import hardware_trees
from rigbook.validate import InventoryInvalid, validate

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "tests" / "artifacts"))
import pack  # noqa: E402

LAB_PINS = yaml.safe_load((REPO / "inventory/lab/group_vars/x99_3080.yml").read_text())["rigbook_pins"]


def test_standin_artifacts_are_reproducible_and_pinned(tmp_path):
    first = pack.pack(tmp_path / "a")
    assert pack.pack(tmp_path / "b") == first  # byte for byte: the pins can hold a fixed sha256
    assert first[pack.TARBALL] == LAB_PINS["nvidia_driver"]["source"]["sha256"]
    assert first[pack.INSTALLER] == LAB_PINS["nvidia_driver"]["userspace_installer"]["sha256"]
    assert LAB_PINS["nvidia_driver"]["source"]["path"].endswith(pack.TARBALL)
    assert first[pack.NCCL_TESTS] == LAB_PINS["nccl_tests"]["source"]["sha256"]
    assert LAB_PINS["nccl_tests"]["source"]["path"].endswith(pack.NCCL_TESTS)


@pytest.mark.parametrize("line,row", [
    ("nvidia/615.71.09, 6.1.0-47-amd64, x86_64: installed",
     dict(name="nvidia", version="615.71.09", kernel="6.1.0-47-amd64", arch="x86_64", state="installed")),
    ("nvidia, 550.54.15, 6.8.0-40-generic, x86_64: built",
     dict(name="nvidia", version="550.54.15", kernel="6.8.0-40-generic", arch="x86_64", state="built")),
    ("nvidia/615.71.09: added", dict(name="nvidia", version="615.71.09", kernel=None, arch=None, state="added")),
])
def test_dkms_status_both_formats(line, row):
    assert dkms_module.parse_status(line + "\n") == [row]


def test_bios_checklist_of_the_x99_3080_box(tmp_path):
    root = hardware_trees.materialize("x99-3080", tmp_path / "t")
    ladder_view = {"gpu": {"vendor": "nvidia", "vram_gib": 20, "count": 2}, "p2p": {"expected": False, "reason": "x"}}
    found = evidence.collect_static(str(root), ("gpus",))
    items = {i["item"]: i["done"] for i in bios_checklist.checklist(found, ladder_view)}
    assert items == {"csm_off": True, "above_4g_decoding": False, "resizable_bar": False}
    lines = bios_checklist.render(bios_checklist.checklist(found, ladder_view),
                                  ladder_static.judge_firmware(found, ladder_view), False)
    assert "[ ] NOT DONE Above 4G Decoding ON" in "\n".join(lines)
    assert "never changes BIOS settings" in lines[0] and "advice, not a failure" in lines[-1]


def test_bios_checklist_of_the_real_h200_vm_names_no_csm_to_switch(fixtures):
    """The recorded H200 VM (no EFI; its hypervisor boots it): the CSM item is not "NOT DONE", and its BAR covers
    the VRAM (real-gpu-run.md defect 6)."""
    ladder_view = {"gpu": {"vendor": "nvidia", "vram_gib": 141, "count": 1}, "p2p": {"expected": False, "reason": "x"}}
    found = evidence.collect_static(str(fixtures / "evidence" / "h200-vm"), ("gpus",))
    items = {i["item"]: i for i in bios_checklist.checklist(found, ladder_view)}
    assert {name: item["done"] for name, item in items.items()} == {"csm_off": None, "above_4g_decoding": True,
                                                                    "resizable_bar": True}
    assert items["csm_off"]["seen"].startswith("a virtual machine (recorded var/lib/rigbook/commands/nvidia-smi-q.txt")
    lines = bios_checklist.render(list(items.values()), ladder_static.judge_firmware(found, ladder_view), False)
    assert "NOT DONE" not in "\n".join(lines)


def test_cuda_toolchain_pin_keys_validate(tmp_path):
    import shutil

    inv = tmp_path / "inv"
    shutil.copytree(REPO / "inventory" / "lab", inv)
    path = inv / "group_vars/x99_3080.yml"
    data = yaml.safe_load(path.read_text())
    data["rigbook_pins"]["cuda_toolchain"]["versions"] = {"nvidia-cuda-runtime": "13.0.96"}
    path.write_text(yaml.safe_dump(data))
    validate(inv)
    data["rigbook_pins"]["cuda_toolchain"]["versions"] = {"nvidia-nvvm": "13.0"}
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(InventoryInvalid) as err:
        validate(inv)
    assert "rigbook_pins.cuda_toolchain.versions" in str(err.value)


def _fake_mitogen(tmp_path, supported: bool) -> Path:
    pkg = tmp_path / "ansible_mitogen"
    (pkg / "plugins" / "strategy").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "plugins" / "strategy" / "mitogen_linear.py").write_text("")
    body = "pass" if supported else "raise RuntimeError('Your version of Ansible (2.19) is too new')"
    (pkg / "loaders.py").write_text(f"def assert_supported_release():\n    {body}\n")
    return tmp_path


@pytest.fixture
def no_mitogen(monkeypatch):
    monkeypatch.delenv("RIGBOOK_MITOGEN", raising=False)
    yield
    for name in [m for m in sys.modules if m.startswith("ansible_mitogen")]:
        del sys.modules[name]
    importlib.invalidate_caches()


@pytest.mark.parametrize("supported", [True, False])
def test_mitogen_used_when_it_supports_this_ansible_else_a_clean_fallback(tmp_path, monkeypatch, no_mitogen,
                                                                          supported):
    monkeypatch.syspath_prepend(str(_fake_mitogen(tmp_path, supported)))
    strategy, message = run.mitogen_strategy()
    env = run.ansible_env()
    if supported:
        assert strategy == str(tmp_path / "ansible_mitogen" / "plugins" / "strategy")
        assert env["ANSIBLE_STRATEGY"] == "mitogen_linear" and env["ANSIBLE_STRATEGY_PLUGINS"] == strategy
        assert ": on (strategy mitogen_linear" in message
        assert "ANSIBLE_STRATEGY" not in run.ansible_env(mitogen=False)
    else:
        assert strategy is None and "ANSIBLE_STRATEGY" not in env
        assert "does not support ansible-core" in message and "running with the default strategy" in message
    monkeypatch.setenv("RIGBOOK_MITOGEN", "off")
    assert run.mitogen_strategy() == (None, "mitogen: off (RIGBOOK_MITOGEN)")


def test_no_mitogen_installed_says_nothing(no_mitogen):
    if importlib.util.find_spec("ansible_mitogen") is not None:
        pytest.skip("mitogen is installed in this environment")
    assert run.mitogen_strategy() == (None, None)
    assert "ANSIBLE_STRATEGY" not in run.ansible_env()
