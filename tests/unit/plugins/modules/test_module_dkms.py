"""dkms_module's glue, in-process: faked dkms/modinfo/depmod outputs, the exact commands in order, the result.

The source tree (/usr/src) and the kernel headers (/lib/modules/<kernel>/build) are directories under tmp_path
(dkms_module.SRC_ROOT and MODULES_ROOT point there); the source tarball is a real file with its real sha256.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import tarfile
from pathlib import Path
from types import SimpleNamespace

import pytest
from ansible_collections.rigbook.homelab.plugins.module_utils import safe_untar
from ansible_collections.rigbook.homelab.plugins.module_utils.facts import builds
from ansible_collections.rigbook.homelab.plugins.modules import dkms_module
from helpers.modules import fail, ok, run_module

K = "6.1.0-47-amd64"
K2 = "6.1.0-50-amd64"
PKG = "nvidia/615.71.09"
STATUS = ["dkms", "status", "-m", "nvidia"]
ADD = ["dkms", "add", PKG]
REMOVE = ["dkms", "remove", PKG, "--all"]
DKMS_KO = f"/lib/modules/{K}/updates/dkms/nvidia.ko"


def install(kernel):
    return ["dkms", "install", PKG, "-k", kernel, "--force"]


def modinfo(kernel, name="nvidia"):
    return ["modinfo", "-k", kernel, "-n", name]


def installed(*kernels, version="615.71.09"):
    """`dkms status` (dkms 3 format) with nvidia/VERSION installed for KERNELS."""
    return ok("".join(f"nvidia/{version}, {k}, x86_64: installed\n" for k in kernels))


def tarball(path: Path, files: dict, links: dict = None) -> Path:
    """A .tar.gz at PATH holding FILES (name -> text) and symlinks LINKS (name -> target)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for name, target in (links or {}).items():
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
    return path


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


FORK = {"nvidia-615.71.09/dkms.conf": 'PACKAGE_NAME="nvidia"\nPACKAGE_VERSION="615.71.09"\n',
        "nvidia-615.71.09/nvidia.c": "/* stand-in */\n"}


@pytest.fixture
def host(tmp_path, monkeypatch):
    """/usr/src, /lib/modules/K/build and the fork's tarball, all under tmp_path."""
    src_root = tmp_path / "usr" / "src"
    src_root.mkdir(parents=True)
    modules = tmp_path / "lib" / "modules"
    (modules / K / "build").mkdir(parents=True)
    monkeypatch.setattr(dkms_module, "SRC_ROOT", str(src_root))
    monkeypatch.setattr(dkms_module, "MODULES_ROOT", str(modules))
    monkeypatch.setattr(dkms_module, "DKMS_TREE", str(tmp_path / "var" / "lib" / "dkms"))
    monkeypatch.setattr(dkms_module, "BACKUP_ROOT", str(tmp_path / "var" / "lib" / "rigbook" / "hand-installed"))
    monkeypatch.setattr(dkms_module, "LIVE_ROOT", str(tmp_path / "live"))
    src = tarball(tmp_path / "artifacts" / "nvidia-fork-615.71.09.tar.gz", FORK)
    return SimpleNamespace(tmp=tmp_path, src_root=src_root, modules=modules, src=src, sha=sha256(src),
                           dest=src_root / "nvidia-615.71.09")


def args(host, **over):
    return {"name": "nvidia", "version": "615.71.09", "src": str(host.src), "sha256": host.sha, "kernels": [K],
            **over}


def unpacked(host, sha=None):
    """The source already in /usr/src, stamped with the tarball's sha256 (what an earlier run left)."""
    host.dest.mkdir()
    (host.dest / "dkms.conf").write_text(FORK["nvidia-615.71.09/dkms.conf"])
    (host.dest / builds.SOURCE_STAMP).write_text((sha or host.sha) + "\n")


def stock_module(host, kernel=K, rel="updates/p2p/nvidia.ko") -> Path:
    """A copy of the module that wins over the DKMS build (a depmod override to updates/p2p, as one public runbook
    installs the fork: WU-CVGL/cluster-setup docs/05_GPU_P2P_RTX4090.md)."""
    path = host.modules / kernel / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("stock")
    return path


def pinned(host, path):
    """Point the fixture's tarball at PATH (a file with its real sha256)."""
    host.src, host.sha = path, sha256(path)


def no_leftover_temp_dirs(host):
    return [p.name for p in host.src_root.iterdir() if p.name.startswith(".rigbook-")] == []


# --- converged -----------------------------------------------------------------------------------------------

def test_converged_is_two_read_only_commands_and_no_change(host):
    unpacked(host)
    run = run_module(dkms_module, args(host), [(STATUS, installed(K)), (modinfo(K), ok(DKMS_KO + "\n"))])
    assert not run.failed, run.msg
    assert run.commands == [STATUS, modinfo(K)]
    assert run.result["changed"] is False and run.result["unpacked"] is False
    assert run.result["built"] == [] and run.result["removed"] == [] and run.result["shadowing_removed"] == []
    assert run.result["modinfo"] == {K: {"nvidia": DKMS_KO}}
    assert run.result["status"] == [dict(name="nvidia", version="615.71.09", kernel=K, arch="x86_64",
                                         state="installed")]


def test_converged_with_dkms_2_status_format(host):
    unpacked(host)
    run = run_module(dkms_module, args(host), [(STATUS, ok(f"nvidia, 615.71.09, {K}, x86_64: installed\n")),
                                               (modinfo(K), ok(DKMS_KO + "\n"))])
    assert not run.failed and run.result["changed"] is False


# --- changes -------------------------------------------------------------------------------------------------

