"""module_utils/deb_store.py: the rules of the controller's store of a distribution kernel's .debs - what the kernel is
installed as per OS, which installed packages are kept, the package index's SHA256 of a version, the store's record,
the decision to install from the stored files, and the box's note read back for the host manifest.

SHOW is RECORDED: `apt-cache show` output pasted in the Ubuntu forum thread "Cannot Update Ubuntu 18.04 HWE Kernel?"
(msantangelosdoc, 2023-10-27; two of its stanzas, verbatim: one in the archive's field order, one in the ESM index's
order). The dpkg status stanza (an installed version no index lists any more) and the policy outputs are
RECONSTRUCTED in apt 2.7's formats (tests/fixtures/ubuntu/SOURCES.md describes apt-cache policy's).
"""

from __future__ import annotations

import json

import pytest
from ansible_collections.rigbook.homelab.plugins.module_utils import deb_store
from ansible_collections.rigbook.homelab.plugins.module_utils.facts import packages

SHOW = """\
Package: linux-image-5.4.0-144-generic
Architecture: amd64
Version: 5.4.0-144.161~18.04.1
Built-Using: linux-hwe-5.4 (= 5.4.0-144.161~18.04.1)
Priority: optional
Section: kernel
Source: linux-signed-hwe-5.4
Origin: Ubuntu
Maintainer: Canonical Kernel Team <kernel-team@lists.ubuntu.com>
Bugs: https://bugs.launchpad.net/ubuntu/+filebug
Installed-Size: 10748
Provides: aufs-dkms, fuse-module, ivtv-modules, kvm-api-4, linux-hwe-5.4-image, redhat-cluster-modules, spl-dkms, \
spl-modules, virtualbox-guest-dkms, virtualbox-guest-modules, zfs-dkms, zfs-modules
Depends: kmod, linux-base (>= 4.5ubuntu1~16.04.1), linux-modules-5.4.0-144-generic
Recommends: grub-pc | grub-efi-amd64 | grub-efi-ia32 | grub | lilo, initramfs-tools | linux-initramfs-tool
Suggests: fdutils, linux-hwe-5.4-doc-5.4.0 | linux-hwe-5.4-source-5.4.0, linux-hwe-5.4-tools, \
linux-headers-5.4.0-144-generic
Conflicts: linux-image-unsigned-5.4.0-144-generic
Filename: pool/main/l/linux-signed-hwe-5.4/linux-image-5.4.0-144-generic_5.4.0-144.161~18.04.1_amd64.deb
Size: 10571604
MD5sum: abfdf663aea2decf5546d39a2c4ea1d4
SHA1: c6c7ebf305648dad08edb37cb3b2f9e539170104
SHA256: 5b9cb86065c95649934f3d84165a5a167d6c6ee9de0840a3527f5e15ec36ecdb
SHA512: c1705d53c65b27650a02e081c3a8d0d41b18a92415635ceb8350156659efbe1569013c044728318f90225406a889d421b364f2da6d3f8\
abaf2b1f004f195dd44
Description-en: Signed kernel image generic
 A kernel image for generic.  This version of it is signed with
 Canonical's signing key.
Description-md5: b0fd0df88b1cd31408007b00d2458952
Supported: 5y


Package: linux-image-5.4.0-155-generic
Source: linux-signed-hwe-5.4
Priority: optional
Section: kernel
Installed-Size: 10772
Maintainer: Canonical Kernel Team <kernel-team@lists.ubuntu.com>
Architecture: amd64
Version: 5.4.0-155.172~18.04.1
Recommends: grub-pc | grub-efi-amd64 | grub-efi-ia32 | grub | lilo, initramfs-tools | linux-initramfs-tool
Depends: kmod, linux-base (>= 4.5ubuntu1~16.04.1), linux-modules-5.4.0-155-generic
Conflicts: linux-image-unsigned-5.4.0-155-generic
Filename: pool/main/l/linux-signed-hwe-5.4/linux-image-5.4.0-155-generic_5.4.0-155.172~18.04.1_amd64.deb
Size: 10591052
SHA256: 849788b9ab3a9aa6ed647b79eca8c60623d5c9db267475a99bf17c2f32b64649
SHA1: 803b2601e30173871d5a04e7ac5e78b1108b74a5
MD5sum: 79ad662a7d07c75b8e1869f995669d21
Description: Signed kernel image generic
Description-md5: b0fd0df88b1cd31408007b00d2458952
Built-Using: linux-hwe-5.4 (= 5.4.0-155.172~18.04.1)

"""
# RECONSTRUCTED: apt-cache show of an installed version no index lists (its record is dpkg's status entry)
STATUS_ONLY = """\
Package: linux-image-7.0.0-31-generic
Status: install ok installed
Priority: optional
Section: kernel
Installed-Size: 15060
Maintainer: Canonical Kernel Team <kernel-team@lists.ubuntu.com>
Architecture: amd64
Source: linux-signed-hwe-7.0
Version: 7.0.0-31.31~24.04.1
Depends: kmod, linux-base (>= 4.5ubuntu1~16.04.1), linux-modules-7.0.0-31-generic
Description: Signed kernel image generic

"""
R = "7.0.0-31-generic"
V = "7.0.0-31.31~24.04.1"


