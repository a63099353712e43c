"""The host manifest: its collector on recorded x99-3080 trees, the module, `provision diff` and its exit codes.

The hardware comes from src/rigbook/lab/hardware_trees.py (the recorded x99-3080 lab rig). What the roles leave
on a box (env files, the SGLang venv stamp and dist-info, dpkg-query's listing, `dkms status`) and the host identity
are RECONSTRUCTED here by add_installed_state() / add_identity(), in the formats the roles and tools write.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
from ansible_collections.rigbook.homelab.plugins.module_utils.collect import manifest as collector
from ansible_collections.rigbook.homelab.plugins.modules import host_manifest
from helpers.cli import provision
from helpers.modules import run_module

from rigbook import manifests
from rigbook.errors import UserError
from rigbook.lab.hardware_trees import materialize

# CONVERTED from the dpkg status file (var/lib/dpkg/status) this test wrote before the manifest read packages through
# facts/packages.py: the same three packages (a held kernel image, an installed driver, a removed package whose
# configuration files are left) as the dpkg-query listing (facts/packages.DPKG_QUERY: name, status, version) a
# recorded tree keeps as var/lib/rigbook/commands/dpkg-query.txt.
DPKG_QUERY = ("linux-image-7.0.0-31-generic\thi \t7.0.0-31.31\n"
              "nvidia-dkms-615-open\tii \t615.71.09-0ubuntu1\n"
              "removed-thing\trc \t1.0\n")
DKMS_STATUS = ("nvidia/615.71.09, 7.0.0-31-generic, x86_64: installed\n"
               "nvidia/615.71.09, 6.8.0-40-generic, x86_64: built\n")
# source_build's stamp of an nccl-tests prefix (its keys as the module writes them; the values reconstructed)
NCCL_TESTS_STAMP = {"name": "nccl-tests", "version": "2.19.6", "components": [{"name": "nccl-tests", "patches": []}],
                    "files": {"bin/sendrecv_perf": "5e" * 32, "bin/all_reduce_perf": "a1" * 32}}
VENV_STAMP = {"patches": ["0001-p2p.patch -p1 " + "ab" * 32], "versions": {"sglang": "0.5.18"}, "patch_set": "0f1e"}


def write(root: Path, rel: str, text: str) -> None:
    target = root / rel
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)


def add_installed_state(root: Path) -> None:
    write(root, "etc/rigbook/cuda.env", "CUDA_HOME=/usr/local/cuda-13.0\n")
    write(root, "usr/local/cuda-13.0/version.json", json.dumps({"cuda": {"version": "13.0.48"}}))
    write(root, "var/lib/rigbook/commands/dpkg-query.txt", DPKG_QUERY)
    write(root, "var/lib/rigbook/commands/dkms-status.txt", DKMS_STATUS)
    write(root, "opt/rigbook/nccl-tests/current/.rigbook-build.json", json.dumps(NCCL_TESTS_STAMP, sort_keys=True))
    venv = "opt/rigbook/sglang/0.5.18-0f1e"
    write(root, f"{venv}/.rigbook-venv.json", json.dumps(VENV_STAMP, indent=2, sort_keys=True))
    for dist in ("sglang-0.5.18", "torch-2.9.1", "sgl_kernel-0.3.21"):
        write(root, f"{venv}/lib/python3.12/site-packages/{dist}.dist-info/METADATA", "Metadata-Version: 2.1\n")
    write(root, "etc/systemd/system/rigbook-serve-qwen.service",
          "[Service]\nExecStart=/opt/rigbook/sglang/0.5.18-0f1e/bin/python3 -m sglang.launch_server --tp-size 2 "
          "--host {bind} --port 30000\n")
    write(root, "etc/rigbook/serve/qwen.env", "SGLANG_ARGS=--mem-fraction-static 0.88\n")


def add_identity(root: Path, name: str, mac: str, bind: str) -> None:
    write(root, "etc/hostname", name + "\n")
    write(root, "etc/machine-id", (name.encode().hex() * 8)[:32] + "\n")
    write(root, "sys/class/net/enp5s0/address", mac + "\n")
    write(root, "etc/rigbook/serve/qwen.key.env", f"SGLANG_API_KEY=secret-of-{name}\n")
    unit = root / "etc/systemd/system/rigbook-serve-qwen.service"
    unit.write_text(unit.read_text().replace("{bind}", bind))


def twin(base: Path, name: str, mac: str, bind: str) -> Path:
    root = materialize("x99-3080", base / name)
    add_installed_state(root)
    add_identity(root, name, mac, bind)
    return root


@pytest.fixture
def twins(tmp_path):
    return (twin(tmp_path, "rig-a", "3c:7c:3f:00:00:0a", "192.0.2.10"),
            twin(tmp_path, "rig-b", "3c:7c:3f:00:00:0b", "192.0.2.11"))


def collect(root: Path) -> dict:
    return collector.collect_manifest(str(root), str(root))


def test_the_collector_reads_the_recorded_tree(twins):
    items = collect(twins[0])["items"]
    assert items["kernel.running"]["value"] == "7.0.0-31-generic"
    assert "iommu=pt" in items["kernel.cmdline"]["value"]
    assert not any(p.startswith("root=") for p in items["kernel.cmdline"]["value"])
    assert items["host.cmdline_disks"]["unique"] and items["host.cmdline_disks"]["value"][0].startswith("root=UUID=")
    assert items["kernel.held"]["value"] == ["linux-image-7.0.0-31-generic"]
    assert items["packages.held"]["value"] == {"linux-image-7.0.0-31-generic": "7.0.0-31.31"}
    assert items["dkms.7.0.0-31-generic"]["value"] == ["nvidia/615.71.09: installed"]
    assert items["dkms.6.8.0-40-generic"]["value"] == ["nvidia/615.71.09: built"]
    assert items["driver.nvidia"]["value"] == "615.71.09"
    assert items["cuda.version"]["value"] == "13.0.48"
    assert items["sglang.0.5.18-0f1e.packages"]["value"] == {"sglang": "0.5.18", "sgl-kernel": "0.3.21",
                                                             "torch": "2.9.1"}
    assert items["sglang.0.5.18-0f1e.patches"]["value"] == VENV_STAMP["patches"]
    assert items["gpu.count"]["value"] == 2
    gpu = "gpu.0000:03:00.0"
    assert items[f"{gpu}.model"]["value"]["name"] == "NVIDIA GeForce RTX 3080"
    assert items[f"{gpu}.vbios"] == {"group": "firmware", "value": "94.02.42.00.A9", "unique": False}
    assert items[f"{gpu}.link"]["value"]["max_width"] == 16 and items[f"{gpu}.link"]["group"] == "pcie_link"
    assert items[f"{gpu}.bars"]["group"] == "dma_window" and 268435456 in items[f"{gpu}.bars"]["value"]
    assert len(items["file.etc/rigbook/cuda.env"]["value"]) == 64
    assert items["file.etc/rigbook/serve/qwen.key.env"]["unique"]
    unique = {k for k, v in items.items() if v["unique"]}
    assert {"host.hostname", "host.machine_id", "host.mac.enp5s0"} <= unique


def test_two_materialized_twins_differ_only_in_host_unique_items(twins):
    result = manifests.diff(collect(twins[0]), collect(twins[1]))
    assert result["pinned"] == {}
    assert {row["item"] for row in result["unique"]} == {
        "host.hostname", "host.machine_id", "host.mac.enp5s0", "file.etc/rigbook/serve/qwen.key.env",
        "bind.etc/systemd/system/rigbook-serve-qwen.service"}
    assert result["same"] > 20


def test_twins_with_one_group_build_are_equal_and_another_build_is_pinned_under_its_role(twins):
    a, b = twins
    items = collect(a)["items"]
    assert items["nccl_tests.version"] == {"group": "nccl_tests", "value": "2.19.6", "unique": False}
    assert items["nccl_tests.files"]["value"] == NCCL_TESTS_STAMP["files"]
    assert len(items["nccl_tests.stamp_sha256"]["value"]) == 64
    other = dict(NCCL_TESTS_STAMP, files=dict(NCCL_TESTS_STAMP["files"], **{"bin/sendrecv_perf": "00" * 32}))
    write(b, "opt/rigbook/nccl-tests/current/.rigbook-build.json", json.dumps(other, sort_keys=True))
    result = manifests.diff(collect(a), collect(b))
    assert list(result["pinned"]) == ["nccl_tests"], result["pinned"]
    assert [r["item"] for r in result["pinned"]["nccl_tests"]] == ["nccl_tests.files", "nccl_tests.stamp_sha256"]
    builds = {build["build"]: build for build in result["builds"]}  # the SGLang venv's and the DKMS modules' too
    assert set(builds) == {"nccl_tests", "sglang.0.5.18-0f1e", "dkms.7.0.0-31-generic"}
    assert builds["sglang.0.5.18-0f1e"]["equal"] and builds["dkms.7.0.0-31-generic"]["equal"]
    assert not builds["nccl_tests"]["equal"] and builds["nccl_tests"]["a"] != builds["nccl_tests"]["b"]
    same = {build["build"]: build["equal"] for build in manifests.diff(collect(a), collect(a))["builds"]}
    assert same == {"nccl_tests": True, "sglang.0.5.18-0f1e": True, "dkms.7.0.0-31-generic": True}


def test_the_modules_dkms_installed_are_hashed_per_kernel_and_listed_with_the_builds(twins):
    a, b = twins
    for root in twins:
        write(root, "lib/modules/7.0.0-31-generic/updates/dkms/nvidia.ko", "the fork, built once\n")
    items = collect(a)["items"]
    assert items["dkms.7.0.0-31-generic.modules_sha256"]["group"] == "driver_state"
    assert "dkms.6.8.0-40-generic.modules_sha256" not in items  # no module file for that kernel
    assert {r["build"]: r["equal"] for r in manifests.diff(collect(a), collect(b))["builds"]}[
        "dkms.7.0.0-31-generic"] is True
    # built again on the twin: the same pin, other bits - listed with the builds, not a pinned difference
    write(b, "lib/modules/7.0.0-31-generic/updates/dkms/nvidia.ko", "built again\n")
    result = manifests.diff(collect(a), collect(b))
    assert result["pinned"] == {} and items["dkms.7.0.0-31-generic.modules_sha256"]["bits"] is True
    assert {r["build"]: r["equal"] for r in result["builds"]}["dkms.7.0.0-31-generic"] is False


def test_a_serve_unit_is_pinned_apart_from_the_address_it_listens_on(twins):
    unit = twins[1] / "etc/systemd/system/rigbook-serve-qwen.service"
    unit.write_text(unit.read_text().replace("--tp-size 2", "--tp-size 1"))
    result = manifests.diff(collect(twins[0]), collect(twins[1]))
    assert list(result["pinned"]) == ["serve"], result["pinned"]
    assert [row["item"] for row in result["pinned"]["serve"]] == ["file.etc/systemd/system/rigbook-serve-qwen.service"]


def test_a_pinned_difference_is_grouped_by_layer_or_role(twins):
    a, b = twins
    write(b, "etc/rigbook/cuda.env", "CUDA_HOME=/usr/local/cuda-12.8\n")
    write(b, "proc/cmdline", (a / "proc/cmdline").read_text().replace("iommu=pt", "iommu=on"))
    result = manifests.diff(collect(a), collect(b))
    assert set(result["pinned"]) == {"cuda_toolchain", "kernel_state"}
    assert [r["item"] for r in result["pinned"]["cuda_toolchain"]] == ["cuda.version", "file.etc/rigbook/cuda.env"]
    row = result["pinned"]["kernel_state"][0]
    assert row["item"] == "kernel.cmdline" and "iommu=pt" in row["a"] and "iommu=on" in row["b"]


# The kernel role's note of the stored .debs it installed the distribution kernel from (plugins/modules/deb_packages.py
# writes it from the controller's store record: module_utils/deb_store.box_record); the sha256 values reconstructed.
KERNEL_NOTE = {"release": "7.0.0-31-generic", "architecture": "amd64", "packages": {
    "linux-image-7.0.0-31-generic": {"version": "7.0.0-31.31", "sha256": "5b" * 32},
    "linux-modules-extra-7.0.0-31-generic": {"version": "7.0.0-31.31", "sha256": "7c" * 32}}}


def test_the_kernel_s_stored_debs_are_shown_with_their_sha256_and_other_bytes_are_a_pinned_difference(twins, capsys):
    a, b = twins
    assert collect(a)["items"]["kernel.debs"] == {"group": "kernel_state", "value": None, "unique": False}
    for root in twins:
        write(root, "var/lib/rigbook/debs/kernel.json", json.dumps(KERNEL_NOTE))
    assert collect(a)["items"]["kernel.debs"] == {"group": "kernel_state", "value": KERNEL_NOTE["packages"],
                                                  "unique": False}
    result = manifests.diff(collect(a), collect(b))
    assert result["pinned"] == {} and [row["equal"] for row in result["kernel_debs"]] == [True, True]
    manifests.print_diff(result, "rig-a", "rig-b", os.sys.stdout)
    out = capsys.readouterr().out
    assert f"kernel package linux-image-7.0.0-31-generic: equal, 7.0.0-31.31 sha256 {'5b' * 32}\n" in out
    assert f"kernel package linux-modules-extra-7.0.0-31-generic: equal, 7.0.0-31.31 sha256 {'7c' * 32}\n" in out
    # the twin's modules-extra came from other bytes of the same version
    other = json.loads(json.dumps(KERNEL_NOTE))
    other["packages"]["linux-modules-extra-7.0.0-31-generic"]["sha256"] = "00" * 32
    write(b, "var/lib/rigbook/debs/kernel.json", json.dumps(other))
    result = manifests.diff(collect(a), collect(b))
    assert [row["item"] for row in result["pinned"]["kernel_state"]] == ["kernel.debs"]
    manifests.print_diff(result, "rig-a", "rig-b", os.sys.stdout)
    out = capsys.readouterr().out
    assert (f'kernel package linux-modules-extra-7.0.0-31-generic: "7.0.0-31.31 sha256 {"7c" * 32}" / '
            f'"7.0.0-31.31 sha256 {"00" * 32}"\n') in out
    # a twin the store gave nothing (a plain ansible-playbook run): its side is absent, a pinned difference too
    (b / "var/lib/rigbook/debs/kernel.json").unlink()
    result = manifests.diff(collect(a), collect(b))
    assert [row["item"] for row in result["pinned"]["kernel_state"]] == ["kernel.debs"]
    assert {row["b"] for row in result["kernel_debs"]} == {None}


def test_a_garbled_kernel_note_is_a_reason_never_a_value(twins):
    write(twins[0], "var/lib/rigbook/debs/kernel.json",
          json.dumps({"packages": {"linux-image-x": {"version": "\x1b[2J", "sha256": "5b" * 32}}}))
    value = collect(twins[0])["items"]["kernel.debs"]["value"]
    assert value == ("unreadable: var/lib/rigbook/debs/kernel.json: the entry 'linux-image-x' is no package with a "
                     "version and sha256")
    assert manifests.kernel_debs(collect(twins[0]), collect(twins[1])) == []


def save(path: Path, manifest: dict) -> Path:
    path.write_text(json.dumps(manifest))
    return path


def test_diff_exit_codes_and_json(twins, tmp_path, capsys):
    a = save(tmp_path / "a.json", collect(twins[0]))
    b = save(tmp_path / "b.json", collect(twins[1]))
    assert manifests.diff_command(str(a), str(b), False, os.sys.stdout) == 0
    out = capsys.readouterr().out
    assert "no pinned item differs" in out and "host-unique (5 item(s)" in out
    stamp = hashlib.sha256(json.dumps(NCCL_TESTS_STAMP, sort_keys=True).encode()).hexdigest()
    assert f"build nccl_tests: equal, sha256 {stamp}\n" in out
    write(twins[1], "sys/bus/pci/devices/0000:04:00.0/current_link_width", "8\n")
    b = save(tmp_path / "b.json", collect(twins[1]))
    assert manifests.diff_command(str(a), str(b), True, os.sys.stdout) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["exit_code"] == 1 and [r["item"] for r in data["pinned"]["pcie_link"]] == ["gpu.0000:04:00.0.link"]


def manifest_run(state: Path, hosts: dict) -> Path:
    run = state / "runs" / "20250101-000000-manifest-abc123"
    (run / "manifests").mkdir(parents=True)
    for host, data in hosts.items():
        save(run / "manifests" / f"{host}.json", {**data, "host": host})
    return run


def test_cli_diff_of_two_hosts_of_the_last_manifest_run(twins, tmp_path):
    state = tmp_path / "state"
    manifest_run(state, {"rig-a": collect(twins[0]), "rig-b": collect(twins[1])})
    proc = provision("diff", "rig-a", "rig-b", env={"RIGBOOK_STATE_DIR": str(state)})
    assert proc.returncode == 0, proc.stderr
    assert "rig-a vs rig-b: no pinned item differs" in proc.stdout


def test_cli_diff_of_an_unknown_host_exits_2_without_a_traceback(twins, tmp_path):
    state = tmp_path / "state"
    env = {"RIGBOOK_STATE_DIR": str(state)}
    proc = provision("diff", "rig-a", "rig-z", env=env)
    assert proc.returncode == 2 and "no manifest run yet" in proc.stderr and "Traceback" not in proc.stderr
    manifest_run(state, {"rig-a": collect(twins[0])})
    proc = provision("diff", "rig-a", "rig-z", env=env)
    assert proc.returncode == 2, proc.stderr
    assert "'rig-z' is neither a manifest file nor a host" in proc.stderr and "hosts: rig-a" in proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""


def inventory_run(state: Path, name: str, inventory: Path, hosts: dict) -> Path:
    """A stored manifest run NAME (its folder name orders it) made with INVENTORY, as run.json records it."""
    run = state / "runs" / name
    (run / "manifests").mkdir(parents=True)
    save(run / "run.json", {"playbook": "manifest.yml", "inventory": str(inventory), "exit_code": 0})
    for host, data in hosts.items():
        save(run / "manifests" / f"{host}.json", {**data, "host": host})
    return run


@pytest.fixture
def rig_inventory(tmp_path) -> Path:
    inv = tmp_path / "rigs"
    inv.mkdir()
    (inv / "hosts.yml").write_text("all:\n  hosts:\n    rig-a: {}\n    rig-b: {}\n    rig-c: {}\n")
    return inv


def test_cli_diff_with_an_inventory_compares_its_hosts_newest_manifests(twins, tmp_path, rig_inventory):
    state = tmp_path / "state"
    env = {"RIGBOOK_STATE_DIR": str(state)}
    a, b = collect(twins[0]), collect(twins[1])
    write(twins[1], "etc/rigbook/cuda.env", "CUDA_HOME=/usr/local/cuda-12.8\n")
    b_old = collect(twins[1])
    inventory_run(state, "20250101-000000-manifest-aaaaaa", rig_inventory, {"rig-a": a, "rig-b": b_old})
    inventory_run(state, "20250102-000000-manifest-bbbbbb", rig_inventory, {"rig-b": b})  # rig-b fixed since
    other = tmp_path / "other"
    other.mkdir()
    (other / "hosts.yml").write_text("all:\n  hosts:\n    rig-a: {}\n")
    inventory_run(state, "20250103-000000-manifest-cccccc", other, {"rig-a": b_old})  # another inventory's: unused
    proc = provision("diff", "-i", rig_inventory, "rig-a", "rig-b", env=env)
    assert proc.returncode == 0, proc.stderr
    assert "rig-a vs rig-b: no pinned item differs" in proc.stdout and "host-unique (5 item(s)" in proc.stdout
    proc = provision("diff", "rig-b", "rig-a", "--inventory", rig_inventory, "--json", env=env)
    assert proc.returncode == 0 and json.loads(proc.stdout)["pinned"] == {}, proc.stderr
    inventory_run(state, "20250104-000000-manifest-dddddd", rig_inventory, {"rig-b": b_old})  # rig-b regressed
    proc = provision("diff", "-i", rig_inventory, "rig-a", "rig-b", env=env)
    assert proc.returncode == 1, proc.stderr
    assert "rig-a vs rig-b: 2 pinned item(s) differ" in proc.stdout and "[cuda_toolchain]" in proc.stdout
    assert '    rig-a: "13.0.48"\n    rig-b: (absent)' in proc.stdout
    proc = provision("diff", "-i", rig_inventory, "rig-a", "rig-c", env=env)  # a host with no manifest yet
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and proc.stdout == ""
    assert "host 'rig-c' of inventory" in proc.stderr and "hosts with one: rig-a, rig-b" in proc.stderr
    proc = provision("diff", "-i", rig_inventory, "rig-a", "rig-z", env=env)  # no host of the inventory
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "'rig-z' is neither a host of inventory" in proc.stderr and "hosts: rig-a, rig-b, rig-c" in proc.stderr


def test_cli_diff_with_a_bad_inventory_exits_2_with_a_message(tmp_path, rig_inventory):
    env = {"RIGBOOK_STATE_DIR": str(tmp_path / "state")}
    proc = provision("diff", "-i", tmp_path / "no-such-inventory", "rig-a", "rig-b", env=env)
    assert proc.returncode == 2 and proc.stdout == "" and "Traceback" not in proc.stderr
    assert "error: inventory" in proc.stderr and "not found" in proc.stderr
    (rig_inventory / "hosts.yml").write_text("all: [1\n")
    proc = provision("diff", "-i", rig_inventory, "rig-a", "rig-b", env=env)
    assert proc.returncode == 2 and "not valid YAML" in proc.stderr and "Traceback" not in proc.stderr
    proc = provision("diff", "-i", env=env)
    assert proc.returncode == 2 and "usage: provision diff" in proc.stderr


def test_plain_diff_prints_a_long_kernel_command_line_whole(twins, tmp_path, rig_inventory):
    a, b = twins
    extra = [f"rigbook.test_argument_{n}=value-{n:03d}" for n in range(12)]
    write(b, "proc/cmdline", (a / "proc/cmdline").read_text().replace("iommu=pt", "iommu=on " + " ".join(extra)))
    state = tmp_path / "state"
    inventory_run(state, "20250101-000000-manifest-aaaaaa", rig_inventory, {"rig-a": collect(a), "rig-b": collect(b)})
    proc = provision("diff", "-i", rig_inventory, "rig-a", "rig-b", env={"RIGBOOK_STATE_DIR": str(state)})
    assert proc.returncode == 1, proc.stderr
    cmdline = collect(b)["items"]["kernel.cmdline"]["value"]
    assert len(json.dumps(cmdline)) > 300
    assert f"    rig-b: {json.dumps(cmdline, sort_keys=True)}\n" in proc.stdout
    assert all(arg in proc.stdout for arg in extra) and "..." not in proc.stdout and "\u2026" not in proc.stdout


def test_a_file_that_is_no_manifest_is_a_user_error(tmp_path):
    (tmp_path / "x.json").write_text("[1, 2]")
    (tmp_path / "y.json").write_text("{not json")
    with pytest.raises(UserError, match="not a manifest"):
        manifests.resolve_side(str(tmp_path / "x.json"), None)
    with pytest.raises(UserError, match="not valid JSON"):
        manifests.resolve_side(str(tmp_path / "y.json"), None)


def test_the_module_returns_the_manifest_in_check_mode(twins):
    run = run_module(host_manifest, {"root": str(twins[0]), "system": str(twins[0])}, check_mode=True)
    assert not run.failed and run.result["changed"] is False
    assert run.result["manifest"]["items"] == collect(twins[0])["items"]


def test_parsers_on_their_edges():
    assert collector.parse_dkms_status("nvidia/580.1, 6.8.0-1, x86_64: installed (WARNING Diff)\njunk\n") == {
        "6.8.0-1": ["nvidia/580.1: installed (WARNING Diff)"]}
    assert collector.parse_dkms_status("amdgpu, 6.10.5, 6.8.0-1, x86_64: installed") == {
        "6.8.0-1": ["amdgpu/6.10.5: installed"]}
    assert collector.parse_ip_addr("1: lo    inet 127.0.0.1/8 scope host lo\n2: eno1    inet 192.0.2.5/24 brd x\n") \
        == ["eno1 192.0.2.5/24"]


DKMS_FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "dkms"  # recorded: tests/fixtures/dkms/SOURCES.md


def test_recorded_dkms_status_outputs_of_both_forms_and_their_warnings():
    read = collector.parse_dkms_status
    assert read((DKMS_FIXTURES / "dkms-status-broken-entry.txt").read_text()) == {  # the error lines are read past
        "6.12.10-76061203-generic": ["nvidia/570.172.08: installed"],
        "6.16.3-76061603-generic": ["nvidia/570.172.08: installed"]}
    assert read((DKMS_FIXTURES / "dkms-3.0.9-status-warnings.txt").read_text()) == {
        "5.15.86-1-lts": ["rtl88x2bu/5.13.1.r179.a2ac3b2: installed", "rtl88x2bu/5.13.1: built",
                          "rtl88x2bu/r142.549257e: built"],
        "6.1.4-arch1-1": ["rtl88x2bu/5.13.1.r179.a2ac3b2: installed (WARNING! Missing some built modules!)",
                          "rtl88x2bu/r142.549257e: built (WARNING! Missing some built modules!)"]}
    assert read((DKMS_FIXTURES / "dkms-2-status.txt").read_text()) == {
        "5.11.0-36-generic": ["nvidia/460.91.03: installed"]}


@pytest.mark.parametrize("raw,problem", [
    (b'{"items": {"kernel.release": "6.8"}}', "item 'kernel.release' is not an object but str"),
    (b'{"items": ["kernel.release"]}', "no items object"),
    (b'"a string"', "not a JSON object but str"),
    (b"\xff{}", "not UTF-8 text"),
    (b"{not json", "not valid JSON"),
], ids=lambda value: value if isinstance(value, str) else None)
def test_cli_diff_of_a_malformed_manifest_exits_2_naming_it(twins, tmp_path, raw, problem):
    state = tmp_path / "state"
    run = manifest_run(state, {"rig-a": collect(twins[0]), "rig-b": collect(twins[1])})
    (run / "manifests" / "rig-b.json").write_bytes(raw)
    saved = save(tmp_path / "saved.json", collect(twins[0]))
    for args in (("rig-a", "rig-b"), (saved, run / "manifests" / "rig-b.json")):
        proc = provision("diff", *args, env={"RIGBOOK_STATE_DIR": str(state)})
        assert proc.returncode == 2 and "Traceback" not in proc.stderr and proc.stdout == "", proc.stderr
        assert f"error: {run / 'manifests' / 'rig-b.json'}: not a manifest ({problem}" in proc.stderr


def test_cli_diff_with_an_inventory_names_a_bad_run_record_and_leaves_its_run_out(twins, tmp_path, rig_inventory):
    state = tmp_path / "state"
    a, b = collect(twins[0]), collect(twins[1])
    inventory_run(state, "20250101-000000-manifest-aaaaaa", rig_inventory, {"rig-a": a, "rig-b": b})
    bad = inventory_run(state, "20250102-000000-manifest-bbbbbb", rig_inventory, {"rig-b": {"items": {}}})
    (bad / "run.json").write_text('{"inventory": ["rigs"]}')
    proc = provision("diff", "-i", rig_inventory, "rig-a", "rig-b", env={"RIGBOOK_STATE_DIR": str(state)})
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr == (f"warning: run record {bad / 'run.json'} is unusable: inventory is not a string but "
                           "list: its manifests are left out\n")
    assert "rig-a vs rig-b: no pinned item differs" in proc.stdout


# --- the controller labels the items (issue 34) ------------------------------------------------------------------

RCCL_STAMP = {"name": "rccl", "version": "2.27.7", "components": [{"name": "rccl", "patches": ["p -p1 " + "cd" * 32]}],
              "files": {"lib/librccl.so": "7e" * 32}}


def test_the_controller_labels_every_item_the_collector_makes_as_the_collector_does(twins):
    """manifests.ITEM_RULES is the controller's own copy of what each item is: for every item of a full manifest
    (an RCCL build, DKMS modules, a GPU serial and DMI serials added to the recorded tree) it agrees with the label
    the collector gives, so diff's meaning cannot drift from the collector's."""
    root = twins[0]
    write(root, "opt/rigbook/rccl/current/.rigbook-build.json", json.dumps(RCCL_STAMP, sort_keys=True))
    write(root, "lib/modules/7.0.0-31-generic/updates/dkms/nvidia.ko", "built\n")
    write(root, "sys/class/dmi/id/board_serial", "SN-1\n")
    write(root, "sys/class/dmi/id/bios_version", "3.4\n")
    items = collect(root)["items"]
    assert {"rccl.stamp_sha256", "dkms.7.0.0-31-generic.modules_sha256", "dmi.board_serial", "dmi.bios_version",
            "host.cmdline_disks", "file.etc/rigbook/serve/qwen.key.env"} <= set(items)
    for key, item in items.items():
        box = {"group": item["group"], "unique": item["unique"], "build": item.get("build"),
               "bits": bool(item.get("bits"))}
        assert manifests.label_of(key) == box, key
    assert manifests.label_of("something.new") == {"group": "other", "unique": False, "build": None, "bits": False}


def _relabelled(manifest: dict, labels: dict) -> dict:
    """MANIFEST with the labels of some items replaced, as a box that wants its drift excused would send it."""
    items = {key: {**item, **labels.get(key, {})} for key, item in manifest["items"].items()}
    return {**manifest, "items": items}


def test_a_twin_that_labels_its_drift_host_unique_or_a_build_s_bits_still_differs(twins, tmp_path):
    """The attack: the twin's cuda.env and default kernel drifted, and its manifest calls the one host-unique and
    the other a build's bits (with a build name). `provision diff` decides by the item's name: both differ, exit 1."""
    a, b = twins
    write(b, "etc/rigbook/cuda.env", "CUDA_HOME=/usr/local/cuda-12.8\n")
    (b / "boot").mkdir(exist_ok=True)
    (b / "boot" / "vmlinuz").unlink(missing_ok=True)
    (b / "boot" / "vmlinuz").symlink_to("vmlinuz-6.8.0-40-generic")
    lying = _relabelled(collect(b), {"file.etc/rigbook/cuda.env": {"group": "host", "unique": True},
                                     "cuda.version": {"group": "host", "unique": True},
                                     "kernel.default": {"bits": True, "build": "dkms.x", "group": "driver_state"}})
    state = tmp_path / "state"
    manifest_run(state, {"rig-a": collect(a), "rig-b": lying})
    env = {"RIGBOOK_STATE_DIR": str(state)}
    proc = provision("diff", "rig-a", "rig-b", "--json", env=env)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    result = json.loads(proc.stdout)
    assert [r["item"] for r in result["pinned"]["cuda_toolchain"]] == ["cuda.version", "file.etc/rigbook/cuda.env"]
    assert [r["item"] for r in result["pinned"]["kernel_state"]] == ["kernel.default"]
    assert not {"cuda.version", "file.etc/rigbook/cuda.env"} & {r["item"] for r in result["unique"]}
    assert "dkms.x" not in {b["build"] for b in result["builds"]}
    proc = provision("diff", "rig-a", "rig-b", env=env)
    assert proc.returncode == 1 and "rig-a vs rig-b: 3 pinned item(s) differ" in proc.stdout, proc.stdout


ESCAPES = "\x1b[1A\x1b[2K\x1b]52;c;ZXZpbA==\x07\x9b2K\u202e"


def test_escape_sequences_in_a_manifest_never_reach_the_terminal(twins, tmp_path):
    """ESC[1A ESC[2K (up a line, erase it: a "differ" line hidden), OSC 52 (write the clipboard), a C1 CSI and a
    bidi override in an item's name and value, and in a host's file name: printed as visible escapes."""
    a, b = collect(twins[0]), collect(twins[1])
    b["items"][f"kernel.cmdline{ESCAPES}"] = {"group": "kernel_state", "value": f"quiet{ESCAPES}", "unique": False}
    b["items"]["kernel.running"]["value"] = f"6.8{ESCAPES}"
    state = tmp_path / "state"
    manifest_run(state, {"rig-a": a, f"rig-b{ESCAPES}": b})
    proc = provision("diff", "rig-a", f"rig-b{ESCAPES}", env={"RIGBOOK_STATE_DIR": str(state)})
    assert proc.returncode == 1, proc.stderr
    for byte in ("\x1b", "\x07", "\x9b", "\u202e"):
        assert byte not in proc.stdout + proc.stderr
    shown = "\\x1b[1A\\x1b[2K\\x1b]52;c;ZXZpbA==\\x07\\x9b2K\\u202e"
    assert f"[other]\n  kernel.cmdline{shown}\n    rig-a: (absent)\n    rig-b{shown}: \"quiet\\u001b[1A" in proc.stdout
    assert f"  kernel.running\n    rig-a: \"7.0.0-31-generic\"\n    rig-b{shown}: \"6.8\\u001b[1A" in proc.stdout
