"""facts/kernel.py: the running release, the command line, and the words every boot has (never a pin)."""

from __future__ import annotations

import pytest
from ansible_collections.rigbook.homelab.plugins.module_utils.facts import kernel

# seed 000's 3080 box (Ubuntu, HWE kernel 7.0.0-31, IOMMU in passthrough): the shape of its /proc/cmdline,
# reconstructed from the write-up's GRUB line.
SEED_CMDLINE = ("BOOT_IMAGE=/boot/vmlinuz-7.0.0-31-generic root=UUID=0c4e2f6a-1b7d-4f55-9d1e-2b8f3f0c9a11 ro quiet "
                "splash intel_iommu=on iommu=pt vt.handoff=7")


def _tree(tmp_path, release, cmdline):
    (tmp_path / "proc" / "sys" / "kernel").mkdir(parents=True)
    (tmp_path / "proc" / "sys" / "kernel" / "osrelease").write_text(release + "\n")
    (tmp_path / "proc" / "cmdline").write_text(cmdline + "\n")
    return str(tmp_path)


def test_release_and_cmdline_under_a_recorded_root(tmp_path):
    root = _tree(tmp_path, "7.0.0-31-generic", SEED_CMDLINE)
    assert kernel.release(root) == "7.0.0-31-generic"
    assert kernel.cmdline(root)[0] == "BOOT_IMAGE=/boot/vmlinuz-7.0.0-31-generic"
    assert kernel.release(str(tmp_path / "nothing")) is None and kernel.cmdline(str(tmp_path / "nothing")) is None


def test_a_release_of_another_shape_is_none():
    assert kernel.parse_release("6.8.0-90-generic") == "6.8.0-90-generic"
    assert kernel.parse_release("6.8.0 {{ lookup('pipe','id') }}") is None
    assert kernel.parse_release("") is None


def test_own_words_leave_out_every_boot_only_word_and_stop_at_the_init_arguments():
    assert kernel.own_words(SEED_CMDLINE) == ["intel_iommu=on", "iommu=pt"]
    assert kernel.own_words(["amd_iommu=on", "--", "single"]) == ["amd_iommu=on"]
    assert kernel.own_words(None) == []


def test_host_words_are_this_hosts_own_disks():
    words = kernel.parse_cmdline(SEED_CMDLINE + " resume=UUID=abc")
    assert kernel.host_words(words) == ["root=UUID=0c4e2f6a-1b7d-4f55-9d1e-2b8f3f0c9a11", "resume=UUID=abc"]


def test_parse_cmdline_is_bounded():
    words = kernel.parse_cmdline("x" * 5000 + " " + "y " * 1000)
    assert len(words) == kernel.MAX_WORDS and len(words[0]) == kernel.MAX_WORD
    assert kernel.parse_cmdline(None) is None


# --- the boot words a pin carries (issue 35): only the P2P stack's, the list in one place ---------------------------

# The real VM's /proc/cmdline (tests/fixtures/evidence/h200-vm, captured): its host's own words, then init's
def _vm_cmdline(fixtures):
    return (fixtures / "evidence/h200-vm/proc/cmdline").read_text()


def test_the_vms_boot_words_are_all_left_alone_and_nothing_after_the_dashes_is_a_parameter(fixtures):
    pinned, left = kernel.p2p_words(_vm_cmdline(fixtures))
    assert pinned == ["pci=realloc=off"]  # a pci= word: the only one the P2P stack reads
    assert left[:4] == ["mitigations=auto,no_guest_host,no_guest_guest", "console=ttyS0", "reboot=k", "panic=1"]
    assert "rdinit=/process_api" in left and "quiet" not in left  # a boot-only word is neither
    assert not [w for w in pinned + left if w.startswith("--") or "0.0.0.0" in w]  # init's arguments are no words


def test_the_seeds_boot_words_are_pinned():
    assert kernel.p2p_words(SEED_CMDLINE) == (["intel_iommu=on", "iommu=pt"], [])


@pytest.mark.parametrize("word", [
    "intel_iommu=on", "amd_iommu=on", "iommu=pt", "iommu.passthrough=1", "iommu.strict=0", "iommu.forcedac=1",
    "pci=realloc", "pci=noaer", "pci=nommconf", "pcie_aspm=off", "pcie_aspm.policy=performance",
    "pcie_acs_override=downstream,multifunction", "pcie_ports=native", "pcie_port_pm=off",
    "nvidia.NVreg_EnableStreamMemOPs=1", "nvidia_uvm.uvm_disable_hmm=1", "nvidia-uvm.uvm_disable_hmm=1",
    "nvidia-drm.modeset=1", "nvidia_drm.fbdev=1", "amdgpu.ppfeaturemask=0xffffffff", "nouveau.modeset=0",
    "modprobe.blacklist=nouveau", "rd.driver.blacklist=nouveau", "module_blacklist=nouveau",
])
def test_what_the_p2p_stack_reads_is_pinned(word):
    assert kernel.is_p2p_word(word) and kernel.p2p_words([word]) == ([word], [])


