"""The lab's offline artifacts: what inventory/lab pins for site.yml, made ready on this machine by `lab up`.

The lab mounts this machine's artifact directory read-only on every host at /var/cache/rigbook/artifacts, so
site.yml finds there, offline:
- the driver stand-ins (TEST ARTIFACTS from tests/artifacts/, not a driver), packed byte for byte so their
  sha256 equal the lab pins;
- the pinned CUDA wheels, downloaded once with pip into the pinned wheel directory (a cached step: later
  runs find them and download nothing);
- for the AMD host (inventory/lab/group_vars/x99_r9700.yml): the real Debian kernel .deb set that stands in for
  the custom P2P kernel, fetched once through this machine's apt sources (`apt-get download`, or copied from the
  lab's shared apt cache) and checked against the pinned sha256; and the local signed ROCm apt repository of
  TEST STAND-IN packages (tests/artifacts/rocm_repo.py), rebuilt only when its builder changed.
"""

from __future__ import annotations

import fcntl
import re
import shutil
import sys
import tempfile
from pathlib import Path

import yaml

from rigbook import paths
from rigbook.lab.machine import APT_CACHE_DIR, ARTIFACTS_DIR, shared_dirs
from rigbook.lab.system import LabFailure, progress

PINNED_GROUP = "inventory/lab/group_vars/x99_3080.yml"
AMD_GROUP = "inventory/lab/group_vars/x99_r9700.yml"
EXTRA_WHEELS = ["nvidia-cuda-runtime"]  # the runtime the compile-and-link check links against


def lab_pins() -> dict:
    return yaml.safe_load((paths.collection_root() / PINNED_GROUP).read_text())["rigbook_pins"]


def _packer():
    """tests/artifacts/pack.py of the collection root: the checkout, or the copy a wheel carries (setup.py ships
    tests/artifacts/ for this; the stand-ins live with the tests that use them)."""
    return paths.load_collection_file("tests/artifacts/pack.py", "rigbook_lab_pack")


def source_dir() -> Path:
    """The artifact directory on this machine (RIGBOOK_LAB_ARTIFACTS moves it)."""
    return next(src for src, target, _ in shared_dirs() if target == str(ARTIFACTS_DIR))


def _on_this_machine(host_path: str) -> Path:
    """A pinned path inside the hosts' artifact mount, as a path of this machine."""
    return source_dir() / Path(host_path).relative_to(ARTIFACTS_DIR)


def _sha256(path: Path) -> str:
    """The sha256 of the file PATH (facts/files.sha256_of: OSError when it cannot be read)."""
    return paths.facts("files").sha256_of(str(path))


def _tail(result) -> str:
    """The last line a failed command (a runner.Result) printed, or why it did not run."""
    lines = (result.stderr.strip() or result.stdout.strip()).splitlines()[-1:]
    return lines[0] if lines else (result.error or "no output")


def pack_standins(pins: dict) -> None:
    """Pack the stand-ins and check them against the pins (a stale pin is a bug here, said plainly)."""
    driver = pins["nvidia_driver"]
    wanted = {driver["source"]["path"]: driver["source"]["sha256"],
              driver["userspace_installer"]["path"]: driver["userspace_installer"]["sha256"]}
    tests = (pins.get("nccl_tests") or {}).get("source") or {}
    if "path" in tests:
        wanted[tests["path"]] = tests["sha256"]
    if all(_on_this_machine(p).is_file() and _sha256(_on_this_machine(p)) == s for p, s in wanted.items()):
        progress("artifacts: driver stand-ins present, sha256 as pinned")
        return
    _packer().pack(source_dir())
    for host_path, digest in wanted.items():
        got = _sha256(_on_this_machine(host_path))
        if got != digest:
            raise LabFailure(f"artifacts: {host_path} packed with sha256 {got}, but {PINNED_GROUP} pins {digest}")
    progress(f"artifacts: packed the driver stand-ins into {source_dir()}")


