"""source_build, in-process: the exact commands in order (faked), then real builds of the RCCL TEST STAND-IN with real
`patch`, `cmake` and the compiler: the shipped patch applies, a converged re-run runs nothing, a bumped source fails
before anything is built naming the patch and file, a bad sha256 is refused before anything is touched, two patch
sets coexist and the link switches between them without a rebuild. One build for a group: an export installs on
another box only with the controller's manifest, every file checked (an extra file, a changed program, another build:
refused with nothing installed), and the same pins export the same bytes.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from ansible_collections.rigbook.homelab.plugins.module_utils import safe_untar
from ansible_collections.rigbook.homelab.plugins.module_utils.facts import builds
from ansible_collections.rigbook.homelab.plugins.modules import source_build
from helpers.cli import REPO
from helpers.modules import fail, ok, run_module, run_module_real

sys.path.insert(0, str(REPO / "tests" / "artifacts"))
import rccl_standin  # noqa: E402  (the stand-in packer lives with the stand-ins)

PATCH = REPO / "roles" / "rccl" / "files" / "patches" / "p2p-level-user-last.patch"
PATCH_SHA = hashlib.sha256(PATCH.read_bytes()).hexdigest()
TOOLS = all(shutil.which(t) for t in ("cmake", "patch", "c++", "make"))
needs_tools = pytest.mark.skipif(not TOOLS, reason="needs cmake, patch, make and a C++ compiler")


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def tarballs(tmp_path_factory):
    dest = tmp_path_factory.mktemp("artifacts")
    digests = rccl_standin.pack(dest)
    return {name: (dest / name, digest) for name, digest in digests.items()}


def args(tmp_path, tarballs, source=rccl_standin.SOURCE, patches=True, tests=False, **extra):
    src, digest = tarballs[source]
    comps = [dict(name="rccl", src=str(src), sha256=digest,
                  patches=[dict(path=str(PATCH), sha256=PATCH_SHA)] if patches else [],
                  cmake_args=["-DAMDGPU_TARGETS=gfx1201", "-DGPU_TARGETS=gfx1201"])]
    files = ["lib/librccl.so"]
    if tests:
        tsrc, tdigest = tarballs[rccl_standin.TESTS]
        comps.append(dict(name="rccl-tests", src=str(tsrc), sha256=tdigest, cmake_args=["-DNCCL_HOME={prefix}"]))
        files += ["bin/sendrecv_perf", "bin/all_reduce_perf"]
    return dict(dict(name="rccl", version="2.27.7", prefix_root=str(tmp_path / "opt"), components=comps,
                     check_files=files, build_root=str(tmp_path / "build"), jobs=2), **extra)


def real(module_args, check_mode=False, diff=False):
    """main() in-process with the real run_command; returns (result, failed, argvs run)."""
    return run_module_real(source_build, module_args, check_mode=check_mode, diff=diff)


# --- exact commands (faked) ----------------------------------------------------------------------------------

def identity_of(a) -> str:
    """The identity_id a check names for A (its sources not fetched yet: it stops before reading them)."""
    check = run_module(source_build, {**a, "components": [dict(c, src=c["src"] + ".not-fetched") for c in
                                                          a["components"]]}, check_mode=True)
    return check.result["identity_id"]


def test_fresh_build_runs_dry_run_then_patch_configure_build_install_in_order(tmp_path, tarballs):
    a = args(tmp_path, tarballs)
    a["check_files"] = []
    opt = tmp_path / "opt"
    prefix = f"{opt}/2.27.7-{hashlib.sha256(f'rccl:{PATCH_SHA}'.encode()).hexdigest()[:12]}"
    log = f"{opt}/.rccl-build.log"
    # the build tree: one path per build (its identity), so a compiler writes the same paths on every box
    work = tmp_path / "build" / f".rigbook-rccl-{identity_of(a)}"
    top = f"{work}/rccl/rccl-2.27.7"
    sh = ["sh", "-c", 'exec "$@" >>"$0" 2>&1', log]

    def install_one_file(argv):
        Path(prefix, "lib").mkdir(parents=True)
        Path(prefix, "lib", "librccl.so.1").write_bytes(b"\x7fELF")
        Path(prefix, "lib", "librccl.so").symlink_to("librccl.so.1")
        return ok()

    run = run_module(source_build, a, [
        (["patch", "--dry-run", "-p1", "--forward", "--batch", "-d", top, "-i", str(PATCH)], ok()),
        (["patch", "-p1", "--forward", "--batch", "-d", top, "-i", str(PATCH)], ok()),
        (sh + ["cmake", "-S", top, "-B", f"{work}/build-rccl", f"-DCMAKE_INSTALL_PREFIX={prefix}",
               "-DCMAKE_BUILD_TYPE=Release", "-DAMDGPU_TARGETS=gfx1201", "-DGPU_TARGETS=gfx1201"], ok()),
        (sh + ["cmake", "--build", f"{work}/build-rccl", "--parallel", "2"], ok()),
        (sh + ["cmake", "--install", f"{work}/build-rccl"], install_one_file),
    ], diff=True)
    assert not run.failed, run.result
    assert run.result["changed"] and run.result["built"] and run.result["link_changed"]
    assert run.result["prefix"] == prefix and os.readlink(opt / "current") == Path(prefix).name
    stamp = json.loads((Path(prefix) / ".rigbook-build.json").read_text())
    assert stamp["components"][0]["patches"] == [f"p2p-level-user-last.patch -p1 {PATCH_SHA}"]
    # every file the build installed is stamped (a link is not a file: its target is)
    assert stamp["files"] == {"lib/librccl.so.1": hashlib.sha256(b"\x7fELF").hexdigest()}
    assert "no build" in run.result["diff"]["before"]
    assert "patch p2p-level-user-last.patch" in run.result["diff"]["after"]
    assert not work.exists()  # the build tree is removed


def test_a_failing_build_step_fails_with_the_log_and_leaves_no_stamp_and_no_link(tmp_path, tarballs):
    a = args(tmp_path, tarballs, patches=False)
    opt = tmp_path / "opt"
    opt.mkdir()
    (opt / ".rccl-build.log").write_text("c++: fatal error: hipcc not found\n")
    work = tmp_path / "build" / f".rigbook-rccl-{identity_of(a)}"
    (work / "left-by-a-cut-short-build").mkdir(parents=True)
    top = f"{work}/rccl/rccl-2.27.7"
    run = run_module(source_build, a, [
        (["sh", "-c", 'exec "$@" >>"$0" 2>&1', f"{opt}/.rccl-build.log", "cmake", "-S", top, "-B",
          f"{work}/build-rccl", f"-DCMAKE_INSTALL_PREFIX={opt}/2.27.7-stock", "-DCMAKE_BUILD_TYPE=Release",
          "-DAMDGPU_TARGETS=gfx1201", "-DGPU_TARGETS=gfx1201"], fail(1)),
    ])
    assert run.failed and "configure rccl failed (rc 1)" in run.msg and "hipcc not found" in run.msg
    assert not (opt / "current").exists() and not (opt / "2.27.7-stock" / ".rigbook-build.json").exists()
    assert not work.exists()


def test_bad_source_sha256_is_refused_before_any_command(tmp_path, tarballs):
    a = args(tmp_path, tarballs)
    a["components"][0]["sha256"] = "0" * 64
    run = run_module(source_build, a, [])
    assert run.failed and "refused" in run.msg and "pinned " + "0" * 64 in run.msg and "nothing was built" in run.msg
    assert not (tmp_path / "opt").exists() and not (tmp_path / "build").exists()


def test_the_archive_glob_comes_with_the_check_and_an_archive_of_another_name_is_refused(tmp_path, tarballs):
    check = run_module(source_build, args(tmp_path, tarballs, patches=False), check_mode=True)
    identity = check.result["identity_id"]
    assert not check.failed and check.result["archive_glob"] == f"rccl-{identity}-*.tar.gz"
    renamed = tmp_path / "rccl-build.tar.gz"
    renamed.write_bytes(b"not looked at")
    run = run_module(source_build, args(tmp_path, tarballs, patches=False, install_from=str(renamed),
                                        install_files={}))
    assert run.failed and run.msg == (f"install_from {renamed}: not an archive of this build "
                                      f"(rccl-{identity}-*.tar.gz); nothing was installed")
    assert not (tmp_path / "opt" / "current").exists()
    # an archive without the controller's manifest is not installed at all
    run = run_module(source_build, args(tmp_path, tarballs, patches=False, install_from=str(renamed)))
    assert run.failed and "install_files" in run.msg and run.commands == []
    run = run_module(source_build, args(tmp_path, tarballs, patches=False, install_from=str(renamed),
                                        install_files={"../../etc/cron.d/x": "0" * 64}))
    assert run.failed and run.msg == ("install_files: '../../etc/cron.d/x' is no relative path inside the prefix; "
                                      "nothing was installed")


def test_bad_patch_sha256_is_refused_naming_the_patch(tmp_path, tarballs):
    a = args(tmp_path, tarballs)
    a["components"][0]["patches"][0]["sha256"] = "1" * 64
    run = run_module(source_build, a, [])
    assert run.failed and f"refused patch {PATCH}" in run.msg and not (tmp_path / "opt").exists()


def test_an_unsafe_source_tarball_fails_before_any_command(tmp_path, tarballs):
    # x -> . then x/y -> ../../../outside: each link stays inside on its own (module_utils/safe_untar.py's suite
    # is the one for every pattern; this is the module's use of it)
    bad = tmp_path / "rccl-chain.tar.gz"
    with tarfile.open(bad, "w:gz") as tar:
        for name, target in (("rccl/x", "."), ("rccl/x/y", "../../../outside")):
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
    a = args(tmp_path, tarballs)
    a["components"][0].update(src=str(bad), sha256=sha256(bad))
    run = run_module(source_build, a, [])
    assert run.failed and run.msg == (f"{bad}: unsafe archive, nothing was built: member 'rccl/x/y' lies under the "
                                      "symlink 'rccl/x'"), run.msg
    assert not (tmp_path / "outside").exists() and not (tmp_path / "opt" / "current").exists()
    assert list((tmp_path / "build").iterdir()) == []  # the unpack folder is removed


def test_directory_source_needs_a_source_id(tmp_path, tarballs):
    a = args(tmp_path, tarballs)
    a["components"][0].update(src=str(REPO / "tests/artifacts/rccl-standin"), sha256=None)
    run = run_module(source_build, a, [])
    assert run.failed and "needs a source_id" in run.msg


def test_check_mode_with_the_source_not_fetched_yet_reports_a_change(tmp_path, tarballs):
    a = args(tmp_path, tarballs)
    a["components"][0]["src"] = str(tmp_path / "not-here.tar.gz")
    run = run_module(source_build, a, [], check_mode=True)
    assert not run.failed and run.result["changed"] and "not on the host yet" in run.msg


@pytest.mark.parametrize("text, files", [
    ("checking file src/graph/paths.cc\nHunk #1 FAILED at 67.\n1 out of 2 hunks FAILED", ["src/graph/paths.cc"]),
    ("checking file a.c\nchecking file src/x.cc\nReversed (or previously applied) patch detected!  Skipping patch.",
     ["src/x.cc"]),
    ("can't find file to patch at input line 3\n|--- a/src/graph/paths.cc\nNo file to patch.  Skipping patch.",
     ["src/graph/paths.cc"]),
    ("checking file a.c\n", []),
])
def test_failing_files_from_patch_output(text, files):
    assert source_build.failing_files(text) == files


# --- real builds of the stand-in (real patch, cmake, c++) ----------------------------------------------------

@needs_tools
def test_real_build_then_converged_rerun_runs_nothing(tmp_path, tarballs):
    a = args(tmp_path, tarballs, tests=True)
    first, failed, ran = real(a)
    assert not failed, first.get("msg")
    assert first["changed"] and first["patches_checked"] == ["p2p-level-user-last.patch"]
    prefix = Path(first["prefix"])
    assert (prefix / "lib/librccl.so").is_file() and (prefix / "bin/sendrecv_perf").is_file()
    assert [argv[0] for argv in ran][:2] == ["patch", "patch"] and ran[0][1] == "--dry-run"
    assert (tmp_path / "opt/current").resolve() == prefix.resolve()
    log = (tmp_path / "opt/.rccl-build.log").read_text()
    assert "[rigbook" in log and "Linking CXX shared library" in log
    # the patch really is in the built library: P2P with PHB on the Intel box of the lab's evidence tree
    second, failed, ran = real(a, diff=True)
    assert not failed and not second["changed"] and ran == [] and second["reasons"] == []
    assert "diff" not in second
    # check mode on the converged host: nothing to do either
    third, failed, ran = real(a, check_mode=True)
    assert not failed and not third["changed"] and ran == []


@needs_tools
def test_changed_installed_library_is_rebuilt(tmp_path, tarballs):
    a = args(tmp_path, tarballs)
    first, failed, _ = real(a)
    assert not failed, first.get("msg")
    lib = Path(first["prefix"]) / "lib/librccl.so"
    lib.resolve().write_bytes(b"not the build\n")
    again, failed, ran = real(a)
    assert not failed and again["changed"] and any("changed since it was built" in r for r in again["reasons"])
    assert lib.resolve().read_bytes().startswith(b"\x7fELF")


@needs_tools
def test_bumped_source_fails_before_building_naming_patch_and_file(tmp_path, tarballs):
    a = args(tmp_path, tarballs, source=rccl_standin.BUMPED_SOURCE, version="2.27.8")
    a["version"] = "2.27.8"
    result, failed, ran = real(a)
    assert failed
    assert "patch p2p-level-user-last.patch no longer applies to rccl 2.27.8" in result["msg"]
    assert "failed on src/graph/paths.cc" in result["msg"] and result["failing_files"] == ["src/graph/paths.cc"]
    assert [argv[:2] for argv in ran] == [["patch", "--dry-run"]]  # nothing else ran: no cmake, no real patch
    assert not (tmp_path / "opt").exists() or not any((tmp_path / "opt").glob("2.27.8-*"))
    # check mode finds the same before anything
    result, failed, _ = real(a, check_mode=True)
    assert failed and "no longer applies" in result["msg"]


@needs_tools
def test_two_patch_sets_coexist_and_the_link_switches_back_without_a_rebuild(tmp_path, tarballs):
    patched, failed, _ = real(args(tmp_path, tarballs))
    assert not failed, patched.get("msg")
    stock, failed, _ = real(args(tmp_path, tarballs, patches=False))
    assert not failed, stock.get("msg")
    assert stock["prefix"].endswith("2.27.7-stock") and patched["prefix"] != stock["prefix"]
    assert os.readlink(tmp_path / "opt/current") == "2.27.7-stock"
    back, failed, ran = real(args(tmp_path, tarballs), diff=True)
    assert not failed and back["changed"] and back["link_changed"] and not back["built"] and ran == []
    assert os.readlink(tmp_path / "opt/current") == Path(patched["prefix"]).name
    assert "2.27.7-stock" in back["diff"]["before"] and Path(patched["prefix"]).name in back["diff"]["after"]


@needs_tools
def test_stand_in_tests_pick_p2p_only_with_the_patch_and_the_level(tmp_path, tarballs):
    """The built stand-ins against the lab's recorded r9700 tree: seed 004's 'patch + PHB, both are needed'."""
    import subprocess

    from rigbook.lab import hardware_trees

    tree = hardware_trees.materialize("x99-r9700", tmp_path / "evidence")
    outputs = {}
    for patches in (True, False):
        result, failed, _ = real(args(tmp_path, tarballs, patches=patches, tests=True))
        assert not failed, result.get("msg")
        for level in ("PHB", None):
            env = {"PATH": os.environ["PATH"], "RIGBOOK_EVIDENCE_ROOT": str(tree), "NCCL_DEBUG": "INFO"}
            if level:
                env["NCCL_P2P_LEVEL"] = level
            proc = subprocess.run([f"{result['prefix']}/bin/sendrecv_perf", "-b", "1G", "-e", "1G", "-g", "2"],
                                  capture_output=True, text=True, env=env, timeout=60)
            assert proc.returncode == 0, proc.stderr
            outputs[patches, level] = proc.stdout
    assert "via P2P/IPC" in outputs[True, "PHB"] and "Avg bus bandwidth    : 9.7500" in outputs[True, "PHB"]
    for key in ((True, None), (False, "PHB"), (False, None)):
        assert "via SHM/direct/direct" in outputs[key] and "Avg bus bandwidth    : 6.9000" in outputs[key], key


@needs_tools
def test_stand_in_all_gather_and_reduce_scatter_print_seed_004_in_the_tools_format(tmp_path, tarballs):
    """all_gather_perf and reduce_scatter_perf of the stand-in, read back by the parser the collectives layer uses:
    seed 004's busbw (AllGather 9.16, ReduceScatter 8.92 GB/s) and algbw = busbw * n/(n-1) on 2 GPUs."""
    import subprocess

    from ansible_collections.rigbook.homelab.plugins.module_utils.collect import collective_bench

    from rigbook.lab import hardware_trees

    tree = hardware_trees.materialize("x99-r9700", tmp_path / "evidence")
    a = args(tmp_path, tarballs, tests=True)
    a["check_files"] += ["bin/all_gather_perf", "bin/reduce_scatter_perf"]
    result, failed, _ = real(a)
    assert not failed, result.get("msg")
    env = {"PATH": os.environ["PATH"], "RIGBOOK_EVIDENCE_ROOT": str(tree), "NCCL_DEBUG": "INFO",
           "NCCL_P2P_LEVEL": "PHB"}
    rows = {}
    for op, redop in (("all_gather", "none"), ("reduce_scatter", "sum")):
        proc = subprocess.run([f"{result['prefix']}/bin/{op}_perf", "-b", "1G", "-e", "1G", "-g", "2"],
                              capture_output=True, text=True, env=env, timeout=60)
        assert proc.returncode == 0, proc.stderr
        assert f"# Collective test starting: {op}_perf" in proc.stdout
        assert f"1073741824     134217728     float  {redop:>6}      -1" in proc.stdout  # count per rank
        rows[op] = collective_bench.rows_from_nccl_tests(op, proc.stdout)
    assert (rows["all_gather"]["busbw_gbs"], rows["all_gather"]["algbw_gbs"]) == (9.16, 18.32)
    assert (rows["reduce_scatter"]["busbw_gbs"], rows["reduce_scatter"]["algbw_gbs"]) == (8.92, 17.84)
    assert rows["all_gather"]["wrong"] == 0 and rows["reduce_scatter"]["out_of_bounds"] == 0