@pytest.mark.parametrize("word", [
    "console=ttyS0", "panic=1", "rdinit=/process_api", "reboot=k", "fc_dmapin=0xeebe0000,0x3000,0xeebf0000",
    "iomem=relaxed", "memmap=2G$4G", "swiotlb=noforce", "mitigations=off", "hugepages=16", "video=efifb:off",
    "iommu.foo=1", "nvidiafb.mode=1", "amdgpux.x=1", "nvidia", "pcie",
])
def test_every_other_word_is_left_alone(word):
    assert not kernel.is_p2p_word(word) and kernel.p2p_words([word]) == ([], [word])


# --- the loaded driver's file, how it got there, its userspace; how the box boots ------------------------------------

RELEASE = "7.0.0-31-generic"
# depmod's modules.dep of a box where seed 000's fork went in by its own `make modules_install` (paths relative to
# /lib/modules/<release>, dependencies after the colon), reconstructed from depmod's format
DEP = ("kernel/drivers/video/nvidia-modeset.ko: kernel/drivers/video/nvidia.ko\n"
       "kernel/drivers/video/nvidia.ko:\n"
       "kernel/drivers/video/nvidia-uvm.ko: kernel/drivers/video/nvidia.ko\n")


def test_modules_dep_names_the_file_a_module_loads_from():
    assert kernel.parse_modules_dep(DEP, "nvidia") == "kernel/drivers/video/nvidia.ko"
    assert kernel.parse_modules_dep(DEP, "nvidia_uvm") == "kernel/drivers/video/nvidia-uvm.ko"  # - and _ alike
    assert kernel.parse_modules_dep("updates/dkms/nvidia.ko.zst:\n", "nvidia") == "updates/dkms/nvidia.ko.zst"
    old_depmod = "/lib/modules/5.4/extra/nvidia.ko"
    assert kernel.parse_modules_dep(old_depmod + ":\n", "nvidia") == old_depmod
    assert kernel.parse_modules_dep(DEP, "amdgpu") is None and kernel.parse_modules_dep(None, "nvidia") is None


def test_the_module_file_from_modules_dep_else_modinfo_on_a_live_box(tmp_path):
    folder = tmp_path / "lib/modules" / RELEASE
    folder.mkdir(parents=True)
    (folder / "modules.dep").write_text(DEP)
    assert kernel.module_file(str(tmp_path), RELEASE, "nvidia") == (
        f"/lib/modules/{RELEASE}/kernel/drivers/video/nvidia.ko", f"/lib/modules/{RELEASE}/modules.dep")
    asked = []

    def modinfo(argv):
        asked.append(argv)
        return 0, "/lib/modules/6.8.0-90-generic/kernel/nvidia-580/nvidia.ko\n"
    assert kernel.module_file(str(tmp_path), "6.8.0-90-generic", "nvidia", modinfo) == (
        "/lib/modules/6.8.0-90-generic/kernel/nvidia-580/nvidia.ko", "modinfo -n nvidia")
    assert asked == [["modinfo", "-n", "nvidia"]]
    # the VM: no /lib/modules at all, no modinfo either
    assert kernel.module_file(str(tmp_path), "6.18.44-fc-v1252-gpu", "nvidia", lambda argv: (-1, "")) == (
        None, "no /lib/modules/6.18.44-fc-v1252-gpu/modules.dep")
    assert kernel.module_file(str(tmp_path), RELEASE, "amdgpu")[1] == \
        f"/lib/modules/{RELEASE}/modules.dep lists no amdgpu module"


@pytest.mark.parametrize("path, way", [
    (f"/lib/modules/{RELEASE}/updates/dkms/nvidia.ko.zst", "dkms"),
    (f"/lib/modules/{RELEASE}/kernel/drivers/video/nvidia.ko", "make modules_install"),  # seed 000's way
    (f"/usr/lib/modules/{RELEASE}/kernel/drivers/video/nvidia.ko", "make modules_install"),
    (f"/lib/modules/{RELEASE}/kernel/nvidia-580/nvidia.ko", "package"),  # Ubuntu's linux-modules-nvidia-580-*
    (f"/lib/modules/{RELEASE}/kernel/nvidia-580-open/nvidia.ko", "package"),
    (f"/lib/modules/{RELEASE}/kernel/drivers/gpu/drm/amd/amdgpu/amdgpu.ko.zst", "package"),  # the kernel's own
    (f"/lib/modules/{RELEASE}/extra/nvidia/nvidia.ko", "package"),  # a kmod package
    (f"/lib/modules/{RELEASE}/misc/nvidia.ko", "unknown"), ("/opt/nvidia.ko", "unknown"), (None, "unknown"),
    ("/lib/modules/6.8.0-90-generic/updates/dkms/nvidia.ko", "unknown"),  # another release's
])
def test_how_the_module_file_got_there(path, way):
    assert kernel.installed_by(path, RELEASE) == way


