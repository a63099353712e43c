"""`provision manifest` and `provision diff`: prove a second box identical to the first.

`provision manifest -i INV` runs playbooks/manifest.yml (module rigbook.homelab.host_manifest) and stores each
host's manifest as <run>/manifests/<host>.json. `provision diff A B` compares two manifests (a host of the last
manifest run, or a saved manifest file), grouped by ladder layer / role, with host-unique items apart, each build's
hash and each stored .deb the distribution kernel was installed from with its sha256 (kernel_debs); it exits 1
when a pinned item differs and 0 when only host-unique items do. `provision diff -i INV A B`: A and B are hosts of
the inventory INV (validated as every command validates it), each compared by its newest manifest stored by a
`provision manifest` run of that inventory (the run's run.json names it), or saved manifest files. Every value is
printed whole, never shortened, and terminal-safe (display.terminal_safe).

What an item is (its group, host-unique or pinned, a build's hash, a build's own bits) is decided here from the
item's name (label_of, ITEM_RULES), never taken from the manifest: a box labels its own items, so a twin that called
a drifted file "host-unique" or "a build's bits" would otherwise make `provision diff` read clean.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from rigbook import runs
from rigbook.errors import UserError
from rigbook.paths import inventory_key
from rigbook.statefile import read_json
from rigbook.terminal import terminal_safe

MANIFEST_DIR = "manifests"
PLAYBOOK = "manifest.yml"
EXIT_SAME, EXIT_PINNED_DIFFER = 0, 1

# (item name pattern, its group, host-unique, a build's hash, only a build's bits): the first whose pattern matches
# the whole name decides; the items collect/manifest.py makes (its docstring lists them). A named group "build" is
# the build the hash belongs to. Any other name is pinned, in group "other": what the controller does not know is
# held equal, never excused.
ITEM_RULES = (
    (r"host\..+", "host", True, False, False),
    (r"bind\..+", "serve", True, False, False),
    (r"file\.etc/rigbook/serve/[^/]+\.key\.env", "serve", True, False, False),
    (r"file\.etc/rigbook/serve/[^/]+\.env", "serve", False, False, False),
    (r"file\.etc/systemd/system/rigbook-serve-[^/]+\.service", "serve", False, False, False),
    (r"file\.etc/rigbook/gpu\.env", "gpu_env", False, False, False),
    (r"file\.etc/rigbook/cuda\.env", "cuda_toolchain", False, False, False),
    (r"dmi\.(?:board_serial|product_serial|chassis_serial|product_uuid)", "host", True, False, False),
    (r"dmi\.(?:bios_version|bios_date|board_name|board_vendor)", "firmware", False, False, False),
    (r"gpu\.count", "pcie_link", False, False, False),
    (r"gpu\.[0-9a-f:.]+\.serial", "host", True, False, False),
    (r"gpu\.[0-9a-f:.]+\.(?:model|vbios)", "firmware", False, False, False),
    (r"gpu\.[0-9a-f:.]+\.link", "pcie_link", False, False, False),
    (r"gpu\.[0-9a-f:.]+\.bars", "dma_window", False, False, False),
    (r"kernel\.(?:running|cmdline|config|default|installed|held|debs)", "kernel_state", False, False, False),
    (r"(?P<build>dkms\..+)\.modules_sha256", "driver_state", False, True, True),
    (r"dkms\..+", "driver_state", False, False, False),
    (r"packages\.held", "packages", False, False, False),
    (r"driver\.(?:nvidia|nvidia_files|amdgpu)", "driver_state", False, False, False),
    (r"rocm\.version", "amd_rocm", False, False, False),
    (r"cuda\.version", "cuda_toolchain", False, False, False),
    (r"(?P<build>rccl)\.stamp_sha256", "rccl", False, True, False),
    (r"rccl\.(?:version|patches|files)", "rccl", False, False, False),
    (r"(?P<build>nccl_tests)\.stamp_sha256", "nccl_tests", False, True, False),
    (r"nccl_tests\.(?:version|patches|files)", "nccl_tests", False, False, False),
    (r"(?P<build>sglang\.[^/]+)\.stamp_sha256", "sglang", False, True, False),
    (r"sglang\.[^/]+\.(?:versions|patches|packages)", "sglang", False, False, False),
)
_RULES = tuple((re.compile(pattern), group, unique, build, bits) for pattern, group, unique, build, bits in ITEM_RULES)


def label_of(key: str) -> dict:
    """{"group", "unique", "build", "bits"} of the manifest item named KEY, by ITEM_RULES (build: the name of the
    build a hash belongs to, or None; bits: only the bits built on the box, never a pinned difference)."""
    for pattern, group, unique, build, bits in _RULES:
        found = pattern.fullmatch(key)
        if found:
            return {"group": group, "unique": unique, "build": found.group("build") if build else None, "bits": bits}
    return {"group": "other", "unique": False, "build": None, "bits": False}


def manifest_runs() -> list:
    """The run folders holding manifests, newest first."""
    return [path for path in runs.run_dirs()
            if (path / MANIFEST_DIR).is_dir() and any((path / MANIFEST_DIR).glob("*.json"))]


def last_manifest_run() -> Path | None:
    """The newest run folder holding manifests, or None."""
    found = manifest_runs()
    return found[0] if found else None


def _run_inventory(run_dir: Path, warn) -> str | None:
    """The inventory key of the inventory RUN_DIR's run was made with (its run.json; runs.inventory_key_of); None
    when unknown (no record, or a bad one: named through WARN)."""
    try:
        record = runs.read_record(run_dir)
    except runs.BadRecord as exc:
        warn(f"warning: {exc}: its manifests are left out")
        return None
    return runs.inventory_key_of(record) if record else None


def _warn(line: str) -> None:
    print(terminal_safe(line), file=sys.stderr)


def latest_of_inventory(inventory: Path, warn=None) -> dict:
    """{host: its newest stored manifest file} over the manifest runs made with INVENTORY; a run whose record is bad
    is named through WARN (default: a line on stderr) and left out."""
    warn = warn or _warn
    want, found = inventory_key(inventory), {}
    for run_dir in manifest_runs():
        if want is None or _run_inventory(run_dir, warn) != want:
            continue
        for path in (run_dir / MANIFEST_DIR).glob("*.json"):
            found.setdefault(path.stem, path)
    return found


def _manifest_problem(data) -> str | None:
    """What is wrong with the shape of a manifest, or None: the one place that decides it."""
    if not isinstance(data, dict):
        return f"not a JSON object but {type(data).__name__}"
    items = data.get("items")
    if not isinstance(items, dict):
        return "no items object"
    for key, item in items.items():
        if not isinstance(item, dict):
            return f"item {key!r} is not an object but {type(item).__name__}"
    return None  # an item's labels (group, unique, build, bits) are never read: label_of decides them


def read_manifest(path: Path) -> dict:
    """The manifest in PATH; UserError (exit 2) naming the file and the problem when it cannot be read, is not
    UTF-8 JSON or not a manifest's shape."""
    try:
        data, problem = read_json(path)
    except OSError as exc:
        raise UserError(f"manifest {path}: cannot read: {exc.strerror or exc}") from None
    problem = problem or _manifest_problem(data)
    if problem:
        raise UserError(f"{path}: not a manifest ({problem}; make one with `provision manifest -i INV`)")
    return data


