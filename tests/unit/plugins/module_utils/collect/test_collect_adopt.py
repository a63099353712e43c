"""collect/adopt.py: what `provision adopt` reads of a box set up by hand, from a laid-out system root and recorded
command outputs. BASH_POLICY is real (`apt-cache policy bash` on a Debian 12 machine, 2026-12: an installed version
the archive no longer offers); the kernel outputs are reconstructed in the same formats (dpkg-query with a tab
format, apt-cache policy) for a box like seed 004's, whose custom kernel .debs were installed with dpkg -i."""

from __future__ import annotations

import builtins
import hashlib
import os

from ansible_collections.rigbook.homelab.plugins.module_utils.collect import adopt, static_evidence
from ansible_collections.rigbook.homelab.plugins.module_utils.facts import packages

BASH_POLICY = """bash:
  Installed: 5.2.15-2+b8
  Candidate: 5.2.15-2+b13
  Version table:
     5.2.15-2+b13 500
        500 http://deb.debian.org/debian bookworm/main amd64 Packages
 *** 5.2.15-2+b8 100
        100 /var/lib/dpkg/status
"""
RELEASE = "6.8.12-r9700-p2p-dma44"
DPKG = (f"linux-image-{RELEASE}\tii \t6.8.12-1\nlinux-headers-{RELEASE}\tii \t6.8.12-1\n"
        "linux-image-6.8.0-31-generic\tii \t6.8.0-31.31\nlinux-libc-dev\tii \t6.8.0-31.31\nlinux-doc\tun \t\n")
POLICY = f"""linux-headers-{RELEASE}:
  Installed: 6.8.12-1
  Candidate: 6.8.12-1
  Version table:
 *** 6.8.12-1 100
        100 /var/lib/dpkg/status
linux-image-{RELEASE}:
  Installed: 6.8.12-1
  Candidate: 6.8.12-1
  Version table:
 *** 6.8.12-1 100
        100 /var/lib/dpkg/status
"""
ARCHIVE_POLICY = """linux-image-6.8.0-31-generic:
  Installed: 6.8.0-31.31
  Candidate: 6.8.0-31.31
  Version table:
 *** 6.8.0-31.31 500
        500 http://archive.ubuntu.com/ubuntu noble/main amd64 Packages
        100 /var/lib/dpkg/status
"""
CMDLINE = (f"BOOT_IMAGE=/vmlinuz-{RELEASE} root=/dev/mapper/ubuntu--vg-ubuntu--lv ro iommu=pt "
           "amd_iommu=on pci=realloc quiet splash vt.handoff=7\n")


def _box(tmp_path, release=RELEASE, debs=True):
    system = tmp_path / "system"
    (system / "proc/sys/kernel").mkdir(parents=True)
    (system / "proc/sys/kernel/osrelease").write_text(release + "\n")
    (system / "proc/cmdline").write_text(CMDLINE)
    (system / "etc/default/grub.d").mkdir(parents=True)
    (system / "etc/default/grub").write_text('GRUB_DEFAULT=0\nGRUB_TIMEOUT=5\n')
    (system / "etc/default/grub.d/50-p2p.cfg").write_text(
        f'GRUB_DEFAULT="Advanced options for Ubuntu>Ubuntu, with Linux {release}"\n')
    if debs:
        folder = system / "home/admin/kernel"
        folder.mkdir(parents=True)
        (folder / f"linux-image-{RELEASE}_6.8.12-1_amd64.deb").write_bytes(b"image deb")
        cache = system / "var/cache/apt/archives"
        cache.mkdir(parents=True)
        (cache / f"linux-headers-{RELEASE}_6.8.12-1_amd64.deb").write_bytes(b"headers deb")
    return system


def _run(outputs):
    def run(argv):
        return (0, outputs[argv[0]]) if argv[0] in outputs else (1, "")
    return run


def test_policy_of_a_version_the_archive_dropped_lists_only_the_dpkg_status():
    assert packages.parse_policy(BASH_POLICY) == {"bash": {"installed": "5.2.15-2+b8", "candidate": "5.2.15-2+b13",
                                                        "sources": ["100 /var/lib/dpkg/status"]}}
    assert adopt.origin(["100 /var/lib/dpkg/status"]) == "local"
    assert adopt.origin(packages.parse_policy(ARCHIVE_POLICY)["linux-image-6.8.0-31-generic"]["sources"]) == "archive"


