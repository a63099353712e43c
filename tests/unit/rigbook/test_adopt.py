"""rigbook/adopt: what adopt_facts read, turned into rigbook_* variables with where each was read, written as YAML
that reads back as exactly those values; `provision adopt`'s bad input (exit 2, nothing read or written); and what a
box says is data: Jinja2 in every field adopt copies is never run by Ansible (real ansible-playbook on the written
inventory, beside a control written without !unsafe that does run it), control characters, environment names,
credentials in URLs and the admin API key stay out of the file and the terminal."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys

import yaml
from ansible_collections.rigbook.homelab.plugins.modules import adopt_facts
from helpers.cli import REPO, provision

from rigbook import adopt, runs
from rigbook.adopt import command, emit
from rigbook.paths import link_collection

link_collection()

RELEASE = "6.8.12-r9700-p2p-dma44"
FACTS = {
    "kernel": {"release": RELEASE, "cmdline": ["iommu=pt", "amd_iommu=on"], "grub_default": "0",
               "grub_default_file": "/etc/default/grub",
               "packages": [{"name": f"linux-image-{RELEASE}", "version": "6.8.12-1", "origin": "local",
                             "sources": ["100 /var/lib/dpkg/status"],
                             "deb": {"path": "/home/a/image.deb", "sha256": "a" * 64}},
                            {"name": f"linux-headers-{RELEASE}", "version": "6.8.12-1", "origin": "local",
                             "sources": ["100 /var/lib/dpkg/status"], "deb": None}]},
    "engines": [{"pid": 4100, "unit": "sglang.service", "venv": "/opt/v",
                 "args": ["--model-path", "/srv/models/qwen", "--tp", "2", "--api-key", "********",
                          "--enable-metrics"],
                 "env": {"NCCL_P2P_LEVEL": "PHB", "HSA_X\n#y: z": "a\"b\n- c"}, "secret_env": ["SGLANG_API_KEY"],
                 "packages": [{"name": "sglang", "version": "0.5.23",
                               "install": {"vcs": "git", "url": "https://github.com/sgl-project/sglang.git",
                                           "commit": "c" * 40}}]},
                {"pid": 5200, "unit": None, "venv": None, "args": ["--model-path", "/srv/models/draft"], "env": {},
                 "secret_env": [], "packages": []}],
}


def test_the_adopted_variables_with_where_each_was_read():
    variables, comments, unpinned, notes = adopt.variables_of(FACTS)
    assert variables["rigbook_pins"]["kernel"] == {
        "release": RELEASE, "source": "debs", "debs": [{"path": "/home/a/image.deb", "sha256": "a" * 64}],
        "cmdline": ["iommu=pt", "amd_iommu=on"]}
    # the venv made by hand is pinned: kept and stamped by the sglang role, never replaced
    assert variables["rigbook_pins"]["sglang"] == {"version": "0.5.23", "venv": "/opt/v",
                                                   "lock": "locks/HOST-sglang-0.5.23.txt"}
    assert [p["name"] for p in variables["rigbook_serve"]] == ["sglang", "engine"]
    assert variables["rigbook_serve"][0]["extra_args"] == ["--enable-metrics"]
    assert comments[("rigbook_serve", 0)] == "/proc/4100/cmdline (unit sglang.service)"
    assert comments[("rigbook_serve", 1)] == "/proc/5200/cmdline (started from a shell, no unit)"
    assert "c" * 40 in comments[("rigbook_pins", "sglang", "version")]
    assert any(f"linux-headers-{RELEASE} 6.8.12-1 is installed" in u and "--debs-dir" in u for u in unpinned)
    assert any("GRUB_DEFAULT='0'" in u for u in unpinned)
    assert any("SGLANG_API_KEY" in n and "not copied" in n for n in notes)
    assert any("--api-key" in n and "was not copied" in n for n in notes)


def test_the_file_reads_back_as_the_values_even_with_hostile_text_from_the_box():
    variables, comments, unpinned, notes = adopt.variables_of(FACTS)
    text = adopt.render("box-1", variables, comments, unpinned, notes)
    assert emit.load(text) == variables
    assert "/proc/sys/kernel/osrelease" in text and "# /proc/4100/cmdline (unit sglang.service)" in text
    assert "# Not pinned" in text and "********" not in text
    assert all(line.startswith(("#", " ", "-", "rigbook_")) or line == "---" for line in text.splitlines())


def test_no_engine_and_no_release_are_named_not_guessed():
    variables, _, unpinned, _ = adopt.variables_of({"kernel": {}, "engines": []})
    assert variables == {}
    assert any("release could not be read" in u for u in unpinned)
    assert any("no running SGLang engine" in u for u in unpinned)


def test_adopt_refuses_bad_input_before_reading_the_host(tmp_path):
    inv = tmp_path / "inv"
    (inv / "host_vars").mkdir(parents=True)
    (inv / "hosts.yml").write_text("all:\n  hosts:\n    box-1:\n      ansible_host: 127.0.0.1\n      ansible_port: 1\n")
    existing = inv / "host_vars/box-1.yml"
    existing.write_text("# mine\n")
    env = {"RIGBOOK_STATE_DIR": str(tmp_path / "state")}
    cases = [
        (["adopt", "nosuch", "-i", inv], "'nosuch' is not a host of"),
        (["adopt", "box-1", "-i", inv], "box-1.yml exists; --force replaces it"),
        (["adopt", "box-1", "-i", inv, "--force", "--debs-dir", "debs"], "an absolute folder on the host"),
        (["adopt", "box-1", "-i", inv, "--force", "--wheels-dir", "w"], "--wheels-dir: an absolute folder"),
        (["adopt", "box-1", "-i", inv, "-o", tmp_path / "no/such/out.yml"], "does not exist"),
        (["adopt", "box-1", "-i", inv, "--group"], "is in no group"),
        (["adopt", "box-1", "-i", inv, "-o", inv / "adopted.yml"], "as an inventory of its own"),
    ]
    for args, message in cases:
        proc = provision(*args, env=env)
        assert proc.returncode == 2 and message in proc.stderr, (args, proc.stderr)
        assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert existing.read_text() == "# mine\n"
    assert not (tmp_path / "state/runs").exists()  # no run: the host was never contacted


def test_a_host_that_does_not_answer_is_exit_3_and_nothing_is_written(tmp_path):
    inv = tmp_path / "inv"
    inv.mkdir()
    (inv / "hosts.yml").write_text("all:\n  hosts:\n    box-1:\n      ansible_host: 127.0.0.1\n      ansible_port: 1\n"
                                   "      ansible_user: nobody\n")
    proc = provision("adopt", "box-1", "-i", inv, env={"RIGBOOK_STATE_DIR": str(tmp_path / "state")}, timeout=120)
    assert proc.returncode == 3, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "nothing was written" in proc.stderr
    assert not (inv / "host_vars").exists()


def test_a_kernel_from_the_archive_is_pinned_by_its_packages():
    facts = {"kernel": {"release": "6.1.0-47-amd64", "cmdline": ["intel_iommu=on", "iommu=pt"], "packages": [
        {"name": "linux-headers-6.1.0-47-amd64", "version": "6.1.170-3", "origin": "archive",
         "sources": ["500 http://deb.debian.org/debian bookworm/main amd64 Packages"]},
        {"name": "linux-image-6.1.0-47-amd64", "version": "6.1.170-3", "origin": "archive",
         "sources": ["500 http://deb.debian.org/debian bookworm/main amd64 Packages"]}]}, "engines": []}
    variables, comments, _, _ = adopt.variables_of(facts)
    assert variables["rigbook_pins"]["kernel"] == {  # as inventory/lab/group_vars/x99_3080.yml pins it
        "release": "6.1.0-47-amd64", "source": "distro",
        "packages": ["linux-image-6.1.0-47-amd64", "linux-headers-6.1.0-47-amd64"],
        "cmdline": ["intel_iommu=on", "iommu=pt"]}
    assert "bookworm/main" in comments[("rigbook_pins", "kernel", "source")]
    # the same packages as .debs in --debs-dir (inventory/lab/group_vars/x99_r9700.yml pins those files): pinned by
    # name from the archive, each file named with its sha256
    deb = {"path": "/srv/debs/linux-image-6.1.0-47-amd64_6.1.170-3_amd64.deb", "sha256": "e" * 64}
    facts["kernel"]["packages"][1]["deb"] = deb
    variables, _, unpinned, notes = adopt.variables_of(facts)
    assert variables["rigbook_pins"]["kernel"]["source"] == "distro" and not [u for u in unpinned if "kernel" in u]
    [note] = [n for n in notes if deb["path"] in n]
    assert f"sha256 {'e' * 64}" in note and "set source: debs" in note


def test_the_fork_as_dkms_built_it_is_the_driver_pin_and_its_files_are_named_not_pinned():
    facts = {"kernel": {}, "engines": [], "nvidia_userspace": "615.71.09", "dkms": [
        {"module": "nvidia", "version": "615.71.09", "kernels": {"6.1.0-47-amd64": "installed"},
         "source": "/usr/src/nvidia-615.71.09",
         "git": {"repo": "https://github.com/tinygrad/open-gpu-kernel-modules", "branch": None, "commit": "3f2b1c0a"}},
        {"module": "zfs", "version": "2.1.11", "kernels": {"6.1.0-47-amd64": "installed"}, "source": None,
         "git": None}]}
    variables, comments, unpinned, notes = adopt.variables_of(facts)
    assert variables["rigbook_pins"]["nvidia_driver"] == {
        "version": "615.71.09", "fork_repo": "https://github.com/tinygrad/open-gpu-kernel-modules",
        "commit": "3f2b1c0a", "userspace_version": "615.71.09"}
    assert comments[("rigbook_pins", "nvidia_driver", "commit")] == "/usr/src/nvidia-615.71.09/.git"
    assert any("source tarball" in u and "/usr/src/nvidia-615.71.09" in u for u in unpinned)
    assert any("zfs/2.1.11" in n for n in notes)
    assert emit.load(adopt.render("box", variables, comments, unpinned, notes)) == variables


def _wheels(*pairs, install="index"):
    return [{"name": name, "version": version, "install": install} for name, version in pairs]


CUDA_13 = _wheels(("nvidia-cuda-cccl", "13.0.85"), ("nvidia-cuda-crt", "13.0.88"), ("nvidia-cuda-nvcc", "13.0.88"),
                  ("nvidia-cuda-runtime", "13.0.88"), ("nvidia-nccl-cu13", "2.27.7"), ("nvidia-nvvm", "13.0.88"),
                  ("torch", "2.9.1"))


def _lab_pins(group):
    return yaml.safe_load((REPO / f"inventory/lab/group_vars/{group}.yml").read_text())["rigbook_pins"]


def test_the_cuda_wheels_of_the_default_venv_are_pinned_as_the_3080_twin_pins_them():
    facts = {"kernel": {}, "engines": [], "nvidia_userspace": "615.71.09",
             "cuda_venv": {"venv": "/opt/rigbook/cuda", "packages": CUDA_13}}
    variables, comments, unpinned, notes = adopt.variables_of(facts)
    lab = _lab_pins("x99_3080")["cuda_toolchain"]
    lab.pop("wheel_dir")  # the lab's offline folder: a box installed from the index needs none
    assert variables["rigbook_pins"]["cuda_toolchain"] == lab  # the NCCL and CCCL wheels nccl-tests build with too
    assert "nvidia-cuda-nvcc-13.0.88.dist-info" in comments[("rigbook_pins", "cuda_toolchain", "version")]
    assert comments[("rigbook_pins", "cuda_toolchain", "versions")] == (
        "/opt/rigbook/cuda (the cuda_toolchain role's default venv): nvidia-cuda-cccl-13.0.85.dist-info, "
        "nvidia-nccl-cu13-2.27.7.dist-info")
    assert not [u for u in unpinned if "cuda_toolchain" in u] and not [n for n in notes if "problem" in n]
    # nccl-tests are files no process shows: with an NCCL pinned, named as not read
    assert [u for u in unpinned if u.startswith("rigbook_pins.nccl_tests: which nccl-tests the box runs is not read")]
    assert emit.load(adopt.render("box", variables, comments, unpinned, notes)) == variables
    # the wheels of every pinned package (and the runtime) found in one --wheels-dir folder: that folder is the pin's
    folder = "/var/cache/rigbook/artifacts/wheels/cuda-13.0.88"
    found = [dict(p, wheels=[{"path": f"{folder}/{p['name'].replace('-', '_')}-{p['version']}-py3-none-any.whl",
                              "sha256": "f" * 64}]) for p in CUDA_13]
    facts["cuda_venv"]["packages"] = found
    variables, comments, _, _ = adopt.variables_of(facts)
    assert variables["rigbook_pins"]["cuda_toolchain"] == _lab_pins("x99_3080")["cuda_toolchain"]
    assert comments[("rigbook_pins", "cuda_toolchain", "wheel_dir")].startswith("--wheels-dir")
    found[0]["wheels"] = []  # one wheel missing there: no folder to pin
    assert "wheel_dir" not in adopt.variables_of(facts)[0]["rigbook_pins"]["cuda_toolchain"]


def test_cuda_wheels_in_the_engines_venv_a_mixed_release_and_a_runtime_of_its_own():
    mixed = _wheels(("nvidia-cuda-crt", "13.4.48"), ("nvidia-cuda-nvcc", "13.0.88"),
                    ("nvidia-cuda-runtime", "13.0.96"), ("nvidia-nvvm", "13.0.88"))
    facts = {"kernel": {}, "engines": [{"pid": 7, "venv": "/srv/sgl", "args": ["--model-path", "/m"], "env": {},
                                        "packages": mixed}], "cuda_venv": None}
    variables, comments, unpinned, notes = adopt.variables_of(facts)
    assert variables["rigbook_pins"]["cuda_toolchain"] == {
        "version": "13.0.88", "packages": ["nvidia-cuda-nvcc", "nvidia-cuda-crt", "nvidia-nvvm"],
        "venv": "/srv/sgl", "versions": {"nvidia-cuda-runtime": "13.0.96"}}
    assert any(n.startswith("problem: ") and "nvidia-cuda-crt 13.4.48" in n and "one release" in n for n in notes)
    assert comments[("rigbook_pins", "cuda_toolchain", "venv")] == "/srv/sgl (the engine /proc/7's venv)"


def test_cuda_12_wheels_files_and_a_box_without_any():
    cu12 = _wheels(("nvidia-cuda-nvcc-cu12", "12.4.131"), ("nvidia-nvvm-cu12", "12.4.131"))
    cu12 += _wheels(("nvidia-cuda-crt-cu12", "12.4.131"),
                    install={"archive": "file:///w/nvidia_cuda_crt_cu12-12.4.131-py3-none-any.whl", "sha256": None})
    variables, _, unpinned, notes = adopt.variables_of({"kernel": {}, "engines": [],
                                                        "cuda_venv": {"venv": "/opt/rigbook/cuda", "packages": cu12}})
    assert variables["rigbook_pins"]["cuda_toolchain"]["packages"] == [
        "nvidia-cuda-nvcc-cu12", "nvidia-cuda-crt-cu12", "nvidia-nvvm-cu12"]
    assert any("suffixed" in n for n in notes)
    assert any("wheel_dir" in u and "nvidia_cuda_crt_cu12-12.4.131" in u for u in unpinned)
    _, _, unpinned, _ = adopt.variables_of({"kernel": {}, "engines": [], "nvidia_userspace": "615.71.09"})
    assert any(u.startswith("rigbook_pins.cuda_toolchain: no nvidia-cuda-nvcc wheel") for u in unpinned)
    _, _, unpinned, _ = adopt.variables_of({"kernel": {}, "engines": []})  # no NVIDIA driver: nothing to say
    assert not any("cuda_toolchain" in u for u in unpinned)


def _schema_problems(variables):
    from ansible_collections.rigbook.homelab.plugins.plugin_utils.host_vars_schema import schema_problems

    return schema_problems(variables)


SGLANG_WHEEL = {"path": "/srv/wheels/sglang-0.5.23-py3-none-any.whl",
                "sha256": "00b3cd5b265ac76c64185fbb6b95424f324ddd9f428d0306b77bc9db9d859937"}  # inventory/lab's lock


def _engine(packages, sglang_files=None):
    return {"pid": 4100, "unit": "sglang.service", "venv": "/opt/sgl", "args": ["--model-path", "/m"], "env": {},
            "packages": packages, "sglang_files": sglang_files}


def test_a_venv_whose_every_wheel_was_found_is_locked_with_hashes_as_the_labs_lock(tmp_path):
    packages = [{"name": "sglang", "version": "0.5.23", "install": "index", "wheels": [SGLANG_WHEEL]},
                {"name": "torch", "version": "2.9.1+cu128", "install": "index",
                 "wheels": [{"path": "/srv/wheels/torch.whl", "sha256": "c" * 64},
                            {"path": "/srv/other/torch.whl", "sha256": "c" * 64}]},  # in two folders: hashed once
                # what `python -m venv` put there: left out, as `pip freeze` leaves it out
                {"name": "pip", "version": "23.0.1", "install": "index", "wheels": []},
                {"name": "setuptools", "version": "66.1.1", "install": "index", "wheels": []}]
    variables, comments, unpinned, notes, files = adopt.adopt_of({"kernel": {}, "engines": [_engine(packages)]},
                                                                 "box-1", tmp_path)
    pin = variables["rigbook_pins"]["sglang"]
    assert pin == {"version": "0.5.23", "venv": "/opt/sgl", "lock": "locks/box-1-sglang-0.5.23.txt"}
    lines = [line for line in files[pin["lock"]].splitlines() if not line.startswith("#")]

    lab_lock = [line for line in (REPO / "inventory/lab/locks/sglang-0.5.23.txt").read_text().splitlines()
                if not line.startswith("#")]
    assert lines == lab_lock + ["torch==2.9.1+cu128 --hash=sha256:" + "c" * 64]
    assert "with the sha256 of each wheel" in comments[("rigbook_pins", "sglang", "lock")]
    assert not [u for u in unpinned if "sglang" in u] and not [n for n in notes if "problem" in n]
    assert _schema_problems(variables) == []


def test_a_lock_without_every_wheel_vcs_editable_and_hostile_distributions(tmp_path):
    packages = [{"name": "sglang", "version": "0.5.23", "install": "index", "wheels": [SGLANG_WHEEL]},
                {"name": "flashinfer", "version": "0.5.3", "install": {
                    "vcs": "git", "url": "https://github.com/flashinfer-ai/flashinfer.git", "commit": "d" * 40}},
                {"name": "my-patch", "version": "0.1", "install": {"local": "editable", "url": "file:///home/u/p"}},
                {"name": "private", "version": "1.0", "install": {
                    "vcs": "git", "url": "https://user:s3cret@git.example/p.git", "commit": "e" * 40}},
                {"name": "evil\n--index-url", "version": "1", "install": "index"},
                {"name": "numpy", "version": "2.3.4", "install": "index", "wheels": []}]
    variables, comments, unpinned, notes, files = adopt.adopt_of({"kernel": {}, "engines": [_engine(packages)]},
                                                                 "box/../1", tmp_path, "/srv/wheels")
    lock = variables["rigbook_pins"]["sglang"]["lock"]
    assert lock == "locks/box%2F..%2F1-sglang-0.5.23.txt"  # a host name cannot lead out of locks/
    body = [line for line in files[lock].splitlines() if not line.startswith("#")]
    assert body == ["flashinfer @ git+https://github.com/flashinfer-ai/flashinfer.git@" + "d" * 40,
                    "numpy==2.3.4", "sglang==0.5.23"]  # no --hash at all: pip wants one on every line or none
    assert any("written without --hash" in u and "--wheels-dir /srv/wheels" in u and "numpy==2.3.4" in u
               for u in unpinned)
    problems = [n for n in notes if n.startswith("problem: ")]
    assert any("my-patch 0.1: an editable install" in n and "cannot be reproduced" in n for n in problems)
    assert any("'evil\ufffd--index-url'" in n for n in problems)  # the line break: U+FFFD, never dropped
    assert "s3cret" not in repr((variables, comments, unpinned, notes, files))
    assert any("https://***@git.example/p.git" in n for n in problems)


def test_local_changes_to_sglang_are_named_and_their_diff_is_the_patch_beside_the_pins(tmp_path):
    import hashlib

    patch = "--- a/sglang/srt/server_args.py\n+++ b/sglang/srt/server_args.py\n@@ -1,2 +1,2 @@\n API_KEY = None\n" \
            "-DEBUG = False\n+DEBUG = True\n"
    changed = [{"path": "sglang/srt/server_args.py", "state": "differs"},
               {"path": "sglang/srt/gone.py", "state": "missing"}]
    local = {"changed": changed, "wheel": SGLANG_WHEEL["path"], "patch": patch, "problem": None}
    packages = [{"name": "sglang", "version": "0.5.23", "install": "index", "wheels": [SGLANG_WHEEL]}]
    variables, comments, unpinned, notes, files = adopt.adopt_of(
        {"kernel": {}, "engines": [_engine(packages, local)]}, "box-1", tmp_path)
    patches = variables["rigbook_pins"]["sglang"]["patches"]
    assert patches == [{"path": str(tmp_path.resolve() / "patches/box-1-sglang-0.5.23-local.patch"),
                        "sha256": hashlib.sha256(patch.encode()).hexdigest()}]
    assert files["patches/box-1-sglang-0.5.23-local.patch"] == patch
    assert any("sglang/srt/server_args.py differs" in n and "RECORD" in n for n in notes)
    assert any("sglang/srt/gone.py missing" in n for n in notes)
    assert _schema_problems(variables) == []
    text = adopt.render("box-1", variables, comments, unpinned, notes)
    assert emit.load(text) == variables and "the diff from /srv/wheels/sglang-0.5.23" in text
    _, _, unpinned, _, files = adopt.adopt_of(
        {"kernel": {}, "engines": [_engine(packages, dict(local, patch=None, wheel=None))]}, "box-1", tmp_path)
    assert list(files) == ["locks/box-1-sglang-0.5.23.txt"]
    assert any(u.startswith("rigbook_pins.sglang.patches:") and "not in a --wheels-dir (none given)" in u
               for u in unpinned)


def test_the_pins_and_the_files_beside_them_are_written_together_or_not_at_all(tmp_path):
    target, lock = tmp_path / "host_vars/box.yml", tmp_path / "locks/box.txt"
    adopt.write_together({target: "a: 1\n", lock: "x==1\n"})
    assert target.read_text() == "a: 1\n" and lock.read_text() == "x==1\n"
    (tmp_path / "blocked").write_text("a file where a folder must be")
    try:
        adopt.write_together({target: "a: 2\n", tmp_path / "blocked/lock.txt": "y==2\n"})
    except OSError:
        pass
    assert target.read_text() == "a: 1\n"  # the second could not be written: the first was not replaced
    assert sorted(p.name for p in (tmp_path / "host_vars").iterdir()) == ["box.yml"]  # no temporary file left


LAB_KEY_SHA = "e9b9a1fef379c3cf9ceeab5930c95b518fdda8525c861fefc6f67546e18ed57a"  # inventory/lab x99_r9700's key
ROCM = {"version_file": "7.1.0-38",
        "packages": {"rocm-core": "7.1.0.70100-38~24.04", "rocminfo": "1.0.0.70100-38~24.04",
                     "rocm-smi-lib": "7.8.0.70100-38~24.04", "hip-runtime-amd": "7.1.25424.70100-38~24.04",
                     "hsa-rocr": "1.18.0.70100-38~24.04", "hipcc": "1.1.1.70100-38~24.04",
                     "hip-dev": "7.1.25424.70100-38~24.04", "hsa-rocr-dev": "1.18.0.70100-38~24.04",
                     "rocm-cmake": "0.14.0.70100-38~24.04", "rocm-llvm": "20.0.0.25425.70100-38~24.04",
                     "rocm-device-libs": "1.0.0.70100-38~24.04"},
        "manual": ["hip-runtime-amd", "rocm-core", "rocm-smi-lib", "rocminfo", "hipcc", "hip-dev", "hsa-rocr-dev",
                   "rocm-cmake", "rocm-llvm", "rocm-device-libs"],
        "policy": ["500 file:/var/cache/rigbook/artifacts/rocm-repo noble/main amd64 Packages",
                   "100 /var/lib/dpkg/status"],
        "sources": [{"file": "/etc/apt/sources.list", "types": ["deb"], "uris": ["http://deb.debian.org/debian"],
                     "suites": ["bookworm"], "components": ["main"], "signed_by": []},
                    {"file": "/etc/apt/sources.list.d/rigbook-rocm.sources", "types": ["deb"],
                     "uris": ["file:///var/cache/rigbook/artifacts/rocm-repo"], "suites": ["noble"],
                     "components": ["main"], "signed_by": ["/etc/apt/keyrings/rigbook-rocm.asc"]}],
        "keyrings": {"/etc/apt/keyrings/rigbook-rocm.asc": LAB_KEY_SHA}}


def test_rocm_is_pinned_as_the_r9700_twin_pins_it():
    engine = {"pid": 4100, "venv": None, "args": ["--model-path", "/m"], "packages": [],
              "env": {"HSA_ENABLE_IPC_MODE_LEGACY": "0", "NCCL_P2P_LEVEL": "PHB"}}
    variables, comments, unpinned, notes = adopt.variables_of({"kernel": {}, "engines": [engine], "rocm": ROCM})
    pin = variables["rigbook_pins"]["rocm"]
    lab = _lab_pins("x99_r9700")["rocm"]
    # the same bytes: the role keeps the key it fetched as it is, so the keyring on the box is the lab's key file
    assert pin["repo"].pop("key_url") == "file:///etc/apt/keyrings/rigbook-rocm.asc"
    assert lab["repo"].pop("key_url") == "file:///var/cache/rigbook/artifacts/rocm-repo/rocm.gpg.key"
    assert pin == lab
    assert comments[("rigbook_pins", "rocm", "version")] == "/opt/rocm/.info/version"
    assert "rigbook-rocm.sources" in comments[("rigbook_pins", "rocm", "repo", "url")]
    assert any("key_url is /etc/apt/keyrings/rigbook-rocm.asc" in n for n in notes)
    assert not [u for u in unpinned if "rocm" in u]
    pin["repo"]["key_url"] = "file:///etc/apt/keyrings/rigbook-rocm.asc"
    assert _schema_problems(variables) == []
    # the RCCL build's packages (the role's build_packages) apart from the runtime: all there is the default; none
    # installed by name (RCCL never built on the box) is pinned as none, with where it was read
    runtime = ["hip-runtime-amd", "rocm-core", "rocm-smi-lib", "rocminfo"]
    variables, comments, _, _ = adopt.variables_of({"kernel": {}, "engines": [], "rocm": dict(ROCM, manual=runtime)})
    assert variables["rigbook_pins"]["rocm"]["build_packages"] == []
    assert variables["rigbook_pins"]["rocm"]["packages"] == lab["packages"]
    assert "none of the RCCL build's packages" in comments[("rigbook_pins", "rocm", "build_packages")]


def test_rocm_from_debs_an_inline_key_a_hostile_source_and_amdgpu_dkms():
    no_repo = dict(ROCM, policy=["100 /var/lib/dpkg/status"], manual=[], version_file=None,
                   packages=dict(ROCM["packages"], **{"amdgpu-dkms": "6.16.6.70100-38~24.04"}))
    variables, comments, unpinned, _ = adopt.variables_of({"kernel": {}, "engines": [], "rocm": no_repo})
    pin = variables["rigbook_pins"]["rocm"]
    assert pin["version"] == "7.1.0" and pin["dkms"] is True and "repo" not in pin
    assert pin["packages"] == ["rocm-core", "rocminfo", "rocm-smi-lib", "hip-runtime-amd"]  # none by name: the four
    assert comments[("rigbook_pins", "rocm", "version")].startswith("dpkg-query: rocm-core 7.1.0.70100")
    assert any(u.startswith("rigbook_pins.rocm.repo: no configured apt source") for u in unpinned)
    inline = dict(ROCM, sources=[dict(ROCM["sources"][1], signed_by="inline")])
    _, _, unpinned, _ = adopt.variables_of({"kernel": {}, "engines": [], "rocm": inline})
    assert any("key_sha256" in u and "holds the key itself" in u for u in unpinned)
    hostile = dict(ROCM, policy=["500 file:/r noble\n/main amd64 Packages"],
                   sources=[dict(ROCM["sources"][1], uris=["file:///r"], suites=["noble\n"])])
    variables, _, unpinned, _ = adopt.variables_of({"kernel": {}, "engines": [], "rocm": hostile})
    assert "repo" not in variables["rigbook_pins"]["rocm"]
    assert any(u.startswith("rigbook_pins.rocm: the ROCm release could not be read") for u in
               adopt.variables_of({"kernel": {}, "engines": [], "rocm": {"packages": {}}})[2])


def _stamp(rccl_source, tests_source):
    """A source_build stamp as the rccl role's build writes it (source_build identity: name, version, prefix,
    components with source, subdir, patches "NAME -pN SHA", cmake_args), constructed for the lab's R9700 pins."""
    prefix = "/opt/rigbook/rccl/2.27.7-5d2f"
    return {"name": "rccl", "version": "2.27.7", "prefix": prefix, "files": {}, "components": [
        {"name": "rccl", "source": rccl_source, "subdir": "",
         "patches": ["p2p-level-user-last.patch -p1 a25080b6aa9d212113fa7492b703608b0fc624e2658ccba1c360144061553ad1"],
         "cmake_args": ["-DCMAKE_CXX_COMPILER=/usr/bin/g++", "-DROCM_PATH=/opt/rocm", "-DAMDGPU_TARGETS=gfx1201",
                        "-DGPU_TARGETS=gfx1201", "-DBUILD_TESTS=OFF"]},
        {"name": "rccl-tests", "source": tests_source, "subdir": "", "patches": [],
         "cmake_args": [f"-DNCCL_HOME={prefix}", "-DGPU_TARGETS=gfx1201"]}]}