@pytest.mark.parametrize("os_id,release,names,want", [
    ("ubuntu", R, [f"linux-image-{R}", f"linux-headers-{R}"],
     [f"linux-image-{R}", f"linux-modules-{R}", f"linux-modules-extra-{R}", f"linux-headers-{R}"]),
    # declared already: nothing twice, the declared order kept
    ("ubuntu", R, [f"linux-image-{R}", f"linux-modules-extra-{R}", f"linux-headers-{R}"],
     [f"linux-image-{R}", f"linux-modules-{R}", f"linux-modules-extra-{R}", f"linux-headers-{R}"]),
    # Debian has no modules-extra: the pin's list as it is
    ("debian", "6.1.0-47-amd64", ["linux-image-6.1.0-47-amd64", "linux-headers-6.1.0-47-amd64"],
     ["linux-image-6.1.0-47-amd64", "linux-headers-6.1.0-47-amd64"]),
    # an unknown OS (no facts) adds nothing it cannot be sure exists
    ("", R, [f"linux-image-{R}"], [f"linux-image-{R}"]),
    ("ubuntu", "", [], []),
])
def test_the_packages_a_distribution_kernel_is_installed_as_per_os(os_id, release, names, want):
    assert deb_store.distro_kernel_packages(release, os_id, names) == want


def test_the_kept_packages_are_the_pinned_ones_and_the_release_s_common_headers():
    names = deb_store.distro_kernel_packages(R, "ubuntu", [f"linux-image-{R}", f"linux-headers-{R}"])
    patterns = deb_store.keep_patterns(R, names)
    assert patterns == names + ["linux-*headers-7.0.0-31", "linux-headers-7.0.0-31-common"]
    kept = [n for n in ("linux-hwe-7.0-headers-7.0.0-31", "linux-headers-7.0.0-31", f"linux-modules-extra-{R}",
                        "linux-headers-6.1.0-47-common") if deb_store.matches(n, patterns)]
    assert kept == ["linux-hwe-7.0-headers-7.0.0-31", "linux-headers-7.0.0-31", f"linux-modules-extra-{R}"]
    # another ABI, another package of the same ABI (tools, NVIDIA's prebuilt modules): not the kernel's
    for other in ("linux-hwe-7.0-headers-7.0.0-310", "linux-tools-7.0.0-31-generic",
                  "linux-modules-nvidia-570-7.0.0-31-generic", "linux-base"):
        assert not deb_store.matches(other, patterns), other
    assert "linux-headers-6.1.0-47-common" in deb_store.keep_patterns("6.1.0-47-amd64", [])
    assert deb_store.keep_patterns("custom", ["linux-image-custom"]) == ["linux-image-custom"]