def test_a_kernel_installed_from_debs_by_hand_is_found_with_its_files_and_hashes(tmp_path):
    system = _box(tmp_path)
    facts = adopt.kernel_facts(str(system), _run({"dpkg-query": DPKG, "apt-cache": POLICY}),
                               debs_dir="/home/admin/kernel")
    assert facts["release"] == RELEASE
    assert facts["cmdline"] == ["iommu=pt", "amd_iommu=on", "pci=realloc"]
    assert facts["grub_default"] == f"Advanced options for Ubuntu>Ubuntu, with Linux {RELEASE}"
    assert facts["grub_default_file"] == "/etc/default/grub.d/50-p2p.cfg"
    by_name = {p["name"]: p for p in facts["packages"]}
    assert sorted(by_name) == [f"linux-headers-{RELEASE}", f"linux-image-{RELEASE}"]
    assert by_name[f"linux-image-{RELEASE}"]["deb"] == {
        "path": f"/home/admin/kernel/linux-image-{RELEASE}_6.8.12-1_amd64.deb",
        "sha256": hashlib.sha256(b"image deb").hexdigest()}
    assert by_name[f"linux-headers-{RELEASE}"]["deb"]["path"].startswith("/var/cache/apt/archives/")
    assert {p["origin"] for p in facts["packages"]} == {"local"}


def test_a_deb_found_nowhere_is_none_and_an_archive_kernel_needs_no_file(tmp_path):
    system = _box(tmp_path, debs=False)
    facts = adopt.kernel_facts(str(system), _run({"dpkg-query": DPKG, "apt-cache": POLICY}))
    assert [p["deb"] for p in facts["packages"]] == [None, None]
    system2 = _box(tmp_path / "b", release="6.8.0-31-generic", debs=False)
    facts = adopt.kernel_facts(str(system2), _run({"dpkg-query": DPKG, "apt-cache": ARCHIVE_POLICY}))
    assert [(p["name"], p["origin"]) for p in facts["packages"]] == [("linux-image-6.8.0-31-generic", "archive")]
    assert "deb" not in facts["packages"][0]
    # the owner's copy of an archive package in --debs-dir (not the apt cache: apt's own downloads) is named
    folder = system2 / "srv/debs"
    folder.mkdir(parents=True)
    (folder / "linux-image-6.8.0-31-generic_6.8.0-31.31_amd64.deb").write_bytes(b"archive deb")
    facts = adopt.kernel_facts(str(system2), _run({"dpkg-query": DPKG, "apt-cache": ARCHIVE_POLICY}),
                               debs_dir="/srv/debs")
    assert facts["packages"][0]["origin"] == "archive" and facts["packages"][0]["deb"] == {
        "path": "/srv/debs/linux-image-6.8.0-31-generic_6.8.0-31.31_amd64.deb",
        "sha256": hashlib.sha256(b"archive deb").hexdigest()}


def test_a_box_without_dpkg_reads_the_kernel_and_no_packages(tmp_path):
    facts = adopt.kernel_facts(str(_box(tmp_path, debs=False)), _run({}))
    assert facts["release"] == RELEASE and facts["packages"] == []


def test_venv_packages_name_vcs_editable_and_index_installs(tmp_path):
    site = tmp_path / "system/opt/venv/lib/python3.12/site-packages"
    for stem, direct in (("sglang-0.5.23", {"url": "https://github.com/sgl-project/sglang.git",
                                            "vcs_info": {"vcs": "git", "commit_id": "a" * 40}}),
                         ("my_patch-0.1", {"url": "file:///home/u/patch", "dir_info": {"editable": True}}),
                         ("Torch-2.9.1", None)):
        info = site / f"{stem}.dist-info"
        info.mkdir(parents=True)
        if direct:
            (info / "direct_url.json").write_text(__import__("json").dumps(direct))
    found = adopt.venv_packages(str(tmp_path / "system"), "/opt/venv", 0)
    assert found == [
        {"name": "my-patch", "version": "0.1", "install": {"local": "editable", "url": "file:///home/u/patch"}},
        {"name": "sglang", "version": "0.5.23",
         "install": {"vcs": "git", "url": "https://github.com/sgl-project/sglang.git", "commit": "a" * 40}},
        {"name": "torch", "version": "2.9.1", "install": "index"}]


def test_the_words_after_a_double_dash_belong_to_init_not_the_kernel(tmp_path):
    system = _box(tmp_path, debs=False)
    (system / "proc/cmdline").write_text("BOOT_IMAGE=/vmlinuz ro iommu=pt -- --firecracker-init --addr x\n")
    assert adopt.kernel_facts(str(system), _run({}))["cmdline"] == ["iommu=pt"]


# `dkms status` as DKMS 3 prints it (module/version, kernel, arch: state); reconstructed for seed 000's fork.
DKMS_STATUS = ("nvidia/615.71.09, 6.1.0-47-amd64, x86_64: installed\n"
               "nvidia/615.71.09, 6.1.0-50-amd64, x86_64: built\n"
               "zfs/2.1.11, 6.1.0-47-amd64, x86_64: installed\n")


