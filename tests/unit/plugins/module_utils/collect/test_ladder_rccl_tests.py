"""The collectives layer running built rccl-tests (AMD, Deliver 6 of issue 12): the programs of nccl_tests_dir run on
any evidence root with the GPU environment file alone and NCCL_DEBUG=INFO, the transport layer reads that run's log,
and with ab the NCCL_P2P_DISABLE=1 run's gain is judged. The programs here are small shell scripts that print
rccl-tests output from their environment (what they got is what they print)."""

from __future__ import annotations

import hashlib
import stat
from pathlib import Path

import pytest
from ansible_collections.rigbook.homelab.plugins.module_utils.collect import collective_bench
from ansible_collections.rigbook.homelab.plugins.module_utils.ladder.climb import Context, climb

from rigbook.lab import hardware_trees

LADDER_VIEW = {"gpu": {"vendor": "amd", "count": 2}, "p2p": {"expected": True, "nccl_p2p_level": "PHB"}}
# A program printing rccl-tests' table: P2P figures when NCCL_P2P_LEVEL=PHB and the "library" is patched
# ($PATCHED_FLAG exists), SHM figures otherwise or with NCCL_P2P_DISABLE=1; its NCCL INFO lines say which.
SCRIPT = r"""#!/bin/sh
[ -n "$RIGBOOK_EVIDENCE_ROOT" ] || { echo "no evidence root" >&2; exit 3; }
[ "$NCCL_DEBUG" = INFO ] || { echo "NCCL_DEBUG not INFO" >&2; exit 3; }
echo "$RIGBOOK_EVIDENCE_ROOT $LD_LIBRARY_PATH" >> "$(dirname "$0")/calls"
bw=6.90; via=SHM/direct/direct; direct=0
[ -n "$NCCL_P2P_LEVEL" ] && echo "h:1:1 [0] NCCL INFO NCCL_P2P_LEVEL set by environment to $NCCL_P2P_LEVEL"
if [ "$NCCL_P2P_LEVEL" = PHB ] && [ -e "$(dirname "$0")/patched" ] && [ "$NCCL_P2P_DISABLE" != 1 ]; then
  bw=%(bw)s; via=P2P/IPC; direct=1
fi
echo "h:1:1 [0] NCCL INFO Check P2P Type isAllDirectP2p $direct directMode 0"
echo "h:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via $via"
echo "h:1:1 [1] NCCL INFO Channel 00/0 : 1[1] -> 0[0] via $via"
echo "#  size   count   type   redop   root   time   algbw   busbw #wrong   time   algbw   busbw #wrong"
echo "   268435456      67108864     float     sum      -1  38904.1    $bw    $bw      0  38904.1    $bw    $bw      0"
echo "# Out of bounds values : 0 OK"
"""


def make_tests_dir(tmp_path: Path, patched=True, bw="9.75") -> Path:
    d = tmp_path / "bin"
    d.mkdir(exist_ok=True)
    for name in ("sendrecv_perf", "all_reduce_perf"):
        (d / name).write_text(SCRIPT % {"bw": bw})
        (d / name).chmod((d / name).stat().st_mode | stat.S_IXUSR)
    if patched:
        (d / "patched").write_text("")
    return d


def env_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "gpu.env"
    path.write_text(text)
    return path


GOOD_ENV = ("# BEGIN amd_rocm\nHSA_ENABLE_IPC_MODE_LEGACY=0\nNCCL_P2P_LEVEL=PHB\n# END amd_rocm\n"
            "# BEGIN rccl\nLD_LIBRARY_PATH=/opt/rigbook/rccl/2.27.7-abc/lib\n# END rccl\n")


def runtime(tmp_path, tree, tdir, envf, ab=True, env=None):
    ctx = Context(str(tree), LADDER_VIEW, options=dict(nccl_tests_dir=str(tdir), env_file=str(envf) if envf else None,
                                                       ab=ab, env=env or {}, collective_bytes=256 << 20))
    return climb(["collectives", "nccl_transport"], ctx)


@pytest.fixture
def tree(tmp_path):
    return hardware_trees.materialize("x99-r9700", tmp_path / "evidence")


def test_read_env_file(tmp_path):
    env, error = collective_bench.read_env_file(str(env_file(
        tmp_path, "# c\n\nexport A='1 2'\nB=\"x\"\nnot a line\nC=\n")))
    assert error is None and env == {"A": "1 2", "B": "x", "C": ""}
    assert collective_bench.read_env_file(str(tmp_path / "missing"))[1].startswith("cannot read")