def _rccl_engine(build):
    return {"pid": 4100, "venv": None, "args": ["--model-path", "/m"], "env": {}, "packages": [], "libraries": [
        {"path": "/opt/rigbook/rccl/2.27.7-5d2f/lib/librccl.so.1.0", "sha256": "f" * 64, "build": build},
        {"path": "/opt/rocm/lib/libamdhip64.so.7", "sha256": "e" * 64}]}


def test_the_mapped_rccl_is_pinned_as_far_as_its_build_stamp_says():
    lab = _lab_pins("x99_r9700")["rccl"]
    stamp = _stamp(lab["source"]["sha256"], lab["tests"]["source"]["sha256"])  # the lab's tarballs
    build = {"path": "/opt/rigbook/rccl/2.27.7-5d2f/.rigbook-build.json", "stamp": stamp}
    variables, comments, unpinned, _ = adopt.variables_of({"kernel": {}, "engines": [_rccl_engine(build)]})
    pin = variables["rigbook_pins"]["rccl"]
    assert pin == {key: lab[key] for key in ("version", "patches", "gpu_targets")}
    assert comments[("rigbook_pins", "rccl", "version")] == f"the build stamp {build['path']}"
    assert any(u.startswith("rigbook_pins.rccl.source:") and lab["source"]["sha256"] in u and "path or url" in u
               for u in unpinned)
    assert any(u.startswith("rigbook_pins.rccl.tests.source:") for u in unpinned)
    commit = "1" * 40
    stamp = _stamp(f"dir:https://github.com/ROCm/rocm-systems@{commit}", "dir:https://github.com/ROCm/rccl-tests@"
                   + "2" * 40)
    stamp["components"][0]["subdir"] = "projects/rccl"
    variables, _, _, _ = adopt.variables_of({"kernel": {}, "engines": [_rccl_engine(dict(build, stamp=stamp))]})
    pin = variables["rigbook_pins"]["rccl"]
    assert pin["source"] == {"repo": "https://github.com/ROCm/rocm-systems", "commit": commit,
                             "subdir": "projects/rccl"}
    assert pin["tests"] == {"source": {"repo": "https://github.com/ROCm/rccl-tests", "commit": "2" * 40}}
    assert _schema_problems(variables) == []


