"""plugins/module_utils/host_model.py: the one model of a host, its readiness, and the rule that no role assert may
catch what `provision validate` did not (the table of inputs is derived from the roles' asserts)."""

from __future__ import annotations

import copy
import fnmatch
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from ansible_collections.rigbook.homelab.plugins.module_utils import host_model

REPO = Path(__file__).resolve().parents[4]
LAB = REPO / "inventory" / "lab"
HOMELAB = REPO / "inventory" / "homelab"
# Asserts that judge what only the box knows (no inventory input): privilege and Python, the owner's files on the
# box, the engine the sglang role installed in this run. Every other assert of a role checks its readiness.
HOST_STATE_ASSERTS = {
    ("preflight", "Check Python, OS, kernel and privileges"),
    ("preflight", "Check that it is there"),
    ("serve", "Check that the engine is installed"),
}
READINESS = re.compile(r"^rigbook_host\.readiness\.([a-z_0-9]+) \| length == 0$")


def _vars(inventory: Path, group: str) -> dict:
    merged = {}
    for name in ("lab", group):
        path = inventory / "group_vars" / f"{name}.yml"
        if path.is_file():
            merged.update(yaml.safe_load(path.read_text()) or {})
    return merged


def _role_asserts():
    """[(role, task name, that)] of every ansible.builtin.assert in the roles' task files."""
    found = []
    for tasks_file in sorted((REPO / "roles").glob("*/tasks/*.yml")):
        role = tasks_file.parts[-3]
        for task in yaml.safe_load(tasks_file.read_text()) or []:
            for block in [task] + task.get("block", []):
                if "ansible.builtin.assert" in block:
                    found.append((role, block["name"], block["ansible.builtin.assert"]["that"]))
    return found


def _readiness_roles():
    """The roles whose assert checks their readiness in the host model: the table's rows come from here."""
    roles = []
    for role, _name, that in _role_asserts():
        match = READINESS.match(that) if isinstance(that, str) else None
        if match:
            assert match.group(1) == role, f"roles/{role} asserts the readiness of {match.group(1)}"
            roles.append(role)
    return roles


# Ansible's facts of a Debian 12 host (the lab's), as the preflight play gathers them.
DEBIAN_FACTS = {"distribution": "Debian", "distribution_version": "12", "distribution_release": "bookworm",
                "python": {"version": {"major": 3, "minor": 11, "micro": 2}}}


# --- the model --------------------------------------------------------------------------------------------------

def test_the_lab_twins_models():
    nvidia = host_model.build(_vars(LAB, "x99_3080"), DEBIAN_FACTS)  # the lab's hosts are Debian 12
    amd = host_model.build(_vars(LAB, "x99_r9700"), DEBIAN_FACTS)
    assert nvidia["vendor"] == "nvidia" and nvidia["p2p"] == {
        "expected": False, "declared": True, "nccl_p2p_level": "",
        "reason": nvidia["p2p"]["reason"]} and nvidia["p2p"]["reason"].startswith("BAR1 is 256 MiB")
    assert nvidia["gpu_env_file"] == amd["gpu_env_file"] == "/etc/rigbook/gpu.env"
    assert nvidia["roles"] == ["bios_checklist", "kernel", "nvidia_p2p_driver", "cuda_toolchain", "nccl_tests",
                               "multi_user_target", "p2p_verify", "sglang", "serve", "health"]
    assert amd["roles"] == ["bios_checklist", "kernel", "amd_rocm", "rccl", "p2p_verify", "sglang", "serve", "health"]
    assert nvidia["health"] == {"enabled": True, "interval_s": 300,  # the lab's (group_vars/lab.yml)
                                "textfile": "/var/lib/prometheus/node-exporter/rigbook.prom",
                                "prometheus_rules_dir": ""}  # no alert rules installed unless pointed
    rules = host_model.build({"rigbook_gpu": {"vendor": "amd"}, "rigbook_health": {"prometheus_rules_dir": "/etc/p/"}})
    assert rules["health"]["prometheus_rules_dir"] == "/etc/p"
    assert host_model.build({})["health"]["enabled"] is False  # no GPUs declared: nothing to watch
    assert nvidia["pins"]["nvidia_driver"]["uvm_disable_hmm"] is True  # iommu=pt on the command line
    assert nvidia["pins"]["nvidia_driver"]["stock_packages"][-2:] == ["nvidia-dkms-615", "nvidia-dkms-615-open"]
    assert amd["pins"]["rocm"]["version_glob"] == "*.70100-*"
    assert amd["pins"]["rocm"]["apt_version_pin"] == "/^.*\\.70100-.*$/"  # the preferences line site.yml writes
    assert amd["pins"]["rocm"]["env"] == {"HSA_ENABLE_IPC_MODE_LEGACY": "0", "NCCL_P2P_LEVEL": "PHB"}
    assert [a["sha256"][:8] for a in amd["artifacts"]] == ["e0061f95", "2a40c463", "845e73df", "e9b9a1fe", "f309dbbf",
                                                           "29ef175a"]
    assert amd["artifacts"][3]["dest_dir"] == host_model.KEY_DIR
    # the library the engine must run: torch's bundled copy linked to the one the collectives tests load (the
    # rccl role's build; the NCCL wheel of the CUDA toolchain venv, laid out in the nccl-tests prefix)
    assert amd["engine_libraries"] == [{"bundled": "torch/lib/librccl.so.1",
                                        "target": "/opt/rigbook/rccl/current/lib/librccl.so.1"}]
    assert nvidia["engine_libraries"] == [{"bundled": "nvidia/nccl/lib/libnccl.so.2",
                                           "target": "/opt/rigbook/nccl-tests/current/nccl/lib/libnccl.so.2"}]
    assert (amd["collectives_tests_dir"], nvidia["collectives_tests_dir"]) == (
        "/opt/rigbook/rccl/current/bin", "/opt/rigbook/nccl-tests/current/bin")
    # the roles' install roots (their defaults read them) are the folders those paths lie under
    assert amd["install_roots"] == {"rccl": "/opt/rigbook/rccl", "nccl_tests": "/opt/rigbook/nccl-tests"}
    assert amd["collectives_tests_dir"].startswith(amd["install_roots"]["rccl"] + "/current/")
    assert nvidia["collectives_tests_dir"].startswith(nvidia["install_roots"]["nccl_tests"] + "/current/")
    site = "/opt/rigbook/cuda/lib/python3.11/site-packages"
    assert nvidia["pins"]["cuda_toolchain"]["home"] == site + "/nvidia/cu13"
    assert nvidia["pins"]["cuda_toolchain"]["nccl"] == {"package": "nvidia-nccl-cu13", "version": "2.27.7",
                                                        "home": site + "/nvidia/nccl"}
    assert nvidia["artifacts"][-1]["path"].endswith("nccl-tests-standin-2.19.6.tar.gz")
    (serve,) = nvidia["serve"]
    assert serve["unit"] == "rigbook-serve-standin.service" and serve["bind"] == "127.0.0.1"
    assert serve["startup_timeout_s"] == 60 and serve["api_key_file"] is None
    assert nvidia["box_facts"] == {"gpu_count": 2, "vendor": "nvidia", "p2p_expected": False}
    assert host_model.readiness(nvidia, inventory_dir=str(LAB)) == []
    assert host_model.readiness(amd, inventory_dir=str(LAB)) == []