def test_built_tests_run_under_a_recorded_root_with_the_env_file_and_pass(tmp_path, tree):
    tdir = make_tests_dir(tmp_path)
    verdicts, evidence = runtime(tmp_path, tree, tdir, env_file(tmp_path, GOOD_ENV),
                                 env={"NCCL_P2P_LEVEL": "SYS"})  # ignored: the env file is what serves
    assert [v["status"] for v in verdicts] == ["pass", "pass"], verdicts
    coll = evidence["collectives"]
    assert coll["source"].startswith("rccl-tests") and coll["ab"]["gain"] == round(9.75 / 6.90, 3)
    assert "1.41x" in verdicts[0]["measured"]["p2p_gain"]
    assert evidence["nccl_transport"]["from_tests_run"] and evidence["nccl_transport"]["p2p_level"] == "PHB"
    calls = (tdir / "calls").read_text().splitlines()
    assert len(calls) == 3 and all(c == f"{tree} /opt/rigbook/rccl/2.27.7-abc/lib" for c in calls)


def test_unpatched_library_fails_collectives_naming_the_rccl_role(tmp_path, tree):
    tdir = make_tests_dir(tmp_path, patched=False)
    verdicts, _ = runtime(tmp_path, tree, tdir, env_file(tmp_path, GOOD_ENV))
    assert [v["layer"] for v in verdicts] == ["collectives"] and verdicts[0]["status"] == "fail"
    assert "P2P gain 1.00x" in verdicts[0]["why"]
    assert "re-run the rccl role" in verdicts[0]["remedy"] and "NCCL_P2P_LEVEL=PHB was set" in verdicts[0]["remedy"]


def test_level_missing_from_the_env_file_fails_naming_the_amd_rocm_role(tmp_path, tree):
    tdir = make_tests_dir(tmp_path)
    verdicts, _ = runtime(tmp_path, tree, tdir, env_file(tmp_path, GOOD_ENV.replace("NCCL_P2P_LEVEL=PHB\n", "")))
    assert verdicts[0]["status"] == "fail" and "re-run the amd_rocm role" in verdicts[0]["remedy"]
    assert str(tmp_path / "gpu.env") in verdicts[0]["remedy"]


def test_without_ab_the_shm_run_fails_collectives_on_its_own_log(tmp_path, tree):
    """seed 004's must: the log must say isAllDirectP2p 1 via P2P/IPC; the run's own log says 0, via SHM."""
    tdir = make_tests_dir(tmp_path, patched=False)
    verdicts, _ = runtime(tmp_path, tree, tdir, env_file(tmp_path, GOOD_ENV), ab=False)
    assert [(v["layer"], v["status"]) for v in verdicts] == [("collectives", "fail")]
    assert "isAllDirectP2p 0 (channels via SHM/direct/direct)" in verdicts[0]["why"]
    assert "re-run the rccl role" in verdicts[0]["remedy"]
    # the transport layer above it reads that same log and says the same
    transport = climb(["collectives", "nccl_transport"], Context(str(tree), LADDER_VIEW, options=dict(
        nccl_tests_dir=str(tdir), env_file=str(env_file(tmp_path, GOOD_ENV)))), stop_at_fail=False)[0][1]
    assert transport["status"] == "fail" and "through SHM" in transport["why"]
    assert "re-run the rccl role" in transport["remedy"]


def test_ab_on_a_box_without_p2p_only_reports_the_gain(tmp_path, tree):
    tdir = make_tests_dir(tmp_path, patched=False)
    ctx = Context(str(tree), dict(LADDER_VIEW, p2p={"expected": False}),
                  options=dict(nccl_tests_dir=str(tdir), env_file=str(env_file(tmp_path, GOOD_ENV)), ab=True))
    verdicts, _ = climb(["collectives"], ctx)
    assert verdicts[0]["status"] == "pass" and "1.00x" in verdicts[0]["measured"]["p2p_gain"]


def test_missing_tests_dir_falls_back_to_the_recording(tmp_path, tree):
    verdicts, evidence = runtime(tmp_path, tree, tmp_path / "nothing", None)
    assert evidence["collectives"]["source"].startswith("seed 004") and "ab" not in evidence["collectives"]
    assert [v["status"] for v in verdicts] == ["pass", "pass"]


def test_a_failing_program_is_unknown_not_pass(tmp_path, tree):
    tdir = make_tests_dir(tmp_path)
    (tdir / "sendrecv_perf").write_text("#!/bin/sh\necho boom >&2\nexit 1\n")
    verdicts, evidence = runtime(tmp_path, tree, tdir, env_file(tmp_path, GOOD_ENV), ab=True)
    assert "boom" in evidence["collectives"]["error"] and "ab" not in evidence["collectives"]
    assert verdicts[0]["status"] in ("warn", "unknown")