def download_wheels(pins: dict) -> None:
    toolchain = pins["cuda_toolchain"]
    wanted = {name: toolchain["version"] for name in list(toolchain["packages"]) + EXTRA_WHEELS}
    wanted.update(toolchain.get("versions") or {})  # e.g. the NCCL and CCCL wheels the nccl-tests build needs
    wheel_dir = _on_this_machine(toolchain["wheel_dir"])
    have = {tuple(p.name.split("-")[:2]) for p in wheel_dir.glob("*.whl")}
    missing = [n for n in wanted if (n.replace("-", "_"), wanted[n]) not in have]
    if not missing:
        progress(f"artifacts: CUDA {toolchain['version']} wheels present in {wheel_dir}")
        return
    wheel_dir.mkdir(parents=True, exist_ok=True)
    specs = [f"{name}=={wanted[name]}" for name in missing]
    progress(f"artifacts: downloading {', '.join(specs)} into {wheel_dir} (once per machine) ...")
    result = paths.facts("runner").run([sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "-q",
                                        "--only-binary=:all:", "-d", str(wheel_dir), *specs], timeout=1800)
    if result.rc != 0:
        raise LabFailure(f"artifacts: pip download failed: {_tail(result)}")
    progress(f"artifacts: {len(specs)} wheels downloaded")


def amd_pins() -> dict:
    return yaml.safe_load((paths.collection_root() / AMD_GROUP).read_text())["rigbook_pins"]


def _apt_cache() -> Path:
    return next(src for src, target, _ in shared_dirs() if target == "/var/cache/apt/archives") or APT_CACHE_DIR


def fetch_kernel_debs(pins: dict) -> None:
    """The pinned kernel .deb set (real Debian packages standing in for the custom kernel), once per machine."""
    debs = (pins.get("kernel") or {}).get("debs") or []
    missing = [d for d in debs if not (_on_this_machine(d["path"]).is_file()
                                       and _sha256(_on_this_machine(d["path"])) == d["sha256"])]
    if not missing:
        if debs:
            progress("artifacts: kernel .debs present, sha256 as pinned")
        return
    for deb in missing:
        target = _on_this_machine(deb["path"])
        target.parent.mkdir(parents=True, exist_ok=True)
        cached = _apt_cache() / target.name
        if cached.is_file() and _sha256(cached) == deb["sha256"]:
            shutil.copyfile(cached, target)
            continue
        name, version = target.name.split("_")[:2]
        spec = f"{name}={version.replace('%3a', ':')}"
        progress(f"artifacts: downloading {spec} through this machine's apt sources (once per machine) ...")
        with tempfile.TemporaryDirectory(dir=target.parent) as work:
            Path(work).chmod(0o755)
            result = paths.facts("runner").run(["apt-get", "download", "-q", spec], cwd=work, timeout=1800)
            got = list(Path(work).glob("*.deb"))
            if result.rc != 0 or len(got) != 1:
                raise LabFailure(f"artifacts: apt-get download {spec} failed: {_tail(result)} (is it still in the "
                                 f"apt sources? {AMD_GROUP} pins it)")
            shutil.move(str(got[0]), target)
    for deb in debs:
        got = _sha256(_on_this_machine(deb["path"]))
        if got != deb["sha256"]:
            raise LabFailure(f"artifacts: {deb['path']} has sha256 {got}, but {AMD_GROUP} pins {deb['sha256']}")
    progress(f"artifacts: {len(missing)} kernel .debs fetched, sha256 as pinned")


def build_rocm_repo(pins: dict) -> None:
    """The local signed ROCm apt repository of TEST STAND-INS, served file:// through the artifact mount."""
    repo = (pins.get("rocm") or {}).get("repo")
    if not repo:
        return
    builder = paths.load_collection_file("tests/artifacts/rocm_repo.py", "rigbook_lab_rocm_repo")
    built = builder.build(source_dir())
    key = source_dir() / Path(repo["key_url"][len("file://"):]).relative_to(ARTIFACTS_DIR)
    got = _sha256(key) if key.is_file() else None
    if got != repo["key_sha256"]:
        raise LabFailure(f"artifacts: the stand-in ROCm repository's key {key} has sha256 {got}, "
                         f"but {AMD_GROUP} pins {repo['key_sha256']}")
    progress(f"artifacts: ROCm stand-in apt repository ready in {built}")