def test_fresh_host_unpacks_adds_and_installs(host):
    run = run_module(dkms_module, args(host), [
        (STATUS, ok()),
        (ADD, ok(f"Creating symlink /var/lib/dkms/{PKG}/source -> /usr/src/nvidia-615.71.09\n")),
        (install(K), ok()),
        (modinfo(K), ok(DKMS_KO + "\n")),
        (STATUS, installed(K)),
    ])
    assert not run.failed, run.msg
    assert run.result["changed"] is True and run.result["unpacked"] is True
    assert run.result["built"] == [K] and run.result["removed"] == []
    assert run.result["status"][0]["state"] == "installed"
    assert (host.dest / "dkms.conf").read_text().startswith('PACKAGE_NAME="nvidia"')
    assert (host.dest / "nvidia.c").is_file()
    assert (host.dest / builds.SOURCE_STAMP).read_text() == host.sha + "\n"
    assert no_leftover_temp_dirs(host)


def test_a_symlink_inside_the_tree_is_kept(host):
    pinned(host, tarball(host.tmp / "artifacts" / "links.tar.gz", {**FORK, "nvidia-615.71.09/common/Kbuild": "x"},
                         links={"nvidia-615.71.09/kernel-open/Kbuild": "../common/Kbuild"}))
    run = run_module(dkms_module, args(host), [
        (STATUS, ok()), (ADD, ok()), (install(K), ok()), (modinfo(K), ok(DKMS_KO)), (STATUS, installed(K))])
    assert not run.failed, run.msg
    assert (host.dest / "kernel-open" / "Kbuild").is_symlink()
    assert (host.dest / "kernel-open" / "Kbuild").read_text() == "x"


def test_a_source_directory_is_copied(host):
    tree = host.tmp / "checkout"
    tree.mkdir()
    (tree / "dkms.conf").write_text("PACKAGE_NAME=nvidia\n")
    run = run_module(dkms_module, args(host, src=str(tree), sha256=None), [
        (STATUS, ok()), (ADD, ok()), (install(K), ok()), (modinfo(K), ok(DKMS_KO)), (STATUS, installed(K))])
    assert not run.failed, run.msg
    assert (host.dest / builds.SOURCE_STAMP).read_text() == "directory\n"


def test_other_versions_are_removed_and_a_new_kernel_is_built(host):
    unpacked(host)
    (host.modules / K2 / "build").mkdir(parents=True)
    run = run_module(dkms_module, args(host, kernels=[K, K2]), [
        (STATUS, ok(f"nvidia/610.1.1, {K}, x86_64: installed\nnvidia/615.71.09, {K}, x86_64: installed\n")),
        (["dkms", "remove", "nvidia/610.1.1", "--all"], ok()),
        (STATUS, installed(K)),
        (install(K2), ok()),
        (modinfo(K), ok(DKMS_KO)),
        (modinfo(K2), ok(f"/lib/modules/{K2}/updates/dkms/nvidia.ko")),
        (STATUS, installed(K, K2)),
    ])
    assert not run.failed, run.msg
    assert run.result["changed"] is True and run.result["unpacked"] is False
    assert run.result["removed"] == ["nvidia/610.1.1"] and run.result["built"] == [K2]
    assert [r["kernel"] for r in run.result["status"]] == [K, K2]


def test_a_new_source_of_the_same_version_replaces_the_build(host):
    unpacked(host, sha="0" * 64)
    run = run_module(dkms_module, args(host), [
        (STATUS, installed(K)),
        (REMOVE, ok()),
        (STATUS, ok()),
        (ADD, ok()),
        (install(K), ok()),
        (modinfo(K), ok(DKMS_KO)),
        (STATUS, installed(K)),
    ], diff=True)
    assert not run.failed, run.msg
    assert run.result["changed"] is True and run.result["unpacked"] is True and run.result["built"] == [K]
    assert (host.dest / builds.SOURCE_STAMP).read_text() == host.sha + "\n"
    # the diff starts from the build the call found, not from the tree after the old build was removed
    assert run.result["diff"]["before"] == f"nvidia/615.71.09 {K}: installed\n"
    assert run.result["diff"]["after"] == f"nvidia/615.71.09 {K}: installed\n"


def by_hand(host, files=FORK):
    """The pinned source put in /usr/src by hand (`git clone` of the fork, then `dkms add/build/install`): the
    tarball's files, a .git folder, no stamp."""
    for name, text in files.items():
        path = host.src_root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    (host.dest / ".git").mkdir()
    (host.dest / ".git" / "HEAD").write_text("ref: refs/heads/615.71.09-p2p\n")


@pytest.mark.parametrize("check_mode", [False, True])
def test_a_tree_put_there_by_hand_from_the_pinned_source_is_stamped_and_its_build_kept(host, check_mode):
    by_hand(host)
    run = run_module(dkms_module, args(host), [(STATUS, installed(K)), (modinfo(K), ok(DKMS_KO + "\n"))],
                     check_mode=check_mode)
    assert not run.failed, run.msg
    assert run.commands == [STATUS, modinfo(K)]  # no dkms remove, add or install
    assert run.result["stamped"] is True and run.result["changed"] is True
    assert run.result["built"] == [] and run.result["unpacked"] is False
    assert "holds the pinned source" in run.result["msg"]
    assert (host.dest / builds.SOURCE_STAMP).exists() is not check_mode
    assert (host.dest / ".git" / "HEAD").exists() and no_leftover_temp_dirs(host)


def test_a_tree_put_there_by_hand_that_differs_from_the_pinned_source_is_replaced(host):
    by_hand(host, {**FORK, "nvidia-615.71.09/nvidia.c": "/* patched by hand */\n"})
    run = run_module(dkms_module, args(host), [
        (STATUS, installed(K)), (REMOVE, ok()), (STATUS, ok()), (ADD, ok()), (install(K), ok()),
        (modinfo(K), ok(DKMS_KO)), (STATUS, installed(K))])
    assert not run.failed, run.msg
    assert run.result["stamped"] is False and run.result["unpacked"] is True and run.result["built"] == [K]
    assert (host.dest / "nvidia.c").read_text() == "/* stand-in */\n"


