"""`lab up` prepares the lab's offline artifacts (src/rigbook/lab/artifacts.py); no download here."""

from __future__ import annotations

import copy
import hashlib

import pytest

from rigbook.lab import artifacts
from rigbook.lab.system import LabFailure

PINS = artifacts.lab_pins()


@pytest.fixture
def artifact_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("RIGBOOK_LAB_ARTIFACTS", str(tmp_path / "artifacts"))
    return tmp_path / "artifacts"


def test_standins_are_packed_with_the_pinned_sha256(artifact_dir, capsys):
    artifacts.pack_standins(PINS)
    tarball = artifact_dir / "nvidia-fork-standin-615.71.09.tar.gz"
    assert hashlib.sha256(tarball.read_bytes()).hexdigest() == PINS["nvidia_driver"]["source"]["sha256"]
    assert "packed the driver stand-ins" in capsys.readouterr().out
    artifacts.pack_standins(PINS)  # the second time finds them
    assert "sha256 as pinned" in capsys.readouterr().out


def test_a_stale_pin_is_named(artifact_dir):
    pins = copy.deepcopy(PINS)
    pins["nvidia_driver"]["source"]["sha256"] = "0" * 64
    with pytest.raises(LabFailure, match="pins 0000"):
        artifacts.pack_standins(pins)


def test_wheels_already_there_are_not_downloaded(artifact_dir, capsys, monkeypatch):
    wheels = artifact_dir / "wheels" / "cuda-13.0.88"
    wheels.mkdir(parents=True)
    for name in ("nvidia_cuda_nvcc", "nvidia_cuda_crt", "nvidia_nvvm", "nvidia_cuda_runtime"):
        (wheels / f"{name}-13.0.88-py3-none-manylinux2014_x86_64.whl").write_bytes(b"")

    def no_download(*args, **kwargs):
        raise AssertionError(f"pip was run: {args}")

    monkeypatch.setattr(artifacts.subprocess, "run", no_download)
    artifacts.download_wheels(PINS)
    assert "wheels present" in capsys.readouterr().out
