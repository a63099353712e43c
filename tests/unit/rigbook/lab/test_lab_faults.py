"""Faults as data: the shipped definitions validate, each one changes what the evidence reads."""

from __future__ import annotations

import copy
import filecmp
import json
from pathlib import Path

import pytest
import yaml
from ansible_collections.rigbook.homelab.plugins.module_utils.parse import nccl as parse_nccl
from ansible_collections.rigbook.homelab.plugins.module_utils.parse import nvidia_smi as parse_nvidia_smi

from rigbook.errors import UserError
from rigbook.lab import faults, hardware_trees

REQUIRED = ["bar1-256m", "rebar-off", "link-x8", "link-gen1", "iommu-flags-lost", "kernel-upgraded-module-missing",
            "dma-window-above-44bit", "nccl-shm-fallback", "busbw-half"]


def broken(tmp_path: Path, rig_name: str, *names: str) -> Path:
    tree = hardware_trees.materialize(rig_name, tmp_path / rig_name)
    rig = hardware_trees.load_rig(rig_name)
    for name in names:
        changes = faults.plan(name, tree, rig)
        assert changes, f"{name} changed nothing on {rig_name}"
        faults.apply(changes)
    return tree


def read(tree: Path, rel: str) -> str:
    return (tree / rel).read_text()


def vram_bar(tree: Path, bdf: str, index: int) -> tuple:
    line = read(tree, f"sys/bus/pci/devices/{bdf}/resource").splitlines()[index]
    start, end, flags = (int(x, 16) for x in line.split())
    return start, end - start + 1, flags


def test_shipped_faults_validate_and_include_the_required_ones():
    data = yaml.safe_load(faults.FAULTS_FILE.read_text())
    faults.validate(data)
    assert set(REQUIRED) <= set(faults.fault_names())
    for name, fault in data["faults"].items():
        assert fault["layer"] in faults.layer_names(), name


GPU_ENV = "# BEGIN amd_rocm\nHSA_ENABLE_IPC_MODE_LEGACY=0\nNCCL_P2P_LEVEL=PHB\n# END amd_rocm\n"


def host(tmp_path: Path, rig_name: str) -> Path:
    """A host root as the roles leave it (the GPU environment file, an RCCL prefix with its current link) holding
    the rig's evidence tree where a lab host has it; returns the tree."""
    root = tmp_path / f"{rig_name}-root"
    (root / "etc/rigbook").mkdir(parents=True)
    (root / "etc/rigbook/gpu.env").write_text(GPU_ENV)
    lib = root / "opt/rigbook/rccl/2.27.7-abc/lib"
    lib.mkdir(parents=True)
    (lib / "librccl.so.1.0").write_bytes(b"patched build\n")
    (lib / "librccl.so").symlink_to("librccl.so.1.0")
    (root / "opt/rigbook/rccl/current").symlink_to("2.27.7-abc")
    return hardware_trees.materialize(rig_name, root / faults.EVIDENCE_ROOT)


@pytest.mark.parametrize("name", sorted(yaml.safe_load(faults.FAULTS_FILE.read_text())["faults"]))
def test_every_fault_changes_some_rig(name, tmp_path):
    changed = []
    for rig_name in hardware_trees.rig_names():
        tree = host(tmp_path, rig_name)
        if name == "collectives-tool-missing":  # it removes what the roles built: the tests' programs
            (faults.host_root_of(tree) / "opt/rigbook/rccl/current/bin").mkdir()
            (faults.host_root_of(tree) / "opt/rigbook/rccl/current/bin/sendrecv_perf").write_bytes(b"tests\n")
        try:
            if faults.plan(name, tree, hardware_trees.load_rig(rig_name)):
                changed.append(rig_name)
        except UserError:  # not for this vendor
            pass
    assert changed, f"fault {name} changes no shipped rig"


def test_bar1_256m_moves_the_vram_bar_below_4g(tmp_path):
    tree = broken(tmp_path, "x99-r9700", "bar1-256m")
    assert vram_bar(tree, "0000:03:00.0", 0)[:2] == (0xC0000000, 256 << 20)
    assert vram_bar(tree, "0000:06:00.0", 0)[:2] == (0xD0000000, 256 << 20)
    assert vram_bar(tree, "0000:03:00.0", 0)[2] == 0x14220C  # still a 64-bit prefetchable BAR


