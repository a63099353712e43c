"""Validate every host's rigbook_* variables against their schema (meta/host_vars.schema.json), before any host is
contacted.

First the names: every host and group name must be one Ansible's host patterns read as itself (--limit, the rolling
batches, `baseline record --group`): letters, digits, `.`, `_` and `-`, not starting with `.` or `-`, and no host
named like a group (`all` included). A canary named `x,all` would otherwise be the pattern "x and every host".

Then, per host, the checks that need its merged view: combinations of keys, and the serve profiles' traps
(rigbook_serve, judged with the box's GPU count, vendor and rigbook_p2p.expected). A host in groups that say
different GPU vendors (rigbook_gpu.vendor in their group variables, neither group the other's parent), or listed in
the other vendor's gpu_vendor_<vendor> play group of site.yml, is an error naming the host and the groups. A serve
profile with a key on a host whose SGLang pin lacks the patch that keeps keys out of the engine's log is an error too
(serve/profile.key_log_problems). Errors stop the command (exit 2, naming file, host and key path); warnings are
printed on stderr and do not stop it.

Apart from both: the values an inventory's author guessed (rigbook_unconfirmed, key paths of host variables the
owner's write-up or box did not give) are listed as "unconfirmed" with their values until the owner confirms each by
removing it from that list; a key path there that names no value of the host is a warning (a host's own variables
may replace its group's).
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

from rigbook import inventory as inventory_mod
from rigbook import paths
from rigbook.errors import UserError

PREFIX = "rigbook_"
# Both inside the collection (paths.collection_root()), shared with the preflight role's host_model task.
SCHEMA_FILE = "meta/host_vars.schema.json"
# The sglang role's patch that keeps the keys out of SGLang's log (serve/profile.KEY_LOG_PATCH is its file name).
# A host or group name Ansible's host patterns read as itself (ansible.inventory.manager: split_host_pattern splits
# on `,`, on `:` and whitespace; `[` starts a subscript; `*`, `?` and `[` make a wildcard; a leading `~` a regular
# expression, `!` an exclusion, `&` an intersection, `@` a file of names; and a leading `-` is an option to argv).
PATTERN_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*\Z")
PATTERN_MEANING = (
    (",", "a list of patterns (x,all is x and every host)"),
    (":", "a list of patterns (x:all is x and every host)"),
    ("[", "a subscript or range of a group"),
    ("]", "a subscript or range of a group"),
    ("*", "a wildcard"),
    ("?", "a wildcard"),
)
LEADING_MEANING = {"!": "an exclusion", "&": "an intersection", "~": "a regular expression",
                   "@": "a file of host names", "-": "an option to ansible-playbook",
                   ".": "a hidden file's name (rigbook names files after hosts and groups)"}


@dataclass(frozen=True)
class Problem:
    file: Path
    owner: str  # "group x99_3080" / "host rig1"
    key_path: str
    message: str

    def __str__(self) -> str:
        return f"{self.file}: {self.owner}: {self.key_path}: {self.message}"


@dataclass(frozen=True)
class Unconfirmed:
    """A value the inventory's author guessed (rigbook_unconfirmed), not yet confirmed by the owner."""

    file: Path
    host: str
    key_path: str
    value: object
    why: str

    def __str__(self) -> str:
        shown = json.dumps(self.value, default=str, ensure_ascii=False)  # one line: control characters escaped
        shown = shown if len(shown) <= 100 else shown[:97] + "..."
        return f"{self.file}: host {self.host}: {self.key_path} = {shown}" + (f": {self.why}" if self.why else "")


class InventoryInvalid(UserError):
    def __init__(self, problems):
        self.problems = list(problems)
        lines = [str(p) for p in self.problems]
        missing = sum(1 for p in self.problems if p.message.startswith("needed by the "))
        what = (f"inventory is invalid ({len(lines)} problem{'s' if len(lines) != 1 else ''})" if missing < len(lines)
                else f"inventory is not ready: {missing} input{'s' if missing != 1 else ''} the play needs "
                     f"{'are' if missing != 1 else 'is'} missing (nothing was contacted)")
        super().__init__(what + ":\n  " + "\n  ".join(lines))


def _shared():
    """plugins/plugin_utils/host_vars_schema.py of the collection: the schema file and the wording, one copy for the
    CLI and the preflight role's host_model task (which imports it as Ansible does, through the collection
    link)."""
    paths.link_collection()
    # deferred: ansible_collections.rigbook.homelab is importable only after link_collection() (above)
    from ansible_collections.rigbook.homelab.plugins.plugin_utils import host_vars_schema

    return host_vars_schema


def _host_model():
    paths.link_collection()
    # deferred: ansible_collections.rigbook.homelab is importable only after link_collection() (above)
    from ansible_collections.rigbook.homelab.plugins.module_utils import host_model

    return host_model