def test_a_stock_module_that_shadows_the_build_is_deleted(host):
    unpacked(host)
    stock = stock_module(host)
    run = run_module(dkms_module, args(host), [
        (STATUS, installed(K)),
        (modinfo(K), ok(f"{stock}\n")),
        (["depmod", "-a", K], ok()),
        (modinfo(K), ok(DKMS_KO)),
        (STATUS, installed(K)),
    ])
    assert not run.failed, run.msg
    assert run.result["changed"] is True and run.result["shadowing_removed"] == [str(stock)]
    assert not stock.exists()
    assert run.result["modinfo"] == {K: {"nvidia": DKMS_KO}}


def test_each_named_module_must_resolve_to_the_build(host):
    unpacked(host)
    run = run_module(dkms_module, args(host, modules=["nvidia", "nvidia-uvm"]), [
        (STATUS, installed(K)),
        (modinfo(K), ok(DKMS_KO)),
        (modinfo(K, "nvidia-uvm"), ok(f"/lib/modules/{K}/updates/dkms/nvidia-uvm.ko")),
    ])
    assert not run.failed and run.result["changed"] is False
    assert set(run.result["modinfo"][K]) == {"nvidia", "nvidia-uvm"}


# --- check mode ----------------------------------------------------------------------------------------------

def read_only(commands):
    return all(argv[:2] == ["dkms", "status"] or argv[0] == "modinfo" for argv in commands)


def test_check_mode_on_a_fresh_host_runs_nothing_that_changes_it(host):
    not_found = fail(1, "modinfo: ERROR: Module nvidia not found.\n")
    run = run_module(dkms_module, args(host), [(STATUS, ok()), (modinfo(K), not_found)], check_mode=True, diff=True)
    assert not run.failed, run.msg
    assert read_only(run.commands)
    assert run.result["changed"] is True and run.result["unpacked"] is True and run.result["built"] == [K]
    assert run.result["modinfo"] == {K: {"nvidia": None}}
    assert run.result["diff"]["after"] == f"nvidia/615.71.09 {K}: installed\n"
    assert not host.dest.exists() and no_leftover_temp_dirs(host)


def test_check_mode_reports_a_shadowing_stock_module_it_would_delete(host):
    unpacked(host)
    stock = stock_module(host)
    run = run_module(dkms_module, args(host), [(STATUS, installed(K)), (modinfo(K), ok(f"{stock}\n"))],
                     check_mode=True)
    assert not run.failed, run.msg
    assert read_only(run.commands)
    assert run.result["changed"] is True and run.result["shadowing_removed"] == [str(stock)]
    assert stock.exists()


def test_check_mode_before_the_headers_are_installed_reports_the_build(host):
    run = run_module(dkms_module, args(host, kernels=[K2]), [(STATUS, ok()), (modinfo(K2), fail(1))],
                     check_mode=True)
    assert not run.failed, run.msg
    assert run.result["changed"] is True and run.result["built"] == [K2]
    assert run.result["msg"] == f"the headers of {K2} are not installed yet (check mode)"


@pytest.mark.parametrize("missing", ["src", "dkms"])
def test_check_mode_before_the_source_or_dkms_is_there(host, missing):
    src = str(host.tmp / "not-fetched.tar.gz") if missing == "src" else str(host.src)
    run = run_module(dkms_module, args(host, src=src), [], check_mode=True, bins={"dkms": None})
    assert not run.failed and run.commands == []
    assert run.result["changed"] is True and run.result["built"] == [K]
    assert "(check mode)" in run.msg


# --- failures ------------------------------------------------------------------------------------------------

def test_a_failing_build_names_the_command_and_dkms_output(host):
    unpacked(host)
    err = (f"Error! Bad return status for module build on kernel: {K} (x86_64)\n"
           "Consult /var/lib/dkms/nvidia/615.71.09/build/make.log for more information.\n")
    run = run_module(dkms_module, args(host), [(STATUS, ok("nvidia/615.71.09: added\n")), (install(K), fail(10, err))])
    assert run.failed
    assert run.msg == f"dkms install {PKG} -k {K} failed (rc 10): {err.strip()}"
    assert run.result["cmd"] == install(K)


def test_a_build_that_still_loses_to_a_stock_module_fails(host):
    unpacked(host)
    stock = stock_module(host)
    extra = f"/lib/modules/{K}/extra/nvidia.ko"
    run = run_module(dkms_module, args(host), [
        (STATUS, installed(K)), (modinfo(K), ok(str(stock))), (["depmod", "-a", K], ok()), (modinfo(K), ok(extra))])
    assert run.failed
    assert run.msg == f"after installing {PKG} for {K}, modinfo -n nvidia resolves to {extra}, not the DKMS build"
    assert run.result["shadowing_removed"] == [str(stock)]


def test_a_builtin_module_is_a_clear_failure(host):
    unpacked(host)
    run = run_module(dkms_module, args(host), [(STATUS, installed(K)), (modinfo(K), ok("(builtin)\n"))])
    assert run.failed and "resolves to (builtin), not the DKMS build" in run.msg


# --- bad input -----------------------------------------------------------------------------------------------

def test_a_sha256_mismatch_is_refused_before_any_command(host):
    run = run_module(dkms_module, args(host, sha256="0" * 64), [])
    assert run.failed and run.commands == []
    assert run.msg == f"refused {host.src}: its sha256 is {host.sha}, pinned {'0' * 64}; nothing was installed"
    assert not host.dest.exists()


def test_a_tarball_without_a_pin_is_refused(host):
    run = run_module(dkms_module, args(host, sha256=None), [])
    assert run.failed and run.msg.endswith("pinned (no sha256 given); nothing was installed")


def test_missing_source_and_missing_arguments(host):
    run = run_module(dkms_module, args(host, src=str(host.tmp / "nope.tar.gz")), [])
    assert run.failed and run.msg == f"DKMS source {host.tmp / 'nope.tar.gz'} does not exist"
    bad = args(host)
    del bad["kernels"]
    run = run_module(dkms_module, bad, [])
    assert run.failed and run.msg == "missing required arguments: kernels"