def resolve_side(spec: str, run_dir: Path | None) -> tuple:
    """(label, manifest) for SPEC: a saved manifest file, or a host of RUN_DIR's manifests."""
    given = Path(spec)
    if given.is_file():
        return str(given), read_manifest(given)
    if run_dir is None:
        raise UserError(f"{spec!r} is no manifest file, and there is no manifest run yet "
                        "(run `provision manifest -i INV` first)")
    hosts = sorted(p.stem for p in (run_dir / MANIFEST_DIR).glob("*.json"))
    if spec not in hosts:
        raise UserError(f"{spec!r} is neither a manifest file nor a host of the last manifest run {run_dir} "
                        f"(hosts: {', '.join(hosts) or 'none'})")
    return spec, read_manifest(run_dir / MANIFEST_DIR / f"{spec}.json")


def resolve_inventory_side(spec: str, inv, stored: dict, given: str) -> tuple:
    """(label, manifest) for SPEC with -i GIVEN: a host of the inventory INV (its newest manifest in STORED, from
    latest_of_inventory), else a saved manifest file."""
    if spec in inv.hosts:
        if spec not in stored:
            have = ", ".join(h for h in inv.hosts if h in stored) or "none"
            raise UserError(f"host {spec!r} of inventory {given} has no stored manifest from a manifest run of that "
                            f"inventory (run `provision manifest -i {given}` first; hosts with one: {have})")
        return spec, read_manifest(stored[spec])
    if Path(spec).is_file():
        return spec, read_manifest(Path(spec))
    raise UserError(f"{spec!r} is neither a host of inventory {inv.path} nor a manifest file "
                    f"(hosts: {', '.join(inv.hosts) or 'none'})")


