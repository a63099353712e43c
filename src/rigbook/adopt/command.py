"""`provision adopt HOST -i INV`: read the host with playbooks/adopt.yml over SSH (the adopt_facts module: read-only,
changes nothing), turn what it stored into rigbook_* variables (rigbook.adopt.mapping), write them (rigbook.adopt.emit)
as the inventory's host_vars/HOST.yml (group_vars/GROUP/adopted.yml with --group, or -o FILE) with the files beside
them, all or none, then check the inventory with them (the readiness check site.yml makes)."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

from rigbook import inventory as inventory_mod
from rigbook import runs, statefile
from rigbook.adopt.emit import render
from rigbook.adopt.mapping import adopt_of
from rigbook.errors import UserError
from rigbook.paths import facts, name_file
from rigbook.run import RunOptions, resolve_inventory, resolve_playbook, run_playbook
from rigbook.validate import InventoryInvalid, run_roles, validate

PLAYBOOK = "adopt.yml"
FACTS_DIR = "adopted"


def output_path(inventory_dir, host: str, group: str | None, given: str | None):
    """Where adopt writes: -o FILE, else the inventory's host_vars/HOST.yml (group_vars/GROUP.yml with --group)."""
    if given:
        out = Path(given)
        inv = Path(inventory_dir)
        if inv.is_dir() and out.parent.resolve() == inv.resolve():
            raise UserError(f"-o {given}: Ansible reads every file at the top of {inventory_dir} as an inventory of "
                            "its own; write it elsewhere (host_vars/ or group_vars/ of the inventory, or outside it)")
        return out
    folder = Path(inventory_dir) / ("group_vars" if group else "host_vars")
    if group and (_group_file(folder, group) or (folder / name_file(group, "")).is_dir()):
        # the group has variables of its own (its rig, GPUs, P2P): adopt's file goes in the group's folder, beside
        # them (group_file_to_folder moves a GROUP.yml in: Ansible reads a group's folder or its file, not both)
        return folder / name_file(group, "") / "adopted.yml"
    return folder / name_file(group or host, ".yml")


def _group_file(folder, group: str):
    """The group's own vars file (group_vars/GROUP.yml or .yaml), or None."""
    found = [folder / name_file(group, suffix) for suffix in (".yml", ".yaml")]
    return next((p for p in found if p.is_file()), None)


def group_file_to_folder(target):
    """Before adopt writes group_vars/GROUP/adopted.yml: move group_vars/GROUP.yml (or .yaml) into that folder,
    content unchanged, as Ansible reads a group's folder or its file, never both. The path moved to, or None."""
    if target.name != "adopted.yml":
        return None
    own = _group_file(target.parent.parent, target.parent.name)
    if own is None:
        return None
    target.parent.mkdir(exist_ok=True)
    moved = target.parent / own.name
    if moved.exists():
        raise UserError(f"adopt --group: {moved} exists beside {own}; merge them by hand (nothing was written)")
    own.rename(moved)
    return moved


def _group_of(inv, host: str, path) -> str:
    """The group `adopt --group` writes for HOST: its most specific group (the deepest), e.g. x99_3080 under lab."""
    groups = [g for g in inv.groups_of(host) if g not in ("all", "ungrouped")]
    if not groups:
        raise UserError(f"adopt --group: {host} is in no group of {path}")
    deepest = max(inv.group_depth(g) for g in groups)
    chosen = sorted(g for g in groups if inv.group_depth(g) == deepest)
    if len(chosen) > 1:
        raise UserError(f"adopt --group: {host} is in {', '.join(chosen)} alike; name the file with -o "
                        f"(e.g. -o group_vars/{chosen[0]}.yml)")
    return chosen[0]


def _already_set(inv, group: str, keys) -> list:
    """The adopted KEYS that GROUP's own files set already (a second file of the group would fight them)."""
    return sorted({key for source in inv.sources if source.owner == f"group {group}" for key in source.variables
                   if key in keys})


def _shown(text) -> str:
    """TEXT (it may quote what the box said) on one terminal line: control characters, escape sequences' ESC too,
    removed (facts/text.bounded), line breaks and tabs made spaces."""
    return facts("text").bounded(str(text), None).replace("\n", " ").replace("\t", " ")


def write_together(files: dict) -> None:
    """Write every {path: text} of FILES or none (the folders made): facts/files.write_many stages each beside its
    target, then renames them all into place; a failure before the renames leaves no file changed."""
    facts("files").write_many([(str(path), text) for path, text in files.items()], mode=0o644, make_parents=True)