def test_no_dkms_is_a_clear_failure(host):
    run = run_module(dkms_module, args(host), [], bins={"dkms": None})
    assert run.failed and run.msg == "dkms is not installed" and run.commands == []


def test_missing_headers_fail_naming_the_kernel(host):
    unpacked(host)
    run = run_module(dkms_module, args(host, kernels=[K2]), [(STATUS, installed(K))])
    assert run.failed
    assert run.msg == (f"cannot build {PKG} for {K2}: its headers are not installed "
                       f"({host.modules / K2 / 'build'})")


@pytest.mark.parametrize("kind,message", [
    ("not-a-tarball", "cannot unpack {src}: "),
    ("no-dkms-conf", "{src} has no dkms.conf at its top level"),
    ("dotdot", "{src}: unsafe archive, nothing was installed: member 'nvidia-615.71.09/../../evil' has a '..' "
               "component"),
    ("symlink-out", "{src}: unsafe archive, nothing was installed: member 'nvidia-615.71.09/shadow' is a symlink to "
                    "'/etc/shadow', an absolute path"),
    ("symlink-up-and-out", "{src}: unsafe archive, nothing was installed: member 'nvidia-615.71.09/etc' is a symlink "
                           "to '../../etc', which leads out of the folder"),
    ("symlink-chain", "{src}: unsafe archive, nothing was installed: member 'nvidia-615.71.09/x/y' lies under the "
                      "symlink 'nvidia-615.71.09/x'"),
], ids=["not-a-tarball", "no-dkms-conf", "dotdot", "symlink-out", "symlink-up-and-out", "symlink-chain"])
def test_a_bad_tarball_fails_before_the_old_build_is_touched(host, kind, message):
    unpacked(host, sha="0" * 64)  # an older source of the same version is built and installed
    path = host.tmp / "artifacts" / f"{kind}.tar.gz"
    if kind == "not-a-tarball":
        path.write_text("<html>404</html>\n")
    elif kind == "no-dkms-conf":
        tarball(path, {"nvidia-615.71.09/nvidia.c": ""})
    elif kind == "dotdot":
        tarball(path, {**FORK, "nvidia-615.71.09/../../evil": "x"})
    elif kind == "symlink-out":
        tarball(path, FORK, links={"nvidia-615.71.09/shadow": "/etc/shadow"})
    elif kind == "symlink-chain":  # x -> . then x/y -> ../../evil: each link stays inside on its own
        tarball(path, FORK, links={"nvidia-615.71.09/x": ".", "nvidia-615.71.09/x/y": "../../evil"})
    else:
        tarball(path, FORK, links={"nvidia-615.71.09/etc": "../../etc"})
    pinned(host, path)
    run = run_module(dkms_module, args(host), [(STATUS, installed(K))])
    assert run.failed and run.msg.startswith(message.format(src=path)), run.msg
    assert run.commands == [STATUS]  # no `dkms remove` of the working build
    assert (host.dest / builds.SOURCE_STAMP).read_text() == "0" * 64 + "\n"
    assert no_leftover_temp_dirs(host) and not (host.tmp / "evil").exists()


# --- one build for a group: export (the builds as one reproducible archive) and install_from -------------------

ARCH = os.uname()[4]
MODULE_DIR = f"{K}/{ARCH}/module"


def built_tree(host, kernels=(K,), modules=("nvidia.ko",)):
    """What `dkms install --force` left in dkms's tree (dkms_module.DKMS_TREE, under tmp_path): each kernel's built
    modules, and its make.log."""
    for kernel in kernels:
        folder = host.dkms / "nvidia" / "615.71.09" / kernel / ARCH
        (folder / "module").mkdir(parents=True, exist_ok=True)
        (folder / "log").mkdir(exist_ok=True)
        (folder / "log" / "make.log").write_text(f"DKMS make.log for nvidia-615.71.09 for kernel {kernel}\n"
                                                 "Mon Jan  1 00:00:00 UTC 2025\n")
        for name in modules:
            (folder / "module" / name).write_bytes(f"\x7fELF {name} for {kernel}\n".encode())


@pytest.fixture
def dkms_tree(host, monkeypatch):
    host.dkms = host.tmp / "var" / "lib" / "dkms"
    (host.dkms / "nvidia" / "615.71.09").mkdir(parents=True)  # `dkms add` made it
    monkeypatch.setattr(dkms_module, "DKMS_TREE", str(host.dkms))
    return host


def identity(host, kernels=(K,)):
    run = run_module(dkms_module, args(host, kernels=list(kernels)), [(STATUS, ok())] + [
        (modinfo(k), fail(1)) for k in kernels], check_mode=True)
    return run.result["identity_id"]


SRCVERSION = "9C1D5A3B7E2F04A6D8B1C3E"


def srcversion(path=DKMS_KO, value=SRCVERSION):
    """`modinfo -F srcversion PATH` answering VALUE: what the build stamp records of each built module."""
    return ["modinfo", "-F", "srcversion", path], ok(value + "\n")


def export_run(host, out, kernels=(K,)):
    return run_module(dkms_module, args(host, kernels=list(kernels), export_dir=str(out)), [
        (STATUS, ok("nvidia/615.71.09: added\n"))] + [(install(k), ok()) for k in kernels]
        + [(modinfo(k), ok(DKMS_KO + "\n")) for k in kernels] + [srcversion() for _k in kernels]
        + [(STATUS, installed(*kernels))])


def manifest(path: Path) -> dict:
    """The controller's manifest of an archive: {path: sha256} of its regular files (safe_untar.listing)."""
    return {rel: e["sha256"] for rel, e in safe_untar.listing(str(path)).items() if e["kind"] == "file"}


def test_check_mode_names_the_identity_of_what_is_due_and_the_headers_symbols_are_part_of_it(host):
    first = identity(host)
    assert len(first) == 16 and first == identity(host)
    (host.modules / K / "build" / "Module.symvers").write_text("0x12345678\tprintk\tvmlinux\tEXPORT_SYMBOL\n")
    assert identity(host) != first  # another kernel build: another binary
    unpacked(host)
    run = run_module(dkms_module, args(host), [(STATUS, installed(K)), (modinfo(K), ok(DKMS_KO + "\n"))])
    assert run.result["identity_id"] == "" and run.result["archive_glob"] == ""  # nothing to build