def kernel_debs(a: dict, b: dict) -> list:
    """[{package, a, b, equal}] of the kernel's stored .debs on either side (the item kernel.debs: {package: {version,
    sha256}} from the kernel role's note, module_utils/deb_store): each package's version and sha256 as "VERSION
    sha256 HEX", None where a side has none. A side whose item is no such mapping lists nothing of its own."""
    def packages_of(manifest: dict) -> dict:
        value = ((manifest.get("items") or {}).get("kernel.debs") or {}).get("value")
        return value if isinstance(value, dict) else {}

    def shown(entry) -> str | None:
        if not isinstance(entry, dict):
            return None
        return f"{entry.get('version')} sha256 {entry.get('sha256')}"

    left, right = packages_of(a), packages_of(b)
    rows = []
    for package in sorted(set(left) | set(right)):
        row = {"package": str(package), "a": shown(left.get(package)), "b": shown(right.get(package))}
        rows.append({**row, "equal": row["a"] is not None and row["a"] == row["b"]})
    return rows


def diff(a: dict, b: dict) -> dict:
    """{"pinned": {group: [{item, a, b}]}, "unique": [{item, group, a, b}], "same": N, "builds": [{build, a, b,
    equal}], "kernel_debs": [{package, a, b, equal}]} of two manifests; builds: each build's hash on either side
    (equal: one group build); kernel_debs: the sha256 of each stored .deb the kernel was installed from (kernel.debs
    is a pinned item too). What each item is comes from label_of (its name), never from the labels the manifests
    carry."""
    items_a, items_b = a.get("items") or {}, b.get("items") or {}
    pinned, unique, same, builds = {}, [], 0, []
    for key in sorted(set(items_a) | set(items_b)):
        left, right = items_a.get(key) or {}, items_b.get(key) or {}
        kind = label_of(key)
        if kind["build"]:
            builds.append({"build": kind["build"], "a": left.get("value"), "b": right.get("value"),
                           "equal": left.get("value") is not None and left.get("value") == right.get("value")})
        if key in items_a and key in items_b and left.get("value") == right.get("value"):
            same += 1
            continue
        if kind["bits"]:
            continue  # a build's own bits: in builds below, never a pinned difference
        row = {"item": key, "a": left.get("value"), "b": right.get("value")}
        if kind["unique"]:
            unique.append({**row, "group": kind["group"]})
        else:
            pinned.setdefault(kind["group"], []).append(row)
    return {"pinned": pinned, "unique": unique, "same": same, "builds": builds, "kernel_debs": kernel_debs(a, b)}


