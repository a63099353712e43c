"""host_vars_schema.secure_boot_needs: what a play's roles need of a box whose Secure Boot is on (the DKMS signing
key enrolled, a kernel the owner built signed), worded as readiness words a need, on the lab inventory's models."""

from __future__ import annotations

import copy

import pytest

from rigbook.paths import link_collection
from rigbook.validate import validate

link_collection()
from ansible_collections.rigbook.homelab.plugins.module_utils import host_model  # noqa: E402
from ansible_collections.rigbook.homelab.plugins.plugin_utils import host_vars_schema  # noqa: E402

DEBIAN = {"distribution": "Debian", "distribution_version": "12", "distribution_release": "bookworm"}
KEY = "/var/lib/dkms/mok.pub"


@pytest.fixture(scope="module")
def inv():
    return validate("inventory/lab")


def model_of(inv, host, **pins):
    variables = copy.deepcopy(inv.host_vars(host))
    for name, changes in pins.items():
        variables["rigbook_pins"][name].update(changes)
    return host_model.build(variables, DEBIAN)


def on(key_state, why=f"mokutil --test-key: {KEY} is not enrolled"):
    return {"state": "on", "why": "EFI variables: SecureBoot is 1, SetupMode 0",
            "dkms_key": {"path": KEY, "state": key_state, "why": why}}


def test_the_dkms_key_not_enrolled_names_mokutil_import_and_the_console(inv):
    needs, warnings, notes = host_vars_schema.secure_boot_needs(model_of(inv, "lab-3080"), on("not-enrolled"))
    assert [(n["role"], n["key"]) for n in needs] == [("nvidia_p2p_driver", "Secure Boot")] and not warnings
    need = needs[0]
    assert "the DKMS signing key /var/lib/dkms/mok.pub is not enrolled" in need["why"]
    assert "the kernel refuses the P2P driver fork the nvidia_p2p_driver role builds with DKMS" in need["why"]
    assert need["how"].startswith("enrol it: mokutil --import /var/lib/dkms/mok.pub, then reboot and confirm at the "
                                  "console (MokManager")
    assert need["text"] == "Secure Boot: " + host_model.need_text(need)
    assert notes == []


@pytest.mark.parametrize("state,why_words,how_words", [
    ("pending", "waits in the enrolment request", "reboot and confirm it at the console"),
    ("missing", "no DKMS signing key yet", "dkms generate_mok"),
    ("blocked", "is blocked", "/etc/dkms/framework.conf"),
    ("unknown", "cannot be told", "install mokutil"),
])
def test_each_key_state_has_its_own_words(inv, state, why_words, how_words):
    needs, _, _ = host_vars_schema.secure_boot_needs(model_of(inv, "lab-3080"), on(state))
    assert len(needs) == 1 and why_words in needs[0]["why"] and how_words in needs[0]["how"]


def test_an_enrolled_key_and_no_kernel_of_ones_own_is_fine_with_a_note(inv):
    enrolled = on("enrolled", f"mokutil --test-key: {KEY} is already enrolled")
    needs, warnings, notes = host_vars_schema.secure_boot_needs(model_of(inv, "lab-3080"), enrolled)
    assert needs == [] and warnings == []
    assert notes == ["Secure Boot is on and the DKMS signing key /var/lib/dkms/mok.pub is enrolled (mokutil "
                     "--test-key: /var/lib/dkms/mok.pub is already enrolled): the P2P driver fork the "
                     "nvidia_p2p_driver role builds with DKMS will load"]


def test_off_or_no_efi_needs_nothing(inv):
    for state in ("off", "not-efi"):
        needs, warnings, notes = host_vars_schema.secure_boot_needs(
            model_of(inv, "lab-3080"), {"state": state, "why": "read", "dkms_key": None})
        assert (needs, warnings) == ([], []) and notes == ["Secure Boot is off (read)"]