def test_dkms_modules_with_the_forks_git_origin_read_from_its_files(tmp_path):
    system = tmp_path / "system"
    git = system / "usr/src/nvidia-615.71.09/.git"
    (git / "refs/heads").mkdir(parents=True)
    (git / "HEAD").write_text("ref: refs/heads/615.71.09-p2p\n")
    (git / "refs/heads/615.71.09-p2p").write_text("3f2b1c0a" + "0" * 32 + "\n")
    (git / "config").write_text('[core]\n\tbare = false\n[remote "origin"]\n'
                                '\turl = https://github.com/tinygrad/open-gpu-kernel-modules\n'
                                '\tfetch = +refs/heads/*:refs/remotes/origin/*\n')
    lib = system / "usr/lib/x86_64-linux-gnu"
    lib.mkdir(parents=True)
    (lib / "libnvidia-ml.so.615.71.09").write_bytes(b"")
    (lib / "libnvidia-ml.so.1").symlink_to("libnvidia-ml.so.615.71.09")
    found = adopt.dkms_facts(str(system), _run({"dkms": DKMS_STATUS}))
    assert found == [
        {"module": "nvidia", "version": "615.71.09", "kernels": {"6.1.0-47-amd64": "installed",
                                                                 "6.1.0-50-amd64": "built"},
         "source": "/usr/src/nvidia-615.71.09",
         "git": {"repo": "https://github.com/tinygrad/open-gpu-kernel-modules", "branch": "615.71.09-p2p",
                 "commit": "3f2b1c0a" + "0" * 32}},
        {"module": "zfs", "version": "2.1.11", "kernels": {"6.1.0-47-amd64": "installed"}, "source": None,
         "git": None}]
    assert adopt.nvidia_userspace(str(system)) == "615.71.09"
    assert adopt.nvidia_userspace(str(tmp_path / "none")) is None
    # the lab's stand-in installer leaves only the versioned libcuda (the file the nvidia_p2p_driver role checks)
    other = tmp_path / "other/usr/lib/x86_64-linux-gnu"
    other.mkdir(parents=True)
    (other / "libcuda.so.1").write_bytes(b"")
    (other / "libcuda.so.615.71.09").write_bytes(b"")
    assert adopt.nvidia_userspace(str(tmp_path / "other")) == "615.71.09"
    assert adopt.dkms_facts(str(system), _run({})) == []  # no dkms on the box


def test_the_running_kernel_is_read_where_the_ladder_reads_it(tmp_path):
    # a lab host: its own /proc is this machine's; the kernel it booted is recorded in its evidence tree
    system = _box(tmp_path, release="6.18.0-host", debs=False)
    evidence = tmp_path / "evidence"
    (evidence / "proc/sys/kernel").mkdir(parents=True)
    (evidence / "proc/sys/kernel/osrelease").write_text(RELEASE + "\n")
    (evidence / "proc/cmdline").write_text("BOOT_IMAGE=/vmlinuz ro intel_iommu=on iommu=pt\n")
    facts = adopt.kernel_facts(str(system), _run({}), evidence_root=str(evidence))
    assert facts["release"] == RELEASE and facts["cmdline"] == ["intel_iommu=on", "iommu=pt"]
    assert facts["grub_default_file"] == "/etc/default/grub.d/50-p2p.cfg"  # GRUB is the box's own files


def _dist(site, stem, direct=None):
    info = site / f"{stem}.dist-info"
    info.mkdir(parents=True)
    if direct is not None:
        (info / "direct_url.json").write_text(direct if isinstance(direct, str) else __import__("json").dumps(direct))
    return info


def test_the_cuda_toolchain_venv_and_archive_installs(tmp_path):
    """/opt/rigbook/cuda laid out as the cuda_toolchain role leaves it (dist-info folders of the CUDA 13 wheels, as
    pip names them); an archive install's direct_url.json as PEP 610 writes it (pip 24: hashes and hash)."""
    system = tmp_path / "system"
    unpinned = []
    assert adopt.cuda_venv(str(system), {}, unpinned) is None and unpinned == []  # not a venv: nothing read
    venv = system / "opt/rigbook/cuda"
    site = venv / "lib/python3.11/site-packages"
    (venv / "pyvenv.cfg").parent.mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
    for stem in ("nvidia_cuda_nvcc-13.0.88", "nvidia_cuda_crt-13.0.88", "nvidia_nvvm-13.0.88",
                 "nvidia_cuda_runtime-13.0.96"):
        _dist(site, stem)
    _dist(site, "pip-23.0.1", {"url": "file:///tmp/w/pip-23.0.1-py3-none-any.whl",
                               "archive_info": {"hash": "sha256=" + "b" * 64, "hashes": {"sha256": "b" * 64}}})
    _dist(site, "broken-1.0", "{not json")
    found = adopt.cuda_venv(str(system), {}, unpinned)
    assert found["venv"] == "/opt/rigbook/cuda"
    assert [(p["name"], p["version"]) for p in found["packages"]] == [
        ("broken", "1.0"), ("nvidia-cuda-crt", "13.0.88"), ("nvidia-cuda-nvcc", "13.0.88"),
        ("nvidia-cuda-runtime", "13.0.96"), ("nvidia-nvvm", "13.0.88"), ("pip", "23.0.1")]
    by_name = {p["name"]: p["install"] for p in found["packages"]}
    assert by_name["pip"] == {"archive": "file:///tmp/w/pip-23.0.1-py3-none-any.whl", "sha256": "b" * 64}
    assert by_name["broken"] == {"local": "unreadable", "url": None}
    assert by_name["nvidia-cuda-nvcc"] == "index"