def test_a_mapped_rccl_that_rigbook_did_not_build_is_named():
    _, _, _, notes = adopt.variables_of({"kernel": {}, "engines": [_rccl_engine(None)]})
    assert any("/opt/rigbook/rccl/2.27.7-5d2f/lib/librccl.so.1.0 (sha256 " + "f" * 64 + "): not a build of "
               "rigbook's source_build" in n for n in notes)
    hostile = {"path": "/x/.rigbook-build.json", "stamp": {"name": "rccl", "version": "2.27.7\n- x", "components": []}}
    variables, _, unpinned, _ = adopt.variables_of({"kernel": {}, "engines": [_rccl_engine(hostile)]})
    assert "rccl" not in variables.get("rigbook_pins", {}) and any("no x.y.z release" in u for u in unpinned)


def _grouped(tmp_path, group_file=None):
    inv = tmp_path / "inv"
    (inv / "group_vars").mkdir(parents=True)
    (inv / "hosts.yml").write_text("all:\n  children:\n    lab:\n      children:\n        x99_3080:\n          hosts:\n"
                                   "            box-1: {ansible_host: 127.0.0.1, ansible_port: 1}\n")
    if group_file is not None:
        (inv / "group_vars/x99_3080.yml").write_text(group_file)
    return inv


def test_group_adopt_writes_the_most_specific_group_beside_its_own_file(tmp_path):
    from rigbook import inventory

    inv = _grouped(tmp_path)
    loaded = inventory.load(inv)
    assert adopt._group_of(loaded, "box-1", inv) == "x99_3080"  # not `lab`, its parent
    assert adopt.output_path(inv, "box-1", "x99_3080", None) == inv / "group_vars/x99_3080.yml"
    (inv / "group_vars/x99_3080.yml").write_text("rigbook_gpu: {vendor: nvidia, count: 2}\n")
    # the group's own file stays the owner's: adopt's goes in the group's folder, and the group's file moves in
    # beside it, unchanged (Ansible reads a group's folder or its file, never both)
    target = adopt.output_path(inv, "box-1", "x99_3080", None)
    assert target == inv / "group_vars/x99_3080/adopted.yml"
    moved = adopt.group_file_to_folder(target)
    assert moved == inv / "group_vars/x99_3080/x99_3080.yml" and not (inv / "group_vars/x99_3080.yml").exists()
    assert moved.read_text() == "rigbook_gpu: {vendor: nvidia, count: 2}\n"
    assert adopt.output_path(inv, "box-1", "x99_3080", None) == target  # the folder now: still beside
    assert adopt.group_file_to_folder(target) is None


