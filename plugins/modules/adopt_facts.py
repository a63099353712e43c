#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: rigbook developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

DOCUMENTATION = r"""
---
module: adopt_facts
short_description: What a box set up by hand runs, for provision adopt to turn into pins
description:
  - Reads, in one module run, the running kernel, its own command line parameters, the GRUB default, the installed
    kernel packages of the running release with where each came from (C(apt-cache policy)) and, for one no archive
    offers, the .deb found in the apt cache or O(debs_dir) with its sha256; and every running SGLang engine (its
    command line with an API key's value redacted, venv, systemd unit, GPU environment without secrets, the
    NCCL/RCCL and runtime libraries it has mapped with their sha256, its venv's packages, with O(wheels_dir) the
    wheel files of those packages with their sha256, the files of its sglang that differ from the sha256 its RECORD
    lists and their diff from sglang's wheel). An engine is any process started as SGLang's server is
    (C(python -m sglang.launch_server), C(sglang serve), C(python -m sglang.cli.main serve), a wrapper that execs
    one of them).
  - The NVIDIA driver however it got there (DKMS, C(make modules_install), a package, or none on disk), the loaded
    module's version, srcversion, open or proprietary, its file and how that was installed, and the userspace
    version from the versioned library the loader finds (LD_LIBRARY_PATH, C(ldconfig -p), /usr/local/nvidia/lib64,
    /usr/lib*) or nvidia-smi (on the PATH or in /usr/local/nvidia/bin). How the box boots (/lib/modules of the
    running release, EFI, GRUB). Every apt source (sources.list, sources.list.d's *.list and *.sources) and the
    sha256 of each keyring they name.
  - What a box says is data from its local users too (a process's command line and environment, a venv's files).
    Only the engines of root and O(serve_user) are returned (another user's is skipped, named in the result, and
    nothing of its venv is read). A venv owned by a user other than root and the engine's user, or reached through
    a link, is not read at all. Every file of a venv (direct_url.json, RECORD, the sglang sources, the venv stamp)
    and of O(wheels_dir) is read without following a link (each path component opened O_NOFOLLOW, the file
    fstat-ed to be a regular file of bounded size; a venv's file of the venv's owner or readable by all). In every
    string each control character is replaced by U+FFFD and the string cut to 4096 characters, credentials in URLs
    are removed, an environment variable's name must be a shell name, and a key's value (--api-key,
    --admin-api-key) is hidden.
  - Read-only; supports check mode. Changes nothing on the host.
version_added: "1.0.0"
author:
  - rigbook developers (!UNKNOWN)
options:
  system:
    description: Where the box's files and /proc are read; V(/) but in tests.
    type: path
    default: /
  debs_dir:
    description: A folder on the host holding the kernel .debs that were installed by hand.
    type: path
  evidence_root:
    description: Where the running kernel's release and command line are read, as the P2P ladder reads them.
    type: path
    default: /
  wheels_dir:
    description:
      - Folders on the host holding the wheels the engine's venv was installed from; each one of an installed
        distribution's name and version is read with its sha256 (the lock's hashes), and sglang's wheel gives the
        original of its locally changed files (the diff adopt writes as a patch).
    type: list
    elements: path
    default: []
  gpu_env_file:
    description:
      - rigbook's GPU environment file; a variable an engine got from it (same name and value) belongs to the host
        model, not to the serve profile adopt writes.
    type: path
    default: /etc/rigbook/gpu.env
  engine:
    description:
      - The inventory's serve_engine argv; a process started by it (any interpreter) is an engine too, besides
        every way SGLang's server is started (C(-m sglang.launch_server), C(sglang serve), C(-m sglang.cli.main
        serve)).
    type: list
    elements: str
    default: []
  serve_user:
    description:
      - The user the serve units run engines as (the serve role's serve_user); an engine of any user but root and
        this one is not read.
    type: str
    default: rigbook-serve
extends_documentation_fragment:
  - rigbook.homelab.attributes.read_only
"""

EXAMPLES = r"""
- name: Read what the box runs
  rigbook.homelab.adopt_facts:
    debs_dir: /home/admin/kernel-debs
  register: adopted
"""

RETURN = r"""
facts:
  description:
    - C({kernel, engines, ...}); see plugins/module_utils/collect/adopt.py. Besides, C(nvidia_driver) (the loaded
      module, its version, srcversion, open, file, installed_by, userspace), C(boot) (modules_dir, efi, grub),
      C(apt_sources) (facts/apt_sources entries) and C(apt_keyrings) (the sha256 of each keyring they name).
      C(checks) holds C(notes) and C(unpinned) (text) of what was skipped, refused, removed or cut.
  returned: always
  type: dict
"""