# --- make components (nccl-tests' way: make in the tree, programs copied, an NCCL_HOME of links) ----------------

MAKEFILE = """\
DEP ?=
BUILDDIR ?= build
all: $(BUILDDIR)/hello_perf
$(BUILDDIR)/hello_perf: hello.cc
\tmkdir -p $(BUILDDIR)
\t$(CXX) -I$(DEP)/include -o $@ $< -L$(DEP)/lib -ldemo
"""
HELLO = '#include <cstdio>\n#include "demo.h"\nint main() { printf("%d\\n", demo()); return 0; }\n'


@pytest.fixture
def make_tree(tmp_path):
    """(tarball, sha256, dependency dir): a make project and a shared library it links (libdemo.so.2 only, as a pip
    wheel ships libnccl.so.2 without the unversioned name)."""
    dep = tmp_path / "wheel"
    (dep / "include").mkdir(parents=True)
    (dep / "lib").mkdir()
    (dep / "include/demo.h").write_text("int demo();\n")
    (dep / "demo.cc").write_text("int demo() { return 2277; }\n")
    subprocess.run(["c++", "-shared", "-fPIC", "-Wl,-soname,libdemo.so.2", "-o", str(dep / "lib/libdemo.so.2"),
                    str(dep / "demo.cc")], check=True)
    src = tmp_path / "src"
    (src / "tests-1.0").mkdir(parents=True)
    (src / "tests-1.0/Makefile").write_text(MAKEFILE)
    (src / "tests-1.0/hello.cc").write_text(HELLO)
    tarball = tmp_path / "tests-1.0.tar.gz"
    with tarfile.open(tarball, "w:gz") as tar:
        tar.add(src / "tests-1.0", arcname="tests-1.0")
    return tarball, sha256(tarball), dep


