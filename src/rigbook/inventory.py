"""Read a YAML inventory (file or directory with group_vars/ and host_vars/) without Ansible.

rigbook validates every host's rigbook_* variables before any host is contacted, and names
the file, group or host where a bad value was written. Ansible's own loader merges the
sources and loses that, so this module keeps each source separately.
"""

from __future__ import annotations

import copy
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from rigbook.errors import UserError

YAML_SUFFIXES = (".yml", ".yaml")
# The order in which Ansible's host_group_vars plugin looks for a group's or host's variables: a folder (or a file
# without a suffix), then .yml, .yaml, .json; it reads the first it finds and nothing else of that name.
ANSIBLE_ORDER = {"": 0, ".yml": 1, ".yaml": 2, ".json": 3}
# Files in an inventory directory that are documentation, not inventory.
IGNORED_SUFFIXES = (".md", ".txt", ".rst", ".retry", ".bak", ".orig", "~", ".pyc", ".cfg")


@dataclass
class VarSource:
    """One place where variables were written: a file, and the group or host they belong to."""

    file: Path
    owner: str  # "group x99_3080", "host rig1"
    variables: dict
    rank: tuple  # sort key: lower ranks are overridden by higher ones


@dataclass
class Inventory:
    path: Path
    hosts: dict = field(default_factory=dict)  # host -> set of groups (including "all")
    children: dict = field(default_factory=dict)  # group -> set of child groups
    sources: list = field(default_factory=list)  # VarSource
    # The run's -e variables (VarSource or None): checked by the schema on the controller; merged into each host
    # by Ansible itself (a --limit run may give one host's values to the whole inventory).
    extra_vars: VarSource | None = None

    def groups_of(self, host: str) -> set:
        return set(self.hosts.get(host, ()))

    def limited(self, limit: str | None) -> list:
        """The hosts a --limit of plain names (hosts or groups, separated by ',' or ':') selects, sorted; every
        host for no limit or one with patterns (wildcards, !, &, ~, ranges: Ansible decides those)."""
        words = [w for w in re.split(r"[,:]", limit or "") if w]
        if not words or any(not re.fullmatch(r"[A-Za-z0-9_.-]+", w) for w in words):
            return sorted(self.hosts)
        return sorted(h for h, groups in self.hosts.items() if h in words or groups & set(words))

    def group_depth(self, group: str) -> int:
        parents = {g: {p for p, kids in self.children.items() if g in kids} for g in self.all_groups()}

        def depth(g, seen=()):
            ps = parents.get(g, set()) - set(seen)
            return 0 if not ps else 1 + max(depth(p, (*seen, g)) for p in ps)

        return depth(group)

    def all_groups(self) -> set:
        groups = set(self.children)
        for kids in self.children.values():
            groups |= kids
        for host_groups in self.hosts.values():
            groups |= host_groups
        return groups

    def host_sources(self, host: str) -> list:
        """The variable sources that apply to HOST, lowest precedence first."""
        groups = self.groups_of(host)
        mine = [
            s
            for s in self.sources
            if (s.owner.startswith("group ") and s.owner[6:] in groups) or s.owner == f"host {host}"
        ]
        return sorted(mine, key=lambda s: s.rank)

    def host_vars(self, host: str) -> dict:
        """Merged variables (top-level keys replaced, as Ansible's default hash_behaviour does)."""
        merged: dict = {}
        for source in self.host_sources(host):
            merged.update(source.variables)
        return merged

    def provenance(self, host: str, key: str):
        """The source that set KEY last for HOST, or None."""
        found = None
        for source in self.host_sources(host):
            if key in source.variables:
                found = source
        return found


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key written twice in one mapping (YAML takes the last one silently) and reads
    Ansible's `!unsafe` tag (_unsafe)."""


def _mapping_without_duplicates(loader, node, deep=False):
    seen = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        try:
            duplicate = key in seen
            seen.add(key)
        except TypeError:  # an unhashable key: construct_mapping names it below
            continue
        if duplicate:
            raise yaml.constructor.ConstructorError(None, None, f"key {key!r} is written twice in one mapping",
                                                    key_node.start_mark)
    return loader.construct_mapping(node, deep=deep)


def _unsafe(loader, node):
    """Ansible's `!unsafe` (a value Ansible never templates: what `provision adopt` writes of what a box said), read
    as ansible-core reads it: the node resolved as if it had no tag (`!unsafe "text"` is the string; `!unsafe "12"`
    is the number 12 there, as ansible-core 2.19 reads it), so validation sees the value Ansible sees."""
    untagged = copy.copy(node)
    untagged.tag = loader.resolve(type(node), node.value, (True, False))
    return loader.construct_object(untagged, deep=True)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping_without_duplicates)
_UniqueKeyLoader.add_constructor("!unsafe", _unsafe)
# A file this large is no inventory; a bound on aliases keeps an alias bomb from running for minutes.
MAX_YAML_BYTES = 4 << 20
MAX_YAML_ALIASES = 1000


