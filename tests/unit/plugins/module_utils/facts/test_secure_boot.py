"""facts/secure_boot: the Secure Boot state and the DKMS signing key's enrolment, each parser fed the recorded public
outputs of tests/fixtures/secure-boot (SOURCES.md says where each comes from), the reads on trees written here."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from ansible_collections.rigbook.homelab.plugins.module_utils.facts import files, runner, secure_boot

FIXTURES = Path(__file__).resolve().parents[4] / "fixtures" / "secure-boot"
EFIVARS = "sys/firmware/efi/efivars"


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def hexdump_bytes(dump: str) -> bytes:
    """The bytes a `hexdump -C` listing shows (the offset and the ASCII column left out)."""
    found = b""
    for line in dump.splitlines():
        match = re.match(r"^[0-9a-f]{8}((?:  ?[0-9a-f]{2})+)", line)
        if match:
            found += bytes.fromhex(match.group(1).replace(" ", ""))
    return found


# --- the parsers, as data --------------------------------------------------------------------------------------

def test_the_recorded_efivar_dumps_read_one_and_zero():
    on = hexdump_bytes(fixture("efivar-secureboot-on.hexdump"))
    off = hexdump_bytes(fixture("efivar-secureboot-off.hexdump"))
    assert on == b"\x06\x00\x00\x00\x01" and off == b"\x06\x00\x00\x00\x00"
    assert secure_boot.parse_efivar(on) == 1 and secure_boot.parse_efivar(off) == 0


@pytest.mark.parametrize("data", [b"", b"\x06\x00\x00\x00", b"\x06\x00\x00\x00\x01\x00\x00", "\x06\0\0\0\x01", None])
def test_an_efivar_of_another_shape_is_no_value(data):
    assert secure_boot.parse_efivar(data) is None


def test_a_wider_value_reads_little_endian_as_mokutil_does():
    assert secure_boot.parse_efivar(b"\x06\x00\x00\x00\x01\x00") == 1
    assert secure_boot.parse_efivar(b"\x07\x00\x00\x00\x00\x01\x00\x00") == 256


@pytest.mark.parametrize("values,state,words", [
    ((None, None, False), "off", "no SecureBoot variable"),  # the kernel's EFI stub: EFI_NOT_FOUND is disabled
    ((0, 0, False), "off", "SecureBoot is 0"),
    ((1, 0, False), "on", "SecureBoot is 1, SetupMode 0"),
    ((1, None, False), "on", "SetupMode not readable"),
    ((1, 1, False), "off", "Setup Mode"),
    ((1, 0, True), "off", "shim's validation is off"),
    ((2, 0, False), "unknown", "SecureBoot is 2"),
])
def test_the_variables_decide_as_the_kernel_does(values, state, words):
    found, why = secure_boot.decide_efivars(*values)
    assert found == state and words in why


@pytest.mark.parametrize("name,state,words", [
    ("mokutil-sb-state-enabled.txt", "on", "SecureBoot enabled"),
    ("mokutil-sb-state-disabled.txt", "off", "SecureBoot disabled"),
    ("mokutil-sb-state-setup-mode.txt", "off", "Platform is in Setup Mode"),
    ("mokutil-sb-state-shim-validation-off.txt", "off", "validation is disabled in shim"),
    ("mokutil-no-efivars.txt", "no-efivars", "EFI variables are not supported"),
])
def test_mokutil_sb_state(name, state, words):
    found, why = secure_boot.parse_sb_state(fixture(name))
    assert found == state and words in why and why.startswith("mokutil --sb-state: ")


def test_mokutil_sb_state_it_cannot_say_is_unknown_and_its_text_is_bounded():
    assert secure_boot.parse_sb_state("Cannot determine secure boot state.\n")[0] == "unknown"
    assert secure_boot.parse_sb_state("")[0] == "unknown"
    found, why = secure_boot.parse_sb_state("\x1b[31mSecureBoot enabled\x1b[0m\n" + "x" * 5000)
    assert "\x1b" not in why and len(why) < 700
    assert secure_boot.parse_sb_state("This system doesn't support Secure Boot\n")[0] == "off"


@pytest.mark.parametrize("output,state", [
    (fixture("mokutil-test-key-not-enrolled.txt"), "not-enrolled"),
    (fixture("mokutil-test-key-enrolled.txt"), "enrolled"),
    (fixture("mokutil-test-key-pending.txt"), "pending"),
    # the other endings of mokutil.c's print_skip_message / test_key (see SOURCES.md)
    ("/var/lib/dkms/mok.pub is already in db\n", "enrolled"),
    ("/var/lib/dkms/mok.pub is already in the built-in trusted keyring\n", "enrolled"),
    ("/var/lib/dkms/mok.pub is blocked in dbx\n", "blocked"),
    ("/var/lib/dkms/mok.pub is blocked in MokListX\n", "blocked"),
    (fixture("mokutil-no-efivars.txt"), "unknown"),
    ("Failed to open /var/lib/dkms/mok.pub\n", "unknown"),
    ("Not a valid x509 certificate\n", "unknown"),
    ("", "unknown"),
])
def test_mokutil_test_key(output, state):
    found, why = secure_boot.parse_test_key(output)
    assert found == state and why.startswith("mokutil --test-key: ")
    if output:
        assert output.strip().splitlines()[0] in why


@pytest.mark.parametrize("content,key", [
    ("", ""),
    ("# mok_certificate=/var/lib/dkms/mok.pub\n", ""),  # the shipped file: commented out
    ('mok_signing_key="/var/lib/shim-signed/mok/MOK.priv"\nmok_certificate="/var/lib/shim-signed/mok/MOK.der"\n',
     "/var/lib/shim-signed/mok/MOK.der"),  # the DKMS README's example for Ubuntu's update-secureboot-policy key
    ("mok_certificate=/etc/a.der\nmok_certificate=/etc/b.der  # the last wins\n", "/etc/b.der"),
    ("mok_certificate=/var/lib/dkms/${kernelver}/mok.pub\n", None),  # a variable: not a path rigbook can test
    ("mok_certificate=relative/mok.pub\n", None),
])
def test_framework_conf(content, key):
    assert secure_boot.parse_framework(content) == key


def test_which_key_dkms_signs_with():
    assert secure_boot.dkms_key("ubuntu") == "/var/lib/shim-signed/mok/MOK.der"
    assert secure_boot.dkms_key("debian") == secure_boot.dkms_key("") == "/var/lib/dkms/mok.pub"
    assert secure_boot.dkms_key("ubuntu", "/etc/keys/mok.der") == "/etc/keys/mok.der"


# --- reads of a recorded tree ----------------------------------------------------------------------------------

def tree(tmp_path, efi=True, variables=None, recordings=None, paths=()):
    root = tmp_path / "tree"
    root.mkdir(parents=True)
    if efi:
        (root / "sys/firmware/efi").mkdir(parents=True)
    for name, data in (variables or {}).items():
        (root / EFIVARS).mkdir(parents=True, exist_ok=True)
        (root / EFIVARS / name).write_bytes(data)
    for name, output in (recordings or {}).items():
        path = Path(runner.recording_path(str(root), name))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(output)
    for rel in paths:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text("certificate\n")
    return str(root)


ON = {secure_boot.SECURE_BOOT_VAR: b"\x06\0\0\0\x01", secure_boot.SETUP_MODE_VAR: b"\x06\0\0\0\0"}
OFF = {secure_boot.SECURE_BOOT_VAR: b"\x06\0\0\0\0", secure_boot.SETUP_MODE_VAR: b"\x06\0\0\0\0"}


def test_no_efi_folder_is_not_efi_and_nothing_else_is_read(tmp_path):
    found = secure_boot.read(tree(tmp_path, efi=False, recordings={"mokutil-sb-state": "SecureBoot enabled\n"}))
    assert found == {"state": "not-efi", "dkms_key": None,
                     "why": "no /sys/firmware/efi: not an EFI boot, so Secure Boot cannot be on"}


def test_off_by_the_variables_tests_no_key(tmp_path):
    found = secure_boot.read(tree(tmp_path, variables=OFF, recordings={"mokutil-test-key": "x is not enrolled\n"}))
    assert found == {"state": "off", "why": "EFI variables: SecureBoot is 0", "dkms_key": None}


def test_on_with_the_key_not_enrolled(tmp_path):
    root = tree(tmp_path, variables=ON, paths=["var/lib/dkms/mok.pub"],
                recordings={"mokutil-test-key": fixture("mokutil-test-key-not-enrolled.txt")})
    found = secure_boot.read(root, "debian")
    assert found["state"] == "on" and found["why"] == "EFI variables: SecureBoot is 1, SetupMode 0"
    assert found["dkms_key"] == {"path": "/var/lib/dkms/mok.pub", "state": "not-enrolled",
                                 "why": "mokutil --test-key: /var/lib/dkms/mok.pub is not enrolled"}


def test_on_ubuntu_the_shim_signed_key_and_a_missing_one(tmp_path):
    found = secure_boot.read(tree(tmp_path, variables=ON), "Ubuntu")
    assert found["dkms_key"] == {"path": "/var/lib/shim-signed/mok/MOK.der", "state": "missing",
                                 "why": "no file /var/lib/shim-signed/mok/MOK.der"}


def test_framework_conf_names_the_key_tested(tmp_path):
    root = tree(tmp_path, variables=ON, paths=["etc/keys/module.der"],
                recordings={"mokutil-test-key": "/etc/keys/module.der is already enrolled\n"})
    Path(root, "etc/dkms/framework.conf.d").mkdir(parents=True)
    Path(root, "etc/dkms/framework.conf").write_text("mok_certificate=/var/lib/dkms/other.pub\n")
    Path(root, "etc/dkms/framework.conf.d/keys.conf").write_text('mok_certificate="/etc/keys/module.der"\n')
    key = secure_boot.read(root, "debian")["dkms_key"]
    assert (key["path"], key["state"]) == ("/etc/keys/module.der", "enrolled")
    Path(root, "etc/dkms/framework.conf.d/keys.conf").write_text("mok_certificate=/x/${kernelver}.der\n")
    key = secure_boot.read(root, "debian")["dkms_key"]
    assert key["state"] == "unknown" and "rigbook cannot read" in key["why"]


def test_setup_mode_and_shim_validation_off_are_off(tmp_path):
    setup = dict(ON, **{secure_boot.SETUP_MODE_VAR: b"\x06\0\0\0\x01"})
    assert secure_boot.read(tree(tmp_path, variables=setup))["state"] == "off"
    shim = dict(ON, **{secure_boot.MOK_SB_STATE_VAR: b"\x06\0\0\0\x01"})
    found = secure_boot.read(tree(tmp_path / "b", variables=shim))
    assert found["state"] == "off" and "MokSBStateRT" in found["why"] and found["dkms_key"] is None


def test_efivarfs_with_no_secure_boot_variable_is_off(tmp_path):
    found = secure_boot.read(tree(tmp_path, variables={"BootCurrent-" + secure_boot.EFI_GLOBAL: b"\x06\0\0\0\0\0"}))
    assert found["state"] == "off" and "no SecureBoot variable" in found["why"]


def test_efivarfs_not_mounted_asks_mokutil(tmp_path):
    found = secure_boot.read(tree(tmp_path, recordings={"mokutil-sb-state": fixture("mokutil-sb-state-enabled.txt")}))
    assert found["state"] == "on" and found["why"] == "mokutil --sb-state: SecureBoot enabled"
    assert found["dkms_key"]["state"] == "missing"
    none = secure_boot.read(tree(tmp_path / "b", recordings={"mokutil-sb-state": fixture("mokutil-no-efivars.txt")}))
    assert none["state"] == "unknown" and "efivarfs not mounted" in none["why"] and "not supported" in none["why"]
    silent = secure_boot.read(tree(tmp_path / "c"))
    assert silent["state"] == "unknown" and "no recording at var/lib/rigbook/commands/mokutil-sb-state.txt" in silent[
        "why"]


def test_a_garbled_variable_asks_mokutil(tmp_path):
    garbled = {secure_boot.SECURE_BOOT_VAR: b"\x06\0\0"}
    found = secure_boot.read(tree(tmp_path, variables=garbled,
                                  recordings={"mokutil-sb-state": fixture("mokutil-sb-state-disabled.txt")}))
    assert found == {"state": "off", "why": "mokutil --sb-state: SecureBoot disabled", "dkms_key": None}


def test_a_variable_reached_through_a_link_is_not_read(tmp_path):
    root = tree(tmp_path, variables=OFF)
    target = Path(root, EFIVARS, secure_boot.SECURE_BOOT_VAR)
    target.rename(tmp_path / "elsewhere")
    target.symlink_to(tmp_path / "elsewhere")
    found = secure_boot.read(root)
    assert found["state"] == "unknown" and "symbolic link" in found["why"]


# --- live: the commands run through the one runner -------------------------------------------------------------

def test_live_mokutil_is_run_and_its_exit_code_is_not_the_answer(tmp_path, monkeypatch):
    root = tree(tmp_path, variables=ON, paths=["var/lib/dkms/mok.pub"])
    ran = []

    def run(argv, timeout=None, **_):
        ran.append(argv)
        if argv[:2] == ["mokutil", "--test-key"]:  # exits 1 for "is not enrolled" (src/mokutil.c test_key)
            return runner.Result(argv, 1, fixture("mokutil-test-key-not-enrolled.txt"), "", "exited 1", False)
        raise AssertionError(argv)

    monkeypatch.setattr(files, "is_live", lambda _root: True)
    monkeypatch.setattr(runner, "run", run)
    key = secure_boot.read(root, "debian")["dkms_key"]
    assert ran == [["mokutil", "--test-key", "/var/lib/dkms/mok.pub"]]
    assert key["state"] == "not-enrolled"


def test_live_without_mokutil_the_key_is_unknown(tmp_path, monkeypatch):
    root = tree(tmp_path, variables=ON, paths=["var/lib/dkms/mok.pub"])
    monkeypatch.setattr(files, "is_live", lambda _root: True)
    monkeypatch.setattr(runner, "run", lambda argv, timeout=None, **_: runner.Result(
        argv, None, "", "", "mokutil --test-key /var/lib/dkms/mok.pub: No such file or directory", False))
    key = secure_boot.read(root, "debian")["dkms_key"]
    assert key["state"] == "unknown" and "No such file or directory" in key["why"]