def test_group_adopt_refuses_a_group_that_pins_already(tmp_path):
    inv = _grouped(tmp_path, "rigbook_pins:\n  sglang: {version: 0.5.23}\n")
    proc = provision("adopt", "box-1", "-i", inv, "--group", env={"RIGBOOK_STATE_DIR": str(tmp_path / "state")})
    assert proc.returncode == 2 and "group x99_3080 sets rigbook_pins already" in proc.stderr, proc.stderr
    assert not (inv / "group_vars/x99_3080").exists() and not (tmp_path / "state/runs").exists()


def test_a_venv_rigbook_made_is_adopted_as_its_stamp_says_and_rigbooks_gpu_environment_is_not_the_profiles():
    # a converged lab host: the sglang role's venv, its pinned_venv stamp, and the unit's engine environment with
    # what rigbook's GPU environment file gave it (adopt_facts moved those names to env_from_rigbook)
    venv = "/opt/rigbook/sglang/0.5.23-1c3f0a9e2b4d"
    engine = {"pid": 700, "unit": "rigbook-serve-standin.service", "venv": venv, "args": ["--model-path", "/m"],
              "env": {"RIGBOOK_EVIDENCE_ROOT": "/var/lib/rigbook-lab/evidence"},
              "env_from_rigbook": ["CUDA_HOME", "CUDA_PATH"],
              "packages": [{"name": "sglang", "version": "0.5.23", "install": "index", "wheels": [SGLANG_WHEEL]}],
              "venv_stamp": {"patches": ["symm-mem-logits-gather-sm90.patch -p1 " + "d" * 64, "../x -p1 zz"],
                             "no_deps": True, "no_index": True,
                             "find_links": ["/var/cache/rigbook/artifacts/wheels/sglang-0.5.23"]}}
    variables, comments, _, notes = adopt.variables_of({"kernel": {}, "engines": [engine]})
    pin = variables["rigbook_pins"]["sglang"]
    assert "venv" not in pin  # rigbook's own venv: the role's default
    assert pin["patches"] == [{"name": "symm-mem-logits-gather-sm90.patch", "sha256": "d" * 64}]
    assert pin["no_deps"] is True and pin["wheel_dir"] == "/var/cache/rigbook/artifacts/wheels/sglang-0.5.23"
    assert comments[("rigbook_pins", "sglang", "patches")] == f"{venv}/.rigbook-venv.json (rigbook's stamp)"
    assert any("'../x -p1 zz'" in n and "not pinned" in n for n in notes)
    [profile] = variables["rigbook_serve"]
    assert profile["name"] == "standin" and profile["env"] == {"RIGBOOK_EVIDENCE_ROOT": "/var/lib/rigbook-lab/evidence"}
    assert any("CUDA_HOME, CUDA_PATH came from rigbook's GPU environment file" in n for n in notes)