ADOPTED_LAST = "~~adopted-by-rigbook.yml"  # sorts after every other file of a vars folder: its values win


def _link_tree(source: Path, dest: Path, moved: dict) -> None:
    """DEST made a folder of links to every file under SOURCE (same relative paths), each link noted in MOVED
    {link: the file it stands for}."""
    for top, _dirs, names in os.walk(source):
        folder = dest / Path(top).relative_to(source)
        folder.mkdir(parents=True, exist_ok=True)
        for name in names:
            (folder / name).symlink_to(Path(top, name).absolute())
            moved[folder / name] = Path(top, name)


@contextmanager
def inventory_with(path: Path, target: Path, kind: str, name: str):
    """(inventory path, {path there: the path it stands for}) of PATH read with TARGET's values as KIND ("host" or
    "group") variables of NAME, as Ansible would read them from KIND_vars/NAME beside the inventory: PATH itself when
    it reads TARGET already, else a folder of links to PATH's files where KIND_vars/NAME/ also holds TARGET, read
    last (its keys replace the same keys of NAME's own files). Removed on leaving."""
    if any(Path(s.file).resolve() == target.resolve() and s.owner == f"{kind} {name}"
           for s in inventory_mod.load(path).sources):
        yield path, {}
        return
    base = path if path.is_dir() else path.parent
    with tempfile.TemporaryDirectory(prefix="rigbook-adopt-check-") as scratch:
        top, moved = Path(scratch) / "inventory", {}
        top.mkdir()
        moved[top] = base
        for entry in base.iterdir():
            if entry.name != f"{kind}_vars":
                (top / entry.name).symlink_to(entry.absolute())
                moved[top / entry.name] = entry
        folder = top / f"{kind}_vars"
        folder.mkdir()
        own = name_file(name, "")
        original = base / f"{kind}_vars"
        for entry in sorted(original.iterdir()) if original.is_dir() else []:
            if entry.name == own and entry.is_dir():
                _link_tree(entry, folder / own, moved)
            elif entry.name in (own + ".yml", own + ".yaml"):
                (folder / own).mkdir(exist_ok=True)
                (folder / own / entry.name).symlink_to(entry.absolute())
                moved[folder / own / entry.name] = entry
            else:
                (folder / entry.name).symlink_to(entry.absolute())
                moved[folder / entry.name] = entry
        (folder / own).mkdir(exist_ok=True)
        (folder / own / ADOPTED_LAST).symlink_to(target.absolute())
        moved[folder / own / ADOPTED_LAST] = target
        yield (top if path.is_dir() else top / path.name), moved


def _as_given(err: InventoryInvalid, moved: dict) -> InventoryInvalid:
    """ERR with each problem's file named as the user knows it (MOVED: inventory_with's links)."""
    def real(file):
        file = Path(file)
        if file in moved:
            return moved[file]
        for link, original in sorted(moved.items(), key=lambda item: -len(str(item[0]))):
            if link in file.parents:
                return original / file.relative_to(link)
        return file
    return InventoryInvalid([dataclasses.replace(p, file=real(p.file)) for p in err.problems])


def check_written(path: Path, inventory: str, target: Path, host: str, group: str | None, stream) -> int:
    """The readiness check site.yml makes before contacting the host, of the inventory PATH (-i INVENTORY) with what
    adopt wrote (TARGET; with -o outside the folders Ansible reads, read as HOST's host_vars, or GROUP's group_vars
    with --group): 0 ready, 1 with what is still missing named."""
    kind, name = ("group", group) if group else ("host", host)
    warnings = io.StringIO()
    with inventory_with(path, target, kind, name) as (checked, moved):
        try:
            validate(checked, warn=warnings, roles=run_roles(resolve_playbook("site.yml")), limit=host)
            err = None
        except InventoryInvalid as exc:
            err = _as_given(exc, moved)
    for line in warnings.getvalue().splitlines():
        for link, original in sorted(moved.items(), key=lambda item: -len(str(item[0]))):
            line = line.replace(str(link), str(original))
        print(line, file=sys.stderr)
    written = f"{target} (read as {kind}_vars of {name})" if moved else target.name
    if err is not None:
        print(f"adopt: the inventory with {written} does not validate yet:\n{err}", file=sys.stderr)
        return 1
    where = f"{path if path.is_dir() else path.parent}/{kind}_vars/{name_file(name, '')}/"
    print(f"adopt: {path} validates with {written}; next: "
          + (f"copy {target} into {where}, then " if moved else "")
          + f"provision site.yml -i {inventory} --limit {host} --check --diff", file=stream)
    return 0


