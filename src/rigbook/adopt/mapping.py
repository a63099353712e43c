"""What adopt_facts read on a box set up by hand -> the rigbook_* variables that reproduce it (`adopt_of`), each value
with where it was read (comments), what could not be pinned (unpinned, with the reason) and notes.

The pins come from the one table of pins, plugins/module_utils/host_pins.PINS (each pin's inverse beside the forward
host_model.build uses: a new pin is added there, for both). Here: the serve profiles (each running engine's command
line and GPU environment), and the files written beside the pins (the SGLang venv's lock, its local patch).
"""

from __future__ import annotations

import hashlib
import math
import re
from pathlib import Path
from urllib.parse import quote

from rigbook.adopt.emit import comment
from rigbook.paths import collection_root, name_file

NOT_READ_YET = ()
UNIT_NAME = re.compile(r"[^a-z0-9-]+")
# What a lock line may hold of what the box said (anything else would be a pip option or a second requirement).
DIST_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$")
DIST_VERSION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.+!_-]*$")
VCS_URL = re.compile(r"^(https?|ssh|git|file)://[^\s#@]+$|^[A-Za-z0-9._-]+@[A-Za-z0-9.-]+:[^\s#@]+$")
VENV_TOOLS = frozenset(("pip", "setuptools", "wheel", "distribute"))


def _host_pins():
    """plugins/module_utils/host_pins (imported when used: the collection is on the import path by then)."""
    # deferred: ansible_collections.rigbook.homelab is importable only once link_collection() ran (validate runs it)
    from ansible_collections.rigbook.homelab.plugins.module_utils import host_pins

    return host_pins


def _box_rules():
    """plugins/modules/adopt_facts: the rules the module applies on the box to what it read (`typed`), applied here
    again to what the run stored."""
    # deferred: ansible_collections.rigbook.homelab is importable only once link_collection() ran (validate runs it)
    from ansible_collections.rigbook.homelab.plugins.modules import adopt_facts

    return adopt_facts


def _finite(profile: dict) -> dict:
    """PROFILE with a number that is not finite (--mem-fraction-static nan) given back as the text the engine was
    given: the schema names it, instead of a NaN that never equals itself."""
    return {key: (str(value) if isinstance(value, float) and not math.isfinite(value) else value)
            for key, value in profile.items()}


def _profile_name(engine: dict, taken: set) -> str:
    """A serve profile name for ENGINE: its unit's name without .service (lowercase, [a-z0-9-]), else "engine";
    -2, -3, ... when taken."""
    base = UNIT_NAME.sub("-", (engine.get("unit") or "engine").removesuffix(".service").lower()).strip("-")
    base = base.removeprefix("rigbook-serve-") or "engine"
    name, n = base, 2
    while name in taken:
        name, n = f"{base}-{n}", n + 1
    taken.add(name)
    return name


def _lock_line(p: dict) -> tuple:
    """(requirement line without hashes or None, [sha256 of the wheels found], why it cannot be written or None) of
    one venv distribution P (venv_packages with wheel_files)."""
    pins = _host_pins()
    name, version, install = p.get("name") or "", p.get("version") or "", p.get("install")
    if not DIST_NAME.match(name) or not DIST_VERSION.match(version):
        return None, [], f"{name!r} {version!r} is no distribution name and version pip reads"
    # one wheel file may be in two --wheels-dir folders: each sha256 once
    hashes = sorted(set(w["sha256"] for w in p.get("wheels") or [] if pins.SHA256.match(w.get("sha256") or "")))
    if install == "index":
        return f"{name}=={version}", hashes, None
    if isinstance(install, dict) and install.get("vcs"):
        url, commit = install.get("url") or "", install.get("commit") or ""
        if install["vcs"] != "git" or not VCS_URL.match(url) or not pins.HEX.match(commit):
            return None, [], (f"{name} {version}: a {install['vcs']} install from {pins.redact(url)!r} at {commit!r} "
                              "(a lock line needs git, a URL without credentials and a full commit)")
        return f"{name} @ git+{url}@{commit}", [], None
    if isinstance(install, dict) and "archive" in install:
        return f"{name}=={version}", sorted(set(hashes + ([install["sha256"]] if install.get("sha256") else []))), None
    kind = install.get("local") if isinstance(install, dict) else install
    url = install.get("url") if isinstance(install, dict) else None
    return None, [], (f"{name} {version}: an {kind} install from {pins.redact(url)!r}: it cannot be reproduced "
                      "from a lock")


