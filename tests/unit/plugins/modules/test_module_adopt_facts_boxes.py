"""adopt_facts and the mapping on the boxes adopt exists for, as their owners built them (issue 35):

- seed 000's 3080 box: the engine started as the write-up starts it (`sglang serve ...`, section 四, from a shell
  under the owner's user: tests/fixtures/adopt/seed-000-sglang-serve.txt), the P2P fork installed the fork's way
  (`make modules_install`: kernel/drivers/video/nvidia.ko, no DKMS), the .run userspace in /usr/lib. Its venv, lock,
  CUDA pins and serve profile are read from every way SGLang is started exactly as from `-m sglang.launch_server`.
- the real single-H200 cloud VM (../shared/research/real-gpu-run.md): its /proc and /sys are the real capture
  tests/fixtures/evidence/h200-vm; the driver's libraries in /usr/local/nvidia/lib64, no /lib/modules, no EFI, no
  GRUB, as the run notes record them.
- seed 004's R9700 box: ROCm from amdgpu-install's own apt sources (tests/fixtures/adopt/apt: rocm.list,
  amdgpu.list reconstructed from AMD's documented layout) and their keyring /etc/apt/keyrings/rocm.gpg (its bytes
  constructed); dpkg-query and apt-cache policy in their formats.

The box is a system root laid out here (a process as Linux shows it: NUL-separated cmdline and environ, status with
its Uid line, cgroup v2; a venv as pip leaves it: pyvenv.cfg and dist-info folders); the srcversion and the
kernel's build line of seed 000's module are constructed (the write-up does not print them). Commands answered from
the table run_module checks (dpkg-query, dkms status: the old DKMS module cleared, so it lists nothing).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shlex
import shutil

import pytest
from ansible_collections.rigbook.homelab.plugins.module_utils.facts import packages
from ansible_collections.rigbook.homelab.plugins.modules import adopt_facts
from ansible_collections.rigbook.homelab.plugins.plugin_utils.host_vars_schema import schema_problems
from helpers.modules import ok, run_module

from rigbook import adopt, runs
from rigbook.adopt import command, emit

OWNER, UID = "kk", 1000
HOME = f"/home/{OWNER}"
VENV = f"{HOME}/venv"
SITE = VENV + "/lib/python3.12/site-packages"
RELEASE = "7.0.0-31-generic"
SEED_CMDLINE = (f"BOOT_IMAGE=/boot/vmlinuz-{RELEASE} root=UUID=0c4e2f6a-1b7d-4f55-9d1e-2b8f3f0c9a11 ro quiet splash "
                "intel_iommu=on iommu=pt vt.handoff=7")
SRCVERSION = "5C0F3B1E9A7D2C4B8E6F1A3D"  # constructed: 24 hex digits as modpost writes them
WHEELS = (("sglang", "0.5.18"), ("nvidia_cuda_nvcc", "13.0.88"), ("nvidia_cuda_crt", "13.0.88"),
          ("nvidia_nvvm", "13.0.88"), ("nvidia_cuda_runtime", "13.0.96"), ("torch", "2.9.1"))


def seed_args(fixtures):
    """The engine's own arguments as the owner's shell hands them to `sglang serve`: the write-up's lines joined
    (a backslash-newline is no word), split as the shell splits, a leading ~ expanded to the owner's home."""
    typed = (fixtures / "adopt/seed-000-sglang-serve.txt").read_text().replace("\\\n", " ")
    words = [HOME + w[1:] if w.startswith("~/") else w for w in shlex.split(typed)]
    assert words[:2] == ["sglang", "serve"]
    return words[2:]


STARTS = {
    # the console script through its shebang: the kernel runs the venv's python with the script's path
    "sglang serve": lambda args: [f"{VENV}/bin/python3", f"{VENV}/bin/sglang", "serve", *args],
    "python -m sglang.launch_server": lambda args: [f"{VENV}/bin/python3", "-m", "sglang.launch_server", *args],
    "python -m sglang.cli.main serve": lambda args: [f"{VENV}/bin/python3", "-m", "sglang.cli.main", "serve", *args],
    # typed with the venv activated: a bare python3, found in the PATH of the process's environment
    "python3 <venv>/bin/sglang serve": lambda args: ["python3", f"{VENV}/bin/sglang", "serve", *args],
}