def make_args(tmp_path, make_tree, **comp):
    tarball, digest, dep = make_tree
    component = dict(name="tests", src=str(tarball), sha256=digest, build="make",
                     links={"dep/include": str(dep / "include"), "dep/lib/libdemo.so": str(dep / "lib/libdemo.so.2"),
                            "dep/lib/libdemo.so.2": str(dep / "lib/libdemo.so.2")},
                     make_args=["DEP={prefix}/dep"], make_env={"LD_RUN_PATH": "{prefix}/dep/lib"},
                     install=["build/*_perf"])
    component.update(comp)
    return dict(name="tests", version="1.0", prefix_root=str(tmp_path / "opt"), components=[component],
                check_files=["bin/hello_perf"], build_root=str(tmp_path / "build"), jobs=2)


@needs_tools
def test_make_build_links_the_dependency_copies_the_programs_and_a_rerun_runs_nothing(tmp_path, make_tree):
    a = make_args(tmp_path, make_tree)
    first, failed, ran = real(a)
    assert not failed, first.get("msg")
    prefix = Path(first["prefix"])
    assert [argv[4:6] + argv[7:] for argv in ran] == [["make", "-C", "-j", "2", f"DEP={prefix}/dep"]]  # one make run
    program = prefix / "bin/hello_perf"
    assert subprocess.run([str(program)], capture_output=True, text=True).stdout == "2277\n"
    # it loads the library through the prefix's links (LD_RUN_PATH at link time), whatever the caller's paths
    dynamic = subprocess.run(["readelf", "-d", str(program)], capture_output=True, text=True).stdout
    assert f"[{prefix}/dep/lib]" in dynamic
    assert os.readlink(prefix / "dep/lib/libdemo.so") == str(make_tree[2] / "lib/libdemo.so.2")
    assert first["stamp"]["components"][0]["make_args"] == [f"DEP={prefix}/dep"]
    second, failed, ran = real(a)
    assert not failed and not second["changed"] and ran == [] and second["reasons"] == []