def test_a_build_is_exported_as_one_reproducible_binaries_only_archive_named_by_identity_and_sha256(dkms_tree):
    host = dkms_tree
    unpacked(host)
    built_tree(host)
    wanted = identity(host)
    run = export_run(host, host.tmp / "builds")
    assert not run.failed, run.msg
    path = Path(run.result["export_path"])
    assert path.name == f"nvidia-{wanted}-{run.result['export_sha256']}.tar.gz" and sha256(path) == run.result[
        "export_sha256"]
    assert run.result["archive_glob"] == f"nvidia-{wanted}-*.tar.gz"  # what the group_build role looks for
    with tarfile.open(path) as tar:
        members = {m.name: m for m in tar.getmembers()}
        conf = tar.extractfile("dkms_binaries_only/dkms.conf").read()
    assert sorted(n for n, m in members.items() if m.isfile()) == [
        ".rigbook-build.json", "dkms_binaries_only/PACKAGE_NAME", "dkms_binaries_only/PACKAGE_VERSION",
        "dkms_binaries_only/dkms.conf", f"dkms_main_tree/{MODULE_DIR}/nvidia.ko"]  # no make.log: it holds times
    assert {(m.mtime, m.uid, m.gid) for m in members.values()} == {(0, 0, 0)}
    assert conf == FORK["nvidia-615.71.09/dkms.conf"].encode()  # the pinned source's
    # the same build exported again, later, is the same bytes: a second box's build of it can be compared
    for ko in (host.dkms / "nvidia" / "615.71.09").rglob("*.ko"):
        os.utime(ko, (1, 1))
    (host.dkms / "nvidia" / "615.71.09" / K / ARCH / "log" / "make.log").write_text("another time\n")
    again = export_run(host, host.tmp / "builds-again")
    assert again.result["export_sha256"] == run.result["export_sha256"]


def test_an_export_without_the_built_modules_fails_naming_dkms_tree(dkms_tree):
    host = dkms_tree
    unpacked(host)
    run = run_module(dkms_module, args(host, export_dir=str(host.tmp / "builds")), [
        (STATUS, ok("nvidia/615.71.09: added\n")), (install(K), ok())])
    assert run.failed and f"no built module of nvidia/615.71.09 for {K}" in run.msg and str(host.dkms) in run.msg


def exported(host, kernels=(K,)) -> Path:
    """The builder's archive of KERNELS (made by the module's export on a builder's tree), then this box's own dkms
    tree emptied: the twin has the source registered and nothing built."""
    unpacked(host)
    built_tree(host, kernels)
    run = export_run(host, host.tmp / "builder", kernels)
    assert not run.failed, run.msg
    for kernel in kernels:
        shutil.rmtree(host.dkms / "nvidia" / "615.71.09" / kernel)
    return Path(run.result["export_path"])


def twin(host, archive, files=None, commands=None, kernels=(K,)):
    return run_module(dkms_module, args(host, kernels=list(kernels), install_from=str(archive),
                                        install_files=manifest(archive) if files is None else files),
                      commands if commands is not None else [(STATUS, ok("nvidia/615.71.09: added\n"))])


def test_a_twin_installs_only_the_checked_modules_and_no_dkms_command_reads_the_archive(dkms_tree):
    host = dkms_tree
    archive = exported(host)
    run = twin(host, archive, commands=[
        (STATUS, ok("nvidia/615.71.09: added\n")),
        (STATUS, ok(f"nvidia/615.71.09, {K}, {ARCH}: built\n")),  # dkms sees the modules put in its tree
        (["dkms", "install", PKG, "-k", K], ok()),  # no --force: the loaded build is installed, not rebuilt
        (modinfo(K), ok(DKMS_KO + "\n")), srcversion(), (STATUS, installed(K))])
    assert not run.failed, run.msg
    assert run.result["installed_from"] == str(archive) and run.result["built"] == [K]
    loaded = host.dkms / "nvidia" / "615.71.09" / K / ARCH
    assert sorted(p.relative_to(loaded).as_posix() for p in loaded.rglob("*")) == [
        ".rigbook-build.json", "module", "module/nvidia.ko"]  # the modules, and rigbook's stamp of the build
    assert (loaded / "module" / "nvidia.ko").read_bytes() == f"\x7fELF nvidia.ko for {K}\n".encode()
    assert (host.dest / "dkms.conf").read_text() == FORK["nvidia-615.71.09/dkms.conf"]  # the source untouched
    assert not [p for p in host.dkms.iterdir() if p.name.startswith(".rigbook-")]


def test_modules_dkms_does_not_see_fail_before_dkms_could_compile(dkms_tree):
    host = dkms_tree
    archive = exported(host)
    run = twin(host, archive, commands=[(STATUS, ok("nvidia/615.71.09: added\n")),
                                        (STATUS, ok("nvidia/615.71.09: added\n"))])
    assert run.failed and f"dkms does not see the build of nvidia loaded from {archive} for {K}" in run.msg
    assert "nothing compiled" in run.msg


def repacked(archive: Path, change) -> Path:
    """ARCHIVE's members, CHANGE(dict of name -> bytes) applied, packed again under the name export would give."""
    with tarfile.open(archive) as tar:
        members = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}
    change(members)
    data = builds.pack([(name, "bytes", body) for name, body in members.items()])
    named = builds.parse_archive_name(archive.name)
    path = archive.with_name(builds.archive_name("nvidia", named["identity_id"], hashlib.sha256(data).hexdigest()))
    path.write_bytes(data)
    return path