def test_rebar_off_keeps_the_address_and_shrinks_the_bar(tmp_path):
    tree = broken(tmp_path, "x99-r9700", "rebar-off")
    assert vram_bar(tree, "0000:03:00.0", 0)[:2] == (0x3800000000, 256 << 20)


def test_faults_already_true_of_the_3080_change_nothing(tmp_path):
    tree = hardware_trees.materialize("x99-3080", tmp_path / "t")
    rig = hardware_trees.load_rig("x99-3080")
    for name in ("bar1-256m", "rebar-off", "nccl-shm-fallback", "busbw-half"):
        assert faults.plan(name, tree, rig) == [], name


def test_link_faults(tmp_path):
    tree = broken(tmp_path, "x99-3080", "link-x8")
    for bdf in ("0000:03:00.0", "0000:04:00.0", "0000:00:02.0"):
        assert read(tree, f"sys/bus/pci/devices/{bdf}/current_link_width") == "8\n"
    assert read(tree, "sys/bus/pci/devices/0000:03:00.0/max_link_width") == "16\n"
    smi = parse_nvidia_smi.parse_q(read(tree, "var/lib/rigbook/commands/nvidia-smi-q.txt"))
    assert [g["link_width_current"] for g in smi["gpus"]] == [8, 8]
    assert [g["link_width_max"] for g in smi["gpus"]] == [16, 16]

    tree = broken(tmp_path / "gen1", "x99-r9700", "link-gen1")
    for bdf in ("0000:03:00.0", "0000:06:00.0"):
        assert read(tree, f"sys/bus/pci/devices/{bdf}/current_link_speed") == "2.5 GT/s PCIe\n"
    assert read(tree, "sys/bus/pci/devices/0000:00:02.0/max_link_speed") == "2.5 GT/s PCIe\n"


def test_slot_link_x8_edits_the_link_across_the_slot_not_the_gpus_own(tmp_path):
    """On the R9700's card the slot link is the card's switch upstream port's; on the 3080 (no switch) the GPU's."""
    tree = broken(tmp_path, "x99-r9700", "slot-link-x8")
    for bdf in ("0000:01:00.0", "0000:04:00.0", "0000:00:02.0", "0000:00:03.0"):
        assert read(tree, f"sys/bus/pci/devices/{bdf}/current_link_width") == "8\n", bdf
    for bdf in ("0000:02:00.0", "0000:03:00.0", "0000:05:00.0", "0000:06:00.0"):
        assert read(tree, f"sys/bus/pci/devices/{bdf}/current_link_width") == "16\n", bdf
    tree = broken(tmp_path / "3080", "x99-3080", "slot-link-x8")
    for bdf in ("0000:03:00.0", "0000:04:00.0", "0000:00:03.0"):
        assert read(tree, f"sys/bus/pci/devices/{bdf}/current_link_width") == "8\n", bdf


def test_link_gen1_on_nvidia_smi(tmp_path):
    tree = broken(tmp_path, "x99-3080", "link-gen1")
    smi = parse_nvidia_smi.parse_q(read(tree, "var/lib/rigbook/commands/nvidia-smi-q.txt"))
    assert [g["pcie_gen_max"] for g in smi["gpus"]] == [1, 1]


def test_iommu_flags_lost(tmp_path):
    for name in hardware_trees.rig_names():
        words = read(broken(tmp_path / name, name, "iommu-flags-lost"), "proc/cmdline").split()
        assert not [w for w in words if "iommu" in w], words
        assert "ro" in words


def test_kernel_upgraded_module_missing(tmp_path):
    tree = broken(tmp_path, "x99-3080", "kernel-upgraded-module-missing")
    assert read(tree, "proc/sys/kernel/osrelease") == "7.0.0-33-generic\n"
    assert "vmlinuz-7.0.0-33-generic" in read(tree, "proc/cmdline")
    assert read(tree, "boot/config-7.0.0-33-generic") == read(tree, "boot/config-7.0.0-31-generic")
    assert (tree / "lib/modules/7.0.0-33-generic").is_dir()
    assert not (tree / "lib/modules/7.0.0-33-generic/updates").exists()
    assert not (tree / "proc/driver/nvidia").exists() and not (tree / "sys/module/nvidia").exists()
    assert not (tree / "sys/bus/pci/devices/0000:03:00.0/driver").is_symlink()
    smi = parse_nvidia_smi.parse_q(read(tree, "var/lib/rigbook/commands/nvidia-smi-q.txt"))
    assert smi["gpus"] == [] and smi["driver_version"] is None


