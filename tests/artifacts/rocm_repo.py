"""Build the lab's signed ROCm apt repository of TEST STAND-IN packages (no ROCm inside).

TEST STAND-INS: small .debs named and versioned like ROCm's (rocm-core, rocminfo, rocm-smi-lib,
hip-runtime-amd, the RCCL build's hipcc, hip-dev, hsa-rocr-dev, rocm-cmake, rocm-llvm, rocm-device-libs) at ROCm
7.1.0 (the lab pin) and at 7.2.0 (a newer release, so the amd_rocm role's apt preferences pin is tested), laid out
like AMD's repository (dists/noble/main, pool/), and beside it, in amdgpu/, the stand-in of AMD's graphics
repository, where AMD publishes amdgpu-dkms (amdgpu-install's amdgpu.list points there); both signed
with the TEST KEY in rocm-standin/ (lab-rocm-TEST-ONLY.secret.asc: generated once for these tests, committed
so the public key's sha256 can be pinned in inventory/lab; it signs nothing but this stand-in repository;
never trust it anywhere else). The tools inside the packages are stand-ins that say so and exit 1: the lab
judges the GPU list from the host's recorded rocminfo / rocm-smi output (the evidence tree), never from them.

Real tools: dpkg-deb builds the packages (SOURCE_DATE_EPOCH=0, so they are byte for byte reproducible),
apt-ftparchive writes Packages and Release, gpg signs InRelease and Release.gpg. The lab hosts read the
repository as file:///var/cache/rigbook/artifacts/rocm-repo through the read-only artifact mount.

    .venv/bin/python tests/artifacts/rocm_repo.py [DEST]     # -> DEST/rocm-repo (default /var/cache/rigbook/artifacts)
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
STANDIN = HERE / "rocm-standin"
KEY = STANDIN / "lab-rocm.gpg.key"
SECRET = STANDIN / "lab-rocm-TEST-ONLY.secret.asc"
DEFAULT_DIR = Path("/var/cache/rigbook/artifacts")
REPO = "rocm-repo"
GRAPHICS = "amdgpu"  # AMD's graphics repository's stand-in, inside REPO: REPO/amdgpu
SUITE, COMPONENT, ARCH = "noble", "main", "amd64"
BUILDER_VERSION = "3"  # bump when the packages below change (the cached repository is rebuilt)

# (ROCm release, AMD's numeric tag, build suffix): every package of a release ends in .<tag>-<build>
RELEASES = (("7.1.0", "70100", "38~24.04"), ("7.2.0", "70200", "43~24.04"))
# package -> (upstream version prefix by ROCm release, files, depends on rocm-core)
TOOL = """#!/bin/sh
# TEST STAND-IN for ROCm's {name} {release} (rigbook lab): there is no GPU runtime here.
echo "{name}: TEST STAND-IN of ROCm {release} (rigbook lab), no GPU runtime; the lab reads the recorded output" >&2
exit 1
"""


def packages(release: str, tag: str, build: str) -> list:
    """[(name, version, {path: (text, mode)}, depends)] of one ROCm release."""
    prefix = f"opt/rocm-{release}"
    core = f"{release}.{tag}-{build}"
    readme = f"TEST STAND-IN of ROCm {release} for the rigbook lab (tests/artifacts/rocm_repo.py); not ROCm.\n"
    return [
        ("rocm-core", core, {f"{prefix}/.info/version": (f"{release}-{build.split('~')[0]}\n", 0o644),
                             f"{prefix}/share/doc/rocm-core/TEST-STAND-IN": (readme, 0o644)}, ""),
        ("rocminfo", f"1.0.0.{tag}-{build}",
         {f"{prefix}/bin/rocminfo": (TOOL.format(name="rocminfo", release=release), 0o755)}, f"rocm-core (= {core})"),
        ("rocm-smi-lib", f"7.8.0.{tag}-{build}",
         {f"{prefix}/bin/rocm-smi": (TOOL.format(name="rocm-smi", release=release), 0o755)}, f"rocm-core (= {core})"),
        ("hip-runtime-amd", f"{release[:3]}.25424.{tag}-{build}",
         {f"{prefix}/share/doc/hip-runtime-amd/TEST-STAND-IN": (readme, 0o644)}, f"rocm-core (= {core})"),
    ] + [
        # What the RCCL build needs (rigbook_pins.rocm.build_packages' default): documentation only, no compiler (the
        # lab builds its RCCL stand-in with g++).
        (name, f"{upstream}.{tag}-{build}",
         {f"{prefix}/share/doc/{name}/TEST-STAND-IN": (readme, 0o644)}, f"rocm-core (= {core})")
        for name, upstream in (("hipcc", "1.1.1"), ("hip-dev", f"{release[:3]}.25424"), ("hsa-rocr-dev", "1.18.0"),
                               ("rocm-cmake", "0.14.0"), ("rocm-llvm", "20.0.0.25425"), ("rocm-device-libs", "1.0.0"))
    ]


def graphics_packages(release: str, tag: str, build: str) -> list:
    """[(name, version, files, depends)] of AMD's graphics repository for one release: amdgpu-dkms (never installed
    by the lab pins, rigbook_pins.rocm.dkms false: present so its source and pin are tested)."""
    return [("amdgpu-dkms", f"6.16.6.{tag}-{build}",
             {"usr/share/doc/amdgpu-dkms/TEST-STAND-IN": ("TEST STAND-IN of amdgpu-dkms; builds nothing.\n", 0o644)},
             "")]


def _deb(work: Path, out: Path, name: str, version: str, files: dict, depends: str) -> Path:
    root = work / f"{name}_{version}"
    (root / "DEBIAN").mkdir(parents=True)
    control = [f"Package: {name}", f"Version: {version}", f"Architecture: {ARCH}",
               "Maintainer: rigbook tests <lab-rocm@rigbook.invalid>", "Section: devel", "Priority: optional"]
    if depends:
        control.append(f"Depends: {depends}")
    control.append(f"Description: TEST STAND-IN for ROCm's {name} (rigbook lab)\n"
                   " Named and versioned like the ROCm package; holds no ROCm code.")
    (root / "DEBIAN" / "control").write_text("\n".join(control) + "\n")
    for rel, (text, mode) in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        path.chmod(mode)
    for path in [root, *root.rglob("*")]:
        if path.is_dir():
            path.chmod(0o755)
        os.utime(path, (0, 0), follow_symlinks=False)
    deb = out / f"{name}_{version.replace(':', '%3a')}_{ARCH}.deb"
    env = dict(os.environ, SOURCE_DATE_EPOCH="0")
    subprocess.run(["dpkg-deb", "--root-owner-group", "-Zxz", "--build", str(root), str(deb)], check=True,
                   capture_output=True, env=env)
    return deb


def stamp() -> str:
    """What the built repository depends on (this file and the key): a changed builder rebuilds it."""
    digest = hashlib.sha256(Path(__file__).read_bytes() + KEY.read_bytes() + BUILDER_VERSION.encode())
    return digest.hexdigest()


def _signed_repo(top: Path, package_list, label: str) -> None:
    """A signed apt repository in TOP (pool/, dists/SUITE) of PACKAGE_LIST(release, tag, build) for each release."""
    pool = top / "pool" / COMPONENT
    pool.mkdir(parents=True)
    with tempfile.TemporaryDirectory() as work:
        for release, tag, build_id in RELEASES:
            for name, version, files, depends in package_list(release, tag, build_id):
                _deb(Path(work), pool, name, version, files, depends)
    dist = top / "dists" / SUITE
    binary = dist / COMPONENT / f"binary-{ARCH}"
    binary.mkdir(parents=True)
    packages_text = subprocess.run(["apt-ftparchive", "packages", "pool"], cwd=top, check=True,
                                   capture_output=True, text=True).stdout
    (binary / "Packages").write_text(packages_text)
    release_text = subprocess.run(
        ["apt-ftparchive", "-o", f"APT::FTPArchive::Release::Suite={SUITE}",
         "-o", f"APT::FTPArchive::Release::Codename={SUITE}",
         "-o", "APT::FTPArchive::Release::Origin=rigbook-lab-rocm-standin",
         "-o", f"APT::FTPArchive::Release::Label={label}",
         "-o", f"APT::FTPArchive::Release::Architectures={ARCH}",
         "-o", f"APT::FTPArchive::Release::Components={COMPONENT}", "release", "."],
        cwd=dist, check=True, capture_output=True, text=True).stdout
    (dist / "Release").write_text(release_text)
    with tempfile.TemporaryDirectory() as home:
        gpg = ["gpg", "--homedir", home, "--batch", "--quiet", "--pinentry-mode", "loopback", "--passphrase", ""]
        subprocess.run(gpg + ["--import", str(SECRET)], check=True, capture_output=True)
        subprocess.run(gpg + ["--clearsign", "-o", str(dist / "InRelease"), str(dist / "Release")], check=True,
                       capture_output=True)
        subprocess.run(gpg + ["--armor", "--detach-sign", "-o", str(dist / "Release.gpg"), str(dist / "Release")],
                       check=True, capture_output=True)


def build(dest: Path = DEFAULT_DIR) -> Path:
    """DEST/rocm-repo, built when missing or stale (atomic: built aside, then renamed into place)."""
    dest.mkdir(parents=True, exist_ok=True)
    target = dest / REPO
    if (target / ".stamp").is_file() and (target / ".stamp").read_text() == stamp():
        return target
    tmp = Path(tempfile.mkdtemp(prefix=".rocm-repo-", dir=dest))
    try:
        _signed_repo(tmp, packages, "ROCm TEST STAND-IN")
        _signed_repo(tmp / GRAPHICS, graphics_packages, "amdgpu TEST STAND-IN")
        shutil.copyfile(KEY, tmp / "rocm.gpg.key")
        (tmp / "TEST-STAND-IN").write_text(__doc__)
        for path in [tmp, *tmp.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
        (tmp / ".stamp").write_text(stamp())
        if target.exists():
            shutil.rmtree(target)
        tmp.rename(target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return target


if __name__ == "__main__":
    print(build(Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_DIR))