# An SGLang venv and its wheel, constructed by hand in the wheel format (PEP 427: RECORD rows of path,
# sha256=<urlsafe base64 without padding>, size; a script under ../../../bin): one file changed after the install, one
# deleted, one replaced by a link out of the venv, a row with an absolute path.
ORIGINAL = {"sglang/__init__.py": "__version__ = '0.5.23'\n",
            "sglang/srt/server_args.py": "API_KEY = None\nDEBUG = False\n",
            "sglang/srt/gone.py": "x = 1\n",
            "sglang/srt/linked.py": "y = 2\n"}


def _record_row(rel, data):
    import base64

    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{rel},sha256={digest},{len(data)}"


def _sglang_box(tmp_path):
    import zipfile

    system = tmp_path / "system"
    site = system / "opt/sgl/lib/python3.12/site-packages"
    (system / "opt/sgl/pyvenv.cfg").parent.mkdir(parents=True)
    (system / "opt/sgl/pyvenv.cfg").write_text("home = /usr/bin\n")
    info = "sglang-0.5.23.dist-info"
    rows = [_record_row(rel, text.encode()) for rel, text in ORIGINAL.items()]
    rows += ["../../../bin/sglang,sha256=AAAA,10", "/etc/shadow,sha256=AAAA,10", f"{info}/RECORD,,",
             "sglang/__pycache__/__init__.cpython-312.pyc,,"]
    for rel, text in ORIGINAL.items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_text(text)
    (site / info).mkdir()
    (site / info / "RECORD").write_text("\n".join(rows) + "\n")
    (site / "sglang/srt/server_args.py").write_text("API_KEY = None\nDEBUG = True\n")  # the local change
    (site / "sglang/srt/gone.py").unlink()
    (site / "sglang/srt/linked.py").unlink()
    (site / "sglang/srt/linked.py").symlink_to("/etc/hostname")
    wheels = system / "srv/wheels"
    wheels.mkdir(parents=True)
    with zipfile.ZipFile(wheels / "sglang-0.5.23-py3-none-any.whl", "w") as whl:
        for rel, text in ORIGINAL.items():
            whl.writestr(rel, text)
    (wheels / "sglang-0.5.22-py3-none-any.whl").write_bytes(b"another version")
    (wheels / "torch-2.9.1+cu128-cp312-cp312-manylinux_2_28_x86_64.whl").write_bytes(b"torch wheel")
    (wheels / "Not_A_Wheel.txt").write_text("")
    _dist(site, "torch-2.9.1+cu128")
    return system, site


def test_the_lock_inputs_local_changes_and_their_diff_from_the_wheel(tmp_path):
    import subprocess

    system, site = _sglang_box(tmp_path)
    packages = adopt.wheel_files(str(system), "/srv/wheels", adopt.venv_packages(str(system), "/opt/sgl", 0))
    assert [(p["name"], p["wheels"]) for p in packages] == [
        ("sglang", [{"path": "/srv/wheels/sglang-0.5.23-py3-none-any.whl",
                     "sha256": hashlib.sha256((system / "srv/wheels/sglang-0.5.23-py3-none-any.whl").read_bytes())
                     .hexdigest()}]),
        ("torch", [{"path": "/srv/wheels/torch-2.9.1+cu128-cp312-cp312-manylinux_2_28_x86_64.whl",
                    "sha256": hashlib.sha256(b"torch wheel").hexdigest()}])]
    found = adopt.sglang_files(str(system), "/opt/sgl", packages, 0)
    assert found["changed"] == [
        {"path": "sglang/srt/server_args.py", "state": "differs"},
        {"path": "sglang/srt/gone.py", "state": "missing"},
        {"path": "sglang/srt/linked.py", "state": "outside site-packages or behind a link (not read)"},
        {"path": "/etc/shadow", "state": "outside site-packages or behind a link (not read)"}]
    assert found["wheel"] == "/srv/wheels/sglang-0.5.23-py3-none-any.whl" and found["problem"] is None
    assert found["patch"].startswith("--- a/sglang/srt/server_args.py\n+++ b/sglang/srt/server_args.py\n")
    original = tmp_path / "original"  # the diff turns the wheel's file into the box's (patch -p1 in site-packages)
    (original / "sglang/srt").mkdir(parents=True)
    (original / "sglang/srt/server_args.py").write_text(ORIGINAL["sglang/srt/server_args.py"])
    subprocess.run(["patch", "-p1", "--quiet"], input=found["patch"], text=True, cwd=original, check=True)
    assert (original / "sglang/srt/server_args.py").read_text() == "API_KEY = None\nDEBUG = True\n"