import math
import os
import re

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.rigbook.homelab.plugins.module_utils.collect import adopt as collect
from ansible_collections.rigbook.homelab.plugins.module_utils.collect import static_evidence
from ansible_collections.rigbook.homelab.plugins.module_utils.facts import apt_sources, files, kernel, runner, text
from ansible_collections.rigbook.homelab.plugins.module_utils.host_pins import ENV_NAME, redact
from ansible_collections.rigbook.homelab.plugins.module_utils.serve.profile import redacted_argv

MAX_ITEMS = 4096  # items of one list or mapping the box gave (argv words, environment variables, packages)
MAX_ENV_NAME = 128
MAX_SHOWN = 10  # places named in one note
CONTROL_OR_BREAK = re.compile(r"[\x00-\x1f\x7f-\x9f]")
REPLACED = "\ufffd"  # what stands for a control character: no name, version or URL rule accepts it
URL_USER = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^/@\s]*@")
PATCH = "sglang_files.patch"  # the one multi-line text of the facts: a diff, never cut


# --- typed and bounded: every value the box gave (pure; provision adopt applies it again on the controller) ------

def _clean(value, where, found):
    """VALUE with every string cut to text.MAX_FIELD characters, each of its control characters (line breaks and tabs
    too) replaced by REPLACED (a value the box gave stays one no rule of adopt's accepts, never becomes another) and
    the credentials of a URL in it removed (host_pins.redact); lists and mappings cut to MAX_ITEMS; a
    number that is not finite None. FOUND[kind] collects where each change was made."""
    if isinstance(value, dict):
        if len(value) > MAX_ITEMS:
            found["cut"].append(where)
        out = {}
        for key, item in list(value.items())[:MAX_ITEMS]:
            name = _clean(str(key), where + "." + str(key)[:40], found)
            out[name] = _clean(item, "%s.%s" % (where, name) if where else name, found)
        return out
    if isinstance(value, (list, tuple)):
        if len(value) > MAX_ITEMS:
            found["cut"].append(where)
        return [_clean(item, "%s[%d]" % (where, i), found) for i, item in enumerate(list(value)[:MAX_ITEMS])]
    if isinstance(value, bool) or value is None or isinstance(value, int):
        return value
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        found["figure"].append(where)
        return None
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    value = str(value)
    if where.endswith(PATCH):
        if text.CONTROL.search(value):  # a diff keeps its line breaks and tabs; anything else: no patch
            found["patch"].append(where)
            return None
        return value
    if "://" in value and URL_USER.search(value) and redact(value) != value:  # "//***@" stays as it is
        value = redact(value)
        found["redacted"].append(where)
    if CONTROL_OR_BREAK.search(value):
        value = CONTROL_OR_BREAK.sub(REPLACED, value)
        found["control"].append(where)
    if len(value) > text.MAX_FIELD:
        value = value[:text.MAX_FIELD]
        found["cut"].append(where)
    return value


def _names(kind, places):
    shown = ", ".join(places[:MAX_SHOWN]) + (" and %d more" % (len(places) - MAX_SHOWN)
                                             if len(places) > MAX_SHOWN else "")
    return "%s: %s" % (kind, shown)


def _shell_names(engine, unpinned):
    """ENGINE's environment (and the names it lists) with only shell names ([A-Za-z_][A-Za-z0-9_]*, at most
    MAX_ENV_NAME characters) kept; each other name is said in UNPINNED, never written as a key."""
    def good(name):
        return isinstance(name, str) and len(name) <= MAX_ENV_NAME and bool(ENV_NAME.match(name))

    env = engine.get("env") if isinstance(engine.get("env"), dict) else {}
    bad = [name for name in env if not good(name)]
    for field in ("secret_env", "env_from_rigbook"):
        names = engine.get(field) if isinstance(engine.get(field), list) else []
        bad += [name for name in names if not good(name) and name not in bad]
        engine[field] = [name for name in names if good(name)]
    engine["env"] = dict((name, value if isinstance(value, str) else str(value)) for name, value in env.items()
                         if good(name))
    for name in bad:
        unpinned.append("rigbook_serve: the engine /proc/%s's environment holds %r, no shell name "
                        "([A-Za-z_][A-Za-z0-9_]*, at most %d characters): not copied"
                        % (engine.get("pid"), str(name)[:60], MAX_ENV_NAME))