def test_the_package_index_sha256_of_one_version_from_a_recorded_apt_cache_show():
    stanzas = deb_store.parse_show(SHOW)
    assert [(s["package"], s["version"], s["architecture"]) for s in stanzas] == [
        ("linux-image-5.4.0-144-generic", "5.4.0-144.161~18.04.1", "amd64"),
        ("linux-image-5.4.0-155-generic", "5.4.0-155.172~18.04.1", "amd64")]
    assert deb_store.index_sha256(stanzas, "linux-image-5.4.0-155-generic", "5.4.0-155.172~18.04.1", "amd64") == [
        "849788b9ab3a9aa6ed647b79eca8c60623d5c9db267475a99bf17c2f32b64649"]
    assert deb_store.index_sha256(stanzas, "linux-image-5.4.0-144-generic", "5.4.0-144.161~18.04.1", "amd64") == [
        "5b9cb86065c95649934f3d84165a5a167d6c6ee9de0840a3527f5e15ec36ecdb"]
    # another version, another architecture: no index entry
    assert deb_store.index_sha256(stanzas, "linux-image-5.4.0-144-generic", "5.4.0-144.999", "amd64") == []
    assert deb_store.index_sha256(stanzas, "linux-image-5.4.0-144-generic", "5.4.0-144.161~18.04.1", "arm64") == []


def test_an_installed_version_only_dpkg_knows_has_no_index_sha256():
    stanzas = deb_store.parse_show(STATUS_ONLY)
    assert stanzas[0]["version"] == V and stanzas[0]["sha256"] is None
    assert deb_store.index_sha256(stanzas, f"linux-image-{R}", V, "amd64") == []


def test_a_stanza_of_another_shape_is_typed_not_trusted():
    stanzas = deb_store.parse_show("Package: ok\nVersion: 1.0 $(reboot)\nArchitecture: amd64\nSHA256: zz\n"
                                   "Filename: pool/x.deb\n")
    assert stanzas == [{"package": "ok", "version": None, "architecture": "amd64", "sha256": None,
                        "filename": "pool/x.deb"}]
    assert deb_store.parse_show("") == [] and deb_store.parse_show(None) == []


def test_the_file_apt_keeps_a_version_as():
    assert deb_store.cache_name(f"linux-image-{R}", V, "amd64") == f"linux-image-{R}_{V}_amd64.deb"
    assert deb_store.cache_name("rocm-core", "1:7.1.0", "amd64") == "rocm-core_1%3a7.1.0_amd64.deb"


def stored(*names, version=V):
    return dict((n, {"version": version, "architecture": "amd64", "sha256": "ab" * 32}) for n in names)


def candidates_of(policy, names):
    """deb_packages' reading of apt-cache policy, through facts/packages (the one reader)."""
    return packages.candidates(names, run=lambda argv: (0, policy))


GONE = f"""linux-image-{R}:
  Installed: (none)
  Candidate: (none)
  Version table:
linux-modules-{R}:
  Installed: (none)
  Candidate: (none)
  Version table:
"""
OFFERED = f"""linux-image-{R}:
  Installed: (none)
  Candidate: {V}
  Version table:
     {V} 500
        500 http://archive.ubuntu.com/ubuntu noble-updates/main amd64 Packages
linux-modules-{R}:
  Installed: (none)
  Candidate: {V}
  Version table:
     {V} 500
        500 http://archive.ubuntu.com/ubuntu noble-updates/main amd64 Packages
"""
# the same ABI uploaded again: the archive offers another version than the one the store holds
REUPLOADED = OFFERED.replace(f"Candidate: {V}", "Candidate: 7.0.0-31.32~24.04.1")


def test_the_stored_files_are_used_when_apt_cache_policy_says_the_version_is_gone():
    names = [f"linux-image-{R}", f"linux-modules-{R}"]
    store = stored(*names)
    assert deb_store.from_store(store, {}, candidates_of(GONE, names)) == names
    assert deb_store.from_store(store, {}, candidates_of(REUPLOADED, names)) == names
    # the archive still offers the stored version: apt installs it from there (its signatures check it)
    assert deb_store.from_store(store, {}, candidates_of(OFFERED, names)) == []
    # what is installed at its stored version is not installed again
    assert deb_store.from_store(store, {f"linux-image-{R}": V}, candidates_of(GONE, names)) == [
        f"linux-modules-{R}"]


def test_only_what_the_store_holds_no_version_of_is_kept():
    installed = {f"linux-image-{R}": V, f"linux-modules-{R}": V, "linux-hwe-7.0-headers-7.0.0-31": V}
    assert deb_store.to_keep(installed, {}) == sorted(installed)
    assert deb_store.to_keep(installed, stored(f"linux-image-{R}")) == [
        "linux-hwe-7.0-headers-7.0.0-31", f"linux-modules-{R}"]
    # the store holds another version: the box does not replace the first box's files
    assert deb_store.to_keep(installed, stored(*installed, version="7.0.0-31.30")) == []