def test_whose_venv_is_read_is_decided_from_its_folders_reached_without_a_link(tmp_path):
    import os

    system, site = _sglang_box(tmp_path)
    assert adopt.venv_owner(str(system), "/opt/sgl", 990) == (0, None)  # root's venv: read as root reads it
    os.chown(site, 990, 990)  # the engine's user may write site-packages: every file read as that user could
    assert adopt.venv_owner(str(system), "/opt/sgl", 990) == (990, None)
    os.chown(system / "opt/sgl", 1001, 1001)
    assert adopt.venv_owner(str(system), "/opt/sgl", 990) == (None, 1001)
    assert adopt.venv_owner(str(system), "/opt/sgl", 1001) == (None, 990)  # each folder is checked
    os.chown(system / "opt/sgl", 0, 0)
    assert adopt.venv_owner(str(system), "/opt/sgl", 0) == (None, 990)  # a root engine on a venv the user may change
    (system / "opt/link").symlink_to("sgl")
    assert adopt.venv_owner(str(system), "/opt/link", 0) == (None, "reached through a symbolic link")
    assert adopt.venv_owner(str(system), "/opt/none", 0) == (None, "unreadable (No such file or directory)")
    # a wheel that is a link is passed over, never hashed
    (system / "srv/wheels/torch-2.9.1+cu128-cp312-cp312-manylinux_2_28_x86_64.whl").unlink()
    (system / "srv/wheels/torch-2.9.1+cu128-cp312-cp312-manylinux_2_28_x86_64.whl").symlink_to("/etc/hostname")
    packages = adopt.wheel_files(str(system), "/srv/wheels", adopt.venv_packages(str(system), "/opt/sgl", 0))
    assert [(p["name"], len(p["wheels"])) for p in packages] == [("sglang", 1), ("torch", 0)]


def test_without_the_wheel_the_changes_are_named_and_no_diff_is_made(tmp_path):
    system, site = _sglang_box(tmp_path)
    packages = adopt.venv_packages(str(system), "/opt/sgl", 0)
    found = adopt.sglang_files(str(system), "/opt/sgl", packages, 0)
    assert found["patch"] is None and found["wheel"] is None and len(found["changed"]) == 4
    (site / "sglang-0.5.23.dist-info/RECORD").unlink()
    assert adopt.sglang_files(str(system), "/opt/sgl", packages, 0)["changed"] == [
        {"path": "sglang-0.5.23.dist-info/RECORD", "state": "missing"}]
    assert adopt.sglang_files(str(system), "/opt/none", packages, 0) is None
    assert adopt.wheel_files(str(system), "/no/such", packages)[0]["wheels"] == []


def test_a_changed_file_without_a_newline_at_its_end_and_one_the_wheel_lacks(tmp_path):
    import subprocess
    import zipfile

    wheel = tmp_path / "w.whl"
    with zipfile.ZipFile(wheel, "w") as whl:
        whl.writestr("pkg/a.py", "a = 1")
    site = tmp_path / "site"
    (site / "pkg").mkdir(parents=True)
    (site / "pkg/a.py").write_text("a = 2")
    text, problem = adopt.local_patch(str(tmp_path), "/site", "/w.whl", [{"path": "pkg/a.py"}], 0)
    assert problem is None and "\\ No newline at end of file" in text
    copy = tmp_path / "copy"
    (copy / "pkg").mkdir(parents=True)
    (copy / "pkg/a.py").write_text("a = 1")
    subprocess.run(["patch", "-p1", "--quiet"], input=text, text=True, cwd=copy, check=True)
    assert (copy / "pkg/a.py").read_text() == "a = 2"
    assert adopt.local_patch(str(tmp_path), "/site", "/w.whl", [{"path": "pkg/b.py"}], 0) == (
        None, "pkg/b.py is not in /w.whl")
    (tmp_path / "bad.whl").write_bytes(b"not a zip")
    assert "could not be read" in adopt.local_patch(str(tmp_path), "/site", "/bad.whl", [], 0)[1]
    # the wheel and the installed file are opened without following a link
    (tmp_path / "link.whl").symlink_to(wheel)
    assert adopt.local_patch(str(tmp_path), "/site", "/link.whl", [{"path": "pkg/a.py"}], 0) == (
        None, "/link.whl: a symbolic link on the way (not read)")
    (site / "pkg/a.py").unlink()
    (site / "pkg/a.py").symlink_to(copy / "pkg/a.py")
    assert adopt.local_patch(str(tmp_path), "/site", "/w.whl", [{"path": "pkg/a.py"}], 0) == (
        None, "/site/pkg/a.py: a symbolic link on the way (not read)")


