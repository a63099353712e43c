"""gpu_env in-process: one file, one block per owner; exact file text, ownership of keys, check and diff mode."""

from __future__ import annotations

import os

import pytest
from ansible_collections.rigbook.homelab.plugins.modules import gpu_env
from helpers.modules import run_module

HEADER = "".join(line + "\n" for line in gpu_env.HEADER)
ROCM = {"HSA_ENABLE_IPC_MODE_LEGACY": "0", "NCCL_P2P_LEVEL": "PHB"}


@pytest.fixture
def path(tmp_path):
    return str(tmp_path / "etc" / "rigbook" / "gpu.env")


def put(path, owner, env, **kw):
    return run_module(gpu_env, {"path": path, "owner": owner, "env": env, **kw})


def text(path):
    with open(path) as handle:
        return handle.read()


def test_first_block_creates_the_file_0644(path):
    run = put(path, "amd_rocm", ROCM)
    assert not run.failed, run.msg
    assert run.commands == [] and run.result["changed"] is True
    assert text(path) == HEADER + "# BEGIN amd_rocm\nHSA_ENABLE_IPC_MODE_LEGACY=0\nNCCL_P2P_LEVEL=PHB\n# END amd_rocm\n"
    assert os.stat(path).st_mode & 0o777 == 0o644
    assert os.stat(os.path.dirname(path)).st_mode & 0o777 == 0o755
    assert run.result["env"] == ROCM and run.result["owners"] == {k: "amd_rocm" for k in ROCM}


def test_two_owners_keep_their_blocks_and_rerun_changes_nothing(path):
    put(path, "amd_rocm", ROCM)
    run = put(path, "rccl", {"LD_LIBRARY_PATH": "/opt/rigbook/rccl/2.27.7-abc/lib"})
    assert run.result["changed"] is True
    both = text(path)
    assert both.endswith("# END amd_rocm\n# BEGIN rccl\nLD_LIBRARY_PATH=/opt/rigbook/rccl/2.27.7-abc/lib\n# END rccl\n")
    for owner, env in (("amd_rocm", ROCM), ("rccl", {"LD_LIBRARY_PATH": "/opt/rigbook/rccl/2.27.7-abc/lib"})):
        again = put(path, owner, env)
        assert again.result["changed"] is False and text(path) == both
    owners = again.result["owners"]
    assert owners["NCCL_P2P_LEVEL"] == "amd_rocm" and owners["LD_LIBRARY_PATH"] == "rccl"


def test_a_dropped_key_leaves_the_block_and_others_stay(path):
    put(path, "amd_rocm", ROCM)
    put(path, "rccl", {"LD_LIBRARY_PATH": "/x/lib"})
    run = put(path, "amd_rocm", {"HSA_ENABLE_IPC_MODE_LEGACY": "0"})
    assert run.result["changed"] is True
    assert "NCCL_P2P_LEVEL" not in text(path) and "LD_LIBRARY_PATH=/x/lib" in text(path)


def test_a_key_owned_by_another_block_is_refused(path):
    put(path, "amd_rocm", ROCM)
    before = text(path)
    run = put(path, "rccl", {"NCCL_P2P_LEVEL": "SYS"})
    assert run.failed and "the block 'amd_rocm' already sets it" in run.msg and "NCCL_P2P_LEVEL" in run.msg
    assert text(path) == before


def test_a_hand_written_line_is_kept_and_owns_its_key(path):
    os.makedirs(os.path.dirname(path))
    with open(path, "w") as handle:
        handle.write("NCCL_DEBUG=WARN\n")
    run = put(path, "amd_rocm", ROCM)
    assert not run.failed and text(path).startswith(HEADER + "NCCL_DEBUG=WARN\n# BEGIN amd_rocm\n")
    refused = put(path, "rccl", {"NCCL_DEBUG": "INFO"})
    assert refused.failed and "'unmanaged'" in refused.msg


def test_values_with_spaces_are_quoted_and_shell_specials_refused(path):
    run = put(path, "amd_rocm", {"HSA_TOOLS_LIB": "a b", "FLAG": True})
    assert not run.failed and 'HSA_TOOLS_LIB="a b"\n' in text(path) and "FLAG=1\n" in text(path)
    assert run.result["env"]["HSA_TOOLS_LIB"] == "a b"
    for bad in ("$HOME", 'x"y', "a\\b", "`id`"):
        refused = put(path, "amd_rocm", {"X": bad})
        assert refused.failed and "quote, backslash, $ or backtick" in refused.msg
    assert put(path, "amd_rocm", {"1BAD": "x"}).failed


def test_check_mode_writes_nothing_and_diff_shows_the_file(path):
    run = run_module(gpu_env, {"path": path, "owner": "amd_rocm", "env": ROCM}, check_mode=True, diff=True)
    assert run.result["changed"] is True and not os.path.exists(path)
    assert run.result["diff"]["before"] == "" and "NCCL_P2P_LEVEL=PHB" in run.result["diff"]["after"]


def test_wrong_mode_is_fixed_and_absent_removes_the_block(path):
    put(path, "amd_rocm", ROCM)
    put(path, "rccl", {"LD_LIBRARY_PATH": "/x/lib"})
    os.chmod(path, 0o600)
    assert put(path, "amd_rocm", ROCM).result["changed"] is True and os.stat(path).st_mode & 0o777 == 0o644
    run = put(path, "rccl", {}, state="absent")
    assert run.result["changed"] is True and "rccl" not in text(path) and "# BEGIN amd_rocm" in text(path)
    assert put(path, "amd_rocm", {}, state="absent").result["changed"] is True and not os.path.exists(path)


def test_a_link_in_the_files_place_is_never_written_through(path, tmp_path):
    elsewhere = tmp_path / "elsewhere.env"
    elsewhere.write_text("KEEP=1\n")
    os.makedirs(os.path.dirname(path))
    os.symlink(elsewhere, path)
    run = put(path, "amd_rocm", ROCM)
    assert run.failed and run.msg.startswith(f"could not write {path}: ") and "symbolic link" in run.msg
    assert elsewhere.read_text() == "KEEP=1\n"