# `ldconfig -p` as glibc prints it (the header line, then one line a library), reconstructed for the VM's
# libraries in /usr/local/nvidia/lib64 (real-gpu-run.md) and a distribution's
LDCONFIG = ("412 libs found in cache `/etc/ld.so.cache'\n"
            "\tlibnvidia-ml.so.1 (libc6,x86-64) => /usr/local/nvidia/lib64/libnvidia-ml.so.1\n"
            "\tlibcuda.so.1 (libc6,x86-64) => /usr/local/nvidia/lib64/libcuda.so.1\n"
            "\tlibcuda.so (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcuda.so\n"
            "\tlibc.so.6 (libc6,x86-64, OS ABI: Linux 3.2.0) => /lib/x86_64-linux-gnu/libc.so.6\n")


def test_the_loaders_folders_and_the_userspace_version_found_there(tmp_path):
    assert kernel.parse_ldconfig(LDCONFIG) == ["/usr/local/nvidia/lib64", "/usr/lib/x86_64-linux-gnu"]
    lib64 = tmp_path / "usr/local/nvidia/lib64"
    lib64.mkdir(parents=True)
    for name in ("libcuda.so.1", "libcuda.so.580.159.04", "libnvidia-ml.so.1", "libnvidia-ml.so.580.159.04"):
        (lib64 / name).write_bytes(b"")
    usr = tmp_path / "usr/lib/x86_64-linux-gnu"
    usr.mkdir(parents=True)
    (usr / "libnvidia-ml.so.550.54.14").write_bytes(b"")
    # in the loader's order: what LD_LIBRARY_PATH or the cache names first wins
    assert kernel.driver_userspace(str(tmp_path), ["/nowhere", "/usr/local/nvidia/lib64", "/usr/lib/x86_64-linux-gnu"]
                                   ) == {"version": "580.159.04",
                                         "path": "/usr/local/nvidia/lib64/libnvidia-ml.so.580.159.04"}
    assert kernel.driver_userspace(str(tmp_path), list(kernel.DRIVER_LIBRARY_DIRS[1:]))["version"] == "550.54.14"
    (lib64 / "libnvidia-ml.so.580.159.04").unlink()
    assert kernel.driver_userspace(str(tmp_path), ["/usr/local/nvidia/lib64"])["path"].endswith(
        "libcuda.so.580.159.04")
    assert kernel.driver_userspace(str(tmp_path), ["relative", 7, "/usr/lib64"]) is None
    assert kernel.parse_driver_version("580.159.04\n580.159.04\n") == "580.159.04"
    assert kernel.parse_driver_version("No devices were found") is None and kernel.parse_driver_version(None) is None


def test_how_the_box_boots(tmp_path, fixtures):
    vm = str(fixtures / "evidence/h200-vm")  # the real capture: no /lib/modules, no EFI
    assert kernel.boot_facts(str(tmp_path), vm, "6.18.44-fc-v973-gpu") == {"modules_dir": False, "efi": False,
                                                                            "grub": []}
    (tmp_path / "lib/modules" / RELEASE).mkdir(parents=True)
    (tmp_path / "sys/firmware/efi").mkdir(parents=True)
    (tmp_path / "etc/default").mkdir(parents=True)
    (tmp_path / "etc/default/grub").write_text("GRUB_DEFAULT=0\n")
    assert kernel.boot_facts(str(tmp_path), str(tmp_path), RELEASE) == {"modules_dir": True, "efi": True,
                                                                        "grub": ["/etc/default/grub"]}
    assert kernel.boot_facts(str(tmp_path), None, None)["modules_dir"] is False
    assert kernel.module_loaded(vm, "nvidia") and not kernel.module_loaded(str(tmp_path), "nvidia")


def test_nvidia_smi_off_the_path_where_a_cloud_image_keeps_it(tmp_path):
    asked = []

    def smi(argv):  # nvidia-smi --query-gpu=driver_version prints one line a GPU (the real VM's: 580.159.04)
        asked.append(argv)
        return 0, "580.159.04\n"
    assert kernel.smi_userspace(str(tmp_path), smi) == (None, None) and asked == []  # not there: not run
    (tmp_path / "usr/local/nvidia/bin").mkdir(parents=True)
    (tmp_path / "usr/local/nvidia/bin/nvidia-smi").write_bytes(b"")
    assert kernel.smi_userspace(str(tmp_path), smi) == ("580.159.04", "/usr/local/nvidia/bin/nvidia-smi")
    assert asked == [["/usr/local/nvidia/bin/nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]]
    assert kernel.smi_userspace(str(tmp_path), lambda argv: (9, "NVIDIA-SMI has failed")) == (None, None)


def test_the_boot_id_is_read_under_the_root_and_typed(tmp_path):
    folder = tmp_path / "proc" / "sys" / "kernel" / "random"
    folder.mkdir(parents=True)
    assert kernel.boot_id(str(tmp_path)) is None
    (folder / "boot_id").write_text("3f2a8c1e-6d4b-4c55-9a0e-2b7d1f6e8a90\n")
    assert kernel.boot_id(str(tmp_path)) == "3f2a8c1e-6d4b-4c55-9a0e-2b7d1f6e8a90"
    (folder / "boot_id").write_text("not a boot id; rm -rf /\n")
    assert kernel.boot_id(str(tmp_path)) is None