def lock_of(engine: dict, host: str, version: str, wheels_dir: bool = True) -> tuple:
    """(lock text, problems [text], without hashes [text]) of ENGINE's venv: one requirement a distribution, sorted;
    `--hash=sha256:` of each wheel found on the box only when every line has one (pip checks hashes only when every
    requirement has one: a lock with some is refused by pip as a whole)."""
    lines, problems, bare = [], [], []
    for p in sorted(engine.get("packages") or [], key=lambda p: p.get("name") or ""):
        if p.get("name") in VENV_TOOLS:
            continue  # what `python -m venv` put there, left out as `pip freeze` leaves it out
        line, hashes, problem = _lock_line(p)
        if problem:
            problems.append(problem)
            continue
        lines.append((line, hashes))
        if not hashes:
            bare.append(line)
    hashed = bool(lines) and not bare
    head = [f"# Written by `provision adopt {comment(host)}`: every distribution of {comment(engine.get('venv'))} "
            f"(its dist-info name and version), the venv of SGLang {comment(version)}.",
            "# --hash: the sha256 of each wheel found on the box" if hashed else
            "# No --hash lines: not every distribution's wheel was found on the box (pip checks hashes only when "
            "every line has one)."]
    head += [f"# left out: {comment(text)}" for text in problems]
    body = [line + "".join(f" --hash=sha256:{h}" for h in hashes) if hashed else line for line, hashes in lines]
    return "\n".join(head + body) + "\n", problems, bare


def _sglang_extras(engine: dict, pin: dict, host: str, inventory_dir, wheels_dir, comments: dict, unpinned: list,
                   notes: list) -> dict:
    """The lock and the local patch of the engine's sglang beside the pins: {path relative to INVENTORY_DIR: text}
    to write, PIN given lock and patches."""
    files = {}
    version = pin["version"]
    stem = f"{name_file(host, '')}-sglang-{quote(version, safe='')}"
    text, problems, bare = lock_of(engine, host, version)
    lock = f"locks/{stem}.txt"
    files[lock] = text
    pin["lock"] = lock
    key = ("rigbook_pins", "sglang")
    comments[key + ("lock",)] = (f"written beside the pins: every dist-info of {engine.get('venv')}"
                                 + ("" if bare else ", with the sha256 of each wheel found in --wheels-dir"))
    notes += [f"problem: {engine.get('venv')}: {text}" for text in problems]
    if bare:
        where = f"--wheels-dir {wheels_dir}" if wheels_dir else "no --wheels-dir given"
        unpinned.append(f"rigbook_pins.sglang.lock: written without --hash: no wheel file found ({where}) for "
                        + ", ".join(bare[:20]) + (f" and {len(bare) - 20} more" if len(bare) > 20 else "")
                        + "; put those wheels in a folder on the box and adopt again with --wheels-dir")
    local = engine.get("sglang_files") or {}
    changed = local.get("changed") or []
    for item in changed:
        notes.append(f"{engine.get('venv')}: sglang's {item.get('path')} {item.get('state')} "
                     + ("(its sha256 is not the one its RECORD lists: a local change)"
                        if item.get("state") == "differs" else "(RECORD lists it)"))
    differs = {item.get("path") for item in changed if item.get("state") == "differs"}
    covered = _named_patch_files(pin.get("patches") or [])
    if differs and covered is not None:
        outside = sorted(differs - covered)
        if not outside:
            notes.append(f"{engine.get('venv')}: the files that differ from sglang's RECORD are the ones rigbook's "
                         "patches of its stamp change: pinned by name")
        else:
            unpinned.append(f"rigbook_pins.sglang.patches: {', '.join(outside)} changed outside rigbook's patches "
                            "of the venv's stamp: not pinned (a twin gets the named patches only); make that change "
                            "a patch of its own and add it")
    elif local.get("patch"):
        patch = f"patches/{stem}-local.patch"
        files[patch] = local["patch"]
        # An absolute path: the sglang role copies a patch's path with ansible.builtin.copy, which looks a relative
        # path up in the role's files/, not the inventory.
        pin["patches"] = [{"path": str(Path(inventory_dir).resolve() / patch),
                           "sha256": hashlib.sha256(local["patch"].encode()).hexdigest()}]
        comments[key + ("patches", 0)] = (f"written beside the pins: the diff from {local.get('wheel')} to the "
                                          f"installed files that differ from sglang's RECORD")
    elif differs:
        why = local.get("problem") or ("sglang's wheel is not in " + (f"--wheels-dir {wheels_dir}" if wheels_dir
                                                                        else "a --wheels-dir (none given)"))
        unpinned.append(f"rigbook_pins.sglang.patches: sglang's files differ from its RECORD and no patch was "
                        f"written: {why}")
    return files


def _named_patch_files(patches: list):
    """The files (relative to site-packages) that PATCHES change, when every one is a patch by name of the sglang
    role's files/patches/ with the sha256 given; else None (not rigbook's patch set: the local diff decides)."""
    if not patches or any("name" not in patch for patch in patches):
        return None
    files = set()
    for patch in patches:
        path = collection_root() / "roles/sglang/files/patches" / patch["name"]
        try:
            data = path.read_bytes()
        except OSError:
            return None
        if hashlib.sha256(data).hexdigest() != patch.get("sha256"):
            return None
        for line in data.decode("utf-8", "replace").splitlines():
            if line.startswith("+++ "):
                target = line[4:].split("\t")[0].strip()
                files.add(target[2:] if target.startswith(("a/", "b/")) else target)
    return files


