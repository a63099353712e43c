# -*- coding: utf-8 -*-
# Copyright: rigbook developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The rigbook_* host variables: their JSON Schema (meta/host_vars.schema.json) and their problems in words a user
can act on.

Controller side only (needs the Python package jsonschema). One copy serves both checks, so they agree on what is
valid and say it the same way:
- `provision validate` (and every `provision` run): rigbook.validate loads this file from the collection root and
  checks each inventory file's variables, naming the file and group or host;
- the preflight role's first task (action rigbook.homelab.host_model): each host's merged variables, for
  users who run ansible-playbook without the CLI.

Every problem is a key path (rigbook_gpu.pcie.width, rigbook_pins.kernel.debs[0].sha256) and a message with the
bad value and what is allowed.

The serve profiles (rigbook_serve) are also checked for their traps (plugins/module_utils/serve/profile.py) with what
the host model (plugins/module_utils/host_model.py) says about the box: serve_findings gives errors, which stop the
run like schema problems, and warnings, which are shown and do not. readiness_problems names every input a role of
the play needs and the inventory lacks (host_model.readiness).
"""

from __future__ import annotations

import difflib
import json
import os
import re
import sys

from ansible_collections.rigbook.homelab.plugins.module_utils import host_model
from ansible_collections.rigbook.homelab.plugins.module_utils.facts import files, secure_boot, text
from ansible_collections.rigbook.homelab.plugins.module_utils.serve import profile as serve_profile

PREFIX = "rigbook_"
COLLECTION_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))
SCHEMA_FILE = os.path.join(COLLECTION_ROOT, "meta", "host_vars.schema.json")
# the patch that keeps the API keys out of SGLang's log: its sha256 goes into the message that asks for it
KEY_LOG_PATCH_FILE = os.path.join(COLLECTION_ROOT, "roles", "sglang", "files", "patches", serve_profile.KEY_LOG_PATCH)

_CACHE = {}


class SchemaUnavailable(Exception):
    """The check cannot run: jsonschema is missing or the schema file cannot be read."""


def load_schema(path=None):
    path = path or SCHEMA_FILE
    if path not in _CACHE:
        try:
            with open(path, encoding="utf-8") as handle:
                _CACHE[path] = json.load(handle)
        except (OSError, ValueError) as exc:
            raise SchemaUnavailable("cannot read the rigbook host variables schema %s: %s" % (path, exc)) from None
    return _CACHE[path]


def end_anchored(pattern):
    """PATTERN (the schema's regex dialect, ECMA-262) for Python's re: each end anchor `$` becomes `\\Z`. In the
    schema's dialect `$` is the end of the text; Python's `$` also matches before a newline that ends it, so "name\\n"
    would pass ^[a-z]+$ and a trailing newline would reach a unit, an environment file or the GRUB drop-in."""
    out, index, in_class = [], 0, False
    while index < len(pattern):
        char = pattern[index]
        if char == "\\":
            out.append(pattern[index:index + 2])
            index += 2
            continue
        if in_class:
            in_class = char != "]"
        elif char == "[":
            in_class = True
        elif char == "$":
            char = "\\Z"
        out.append(char)
        index += 1
    return "".join(out)


def _pattern_keyword(validator_, pattern, instance, schema):
    """JSON Schema's pattern, with `$` the end of the text as the schema means it (end_anchored)."""
    # deferred: jsonschema is optional here (validator() says how to install it) and costs ~55 ms to import
    from jsonschema.exceptions import ValidationError

    if validator_.is_type(instance, "string") and not re.search(end_anchored(pattern), instance):
        yield ValidationError("%r does not match %r" % (instance, pattern))


def validator(path=None):
    key = ("validator", path or SCHEMA_FILE)
    if key not in _CACHE:
        try:
            # deferred: jsonschema is optional (its absence is SchemaUnavailable, said below); ~55 ms to import
            import jsonschema
            from jsonschema import validators
        except ImportError:
            raise SchemaUnavailable(
                "checking the rigbook_* variables needs the Python package jsonschema (>= 4.18) on the controller: "
                "install it into the Python that runs Ansible (%s -m pip install jsonschema)" % sys.executable
            ) from None
        checker = validators.extend(jsonschema.Draft202012Validator, {"pattern": _pattern_keyword})
        _CACHE[key] = checker(load_schema(path))
    return _CACHE[key]


def key_path(error):
    parts = []
    for part in error.absolute_path:
        parts.append("[%s]" % part if isinstance(part, int) else ("." if parts else "") + str(part))
    return "".join(parts)


def show(value):
    text = json.dumps(value, default=str)
    return text if len(text) <= 60 else text[:57] + "..."


def _article(word):
    return ("an " if word[:1] in "aeiou" else "a ") + word


def _has_control(value):
    return isinstance(value, str) and any(ord(c) < 32 or ord(c) == 127 for c in value)


def describe(error):
    """[(key path, message)] for one jsonschema error."""
    path = key_path(error)
    kind = error.validator
    value = error.instance
    sub = error.schema if isinstance(error.schema, dict) else {}
    if "propertyNames" in error.absolute_schema_path:
        control = " (control characters such as a newline are not allowed)" if _has_control(value) else ""
        return [(path, "bad key %s: names must match %s%s" % (show(value), error.validator_value, control))]
    if kind == "additionalProperties":
        allowed = sorted(sub.get("properties", {}))
        unknown = sorted(set(value) - set(allowed))
        problems = []
        for key in unknown:
            hint = difflib.get_close_matches(key, allowed, n=1)
            did = "; did you mean %r?" % hint[0] if hint else ""
            full = "%s.%s" % (path, key) if path else key
            what = "variable" if not path else "key"
            problems.append((full, "unknown %s %r (allowed: %s)%s" % (what, key, ", ".join(allowed), did)))
        return problems
    if kind == "required":
        missing = [k for k in error.validator_value if k not in (value or {})]
        return [(path, "missing required key %r" % k) for k in missing]
    if kind == "enum":
        allowed = ", ".join(show(v) for v in error.validator_value)
        return [(path, "bad value %s: allowed values are %s" % (show(value), allowed))]
    if kind == "const":
        return [(path, "bad value %s: must be %s" % (show(value), show(error.validator_value)))]
    if kind == "type":
        wanted = error.validator_value
        wanted = " or ".join(wanted) if isinstance(wanted, list) else wanted
        return [(path, "bad value %s (%s): must be %s" % (show(value), type(value).__name__, _article(wanted)))]
    if kind == "pattern":
        if _has_control(value):
            return [(path, "bad value %s: control characters (a newline, a tab, ...) are not allowed: they would "
                           "write extra lines into a unit, an environment file or the GRUB drop-in" % show(value))]
        absolute = " (an absolute path)" if str(error.validator_value).startswith("^/") else ""
        return [(path, "bad value %s: must match %s%s" % (show(value), error.validator_value, absolute))]
    bounds = {
        "minimum": "at least",
        "maximum": "at most",
        "exclusiveMinimum": "greater than",
        "exclusiveMaximum": "less than",
        "minLength": "a string of length at least",
        "minItems": "a list of at least",
    }
    if kind in bounds:
        return [(path, "bad value %s: must be %s %s" % (show(value), bounds[kind], error.validator_value))]
    if kind in ("oneOf", "anyOf"):
        options = [sorted(o.get("required", [])) for o in error.validator_value if isinstance(o, dict)]
        if all(options):
            names = " or ".join("+".join(o) for o in options)
            which = "exactly one of" if kind == "oneOf" else "at least one of"
            return [(path, "needs %s: %s" % (which, names))]
    if kind == "not" and isinstance(error.validator_value, dict) and error.validator_value.get("required"):
        keys = error.validator_value["required"]
        return [(path, "set only one of %s, not both" % " or ".join(keys))]
    return [(path, error.message)]


def schema_problems(variables, path=None):
    """[(key path, message)] for the rigbook_* names in VARIABLES (other names are not looked at)."""
    own = {k: v for k, v in variables.items() if str(k).startswith(PREFIX)}
    problems = []
    for error in sorted(validator(path).iter_errors(own), key=lambda e: list(map(str, e.absolute_path))):
        for where, message in describe(error):
            problems.append((where or "(variables)", message))
    return problems


def combination_problems(merged):
    """[(variable, key path, message)]: checks that need one host's merged view (keys from several files)."""
    gpu = merged.get("rigbook_gpu") or {}
    pins = merged.get("rigbook_pins") or {}
    p2p = merged.get("rigbook_p2p") or {}
    problems = []
    vendor = gpu.get("vendor") if isinstance(gpu, dict) else None
    if not isinstance(pins, dict) or not isinstance(p2p, dict):
        return problems
    wrong_vendor = {"nvidia": ("rocm", "rccl"), "amd": ("nvidia_driver", "cuda_toolchain", "nccl_tests")}
    for pin in wrong_vendor.get(vendor, ()):
        if pin in pins:
            problems.append(("rigbook_pins", "rigbook_pins.%s" % pin,
                             "pinned for a box whose rigbook_gpu.vendor is %s" % vendor))
    if p2p.get("expected") is True and isinstance(gpu.get("count"), int) and gpu["count"] < 2:
        problems.append(("rigbook_p2p", "rigbook_p2p.expected",
                         "true, but rigbook_gpu.count is %s (P2P needs 2 GPUs)" % gpu["count"]))
    if p2p and not gpu:
        problems.append(("rigbook_p2p", "rigbook_p2p", "set, but the host has no rigbook_gpu"))
    return problems


def serve_findings(merged, model=None):
    """(errors, warnings), each [(key path, message)]: the rigbook_serve traps of one host's merged variables,
    judged with what its inventory says about the box (host_model.box_facts). Run after the schema has passed."""
    if "rigbook_serve" not in merged:
        return [], []
    model = model or host_model.build(merged)
    errors, warnings = serve_profile.check_all(merged["rigbook_serve"], host_model.box_facts(model))
    keys_logged = serve_profile.key_log_problems(model["serve"], model["pins"].get("sglang"),
                                                 files.digest(KEY_LOG_PATCH_FILE)[0])
    return [_key_and_text(m) for m in errors] + keys_logged, [_key_and_text(m) for m in warnings]


def _key_and_text(message):
    where, _, text = message.partition(": ")
    return where, text


def host_findings(merged, path=None, model_of=None):
    """(problems, warnings), each [(key path, message)], for one host's merged variables: the schema first; when it
    passes, the combinations and the serve profiles' errors (problems) and warnings. MODEL_OF: a callable giving the
    host model the caller builds anyway (the preflight's action: built once per host and run), called only once the
    schema passed; without it the model is built here."""
    problems = schema_problems(merged, path)
    if problems:
        return problems, []
    problems = [(where, message) for _, where, message in combination_problems(merged)]
    serve_errors, serve_warnings = serve_findings(merged, model_of() if model_of else None)
    return problems + serve_errors, serve_warnings


def host_problems(merged, path=None):
    """[(key path, message)] for one host's merged variables: the schema first; the combinations and the serve
    profiles' errors when it passes."""
    return host_findings(merged, path)[0]


def readiness_problems(model, roles=None, inventory_dir=None):
    """[(key path, message)]: the inputs the roles ROLES (default: the model's) need and the inventory lacks
    (host_model.readiness), worded as `provision validate` words them."""
    return [(need["key"], host_model.need_text(need))
            for need in host_model.readiness(model, roles, inventory_dir)]


# --- Secure Boot: what only the box can say --------------------------------------------------------------------
# `provision validate` cannot know it (it contacts no host): the preflight role reads the box (rigbook.homelab.
# boot_state secure_boot, plugins/module_utils/facts/secure_boot.py) and names these needs before any package changes.
SECURE_BOOT_KEY = "Secure Boot"
DKMS_BUILDS = {"nvidia_p2p_driver": "the P2P driver fork the nvidia_p2p_driver role builds with DKMS",
               "amd_rocm": "amdgpu-dkms, which the amd_rocm role installs and DKMS builds (rigbook_pins.rocm.dkms: "
                           "true)"}
ENROL = "mokutil --import %s, then reboot and confirm at the console (MokManager: Enroll MOK, Continue, Yes, the " \
        "password given to mokutil)"


def _secure_boot_need(role, why, how):
    need = {"role": role, "key": SECURE_BOOT_KEY, "why": why, "how": how}
    need["text"] = "%s: %s" % (SECURE_BOOT_KEY, host_model.need_text(need))
    return need


def custom_kernel(model):
    """The pinned kernel's release when it is one no distribution signs (from .debs: a release of no distribution's
    shape, or linux-image-unsigned-* packages), else ""."""
    pin = model["pins"]["kernel"]
    if pin["source"] != "debs" or not pin["release"]:
        return ""
    names = [os.path.basename(host_model.as_str(deb.get("path") or deb.get("url")))
             for deb in pin["debs"] if isinstance(deb, dict)]
    unsigned = any(name.startswith("linux-image-unsigned-") for name in names)
    return pin["release"] if unsigned or not host_model.DISTRO_KERNEL.match(pin["release"]) else ""


def _dkms_need(role, key):
    path, state = key.get("path") or "its certificate", key.get("state")
    what = DKMS_BUILDS[role]
    if state == "not-enrolled":
        return _secure_boot_need(role, "Secure Boot is on and the DKMS signing key %s is not enrolled (%s): the kernel "
                                 "refuses %s" % (path, key.get("why"), what), "enrol it: " + ENROL % path)
    if state == "pending":
        return _secure_boot_need(role, "Secure Boot is on and the DKMS signing key %s waits in the enrolment request, "
                                 "not enrolled yet: the kernel would refuse %s" % (path, what),
                                 "reboot and confirm it at the console (MokManager: Enroll MOK, Continue, Yes, the "
                                 "password given to mokutil), then run again")
    if state == "missing":
        return _secure_boot_need(role, "Secure Boot is on and there is no DKMS signing key yet (%s): DKMS would make "
                                 "one at its first build, and the kernel would refuse %s, signed by a key nobody "
                                 "enrolled" % (path, what),
                                 "make the key first (DKMS 3.1 and later: `dkms generate_mok`; Ubuntu: "
                                 "`update-secureboot-policy --new-key`), then enrol it: " + ENROL % path)
    if state == "blocked":
        return _secure_boot_need(role, "Secure Boot is on and the DKMS signing key %s is blocked (%s): the kernel "
                                 "refuses %s" % (path, key.get("why"), what),
                                 "have DKMS sign with another key (mok_signing_key and mok_certificate in "
                                 "/etc/dkms/framework.conf), then enrol that certificate: " + ENROL % "CERTIFICATE")
    return _secure_boot_need(role, "Secure Boot is on and whether the DKMS signing key %s is enrolled cannot be told "
                             "(%s): the kernel refuses %s unless it is" % (path, key.get("why"), what),
                             "install mokutil and run again (`mokutil --test-key %s` must say it is already "
                             "enrolled), or enrol it: %s" % (path, ENROL % path))


def box_secure_boot(found):
    """FOUND (what boot_state returned: the box's word, untrusted) typed and bounded again on the controller: states
    outside facts/secure_boot's words read as unknown, texts one bounded line, a key path an absolute path or ""."""
    found = found if isinstance(found, dict) else {}
    key = found.get("dkms_key") if isinstance(found.get("dkms_key"), dict) else None
    return {
        "state": found.get("state") if found.get("state") in secure_boot.STATES else "unknown",
        "why": text.line(found.get("why") if isinstance(found.get("why"), str) else "", 600) or "not read",
        "dkms_key": None if key is None else {
            "path": text.matching(key.get("path"), secure_boot.KEY_PATH) or "",
            "state": key.get("state") if key.get("state") in secure_boot.KEY_STATES else "unknown",
            "why": text.line(key.get("why") if isinstance(key.get("why"), str) else "", 600) or "not read"},
    }


def secure_boot_needs(model, box, running="", roles=None):
    """(needs, warnings, notes) of a box whose Secure Boot state is BOX (facts/secure_boot.read, as the preflight
    role's boot_state returns it; bounded again here) and whose running kernel is RUNNING, for the roles ROLES
    (default: the model's). Needs, worded as host_model.readiness words them ({role, key, why, how, text}): with
    Secure Boot on, the DKMS signing key enrolled where a role builds a module with DKMS (nvidia_p2p_driver; amd_rocm
    with rigbook_pins.rocm.dkms), and a kernel the owner built (custom_kernel) signed by a key shim trusts - known
    when it already runs with Secure Boot on. Warnings: Secure Boot could not be told where it would matter.
    Notes: what was found fine."""
    found = box_secure_boot(box)
    state, why = found["state"], found["why"]
    wanted = [role for role in model["roles"] if roles is None or role in roles]
    builds = [role for role in wanted if role == "nvidia_p2p_driver"
              or (role == "amd_rocm" and model["pins"]["rocm"]["dkms"])]
    kernel = custom_kernel(model) if "kernel" in wanted else ""
    if state in ("off", "not-efi"):
        return [], [], ["Secure Boot is off (%s)" % why]
    if not builds and not kernel:
        return [], [], ["Secure Boot is %s (%s): no role of this run builds a kernel module with DKMS or installs a "
                        "kernel you built" % (state, why)]
    if state != "on":
        uses = " and ".join([DKMS_BUILDS[role] for role in builds] + (["the kernel %s you built" % kernel]
                                                                      if kernel else []))
        return [], ["Secure Boot could not be told (%s): if it is on, %s need%s a key shim trusts "
                    "(docs/secure-boot.md)" % (why, uses, "s" if len(builds) + bool(kernel) == 1 else "")], []
    needs, notes = [], []
    key = found["dkms_key"] or {}
    for role in builds:
        if key.get("state") == "enrolled":
            notes.append("Secure Boot is on and the DKMS signing key %s is enrolled (%s): %s will load"
                         % (key.get("path"), key.get("why"), DKMS_BUILDS[role]))
        else:
            needs.append(_dkms_need(role, key))
    if kernel and running == kernel:
        notes.append("Secure Boot is on and the pinned kernel %s runs: it is signed by a key shim trusts" % kernel)
    elif kernel:
        needs.append(_secure_boot_need(
            "kernel", "Secure Boot is on and the pinned kernel %s is one you built (from .debs no distribution "
            "signs): shim will not boot it" % kernel,
            "a kernel you built is not signed by a key shim trusts: sign it (sbsign) with an enrolled MOK, or turn "
            "Secure Boot off in the firmware (a signed kernel booted once by hand is seen running and passes)"))
    return needs, [], notes