def restamped(members):
    """The stamp rewritten to name the members as they are (a builder that lies consistently)."""
    stamp = json.loads(members[builds.BUILD_STAMP])
    stamp["files"] = {n: hashlib.sha256(b).hexdigest() for n, b in members.items() if n != builds.BUILD_STAMP}
    members[builds.BUILD_STAMP] = json.dumps(stamp).encode()


KO = f"dkms_main_tree/{MODULE_DIR}/nvidia.ko"
CONF = "dkms_binaries_only/dkms.conf"


@pytest.mark.parametrize("attack, why", [
    ("extra file, not in the manifest", "dkms_binaries_only/run.sh is in it but not in the controller's manifest"),
    ("extra file, manifest and stamp made for it", "dkms_binaries_only/run.sh is no part of a binaries-only build"),
    ("extra build log", f"dkms_main_tree/{K}/{ARCH}/log/make.log is no part of a binaries-only build"),
    ("extra module, not in the stamp", f"dkms_main_tree/{MODULE_DIR}/evil.ko is in it but not in its stamp"),
    ("changed .ko, the manifest of the original", f"{KO} is not the file the controller's manifest names"),
    ("changed .ko, not as stamped", f"{KO} is in it but not in its stamp, or not as its stamp names it"),
    ("dkms.conf with a command", f"its {CONF} is not the pinned source's"),
    ("a link", f"it holds the link dkms_main_tree/{MODULE_DIR}/nvidia-uvm.ko"),
    ("another architecture", f"dkms_main_tree/{K}/riscv64/module/nvidia.ko is no part of a binaries-only build"),
])
def test_a_tampered_archive_is_refused_with_nothing_installed_and_no_dkms_command_run(dkms_tree, attack, why):
    host = dkms_tree
    archive = exported(host)
    genuine = manifest(archive)
    marker = host.tmp / "ran-as-root"
    files = None  # the manifest of what is copied to the box
    if attack.startswith("extra file"):
        bad = repacked(archive, lambda m: m.update({"dkms_binaries_only/run.sh": b"touch /tmp/x\n"}))
        if "made for it" in attack:
            bad = repacked(archive, lambda m: (m.update({"dkms_binaries_only/run.sh": b"touch x\n"}), restamped(m)))
        else:
            files = genuine
    elif attack == "extra build log":
        bad = repacked(archive, lambda m: (m.update({f"dkms_main_tree/{K}/{ARCH}/log/make.log": b"x"}), restamped(m)))
    elif attack == "extra module, not in the stamp":
        bad = repacked(archive, lambda m: m.update({f"dkms_main_tree/{MODULE_DIR}/evil.ko": b"\x7fELF evil"}))
    elif attack.startswith("changed .ko"):
        bad = repacked(archive, lambda m: m.update({KO: b"\x7fELF changed"}))
        files = genuine if "original" in attack else None
    elif attack == "dkms.conf with a command":  # what `dkms ldtarball` would have sourced, as root
        conf = FORK["nvidia-615.71.09/dkms.conf"] + f"touch {marker}\n"
        bad = repacked(archive, lambda m: (m.update({CONF: conf.encode()}), restamped(m)))
    elif attack == "a link":
        raw = io.BytesIO()
        with tarfile.open(archive) as tar, tarfile.open(fileobj=raw, mode="w:gz") as out:
            for member in tar.getmembers():
                out.addfile(member, tar.extractfile(member) if member.isfile() else None)
            link = tarfile.TarInfo(f"dkms_main_tree/{MODULE_DIR}/nvidia-uvm.ko")
            link.type, link.linkname = tarfile.SYMTYPE, "nvidia.ko"
            out.addfile(link)
        named = builds.parse_archive_name(archive.name)
        bad = archive.with_name(builds.archive_name("nvidia", named["identity_id"],
                                                    hashlib.sha256(raw.getvalue()).hexdigest()))
        bad.write_bytes(raw.getvalue())
    else:
        def other_arch(m):
            m[f"dkms_main_tree/{K}/riscv64/module/nvidia.ko"] = m.pop(KO)
            restamped(m)
        bad = repacked(archive, other_arch)
    run = twin(host, bad, files=files)
    assert run.failed and run.msg.startswith(f"refused {bad}: ") and why in run.msg, run.msg
    assert run.msg.endswith("; no module was installed") and run.commands == [STATUS]  # no ldtarball, no install
    assert not marker.exists() and not (host.dkms / "nvidia" / "615.71.09" / K).exists()
    assert not [p for p in host.dkms.iterdir() if p.name.startswith(".rigbook-")]
    assert (host.dest / "dkms.conf").read_text() == FORK["nvidia-615.71.09/dkms.conf"]


@pytest.mark.parametrize("problem", ["identity", "sha256", "kernels", "package", "unsafe", "name", "no manifest",
                                     "manifest out"])
def test_an_archive_that_is_not_this_build_is_refused_before_anything_is_loaded(dkms_tree, problem):
    host = dkms_tree
    archive = exported(host)
    wanted = identity(host)
    files = None
    if problem == "identity":
        archive = archive.rename(archive.with_name(archive.name.replace(wanted, "0" * 16)))
    elif problem == "sha256":
        archive = archive.rename(archive.with_name(f"nvidia-{wanted}-{'ab' * 32}.tar.gz"))
    elif problem == "kernels":
        (host.modules / K2 / "build").mkdir(parents=True)
        built_tree(host, (K, K2))
        both = Path(export_run(host, host.tmp / "builder-both", (K, K2)).result["export_path"])
        for kernel in (K, K2):
            shutil.rmtree(host.dkms / "nvidia" / "615.71.09" / kernel)
        files = manifest(both)
        named = builds.parse_archive_name(both.name)
        archive = both.rename(both.with_name(both.name.replace(named["identity_id"], wanted)))
    elif problem == "package":
        archive = repacked(archive, lambda m: (m.update({"dkms_binaries_only/PACKAGE_VERSION": b"615.71.08\n"}),
                                               restamped(m)))
    elif problem == "unsafe":
        bad = tarball(host.tmp / "bad.tar.gz", {"./dkms_binaries_only/PACKAGE_NAME": "nvidia\n"},
                      {"./dkms_main_tree": "/lib/modules"})
        archive = bad.rename(bad.with_name(f"nvidia-{wanted}-{sha256(bad)}.tar.gz"))
        files = {}
    elif problem == "name":
        archive = archive.rename(archive.with_name("nvidia-prebuilt.tar.gz"))
        files = {}
    elif problem == "no manifest":
        run = run_module(dkms_module, args(host, install_from=str(archive)), [])
        assert run.failed and "install_files" in run.msg and run.commands == []
        return
    else:
        files = {"../../etc/shadow": "0" * 64}
    run = twin(host, archive, files=files, commands=[] if problem == "manifest out" else None)
    assert run.failed and "no module was installed" in run.msg, run.msg
    assert {"identity": "it is another build", "sha256": "its name says", "kernels": f"for {K}, {K2})",
            "package": "615.71.08", "unsafe": "unsafe archive", "name": "not a DKMS build archive",
            "manifest out": "install_files: '../../etc/shadow'"}[problem] in run.msg, run.msg
    assert not (host.dkms / "nvidia" / "615.71.09" / K).exists()