@needs_tools
def test_a_link_pointing_elsewhere_is_a_reason_to_rebuild(tmp_path, make_tree):
    a = make_args(tmp_path, make_tree)
    first, failed, _ = real(a)
    assert not failed, first.get("msg")
    link = Path(first["prefix"]) / "dep/lib/libdemo.so.2"
    link.unlink()
    link.symlink_to("/nonexistent/libdemo.so.2")
    second, failed, _ = real(a, check_mode=True)
    assert not failed and second["changed"]
    assert second["reasons"] == [f"{link} is no link to {make_tree[2] / 'lib/libdemo.so.2'}"]


@pytest.mark.parametrize("comp, words", [
    ({"links": {"../escape": "/tmp/x"}}, "link '../escape' is no relative path inside the prefix"),
    ({"links": {"dep/x": "relative/target"}}, "the target must be an absolute path"),
    ({"install": ["/etc/passwd"]}, "install '/etc/passwd' is no relative path inside the source tree"),
    ({"make_env": {"BAD NAME": "x"}}, "make_env 'BAD NAME'"),
    ({"build": "cmake"}, "make_args, make_env and install are for build: make"),
])
def test_bad_make_component_is_refused_before_anything_runs(tmp_path, make_tree, comp, words):
    result, failed, ran = real(make_args(tmp_path, make_tree, **comp))
    assert failed and words in result["msg"] and ran == []
    assert not (tmp_path / "opt").exists()