def _process(system, pid, argv, environ=(), uid=UID, ppid=1, cgroup=None):
    folder = system / "proc" / str(pid)
    folder.mkdir(parents=True)
    (folder / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")
    (folder / "environ").write_bytes(b"\0".join(e.encode() for e in environ) + b"\0")
    (folder / "status").write_text(f"Name:\tpython3\nPid:\t{pid}\nPPid:\t{ppid}\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n")
    (folder / "cgroup").write_text(cgroup or f"0::/user.slice/user-{uid}.slice/session-2.scope\n")
    (folder / "maps").write_text("")


def _write(system, path, data=""):
    target = system / path.lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(data)


def seed_000(tmp_path, argv):
    """Seed 000's box with its engine started by ARGV (pid 4100), its forked, spawned and renamed workers beside."""
    system = tmp_path / "system"
    _write(system, "/proc/sys/kernel/osrelease", RELEASE + "\n")
    _write(system, "/proc/cmdline", SEED_CMDLINE + "\n")
    _write(system, "/etc/passwd", f"root:x:0:0:root:/root:/bin/bash\n{OWNER}:x:{UID}:{UID}::{HOME}:/bin/bash\n")
    _write(system, "/etc/default/grub", 'GRUB_DEFAULT=0\nGRUB_CMDLINE_LINUX_DEFAULT="quiet splash intel_iommu=on '
                                        'iommu=pt"\n')
    # the fork as its own `make modules_install` left it, the old DKMS module cleared and depmod run
    modules = f"/lib/modules/{RELEASE}"
    for name in ("nvidia", "nvidia-uvm", "nvidia-modeset", "nvidia-drm", "nvidia-peermem"):
        _write(system, f"{modules}/kernel/drivers/video/{name}.ko")
    _write(system, f"{modules}/modules.dep",
           "kernel/drivers/video/nvidia-modeset.ko: kernel/drivers/video/nvidia.ko\n"
           "kernel/drivers/video/nvidia.ko:\nkernel/drivers/video/nvidia-uvm.ko: kernel/drivers/video/nvidia.ko\n")
    _write(system, "/sys/module/nvidia/version", "615.71.09\n")
    _write(system, "/sys/module/nvidia/srcversion", SRCVERSION + "\n")
    _write(system, "/proc/driver/nvidia/version", "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  615.71.09"
                                                 "  Release Build  (kk@x99)  \nGCC version:  gcc version 13.3.0 "
                                                 "(Ubuntu 13.3.0-6ubuntu2~24.04)\n")
    for lib in ("libnvidia-ml.so.615.71.09", "libcuda.so.615.71.09", "libcuda.so.1"):  # the .run userspace's
        _write(system, f"/usr/lib/x86_64-linux-gnu/{lib}")
    # the owner's venv: made by hand, the aligned CUDA wheels pip-installed in it
    _write(system, f"{VENV}/pyvenv.cfg", "home = /usr/bin\n")
    _write(system, f"{VENV}/bin/python3")
    _write(system, f"{VENV}/bin/sglang", f"#!{VENV}/bin/python3\nfrom sglang.cli.main import main\nmain()\n")
    for name, version in WHEELS:
        info = f"{SITE}/{name}-{version}.dist-info"
        _write(system, f"{info}/METADATA", f"Name: {name}\nVersion: {version}\n")
        _write(system, f"{info}/RECORD", f"{info.rsplit('/', 1)[1]}/METADATA,,\n")
    for top, dirs, names in os.walk(system / VENV.lstrip("/")):
        for name in dirs + names:
            os.chown(os.path.join(top, name), UID, UID)
    os.chown(system / VENV.lstrip("/"), UID, UID)
    environ = [f"PATH={VENV}/bin:/usr/local/bin:/usr/bin:/bin", f"HOME={HOME}", "CUDA_PATH=" + SITE + "/nvidia/cu13"]
    _process(system, 4100, argv, environ)
    _process(system, 4188, argv, environ, ppid=4100)  # a forked worker: the same command line
    _process(system, 4190, [f"{VENV}/bin/python3", "-c", "from multiprocessing.spawn import spawn_main; "
                            "spawn_main(tracker_fd=5, pipe_handle=7)", "--multiprocessing-fork"], environ, ppid=4100)
    _process(system, 4191, ["sglang::scheduler_TP0"], environ, ppid=4100)  # renamed by the engine (setproctitle)
    _process(system, 4192, [f"{VENV}/bin/python3", "-c", "from multiprocessing.resource_tracker import main;main(6)"],
             environ, ppid=4100)
    return system


COMMANDS = [(packages.DPKG_QUERY + ["linux-*"], ok("")), (["dkms", "status"], ok("")), (packages.DPKG_QUERY, ok(""))]


def _adopt_facts(system, **args):
    run = run_module(adopt_facts, {"system": str(system), "evidence_root": str(system), **args}, COMMANDS)
    assert not run.failed, run.msg
    return run.result["facts"]


@pytest.fixture
def seed_facts(tmp_path, fixtures):
    """{start form: what adopt_facts read} of seed 000's box started each way."""
    found = {}
    for number, (form, start) in enumerate(STARTS.items()):
        found[form] = _adopt_facts(seed_000(tmp_path / str(number), start(seed_args(fixtures))), serve_user=OWNER)
    return found


def test_every_way_sglang_is_started_is_one_engine_read_whole(seed_facts, fixtures):
    args = seed_args(fixtures)
    assert "/home/kk/models/Qwen3.8-27B-AWQ" in args and "~/models/Qwen3.8-27B-AWQ" not in " ".join(args)
    for form, facts in seed_facts.items():
        # one engine: the forked worker is its child, the spawned workers, the resource tracker and the renamed
        # scheduler start none
        [engine] = facts["engines"]
        assert engine["pid"] == 4100 and engine["args"] == args, form
        assert engine["venv"] == VENV and engine["unit"] is None, form
        assert {p["name"] for p in engine["packages"]} == {"sglang", "nvidia-cuda-nvcc", "nvidia-cuda-crt",
                                                           "nvidia-nvvm", "nvidia-cuda-runtime", "torch"}, form
    # exactly as from `-m sglang.launch_server`: everything but the command line itself
    reference = seed_facts["python -m sglang.launch_server"]
    for form, facts in seed_facts.items():
        assert _without_argv(facts) == _without_argv(reference), form


def _without_argv(facts):
    return {**facts, "engines": [{k: v for k, v in e.items() if k != "argv"} for e in facts["engines"]]}


def test_seed_000_is_adopted_whole_from_its_sglang_serve(seed_facts, tmp_path):
    adopted = {form: adopt.adopt_of(facts, "x99-3080", tmp_path) for form, facts in seed_facts.items()}
    variables, comments, unpinned, notes, files = adopted["sglang serve"]
    for form, found in adopted.items():  # the same pins, profile, lock and notes whichever way it was started
        assert found[0] == variables and found[4] == files and found[3] == notes, form
    [profile] = variables["rigbook_serve"]
    assert profile["model_path"] == "/home/kk/models/Qwen3.8-27B-AWQ" and profile["tp_size"] == 2
    assert profile["mem_fraction_static"] == 0.88 and profile["custom_all_reduce"] is False
    assert profile["context_length"] == 200000 and profile["max_total_tokens"] == 185000
    assert profile["speculative"]["draft_model_path"] == "/home/kk/models/Qwen3.8-27B-DFlash2-W4A16"
    assert profile["extra_args"][-2:] == ["--default-chat-template-kwargs", '{"reasoning_effort": "medium"}']
    pins = variables["rigbook_pins"]
    assert list(pins) == ["kernel", "nvidia_driver", "cuda_toolchain", "sglang"]  # the host model's order
    assert pins["sglang"] == {"version": "0.5.18", "venv": VENV, "lock": "locks/x99-3080-sglang-0.5.18.txt"}
    assert pins["cuda_toolchain"]["version"] == "13.0.88" and pins["cuda_toolchain"]["venv"] == VENV
    assert pins["cuda_toolchain"]["versions"] == {"nvidia-cuda-runtime": "13.0.96"}
    assert "nvidia-cuda-nvcc==13.0.88" in files["locks/x99-3080-sglang-0.5.18.txt"]
    # the kernel keeps only the P2P stack's boot words; the driver is the loaded module, its file a note
    assert pins["kernel"]["cmdline"] == ["intel_iommu=on", "iommu=pt"] and "rigbook_manage" not in variables
    assert pins["nvidia_driver"] == {"version": "615.71.09", "userspace_version": "615.71.09"}
    assert comments[("rigbook_pins", "nvidia_driver", "version")] == "/sys/module/nvidia/version: the loaded module"
    assert comments[("rigbook_pins", "nvidia_driver", "userspace_version")].startswith(
        "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.615.71.09")
    [module] = [n for n in notes if n.startswith("the loaded nvidia module")]
    assert f"615.71.09 (open, srcversion {SRCVERSION})" in module
    assert f"/lib/modules/{RELEASE}/kernel/drivers/video/nvidia.ko (/lib/modules/{RELEASE}/modules.dep)" in module
    assert "installed by hand, not by DKMS" in module and "make modules_install" in module
    assert any(u.startswith("rigbook_pins.nvidia_driver: fork_repo and commit") and SRCVERSION in u
               and "installed by make modules_install" in u for u in unpinned)
    assert not [n for n in notes if "RECORD" in n]  # sglang as pip installed it: nothing changed
    assert emit.load(adopt.render("x99-3080", variables, comments, unpinned, notes)) == variables
    assert schema_problems(variables) == []


def test_the_owners_engine_is_read_only_when_serve_user_names_the_owner(tmp_path, fixtures):
    system = seed_000(tmp_path, STARTS["sglang serve"](seed_args(fixtures)))
    facts = _adopt_facts(system)  # serve_user left at rigbook-serve
    assert facts["engines"] == []
    assert any("/proc/4100 runs as user kk: skipped" in n for n in facts["checks"]["notes"])


# --- the real single-H200 cloud VM ----------------------------------------------------------------------------------

def h200_vm(tmp_path, fixtures):
    """The VM as the run found it: the captured /proc and /sys, its userspace in /usr/local/nvidia (lib64 and bin),
    nothing under /lib/modules, /boot empty, no EFI, no GRUB."""
    system = tmp_path / "vm"
    shutil.copytree(fixtures / "evidence/h200-vm", system)
    for lib in ("libnvidia-ml.so.580.159.04", "libcuda.so.580.159.04", "libcuda.so.1"):
        _write(system, f"/usr/local/nvidia/lib64/{lib}")
    _write(system, "/usr/local/nvidia/bin/nvidia-smi")
    (system / "boot").mkdir()
    _write(system, "/etc/passwd", "root:x:0:0:root:/root:/bin/bash\n")
    return system


def test_the_vm_is_read_as_a_box_whose_host_boots_it(tmp_path, fixtures):
    facts = _adopt_facts(h200_vm(tmp_path, fixtures))
    assert facts["boot"] == {"modules_dir": False, "efi": False, "grub": []}
    driver = facts["nvidia_driver"]
    assert driver["loaded"] is True and driver["version"] == "580.159.04" and driver["open"] is True
    assert driver["file"] is None and driver["installed_by"] == "unknown"
    assert driver["userspace"] == {"version": "580.159.04", "from": "library",
                                   "where": "/usr/local/nvidia/lib64/libnvidia-ml.so.580.159.04"}
    assert facts["nvidia_userspace"] == "580.159.04"  # no longer missed: not under /usr/lib*


def test_the_vm_is_adopted_without_its_boot_words_and_says_what_it_leaves(tmp_path, fixtures):
    facts = _adopt_facts(h200_vm(tmp_path, fixtures))
    variables, comments, unpinned, notes = adopt.variables_of(facts)
    # rigbook does not manage this box's kernel or driver: said, with why, instead of pinning that kernel
    assert variables["rigbook_manage"] == {"kernel": False, "nvidia_driver": False}
    assert "no /lib/modules/6.18.44-fc-v973-gpu, no EFI and no GRUB" in comments[("rigbook_manage",)]
    assert "kernel" not in variables["rigbook_pins"] and schema_problems(variables) == []
    # the driver is still pinned from the loaded module (the ladder judges it), without asking for the fork's files
    assert variables["rigbook_pins"]["nvidia_driver"] == {"version": "580.159.04", "userspace_version": "580.159.04"}
    assert not [u for u in unpinned if u.startswith(("rigbook_pins.kernel", "rigbook_pins.nvidia_driver"))]
    # the CUDA toolchain is named as not pinned (the run's adopt said nothing of it)
    assert any(u.startswith("rigbook_pins.cuda_toolchain: no nvidia-cuda-nvcc wheel") for u in unpinned)
    # every boot word is left alone and listed; nothing after "--" is a kernel parameter
    [left] = [n for n in notes if n.startswith("rigbook_manage:")]
    for word in ("console=ttyS0", "panic=1", "rdinit=/process_api", "pci=realloc=off", "reboot=k"):
        assert word in left
    text = adopt.render("h200", variables, comments, unpinned, notes)
    assert "--firecracker-init" not in text and "0.0.0.0:2024" not in text
    assert "console=ttyS0" not in re.sub(r"(?m)^#.*$", "", text)  # only in comments, never a value
    assert emit.load(text) == variables
    assert "\nrigbook_manage:  # no /lib/modules/6.18.44-fc-v973-gpu, no EFI and no GRUB" in text


def test_a_vm_driver_with_no_library_found_is_named_not_skipped(tmp_path, fixtures):
    system = h200_vm(tmp_path, fixtures)
    shutil.rmtree(system / "usr/local/nvidia/lib64")
    (system / "var/lib/rigbook/commands/nvidia-smi-version.txt").unlink()
    (system / "var/lib/rigbook/commands/nvidia-smi-q.txt").unlink()
    facts = _adopt_facts(system)
    _, _, unpinned, _ = adopt.variables_of(facts)
    assert any(u.startswith("rigbook_pins.nvidia_driver.userspace_version: no libnvidia-ml.so.VERSION")
               for u in unpinned)
    assert any(u.startswith("rigbook_pins.cuda_toolchain") for u in unpinned)


# --- seed 004's ROCm from amdgpu-install's own apt sources -----------------------------------------------------------

KEYRING = b"stand-in for AMD's dearmored key (constructed bytes)\n"
ROCM_DPKG = ("bash\tii \t5.2.21-2ubuntu4\nrocm-core\tii \t7.1.0.70100-38~24.04\nrocminfo\tii \t1.0.0.70100-38~24.04\n"
             "rocm-smi-lib\tii \t7.8.0.70100-38~24.04\nhip-runtime-amd\tii \t7.1.25424.70100-38~24.04\n"
             "amdgpu-install\tii \t7.1.70100-1\n")
# `apt-cache policy rocm-core` in apt's format, the version offered by amdgpu-install's rocm.list
ROCM_POLICY = """rocm-core:
  Installed: 7.1.0.70100-38~24.04
  Candidate: 7.1.0.70100-38~24.04
  Version table:
 *** 7.1.0.70100-38~24.04 500
        500 https://repo.radeon.com/rocm/apt/7.1 noble/main amd64 Packages
        100 /var/lib/dpkg/status
"""


def seed_004(tmp_path, fixtures):
    """Seed 004's box as amdgpu-install leaves it: rocm.list, amdgpu.list, their keyring, Ubuntu's own sources."""
    system = tmp_path / "r9700"
    _write(system, "/proc/sys/kernel/osrelease", "6.8.12-r9700-p2p-dma44\n")
    _write(system, "/proc/cmdline", "BOOT_IMAGE=/boot/vmlinuz-6.8.12-r9700-p2p-dma44 root=/dev/sda2 ro iommu=pt\n")
    _write(system, "/etc/passwd", "root:x:0:0:root:/root:/bin/bash\n")
    _write(system, "/opt/rocm/.info/version", "7.1.0-38\n")
    for name in ("rocm.list", "amdgpu.list", "ubuntu.sources", "sources.list"):
        where = "/etc/apt/sources.list" if name == "sources.list" else f"/etc/apt/sources.list.d/{name}"
        _write(system, where, (fixtures / "adopt/apt" / name).read_text())
    (system / "etc/apt/keyrings").mkdir(parents=True)
    (system / "etc/apt/keyrings/rocm.gpg").write_bytes(KEYRING)
    return system


def _adopt_rocm(system):
    commands = [(packages.DPKG_QUERY + ["linux-*"], ok("")), (["dkms", "status"], ok("")),
                (packages.DPKG_QUERY, ok(ROCM_DPKG)), (["apt-mark", "showmanual"], ok("rocm-core\nbash\n")),
                (packages.POLICY + ["rocm-core"], ok(ROCM_POLICY))]
    run = run_module(adopt_facts, {"system": str(system), "evidence_root": str(system)}, commands)
    assert not run.failed, run.msg
    return run.result["facts"]


def test_amdgpu_installs_sources_are_read_by_the_one_parser_and_pinned(tmp_path, fixtures):
    facts = _adopt_rocm(seed_004(tmp_path, fixtures))
    digest = hashlib.sha256(KEYRING).hexdigest()
    assert facts["apt_keyrings"]["/etc/apt/keyrings/rocm.gpg"] == digest
    assert [(e["file"], e["format"]) for e in facts["apt_sources"]] == [
        ("/etc/apt/sources.list.d/amdgpu.list", "one-line"), ("/etc/apt/sources.list.d/rocm.list", "one-line"),
        ("/etc/apt/sources.list.d/ubuntu.sources", "deb822"), ("/etc/apt/sources.list.d/ubuntu.sources", "deb822")]
    variables, comments, unpinned, notes = adopt.variables_of(facts)
    assert schema_problems(variables) == []
    rocm = variables["rigbook_pins"]["rocm"]
    assert rocm["repo"] == {"url": "https://repo.radeon.com/rocm/apt/7.1", "suite": "noble", "components": ["main"],
                            "key_url": "file:///etc/apt/keyrings/rocm.gpg", "key_sha256": digest}
    assert rocm["amdgpu_repo"] == {"url": "https://repo.radeon.com/amdgpu/7.1/ubuntu", "suite": "noble",
                                   "components": ["main"], "key_url": "file:///etc/apt/keyrings/rocm.gpg",
                                   "key_sha256": digest}
    assert comments[("rigbook_pins", "rocm", "amdgpu_repo", "url")].startswith("/etc/apt/sources.list.d/amdgpu.list")
    assert rocm["dkms"] is False and not [u for u in unpinned if u.startswith("rigbook_pins.rocm")]
    # the existing entries, each with its file, format, keyring and sha256: the amd_rocm role replaces them
    for file, line in (("rocm.list", "ROCm's repository deb https://repo.radeon.com/rocm/apt/7.1 noble main"),
                       ("amdgpu.list", "AMD's graphics repository deb https://repo.radeon.com/amdgpu/7.1/ubuntu "
                                       "noble main")):
        assert (f"existing apt source /etc/apt/sources.list.d/{file} (one-line): {line}, Signed-By "
                f"/etc/apt/keyrings/rocm.gpg (sha256 {digest}): the amd_rocm role replaces it") in "\n".join(notes)
    assert not [n for n in notes if "ubuntu.sources" in n]
    assert emit.load(adopt.render("x99-r9700", variables, comments, unpinned, notes)) == variables


def test_a_graphics_repository_whose_keyring_was_not_read_is_said_not_pinned(tmp_path, fixtures):
    system = seed_004(tmp_path, fixtures)
    (system / "etc/apt/keyrings/rocm.gpg").unlink()
    variables, _, unpinned, _ = adopt.variables_of(_adopt_rocm(system))
    assert "amdgpu_repo" not in variables["rigbook_pins"]["rocm"] and "repo" not in variables["rigbook_pins"]["rocm"]
    assert any(u.startswith("rigbook_pins.rocm.amdgpu_repo: AMD's graphics repository "
                            "https://repo.radeon.com/amdgpu/7.1/ubuntu") and "not one keyring file adopt read" in u
               for u in unpinned)


def test_adopt_on_the_vm_writes_a_file_its_inventory_validates_with_but_for_the_toolchain(tmp_path, fixtures,
                                                                                           monkeypatch, capsys):
    """`provision adopt h200 -i inv -o FILE` as the run did it (its inventory: tests/fixtures/adopt/h200-vm-hosts.yml),
    with what adopt_facts reads on the VM stored by the run: the check reads FILE as h200's host_vars and names only
    the CUDA toolchain (no kernel .debs, no driver fork: rigbook does not manage them there)."""
    facts = _adopt_facts(h200_vm(tmp_path, fixtures))
    inv = tmp_path / "inv"
    inv.mkdir()
    (inv / "hosts.yml").write_text((fixtures / "adopt/h200-vm-hosts.yml").read_text())
    monkeypatch.setenv("RIGBOOK_STATE_DIR", str(tmp_path / "state"))

    def stored(options):
        folder = runs.runs_dir() / "adopt-recorded" / command.FACTS_DIR
        folder.mkdir(parents=True)
        (folder / "h200.json").write_text(json.dumps(facts))
        return 0

    monkeypatch.setattr(command, "run_playbook", stored)
    out = io.StringIO()
    assert command.adopt_command("h200", str(inv), output=str(tmp_path / "adopted.yml"), stream=out) == 1
    err = capsys.readouterr().err
    assert "inventory is not ready: 1 input the play needs is missing" in err
    assert f"{tmp_path / 'adopted.yml'}: host h200: rigbook_pins.cuda_toolchain.version: needed by" in err
    assert "not pinned: rigbook_pins.cuda_toolchain" in out.getvalue()
    assert "note: rigbook_manage: no /lib/modules/6.18.44-fc-v973-gpu" in out.getvalue()
