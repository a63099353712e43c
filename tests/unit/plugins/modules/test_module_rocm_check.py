"""rocm_check in-process: packages at the pinned version, amdgpu-dkms absent, the tools present, and the GPUs that
rocminfo and rocm-smi list - recorded under an evidence root (the lab's x99-r9700 tree) or run under /."""

from __future__ import annotations

import pytest
from ansible_collections.rigbook.homelab.plugins.modules import rocm_check
from helpers.modules import fail, ok, run_module

from rigbook.lab import hardware_trees

PACKAGES = ["rocm-core", "rocminfo"]
QUERY = ["dpkg-query", "-W", "-f=${Package}\t${db:Status-Abbrev}\t${Version}\n", "rocm-core", "rocminfo",
         "amdgpu-dkms"]
PINNED = ok("rocm-core\thi \t7.1.0.70100-38~24.04\nrocminfo\thi \t1.0.0.70100-38~24.04\n")


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    return hardware_trees.materialize("x99-r9700", tmp_path_factory.mktemp("ev") / "tree")


@pytest.fixture
def prefix(tmp_path):
    bin_dir = tmp_path / "opt" / "rocm-7.1.0" / "bin"
    bin_dir.mkdir(parents=True)
    for tool in ("rocminfo", "rocm-smi"):
        (bin_dir / tool).write_text("#!/bin/sh\n")
        (bin_dir / tool).chmod(0o755)
    return str(bin_dir.parent)


def check(root, prefix, answers, gpus=2):
    return run_module(rocm_check, {"root": str(root), "rocm_path": prefix, "packages": PACKAGES,
                                   "version_glob": "*.70100-*", "forbid": ["amdgpu-dkms"], "gpus": gpus}, answers)


def test_the_recorded_r9700_box_lists_both_gpus(tree, prefix):
    run = check(tree, prefix, [(QUERY, PINNED)])
    assert not run.failed, run.msg
    assert [(g["name"], g["marketing_name"], g["chip_id"], g["slot"]) for g in run.result["gpus"]] == [
        ("gfx1201", "AMD Radeon AI PRO R9700", "0x7551", "03:00.0"),
        ("gfx1201", "AMD Radeon AI PRO R9700", "0x7551", "06:00.0")]
    assert run.result["smi_devices"] == 2 and run.result["problems"] == []
    assert run.result["source"].endswith("var/lib/rigbook/commands")


def test_every_problem_is_named(tree, prefix, tmp_path):
    (tmp_path / "opt" / "rocm-7.1.0" / "bin" / "rocm-smi").unlink()
    answers = ok("rocm-core\thi \t7.2.0.70200-43~24.04\namdgpu-dkms\tii \t6.16.6.70100-38~24.04\n")
    run = check(tree, prefix, [(QUERY, answers)], gpus=3)
    assert run.failed
    for words in ("rocm-core 7.2.0.70200-43~24.04 is installed, the pin wants *.70100-*",
                  "rocminfo is not installed", "amdgpu-dkms 6.16.6.70100-38~24.04 is installed",
                  "rocm-smi is missing", "rocminfo lists 2 GPUs, rigbook_gpu.count is 3",
                  "rocm-smi lists 2 GPUs, rigbook_gpu.count is 3"):
        assert words in run.msg, run.msg


def test_a_missing_recording_fails_never_passes(tree, prefix, tmp_path):
    empty = tmp_path / "empty-tree"
    empty.mkdir()
    run = check(empty, prefix, [(QUERY, PINNED)])
    assert run.failed and "no recorded rocminfo output at" in run.msg and "no recorded rocm-smi output" in run.msg


def test_one_gpu_missing_from_the_recording_fails(tree, prefix, tmp_path):
    import shutil
    one = tmp_path / "one"
    shutil.copytree(tree, one, symlinks=True)
    smi = one / "var/lib/rigbook/commands/rocm-smi.txt"
    smi.write_text("".join(line for line in smi.read_text().splitlines(True) if not line.startswith("1 ")))
    run = check(one, prefix, [(QUERY, PINNED)])
    assert run.failed and "rocm-smi lists 1 GPU, rigbook_gpu.count is 2" in run.msg and "rocminfo lists" not in run.msg


def test_under_slash_the_tools_run(tree, prefix):
    info = (tree / "var/lib/rigbook/commands/rocminfo.txt").read_text()
    smi = (tree / "var/lib/rigbook/commands/rocm-smi.txt").read_text()
    run = check("/", prefix, [(QUERY, PINNED), ([f"{prefix}/bin/rocminfo"], ok(info)),
                              ([f"{prefix}/bin/rocm-smi"], ok(smi))])
    assert not run.failed and run.result["source"] == "run" and len(run.result["gpus"]) == 2


def test_a_stand_in_tool_that_fails_under_slash_fails_the_check(prefix):
    run = check("/", prefix, [(QUERY, PINNED),
                              ([f"{prefix}/bin/rocminfo"], fail(1, "rocminfo: TEST STAND-IN of ROCm 7.1.0")),
                              ([f"{prefix}/bin/rocm-smi"], ok("garbage\n"))])
    assert run.failed and "rocminfo exited 1" in run.msg and "not rocm-smi output" in run.msg