def pack_rccl_standins(pins: dict) -> None:
    """The RCCL and rccl-tests TEST STAND-INS (tests/artifacts/rccl_standin.py), checked against the pins."""
    rccl = pins.get("rccl") or {}
    wanted = {s["path"]: s["sha256"] for s in (rccl.get("source"), (rccl.get("tests") or {}).get("source"))
              if s and "path" in s}
    if not wanted:
        return
    if all(_on_this_machine(p).is_file() and _sha256(_on_this_machine(p)) == s for p, s in wanted.items()):
        progress("artifacts: RCCL stand-ins present, sha256 as pinned")
        return
    paths.load_collection_file("tests/artifacts/rccl_standin.py", "rigbook_lab_rccl_standin").pack(source_dir())
    for host_path, digest in wanted.items():
        got = _sha256(_on_this_machine(host_path))
        if got != digest:
            raise LabFailure(f"artifacts: {host_path} packed with sha256 {got}, but {AMD_GROUP} pins {digest}")
    progress(f"artifacts: packed the RCCL stand-ins into {source_dir()}")


HASHES = r"--hash=sha256:[0-9a-f]{64}(?:\s+--hash=sha256:[0-9a-f]{64})*"
LOCK_LINE = re.compile(r"^([A-Za-z0-9._-]+)==([^\s;]+)\s+(" + HASHES + ")", re.M)


def sglang_artifacts(pins: dict) -> None:
    """Every wheel the lab's SGLang locks pin, in the SGLang wheel directory (each downloaded once, without
    dependencies, and checked against its lock's sha256), and the engine TEST STAND-IN
    (tests/artifacts/sglang_standin.py) beside the other artifacts."""
    sglang = pins.get("sglang") or {}
    if not sglang:
        return
    wheel_dir = _on_this_machine(sglang["wheel_dir"])
    for lock_name in sorted({sglang["lock"]} | {(amd_pins().get("sglang") or {}).get("lock") or sglang["lock"]}):
        lock = (paths.collection_root() / "inventory/lab" / lock_name).read_text()
        for name, version, hashes in LOCK_LINE.findall(lock):
            _locked_wheel(wheel_dir, name, version, set(re.findall(r"[0-9a-f]{64}", hashes)), lock_name)
    standin = paths.collection_root() / "tests/artifacts/sglang_standin.py"
    target = source_dir() / "sglang-standin.py"
    if not target.is_file() or target.read_bytes() != standin.read_bytes():
        shutil.copyfile(standin, target)
    progress(f"artifacts: the locked wheels (sha256 as locked) and the engine stand-in present in {wheel_dir}")


def _locked_wheel(wheel_dir: Path, name: str, version: str, hashes: set, lock_name: str) -> None:
    """NAME==VERSION's wheel in WHEEL_DIR, downloaded once without dependencies; its sha256 must be one of HASHES."""
    stem = f"{name.replace('-', '_')}-{version}-"
    wheels = sorted(w for w in wheel_dir.glob("*.whl") if w.name.lower().startswith(stem.lower()))
    if not wheels:
        wheel_dir.mkdir(parents=True, exist_ok=True)
        progress(f"artifacts: downloading {name}=={version} (no dependencies) into {wheel_dir} (once) ...")
        result = paths.facts("runner").run([sys.executable, "-m", "pip", "download", "--disable-pip-version-check",
                                            "-q", "--no-deps", "--only-binary=:all:", "-d", str(wheel_dir),
                                            f"{name}=={version}"], timeout=1800)
        if result.rc != 0:
            raise LabFailure(f"artifacts: pip download {name} failed: {_tail(result)}")
        wheels = sorted(w for w in wheel_dir.glob("*.whl") if w.name.lower().startswith(stem.lower()))
    for wheel in wheels:
        if _sha256(wheel) not in hashes:
            raise LabFailure(f"artifacts: {wheel} has sha256 {_sha256(wheel)}, not one the lab's lock "
                             f"inventory/lab/{lock_name} pins")


def prepare() -> None:
    """Everything site.yml needs offline on the lab hosts; idempotent. Under an exclusive lock beside the artifact
    directory: two labs started at once (two state directories, two address blocks) prepare it one after the other,
    the second finding everything present."""
    folder = source_dir()
    folder.parent.mkdir(parents=True, exist_ok=True)
    with open(folder.parent / f".{folder.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        _prepare()


def _prepare() -> None:
    pins = lab_pins()
    pack_standins(pins)
    download_wheels(pins)
    amd = amd_pins()
    fetch_kernel_debs(amd)
    build_rocm_repo(amd)
    pack_rccl_standins(amd)
    sglang_artifacts(pins)