def test_nccl_tests_needs_the_nccl_and_cccl_wheels_pinned_in_the_toolchain():
    variables = _vars(LAB, "x99_3080")
    variables["rigbook_pins"]["cuda_toolchain"].pop("versions")
    model = host_model.build(variables, DEBIAN_FACTS)
    needs = host_model.readiness(model, roles=["nccl_tests"])
    assert [n["key"] for n in needs] == ["rigbook_pins.cuda_toolchain.versions"] * 2
    assert "add nvidia-nccl-cu13: VERSION to cuda_toolchain.versions" in needs[0]["text"]
    assert "fatal error: nv/target: No such file or directory" in needs[1]["text"]
    assert model["engine_libraries"] == []  # no pinned NCCL: nothing to link the engine's copy to
    variables["rigbook_pins"]["nccl_tests"]["source"] = {"repo": "https://github.com/NVIDIA/nccl-tests.git",
                                                         "commit": "v2.19.6"}  # a tag is no pin
    needs = host_model.readiness(host_model.build(variables, DEBIAN_FACTS), roles=["nccl_tests"])
    assert "rigbook_pins.nccl_tests.source" in [n["key"] for n in needs]
    without = host_model.build(variables)  # no facts (`provision validate`): the venv's Python is not known
    assert without["pins"]["cuda_toolchain"]["home"] == "" and without["pins"]["cuda_toolchain"]["nccl"] == {}


def test_the_layers_a_box_must_measure_and_those_it_may_leave_unknown():
    import json

    from ansible_collections.rigbook.homelab.plugins.module_utils.ladder import registry

    variables = _vars(LAB, "x99_3080")
    variables["rigbook_verify"] = {"allow_unknown": ["collectives"]}
    nvidia = host_model.build(variables)
    assert nvidia["verify"] == {"measure": {"layers": True, "serving": True}, "allow_unknown": ["collectives"],
                                "collectives_python": ""}
    view = host_model.ladder_view(nvidia)
    assert registry.expected_layers(view) == registry.names() and view["allow_unknown"] == ["collectives"]
    assert host_model.build(_vars(LAB, "x99_3080"))["verify"]["allow_unknown"] == []  # the lab measures every layer
    bare = host_model.build({"rigbook_gpu": {"vendor": "amd", "count": 2}})
    assert registry.expected_layers(host_model.ladder_view(bare)) == registry.names()[:-1]  # no serve profile
    assert registry.expected_layers(host_model.ladder_view(host_model.build({}))) == []  # no GPUs declared
    schema = json.loads((REPO / "meta/host_vars.schema.json").read_text())
    assert schema["properties"]["rigbook_verify"]["properties"]["allow_unknown"]["items"]["enum"] == registry.names()


