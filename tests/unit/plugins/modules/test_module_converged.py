"""rigbook.homelab.converged in-process on this machine's real files: a role's state written, then judged by the one
read of every role; an edit, another inputs digest, --tags and check mode; bad arguments refused cleanly."""

from __future__ import annotations

from ansible_collections.rigbook.homelab.plugins.modules import converged as module

from tests.helpers.modules import run_module_real

INPUTS = "c" * 64


def write(tmp_path, role, watch, check_mode=False, outputs=None):
    args = {"inputs": INPUTS, "role": role, "watch": watch, "state_dir": str(tmp_path / "states")}
    if outputs:
        args["outputs"] = outputs
    return run_module_real(module, args, check_mode=check_mode)


def read(tmp_path, roles, inputs=INPUTS, force=()):
    return run_module_real(module, {"inputs": inputs, "roles": roles, "force": list(force),
                                    "state_dir": str(tmp_path / "states")})


def test_written_then_read_converged_and_an_edit_runs_only_its_role(tmp_path):
    dropin = tmp_path / "rigbook.cfg"
    dropin.write_text('GRUB_CMDLINE_LINUX_DEFAULT="$GRUB_CMDLINE_LINUX_DEFAULT iommu=pt"\n')
    env = tmp_path / "gpu.env"
    env.write_text("NCCL_P2P_LEVEL=PHB\n")
    result, failed, _ = write(tmp_path, "kernel", {"files": [str(dropin)], "packages": ["dpkg"]})
    assert not failed and result["changed"] is False and result["watched"] == 2
    result, failed, _ = write(tmp_path, "rccl", {"files": [str(env)]}, outputs={"prefix": "/opt/rigbook/rccl/x"})
    assert not failed

    result, failed, ran = read(tmp_path, ["kernel", "rccl", "health"])
    assert not failed and result["changed"] is False
    assert result["roles"]["kernel"]["converged"] and result["roles"]["rccl"]["converged"]
    assert result["roles"]["rccl"]["outputs"] == {"prefix": "/opt/rigbook/rccl/x"}
    assert result["roles"]["health"] == {"converged": False, "why": "no converged state on the box"}
    assert result["pending"] == ["health"]
    assert sum(1 for argv in ran if argv[0] == "dpkg-query") == 1

    env.write_text("NCCL_P2P_LEVEL=SYS\n")
    result, _, _ = read(tmp_path, ["kernel", "rccl"])
    assert result["pending"] == ["rccl"]
    assert result["roles"]["rccl"]["why"] == f"changed since it converged: file:{env}"
    assert "outputs" not in result["roles"]["rccl"]


def test_other_inputs_or_a_role_named_by_tags_run_the_role(tmp_path):
    write(tmp_path, "health", {"files": [str(tmp_path)]})
    result, _, _ = read(tmp_path, ["health"], inputs="d" * 64)
    assert result["roles"]["health"]["why"].startswith("the inputs changed")
    result, _, _ = read(tmp_path, ["health"], force=["health"])
    assert result["roles"]["health"] == {"converged": False, "why": "named by --tags"}


def test_check_mode_writes_nothing(tmp_path):
    result, failed, _ = write(tmp_path, "serve", {"files": [str(tmp_path)]}, check_mode=True)
    assert not failed and "check mode: not written" in result["msg"]
    assert not (tmp_path / "states").exists()


def test_bad_arguments_fail_with_a_message(tmp_path):
    result, failed, _ = run_module_real(module, {"inputs": "not a digest", "roles": ["kernel"]})
    assert failed and result["msg"].startswith("inputs: not a sha256 digest")
    result, failed, _ = run_module_real(module, {"inputs": INPUTS, "roles": ["../../etc/passwd"],
                                                 "state_dir": str(tmp_path)})
    assert failed and result["msg"].startswith("not a role name")
    assert not list(tmp_path.iterdir())


def test_a_boot_watching_state_is_carried_over_the_reboot_the_ladder_judged(tmp_path):
    """This machine's boot id stands for the new boot: a state written in another boot (the run's first) is carried
    over when its layer passed, and the read then finds the role converged."""
    result, failed, _ = write(tmp_path, "kernel", {"boot": True})
    assert not failed
    now = read(tmp_path, ["kernel"])[0]["boot"]
    states = tmp_path / "states" / "kernel.json"
    earlier = states.read_text().replace(now, "00000000-0000-0000-0000-000000000000")
    states.write_text(earlier)
    assert read(tmp_path, ["kernel"])[0]["pending"] == ["kernel"]  # booted since: runs again ...
    args = {"inputs": INPUTS, "roles": ["kernel"], "restamp_boot": "00000000-0000-0000-0000-000000000000",
            "layers": {"kernel_state": "pass"}, "state_dir": str(tmp_path / "states")}
    result, failed, _ = run_module_real(module, args)
    assert not failed and result["changed"] is False
    assert result["carried"] == {"kernel": "kernel_state pass after the reboot"} and result["left"] == {}
    assert read(tmp_path, ["kernel"])[0]["pending"] == []  # ... unless the run that rebooted judged the boot
    result, failed, _ = run_module_real(module, {**args, "restamp_boot": "{{ x }}"})
    assert failed and "restamp_boot: a boot id" in result["msg"]