def host_model_of(inv, host: str) -> dict:
    """The host model of HOST (plugins/module_utils/host_model.build of its merged variables): what the host is,
    decided once for the controller as for the roles."""
    return _host_model().build(inv.host_vars(host))


def playbook_roles(playbook: Path) -> list:
    """The collection's roles PLAYBOOK applies (rigbook.homelab.NAME or NAME), in order. UserError when the file
    is no playbook."""
    try:
        plays = yaml.safe_load(Path(playbook).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise UserError(f"{playbook}: cannot read the playbook: {exc}") from None
    known = _host_model().ROLE_TAGS
    found = []
    for play in plays if isinstance(plays, list) else []:
        for entry in (play.get("roles") or []) if isinstance(play, dict) else []:
            name = entry.get("role", entry.get("name")) if isinstance(entry, dict) else entry
            short = str(name).rsplit(".", 1)[-1]
            if short in known and short not in found:
                found.append(short)
    return found


def _words(tags) -> list:
    return [t.strip() for t in (tags or "").split(",") if t.strip()]


def run_roles(playbook: Path, tags=None, skip_tags=None) -> list:
    """The roles a run of PLAYBOOK with --tags TAGS / --skip-tags SKIP_TAGS (comma lists) applies."""
    chosen = _host_model().roles_for_tags(_words(tags) or ["all"], _words(skip_tags))
    return [role for role in playbook_roles(playbook) if role in chosen]


def schema_file() -> Path:
    return paths.collection_root() / SCHEMA_FILE


def schema() -> dict:
    return _shared().load_schema(str(schema_file()))


def _pattern_meaning(name: str) -> str:
    """What Ansible's host patterns make of NAME, for a name PATTERN_NAME refuses."""
    if name[:1] in LEADING_MEANING:
        return f"a leading {name[0]!r} makes it {LEADING_MEANING[name[0]]}"
    for char, meaning in PATTERN_MEANING:
        if char in name:
            return f"{char!r} makes it {meaning}"
    if any(c.isspace() for c in name):
        return "whitespace separates patterns"
    bad = next((c for c in name if not re.match(r"[A-Za-z0-9_.-]", c)), name[:1])
    return f"{bad!r} is not among the characters rigbook lets into a host pattern"


def _name_problems(inv) -> list:
    """Host and group names Ansible's host patterns would misread (PATTERN_NAME), and hosts named like a group: each
    name reaches --limit (the rolling batches join host names with `,`), where it must select itself only."""
    problems = []
    groups = inv.all_groups()
    allowed = "use letters, digits, '.', '_' and '-', not starting with '.' or '-'"
    for kind, names in (("host", sorted(inv.hosts)), ("group", sorted(groups))):
        for name in names:
            if not PATTERN_NAME.match(name):
                problems.append(Problem(inv.path, f"{kind} {name}", f"{kind} name",
                                        f"{name!r} cannot be a {kind} name: Ansible reads names as host patterns "
                                        f"(--limit, the rolling batches) and {_pattern_meaning(name)}; {allowed}"
                                        + ("; put an address in ansible_host" if kind == "host" else "")))
            elif kind == "host" and name in groups | {"all", "ungrouped"}:
                problems.append(Problem(inv.path, f"host {name}", "host name",
                                        f"{name!r} is also a group name: --limit {name} would select that group's "
                                        "hosts, not this host alone; rename the host"))
    return problems


def _source_problems(source) -> list:
    """The schema's problems of one source. Of the -e source only the host variables the schema defines are checked:
    other rigbook_* names there are the roles' own knobs (rigbook_reboot_timeout, ...), which no inventory file sets."""
    shared = _shared()
    variables = source.variables
    if source.owner == inventory_mod.EXTRA_VARS_OWNER:
        known = set(schema().get("properties") or {})
        variables = {key: value for key, value in variables.items() if key in known}
    try:
        found = shared.schema_problems(variables, str(schema_file()))
    except shared.SchemaUnavailable as exc:
        raise UserError(str(exc)) from None
    return [Problem(source.file, source.owner, key_path, message) for key_path, message in found]


def _file_of(inv, host: str, key: str) -> Path:
    source = inv.provenance(host, key)
    return source.file if source else inv.path


def _readiness(inv, host: str, roles) -> list:
    """The inputs the roles ROLES need on HOST and its inventory lacks, as Problems (file: where rigbook_pins or
    rigbook_serve was set, else the inventory)."""
    model = host_model_of(inv, host)
    base = inv.path if inv.path.is_dir() else inv.path.parent
    problems = []
    for key_path, message in _shared().readiness_problems(model, roles, str(base)):
        variable = key_path.split(".", 1)[0].split("[", 1)[0]
        problems.append(Problem(_file_of(inv, host, variable), f"host {host}", key_path, message))
    return problems


def _host_problems(inv, host: str) -> list:
    """Checks that need the merged view of one host (a combination of keys from several files)."""
    problems = []
    for key, key_path, message in _shared().combination_problems(inv.host_vars(host)):
        problems.append(Problem(_file_of(inv, host, key), f"host {host}", key_path, message))
    reference = inv.host_vars(host).get("rigbook_reference")
    if isinstance(reference, str) and reference:
        # deferred: rigbook.references lists the collection's references/ folder; only a host naming one needs it
        from rigbook import references

        if reference not in references.names():
            problems.append(Problem(_file_of(inv, host, "rigbook_reference"), f"host {host}", "rigbook_reference",
                                    f"{reference!r} is no shipped reference (shipped: "
                                    f"{', '.join(references.names())}; references/ in the collection)"))
    return problems


# site.yml sorts hosts into gpu_vendor_<rigbook_host.vendor> (group_by) and runs each vendor's roles on its group.
VENDOR_GROUP_PREFIX = "gpu_vendor_"


def _descends(inv, group: str, ancestor: str) -> bool:
    """Whether GROUP is ANCESTOR's child, grandchild, ... (its variables override ANCESTOR's, as Ansible means)."""
    seen, todo = set(), [ancestor]
    while todo:
        for kid in inv.children.get(todo.pop(), ()):
            if kid == group:
                return True
            if kid not in seen:
                seen.add(kid)
                todo.append(kid)
    return False


def _vendor_group_problems(inv, host: str) -> list:
    """A host in groups that say different GPU vendors (their group variables set rigbook_gpu.vendor): which value
    wins would be an accident of group names, and with it which vendor's roles run. A child group overriding its
    parent's value is Ansible's rule, not a conflict."""
    claims = {}
    for source in inv.host_sources(host):
        gpu = source.variables.get("rigbook_gpu")
        vendor = gpu.get("vendor") if isinstance(gpu, dict) else None
        if source.owner.startswith("group ") and isinstance(vendor, str):
            claims.setdefault(source.owner[6:], (vendor, source.file))
    conflicting = {group for group, (vendor, _) in claims.items()
                   for other, (said, _) in claims.items()
                   if said != vendor and not _descends(inv, group, other) and not _descends(inv, other, group)}
    problems = []
    if conflicting:
        listed = ", ".join(f"group {group} (vendor {claims[group][0]}, in {claims[group][1]})"
                           for group in sorted(conflicting))
        problems.append(Problem(inv.path, f"host {host}", "rigbook_gpu.vendor",
                                f"host {host} is in groups that say different GPU vendors: {listed}; a host has "
                                "one GPU vendor: list it in the groups of one vendor only"))
    return problems


def _play_group_problems(inv, host: str) -> list:
    """HOST listed in a group gpu_vendor_<vendor> (the group site.yml runs that vendor's roles on) that its own
    rigbook_gpu.vendor contradicts: it would get both vendors' roles. Needs the host model (a schema-valid host)."""
    problems = []
    vendor = host_model_of(inv, host)["vendor"]  # what site.yml's group_by reads (rigbook_host.vendor)
    for group in sorted(g for g in inv.groups_of(host) if g.startswith(VENDOR_GROUP_PREFIX)):
        named = group[len(VENDOR_GROUP_PREFIX):]
        if named != (vendor or "none"):
            source = inv.provenance(host, "rigbook_gpu")
            where = f" (set in {source.owner}, {source.file})" if source and vendor else ""
            problems.append(Problem(inv.path, f"host {host}", "rigbook_gpu.vendor",
                                    f"host {host} is listed in group {group}, the group site.yml runs the {named} "
                                    f"roles on, but its rigbook_gpu.vendor is {vendor or 'not set'}{where}: take it "
                                    f"out of {group} (site.yml puts each host in gpu_vendor_<its vendor> itself)"))
    return problems


UNCONFIRMED = "rigbook_unconfirmed"
KEY_STEP = re.compile(r"\.([^.\[\]]+)|\[([0-9]+)\]")


def lookup(variables: dict, key_path: str) -> tuple:
    """(True, value) of KEY_PATH (name.key[index]...) in VARIABLES, or (False, None) when it names nothing."""
    name = re.match(r"^[^.\[]+", key_path or "")
    if not name or name.group(0) not in variables:
        return False, None
    node, rest = variables[name.group(0)], key_path[name.end():]
    for step in KEY_STEP.finditer(rest):
        key, index = step.group(1), step.group(2)
        if key is not None and isinstance(node, dict) and key in node:
            node = node[key]
        elif index is not None and isinstance(node, list) and int(index) < len(node):
            node = node[int(index)]
        else:
            return False, None
    if "".join(m.group(0) for m in KEY_STEP.finditer(rest)) != rest:
        return False, None
    return True, node


def _unconfirmed_items(merged: dict) -> list:
    """[(key path, why)] of the host's rigbook_unconfirmed (its items: a key path, or {key, why})."""
    items = merged.get(UNCONFIRMED)
    found = []
    for item in items if isinstance(items, list) else []:
        if isinstance(item, dict):
            found.append((str(item.get("key") or ""), " ".join(str(item.get("why") or "").split())))
        else:
            found.append((str(item), ""))
    return found


def unconfirmed(inv) -> tuple:
    """([Unconfirmed], [Problem]): every guessed value each host's rigbook_unconfirmed names, with its value, and a
    Problem (a warning) for an item that names no value of the host: a wrong key path, or a value the host's own
    variables replaced."""
    found, problems = [], []
    for host in sorted(inv.hosts):
        merged = inv.host_vars(host)
        file = _file_of(inv, host, UNCONFIRMED)
        for index, (key_path, why) in enumerate(_unconfirmed_items(merged)):
            there, value = lookup(merged, key_path)
            if there:  # named with the file that sets the value
                variable = re.match(r"^[^.\[]+", key_path).group(0)
                found.append(Unconfirmed(_file_of(inv, host, variable), host, key_path, value, why))
            else:
                problems.append(Problem(file, f"host {host}", f"{UNCONFIRMED}[{index}]",
                                        f"{key_path!r} names no value of this host (a wrong key path, or a value "
                                        "the host's own variables replaced): not listed as unconfirmed"))
    return found, problems


def unconfirmed_text(items) -> str:
    """The listing `provision validate` prints of ITEMS (Unconfirmed), apart from the inputs the play needs."""
    if not items:
        return ""
    return (f"unconfirmed: {len(items)} value{'s' if len(items) != 1 else ''} of the inventory guessed, not the "
            "owner's (rigbook_unconfirmed); check each on the box, correct it if it is wrong, then remove it from "
            "rigbook_unconfirmed:\n  " + "\n  ".join(str(item) for item in items))


def _serve_findings(inv, host: str) -> tuple:
    """(errors, warnings) as Problems: the host's rigbook_serve traps, judged with what its inventory says."""
    shared = _shared()
    try:
        errors, warnings = shared.serve_findings(inv.host_vars(host))
    except shared.SchemaUnavailable as exc:
        raise UserError(str(exc)) from None
    file = _file_of(inv, host, "rigbook_serve")
    return ([Problem(file, f"host {host}", key_path, message) for key_path, message in errors],
            [Problem(file, f"host {host}", key_path, message) for key_path, message in warnings])


def check(inventory_path: Path, roles=None, extra_vars=(), limit=None) -> tuple:
    """(Inventory, problems, warnings): the schema per file; when it passes, each host's combinations and serve
    profiles, and, for the roles ROLES of a play (None: no play), every input they need and the inventory lacks.
    EXTRA_VARS, a run's -e items: the host variables among them meet the same schema. LIMIT: the run's --limit;
    the roles' inputs are needed on the hosts it selects only (Inventory.limited).
    Raises UserError when the inventory or an -e item cannot be read."""
    inv = inventory_mod.load(inventory_path, extra_vars)
    problems, warnings = _name_problems(inv), []
    for source in inv.sources + ([inv.extra_vars] if inv.extra_vars else []):
        problems.extend(_source_problems(source))
    for host in sorted(inv.hosts):
        problems.extend(_vendor_group_problems(inv, host))
    if not problems:
        for host in sorted(inv.hosts):
            problems.extend(_host_problems(inv, host))
            problems.extend(_play_group_problems(inv, host))
            serve_errors, serve_warnings = _serve_findings(inv, host)
            problems.extend(serve_errors)
            warnings.extend(serve_warnings)
    if not problems and roles is not None:
        for host in inv.limited(limit):
            problems.extend(_readiness(inv, host, roles))
    return inv, problems, warnings


def validate(inventory_path: Path, warn=None, roles=None, extra_vars=(), limit=None):
    """Load and validate; returns the Inventory or raises InventoryInvalid / UserError (exit 2). ROLES: the roles
    of the play about to run, whose missing inputs are problems too (None: the variables only). Warnings, then the
    unconfirmed guesses (unconfirmed_text), are printed on WARN (default stderr, so a --json stdout stays JSON) and
    do not stop anything."""
    inv, problems, warnings = check(inventory_path, roles, extra_vars, limit)
    stream = warn if warn is not None else sys.stderr
    for warning in warnings:
        print(f"warning: {warning}", file=stream, flush=True)
    guessed, stale = unconfirmed(inv)
    for warning in stale:
        print(f"warning: {warning}", file=stream, flush=True)
    listing = unconfirmed_text(guessed)
    if listing:
        print(listing, file=stream, flush=True)
    if problems:
        raise InventoryInvalid(problems)
    return inv