@needs_tools
def test_an_install_glob_matching_nothing_fails_naming_it(tmp_path, make_tree):
    result, failed, _ = real(make_args(tmp_path, make_tree, install=["build/*_perf", "build/missing_*"]))
    assert failed and "the build left nothing matching build/missing_*" in result["msg"]
    assert not (tmp_path / "opt/current").exists()


# --- one build for a group: the build host exports, the others install ---------------------------------------

def manifest(path: Path) -> dict:
    """The controller's manifest of an archive: {path: sha256} of its regular files (safe_untar.listing)."""
    return {rel: e["sha256"] for rel, e in safe_untar.listing(str(path)).items() if e["kind"] == "file"}


@needs_tools
def test_a_build_exported_by_one_box_installs_on_another_without_building(tmp_path, make_tree):
    a = dict(make_args(tmp_path, make_tree), export_dir=str(tmp_path / "exports"))
    first, failed, _ = real(a)
    assert not failed, first.get("msg")
    archive = Path(first["export_path"])
    assert archive.name == f"tests-{first['identity_id']}-{first['export_sha256']}.tar.gz"
    assert sha256(archive) == first["export_sha256"]
    # the stamp names every file the build installed
    assert sorted(first["stamp"]["files"]) == ["bin/hello_perf"]
    # the same build exported again is the same bytes (reproducible), so every twin's copy has one sha256
    shutil.rmtree(tmp_path / "opt")
    again, failed, _ = real(a)
    assert not failed and again["export_path"] == str(archive)
    built = (Path(again["prefix"]) / "bin/hello_perf").read_bytes()
    # the other box: nothing of this build on it; it installs the archive instead of building
    shutil.rmtree(tmp_path / "opt")
    other = dict(make_args(tmp_path, make_tree), install_from=str(archive), install_files=manifest(archive))
    installed, failed, ran = real(other)
    assert not failed, installed.get("msg")
    assert ran == [] and installed["built"] is False and installed["installed_from"] == str(archive)
    prefix = Path(installed["prefix"])
    assert (prefix / "bin/hello_perf").read_bytes() == built
    assert subprocess.run([str(prefix / "bin/hello_perf")], capture_output=True, text=True).stdout == "2277\n"
    assert os.readlink(prefix / "dep/lib/libdemo.so") == str(make_tree[2] / "lib/libdemo.so.2")  # its own links
    assert not (tmp_path / "opt/.tests-build.log").exists()  # no build log: nothing was built here
    assert (tmp_path / "opt/current").resolve() == prefix.resolve()
    rerun, failed, ran = real(other)
    assert not failed and not rerun["changed"] and ran == []