def _flags_sglang_lacks(engine: dict, profile: dict, index: int) -> list:
    """What to say of each flag of PROFILE's extra_args that the engine's installed SGLang does not define (its
    "sglang_flags", read from its sources; a unique prefix counts, as the engine's argument parser reads it)."""
    known = engine.get("sglang_flags")
    if not known:
        return []
    version = next((p["version"] for p in engine.get("packages") or [] if p.get("name") == "sglang"), "?")
    lacking = []
    for word in profile.get("extra_args") or []:
        flag = word.partition("=")[0]
        if flag.startswith("--") and not any(k.startswith(flag) for k in known):
            lacking.append(f"rigbook_serve[{index}].extra_args ({profile['name']}): the engine was started with "
                           f"{flag}, which sglang {version} in {engine.get('venv')} does not define (its "
                           "server_args): an engine from these pins refuses it; remove it or pin the SGLang "
                           "that has it")
    return lacking


def _serve_profiles(facts: dict, comments: dict, unpinned: list, notes: list) -> list:
    """rigbook_serve: one profile of each running engine's command line (serve/profile.profile_from_argv) and GPU
    environment, with where it was read; an API key, the admin API key or a secret-looking variable never
    copied (serve/profile: SECRET_FILES)."""
    # deferred: ansible_collections.rigbook.homelab is importable only once link_collection() ran (validate runs it)
    from ansible_collections.rigbook.homelab.plugins.module_utils.serve.profile import profile_from_argv

    profiles, taken = [], set()
    for engine in facts.get("engines") or []:
        name = _profile_name(engine, taken)
        profile, found = profile_from_argv(engine.get("args") or [], name)  # a key (API, admin) never copied
        profile = _finite(profile)
        where = f"/proc/{engine['pid']}/cmdline" + (f" (unit {engine['unit']})" if engine.get("unit") else
                                                    " (started from a shell, no unit)")
        if engine.get("env"):
            profile["env"] = dict(engine["env"])
            comments[("rigbook_serve", len(profiles), "env")] = f"/proc/{engine['pid']}/environ (GPU variables only)"
        for secret in engine.get("secret_env") or []:
            notes.append(f"{name}: {secret} is in the engine's environment and looks like a secret: not copied")
        comments[("rigbook_serve", len(profiles))] = where
        notes += [f"{name}: {text}" for text in found]
        unpinned += _flags_sglang_lacks(engine, profile, len(profiles))
        profiles.append(profile)
        if engine.get("env_from_rigbook"):
            notes.append(f"{name}: {', '.join(engine['env_from_rigbook'])} came from rigbook's GPU environment "
                         "file (the host model's): not written into the profile")
    if not facts.get("engines"):
        unpinned.append("rigbook_serve: no running SGLang engine was found (no process runs sglang.launch_server)")
    return profiles


def variables_of(facts: dict) -> tuple:
    """(variables, comments {path: where}, unpinned [text], notes [text]) of the facts adopt_facts read."""
    return adopt_of(facts)[:4]


def adopt_of(facts: dict, host: str = "HOST", inventory_dir=".", wheels_dir: str | None = None) -> tuple:
    """(variables, comments, unpinned, notes, files): variables_of's, and the files written beside the pins ({path
    relative to INVENTORY_DIR: text}: the venv's lock, the local patch of its sglang)."""
    host_pins = _host_pins()
    # what the run stored is what the box said: typed and bounded again, as the module did on the box
    facts, said, not_copied = _box_rules().typed(facts)
    checks = facts.get("checks") if isinstance(facts.get("checks"), dict) else {}
    reading = host_pins.read_pins(facts)  # every pin of the table, in its order
    pins, comments, unpinned, notes = reading.pins, reading.comments, reading.unpinned, reading.notes
    notes[:0] = [str(text) for text in checks.get("notes") or []] + said
    unpinned[:0] = [str(text) for text in checks.get("unpinned") or []] + not_copied
    files: dict = {}
    engine, _ = host_pins.sglang_engine(facts)
    if "sglang" in pins and host_pins.SGLANG_VERSION.match(pins["sglang"]["version"]):
        files = _sglang_extras(engine, pins["sglang"], host, inventory_dir, wheels_dir, comments, unpinned, notes)
    profiles = _serve_profiles(facts, comments, unpinned, notes)
    unpinned += list(NOT_READ_YET)
    variables = {}
    if pins:
        variables["rigbook_pins"] = pins
    if profiles:
        variables["rigbook_serve"] = profiles
    return variables, comments, unpinned, notes, files
