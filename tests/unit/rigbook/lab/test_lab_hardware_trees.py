"""The materializer: rigs written as the recorded trees of docs/evidence.md."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from ansible_collections.rigbook.homelab.plugins.module_utils.collect import pci, static_evidence
from ansible_collections.rigbook.homelab.plugins.module_utils.parse import nccl as parse_nccl
from ansible_collections.rigbook.homelab.plugins.module_utils.parse import nvidia_smi as parse_nvidia_smi

from rigbook.errors import UserError
from rigbook.lab import hardware_trees


@pytest.fixture(params=hardware_trees.rig_names())
def tree(request, tmp_path) -> Path:
    return hardware_trees.materialize(request.param, tmp_path / request.param)


def resources(tree: Path, bdf: str) -> list:
    text = (tree / "sys/bus/pci/devices" / bdf / "resource").read_text()
    return [tuple(int(x, 16) for x in line.split()) for line in text.splitlines()]


def test_both_seed_rigs_ship():
    assert {"x99-3080", "x99-r9700"} <= set(hardware_trees.rig_names())


def test_layout_nested_dirs_and_relative_symlinks(tree):
    devices = tree / "sys/bus/pci/devices"
    for link in devices.iterdir():
        assert link.is_symlink()
        target = os.readlink(link)
        assert target.startswith("../../../devices/pci0000:00/"), target
        real = link.resolve()
        assert real.is_dir() and not real.is_symlink()
        assert tree.resolve() in real.parents  # never escapes the tree
    gpus = [g["bdf"] for g in hardware_trees.gpus(hardware_trees.load_rig(tree.name))]
    gpu = (devices / gpus[0]).resolve()
    assert "0000:00:02.0" in gpu.relative_to(tree.resolve()).parts  # nested under its root port, as in sysfs
    assert "0000:00:03.0" in (devices / gpus[1]).resolve().relative_to(tree.resolve()).parts
    driver = gpu / "driver"
    assert driver.is_symlink() and driver.resolve().parent.name == "drivers"
    assert (driver.resolve() / "0000:03:00.0").resolve() == gpu


def test_files_of_every_function(tree):
    for link in (tree / "sys/bus/pci/devices").iterdir():
        for name in ("vendor", "device", "class"):
            value = (link / name).read_text()
            assert value.startswith("0x") and value.endswith("\n")
    lines = (tree / "sys/bus/pci/devices/0000:03:00.0/resource").read_text().splitlines()
    assert len(lines) == 13 and all(len(line.split()) == 3 for line in lines)
    assert (tree / "sys/bus/pci/devices/0000:03:00.0/max_link_speed").read_text() == "8.0 GT/s PCIe\n"
    assert (tree / "sys/bus/pci/devices/0000:03:00.0/max_link_width").read_text() == "16\n"
    assert (tree / "sys/firmware/efi").is_dir()
    assert (tree / "RECONSTRUCTED").read_text().startswith("rig x99-")


def test_the_ladders_gpu_listing_reads_it(tree):
    gpus, error = pci.list_gpus(str(tree))
    assert error is None
    assert [g["slot"] for g in gpus] == [g["bdf"] for g in hardware_trees.gpus(hardware_trees.load_rig(tree.name))]
    assert [pci.root_port(str(tree), g["slot"]) for g in gpus] == ["0000:00:02.0", "0000:00:03.0"]


def test_the_r9700_cards_sit_behind_their_own_switch(tmp_path):
    """RECONSTRUCTED on-card switch: root port -> switch upstream port -> downstream port -> GPU, as sysfs nests it;
    bridges are bound to pcieport, only root ports carry the root port AER totals."""
    tree = hardware_trees.materialize("x99-r9700", tmp_path / "t")
    chain = static_evidence.upstream_chain(str(tree), "0000:06:00.0")
    assert [(b["slot"], b["ids"]) for b in chain] == [
        ("0000:05:00.0", "1002:1479"), ("0000:04:00.0", "1002:1478"), ("0000:00:03.0", "8086:6f08")]
    assert chain[1]["link"] == {"current_speed_gts": 8.0, "max_speed_gts": 32.0, "current_width": 16, "max_width": 16}
    assert pci.upstream_port(str(tree), "0000:06:00.0") == "0000:05:00.0"
    up = tree / "sys/bus/pci/devices/0000:04:00.0"
    assert (up / "driver").resolve().name == "pcieport" and (up / "aer_dev_fatal").is_file()
    assert not (up / "aer_rootport_total_err_fatal").exists()
    assert (tree / "sys/bus/pci/devices/0000:00:03.0/aer_rootport_total_err_fatal").is_file()
    assert [g["bdf"] for g in hardware_trees.gpus(hardware_trees.load_rig("x99-r9700"))] == [
        "0000:03:00.0", "0000:06:00.0"]
    assert "location_id 1536" in (tree / "sys/class/kfd/kfd/topology/nodes/2/properties").read_text()  # 0x600


def test_x99_3080_facts(tmp_path):
    tree = hardware_trees.materialize("x99-3080", tmp_path / "t")
    for bdf in ("0000:03:00.0", "0000:04:00.0"):
        assert (tree / f"sys/bus/pci/devices/{bdf}/vendor").read_text() == "0x10de\n"
        start, end, _ = resources(tree, bdf)[1]  # NVIDIA VRAM window = BAR1
        assert end - start + 1 == 256 << 20 and end < 1 << 32  # 256 MiB below 4 GiB: no Above-4G
    assert "intel_iommu=on iommu=pt" in (tree / "proc/cmdline").read_text()
    assert (tree / "proc/sys/kernel/osrelease").read_text() == "7.0.0-31-generic\n"
    assert (tree / "lib/modules/7.0.0-31-generic/updates/dkms/nvidia.ko").is_file()
    assert "615.71.09" in (tree / "proc/driver/nvidia/version").read_text()
    assert "Open Kernel Module" in (tree / "proc/driver/nvidia/version").read_text()
    assert (tree / "sys/module/nvidia/version").read_text() == "615.71.09\n"
    assert (tree / "sys/module/nvidia_uvm/parameters/uvm_disable_hmm").read_text() == "Y\n"
    smi = parse_nvidia_smi.parse_q((tree / "var/lib/rigbook/commands/nvidia-smi-q.txt").read_text())
    assert smi["driver_version"] == "615.71.09"
    assert [g["bar1_total_mib"] for g in smi["gpus"]] == [256, 256]
    assert [g["fb_total_mib"] for g in smi["gpus"]] == [20480, 20480]
    assert [g["bus_id"] for g in smi["gpus"]] == ["0000:03:00.0", "0000:04:00.0"]
    log = parse_nccl.parse((tree / "var/lib/rigbook/commands/nccl-log.txt").read_text())
    assert log["path"] == "shm" and log["all_direct_p2p"] is False
    probe = json.loads((tree / "var/lib/rigbook/commands/cuda-probe.json").read_text())
    assert [(p["enable_peer"], p["peer_gbs"], p["host_staged_gbs"]) for p in probe["pairs"]] == [
        ("CUDA_ERROR_MAP_FAILED", 6.0, 6.0)] * 2
    assert not (tree / "var/lib/rigbook/commands/collectives.json").exists()  # none published


def test_x99_r9700_facts(tmp_path):
    tree = hardware_trees.materialize("x99-r9700", tmp_path / "t")
    assert (tree / "sys/bus/pci/devices/0000:00:00.0/device").read_text() == "0x6f00\n"
    for bdf in ("0000:03:00.0", "0000:06:00.0"):
        assert (tree / f"sys/bus/pci/devices/{bdf}/device").read_text() == "0x7551\n"
        start, end, flags = resources(tree, bdf)[0]  # AMD VRAM window = BAR0
        assert end - start + 1 == 32 << 30
        assert start >= 1 << 32 and end < 1 << 44  # above 4 GiB, inside the 44-bit DMA reach
        assert flags & 0x2000  # prefetchable
    assert "iommu=pt" in (tree / "proc/cmdline").read_text().split()
    config = (tree / "boot/config-6.8.12-r9700-p2p-dma44").read_text().splitlines()
    assert "CONFIG_PCI_P2PDMA=y" in config and "CONFIG_HSA_AMD_P2P=y" in config
    assert (tree / "sys/module/amdgpu").is_dir()
    assert (tree / "opt/rocm/.info/version").read_text().strip()
    log = parse_nccl.parse((tree / "var/lib/rigbook/commands/nccl-log.txt").read_text())
    assert log["nccl_version"] == "2.27.7"
    assert log["path"] == "p2p" and log["all_direct_p2p"] is True and log["transports"] == ["P2P/IPC"]
    probe = json.loads((tree / "var/lib/rigbook/commands/hip-probe.json").read_text())
    assert [p["peer_gbs"] for p in probe["pairs"]] == [10.29, 10.29] and probe["bidir"][0]["gbs"] == 19.7
    assert all(p["ipc"]["ok"] and p["enable_peer"] == "ok" for p in probe["pairs"])
    figures = json.loads((tree / "var/lib/rigbook/commands/collectives.json").read_text())
    rows = {r["op"]: r for r in figures["results"]}
    assert rows["sendrecv"]["busbw_gbs"] == 9.75 and rows["all_reduce"]["busbw_gbs"] == 9.51


def test_rigs_say_they_are_reconstructions():
    for name in hardware_trees.rig_names():
        text = (hardware_trees.RIGS_DIR / f"{name}.yml").read_text()
        assert "RECONSTRUCTED" in text and "guess" in text


def test_refuses_to_write_over_a_tree(tmp_path):
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "keep").write_text("x")
    with pytest.raises(UserError, match="not empty"):
        hardware_trees.materialize("x99-3080", tmp_path / "t")


def test_unknown_rig(tmp_path):
    with pytest.raises(UserError, match=r"unknown lab rig 'x99-9090' \(known: x99-3080, x99-r9700\)"):
        hardware_trees.materialize("x99-9090", tmp_path / "t")
    assert not (tmp_path / "t").exists()


def test_parse_size():
    assert hardware_trees.parse_size("256M") == 256 << 20
    assert hardware_trees.parse_size("32G") == 32 << 30
    assert hardware_trees.parse_size("512K") == 512 << 10
    assert hardware_trees.parse_size(128) == 128
    with pytest.raises(ValueError):
        hardware_trees.parse_size("lots")