def _show(value) -> str:
    """VALUE in full, as one line of JSON: never shortened (a pipe or a log keeps every kernel argument)."""
    return "(absent)" if value is None else json.dumps(value, sort_keys=True)


def print_diff(result: dict, label_a: str, label_b: str, stream) -> None:
    """The difference for a person: one line per fact, each terminal_safe (an item's name or value from a box never
    moves the cursor, erases a line or writes the clipboard)."""
    def say(line: str) -> None:
        print(terminal_safe(line), file=stream)

    pinned = result["pinned"]
    count = sum(len(rows) for rows in pinned.values())
    verdict = f"{count} pinned item(s) differ" if count else "no pinned item differs"
    say(f"{label_a} vs {label_b}: {verdict}; {result['same']} item(s) equal")
    for build in result.get("builds") or []:
        said = (f"equal, sha256 {build['a']}" if build["equal"]
                else f"{_show(build['a'])} / {_show(build['b'])}")
        say(f"build {build['build']}: {said}")
    for row in result.get("kernel_debs") or []:
        said = f"equal, {row['a']}" if row["equal"] else f"{_show(row['a'])} / {_show(row['b'])}"
        say(f"kernel package {row['package']}: {said}")
    for group in sorted(pinned):
        say(f"[{group}]")
        for row in pinned[group]:
            say(f"  {row['item']}")
            say(f"    {label_a}: {_show(row['a'])}")
            say(f"    {label_b}: {_show(row['b'])}")
    if result["unique"]:
        say(f"host-unique ({len(result['unique'])} item(s), expected to differ):")
        for row in result["unique"]:
            say(f"  {row['item']}: {_show(row['a'])} / {_show(row['b'])}")


def diff_command(a: str, b: str, as_json: bool, stream, inventory: str | None = None) -> int:
    """`provision diff [-i INV] A B`: print the difference; 1 when a pinned item differs, else 0."""
    if inventory is None:
        run_dir = last_manifest_run()
        label_a, manifest_a = resolve_side(a, run_dir)
        label_b, manifest_b = resolve_side(b, run_dir)
    else:
        # deferred: rigbook.run, rigbook.validate cost ~47 ms at start-up (benchmarks/cli_speed.py); diff A B needs none
        from rigbook.run import resolve_inventory
        from rigbook.validate import validate

        inv = validate(resolve_inventory(inventory))
        stored = latest_of_inventory(inv.path)
        label_a, manifest_a = resolve_inventory_side(a, inv, stored, inventory)
        label_b, manifest_b = resolve_inventory_side(b, inv, stored, inventory)
    result = diff(manifest_a, manifest_b)
    code = EXIT_PINNED_DIFFER if result["pinned"] else EXIT_SAME
    if as_json:
        stream.write(json.dumps({"a": label_a, "b": label_b, "exit_code": code, **result}, indent=2) + "\n")
    else:
        print_diff(result, label_a, label_b, stream)
    return code


def manifest_command(opts, stream) -> int:
    """`provision manifest -i INV`: run manifest.yml and say where each host's manifest went."""
    # deferred: rigbook.run costs ~47 ms at start-up (benchmarks/cli_speed.py); `provision diff A B` needs none
    from rigbook.run import run_playbook

    base = runs.runs_dir()
    before = set(base.iterdir()) if base.is_dir() else set()
    code = run_playbook(opts)
    after = set(base.iterdir()) if base.is_dir() else set()
    made = sorted(p for p in after - before if (p / MANIFEST_DIR).is_dir())
    if made:
        stored = sorted(p.stem for p in (made[-1] / MANIFEST_DIR).glob("*.json"))
        print(terminal_safe(f"manifests of {', '.join(stored) or 'no host'}: {made[-1] / MANIFEST_DIR}"), file=stream)
    else:
        print("no manifest was stored (see the run's errors above)", file=stream)
    return code