def test_nvidia_only_fault_on_amd_is_refused(tmp_path):
    tree = hardware_trees.materialize("x99-r9700", tmp_path / "t")
    with pytest.raises(UserError, match="is for nvidia GPUs; rig x99-r9700 has amd"):
        faults.plan("kernel-upgraded-module-missing", tree, hardware_trees.load_rig("x99-r9700"))


def test_dma_window_above_44bit(tmp_path):
    tree = broken(tmp_path, "x99-r9700", "dma-window-above-44bit")
    for bdf in ("0000:03:00.0", "0000:06:00.0"):
        start, size, _ = vram_bar(tree, bdf, 0)
        assert start >= 1 << 44 and size == 32 << 30


def test_nccl_shm_fallback(tmp_path):
    tree = broken(tmp_path, "x99-r9700", "nccl-shm-fallback")
    log = parse_nccl.parse(read(tree, "var/lib/rigbook/commands/nccl-log.txt"))
    assert log["path"] == "shm" and log["all_direct_p2p"] is False


def test_nccl_shm_fallback_is_refused_where_the_built_rccl_tests_write_the_log(tmp_path):
    rig = hardware_trees.load_rig("x99-r9700")
    tree = host(tmp_path, "x99-r9700")
    assert faults.plan("nccl-shm-fallback", tree, rig)  # the prefix holds no rccl-tests yet: the log is recorded
    bin_dir = tmp_path / "x99-r9700-root/opt/rigbook/rccl/2.27.7-abc/bin"
    bin_dir.mkdir()
    (bin_dir / "sendrecv_perf").write_text("")
    with pytest.raises(UserError, match="would change nothing this host's verify reads: .*rccl-unpatched"):
        faults.plan("nccl-shm-fallback", tree, rig)


def test_busbw_half(tmp_path):
    tree = broken(tmp_path, "x99-r9700", "busbw-half")
    figures = json.loads(read(tree, "var/lib/rigbook/commands/collectives.json"))
    rows = {r["op"]: r for r in figures["results"]}
    assert rows["all_reduce"]["busbw_gbs"] == pytest.approx(9.51 / 2)
    assert rows["sendrecv"]["busbw_gbs"] == pytest.approx(9.75 / 2)
    assert rows["sendrecv"]["size_bytes"] == 1 << 30  # not a bandwidth figure
    assert rows["sendrecv"]["wrong"] == 0


def test_p2p_bandwidth_half_scales_only_copy_figures(tmp_path):
    tree = broken(tmp_path, "x99-3080", "p2p-bandwidth-half")
    probe = json.loads(read(tree, "var/lib/rigbook/commands/cuda-probe.json"))
    assert [p["peer_gbs"] for p in probe["pairs"]] == [3.0, 3.0]
    assert [p["host_staged_gbs"] for p in probe["pairs"]] == [3.0, 3.0]
    assert probe["size_bytes"] == 256 << 20 and probe["pairs"][0]["src"] == 0


def test_faults_stack_and_a_fresh_tree_heals(tmp_path):
    tree = broken(tmp_path, "x99-r9700", "dma-window-above-44bit", "iommu-flags-lost", "busbw-half")
    pristine = hardware_trees.materialize("x99-r9700", tmp_path / "pristine")
    assert read(tree, "proc/cmdline") != read(pristine, "proc/cmdline")
    cmp = filecmp.dircmp(tree, pristine)
    assert cmp.diff_files or cmp.subdirs


def test_plan_writes_nothing(tmp_path):
    tree = hardware_trees.materialize("x99-r9700", tmp_path / "t")
    before = read(tree, "proc/cmdline")
    assert faults.plan("iommu-flags-lost", tree, hardware_trees.load_rig("x99-r9700"))
    assert read(tree, "proc/cmdline") == before


def test_unknown_fault():
    with pytest.raises(UserError, match=r"unknown fault 'bar1-128m' \(known: .*bar1-256m"):
        faults.get_fault("bar1-128m")