def repacked(archive: Path, change) -> Path:
    """ARCHIVE's files and links, CHANGE(dict of name -> bytes) applied to the files, packed again under the name
    export gives it (facts/builds.pack)."""
    with tarfile.open(archive) as tar:
        members = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}
        links = [(m.name, "symlink", m.linkname) for m in tar.getmembers() if m.issym()]
    change(members)
    data = builds.pack([(name, "bytes", body) for name, body in members.items()] + links)
    named = builds.parse_archive_name(archive.name)
    path = archive.with_name(builds.archive_name(named["name"], named["identity_id"],
                                                 hashlib.sha256(data).hexdigest()))
    path.write_bytes(data)
    return path


def restamped(members):
    """The stamp rewritten to name the files as they are (a builder that lies consistently)."""
    stamp = json.loads(members[".rigbook-build.json"])
    stamp["files"] = {n: hashlib.sha256(b).hexdigest() for n, b in members.items() if n != ".rigbook-build.json"}
    members[".rigbook-build.json"] = json.dumps(stamp).encode()


@needs_tools
@pytest.mark.parametrize("attack, why", [
    ("extra file, not in the manifest", "etc/cron.d/x is in it but not in the controller's manifest of it"),
    ("extra file, not in the stamp", "etc/cron.d/x is in it but not in its stamp"),
    ("changed program, the manifest of the original",
     "bin/hello_perf is not the file the controller's manifest names (its sha256 differs)"),
    ("changed program, not as stamped", "bin/hello_perf is not the file its stamp names"),
    ("a file of the manifest missing", "bin/hello_perf of the controller's manifest is not in it"),
    ("another build", "it is another build (its stamp differs in components)"),
])
def test_a_tampered_archive_is_refused_and_nothing_is_installed(tmp_path, make_tree, attack, why):
    exported, failed, _ = real(dict(make_args(tmp_path, make_tree), export_dir=str(tmp_path / "exports")))
    assert not failed, exported.get("msg")
    archive = Path(exported["export_path"])
    genuine = manifest(archive)
    shutil.rmtree(tmp_path / "opt")
    files = None  # the manifest the controller computed of what it holds
    if attack.startswith("extra file"):
        bad = repacked(archive, lambda m: m.update({"etc/cron.d/x": b"* * * * * root touch /tmp/x\n"}))
        files = genuine if "manifest" in attack else None
    elif attack.startswith("changed program"):
        bad = repacked(archive, lambda m: m.update({"bin/hello_perf": b"#!/bin/sh\ntouch /tmp/x\n"}))
        files = genuine if "original" in attack else None
    elif attack == "a file of the manifest missing":
        bad = repacked(archive, lambda m: (m.pop("bin/hello_perf"), restamped(m)))
        files = genuine
    else:
        def other_build(m):
            stamp = json.loads(m[".rigbook-build.json"])
            stamp["components"][0]["make_args"] = ["DEP={prefix}/dep", "EXTRA=1"]
            m[".rigbook-build.json"] = json.dumps(stamp).encode()
        bad = repacked(archive, other_build)
    result, failed, ran = real(dict(make_args(tmp_path, make_tree), install_from=str(bad),
                                    install_files=manifest(bad) if files is None else files))
    assert failed and result["msg"] == f"refused {bad}: {why}; nothing was installed", result["msg"]
    assert ran == [] and not (tmp_path / "opt/current").exists()
    assert [p.name for p in (tmp_path / "opt").iterdir()] == []  # no prefix, no install folder left