def test_a_flag_the_pinned_sglang_lacks_is_named_and_a_seed_trap_gets_the_written_profiles_error(tmp_path):
    from rigbook import validate

    args = ["--model-path", "/srv/models/qwen", "--tp", "2", "--context-length", "200000", "--max-total-tokens",
            "200000", "--enable-metrics", "--no-such-flag", "3"]
    engine = {"pid": 4100, "unit": None, "venv": "/opt/v", "args": args, "env": {}, "secret_env": [],
              "packages": [{"name": "sglang", "version": "0.5.23", "install": "index"}],
              "sglang_flags": ["--context-length", "--enable-metrics", "--max-total-tokens", "--model-path",
                               "--tp-size"]}
    variables, _, unpinned, notes = adopt.variables_of({"kernel": {}, "engines": [engine]})
    [profile] = variables["rigbook_serve"]
    assert profile["extra_args"] == ["--enable-metrics", "--no-such-flag", "3"] and profile["tp_size"] == 2
    [lacking] = [u for u in unpinned if "--no-such-flag" in u]
    assert "sglang 0.5.23 in /opt/v does not define" in lacking and "--enable-metrics" not in lacking
    assert any("extra_args: --no-such-flag" in n for n in notes)
    # without the sources to judge by, no flag is called unknown
    engine["sglang_flags"] = None
    assert not [u for u in adopt.variables_of({"kernel": {}, "engines": [engine]})[2] if "does not define" in u]

    # the adopted profile, as adopt writes it, meets the same rule (seed 000's pool at the full context) as the same
    # profile written by hand
    messages = []
    for name, text in (("adopted", adopt.render("box-1", variables, {}, [], [])),
                       ("written", "---\n" + yaml.safe_dump({"rigbook_serve": [profile]}))):
        inv = tmp_path / name
        (inv / "host_vars").mkdir(parents=True)
        (inv / "hosts.yml").write_text("all:\n  hosts:\n    box-1:\n      ansible_host: 127.0.0.1\n")
        (inv / "host_vars/box-1.yml").write_text(text)
        _, problems, _ = validate.check(inv)
        messages.append([(p.key_path, p.message) for p in problems if "max_total_tokens" in p.key_path])
    assert messages[0] == messages[1] and len(messages[0]) == 1 and "seed 000" in messages[0][0][1]


def test_record_differences_that_are_rigbooks_stamped_patches_stay_patches_by_name():
    # the lab's patch set as inventory/lab pins it (the sglang role's files/patches/), and the files a converged lab
    # host's venv has changed against sglang's RECORD (read on a converged lab host)
    pins = yaml.safe_load((REPO / "inventory/lab/group_vars/x99_3080.yml").read_text())["rigbook_pins"]["sglang"]
    stamp = [f"{p['name']} -p1 {p['sha256']}" for p in pins["patches"]]
    changed = [{"path": f"sglang/srt/{rel}", "state": "differs"}
               for rel in ("entrypoints/engine.py", "layers/logits_processor.py", "server_args.py")]
    engine = {"pid": 700, "unit": None, "venv": "/opt/rigbook/sglang/0.5.23-1c3f0a9e2b4d", "args": [], "env": {},
              "packages": [{"name": "sglang", "version": "0.5.23", "install": "index", "wheels": [SGLANG_WHEEL]}],
              "venv_stamp": {"patches": stamp},
              "sglang_files": {"changed": changed, "wheel": SGLANG_WHEEL["path"], "patch": "--- a\n+++ b\n"}}
    variables, _, unpinned, notes, files = adopt.adopt_of({"kernel": {}, "engines": [engine]})
    assert variables["rigbook_pins"]["sglang"]["patches"] == pins["patches"]
    assert not [path for path in files if path.startswith("patches/")]  # no local diff written beside the pins
    assert any("are the ones rigbook's patches of its stamp change" in n for n in notes)
    assert not [u for u in unpinned if "sglang.patches" in u]
    # a file changed beyond those patches is named, and still no diff that would apply the patches twice
    engine["sglang_files"]["changed"].append({"path": "sglang/srt/utils/common.py", "state": "differs"})
    variables, _, unpinned, _, files = adopt.adopt_of({"kernel": {}, "engines": [engine]})
    assert variables["rigbook_pins"]["sglang"]["patches"] == pins["patches"]
    assert any("sglang/srt/utils/common.py changed outside rigbook's patches" in u for u in unpinned)
    assert not [path for path in files if path.startswith("patches/")]
    # a stamp naming a patch rigbook does not ship (or another sha256): the local diff decides, as for a hand-made venv
    engine["venv_stamp"] = {"patches": [f"{pins['patches'][0]['name']} -p1 {'0' * 64}"]}
    variables, _, _, _, files = adopt.adopt_of({"kernel": {}, "engines": [engine]})
    assert [path for path in files if path.startswith("patches/")]
    assert "path" in variables["rigbook_pins"]["sglang"]["patches"][0]


def test_gpus_on_two_root_ports_of_a_host_bridge_the_kernel_does_not_allow_are_named_for_p2pdma_allow():
    def gpu(port, bridge):
        return {"chain": [{"slot": port}], "host_bridge": {"slot": "0000:00:00.0", "ids": bridge}}

    kernel = {"release": "6.8.12-r9700-p2p-dma44", "packages": []}
    x99 = {"kernel": kernel, "engines": [], "cpu": {"vendor": "GenuineIntel", "family": 6},
           "gpus": [gpu("0000:00:02.0", "8086:6f00"), gpu("0000:00:03.0", "8086:6f00")]}  # seed 004's placement
    [named] = [u for u in adopt.variables_of(x99)[2] if "p2pdma_allow" in u]
    assert "8086:6f00" in named and "seed 004" in named
    allowed = dict(x99, gpus=[gpu("0000:00:02.0", "8086:2f00"), gpu("0000:00:03.0", "8086:2f00")])
    same_port = dict(x99, gpus=[gpu("0000:00:02.0", "8086:6f00"), gpu("0000:00:02.0", "8086:6f00")])
    zen = dict(x99, cpu={"vendor": "AuthenticAMD", "family": 0x19})
    for facts in (allowed, same_port, zen):
        assert not [u for u in adopt.variables_of(facts)[2] if "p2pdma_allow" in u]


