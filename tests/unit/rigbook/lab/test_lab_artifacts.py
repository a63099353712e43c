"""`lab up` prepares the lab's offline artifacts (src/rigbook/lab/artifacts.py); no download here."""

from __future__ import annotations

import copy
import hashlib

import pytest
from ansible_collections.rigbook.homelab.plugins.module_utils.facts import runner

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
    # the pin's other versions (the NCCL and CCCL wheels the nccl-tests build needs), each at its own version
    (wheels / "nvidia_cuda_cccl-13.0.85-py3-none-manylinux2014_x86_64.whl").write_bytes(b"")
    stale = wheels / "nvidia_nccl_cu13-2.32.6-py3-none-manylinux_2_27_x86_64.whl"
    stale.write_bytes(b"")
    ran = []
    monkeypatch.setattr(runner, "run", lambda argv, **kw: ran.append(argv) or runner.Result(argv, 0, "", "", None,
                                                                                              False))
    artifacts.download_wheels(PINS)
    assert [argv[-1] for argv in ran] == ["nvidia-nccl-cu13==2.27.7"]  # another version there is not the pinned one
    (wheels / "nvidia_nccl_cu13-2.27.7-py3-none-manylinux2014_x86_64.whl").write_bytes(b"")

    def no_download(*args, **kwargs):
        raise AssertionError(f"pip was run: {args}")

    monkeypatch.setattr(runner, "run", no_download)
    artifacts.download_wheels(PINS)
    assert "wheels present" in capsys.readouterr().out


def test_each_address_block_has_its_own_apt_cache_seeded_from_block_0(tmp_path, monkeypatch):
    """apt locks its archive folder for a whole run: two labs side by side get a folder each. Another block's starts
    with block 0's .debs as hard links (downloaded once per machine); a .deb it has already is left as it is."""
    from rigbook.lab import machine

    monkeypatch.setenv("RIGBOOK_LAB_APT_CACHE", str(tmp_path / "apt"))
    base = machine.apt_cache_dir(0)
    assert base == tmp_path / "apt" and machine.apt_cache_dir(2) == tmp_path / "apt-block2"
    assert dict((t, s) for s, t, _ in machine.shared_dirs(2))["/var/cache/apt/archives"] == tmp_path / "apt-block2"
    base.mkdir()
    (base / "linux-image_1_amd64.deb").write_bytes(b"image")
    (base / "lock").write_text("")
    (tmp_path / "apt-block2").mkdir()
    (tmp_path / "apt-block2" / "dkms_2_all.deb").write_bytes(b"its own")
    machine.seed_apt_cache(2)
    machine.seed_apt_cache(0)  # block 0 is the source: nothing to do
    seeded = tmp_path / "apt-block2"
    assert sorted(p.name for p in seeded.iterdir()) == ["dkms_2_all.deb", "linux-image_1_amd64.deb", "partial"]
    assert (seeded / "linux-image_1_amd64.deb").stat().st_ino == (base / "linux-image_1_amd64.deb").stat().st_ino
    assert (seeded / "dkms_2_all.deb").read_bytes() == b"its own"
    assert sorted(p.name for p in base.iterdir()) == ["linux-image_1_amd64.deb", "lock"]