# ROCm on a box as the amd_rocm role leaves it in the lab (inventory/lab x99_r9700: TEST STAND-IN packages in a local
# file:// repository), reconstructed: the .sources file in the form apt_source writes it, dpkg-query in DPKG_QUERY's
# format, `apt-mark showmanual` (one name a line) and `apt-cache policy rocm-core` (apt prints a file:/// URI as
# file:/). Besides it, sources of the other shapes: a one-line .list with options, a deb822 key inline, a Signed-By
# pointing out of the keyring folders.
ROCM_DPKG = ("bash\tii \t5.2.15-2+b8\nrocm-core\thi \t7.1.0.70100-38~24.04\nrocminfo\thi \t1.0.0.70100-38~24.04\n"
             "rocm-smi-lib\thi \t7.8.0.70100-38~24.04\nhip-runtime-amd\thi \t7.1.25424.70100-38~24.04\n"
             "hsa-rocr\tii \t1.18.0.70100-38~24.04\n")
ROCM_POLICY = """rocm-core:
  Installed: 7.1.0.70100-38~24.04
  Candidate: 7.1.0.70100-38~24.04
  Version table:
 *** 7.1.0.70100-38~24.04 1001
        500 file:/var/cache/rigbook/artifacts/rocm-repo noble/main amd64 Packages
        100 /var/lib/dpkg/status
"""
KEY = b"-----BEGIN PGP PUBLIC KEY BLOCK-----\n\nmQINBGTEST-STAND-IN\n-----END PGP PUBLIC KEY BLOCK-----\n"


def _rocm_box(tmp_path):
    system = tmp_path / "system"
    (system / "opt/rocm/.info").mkdir(parents=True)
    (system / "opt/rocm/.info/version").write_text("7.1.0-38\n")
    lists = system / "etc/apt/sources.list.d"
    lists.mkdir(parents=True)
    (system / "etc/apt/sources.list").write_text("deb http://deb.debian.org/debian bookworm main\n# deb-src x y\n")
    (system / "etc/apt/keyrings").mkdir()
    (system / "etc/apt/keyrings/rigbook-rocm.asc").write_bytes(KEY)
    (lists / "rigbook-rocm.sources").write_text(
        "# Managed by rigbook (rigbook.homelab.apt_source): rocm\nTypes: deb\n"
        "URIs: file:///var/cache/rigbook/artifacts/rocm-repo\nSuites: noble\nComponents: main\n"
        "Signed-By: /etc/apt/keyrings/rigbook-rocm.asc\n")
    (lists / "amdgpu.list").write_text("deb [arch=amd64 signed-by=/etc/apt/keyrings/rocm.gpg] "
                                       "https://repo.radeon.com/amdgpu/7.1/ubuntu noble main # AMD's\n")
    (lists / "odd.sources").write_text("Types: deb\nURIs: https://a.example/x\nSuites: s\nComponents: c\n"
                                       "Signed-By:\n -----BEGIN PGP PUBLIC KEY BLOCK-----\n .\n abc\n\n"
                                       "Types: deb\nURIs: https://b.example/y\nSuites: t\nSigned-By: /etc/shadow\n\n"
                                       "Enabled: no\nTypes: deb\nURIs: https://c.example/z\nSuites: u\n")
    (system / "etc/shadow").write_text("root:secret\n")
    return system