def _compile(tmp_path: Path, rpath=None) -> tuple:
    """A real program linked against librccl.so.1 (NEEDED), two builds of that library in two folders, and with
    RPATH a DT_RPATH into the second (as torch's wheel points at its bundled copy)."""
    import subprocess

    folders = []
    for name in ("patched", "bundled"):
        folder = tmp_path / name
        folder.mkdir()
        code = 22707 if name == "patched" else 22606
        (folder / "rccl.c").write_text(f'const char *rigbook_which(void) {{ return "{name}"; }}\n'
                                       f'int ncclGetVersion(int *v) {{ *v = {code}; return 0; }}\n')
        subprocess.run(["cc", "-shared", "-fPIC", "-Wl,-soname,librccl.so.1", "-o", str(folder / "librccl.so.1"),
                        str(folder / "rccl.c")], check=True)
        folders.append(folder)
    (tmp_path / "main.c").write_text("const char *rigbook_which(void);\nint main(void) { return !rigbook_which(); }\n")
    flags = [f"-Wl,-rpath,{folders[1]}", "-Wl,--disable-new-dtags"] if rpath else []
    program = tmp_path / "sendrecv_perf"
    subprocess.run(["cc", "-o", str(program), str(tmp_path / "main.c"), f"-L{folders[0]}", "-l:librccl.so.1",
                    *flags], check=True)
    return program, folders


def test_the_library_the_tests_load_is_the_one_the_loader_resolves(tmp_path):
    program, (patched, bundled) = _compile(tmp_path)
    found = collective_bench.resolved_library(str(program), {"LD_LIBRARY_PATH": str(patched)})
    assert found["path"] == str(patched / "librccl.so.1")
    assert found["sha256"] == hashlib.sha256((patched / "librccl.so.1").read_bytes()).hexdigest()
    assert found["version"] == "2.27.7"  # what its ncclGetVersion says
    assert "error" in collective_bench.resolved_library(str(program), {"LD_LIBRARY_PATH": ""})
    # a DT_RPATH is searched before LD_LIBRARY_PATH: the environment does not choose the library then
    (tmp_path / "rpath").mkdir()
    program, (patched, bundled) = _compile(tmp_path / "rpath", rpath=True)
    found = collective_bench.resolved_library(str(program), {"LD_LIBRARY_PATH": str(patched)})
    assert found["path"] == str(bundled / "librccl.so.1") and found["version"] == "2.26.6"
    # a program that is no ELF binary (the scripts above): named, not guessed
    (tmp_path / "scripts").mkdir()
    script = make_tests_dir(tmp_path / "scripts") / "sendrecv_perf"
    assert collective_bench.resolved_library(str(script), {}) == {
        "error": f"ldd {script} exited 1: not a dynamic executable"}


def test_all_gather_and_reduce_scatter_run_when_built_and_are_not_required(tmp_path, tree):
    tdir = make_tests_dir(tmp_path)
    for name in ("all_gather_perf", "reduce_scatter_perf"):
        (tdir / name).write_text(SCRIPT % {"bw": "9.16"})
        (tdir / name).chmod((tdir / name).stat().st_mode | stat.S_IXUSR)
    verdicts, evidence = runtime(tmp_path, tree, tdir, env_file(tmp_path, GOOD_ENV), ab=False)
    assert sorted(r["op"] for r in evidence["collectives"]["results"]) == [
        "all_gather", "all_reduce", "reduce_scatter", "sendrecv"]
    assert verdicts[0]["metrics"]["all_gather_busbw_gbs"] == 9.16
    (tdir / "all_gather_perf").unlink()
    (tdir / "reduce_scatter_perf").unlink()
    _, evidence = runtime(tmp_path, tree, tdir, env_file(tmp_path, GOOD_ENV), ab=False)
    assert sorted(r["op"] for r in evidence["collectives"]["results"]) == ["all_reduce", "sendrecv"]
    (tdir / "sendrecv_perf").unlink()
    _, evidence = runtime(tmp_path, tree, tdir, env_file(tmp_path, GOOD_ENV), ab=False)
    assert evidence["collectives"]["source"].startswith("seed 004")  # a required program missing: the recording


def test_the_collectives_layer_holds_sendrecv_to_the_probe_climbed_below_it(tmp_path, tree):
    """In one climb, p2p_bandwidth's probe (seed 004: 10.29 GB/s) is what sendrecv is compared with."""
    tdir = make_tests_dir(tmp_path, bw="6.90")
    ctx = Context(str(tree), LADDER_VIEW, options=dict(nccl_tests_dir=str(tdir),
                                                       env_file=str(env_file(tmp_path, GOOD_ENV))))
    verdicts, _ = climb(["p2p_bandwidth", "collectives"], ctx)
    assert [(v["layer"], v["status"]) for v in verdicts] == [("p2p_bandwidth", "pass"), ("collectives", "fail")]
    assert "0.67x the peer copy" in verdicts[1]["why"]