GOOD = {"faults": {"x": {"layer": "kernel_state", "description": "a description", "edits": [
    {"set": "proc/cmdline", "content": "ro\n"}]}}}


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda f: f.update(layer="bios"), "layer"),
        (lambda f: f.update(edits=[]), "edits"),
        (lambda f: f["edits"][0].pop("content"), "set needs content"),
        (lambda f: f["edits"][0].update(remove="x"), "exactly one of"),
        (lambda f: f["edits"].__setitem__(0, {"scope": "gpus"}), "exactly one of"),
        (lambda f: f["edits"].__setitem__(0, {"bar": "vram", "size": "256M"}), "scope: gpus"),
        (lambda f: f["edits"].__setitem__(0, {"replace": "a", "pattern": "(", "with": ""}), "unterminated"),
        (lambda f: f["edits"][0].update(frobnicate=1), "Additional properties"),
        (lambda f: f.update(vendors=["intel"]), "vendors"),
        (lambda f: f.pop("description"), "description"),
    ],
)
def test_bad_fault_documents_are_rejected(mutate, message):
    data = copy.deepcopy(GOOD)
    mutate(data["faults"]["x"])
    with pytest.raises(Exception, match=message):
        faults.validate(data)


def test_good_document_validates():
    assert faults.validate(copy.deepcopy(GOOD))


def test_host_faults_change_nothing_without_the_roles_files(tmp_path):
    rig = hardware_trees.load_rig("x99-r9700")
    bare = hardware_trees.materialize("x99-r9700", tmp_path / "r" / faults.EVIDENCE_ROOT)
    assert faults.host_root_of(bare) == tmp_path / "r"
    assert faults.plan("p2p-level-unset", bare, rig) == []
    assert faults.plan("rccl-unpatched", bare, rig) == []
    elsewhere = hardware_trees.materialize("x99-r9700", tmp_path / "t")
    assert faults.host_root_of(elsewhere) is None and faults.plan("p2p-level-unset", elsewhere, rig) == []


def test_collectives_tool_missing_removes_the_program_of_the_prefix_the_host_has(tmp_path):
    tree = host(tmp_path, "x99-r9700")
    root = faults.host_root_of(tree)
    rig = hardware_trees.load_rig("x99-r9700")
    assert faults.plan("collectives-tool-missing", tree, rig) == []  # no tests built: nothing to remove
    program = root / "opt/rigbook/rccl/2.27.7-abc/bin/sendrecv_perf"
    program.parent.mkdir()
    program.write_bytes(b"rccl-tests\n")
    program.chmod(0o755)
    [change] = faults.plan("collectives-tool-missing", tree, rig)  # only the RCCL prefix is there
    assert change.run.strip() == "rm -f /opt/rigbook/rccl/current/bin/sendrecv_perf"

    def runner(script):  # what the script does inside the host, done here on the fake root
        (root / "opt/rigbook/rccl/current/bin/sendrecv_perf").unlink()

    faults.apply([change], runner=runner, backup_dir=tmp_path / "backups")
    assert not program.exists()
    faults.restore(tmp_path / "backups", root)
    assert program.read_bytes() == b"rccl-tests\n" and program.stat().st_mode & 0o777 == 0o755  # runnable again


def test_p2p_level_unset_edits_the_env_file_and_restore_heals_it(tmp_path):
    tree = host(tmp_path, "x99-r9700")
    root = faults.host_root_of(tree)
    changes = faults.plan("p2p-level-unset", tree, hardware_trees.load_rig("x99-r9700"))
    assert [c.path for c in changes] == [root / "etc/rigbook/gpu.env"]
    assert (root / "etc/rigbook/gpu.env").read_text() == GPU_ENV  # planning writes nothing
    faults.apply(changes, backup_dir=tmp_path / "backups")
    assert "NCCL_P2P_LEVEL" not in (root / "etc/rigbook/gpu.env").read_text()
    assert "HSA_ENABLE_IPC_MODE_LEGACY=0" in (root / "etc/rigbook/gpu.env").read_text()
    assert faults.restore(tmp_path / "backups", root) == [root / "etc/rigbook/gpu.env"]
    assert (root / "etc/rigbook/gpu.env").read_text() == GPU_ENV and not (tmp_path / "backups").exists()