def test_rocm_its_packages_the_source_that_offers_them_and_its_keyring(tmp_path):
    system = _rocm_box(tmp_path)
    run = _run({"dpkg-query": ROCM_DPKG, "apt-cache": ROCM_POLICY,
                "apt-mark": "bash\nhip-runtime-amd\nrocm-core\nrocm-smi-lib\nrocminfo\n"})
    found = adopt.rocm_facts(str(system), run)
    assert found["version_file"] == "7.1.0-38"
    assert sorted(found["packages"]) == ["hip-runtime-amd", "hsa-rocr", "rocm-core", "rocm-smi-lib", "rocminfo"]
    assert found["manual"] == ["hip-runtime-amd", "rocm-core", "rocm-smi-lib", "rocminfo"]
    assert found["policy"] == ["500 file:/var/cache/rigbook/artifacts/rocm-repo noble/main amd64 Packages",
                               "100 /var/lib/dpkg/status"]
    by_file = {(e["file"], e["uris"][0]): e for e in found["sources"]}
    assert by_file[("/etc/apt/sources.list.d/amdgpu.list", "https://repo.radeon.com/amdgpu/7.1/ubuntu")] == {
        "file": "/etc/apt/sources.list.d/amdgpu.list", "types": ["deb"], "suites": ["noble"],
        "uris": ["https://repo.radeon.com/amdgpu/7.1/ubuntu"], "components": ["main"],
        "signed_by": ["/etc/apt/keyrings/rocm.gpg"]}
    assert by_file[("/etc/apt/sources.list.d/odd.sources", "https://a.example/x")]["signed_by"] == "inline"
    assert ("/etc/apt/sources.list.d/odd.sources", "https://c.example/z") not in by_file  # Enabled: no
    assert found["keyrings"] == {
        "/etc/apt/keyrings/rigbook-rocm.asc": hashlib.sha256(KEY).hexdigest(),
        "/etc/apt/keyrings/rocm.gpg": "not read: no file of at most 1048576 bytes",
        "/etc/shadow": "not read: a keyring outside /etc/apt/ and /usr/share/keyrings/"}
    assert adopt.rocm_facts(str(tmp_path / "bare"), _run({"dpkg-query": "bash\tii \t5.2\n"})) is None


def test_the_build_stamp_of_the_prefix_a_mapped_rccl_lies_in(tmp_path):
    """A prefix as source_build leaves it (<root>/<version>-<patch set>/lib and its .rigbook-build.json); the stamp's
    content is source_build's own shape, constructed here."""
    system = tmp_path / "system"
    prefix = system / "opt/rigbook/rccl/2.27.7-0a1b2c3d"
    (prefix / "lib").mkdir(parents=True)
    (prefix / "lib/librccl.so.1.0").write_bytes(b"")
    (prefix / ".rigbook-build.json").write_text('{"name": "rccl", "version": "2.27.7"}\n')
    assert adopt.build_stamp(str(system), "/opt/rigbook/rccl/2.27.7-0a1b2c3d/lib/librccl.so.1.0", 0) == {
        "path": "/opt/rigbook/rccl/2.27.7-0a1b2c3d/.rigbook-build.json", "stamp": {"name": "rccl", "version": "2.27.7"}}
    (system / "opt/rocm/lib").mkdir(parents=True)
    assert adopt.build_stamp(str(system), "/opt/rocm/lib/librccl.so.1", 0) is None
    (prefix / ".rigbook-build.json").write_text("[not a stamp")
    assert adopt.build_stamp(str(system), "/opt/rigbook/rccl/2.27.7-0a1b2c3d/lib/librccl.so.1.0", 0)["stamp"] is None


def test_rigbooks_own_files_on_a_box_are_read_as_rigbook_wrote_them(tmp_path):
    # written here in the formats the roles write (gpu_env, pinned_venv, the nvidia_p2p_driver role's modprobe file)
    system = tmp_path / "system"
    (system / "etc/rigbook").mkdir(parents=True)
    (system / "etc/rigbook/gpu.env").write_text("# rigbook: the GPU stack's environment\n# BEGIN cuda_toolchain\n"
                                                "CUDA_HOME=/opt/rigbook/cuda/nvidia/cu13\n# END cuda_toolchain\n")
    assert adopt.env_file_values(str(system), "/etc/rigbook/gpu.env") == {"CUDA_HOME": "/opt/rigbook/cuda/nvidia/cu13"}
    assert adopt.env_file_values(str(system), "/etc/rigbook/none.env") == {}
    venv = system / "opt/rigbook/sglang/0.5.23-x"
    venv.mkdir(parents=True)
    assert adopt.venv_stamp(str(system), "/opt/rigbook/sglang/0.5.23-x", 0) == (None, None)
    (venv / ".rigbook-venv.json").write_text('{"no_deps": true, "patches": []}\n')
    assert adopt.venv_stamp(str(system), "/opt/rigbook/sglang/0.5.23-x", 0) == ({"no_deps": True, "patches": []}, None)
    (venv / ".rigbook-venv.json").write_text("[1, 2]\n")  # not a stamp
    assert adopt.venv_stamp(str(system), "/opt/rigbook/sglang/0.5.23-x", 0) == (
        None, "/opt/rigbook/sglang/0.5.23-x/.rigbook-venv.json is not a JSON object")
    (system / "etc/modprobe.d").mkdir(parents=True)
    assert static_evidence.uvm_disable_hmm_configured(str(system)) is False
    (system / "etc/modprobe.d/nvidia-uvm-hmm.conf").write_text("options nvidia_uvm uvm_disable_hmm=1\n")
    assert static_evidence.uvm_disable_hmm_configured(str(system)) is True