# --- a fork installed by hand (seed 000's way) moves to DKMS ------------------------------------------------------
# Seed 000 built the fork and installed it the fork's own way ("the old DKMS module cleared, then depmod"): `make
# modules_install` puts NVIDIA's open modules in /lib/modules/<kernel>/kernel/drivers/video
# (NVIDIA/open-gpu-kernel-modules kernel-open/Makefile: INSTALL_MOD_DIR ?= kernel/drivers/video). The fork's
# dkms.conf names its five modules (aikitoria/open-gpu-kernel-modules dkms.conf@03b25e5c, its BUILT_MODULE_NAME lines).
FORK_MODULES = ["nvidia", "nvidia-modeset", "nvidia-drm", "nvidia-uvm", "nvidia-peermem"]
FORK_CONF = ('PACKAGE_NAME="nvidia"\nPACKAGE_VERSION="615.71.09"\n'
             + "".join(f'BUILT_MODULE_NAME[{i}]="{m}"\nBUILT_MODULE_LOCATION[{i}]="kernel-open"\n'
                       f'DEST_MODULE_LOCATION[{i}]="/updates/dkms"\n' for i, m in enumerate(FORK_MODULES))
             + 'AUTOINSTALL="yes"\n')
FIVE = ["nvidia-drm.ko", "nvidia-modeset.ko", "nvidia-peermem.ko", "nvidia-uvm.ko", "nvidia.ko"]
DEPMOD = ["depmod", "-a", K]


def fork_by_hand(host, kernel=K, running=True):
    """The fork's five modules where its `make modules_install` put them for KERNEL, the pinned tarball carrying the
    fork's dkms.conf, and (RUNNING) the running kernel with the pinned nvidia loaded (LIVE_ROOT's /proc and /sys)."""
    pinned(host, tarball(host.tmp / "artifacts" / "fork.tar.gz", {
        "nvidia-615.71.09/dkms.conf": FORK_CONF, "nvidia-615.71.09/nvidia.c": "/* stand-in */\n"}))
    folder = host.modules / kernel / "kernel" / "drivers" / "video"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "fbdev").mkdir(exist_ok=True)
    (folder / "fbdev" / "vesafb.ko").write_text("in-tree")  # the kernel's own module there is left alone
    for name in FIVE:
        (folder / name).write_text(f"hand-built {name}")
    live = host.tmp / "live"
    (live / "proc" / "sys" / "kernel").mkdir(parents=True, exist_ok=True)
    (live / "proc" / "sys" / "kernel" / "osrelease").write_text(kernel + "\n")
    if running:
        (live / "sys" / "module" / "nvidia").mkdir(parents=True, exist_ok=True)
        (live / "sys" / "module" / "nvidia" / "version").write_text("615.71.09\n")
    return folder


def backup_of(host, kernel=K, n=""):
    return host.tmp / "var" / "lib" / "rigbook" / "hand-installed" / "nvidia-615.71.09" / (kernel + n)


@pytest.mark.parametrize("diff", [False, True])
def test_check_mode_says_the_hand_installed_fork_moves_to_dkms_with_the_reason_and_changes_nothing(host, diff):
    folder = fork_by_hand(host)
    by_hand = f"{folder}/nvidia.ko"
    src_root_before = (sorted(host.src_root.iterdir()), host.src_root.stat().st_mtime_ns)
    run = run_module(dkms_module, args(host), [(STATUS, ok()), (modinfo(K), ok(by_hand + "\n"))],
                     check_mode=True, diff=diff)
    assert not run.failed, run.msg
    assert read_only(run.commands)
    # the pinned source's dkms.conf is read without a folder made under /usr/src, even for a moment (check mode)
    assert (sorted(host.src_root.iterdir()), host.src_root.stat().st_mtime_ns) == src_root_before
    assert run.result["changed"] is True and run.result["built"] == [K]
    assert run.result["hand_installed"] == {K: [f"{folder}/{name}" for name in FIVE]}
    assert run.result["moved_aside_to"] == {K: str(backup_of(host))}
    assert (f"the fork is installed by hand (make modules_install) in {folder} ({', '.join(FIVE)}), the pinned nvidia "
            f"615.71.09 loaded from there; the converge builds nvidia/615.71.09 with DKMS for every installed kernel "
            f"({K}) so that a kernel upgrade rebuilds it, and moves the hand-installed files aside to "
            f"{backup_of(host)} (kept, not deleted)") in run.msg
    assert sorted(p.name for p in folder.iterdir() if p.is_file()) == FIVE  # nothing moved
    assert not backup_of(host).parent.exists() and not host.dest.exists()
    assert run.result["shadowing_removed"] == []  # the build to come wins over them: nothing deleted either
    assert no_leftover_temp_dirs(host)
    if diff:
        assert f"{folder}/nvidia.ko (installed by hand)" in run.result["diff"]["before"]
        assert f"{backup_of(host)}/kernel/drivers/video/nvidia.ko (moved aside)" in run.result["diff"]["after"]