def test_p2p_expected_is_one_rule():
    """Declared wins; undeclared, two or more GPUs expect P2P (judges/expectations.p2p_expected)."""
    assert host_model.build({"rigbook_gpu": {"vendor": "nvidia", "count": 2}})["p2p"]["expected"] is True
    assert host_model.build({"rigbook_gpu": {"vendor": "nvidia", "count": 1}})["p2p"]["expected"] is False
    declared = host_model.build({"rigbook_gpu": {"count": 2}, "rigbook_p2p": {"expected": False}})
    assert declared["p2p"]["expected"] is False and declared["box_facts"]["p2p_expected"] is False
    # undeclared, the judges count the GPUs they saw: the ladder view carries no `expected`
    assert "expected" not in host_model.ladder_view(host_model.build({"rigbook_gpu": {"count": 2}}))["p2p"]


def test_the_kernel_source_is_decided_once():
    def source(**pin):
        return host_model.build({"rigbook_pins": {"kernel": pin}})["pins"]["kernel"]["source"]

    assert source(release="6.8.0-90-generic") == "distro"
    assert source(release="6.1.0-47-amd64") == "distro"
    assert source(release="6.8.12-r9700-p2p-dma44") == "debs"  # no archive carries it
    assert source(release="6.1.0-47-amd64", debs=[{"path": "/x.deb", "sha256": "0" * 64}]) == "debs"
    assert source(release="6.8.12-custom", source="distro") == "distro"  # declared wins


def test_wrong_types_read_as_absent():
    model = host_model.build({"rigbook_gpu": "two", "rigbook_pins": {"kernel": ["x"]}, "rigbook_serve": "qwen"})
    assert model["vendor"] == "" and model["pins"]["kernel"]["release"] == "" and model["serve"] == []
    assert model["serve_errors"] == ["rigbook_serve: a list of serve profiles, got 'qwen'"]


def test_readiness_says_how_to_get_each_input():
    model = host_model.build(_vars(HOMELAB, "x99_3080"))
    by_key = {n["key"]: n for n in host_model.readiness(model)}
    commit = by_key["rigbook_pins.nvidia_driver.commit"]
    assert commit["role"] == "nvidia_p2p_driver"
    assert "git ls-remote https://github.com/aikitoria/open-gpu-kernel-modules refs/heads/" in commit["how"]
    assert commit["text"].startswith("rigbook_pins.nvidia_driver.commit: needed by the nvidia_p2p_driver role: ")
    amd = host_model.build(_vars(HOMELAB, "x99_r9700"))
    debs = {n["key"]: n for n in host_model.readiness(amd)}["rigbook_pins.kernel.debs"]
    assert "6.8.12-r9700-p2p-dma44 is no distribution kernel" in debs["why"] and "sha256sum" in debs["how"]


def test_bad_values_are_named():
    base = _vars(LAB, "x99_3080")
    pins = copy.deepcopy(base["rigbook_pins"])
    pins["cuda_toolchain"]["versions"] = {"nvidia-nvvm": "13.0.48"}
    pins["nvidia_driver"]["userspace_flags"] = ["--silent"]
    keys = {n["key"] for n in host_model.readiness(host_model.build(dict(base, rigbook_pins=pins)))}
    assert keys == {"rigbook_pins.cuda_toolchain.versions", "rigbook_pins.nvidia_driver.userspace_flags"}


def test_a_lock_or_patch_that_is_not_beside_the_inventory_is_named(tmp_path):
    base = _vars(LAB, "x99_3080")
    pins = copy.deepcopy(base["rigbook_pins"])
    pins["sglang"]["lock"] = "locks/missing.txt"
    pins["sglang"]["patches"].append({"path": "patches/mine.patch", "sha256": "0" * 64})
    model = host_model.build(dict(base, rigbook_pins=pins))
    keys = [n["key"] for n in host_model.readiness(model, inventory_dir=str(tmp_path))]
    assert keys == ["rigbook_pins.sglang.lock", "rigbook_pins.sglang.patches[2].path"]
    assert host_model.readiness(model, inventory_dir=None) == []  # on the box: no controller files are looked for


def test_tags_choose_the_roles():
    assert host_model.roles_for_tags(["all"]) == [name for name, _, _ in host_model.ROLES]
    assert host_model.roles_for_tags(["serve"]) == ["sglang", "serve"]
    assert host_model.roles_for_tags(["all"], ["sglang"]) == [r for r, _, _ in host_model.ROLES if r != "sglang"]


def test_site_yml_tags_its_roles_as_the_model_says():
    tags = {}
    for play in yaml.safe_load((REPO / "playbooks" / "site.yml").read_text()):
        for entry in play.get("roles") or []:
            tags.setdefault(entry["role"].rsplit(".", 1)[-1], set()).update(entry.get("tags") or [])
    assert {role: set(t) for role, t in host_model.ROLE_TAGS.items() if role != "preflight"} == {
        role: t for role, t in tags.items() if role != "preflight"}