# --- what a box says is data: issue 34 ------------------------------------------------------------------------------

def _attack(mark):
    """A Jinja2 expression that runs `touch MARK` wherever Ansible templates it (no spaces: it fits an apt source's
    URI, a policy line's word and a kernel release as well)."""
    return "{{lookup('pipe','touch${IFS}" + mark + "')}}"


MARKS = ("MARK_argv", "MARK_served", "MARK_extra", "MARK_env", "MARK_venv", "MARK_git", "MARK_branch", "MARK_origin",
         "MARK_release", "MARK_cmdline", "MARK_deb", "MARK_amdgpu")


def _hostile_facts():
    """What adopt_facts returns on a box where a local user started a process whose command line and environment
    hold Jinja2, and the venv path, the DKMS source's git remote, apt sources (a package origin, AMD's graphics
    repository) and the kernel's strings do too (constructed in adopt_facts' shapes)."""
    release = "6.8.12-" + _attack("MARK_release")
    origin = "file:///r/" + _attack("MARK_origin")
    rocm = dict(ROCM, policy=[f"500 {origin.replace('file:///', 'file:/')} noble/main amd64 Packages"],
                sources=[dict(ROCM["sources"][1], uris=[origin])])
    return {
        "kernel": {"release": release, "cmdline": ["iommu=pt", "pci=" + _attack("MARK_cmdline")], "packages": [
            {"name": f"linux-image-{release}", "version": "1", "origin": "local",
             "sources": ["100 /var/lib/dpkg/status"],
             "deb": {"path": "/srv/debs/" + _attack("MARK_deb"), "sha256": "a" * 64}}]},
        "dkms": [{"module": "nvidia", "version": "615.71.09", "kernels": {"6.8.12": "installed"},
                  "source": "/usr/src/nvidia-615.71.09",
                  "git": {"repo": "https://github.com/x/" + _attack("MARK_git"), "branch": _attack("MARK_branch"),
                          "commit": "3f2b1c0a"}}],
        "engines": [{"pid": 4100, "unit": "sglang.service", "venv": "/opt/" + _attack("MARK_venv"),
                     "args": ["--model-path", "/srv/{{ lookup('pipe', 'touch MARK_argv') }}", "--served-model-name",
                              _attack("MARK_served") + "\x1b[2J\u00e9\U0001f600", "--enable-metrics",
                              _attack("MARK_extra")],
                     "env": {"NCCL_DEBUG": _attack("MARK_env")}, "secret_env": [],
                     "packages": [{"name": "sglang", "version": "0.5.23", "install": "index"}]}],
        "rocm": rocm,
        # AMD's graphics repository as amdgpu-install's amdgpu.list names it: its version segment is the box's text
        "apt_sources": [{"file": "/etc/apt/sources.list.d/amdgpu.list", "format": "one-line", "types": ["deb"],
                         "uris": ["https://repo.radeon.com/amdgpu/" + _attack("MARK_amdgpu") + "/ubuntu"],
                         "suites": ["noble"], "components": ["main"], "signed_by": ["/etc/apt/keyrings/rocm.gpg"],
                         "enabled": True}],
        "apt_keyrings": {"/etc/apt/keyrings/rocm.gpg": LAB_KEY_SHA},
    }


def _strings(value):
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in _strings(k) + _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return [value] if isinstance(value, str) else []


def _adopt_recorded(tmp_path, monkeypatch, facts, hosts_extra=""):
    """`provision adopt box-1` (the command itself: mapping, emit, the write, the check) with the playbook run
    replaced by what it stores: FACTS as <run>/adopted/box-1.json. (inventory, exit code, stdout)."""
    inv = tmp_path / "inv"
    inv.mkdir()
    (inv / "hosts.yml").write_text("all:\n  hosts:\n    box-1:\n      ansible_connection: local\n" + hosts_extra)
    monkeypatch.setenv("RIGBOOK_STATE_DIR", str(tmp_path / "state"))

    def stored(options):
        folder = runs.runs_dir() / "adopt-recorded" / command.FACTS_DIR
        folder.mkdir(parents=True)
        (folder / "box-1.json").write_text(json.dumps(facts))
        return 0

    monkeypatch.setattr(command, "run_playbook", stored)
    out = io.StringIO()
    code = command.adopt_command("box-1", str(inv), stream=out)
    return inv, code, out.getvalue()