def test_rccl_unpatched_runs_its_script_in_the_host_after_saving_the_library(tmp_path):
    tree = host(tmp_path, "x99-r9700")
    root = faults.host_root_of(tree)
    changes = faults.plan("rccl-unpatched", tree, hardware_trees.load_rig("x99-r9700"))
    assert len(changes) == 1 and changes[0].run and "readlink -f /opt/rigbook/rccl/current" in changes[0].run
    with pytest.raises(UserError, match="no runner"):
        faults.apply(changes)
    ran = []

    def runner(script):  # what the script does inside the host, done here on the fake root
        ran.append(script)
        (root / "opt/rigbook/rccl/2.27.7-abc/lib/librccl.so.1.0").write_bytes(b"stock build\n")

    faults.apply(changes, runner=runner, backup_dir=tmp_path / "backups")
    assert ran == [changes[0].run]
    assert (root / "opt/rigbook/rccl/current/lib/librccl.so").read_bytes() == b"stock build\n"
    faults.restore(tmp_path / "backups", root)
    assert (root / "opt/rigbook/rccl/current/lib/librccl.so").read_bytes() == b"patched build\n"
    assert (root / "opt/rigbook/rccl/current/lib/librccl.so").is_symlink()  # written through the link


def test_engine_bundled_rccl_puts_a_copy_in_every_sglang_venv_and_restore_removes_it(tmp_path):
    tree = host(tmp_path, "x99-r9700")
    root = faults.host_root_of(tree)
    sites = [root / f"opt/rigbook/sglang/{venv}/lib/python3.11/site-packages" for venv in ("0.5.23-aaa", "0.5.23-bbb")]
    for site in sites:
        site.mkdir(parents=True)
    (root / "opt/rigbook/sglang/0.5.23-aaa.pip.log").write_text("a log, not a venv\n")
    changes = faults.plan("engine-bundled-rccl", tree, hardware_trees.load_rig("x99-r9700"))
    assert len(changes) == 1 and "torch/lib/librccl.so.1" in changes[0].run
    assert faults.backup_paths(root, changes[0].backup) == [
        site / "torch/lib" / name for name in ("librccl.so.1",) for site in sites] + [
        site / "torch/lib/librccl.so.1.rigbook-bundled" for site in sites]

    def runner(script):  # what the script does inside the host, done here on the fake root
        for site in sites:
            (site / "torch/lib").mkdir(parents=True)
            (site / "torch/lib/librccl.so.1").write_bytes(b"stock build\n")

    faults.apply(changes, runner=runner, backup_dir=tmp_path / "backups")
    (sites[0] / "torch/lib/librccl.so.1.rigbook-bundled").write_bytes(b"kept by a role run meanwhile\n")
    faults.restore(tmp_path / "backups", root)
    for site in sites:
        assert not (site / "torch/lib/librccl.so.1").exists()
        assert not (site / "torch/lib/librccl.so.1.rigbook-bundled").exists()
    # an entry without a wildcard is the one path; a wildcard that matches nothing names nothing
    assert faults.backup_paths(root, ["etc/x.conf", "opt/none/*/x"]) == [root / "etc/x.conf"]


def test_a_file_a_fault_creates_is_removed_by_restore(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    change = faults.Change(root / "etc/x.conf", "new\n", root)
    faults.apply([change], backup_dir=tmp_path / "b")
    assert (root / "etc/x.conf").read_text() == "new\n"
    faults.restore(tmp_path / "b", root)
    assert not (root / "etc/x.conf").exists()


def test_run_needs_host_scope():
    data = copy.deepcopy(GOOD)
    data["faults"]["x"]["edits"] = [{"run": "true", "needs": "etc/x"}]
    with pytest.raises(ValueError, match="run works with scope: host only"):
        faults.validate(data)
    data["faults"]["x"]["edits"] = [{"scope": "host", "run": "true"}]
    with pytest.raises(ValueError, match="run needs needs"):
        faults.validate(data)


def test_engine_faults_restart_the_serve_units_and_others_restart_nothing():
    script = faults.restart_script(["decode-half"])
    assert script.startswith("units=$(systemctl list-unit-files --no-legend 'rigbook-serve-*.service' | awk")
    assert script.endswith("systemctl reset-failed $units 2>/dev/null; systemctl restart $units; }")
    assert faults.restart_script(["serve-shm", "serve-crashloop"]) == script
    assert faults.restart_script(["bar1-256m", "nccl-shm-fallback"]) is None