@needs_tools
def test_an_archive_whose_bytes_or_build_differ_is_refused_and_nothing_is_installed(tmp_path, make_tree):
    exported, failed, _ = real(dict(make_args(tmp_path, make_tree), export_dir=str(tmp_path / "exports")))
    assert not failed, exported.get("msg")
    archive = Path(exported["export_path"])
    shutil.rmtree(tmp_path / "opt")
    forged = archive.with_name(archive.name.replace(exported["export_sha256"], "0" * 64))
    shutil.copy(archive, forged)
    result, failed, ran = real(dict(make_args(tmp_path, make_tree), install_from=str(forged),
                                    install_files=manifest(archive)))
    assert failed and f"its sha256 is {exported['export_sha256']}, its name says {'0' * 64}" in result["msg"]
    assert ran == [] and not (tmp_path / "opt/current").exists()
    # a box whose build differs (other make arguments) cannot take this one: its name is another identity's
    other = dict(make_args(tmp_path, make_tree, make_args=["DEP={prefix}/dep", "X=1"]), install_from=str(archive),
                 install_files=manifest(archive))
    result, failed, ran = real(other)
    assert failed and "not an archive of this build" in result["msg"]
    assert ran == [] and not (tmp_path / "opt/current").exists()
    assert not [p for p in (tmp_path / "opt").iterdir() if p.name.startswith(".rigbook-install-")]