# --- no role assert catches what validation could have ----------------------------------------------------------

def test_every_role_assert_is_its_readiness_or_a_host_state_check():
    for role, name, that in _role_asserts():
        if (role, name) in HOST_STATE_ASSERTS:
            continue
        assert isinstance(that, str) and READINESS.match(that), (
            f"roles/{role}: the assert {name!r} checks an input the host model's readiness does not: add its rule "
            f"to plugins/module_utils/host_model.py (readiness, INPUTS) and assert rigbook_host.readiness.{role}")
    assert sorted(_readiness_roles()) == sorted(host_model.INPUTS)


def _table():
    """(role, key path) for every input the roles' readiness asserts check, in the lab host that runs the role."""
    rows = []
    for role in _readiness_roles():
        for key in host_model.INPUTS[role]:
            rows.append((role, key))
    return rows


def _lab_copy(tmp_path: Path) -> Path:
    target = tmp_path / "lab"
    shutil.copytree(LAB, target)
    return target


def _remove(data: dict, key: str) -> bool:
    *parents, last = key.split(".")
    node = data
    for part in parents:
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    if not isinstance(node, dict) or last not in node:
        return False
    del node[last]
    return True


@pytest.mark.parametrize("role,key", _table(), ids=[f"{r}:{k}" for r, k in _table()])
def test_removing_an_input_a_role_asserts_on_makes_validate_name_it(tmp_path, role, key):
    inv = _lab_copy(tmp_path)
    removed = []
    for group in ("x99_3080", "x99_r9700"):
        path = inv / "group_vars" / f"{group}.yml"
        data = yaml.safe_load(path.read_text())
        model = host_model.build(_vars(LAB, group))
        if role in model["roles"] and _remove(data, key):
            path.write_text(yaml.safe_dump(data, sort_keys=False))
            removed.append(group)
    assert removed, f"no lab host both runs {role} and sets {key}: the table cannot test it"
    proc = subprocess.run([sys.executable, "-m", "rigbook", "validate", "-i", str(inv)], capture_output=True,
                          text=True, timeout=60, cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    parent, _, last = key.rpartition(".")
    # the key itself, or its parent with the key's name in the message (the schema's "missing required key 'x'")
    lines = [line for line in proc.stderr.splitlines() if f": {key}: " in line
             or (parent and f": {parent}: " in line and re.search(rf"\b{re.escape(last)}\b", line))]
    assert lines, f"validate did not name {key}:\n{proc.stderr}"


def test_readiness_names_only_the_keys_the_table_knows():
    """Every key a rule names is in NAMED (so the table and the docs list it); checked on the homelab inventory and
    on the lab inventory with each input removed."""
    cases = [_vars(HOMELAB, "x99_3080"), _vars(HOMELAB, "x99_r9700")]
    for group in ("x99_3080", "x99_r9700"):
        for _role, key in _table():
            data = copy.deepcopy(_vars(LAB, group))
            if _remove(data, key):
                cases.append(data)
    for variables in cases:
        for need in host_model.readiness(host_model.build(variables)):
            assert re.sub(r"\[\d+\]", "[]", need["key"]) in host_model.NAMED[need["role"]], need


# --- the OS decision (tests/fixtures/ubuntu/SOURCES.md says which outputs are recorded) ---------------------------

UBUNTU = Path(__file__).resolve().parents[3] / "fixtures" / "ubuntu"


def _ansible_facts_of(os_release):
    """The distribution facts Ansible gathers from an /etc/os-release (its own distro reader and naming rule)."""
    from unittest import mock

    from ansible.module_utils import distro
    from ansible.module_utils.common import sys_info

    reader = distro.LinuxDistribution(include_lsb=False, os_release_file=str(os_release),
                                      distro_release_file="/nonexistent", include_uname=False)
    with mock.patch.object(sys_info.distro, "id", reader.id):
        name = sys_info.get_distribution()
    return {"distribution": name, "distribution_version": reader.version(), "distribution_release": reader.codename()}


def test_ubuntu_2404_os_release_is_decided_ubuntu_and_gets_ubuntus_stock_packages():
    facts = _ansible_facts_of(UBUNTU / "os-release-24.04.txt")
    assert facts == {"distribution": "Ubuntu", "distribution_version": "24.04", "distribution_release": "noble"}
    model = host_model.build(_vars(HOMELAB, "x99_3080"), facts)
    assert model["os"] == {"id": "ubuntu", "version": "24.04", "codename": "noble"}
    stock = model["pins"]["nvidia_driver"]["stock_packages"]
    assert {"linux-modules-nvidia-*", "nvidia-dkms-*", "nvidia-driver-*", "libnvidia-*-[0-9]*"} <= set(stock)
    debian = host_model.build(_vars(HOMELAB, "x99_3080"), DEBIAN_FACTS)["pins"]["nvidia_driver"]["stock_packages"]
    assert not any("*" in name for name in debian) and set(debian) < set(stock)
    assert host_model.build(_vars(HOMELAB, "x99_3080"))["os"]["id"] == ""  # no facts: unknown, Ubuntu's included
    assert host_model.build(_vars(HOMELAB, "x99_3080"))["pins"]["nvidia_driver"]["stock_packages"] == stock


@pytest.mark.parametrize("recorded", ["ubuntu-drivers-devices-rtx5090.txt", "ubuntu-drivers-devices-gtx650ti.txt"])
def test_every_driver_ubuntu_drivers_offers_is_pinned_away_and_nouveau_is_not(recorded):
    stock = host_model.nvidia_stock_packages("ubuntu", "615")
    offered = [line.split(":", 1)[1].split(" - ")[0].strip()
               for line in (UBUNTU / recorded).read_text().splitlines() if line.startswith("driver")]
    nvidia = [name for name in offered if name.startswith("nvidia-driver-")]
    assert nvidia and all(any(fnmatch.fnmatchcase(n, g) for g in stock) for n in nvidia), (nvidia, stock)
    assert not any(fnmatch.fnmatchcase("xserver-xorg-video-nouveau", g) for g in stock)


def test_the_stock_globs_match_ubuntus_driver_packages_and_spare_the_branch_free_ones():
    stock = host_model.nvidia_stock_packages("ubuntu", "")
    listing = (UBUNTU / "dpkg-query-nvidia-570.txt").read_text()
    listed = [line.split("\t")[0].split(":")[0] for line in listing.splitlines()]
    assert all(any(fnmatch.fnmatchcase(n, g) for g in stock) for n in listed)
    for spared in ("libnvidia-egl-wayland1", "libnvidia-container1", "libnvidia-container-tools", "nvidia-prime",
                   "nvidia-settings", "linux-modules-6.8.0-90-generic", "linux-headers-6.8.0-90-generic"):
        assert not any(fnmatch.fnmatchcase(spared, g) for g in stock), spared


def test_unattended_blacklist_entries_are_anchored_regexes_of_the_names_and_globs():
    amd = host_model.build(_vars(HOMELAB, "x99_r9700"), DEBIAN_FACTS)
    kernel = amd["pins"]["kernel"]["unattended_blacklist"]
    release = amd["pins"]["kernel"]["release"]
    assert any(re.match(e, "linux-image-" + release) for e in kernel)
    assert any(re.match(e, "linux-headers-" + release) for e in kernel)
    assert not any(re.match(e, "linux-image-" + release + "-dbg") for e in kernel)
    assert not any(re.match(e, "linux-image-6.8.0-90-generic") for e in kernel)
    rocm = amd["pins"]["rocm"]["unattended_blacklist"]
    for name in amd["pins"]["rocm"]["packages"] + ["hipcc", "rocm-cmake", "amdgpu-dkms"]:
        assert any(re.match(e, name) for e in rocm), name
    assert not any(re.match(e, "rocm-core-asan") for e in rocm)
    nvidia = host_model.unattended_blacklist(host_model.nvidia_stock_packages("ubuntu", "615"))
    assert any(re.match(e, "libnvidia-compute-570") for e in nvidia)
    assert not any(re.match(e, "libnvidia-egl-wayland1") for e in nvidia)
    assert r"libstdc\+\+6$" == host_model.unattended_blacklist(["libstdc++6"])[0]  # escaped as the stock file shows


def test_the_rocm_build_packages_default_and_can_be_declared_empty():
    amd = host_model.build(_vars(HOMELAB, "x99_r9700"))
    assert amd["pins"]["rocm"]["build_packages"] == ["hipcc", "hip-dev", "hsa-rocr-dev", "rocm-cmake", "rocm-llvm",
                                                     "rocm-device-libs"]
    variables = _vars(HOMELAB, "x99_r9700")
    variables["rigbook_pins"] = dict(variables["rigbook_pins"], rocm=dict(variables["rigbook_pins"]["rocm"],
                                                                          build_packages=[]))
    assert host_model.build(variables)["pins"]["rocm"]["build_packages"] == []


def test_offline_rocm_debs_must_carry_the_build_packages():
    def needs(build_packages=None, names=("rocm-core", "hipcc", "hip-dev", "hsa-rocr-dev", "rocm-cmake", "rocm-llvm",
                                          "rocm-device-libs")):
        rocm = {"version": "7.1.0", "debs": [{"path": f"/srv/rocm/{n}_1.0.70100-38~24.04_amd64.deb",
                                              "sha256": "0" * 64} for n in names]}
        if build_packages is not None:
            rocm["build_packages"] = build_packages
        model = host_model.build({"rigbook_gpu": {"vendor": "amd"}, "rigbook_pins": {"rocm": rocm}})
        return [n for n in host_model.readiness(model) if n["key"] == "rigbook_pins.rocm.build_packages"]

    assert needs() == []
    lacking = needs(names=("rocm-core", "hipcc"))
    assert len(lacking) == 1 and "hip-dev, hsa-rocr-dev, rocm-cmake, rocm-llvm, rocm-device-libs" in lacking[0]["why"]
    assert needs(build_packages=[], names=("rocm-core",)) == []


def test_an_rdna4_box_on_a_kernel_before_6_11_must_say_whether_amdgpu_dkms_drives_it():
    variables = _vars(LAB, "x99_r9700")
    variables["rigbook_pins"]["rocm"].pop("dkms")
    variables["rigbook_pins"]["kernel"]["release"] = "6.8.12-r9700-p2p-dma44"  # seed 004's kernel
    needs = host_model.readiness(host_model.build(variables), roles=["amd_rocm"])
    assert [n["key"] for n in needs] == ["rigbook_pins.rocm.dkms"]
    assert "6.8.12-r9700-p2p-dma44 is a 6.8 kernel: mainline amdgpu drives GC 12.0 from Linux 6.11" in needs[0]["text"]
    assert "modinfo -F firmware amdgpu | grep gc_12_0_1" in needs[0]["how"]
    for said in (True, False):  # the owner's answer, either way, is the decision (true: where amdgpu-dkms comes from)
        variables["rigbook_pins"]["rocm"]["dkms"] = said
        assert [n["key"] for n in host_model.readiness(host_model.build(variables), roles=["amd_rocm"])] == (
            ["rigbook_pins.rocm.amdgpu_repo"] if said else [])
    variables["rigbook_pins"]["rocm"].pop("dkms")
    variables["rigbook_pins"]["kernel"]["release"] = "6.14.0-37-generic"  # Ubuntu 24.04's HWE kernel: in-tree
    assert host_model.readiness(host_model.build(variables), roles=["amd_rocm"]) == []
    variables["rigbook_pins"]["kernel"]["release"] = "6.8.0-90-generic"
    variables["rigbook_pins"]["rccl"]["gpu_targets"] = ["gfx1100"]
    variables["rigbook_gpu"]["model"] = "Radeon PRO W7900"  # RDNA3: known to 6.8's amdgpu
    assert host_model.readiness(host_model.build(variables), roles=["amd_rocm"]) == []
    variables["rigbook_gpu"]["model"] = "Radeon RX 9070 XT"  # the model alone says RDNA4
    assert [n["key"] for n in host_model.readiness(host_model.build(variables), roles=["amd_rocm"])] == [
        "rigbook_pins.rocm.dkms"]


# --- amdgpu-dkms from AMD's graphics repository ------------------------------------------------------------------

AMDGPU_REPO = {"url": "https://repo.radeon.com/amdgpu/7.1/ubuntu", "suite": "noble"}


def test_amdgpu_dkms_comes_from_the_graphics_repository_with_the_rocm_key():
    """dkms: true needs AMD's graphics repository (amdgpu-dkms is not in the ROCm one); its key is the ROCm
    repository's unless pinned apart, and the sha256 pre-check fetches that key once."""
    variables = _vars(LAB, "x99_r9700")
    rocm = variables["rigbook_pins"]["rocm"]
    rocm["dkms"] = True
    needs = host_model.readiness(host_model.build(variables), roles=["amd_rocm"])
    assert [n["key"] for n in needs] == ["rigbook_pins.rocm.amdgpu_repo"]
    assert "repo.radeon.com/amdgpu/<release>/ubuntu), not in the ROCm repository" in needs[0]["why"]
    assert "amdgpu_repo: {url: https://repo.radeon.com/amdgpu/RELEASE/ubuntu, suite: noble" in needs[0]["how"]
    rocm["amdgpu_repo"] = dict(AMDGPU_REPO)
    model = host_model.build(variables)
    assert host_model.readiness(model, roles=["amd_rocm"]) == []
    assert model["pins"]["rocm"]["amdgpu_repo"] == {**AMDGPU_REPO, "components": ["main"],
                                                     "key_url": rocm["repo"]["key_url"],
                                                     "key_sha256": rocm["repo"]["key_sha256"]}
    keys = [a for a in model["artifacts"] if a.get("dest_dir") == host_model.KEY_DIR]
    assert keys == [{"url": rocm["repo"]["key_url"], "sha256": rocm["repo"]["key_sha256"],
                     "dest_dir": host_model.KEY_DIR}]  # one key, checked once
    rocm["amdgpu_repo"].update(key_url="https://repo.radeon.com/rocm/rocm.gpg.key", key_sha256="b" * 64)
    model = host_model.build(variables)
    assert model["pins"]["rocm"]["amdgpu_repo"]["key_sha256"] == "b" * 64
    assert [a["sha256"] for a in model["artifacts"] if a.get("dest_dir") == host_model.KEY_DIR] == [
        rocm["repo"]["key_sha256"], "b" * 64]
    rocm["dkms"] = False  # not asked for: neither configured nor its key fetched
    assert [a for a in host_model.build(variables)["artifacts"] if a.get("sha256") == "b" * 64] == []


def test_amdgpu_dkms_offline_is_a_deb_or_a_repository_with_its_own_key():
    debs = [{"path": "/srv/rocm/rocm-core_7.1.0.70100-38~24.04_amd64.deb", "sha256": "0" * 64}]

    def needs(**rocm):
        model = host_model.build({"rigbook_gpu": {"vendor": "amd"},
                                  "rigbook_pins": {"rocm": {"version": "7.1.0", "dkms": True, "build_packages": [],
                                                            **rocm}}})
        return [n["key"] for n in host_model.readiness(model, roles=["amd_rocm"])]

    assert needs(debs=debs) == ["rigbook_pins.rocm.amdgpu_repo"]
    assert needs(debs=debs + [{"path": "/srv/rocm/amdgpu-dkms_6.16.13.30300400-2_all.deb", "sha256": "1" * 64}]) == []
    assert needs(debs=debs, amdgpu_repo=AMDGPU_REPO) == ["rigbook_pins.rocm.amdgpu_repo.key_sha256"]  # no key to share
    assert needs(debs=debs, amdgpu_repo={**AMDGPU_REPO, "key_url": "https://repo.radeon.com/rocm/rocm.gpg.key",
                                         "key_sha256": "c" * 64}) == []


# --- a box whose kernel or driver rigbook does not manage (issue 35: the H200 cloud VM) ---------------------------

# The single-H200 cloud VM of shared/research/real-gpu-run.md: driver 580.159.04 from the image, no DKMS.
H200_VM = {"rigbook_gpu": {"vendor": "nvidia", "model": "H200", "count": 1},
           "rigbook_p2p": {"expected": False, "reason": "one GPU"},
           "rigbook_pins": {"kernel": {"release": "6.1.0-47-amd64"}, "nvidia_driver": {"version": "580.159.04"}}}


def test_a_box_that_leaves_its_kernel_and_driver_to_its_provider_is_asked_nothing_of_them():
    variables = copy.deepcopy(H200_VM)
    variables["rigbook_p2p"] = {"expected": True}  # even where P2P is expected
    variables["rigbook_gpu"]["count"] = 8
    variables["rigbook_pins"]["kernel"].update(release="6.8.12-custom", debs=[{"path": "/k.deb", "sha256": "0" * 64}])
    variables["rigbook_manage"] = {"kernel": False, "nvidia_driver": False}
    model = host_model.build(variables)
    assert model["manage"] == {"kernel": False, "nvidia_driver": False}
    assert "kernel" not in model["roles"] and "nvidia_p2p_driver" not in model["roles"]
    assert "cuda_toolchain" in model["roles"] and "p2p_verify" in model["roles"]
    assert not any(n["role"] in ("kernel", "nvidia_p2p_driver") for n in host_model.readiness(model))
    assert model["artifacts"] == []  # the kernel .debs are not checked: nothing installs them
    view = host_model.ladder_view(model)  # the ladder still judges what runs against the pins
    assert view["pins"]["kernel"]["release"] == "6.8.12-custom" and view["pins"]["nvidia_driver"]["version"] == (
        "580.159.04")
    variables["rigbook_manage"] = {"kernel": False}
    model = host_model.build(variables)
    assert model["manage"] == {"kernel": False, "nvidia_driver": True}
    assert [n["key"] for n in host_model.readiness(model) if n["role"] == "nvidia_p2p_driver"] == [
        "rigbook_pins.nvidia_driver.source", "rigbook_pins.nvidia_driver.userspace_installer"]


def test_a_one_gpu_box_without_p2p_is_not_asked_for_a_p2p_fork():
    """A box that expects no P2P (one GPU; or declared without it) on its stock driver: no pin or a version alone;
    a pin that asks for a build (seed 000's fork, which it runs without working P2P) is still managed."""
    adopted = copy.deepcopy(H200_VM)  # what adopt reads of a stock driver: its version and its userspace's
    adopted["rigbook_pins"]["nvidia_driver"]["userspace_version"] = "580.159.04"
    for variables in (H200_VM, {k: v for k, v in H200_VM.items() if k != "rigbook_p2p"}, adopted,
                      {**H200_VM, "rigbook_pins": {"kernel": H200_VM["rigbook_pins"]["kernel"]}}):
        model = host_model.build(copy.deepcopy(variables))
        assert model["manage"]["nvidia_driver"] is False and "nvidia_p2p_driver" not in model["roles"]
        assert not [n for n in host_model.readiness(model) if n["role"] == "nvidia_p2p_driver"]
    forked = copy.deepcopy(H200_VM)
    forked["rigbook_pins"]["nvidia_driver"]["fork_repo"] = "https://github.com/aikitoria/open-gpu-kernel-modules"
    model = host_model.build(forked)
    assert "nvidia_p2p_driver" in model["roles"]
    assert "rigbook_pins.nvidia_driver.commit" in [n["key"] for n in host_model.readiness(model)]
    seed_000 = host_model.build(_vars(HOMELAB, "x99_3080"))  # P2P declared unavailable, the fork pinned
    assert seed_000["manage"] == {"kernel": True, "nvidia_driver": True} and "nvidia_p2p_driver" in seed_000["roles"]
    two = host_model.build({"rigbook_gpu": {"vendor": "nvidia", "count": 2}})  # P2P expected: the fork is asked for
    assert [n["key"] for n in host_model.readiness(two, roles=["nvidia_p2p_driver"])] == [
        "rigbook_pins.nvidia_driver.version"]


def test_site_yml_runs_a_role_the_model_can_leave_out_only_where_the_model_says():
    """Every role of MANAGED (rigbook_manage) is gated on rigbook_host.roles in every play of site.yml that has it."""
    for play in yaml.safe_load((REPO / "playbooks" / "site.yml").read_text()):
        for entry in play.get("roles") or []:
            short = entry["role"].rsplit(".", 1)[-1]
            if short in host_model.MANAGED:
                assert entry.get("when") == f"'{short}' in rigbook_host.roles", (play["name"], entry)


# --- seed 004's SGLang patches the owner supplies; the FP8 KV scales file among the box paths ------------------------

def test_patches_the_owner_supplies_are_named_until_the_file_and_its_sha256_are_there(tmp_path):
    variables = _vars(HOMELAB, "x99_r9700")
    model = host_model.build(variables)
    needs = [n for n in host_model.readiness(model, roles=["sglang"], inventory_dir=str(tmp_path))]
    assert [n["key"] for n in needs] == ["rigbook_pins.sglang.patches[0].path", "rigbook_pins.sglang.patches[1].path"]
    assert "sglang-bf16-pv.patch is not on the controller, and it has no sha256" in needs[0]["why"]
    (tmp_path / "patches").mkdir()
    (tmp_path / "patches" / "sglang-bf16-pv.patch").write_text("--- a\n+++ b\n")
    (tmp_path / "patches" / "sglang-rdna4-patch065.patch").write_text("--- a\n+++ b\n")
    needs = host_model.readiness(model, roles=["sglang"], inventory_dir=str(tmp_path))
    assert [n["key"] for n in needs] == ["rigbook_pins.sglang.patches[0].sha256",
                                         "rigbook_pins.sglang.patches[1].sha256"]
    assert "sha256sum %s" % (tmp_path / "patches" / "sglang-bf16-pv.patch") in needs[0]["how"]
    for patch in variables["rigbook_pins"]["sglang"]["patches"]:
        patch["sha256"] = "d" * 64
    assert host_model.readiness(host_model.build(variables), roles=["sglang"], inventory_dir=str(tmp_path)) == []


def test_the_fp8_kv_scales_file_is_among_the_box_paths():
    paths = {p["key"]: p for p in host_model.build(_vars(HOMELAB, "x99_3080"))["box_paths"]}
    scales = paths["rigbook_serve[0].extra_args[2]"]
    assert scales["path"] == "/srv/models/scales/qwen38-fp8-kv-scales-per-head.json"
    assert "FP8 KV cache scales" in scales["why"]
    assert not [p for p in host_model.build(_vars(HOMELAB, "x99_r9700"))["box_paths"] if "scales" in p["path"]]


def test_seed_004s_profile_is_what_the_write_up_runs():
    """BF16 KV, num_kv_splits=8, MTP steps=3 top_k=1 draft_tokens=4, PHB, IPC not legacy; nothing the write-up says
    its final configuration does not need (HSA_FORCE_FINE_GRAIN_PCIE)."""
    model = host_model.build(_vars(HOMELAB, "x99_r9700"))
    (profile,) = model["serve"]
    assert "--kv-cache-dtype=bf16" in profile["extra_args"]
    assert "--triton-attention-num-kv-splits=8" in profile["extra_args"]
    assert {k: profile["speculative"][k] for k in ("num_steps", "eagle_topk", "num_draft_tokens")} == {
        "num_steps": 3, "eagle_topk": 1, "num_draft_tokens": 4}
    assert profile["env"]["HSA_ENABLE_IPC_MODE_LEGACY"] == "0" and profile["env"]["NCCL_P2P_LEVEL"] == "PHB"
    assert model["pins"]["rocm"]["env"] == {"HSA_ENABLE_IPC_MODE_LEGACY": "0", "NCCL_P2P_LEVEL": "PHB"}
    assert [p["path"] for p in model["pins"]["sglang"]["patches"]] == ["patches/sglang-bf16-pv.patch",
                                                                      "patches/sglang-rdna4-patch065.patch"]


def test_the_roles_tags_name_always_run():
    assert host_model.roles_named_by_tags(["all"]) == []
    assert host_model.roles_named_by_tags(None) == []
    assert host_model.roles_named_by_tags(["rccl"]) == ["rccl"]
    assert host_model.roles_named_by_tags(["serve"]) == ["sglang", "serve"]
    assert host_model.roles_named_by_tags(["ladder"]) == ["p2p_verify"]