def test_a_real_run_moves_the_hand_installed_files_aside_runs_depmod_then_builds_and_stamps(dkms_tree):
    host = dkms_tree
    folder = fork_by_hand(host)

    def dkms_installs(argv):
        built_tree(host)  # what `dkms install` leaves in dkms's tree
        return ok()

    run = run_module(dkms_module, args(host), [
        (STATUS, ok()), (ADD, ok()), (DEPMOD, ok()), (install(K), dkms_installs),
        (modinfo(K), ok(DKMS_KO + "\n")), srcversion(), (STATUS, installed(K))])
    assert not run.failed, run.msg
    assert run.commands.index(DEPMOD) < run.commands.index(install(K))  # moved aside before dkms install looks
    assert "this run builds nvidia/615.71.09 with DKMS" in run.msg and "moved the hand-installed files aside" in run.msg
    kept = backup_of(host) / "kernel" / "drivers" / "video"
    assert sorted(p.name for p in kept.iterdir()) == FIVE
    assert (kept / "nvidia.ko").read_text() == "hand-built nvidia.ko"  # kept, byte for byte
    assert [p.name for p in folder.iterdir() if p.is_file()] == [] and (folder / "fbdev" / "vesafb.ko").exists()
    stamp = json.loads((host.dkms / "nvidia" / "615.71.09" / K / ARCH / builds.BUILD_STAMP).read_text())
    assert stamp["modules"] == {"nvidia": {"path": DKMS_KO, "srcversion": SRCVERSION}}
    assert stamp["version"] == "615.71.09" and stamp["kernel"] == K and stamp["source"] == host.sha
    assert run.result["build_stamps"] == [str(host.dkms / "nvidia" / "615.71.09" / K / ARCH / builds.BUILD_STAMP)]
    # converged: the next run finds nothing by hand and builds nothing
    again = run_module(dkms_module, args(host), [(STATUS, installed(K)), (modinfo(K), ok(DKMS_KO + "\n"))])
    assert again.result["changed"] is False and "hand_installed" not in again.result


def test_a_build_that_fails_after_the_move_puts_the_hand_installed_files_back(host):
    folder = fork_by_hand(host)
    run = run_module(dkms_module, args(host), [
        (STATUS, ok()), (ADD, ok()), (DEPMOD, ok()),
        (install(K), fail(10, "Error! Bad return status for module build")), (DEPMOD, ok())])
    assert run.failed
    assert run.msg.startswith(f"dkms install {PKG} -k {K} failed (rc 10): Error! Bad return status")
    assert run.msg.endswith("; the hand-installed files were put back and depmod re-run")
    assert sorted(p.name for p in folder.iterdir() if p.is_file()) == FIVE  # the box keeps the driver it ran with


def test_a_second_hand_install_is_moved_beside_the_first_never_over_it(host):
    fork_by_hand(host, running=False)
    backup_of(host).mkdir(parents=True)
    (backup_of(host) / "earlier").write_text("an earlier move")
    run = run_module(dkms_module, args(host), [(STATUS, ok()), (modinfo(K), fail(1))], check_mode=True)
    assert run.result["moved_aside_to"] == {K: str(backup_of(host, n="-2"))}
    assert "loaded from there" not in run.msg  # the pinned nvidia is not loaded: not claimed


def test_only_the_kernels_to_build_for_lose_their_hand_installed_fork(host):
    fork_by_hand(host)
    other = fork_by_hand(host, kernel=K2)  # no headers for K2: not among the kernels the fork is built for
    run = run_module(dkms_module, args(host), [(STATUS, ok()), (modinfo(K), fail(1))], check_mode=True)
    assert list(run.result["hand_installed"]) == [K]
    assert sorted(p.name for p in other.iterdir() if p.is_file()) == FIVE


def test_the_fork_dkms_conf_names_its_five_modules():
    assert dkms_module.built_module_names(FORK_CONF) == FORK_MODULES
    assert dkms_module.built_module_names("MAKE=make\n") == []


@pytest.mark.parametrize("missing", ["src", "dkms"])
def test_check_mode_says_it_before_the_source_or_dkms_is_there(host, missing):
    """The first check-mode converge of seed 000's box: the fork's tarball is not fetched yet (check mode), or dkms is
    not installed yet. Without the source's dkms.conf the package's files are those named nvidia or nvidia-<part>
    (the kernel's own nvidiafb is not one)."""
    folder = fork_by_hand(host)
    fbdev = folder / "fbdev" / "nvidia"
    fbdev.mkdir(parents=True)
    (fbdev / "nvidiafb.ko").write_text("in-tree")
    src = str(host.tmp / "not-fetched.tar.gz") if missing == "src" else str(host.src)
    run = run_module(dkms_module, args(host, src=src), [], check_mode=True, bins={"dkms": None})
    assert not run.failed and run.commands == []
    assert run.result["hand_installed"] == {K: [f"{folder}/{name}" for name in FIVE]}
    assert "(check mode); the fork is installed by hand (make modules_install)" in run.msg
    assert "moves the hand-installed files aside to" in run.msg
    assert sorted(p.name for p in folder.iterdir() if p.is_file()) == FIVE and no_leftover_temp_dirs(host)


def test_a_depmod_that_fails_after_the_move_puts_the_files_back(host):
    folder = fork_by_hand(host)
    run = run_module(dkms_module, args(host), [
        (STATUS, ok()), (ADD, ok()), (DEPMOD, fail(1, "depmod: ERROR: could not open directory")), (DEPMOD, ok())])
    assert run.failed and run.msg.startswith(f"depmod -a {K} failed (rc 1): depmod: ERROR")
    assert run.msg.endswith("the hand-installed files were put back and depmod re-run")
    assert sorted(p.name for p in folder.iterdir() if p.is_file()) == FIVE
    assert [p for p in backup_of(host).rglob("*") if p.is_file()] == []