WHERE = "#include <cstdio>\nint main() { std::puts(__FILE__); return 0; }\n"
CMAKE = ("cmake_minimum_required(VERSION 3.10)\nproject(where CXX)\nadd_executable(where where.cc)\n"
         "install(TARGETS where DESTINATION bin)\n")


@needs_tools
def test_a_cmake_build_that_records_its_source_paths_exports_the_same_bytes_each_time(tmp_path):
    """A compiler writes the source's path (__FILE__, debug info): builds run in one folder per build, not a random
    one, so two builds of the same pins - two boxes of a group, or one box twice - export the same archive."""
    src = tmp_path / "src" / "where-1.0"
    src.mkdir(parents=True)
    (src / "CMakeLists.txt").write_text(CMAKE)
    (src / "where.cc").write_text(WHERE)
    tarball = tmp_path / "where-1.0.tar.gz"
    with tarfile.open(tarball, "w:gz") as tar:
        tar.add(src, arcname="where-1.0")
    a = dict(name="where", version="1.0", prefix_root=str(tmp_path / "opt"), build_root=str(tmp_path / "build"),
             jobs=2, check_files=["bin/where"], export_dir=str(tmp_path / "exports"),
             components=[dict(name="where", src=str(tarball), sha256=sha256(tarball))])
    shas = []
    for _ in range(2):
        shutil.rmtree(tmp_path / "opt", ignore_errors=True)
        result, failed, _ = real(a)
        assert not failed, result.get("msg")
        shas.append(result["export_sha256"])
        printed = subprocess.run([f"{result['prefix']}/bin/where"], capture_output=True, text=True).stdout
        assert printed.startswith(f"{tmp_path}/build/.rigbook-where-{result['identity_id']}/"), printed
    assert shas[0] == shas[1]