def typed(facts):
    """(facts, notes, unpinned): FACTS (what adopt_facts read) typed and bounded: _clean on every value, the shapes
    provision adopt reads (kernel a mapping, dkms and engines lists of mappings, an engine's pid a number), the
    environment's names shell names (_shell_names), every key's value (the API key's, the admin API key's: any
    spelling the engine reads) hidden in every command line (serve/profile.redacted_argv). Pure and idempotent: the
    module applies it on the box, provision adopt again on what the run stored."""
    found = {"control": [], "cut": [], "redacted": [], "figure": [], "patch": []}
    facts = _clean(facts if isinstance(facts, dict) else {}, "", found)
    notes, unpinned = [], []
    for field in ("kernel", "boot", "apt_keyrings"):
        facts[field] = facts.get(field) if isinstance(facts.get(field), dict) else {}
    for field in ("rocm", "cuda_venv", "nvidia_driver"):
        facts[field] = facts.get(field) if isinstance(facts.get(field), dict) else None
    for field in ("dkms", "engines", "apt_sources", "gpus"):
        items = facts.get(field) if isinstance(facts.get(field), list) else []
        facts[field] = [item for item in items if isinstance(item, dict)]
    if not isinstance(facts["kernel"].get("cmdline"), list):
        facts["kernel"]["cmdline"] = []
    facts["kernel"]["cmdline"] = [word for word in facts["kernel"]["cmdline"] if isinstance(word, str)]
    engines, facts["engines"] = facts["engines"], []
    for engine in engines:
        engine["pid"] = text.integer(engine.get("pid"))
        if engine["pid"] is None or engine["pid"] < 1:
            unpinned.append("rigbook_serve: an engine without a process id was left out")
            continue
        facts["engines"].append(engine)
        for field in ("venv", "unit", "interpreter"):
            engine[field] = engine.get(field) if isinstance(engine.get(field), str) and engine.get(field) else None
        items = engine.get("packages") if isinstance(engine.get("packages"), list) else []
        engine["packages"] = [item for item in items if isinstance(item, dict)]
        _shell_names(engine, unpinned)
        for field in ("argv", "args"):
            words = engine.get(field) if isinstance(engine.get(field), list) else []
            engine[field] = redacted_argv([word for word in words if isinstance(word, str)])
    said = (("control", "control characters replaced by U+FFFD in what the box said"),
            ("cut", "cut to %d characters (a list or mapping to %d items)" % (text.MAX_FIELD, MAX_ITEMS)),
            ("redacted", "credentials removed from a URL (put them where git, pip or apt read them on the box, "
                         "never in a URL)"),
            ("figure", "a number that is not finite, dropped"),
            ("patch", "a local patch holding control characters other than tabs and line breaks, not written"))
    notes += [_names(why, found[kind]) for kind, why in said if found[kind]]
    return facts, notes, unpinned


# --- what adopt_facts reads besides collect/adopt.py: the driver wherever it lives, how the box boots, apt sources --

def _library_dirs(engines, live, run):
    """The folders the loader looks in for the driver's libraries, in its order: the engines' LD_LIBRARY_PATH and, on
    a live box, this process's; the loader's cache (ldconfig -p); then kernel.DRIVER_LIBRARY_DIRS."""
    paths = [(e.get("env") or {}).get("LD_LIBRARY_PATH") for e in engines]
    if live:
        paths.append(os.environ.get("LD_LIBRARY_PATH"))
    folders = [f for p in paths if isinstance(p, str) for f in p.split(":") if f.startswith("/")]
    if live:
        rc, out = run(kernel.LDCONFIG)
        folders += kernel.parse_ldconfig(out if rc == 0 else "")
    folders += list(kernel.DRIVER_LIBRARY_DIRS)
    return list(dict.fromkeys(folders))


def nvidia_driver(system, evidence_root, release, run, engines, gpus):
    """The NVIDIA driver as the box runs it, however it got there, or None on a box with neither the module loaded
    nor an NVIDIA GPU: {loaded, version, version_source, srcversion, open, file, file_source, installed_by,
    userspace: {version, where, from: "library" or "nvidia-smi"} or None, userspace_smi}. The module as the ladder reads it
    (static_evidence.collect_nvidia: /sys/module/nvidia/version, /proc/driver/nvidia/version, nvidia-smi), its
    srcversion and file (facts/kernel), the userspace from the versioned library the loader finds, else nvidia-smi
    (on the PATH, or /usr/local/nvidia/bin)."""
    root = evidence_root or system
    loaded = kernel.module_loaded(root, "nvidia")
    if not loaded and not any(g.get("vendor") == "nvidia" for g in gpus or []):
        return None
    ladder = static_evidence.collect_nvidia(root, release)
    version, source = text.matching(ladder.get("module_version"), kernel.DRIVER_VERSION), "/sys/module/nvidia/version"
    if version is None:
        version = text.matching(ladder.get("proc_module_version"), kernel.DRIVER_VERSION)
        source = "/proc/driver/nvidia/version" if version else None
    live = files.is_live(root)
    path, file_source = kernel.module_file(root, release, "nvidia", run if live else None)
    smi = kernel.parse_driver_version(ladder.get("userspace_version"))
    smi_where = "nvidia-smi" if smi else None
    if smi is None and files.is_live(system):
        smi, smi_where = kernel.smi_userspace(system, run)
    library = kernel.driver_userspace(system, _library_dirs(engines, files.is_live(system), run))
    userspace = ({"version": library["version"], "where": library["path"], "from": "library"} if library else
                 {"version": smi, "where": smi_where, "from": "nvidia-smi"} if smi else None)
    return {"loaded": loaded, "version": version, "version_source": source,
            "srcversion": ladder.get("srcversion"), "open": ladder.get("open_kernel_module"),
            "file": path, "file_source": file_source, "installed_by": kernel.installed_by(path, release),
            "userspace": userspace, "userspace_smi": smi}