def test_jinja_from_the_box_is_never_run_by_ansible_at_the_first_play_after_adopt(tmp_path, monkeypatch):
    facts = _hostile_facts()
    inv, code, _ = _adopt_recorded(tmp_path, monkeypatch, facts, hosts_extra=(
        f"      ansible_python_interpreter: {sys.executable}\n    control:\n      ansible_connection: local\n"
        f"      ansible_python_interpreter: {sys.executable}\n"))
    assert code in (0, 1)  # written (1: the check names what the hostile values lack)
    written = (inv / "host_vars/box-1.yml").read_text()
    variables = emit.load(written)
    assert variables["rigbook_serve"][0]["served_model_name"].endswith("\ufffd[2J\u00e9\U0001f600")
    assert variables == adopt.adopt_of(facts, "box-1", inv)[0]
    strings = _strings(variables)
    for mark in MARKS:  # every field carries its attack into the variables Ansible reads
        assert any(mark in s and "lookup('pipe'" in s for s in strings), mark
    # the control: the same variables written without !unsafe (yaml.safe_dump), each mark renamed CTRL_
    control = json.loads(json.dumps(variables).replace("MARK_", "CTRL_"))
    (inv / "host_vars/control.yml").write_text(yaml.safe_dump(control))
    play = tmp_path / "play"
    play.mkdir()
    (play / "play.yml").write_text(json.dumps([{"hosts": "all", "gather_facts": False, "tasks": [
        {"ansible.builtin.copy": {"content": "{{ {'pins': rigbook_pins, 'serve': rigbook_serve} | to_json }}",
                                  "dest": str(tmp_path / "seen") + "/{{ inventory_hostname }}.json"}}]}]))
    (tmp_path / "seen").mkdir()
    bin_dir = os.path.dirname(sys.executable)
    env = {**os.environ, "ANSIBLE_NOCOLOR": "1", "ANSIBLE_LOCAL_TEMP": str(tmp_path / "ansible-tmp"),
           "PATH": bin_dir + os.pathsep + os.environ["PATH"]}
    proc = subprocess.run([os.path.join(bin_dir, "ansible-playbook"), "-i", str(inv), str(play / "play.yml")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    made = {p.name for p in tmp_path.rglob("*") if p.name.startswith(("MARK_", "CTRL_"))}
    # without !unsafe every field runs its command (the harness sees the attack) ...
    assert {m for m in made if m.startswith("CTRL_")} == {m.replace("MARK_", "CTRL_") for m in MARKS}
    # ... with it none does, and Ansible's value of every variable is the adopted string itself
    assert not {m for m in made if m.startswith("MARK_")}
    seen = json.loads((tmp_path / "seen/box-1.json").read_text())
    assert seen == {"pins": variables["rigbook_pins"], "serve": variables["rigbook_serve"]}


def test_control_characters_an_env_name_with_a_template_credentials_and_the_admin_key_stay_out(tmp_path,
                                                                                                monkeypatch):
    facts = {"kernel": {}, "dkms": [
        {"module": "zfs\x1b[2J\x1b]0;owned\x07", "version": "2.1", "kernels": {"6.8": "installed"}, "source": None,
         "git": None},
        {"module": "nvidia", "version": "615.71.09", "kernels": {"6.8": "installed"}, "source": "/usr/src/n",
         "git": {"repo": "https://owner:ghp_s3cret@github.com/x/fork.git", "branch": None, "commit": "3f2b1c0a"}}],
        "engines": [{"pid": 4100, "unit": None, "venv": None, "packages": [],
                     "args": ["--model-path", "/m\nExecStartPre=+/bin/sh", "--admin-api-key", "adm-1",
                              "--admin-api-key=adm-2", "--enable-metrics"],
                     "env": {"NCCL_{{ lookup('pipe','id') }}": "1", "NCCL_P2P_LEVEL": "PHB\x1b[31m"},
                     "secret_env": ["SGLANG_API_KEY"]}]}
    inv, code, out = _adopt_recorded(tmp_path, monkeypatch, facts)
    written = (inv / "host_vars/box-1.yml").read_text()
    variables = emit.load(written)
    [profile] = variables["rigbook_serve"]
    # control characters: replaced by U+FFFD in values, never in the file, never on the terminal
    assert profile["model_path"] == "/m\ufffdExecStartPre=+/bin/sh"
    assert profile["env"] == {"NCCL_P2P_LEVEL": "PHB\ufffd[31m"}
    assert not [c for c in written + out if ord(c) < 32 and c != "\n"] and "\x9b" not in out
    assert "DKMS module zfs\ufffd[2J\ufffd]0;owned\ufffd/2.1" in out
    # an environment name that is no shell name is never a key: named as not pinned
    assert "lookup" not in str(list(profile["env"]))
    assert "not pinned: rigbook_serve: the engine /proc/4100's environment holds \"NCCL_{{ lookup('pipe','id') }}\"" \
           in out
    # credentials in a git remote: removed, said
    assert variables["rigbook_pins"]["nvidia_driver"]["fork_repo"] == "https://***@github.com/x/fork.git"
    assert "s3cret" not in written + out
    assert "credentials removed from a URL" in out and "dkms[1].git.repo" in out
    # the admin API key, in either spelling: never copied, said
    assert profile["extra_args"] == ["--enable-metrics"]
    assert "adm-1" not in written + out and "adm-2" not in written + out
    assert "engine: --admin-api-key: the admin API key is on the engine's command line" in out
    assert code in (0, 1)


def test_the_notes_of_the_box_reach_the_file_and_the_terminal():
    facts = {"kernel": {}, "engines": [], "checks": {
        "notes": ["the engine /proc/5100 runs as user mallory: skipped, not read"],
        "unpinned": ["rigbook_pins.sglang: the venv /opt/v of the engine /proc/4100 is owned by mallory"]}}
    variables, comments, unpinned, notes = adopt.variables_of(facts)
    assert notes[0] == "the engine /proc/5100 runs as user mallory: skipped, not read"
    assert unpinned[0].startswith("rigbook_pins.sglang: the venv /opt/v")
    text = adopt.render("box-1", variables, comments, unpinned, notes)
    assert "# note: the engine /proc/5100 runs as user mallory" in text and "# - rigbook_pins.sglang: the venv" in text


def test_a_number_that_is_not_finite_is_given_back_as_its_text():
    engine = {"pid": 1, "args": ["--model-path", "/m", "--mem-fraction-static", "nan"], "env": {}, "packages": []}
    variables, comments, unpinned, notes = adopt.variables_of({"kernel": {}, "engines": [engine]})
    assert variables["rigbook_serve"][0]["mem_fraction_static"] == "nan"
    assert emit.load(adopt.render("box", variables, comments, unpinned, notes)) == variables


def test_stored_facts_of_the_wrong_shape_are_read_past_without_a_traceback():
    facts = {"kernel": ["not", "a", "mapping"], "dkms": "x", "rocm": [1], "cuda_venv": "y",
             "engines": ["str", {"pid": "x"}, {"pid": 4100, "args": "not a list", "env": [1], "packages": {},
                                               "secret_env": "z", "unit": 7, "venv": ["a"]}]}
    variables, comments, unpinned, notes = adopt.variables_of(facts)
    assert [p["name"] for p in variables["rigbook_serve"]] == ["engine"]
    assert "rigbook_serve: an engine without a process id was left out" in unpinned
    assert emit.load(adopt.render("box", variables, comments, unpinned, notes)) == variables
    # typed twice (on the box, then on what the run stored) says nothing more the second time
    once, said, _ = adopt_facts.typed({"dkms": [{"git": {"repo": "https://u:p@h/r\x1b"}}], "engines": []})
    assert said and adopt_facts.typed(once)[1:] == ([], [])


# --- the closing check reads the inventory with what adopt wrote (issue 35, defect 1 of the real VM run) -------------

def _vm_inventory(tmp_path, fixtures, own_host_vars=None):
    """The real VM run's inventory (tests/fixtures/adopt/h200-vm-hosts.yml), OWN_HOST_VARS its host_vars/h200.yml."""
    inv = tmp_path / "inv"
    inv.mkdir()
    (inv / "hosts.yml").write_text((fixtures / "adopt/h200-vm-hosts.yml").read_text())
    if own_host_vars is not None:
        (inv / "host_vars").mkdir()
        (inv / "host_vars/h200.yml").write_text(own_host_vars)
    return inv


def test_the_check_after_adopt_o_file_reads_the_file_as_the_hosts_variables(tmp_path, fixtures, capsys):
    """What adopt wrote on the VM before issue 35 (recorded, tests/fixtures/adopt/h200-vm-adopted.yml) pins
    kernel.release: the check of `adopt -o FILE` named it missing all the same (the inventory read without FILE)."""
    written = tmp_path / "out/adopted.yml"
    written.parent.mkdir()
    written.write_text((fixtures / "adopt/h200-vm-adopted.yml").read_text())
    inv = _vm_inventory(tmp_path, fixtures, own_host_vars="rigbook_pins:\n  kernel:\n    release: 6.8.0-90-generic\n"
                                                           "rigbook_tolerance: {}\n")
    assert command.check_written(inv, str(inv), written, "h200", None, io.StringIO()) == 1
    err = capsys.readouterr().err
    assert f"adopt: the inventory with {written} (read as host_vars of h200) does not validate yet" in err
    assert "rigbook_pins.kernel.release" not in err  # FILE pins it, over the inventory's own host_vars
    # what is still missing, named in the user's files (FILE, the inventory), never the check's scratch copy
    assert (f"{written}: host h200: rigbook_pins.kernel.debs: " in err and "6.18.44-fc-v1252-gpu is no distribution "
            "kernel" in err)
    assert "rigbook-adopt-check" not in err and "6.8.0-90-generic" not in err
    assert not list(tmp_path.glob("**/~~adopted-by-rigbook.yml"))
    # the same file as host_vars/h200.yml of the inventory: read there, the same missing inputs
    (inv / "host_vars/h200.yml").write_text(written.read_text())
    assert command.check_written(inv, str(inv), inv / "host_vars/h200.yml", "h200", None, io.StringIO()) == 1
    err = capsys.readouterr().err
    assert "adopt: the inventory with h200.yml does not validate yet" in err
    assert "rigbook_pins.kernel.release" not in err and "rigbook_pins.kernel.debs" in err


def test_adopt_o_file_names_only_what_the_file_leaves_missing(tmp_path, monkeypatch, fixtures):
    facts = {"kernel": {"release": "6.1.0-47-amd64", "cmdline": ["intel_iommu=on", "iommu=pt", "console=ttyS0"],
                        "packages": [{"name": "linux-image-6.1.0-47-amd64", "version": "6.1.170-3",
                                      "origin": "archive", "sources": ["500 http://deb.debian.org/debian bookworm/main "
                                                                       "amd64 Packages"]}]},
             "engines": [], "boot": {"modules_dir": True, "efi": True, "grub": ["/etc/default/grub"]}}
    inv = _vm_inventory(tmp_path, fixtures)
    monkeypatch.setenv("RIGBOOK_STATE_DIR", str(tmp_path / "state"))

    def stored(options):
        folder = runs.runs_dir() / "adopt-recorded" / command.FACTS_DIR
        folder.mkdir(parents=True)
        (folder / "h200.json").write_text(json.dumps(facts))
        return 0

    monkeypatch.setattr(command, "run_playbook", stored)
    out, err = io.StringIO(), io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    code = command.adopt_command("h200", str(inv), output=str(tmp_path / "adopted.yml"), stream=out)
    written = emit.load((tmp_path / "adopted.yml").read_text())
    assert written["rigbook_pins"]["kernel"]["cmdline"] == ["intel_iommu=on", "iommu=pt"]
    assert "note: rigbook_pins.kernel.cmdline: left alone (not what the P2P stack reads" in out.getvalue()
    assert code == 1 and "rigbook_pins.kernel" not in err.getvalue()  # kernel.release and its packages: pinned
    assert "rigbook_pins.cuda_toolchain.version" in err.getvalue()  # not read: still missing, named
    assert f"{tmp_path / 'adopted.yml'} (read as host_vars of h200)" in err.getvalue()


# --- the driver however it got there (issue 35) -----------------------------------------------------------------------

def _loaded(version="615.71.09", file="/lib/modules/6.8.12/kernel/drivers/video/nvidia.ko",
            way="make modules_install", userspace="615.71.09"):
    """adopt_facts' nvidia_driver reading of a loaded module (constructed in its shape)."""
    return {"loaded": True, "version": version, "version_source": "/sys/module/nvidia/version",
            "srcversion": "5C0F3B1E9A7D2C4B8E6F1A3D", "open": True, "file": file,
            "file_source": "/lib/modules/6.8.12/modules.dep", "installed_by": way,
            "userspace": {"version": userspace, "where": f"/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.{userspace}",
                          "from": "library"} if userspace else None, "userspace_smi": None}


DKMS_FORK = {"module": "nvidia", "version": "615.71.09", "kernels": {"6.8.12": "installed"},
             "source": "/usr/src/nvidia-615.71.09",
             "git": {"repo": "https://github.com/aikitoria/open-gpu-kernel-modules", "branch": "615.71.09-p2p",
                     "commit": "3f2b1c0a"}}


def test_the_dkms_fork_that_is_loaded_keeps_its_source_and_says_where_its_file_is():
    facts = {"kernel": {}, "engines": [], "dkms": [DKMS_FORK],
             "nvidia_driver": _loaded(file="/lib/modules/6.8.12/updates/dkms/nvidia.ko.zst", way="dkms")}
    variables, comments, unpinned, notes = adopt.variables_of(facts)
    assert variables["rigbook_pins"]["nvidia_driver"] == {
        "version": "615.71.09", "fork_repo": "https://github.com/aikitoria/open-gpu-kernel-modules",
        "branch": "615.71.09-p2p", "commit": "3f2b1c0a", "userspace_version": "615.71.09"}
    assert comments[("rigbook_pins", "nvidia_driver", "version")].startswith("dkms status: nvidia/615.71.09")
    assert any("updates/dkms/nvidia.ko.zst" in n and "installed by DKMS" in n for n in notes)
    assert any(u.startswith("rigbook_pins.nvidia_driver.source and userspace_installer") for u in unpinned)


def test_a_loaded_module_that_is_not_dkmss_is_the_pin_and_nothing_of_dkmss_source_is_kept():
    facts = {"kernel": {}, "engines": [], "dkms": [DKMS_FORK],
             "nvidia_driver": _loaded(version="580.95.05", file="/lib/modules/6.8.12/kernel/nvidia-580/nvidia.ko",
                                      way="package", userspace="580.95.05")}
    variables, comments, unpinned, notes = adopt.variables_of(facts)
    assert variables["rigbook_pins"]["nvidia_driver"] == {"version": "580.95.05", "userspace_version": "580.95.05"}
    assert comments[("rigbook_pins", "nvidia_driver", "version")] == "/sys/module/nvidia/version: the loaded module"
    assert any("DKMS's nvidia/615.71.09 is not the loaded module (580.95.05)" in n for n in notes)
    assert any("installed by a distribution package" in n for n in notes)
    assert not [u for u in unpinned if u.startswith("rigbook_pins.nvidia_driver.source and")]
    assert any(u.startswith("rigbook_pins.nvidia_driver: fork_repo and commit") and "installed by package" in u
               for u in unpinned)


def test_hmm_left_at_the_drivers_default_is_pinned_so_where_it_cannot_confine_host_memory():
    """Seed 000's box: the open fork, HMM at the driver's default, an E5 v3 (46-bit physical addresses): the pin keeps
    HMM as the box has it, so the converge writes no modprobe option; a CPU whose addresses reach past the GPUs' DMA
    mask, or one whose width is unknown, gets no such pin (the host model's default: off with iommu=pt)."""
    facts = {"kernel": {}, "engines": [], "nvidia_driver": _loaded(), "cpu_address_bits": 46}
    variables, comments, _, _ = adopt.variables_of(facts)
    assert variables["rigbook_pins"]["nvidia_driver"]["uvm_disable_hmm"] is False
    assert "46-bit physical addresses end within" in comments[("rigbook_pins", "nvidia_driver", "uvm_disable_hmm")]
    for bits in (52, None):
        variables, *_ = adopt.variables_of(dict(facts, cpu_address_bits=bits))
        assert "uvm_disable_hmm" not in variables["rigbook_pins"]["nvidia_driver"], bits
    variables, *_ = adopt.variables_of(dict(facts, uvm_disable_hmm=True))  # the owner's modprobe.d option: kept
    assert variables["rigbook_pins"]["nvidia_driver"]["uvm_disable_hmm"] is True


def test_an_nvidia_box_without_a_driver_or_toolchain_to_pin_says_so():
    facts = {"kernel": {}, "engines": [], "gpus": [{"slot": "0000:03:00.0", "vendor": "nvidia"}],
             "nvidia_driver": {"loaded": False, "version": None}}
    variables, _, unpinned, _ = adopt.variables_of(facts)
    assert "rigbook_pins" not in variables
    assert any(u.startswith("rigbook_pins.nvidia_driver: no nvidia module is loaded and DKMS has none") for u in
               unpinned)
    assert any(u.startswith("rigbook_pins.cuda_toolchain: no nvidia-cuda-nvcc wheel") for u in unpinned)
    # an AMD box names neither
    _, _, unpinned, _ = adopt.variables_of({"kernel": {}, "engines": [], "gpus": [{"vendor": "amd"}]})
    assert not [u for u in unpinned if "nvidia_driver" in u or "cuda_toolchain" in u]


def test_what_the_box_said_of_its_driver_is_checked_before_it_is_a_pin():
    bad = _loaded(version="615.71.09\nExecStartPre=+/bin/sh", userspace="{{ lookup('pipe','id') }}")
    variables, comments, unpinned, notes = adopt.variables_of({"kernel": {}, "engines": [], "nvidia_driver": bad})
    assert "rigbook_pins" not in variables
    assert any(u.startswith("rigbook_pins.nvidia_driver.version: the loaded module says") for u in unpinned)
    text = adopt.render("box", variables, comments, unpinned, notes)  # nothing but comments: no value came of it
    assert emit.load(text) is None and all(line == "---" or line.startswith("#") for line in text.splitlines())
    # stored facts of the wrong shape are read past
    for shape in ([1], "x", {"loaded": True, "version": "615.71.09", "userspace": "x"}):
        variables, *_ = adopt.variables_of({"kernel": {}, "engines": [], "nvidia_driver": shape,
                                            "apt_sources": ["x", {"uris": "https://repo.radeon.com/rocm/apt/7.1"}],
                                            "boot": "y", "gpus": "z"})
        assert "rigbook_manage" not in variables


def test_a_box_read_before_the_boot_reading_is_not_taken_for_a_vm():
    facts = {"kernel": {"release": "6.1.0-47-amd64", "cmdline": ["iommu=pt"]}, "engines": []}
    variables, _, _, _ = adopt.variables_of(facts)
    assert "rigbook_manage" not in variables and variables["rigbook_pins"]["kernel"]["cmdline"] == ["iommu=pt"]
    for boot in ({"modules_dir": True, "efi": False, "grub": []}, {"modules_dir": False, "efi": True, "grub": []},
                 {"modules_dir": False, "efi": False, "grub": ["/etc/default/grub"]}):
        assert "rigbook_manage" not in adopt.variables_of(dict(facts, boot=boot))[0]
    variables, _, _, _ = adopt.variables_of(dict(facts, boot={"modules_dir": False, "efi": False, "grub": []}))
    assert variables["rigbook_manage"] == {"kernel": False, "nvidia_driver": False}
    assert "kernel" not in variables.get("rigbook_pins", {})


def test_a_relative_path_the_box_resolved_is_pinned_absolute_and_said():
    scales = "/home/owner/scales/qwen38-fp8-kv-scales-per-head.json"
    engine = {"pid": 4242, "args": ["--model-path", "/srv/models/m", "--quantization-param-path", scales],
              "relative_paths": [["--quantization-param-path", "scales/qwen38-fp8-kv-scales-per-head.json", scales]]}
    variables, _, _, notes = adopt.variables_of({"kernel": {}, "engines": [engine]})
    [profile] = variables["rigbook_serve"]
    assert profile["extra_args"] == ["--quantization-param-path", scales]
    assert any("--quantization-param-path scales/qwen38-fp8-kv-scales-per-head.json is relative to the folder the "
               "engine was started in: written as " + scales in n for n in notes)
    # a stored reading of the wrong shape is read past
    variables, *_ = adopt.variables_of({"kernel": {}, "engines": [dict(engine, relative_paths="x")]})
    assert variables["rigbook_serve"][0]["extra_args"] == ["--quantization-param-path", scales]


def test_a_preloaded_collectives_library_is_kept_and_said():
    engine = {"pid": 69, "args": ["--model-path", "/srv/models/m", "--tp-size", "2"],
              "env": {"NCCL_P2P_LEVEL": "PHB", "LD_PRELOAD": "/home/owner/rccl/build/librccl.so.1"}}
    variables, _, _, notes = adopt.variables_of({"kernel": {}, "engines": [engine]})
    assert variables["rigbook_serve"][0]["env"]["LD_PRELOAD"] == "/home/owner/rccl/build/librccl.so.1"
    assert any("LD_PRELOAD puts /home/owner/rccl/build/librccl.so.1 in front of the engine's own NCCL/RCCL" in n
               for n in notes)
    engine["env"]["LD_PRELOAD"] = "/usr/lib/libjemalloc.so.2"  # not a collectives library: nothing said
    assert not [n for n in adopt.variables_of({"kernel": {}, "engines": [engine]})[3] if "LD_PRELOAD" in n]