def adopt_command(host: str, inventory: str, output: str | None = None, group: bool = False, force: bool = False,
                  debs_dir: str | None = None, wheels_dir: str | None = None, stream=None) -> int:
    """`provision adopt HOST -i INV`: read HOST (adopt.yml, read-only), write its pins and serve profiles, then
    check the inventory with them. Exit 0 written and valid, 1 written but the check names problems, 2 bad input
    (nothing written), 3 the host could not be reached (nothing written)."""
    stream = stream or sys.stdout
    path = resolve_inventory(inventory)
    inv = validate(path)
    if host not in inv.hosts:
        raise UserError(f"adopt: {host!r} is not a host of {path} (hosts: {', '.join(sorted(inv.hosts)) or 'none'})")
    chosen_group = _group_of(inv, host, path) if group else None
    if chosen_group and not output and _already_set(inv, chosen_group, ("rigbook_pins", "rigbook_serve")):
        raise UserError(f"adopt --group: group {chosen_group} sets "
                        f"{', '.join(_already_set(inv, chosen_group, ('rigbook_pins', 'rigbook_serve')))} already; "
                        "remove it there or write elsewhere with -o (nothing was read or written)")
    inventory_dir = path if path.is_dir() else path.parent
    target = output_path(inventory_dir, host, chosen_group, output)
    if target.exists() and not force:
        raise UserError(f"adopt: {target} exists; --force replaces it (nothing was read or written)")
    wheels_dirs = [wheels_dir] if isinstance(wheels_dir, str) else list(wheels_dir or [])
    for option, folder in [("--debs-dir", debs_dir)] + [("--wheels-dir", w) for w in wheels_dirs]:
        if folder is not None and (not folder.startswith("/") or "\n" in folder):
            raise UserError(f"adopt {option}: an absolute folder on the host, not {folder!r}")
    if output and not target.parent.is_dir():
        raise UserError(f"adopt: the folder {target.parent} does not exist")
    base = runs.runs_dir()
    before = set(base.iterdir()) if base.is_dir() else set()
    extra = [json.dumps({name: value}) for name, value in (("rigbook_adopt_debs_dir", debs_dir),
                                                            ("rigbook_adopt_wheels_dir", wheels_dirs)) if value]
    code = run_playbook(RunOptions(playbook=PLAYBOOK, inventory=inventory, limit=host, extra_vars=extra,
                                   baseline_mode="off"))
    if code != 0:
        print(f"adopt: {host} was not read (exit {code}); nothing was written", file=sys.stderr)
        return code
    after = set(base.iterdir()) if base.is_dir() else set()
    made = sorted(p for p in after - before if (p / FACTS_DIR / f"{host}.json").is_file())
    if not made:
        print(f"adopt: the run stored nothing for {host}; nothing was written", file=sys.stderr)
        return 1
    facts, problem = statefile.read_json(made[-1] / FACTS_DIR / f"{host}.json")
    if problem or not isinstance(facts, dict):
        print(f"adopt: what the run stored for {host} is unreadable ({problem}); nothing was written", file=sys.stderr)
        return 1
    variables, comments, unpinned, notes, files = adopt_of(facts, host, inventory_dir, ", ".join(wheels_dirs))
    text = render(host, variables, comments, unpinned, notes)
    beside = {inventory_dir / rel: content for rel, content in files.items()}
    taken = [str(p) for p in beside if p.exists() and not force]
    if taken:
        raise UserError(f"adopt: {', '.join(taken)} exists; --force replaces it (nothing was written)")
    target.parent.mkdir(exist_ok=True)  # the inventory's host_vars/ or group_vars/ (-o: checked above)
    moved = group_file_to_folder(target) if not output else None
    try:
        write_together({target: text, **beside})
    except BaseException:
        if moved is not None:  # nothing half: the group's file back where it was
            moved.rename(target.parent.parent / moved.name)
        raise
    if moved is not None:
        print(f"adopt: moved the group's own variables into {moved} (Ansible reads a group's folder or its file, "
              "not both)", file=stream)
    print(f"adopt: {host}: wrote {target}" + "".join(f", {p}" for p in beside), file=stream)
    for text in notes:
        print(f"  note: {_shown(text)}", file=stream)
    for text in unpinned:
        print(f"  not pinned: {_shown(text)}", file=stream)
    # the readiness check site.yml makes before contacting the host: every input its roles need, with what was written
    return check_written(Path(path), inventory, target, host, chosen_group, stream)
