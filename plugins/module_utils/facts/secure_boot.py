# -*- coding: utf-8 -*-
# Copyright: rigbook developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Secure Boot: whether it is on, and whether the key DKMS signs modules with is enrolled (standard library only).

The one reader of the box's Secure Boot state (docs/secure-boot.md). Each source has a pure parser tested as data:

- no sys/firmware/efi under the evidence root: not an EFI boot, so Secure Boot cannot be on;
- the EFI variables (efivarfs, sys/firmware/efi/efivars): SecureBoot-EFI_GLOBAL and SetupMode-EFI_GLOBAL, each 4
  attribute bytes then the value (1 = on); shim's MokSBStateRT-SHIM_LOCK exists when its validation was turned off
  (`mokutil --disable-validation`). Read as the kernel's EFI stub reads them (drivers/firmware/efi/libstub/
  secureboot.c): no SecureBoot variable, SecureBoot 0, SetupMode 1 or MokSBStateRT present is Secure Boot off;
- `mokutil --sb-state` when the variables cannot be read (efivarfs not mounted, a value of another shape):
  "SecureBoot enabled" / "SecureBoot disabled" (+ "Platform is in Setup Mode", "SecureBoot validation is disabled
  in shim"), "This system doesn't support Secure Boot", "EFI variables are not supported on this system";
- `mokutil --test-key KEY` for the certificate DKMS signs with (DKMS_KEY, or Ubuntu's UBUNTU_KEY, or what
  /etc/dkms/framework.conf names): "KEY is already enrolled", "KEY is not enrolled", "KEY is already in the
  enrollment request" (enrolled at the next boot, once confirmed at the console), "KEY is blocked in dbx", ...
  (mokutil's src/mokutil.c, test_key and print_skip_message).

Under a recorded tree (a lab host, a snapshot) the variables are files of the tree and the commands are its
recordings (var/lib/rigbook/commands/mokutil-sb-state.txt, mokutil-test-key.txt); live, under "/", the commands run.
What the box says comes back typed and bounded: states are words of STATES / KEY_STATES, texts one bounded line.
"""

from __future__ import annotations

import errno
import os
import re

from ansible_collections.rigbook.homelab.plugins.module_utils.facts import files, runner, text

EFI = "sys/firmware/efi"
EFIVARS = EFI + "/efivars"
# EFI_GLOBAL_VARIABLE (UEFI specification) and shim's SHIM_LOCK GUID (shim.h), as efivarfs names the files
EFI_GLOBAL = "8be4df61-93ca-11d2-aa0d-00e098032b8c"
SHIM_LOCK = "605dab50-e046-4300-abb6-3dd810dd8b23"
SECURE_BOOT_VAR = "SecureBoot-" + EFI_GLOBAL
SETUP_MODE_VAR = "SetupMode-" + EFI_GLOBAL
MOK_SB_STATE_VAR = "MokSBStateRT-" + SHIM_LOCK
MAX_VAR = 64
# The certificate DKMS signs modules with: DKMS 3.x's default (dkms_framework.conf: mok_certificate), and on Ubuntu,
# when framework.conf names none, the one update-secureboot-policy makes (dkms.in: prepare_mok, `ubuntu*`).
DKMS_KEY = "/var/lib/dkms/mok.pub"
UBUNTU_KEY = "/var/lib/shim-signed/mok/MOK.der"
FRAMEWORK = "etc/dkms/framework.conf"
FRAMEWORK_DIR = "etc/dkms/framework.conf.d"
KEY_PATH = r"/[A-Za-z0-9._+/-]{1,255}"
SB_STATE = ("mokutil", "--sb-state")
TIMEOUT = 30

STATES = ("on", "off", "not-efi", "unknown")
KEY_STATES = ("enrolled", "pending", "not-enrolled", "blocked", "missing", "unknown")


# --- pure parsers ----------------------------------------------------------------------------------------------

def parse_efivar(data):
    """The value of an efivarfs file (bytes: 4 attribute bytes, then the data: 1 byte for SecureBoot and SetupMode;
    2 or 4 read little-endian as mokutil does), or None for a file of another shape."""
    if not isinstance(data, bytes) or len(data) - 4 not in (1, 2, 4):
        return None
    return int.from_bytes(data[4:], "little")


def decide_efivars(secure_boot, setup_mode, shim_validation_off):
    """(state, why) from the variables' values as the kernel's EFI stub decides: SECURE_BOOT and SETUP_MODE the
    values (None: no such variable), SHIM_VALIDATION_OFF whether MokSBStateRT exists."""
    if secure_boot is None:
        return "off", "the firmware has no SecureBoot variable"
    if secure_boot == 0:
        return "off", "SecureBoot is 0"
    if secure_boot != 1:
        return "unknown", "SecureBoot is %d (not 0 or 1)" % secure_boot
    if setup_mode == 1:
        return "off", "SecureBoot is 1 but the platform is in Setup Mode (no platform key: nothing is verified)"
    if shim_validation_off:
        return "off", "SecureBoot is 1 but shim's validation is off (MokSBStateRT, `mokutil --disable-validation`)"
    return "on", "SecureBoot is 1, SetupMode %s" % ("0" if setup_mode == 0 else "not readable")


def parse_sb_state(output):
    """(state, why) of `mokutil --sb-state`'s output (stdout and stderr together): state "on", "off", "no-efivars"
    (mokutil found no EFI variables: not an EFI boot, or efivarfs not mounted) or "unknown"."""
    lines = [text.line(entry, 200) for entry in (output or "").splitlines()]
    lines = [entry for entry in lines if entry]
    said = "; ".join(lines[:3]) or "nothing"
    if "EFI variables are not supported on this system" in lines:
        return "no-efivars", "mokutil --sb-state: " + said
    if "This system doesn't support Secure Boot" in lines:
        return "off", "mokutil --sb-state: " + said
    if "SecureBoot enabled" in lines:
        if "SecureBoot validation is disabled in shim" in lines:
            return "off", "mokutil --sb-state: " + said
        return "on", "mokutil --sb-state: " + said
    if "SecureBoot disabled" in lines:
        return "off", "mokutil --sb-state: " + said
    return "unknown", "mokutil --sb-state: " + said


# What `mokutil --test-key KEY` prints after the key's path (src/mokutil.c: test_key, print_skip_message).
TEST_KEY_ENDINGS = (
    (" is not enrolled", "not-enrolled"),
    (" is already enrolled", "enrolled"),
    (" is already in db", "enrolled"),
    (" is already in the built-in trusted keyring", "enrolled"),
    (" is already in the enrollment request", "pending"),
    (" is blocked in dbx", "blocked"),
    (" is blocked in MokListX", "blocked"),
)


def parse_test_key(output):
    """(key state, why) of `mokutil --test-key KEY`'s output (stdout and stderr together): "enrolled" (also in the
    firmware's db or the kernel's built-in keyring), "pending" (in the enrolment request: enrolled once confirmed at
    the console at the next boot), "not-enrolled", "blocked" (dbx or MokListX) or "unknown" (mokutil could not
    tell: no EFI variables, not a certificate, unreadable)."""
    lines = [text.line(entry, 400) for entry in (output or "").splitlines()]
    lines = [entry for entry in lines if entry]
    for entry in lines:
        for ending, state in TEST_KEY_ENDINGS:
            if entry.endswith(ending):
                return state, "mokutil --test-key: " + entry
    return "unknown", "mokutil --test-key: " + ("; ".join(lines[:2]) or "nothing")


def parse_framework(content):
    """The certificate path a DKMS framework.conf sets (its last `mok_certificate=` line, quotes removed), "" when it
    sets none, None when it sets one rigbook cannot use (a variable such as ${kernelver}, or not an absolute
    path)."""
    found = ""
    for raw in (content or "").splitlines():
        entry = raw.strip()
        if not entry.startswith("mok_certificate="):
            continue
        found = entry.split("=", 1)[1].split("#", 1)[0].strip().strip("\"'")
    if not found:
        return ""
    return text.matching(found, KEY_PATH)


def dkms_key(os_id, configured=""):
    """The certificate DKMS signs modules with on a box of OS_ID ("ubuntu", "debian", ...): CONFIGURED (what
    framework.conf sets) when given, else Ubuntu's update-secureboot-policy key on Ubuntu, else DKMS's own."""
    if configured:
        return configured
    return UBUNTU_KEY if os_id == "ubuntu" else DKMS_KEY


# --- reads of the box ------------------------------------------------------------------------------------------

def _efivar(root, name):
    """(value or None, why or None) of the EFI variable file NAME under ROOT: (None, None) when there is none."""
    data, why = files.read_nofollow(root, EFIVARS + "/" + name, limit=MAX_VAR)
    if data is None:
        return None, why
    value = parse_efivar(data)
    return value, (None if value is not None else "%s: %d bytes, not 4 attribute bytes and a value" % (
        name, len(data)))


def _efivars_listed(root):
    """True when the efivarfs folder under ROOT holds variables (mounted), False when absent or empty."""
    try:
        return bool(files.list_nofollow(root, EFIVARS, limit=4096))
    except OSError as exc:
        return exc.errno == errno.EFBIG  # more names than listed: it is mounted


def command(root, name, argv):
    """(output, source) of a mokutil run: stdout and stderr together (mokutil prints some answers on stderr and
    exits non-zero for others, so the text is the answer, not the exit code), or None when it could not run. Under
    a recorded tree the recording NAME is read instead."""
    if files.is_live(root):
        result = runner.run(list(argv), timeout=TIMEOUT)
        if result.rc is None:
            return None, result.error
        return (result.stdout or "") + (result.stderr or ""), " ".join(argv)
    rel = os.path.join(*runner.COMMANDS_DIR + (name + ".txt",))
    recorded = files.read_text(runner.recording_path(root, name), limit=65536)
    return recorded, ("recorded " + rel if recorded is not None else "no recording at " + rel)


def state(root):
    """(state, why): "not-efi" without sys/firmware/efi, else from the EFI variables, else from mokutil."""
    if not os.path.isdir(files.path(root, EFI)):
        return "not-efi", "no /sys/firmware/efi: not an EFI boot, so Secure Boot cannot be on"
    problems = []
    if _efivars_listed(root):
        secure_boot, why = _efivar(root, SECURE_BOOT_VAR)
        setup_mode, setup_why = _efivar(root, SETUP_MODE_VAR)
        shim_off, shim_why = files.read_nofollow(root, EFIVARS + "/" + MOK_SB_STATE_VAR, limit=MAX_VAR)
        problems = [p for p in (why, setup_why, shim_why) if p]
        if not problems:
            decided, reason = decide_efivars(secure_boot, setup_mode, shim_off is not None)
            if decided != "unknown":
                return decided, "EFI variables: " + reason
            problems.append(reason)
    else:
        problems.append("no EFI variables under /%s (efivarfs not mounted)" % EFIVARS)
    output, source = command(root, "mokutil-sb-state", SB_STATE)
    if output is None:
        return "unknown", "; ".join(problems + [text.line(source, 300) or "mokutil did not run"])
    decided, reason = parse_sb_state(output)
    if decided == "no-efivars":
        return "unknown", "; ".join(problems + [reason])
    return decided, reason


def framework_key(root):
    """The certificate DKMS's framework.conf (and framework.conf.d/*.conf, read after it) sets under ROOT: a path,
    "" for none, None for one rigbook cannot use."""
    found = parse_framework(files.read_text(files.path(root, FRAMEWORK), limit=65536))
    try:
        extra = [name for name, kind in files.list_nofollow(root, FRAMEWORK_DIR)
                 if kind == "file" and name.endswith(".conf")]
    except OSError:
        extra = []
    for name in extra:
        value = parse_framework(files.read_text(files.path(root, FRAMEWORK_DIR, name), limit=65536))
        if value != "":
            found = value
    return found


def key_state(root, path):
    """{path, state, why} of the certificate PATH (on the box, under ROOT): "missing" when the file is not there
    (DKMS makes one at its first signed build: too late to enrol it before the play), else mokutil's answer."""
    try:
        files.stat_nofollow(root, path.lstrip("/"))
    except FileNotFoundError:
        return {"path": path, "state": "missing", "why": "no file %s" % path}
    except OSError as exc:
        return {"path": path, "state": "unknown", "why": files.why_not(path, exc)}
    output, source = command(root, "mokutil-test-key", ("mokutil", "--test-key", path))
    if output is None:
        return {"path": path, "state": "unknown", "why": text.line(source, 300) or "mokutil did not run"}
    found, why = parse_test_key(output)
    return {"path": path, "state": found, "why": why}


def read(root, os_id=""):
    """The box's Secure Boot: {state (STATES), why, dkms_key: {path, state (KEY_STATES), why} or None}. The DKMS
    key is tested only when Secure Boot is on or unknown (mokutil is not run on a box where it cannot matter)."""
    found, why = state(root)
    result = {"state": found, "why": text.line(why, 600), "dkms_key": None}
    if found in ("on", "unknown"):
        configured = framework_key(root)
        if configured is None:
            result["dkms_key"] = {"path": "", "state": "unknown",
                                  "why": "/etc/dkms/framework.conf sets a mok_certificate rigbook cannot read "
                                         "(a variable in it, or not an absolute path)"}
        else:
            key = key_state(root, dkms_key(re.sub(r"[^a-z0-9.-]", "", str(os_id or "").lower()), configured))
            key["why"] = text.line(key["why"], 600)
            result["dkms_key"] = key
    return result
