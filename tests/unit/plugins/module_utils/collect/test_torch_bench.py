"""collect/torch_bench.py, on its real output: tests/fixtures/device/torch-bench-built-with.json is the bundled
benchmark run on a cloud VM with one NVIDIA H100 (2026-12-05, PyTorch 2.11.0+cu130; tests/fixtures/diagnose/SOURCES.md).

torch.cuda.nccl.version() is the NCCL torch was built with, not the library in use (a preloaded or relinked copy
is what runs: shared/research/engine-library-facts.md): the benchmark records it as torch_built_with_nccl, and the
version the ladder reports is NCCL's own INFO line in the run's log.
"""

from __future__ import annotations

import json
import shutil

from ansible_collections.rigbook.homelab.plugins.module_utils.collect import collective_bench, torch_bench
from ansible_collections.rigbook.homelab.plugins.module_utils.facts import runner


def recorded(fixtures):
    return json.loads((fixtures / "device" / "torch-bench-built-with.json").read_text())


def test_the_build_version_is_never_recorded_as_the_nccl_in_use(fixtures):
    data = recorded(fixtures)
    assert data["torch_built_with_nccl"] == "2.28.9"
    assert "nccl_version" not in data  # the name the ladder reads as the library in use
    assert collective_bench.log_summary(data["nccl_log"])["nccl_version"] == "2.28.9"  # "NCCL version 2.28.9+cuda13.0"


def test_a_recorded_run_is_read_by_the_collector_with_its_own_log(fixtures, tmp_path):
    commands = tmp_path.joinpath(*runner.COMMANDS_DIR)
    commands.mkdir(parents=True)
    shutil.copy(fixtures / "device" / "torch-bench-built-with.json", commands / "collectives.json")
    data = collective_bench.collect_collectives(str(tmp_path))
    assert data["world_size"] == 1 and data["results"][0]["op"] == "all_reduce" and data["results"][0]["wrong"] == 0
    assert data["log"]["nccl_version"] == "2.28.9" and data["torch_built_with_nccl"] == "2.28.9"


def test_bus_bandwidth_factors_are_nccl_tests():
    assert torch_bench.busbw_factor("all_reduce", 2) == 1.0
    assert torch_bench.busbw_factor("all_reduce", 4) == 1.5
    assert torch_bench.busbw_factor("sendrecv", 2) == 1.0
