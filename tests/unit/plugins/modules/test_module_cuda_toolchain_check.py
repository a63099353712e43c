"""cuda_toolchain_check in-process: a venv's CUDA wheels (their dist-info folders), nvcc faked through the command
table (it "links" by leaving the program), the stamp of the last good check."""

from __future__ import annotations

import pytest
from ansible_collections.rigbook.homelab.plugins.modules import cuda_toolchain_check
from helpers.modules import fail, ok, run_module

WHEELS = {"nvidia-cuda-nvcc": "13.0.88", "nvidia-cuda-crt": "13.0.88", "nvidia-nvvm": "13.0.88"}


@pytest.fixture
def venv(tmp_path, monkeypatch):
    site = tmp_path / "cuda" / "lib" / "python3.12" / "site-packages"
    for name, version in WHEELS.items():
        (site / f"{name.replace('-', '_')}-{version}.dist-info").mkdir(parents=True)
    (site / "nvidia" / "cu13" / "bin").mkdir(parents=True)
    (site / "nvidia" / "cu13" / "bin" / "nvcc").write_text("#!/bin/sh\n")
    work = tmp_path / "work"
    monkeypatch.setattr(cuda_toolchain_check.tempfile, "mkdtemp", lambda prefix: (work.mkdir(), str(work))[1])
    return tmp_path


def args(venv, **kw):
    return {"venv": str(venv / "cuda"), "expected": dict(WHEELS), "stamp": str(venv / "cuda" / ".rigbook-check"),
            "arch": "sm_120", **kw}


def nvcc(venv):
    home = venv / "cuda" / "lib" / "python3.12" / "site-packages" / "nvidia" / "cu13"
    return [str(home / "bin" / "nvcc"), "-arch=sm_120", "-o", "t", "t.cu"]


def test_a_check_compiles_once_then_the_stamp_says_it_is_done(venv):
    def links(argv):
        (venv / "work" / "t").write_text("ELF")
        return ok()

    run = run_module(cuda_toolchain_check, args(venv), [(nvcc(venv), links)])
    assert not run.failed, run.msg
    assert run.result["compiled"] is True and run.result["changed"] is True
    assert run.environs[0]["CUDA_HOME"].endswith("nvidia/cu13")
    stamp = (venv / "cuda" / ".rigbook-check").read_text()
    assert stamp == "nvidia-cuda-crt=13.0.88 nvidia-cuda-nvcc=13.0.88 nvidia-nvvm=13.0.88 arch=sm_120\n"
    again = run_module(cuda_toolchain_check, args(venv))
    assert not again.failed and again.commands == [] and again.result["changed"] is False


def test_a_failing_nvcc_is_named_and_no_stamp_written(venv):
    run = run_module(cuda_toolchain_check, args(venv),
                     [(nvcc(venv), fail(2, "t.cu(3): error: identifier \"cudaMalloc\" is undefined\n"))])
    assert run.failed and "nvcc could not compile and link a test .cu" in run.msg and "is undefined" in run.msg
    assert not (venv / "cuda" / ".rigbook-check").exists()


def test_a_mixed_toolchain_fails_naming_every_version(venv):
    site = venv / "cuda" / "lib" / "python3.12" / "site-packages"
    (site / "nvidia_nvvm-13.0.88.dist-info").rename(site / "nvidia_nvvm-13.0.48.dist-info")
    run = run_module(cuda_toolchain_check, args(venv))
    assert run.failed and run.commands == []
    assert "nvidia-cuda-crt 13.0.88, nvidia-cuda-nvcc 13.0.88, nvidia-nvvm 13.0.48" in run.msg