def test_the_flags_an_installed_sglang_defines_from_its_argument_calls_and_fields(tmp_path):
    site = tmp_path / "opt/v/lib/python3.11/site-packages"
    # shaped as SGLang 0.5.23's sources: a few flags by add_argument, most from annotated dataclass fields
    (site / "sglang/srt/arg_groups/fields").mkdir(parents=True)
    (site / "sglang/srt/server_args.py").write_text('        parser.add_argument(\n            "--config",\n'
                                                     '            type=str,\n        )\n')
    (site / "sglang/srt/arg_groups/fields/schedule.py").write_text(
        "class ScheduleArgs:\n    max_total_tokens: A[\n        Optional[int],\n    ] = None\n"
        '    model_path: A[str, Arg(help="Path.", aliases=["--model"])]\n    not_a_flag = 3\n')
    (site / "sglang/srt/arg_groups/elsewhere.py").symlink_to("/etc/passwd")  # a link is never read
    assert adopt.sglang_flags(str(tmp_path), "/opt/v", 0) == ["--config", "--max-total-tokens", "--model",
                                                          "--model-path"]
    # no sources to judge by: None, not an empty list that would call every flag unknown
    assert adopt.sglang_flags(str(tmp_path), "/opt/none", 0) is None
    (site / "sglang/srt/server_args.py").unlink()
    (site / "sglang/srt/arg_groups/fields/schedule.py").write_text("nothing here\n")
    assert adopt.sglang_flags(str(tmp_path), "/opt/v", 0) is None


def _engine(system, pid, argv, uid, environ=b"NCCL_DEBUG=INFO\0"):
    """A process as Linux shows it: NUL-separated cmdline and environ, status with its Uid line, cgroup v2, maps."""
    folder = system / "proc" / str(pid)
    folder.mkdir(parents=True)
    (folder / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")
    (folder / "environ").write_bytes(environ)
    (folder / "status").write_text(f"Name:\tpython3\nPid:\t{pid}\nPPid:\t1\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n")
    (folder / "cgroup").write_text("0::/system.slice/sglang.service\n")
    (folder / "maps").write_text("7f0000000000-7f0000100000 r-xp 00000000 08:01 1234 /opt/rccl/lib/librccl.so.1\n")
    os.symlink(argv[0], folder / "exe")


def test_another_users_engine_is_read_no_further_than_its_cmdline_and_owner(tmp_path, monkeypatch):
    system = tmp_path / "system"
    (system / "etc").mkdir(parents=True)
    (system / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/bash\n"
                                       "rigbook-serve:x:990:990::/var/lib/rigbook-serve:/usr/sbin/nologin\n"
                                       "mallory:x:1001:1001::/home/mallory:/bin/bash\n")
    (system / "home/mallory/v/bin").mkdir(parents=True)
    (system / "home/mallory/v/pyvenv.cfg").write_text("home = /usr/bin\n")
    _engine(system, 4100, ["/usr/bin/python3", "-m", "sglang.launch_server", "--model-path", "/m"], 990)
    _engine(system, 5100, ["/home/mallory/v/bin/python3", "-m", "sglang.launch_server", "--model-path", "/m"], 1001,
            environ=b"NCCL_DEBUG=mallory\0")
    touched = []

    def recording(real):
        def call(file, *args, **kwargs):
            touched.append(os.fspath(file) if isinstance(file, (str, bytes, os.PathLike)) else file)
            return real(file, *args, **kwargs)
        return call

    monkeypatch.setattr(builtins, "open", recording(builtins.open))
    for name in ("open", "stat", "lstat", "readlink"):
        monkeypatch.setattr(os, name, recording(getattr(os, name)))
    facts = adopt.adopt_facts(str(system), _run({}))
    monkeypatch.undo()
    assert [e["pid"] for e in facts["engines"]] == [4100] and facts["engines"][0]["env"] == {"NCCL_DEBUG": "INFO"}
    assert any(n.startswith("the engine /proc/5100 runs as user mallory: skipped, not read")
               for n in facts["checks"]["notes"])
    paths = [p for p in touched if isinstance(p, str)]
    proc = str(system / "proc") + "/"
    assert {p[len(proc):] for p in paths if p.startswith(proc + "5100/")} == {"5100/cmdline", "5100/status"}
    assert {"4100/environ", "4100/exe", "4100/maps"} <= {p[len(proc):] for p in paths if p.startswith(proc + "4100/")}
    assert not [p for p in paths if "mallory" in p]  # nothing of its venv either