def test_amd_needs_the_key_only_when_amdgpu_dkms_is_built(inv):
    assert host_vars_schema.secure_boot_needs(model_of(inv, "lab-r9700"), on("not-enrolled"))[0] == []
    needs, _, _ = host_vars_schema.secure_boot_needs(model_of(inv, "lab-r9700", rocm={"dkms": True}),
                                                     on("not-enrolled"))
    assert [n["role"] for n in needs] == ["amd_rocm"] and "amdgpu-dkms" in needs[0]["why"]


def test_a_kernel_one_built_must_be_signed_unless_it_already_runs_with_secure_boot_on(inv):
    seed = model_of(inv, "lab-r9700", kernel={"release": "6.8.12-r9700-p2p-dma44"})
    assert host_vars_schema.custom_kernel(seed) == "6.8.12-r9700-p2p-dma44"
    needs, _, _ = host_vars_schema.secure_boot_needs(seed, on("missing"), running="6.8.0-31-generic")
    assert [n["role"] for n in needs] == ["kernel"]
    assert "6.8.12-r9700-p2p-dma44 is one you built" in needs[0]["why"]
    assert needs[0]["how"].startswith("a kernel you built is not signed by a key shim trusts: sign it (sbsign) with "
                                      "an enrolled MOK, or turn Secure Boot off in the firmware")
    needs, _, notes = host_vars_schema.secure_boot_needs(seed, on("missing"), running="6.8.12-r9700-p2p-dma44")
    assert needs == [] and "runs: it is signed by a key shim trusts" in notes[0]


def test_a_distribution_kernel_from_debs_is_signed_unless_its_debs_are_the_unsigned_image(inv):
    assert host_vars_schema.custom_kernel(model_of(inv, "lab-r9700")) == ""  # Debian's 6.1.0-47-amd64 .debs
    unsigned = model_of(inv, "lab-r9700", kernel={"debs": [
        {"path": "/srv/linux-image-unsigned-6.8.0-90-generic_6.8.0-90.91_amd64.deb", "sha256": "0" * 64}],
        "release": "6.8.0-90-generic"})
    assert host_vars_schema.custom_kernel(unsigned) == "6.8.0-90-generic"
    assert host_vars_schema.custom_kernel(model_of(inv, "lab-3080")) == ""  # a distribution package, from apt


def test_only_the_roles_of_the_run_are_asked_for(inv):
    model = model_of(inv, "lab-3080")
    needs, warnings, notes = host_vars_schema.secure_boot_needs(model, on("not-enrolled"), roles=["cuda_toolchain"])
    assert (needs, warnings) == ([], [])
    assert "no role of this run builds a kernel module with DKMS or installs a kernel you built" in notes[0]


def test_unknown_state_warns_and_does_not_stop_the_play(inv):
    needs, warnings, notes = host_vars_schema.secure_boot_needs(
        model_of(inv, "lab-3080"), {"state": "unknown", "why": "no EFI variables", "dkms_key": None})
    assert needs == [] and notes == []
    assert warnings == ["Secure Boot could not be told (no EFI variables): if it is on, the P2P driver fork the "
                        "nvidia_p2p_driver role builds with DKMS needs a key shim trusts (docs/secure-boot.md)"]
    assert host_vars_schema.secure_boot_needs(model_of(inv, "lab-3080"), None)[1]  # nothing read: warned too


def test_what_the_box_returned_is_bounded_again_on_the_controller(inv):
    """boot_state's result comes from the box: a state outside the reader's words is unknown, texts lose their
    control characters and length, a key path that is no absolute path is dropped."""
    said = {"state": "on", "why": "EFI \x1b[2J" + "x" * 5000,
            "dkms_key": {"path": "/x\n; rm -rf /", "state": "owned", "why": "\x07bell"}}
    found = host_vars_schema.box_secure_boot(said)
    assert found["state"] == "on" and "\x1b" not in found["why"] and len(found["why"]) <= 600
    assert found["dkms_key"] == {"path": "", "state": "unknown", "why": "bell"}
    assert host_vars_schema.box_secure_boot({"state": "maybe"})["state"] == "unknown"
    needs, _, _ = host_vars_schema.secure_boot_needs(model_of(inv, "lab-3080"), said)
    assert "its certificate" in needs[0]["why"] and "\x07" not in needs[0]["text"]