MAX_YAML_NODES = 1_000_000


def _expanded_size(value, sizes: dict, open_ids: set) -> int:
    """How many values VALUE holds once every alias is written out (each shared mapping or list counted once per
    use, sized once: SIZES), or -1 when it holds itself (a mapping or list on its own path: OPEN_IDS)."""
    if not isinstance(value, (dict, list)):
        return 1
    key = id(value)
    if key in open_ids:
        return -1
    if key not in sizes:
        open_ids.add(key)
        total = 1
        for item in (value.values() if isinstance(value, dict) else value):
            inner = _expanded_size(item, sizes, open_ids)
            if inner < 0:
                return -1
            total += inner
        open_ids.discard(key)
        sizes[key] = total
    return sizes[key]


def _read_yaml(path: Path):
    try:
        if path.stat().st_size > MAX_YAML_BYTES:
            raise UserError(f"{path}: {path.stat().st_size} bytes: an inventory file is at most {MAX_YAML_BYTES} bytes")
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise UserError(f"{path}: cannot read: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise UserError(f"{path}: not UTF-8 text (byte {exc.start}): an inventory file is YAML text") from None
    return _parse_yaml(text, str(path))


def _parse_yaml(text: str, where: str):
    """TEXT as YAML (safe types only, no key twice, at most MAX_YAML_ALIASES aliases, nothing that contains
    itself); UserError naming WHERE otherwise."""
    try:
        if text.count("*") > MAX_YAML_ALIASES:  # only then count the real aliases (a * in a value is no alias)
            aliases = sum(1 for token in yaml.scan(text) if isinstance(token, yaml.AliasToken))
            if aliases > MAX_YAML_ALIASES:
                raise UserError(f"{where}: {aliases} YAML aliases: an inventory file uses at most {MAX_YAML_ALIASES}")
        data = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
        size = _expanded_size(data, {}, set())
        if size < 0:
            raise UserError(f"{where}: a YAML alias refers to a mapping or list that contains it (the document "
                            "nests without end)")
        if size > MAX_YAML_NODES:  # a few aliases of aliases can stand for billions of values (an alias bomb)
            raise UserError(f"{where}: its aliases expand to {size} values: an inventory file holds at most "
                            f"{MAX_YAML_NODES}")
        return data
    except RecursionError:
        raise UserError(f"{where}: a YAML alias refers to itself (the document nests without end)") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f" line {mark.line + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise UserError(f"{where}:{line}: not valid YAML: {problem}") from None


# The variables given with -e on the command line.
EXTRA_VARS_OWNER = "extra variables"
EXTRA_VARS_FILE = Path("-e (command line)")


def extra_vars_source(items) -> VarSource | None:
    """The -e ITEMS (KEY=VALUE words, @FILE, or a JSON/YAML mapping), merged in order as ansible-playbook does, as
    one VarSource (None when none). UserError, naming the item by its form (never its value: it may be a secret),
    when one cannot be read."""
    merged: dict = {}
    for number, item in enumerate(items, 1):
        what = f"-e number {number}"
        if item.startswith("@"):
            path = Path(item[1:])
            if not path.is_file():
                raise UserError(f"-e {item}: file {path} does not exist")
            data = _mapping(_read_yaml(path), path, "an -e @FILE")
        elif item.lstrip().startswith("{"):
            data = _mapping(_parse_yaml(item, what), Path(what), "an -e mapping")
        else:
            try:
                words = shlex.split(item)
            except ValueError as exc:
                raise UserError(f"{what}: {exc}: expected KEY=VALUE, @FILE or a JSON/YAML mapping") from None
            if not words or any("=" not in word or word.startswith("=") for word in words):
                raise UserError(f"-e {item!r}: expected KEY=VALUE, @FILE or a JSON/YAML mapping")
            data = dict(word.split("=", 1) for word in words)
        merged.update(data)
    return VarSource(EXTRA_VARS_FILE, EXTRA_VARS_OWNER, merged, (10, 0, "")) if items else None


def _mapping(value, path: Path, what: str) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise UserError(f"{path}: {what} must be a mapping, found {type(value).__name__}")
    return value


def _check_host_name(path: Path, group: str, host: str) -> None:
    """A host name becomes a file name under the state directory (baselines/<host>.json, manifests/<host>.json): no
    path separator, no leading dot, no control character."""
    bad = ("/" in host or "\\" in host or host.startswith(".") or not host
           or any(ord(c) < 32 or ord(c) == 127 for c in host))
    if bad:
        raise UserError(f"{path}: group {group}: host name {host!r} cannot be used: rigbook stores files named after "
                        "each host, so a name may not contain / or \\, start with a dot, or hold control characters")


class _Loader:
    def __init__(self, inventory: Inventory):
        self.inv = inventory

    def load_inventory_file(self, path: Path) -> None:
        data = _mapping(_read_yaml(path), path, "the inventory")
        for group, body in data.items():
            self._group(path, str(group), body, parent=None)

    def _group(self, path: Path, group: str, body, parent) -> None:
        body = _mapping(body, path, f"group {group}")
        unknown = set(body) - {"hosts", "vars", "children"}
        if unknown:
            raise UserError(
                f"{path}: group {group}: unknown section {sorted(unknown)[0]!r} "
                "(a YAML inventory group has hosts, vars and children)"
            )
        self.inv.children.setdefault(group, set())
        if parent is not None:
            self.inv.children.setdefault(parent, set()).add(group)
        for host, host_vars in _mapping(body.get("hosts"), path, f"group {group} hosts").items():
            host = str(host)
            _check_host_name(path, group, host)
            self.inv.hosts.setdefault(host, {"all"}).add(group)
            host_vars = _mapping(host_vars, path, f"host {host}")
            if host_vars:
                self.inv.sources.append(VarSource(path, f"host {host}", host_vars, (8, 0, str(path))))
        group_vars = _mapping(body.get("vars"), path, f"group {group} vars")
        if group_vars:
            self.inv.sources.append(VarSource(path, f"group {group}", group_vars, (3, group, str(path))))
        for child, child_body in _mapping(body.get("children"), path, f"group {group} children").items():
            self._group(path, str(child), child_body, parent=group)

    def load_vars_dir(self, base: Path, kind: str) -> None:
        directory = base / f"{kind}_vars"
        if not directory.is_dir():
            return
        ansible_reads = {}  # name -> the one entry Ansible reads of that name (its vars plugin stops at the first)
        for entry in sorted(directory.iterdir(), key=lambda e: (e.name.split(".")[0], ANSIBLE_ORDER.get(
                e.name[len(e.name.split(".")[0]):], 9))):
            name = entry.stem if entry.is_file() else entry.name
            if entry.is_dir() or entry.suffix in YAML_SUFFIXES:
                first = ansible_reads.setdefault(name, entry)
                if first != entry:
                    raise UserError(f"{entry}: Ansible does not read it: of {kind}_vars/{name}, {name}/, {name}.yml, "
                                    f"{name}.yaml and {name}.json it reads the first there, {first.name}; move it "
                                    f"into {kind}_vars/{name}/")
            files = (
                [entry]
                if entry.is_file()
                else sorted(p for p in entry.rglob("*") if p.is_file() and p.suffix in YAML_SUFFIXES)
            )
            for file in files:
                if file.suffix not in YAML_SUFFIXES:
                    continue
                data = _mapping(_read_yaml(file), file, "a vars file")
                owner = f"{kind} {name}"
                rank = (9, 0, str(file)) if kind == "host" else ((4 if name == "all" else 6), name, str(file))
                self.inv.sources.append(VarSource(file, owner, data, rank))


def load(path: Path, extra_vars=()) -> Inventory:
    """Load a YAML inventory file or directory, and the -e items EXTRA_VARS (Inventory.extra_vars). Raises
    UserError on anything unreadable."""
    path = Path(path)
    if not path.exists():
        raise UserError(f"inventory {path} does not exist")
    inv = Inventory(path=path)
    loader = _Loader(inv)
    if path.is_dir():
        for entry in sorted(path.iterdir()):
            if entry.suffix in YAML_SUFFIXES and not entry.name.startswith(".") and not entry.is_file():
                what = "a folder" if entry.is_dir() else "a link that leads nowhere (or in a loop)"
                raise UserError(f"{entry}: {what}, not an inventory file (a YAML file of groups and hosts)")
        files = sorted(
            p
            for p in path.iterdir()
            if p.is_file() and not p.name.startswith(".") and not p.name.endswith(IGNORED_SUFFIXES)
        )
        for file in files:
            if file.suffix not in YAML_SUFFIXES:
                raise UserError(
                    f"{file}: rigbook reads YAML inventories only (.yml/.yaml); "
                    "convert it with `ansible-inventory -i FILE --list -y`"
                )
            loader.load_inventory_file(file)
        base = path
    else:
        if path.suffix not in YAML_SUFFIXES:
            raise UserError(
                f"{path}: rigbook reads YAML inventories only (.yml/.yaml); "
                "convert it with `ansible-inventory -i FILE --list -y`"
            )
        loader.load_inventory_file(path)
        base = path.parent
    loader.load_vars_dir(base, "group")
    loader.load_vars_dir(base, "host")
    # Group depth refines the rank of group sources: children override parents.
    for source in inv.sources:
        if source.owner.startswith("group "):
            level, name, file = source.rank
            source.rank = (level, inv.group_depth(source.owner[6:]), name, file)
        else:
            source.rank = (source.rank[0], 0, "", source.rank[2])
    if not inv.hosts:
        raise UserError(f"inventory {path} defines no hosts")
    inv.extra_vars = extra_vars_source(extra_vars)
    return inv