def record(**packages_):
    return {"format": 1, "release": R, "architecture": "amd64", "packages": packages_ or stored(f"linux-image-{R}")}


@pytest.mark.parametrize("data,why", [
    ([], "not a JSON object"),
    ({**record(), "release": "6.8.0-31-generic"}, "not a record of 7.0.0-31-generic for amd64 (format 1)"),
    ({**record(), "format": 2}, "not a record of 7.0.0-31-generic for amd64 (format 1)"),
    ({**record(), "packages": {}}, "no packages"),
    (record(**{"Bad Name": stored("x")["x"]}), "the entry 'Bad Name' is no package"),
    (record(**{"ok": {"version": V, "architecture": "amd64", "sha256": "no"}}), "ok has no sha256"),
])
def test_a_record_of_another_shape_is_refused_with_why(data, why):
    assert deb_store.check_record(data, R, "amd64") == (None, why)


def test_a_box_is_handed_versions_and_sha256_only_and_picks_its_architecture():
    full = record(**{f"linux-image-{R}": {**stored("x")["x"], "host": "rig-a", "run_dir": "/state/runs/1"}})
    shown = deb_store.shown_to_box(full)
    assert shown == {"release": R, "architecture": "amd64",
                     "packages": {f"linux-image-{R}": {"version": V, "architecture": "amd64", "sha256": "ab" * 32}}}
    arm = {**shown, "architecture": "arm64"}
    assert deb_store.record_for([arm, shown], "amd64") is shown
    assert deb_store.record_for([arm], "amd64") is None and deb_store.record_for([], "amd64") is None
    broken = {**shown, "packages": {f"linux-image-{R}": {"version": V}}}
    assert deb_store.record_for([broken], "amd64") is None


def test_the_box_s_note_holds_what_is_installed_at_its_recorded_version(tmp_path, monkeypatch):
    shown = deb_store.shown_to_box(record(**stored(f"linux-image-{R}", f"linux-modules-{R}")))
    note = deb_store.box_record(shown, {f"linux-image-{R}": V, f"linux-modules-{R}": "7.0.0-31.30"})
    assert note == {"release": R, "architecture": "amd64",
                    "packages": {f"linux-image-{R}": {"version": V, "sha256": "ab" * 32}}}
    assert deb_store.box_record(shown, {}) is None and deb_store.box_record(None, {}) is None
    # the host manifest reads it back under a root, typed
    monkeypatch.setattr(deb_store, "BOX_RECORD_DIR", "/var/lib/rigbook/debs")
    target = tmp_path / "var/lib/rigbook/debs/kernel.json"
    assert deb_store.read_box_record(str(tmp_path), "kernel") == (None, None)
    target.parent.mkdir(parents=True)
    target.write_text(json.dumps(note))
    assert deb_store.read_box_record(str(tmp_path), "kernel") == (note["packages"], None)


@pytest.mark.parametrize("text,why", [
    ("{not json", "var/lib/rigbook/debs/kernel.json"),
    (json.dumps({"packages": []}), "var/lib/rigbook/debs/kernel.json holds no packages"),
    (json.dumps({"packages": {"linux-image-x": {"version": "1.0", "sha256": "\x1b[2J"}}}),
     "var/lib/rigbook/debs/kernel.json: the entry 'linux-image-x' is no package with a version and sha256"),
])
def test_a_garbled_note_is_a_reason_never_a_value(tmp_path, text, why):
    target = tmp_path / "var/lib/rigbook/debs/kernel.json"
    target.parent.mkdir(parents=True)
    target.write_text(text)
    value, problem = deb_store.read_box_record(str(tmp_path), "kernel")
    assert value is None and why in problem and "\x1b" not in problem


def test_names_of_another_shape_are_refused():
    for bad in (lambda: deb_store.record_name("../x", "amd64"), lambda: deb_store.record_name(R, "AMD 64"),
                lambda: deb_store.deb_name("12"), lambda: deb_store.box_record_path("../etc")):
        with pytest.raises(ValueError):
            bad()
    assert deb_store.record_name(R, "amd64") == f"{R}_amd64.json"