def _rocm_source(entry):
    """An apt_sources entry in the shape rocm facts carry (host_pins reads it): signed_by "inline" for a key given
    in the stanza itself."""
    signed = entry["signed_by"]
    return {"file": entry["file"], "types": entry["types"], "uris": entry["uris"], "suites": entry["suites"],
            "components": entry["components"],
            "signed_by": "inline" if signed == [apt_sources.INLINE_KEY] else signed}


def box_facts(facts, system, evidence_root, run):
    """FACTS (collect.adopt_facts') with the driver wherever it lives (nvidia_driver; nvidia_userspace the library
    the loader finds first, else what nvidia-smi says), how the box boots (boot), every apt source
    (facts/apt_sources, the one parser: apt_sources, apt_keyrings with each keyring's sha256) and ROCm's sources
    read by that parser."""
    release = (facts.get("kernel") or {}).get("release")
    driver = nvidia_driver(system, evidence_root, release, run, facts.get("engines") or [], facts.get("gpus"))
    facts["nvidia_driver"] = driver
    userspace = (driver or {}).get("userspace")
    if userspace and (userspace["from"] == "library" or not facts.get("nvidia_userspace")):
        facts["nvidia_userspace"] = userspace["version"]  # the library the loader finds first, else nvidia-smi's
    facts["boot"] = kernel.boot_facts(system, evidence_root, release)
    # the CPU's physical address width (/proc/cpuinfo): whether HMM can confine host memory (judges/static_layers)
    facts["cpu_address_bits"] = static_evidence.collect_cpu(evidence_root).get("address_bits")
    sources = apt_sources.read_all(system)
    facts["apt_sources"] = sources
    keyrings = [{"signed_by": [p for p in e["signed_by"] if p.startswith("/")]} for e in sources if e["enabled"]]
    facts["apt_keyrings"] = collect.keyring_digests(system, keyrings)
    if isinstance(facts.get("rocm"), dict):
        facts["rocm"]["sources"] = [_rocm_source(e) for e in sources if e["enabled"]]
        facts["rocm"]["keyrings"] = facts["apt_keyrings"]
    return facts


def main():
    module = AnsibleModule(
        argument_spec=dict(system=dict(type="path", default="/"), debs_dir=dict(type="path"),
                           engine=dict(type="list", elements="str", default=[]),
                           evidence_root=dict(type="path", default="/"),
                           wheels_dir=dict(type="list", elements="path", default=[]),
                           gpu_env_file=dict(type="path", default="/etc/rigbook/gpu.env"),
                           serve_user=dict(type="str", default="rigbook-serve")),
        supports_check_mode=True,
    )
    params = module.params
    try:
        # RUN: (rc, stdout) of an argv through the one runner; rc -1 when the box has no such command (no dkms);
        # whose engines and venvs are read is decided there, before anything of a venv is read
        facts = collect.adopt_facts(params["system"], runner.rc_output, params["debs_dir"], params["engine"],
                                    params["evidence_root"], params["wheels_dir"], params["gpu_env_file"],
                                    params["serve_user"])
        facts = box_facts(facts, params["system"], params["evidence_root"], runner.rc_output)
    except (OSError, ValueError) as exc:
        module.fail_json(msg="reading the box failed: %s" % CONTROL_OR_BREAK.sub("", str(exc))[:text.MAX_FIELD])
    facts, more_notes, more_unpinned = typed(facts)
    facts["checks"] = {"notes": facts["checks"]["notes"] + more_notes,
                       "unpinned": facts["checks"]["unpinned"] + more_unpinned}
    module.exit_json(changed=False, facts=facts)


if __name__ == "__main__":
    main()
