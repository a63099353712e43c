"""Baselines: the figures of a known-good run per host, and the history of every run after it.

Stored as one JSON file per host under <state>/baselines/. `provision baseline record` writes
the baseline from a full ladder run; every later run that measures figures is compared with it
by the ladder modules (extra variable rigbook_baselines) and appended to the history.

Per inventory: a file keeps one section per inventory ("inventories": {KEY: {"inventory": PATH, "recorded",
"history"}}, KEY being paths.inventory_key of the inventory's resolved path), and a run reads and writes only its own
inventory's section, so two inventories that name a host alike (a copy of an inventory with one pin changed) never
judge each other's runs or mix their histories. A file written before baselines were kept per inventory holds its
baseline and history at the top level ("recorded", "history"), of no inventory said: each of them belongs to the
inventory its run's record names (the run folder's run.json under <state>/runs, found by the folder's name;
runs.inventory_key_of). So the old baseline keeps judging the runs of the inventory it was recorded with, while that
inventory has none of its own in its section, and judges no other inventory's; with its run's record gone it is
"inventory unknown": `provision baseline show` lists it so and no run is judged by it (record again). A file keeps
at most INVENTORY_LIMIT sections: the one written longest ago goes first, named on stderr.

Group baselines (<state>/baselines/groups/<group>.json, a section per inventory the same way): `provision baseline
record --group` also records the figures of the first box (in inventory order) of each of its groups, so a twin
built later is held to them. The
rule: a host with a baseline of its own is judged against it; a host without one is judged against the group
baseline of the first of its groups, in inventory order (the order the groups first appear in the inventory file),
that has one. A host's groups are those that list it under `hosts:`; parent groups (`lab`, which holds both an
NVIDIA and an AMD box) and `all` / `ungrouped` never lend a baseline. Every run says which baseline judged each
host: "host NAME", "group NAME" or "none", and of which inventory (judged_text).

Faults: every read-modify-write of a file holds its fcntl lock (statefile.locked) and writes a unique temporary file
then os.replace (statefile.write_json_atomic), so concurrent writers lose no history entry. A corrupt file (not
JSON, not the expected shape) is never overwritten: the run that finds it keeps it aside as
NAME.json.corrupt-<UTC time> (an earlier kept copy is never replaced), names it, and stops with exit 2 before any
host is contacted (preflight), so no host is judged against "none" without a word; the next run finds no file and
goes on without that baseline. `provision baseline show` only names a corrupt file (exit 2), it moves nothing.

Figures are data, never code: a figure is a finite number (an int or a float, not a bool, NaN or an infinity) under a
name of FIGURE_NAME (figures_of decides it, for every figure recorded and every figure read). Anything else a
ladder result or a baselines file holds in a figure's place is left out, with a warning naming it, so no string a
box or a hand-edited file put there reaches the next run, where `-e @baselines.json` hands the baseline to Ansible,
which would template it. extra_vars hands Ansible only such figures and strings each matched whole by a strict
pattern (the time, the "host NAME" / "group NAME" label).
"""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

from rigbook import runs, statefile
from rigbook.errors import UserError
from rigbook.paths import facts, inventory_key, link_collection, name_file, name_of_file, state_dir

HISTORY_LIMIT = 200
INVENTORY_LIMIT = 32  # inventory sections per file
INVENTORY_KEY = runs.INVENTORY_KEY
# A figure's name: what the judges name their metrics (peer_gbs_0_1, serve_PROFILE_ttft_s: a serve profile's name
# may hold "-"), nothing that can start a template ({{ {% {#), a quote or a control character.
FIGURE_NAME = re.compile(r"[a-z0-9_-]{1,64}\Z")
# The strings extra_vars hands Ansible: the recording time (time.strftime below) and the label of the baseline.
RECORDED_AT = re.compile(r"\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}\Z")
PLAIN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,254}\Z")
LABEL = re.compile(r"(?:host|group|reference) [A-Za-z0-9][A-Za-z0-9_.:-]{0,254}\Z")
_warned: set = set()  # (where, name) already said in this process: a file read several times is named once


def _dir() -> Path:
    return state_dir() / "baselines"


def _file(host: str) -> Path:
    return _dir() / name_file(host)


class CorruptBaseline(UserError):
    """One or more baselines files were corrupt: each is kept aside (moved, never overwritten) and named."""

    def __init__(self, found: list):
        self.found = found  # [(path, problem, kept copy)]
        files = "; ".join(f"baselines file {path} is corrupt ({problem}): kept aside as {kept}"
                          for path, problem, kept in found)
        super().__init__(f"{files}. Stopped before contacting any host, so no host is judged without its baseline: "
                         "run again to go on without it (or move a good copy back in place first)")


def _mapping_problem(value, what: str) -> str | None:
    return None if value is None or isinstance(value, dict) else f"{what} is not an object but {type(value).__name__}"


def _problem(data) -> str | None:
    """What is wrong with the shape of a baselines file's DATA (a host's or a group's), or None: the one place that
    decides it, so every reader (show, the runs, the report) can use what it reads as it is."""
    if not isinstance(data, dict):
        return f"not a JSON object but {type(data).__name__}"
    problem = _section_problem(data, "its")
    sections = data.get("inventories")
    if problem or sections is None:
        return problem
    if not isinstance(sections, dict):
        return f"its inventories is not an object but {type(sections).__name__}"
    for key, section in sections.items():
        what = f"inventory section {str(key)[:40]!r}"
        if not INVENTORY_KEY.fullmatch(key):
            return f"{what}: not an inventory key (16 of 0-9 a-f)"
        if not isinstance(section, dict):
            return f"{what} is not an object but {type(section).__name__}"
        if not isinstance(section.get("inventory", ""), str):
            return f"{what}: inventory is not a string but {type(section['inventory']).__name__}"
        problem = _section_problem(section, f"{what}:")
        if problem:
            return problem
    return None


def _section_problem(data: dict, whose: str) -> str | None:
    """What is wrong with the recorded baseline and the history of DATA (a file's top level, or one inventory's
    section of it; WHOSE starts the problem's text), or None."""
    history, recorded = data.get("history", []), data.get("recorded")
    if not isinstance(history, list) or not all(isinstance(entry, dict) for entry in history):
        return f"{whose} history is not a list of objects"
    if recorded is not None and not (isinstance(recorded, dict) and isinstance(recorded.get("metrics", {}), dict)):
        return f"{whose} recorded baseline is not an object with metrics"
    if recorded is not None:
        problem = _mapping_problem(recorded.get("versions"), f"{whose} recorded baseline's versions")
        if problem:
            return problem
        if recorded.get("run_dir") is not None and not isinstance(recorded["run_dir"], str):
            return f"{whose} recorded baseline's run_dir is not a string but {type(recorded['run_dir']).__name__}"
    section = "" if whose == "its" else f"{whose} "
    for number, entry in enumerate(history, 1):
        for key in ("metrics", "versions", "statuses"):
            problem = _mapping_problem(entry.get(key), f"{section}history entry {number}: {key}")
            if problem:
                return problem
        if entry.get("run_dir") is not None and not isinstance(entry["run_dir"], str):
            return f"{section}history entry {number}: run_dir is not a string but {type(entry['run_dir']).__name__}"
    return None


def _is_figure(value) -> bool:
    """An int or a float (never text, a bool or None) that is finite (facts/text.finite: NaN, infinities and an int
    too large for a float are not)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and facts("text").finite(value) is not None


def _why_not(name, value) -> str:
    if not isinstance(name, str) or not FIGURE_NAME.match(name):
        return "its name is not 1-64 of a-z 0-9 _ -"
    return f"not a finite number but {type(value).__name__}" if not _is_figure(value) else ""


def _warn_dropped(where: str, name, why: str, once: bool) -> None:
    """One warning line on stderr for a figure left out (ONCE: only the first time in this process), terminal-safe."""
    if once and (where, str(name)) in _warned:
        return
    _warned.add((where, str(name)))
    # deferred: rigbook.display (rich) costs ~25 ms at start-up (benchmarks/cli_speed.py); `provision validate`
    # imports this module and only a figure left out needs it
    from rigbook.display import terminal_safe

    print(terminal_safe(f"warning: {where}: figure {str(name)[:80]!r} left out ({why}): a figure is a finite number "
                        "under a name of a-z 0-9 _ -"), file=sys.stderr)


def figures_of(metrics, where: str, once: bool = True) -> dict:
    """The figures of METRICS (a mapping): each finite number under a FIGURE_NAME name; anything else left out with
    a warning naming WHERE it was read and the figure (ONCE: a file read several times by one command is named
    once). None (a figure not measured) is left out without a word."""
    kept = {}
    for name, value in (metrics.items() if isinstance(metrics, dict) else ()):
        if value is None:
            continue
        why = _why_not(name, value)
        if why:
            _warn_dropped(where, name, why, once)
        else:
            kept[name] = value
    return kept


def _clean(data: dict, path: Path) -> dict:
    """DATA (a sound file's) with only figures in its recorded baselines' and its histories' metrics (the top level's
    and each inventory section's)."""
    where = f"baselines file {path}"
    data = _clean_section(data, where)
    if data.get("inventories"):
        data["inventories"] = {key: _clean_section(section, where) for key, section in data["inventories"].items()}
    return data


def _clean_section(data: dict, where: str) -> dict:
    data = dict(data)
    recorded = data.get("recorded")
    if isinstance(recorded, dict) and "metrics" in recorded:
        data["recorded"] = {**recorded, "metrics": figures_of(recorded["metrics"], where)}
    if "history" in data:
        data["history"] = [{**entry, "metrics": figures_of(entry["metrics"], where)} if "metrics" in entry else entry
                           for entry in data["history"]]
    return data


def _read(path: Path) -> tuple:
    """(data, None) for a sound file, (None, None) for a missing one, (None, problem) for a corrupt one; a sound
    file's data holds only figures (figures_of: anything else left out and named on stderr). Touches nothing:
    `provision baseline show` uses it as it is."""
    try:
        data, problem = statefile.read_json(path)
    except FileNotFoundError:
        return None, None
    except OSError as exc:
        raise UserError(f"baselines file {path}: cannot read: {exc.strerror}") from None
    problem = problem or _problem(data)
    return (None, problem) if problem else (_clean(data, path), None)


def _load_held(path: Path, empty: dict) -> dict:
    """PATH's data (EMPTY when missing); the caller holds statefile.locked(PATH). A corrupt file is kept aside and
    CorruptBaseline raised."""
    data, problem = _read(path)
    if problem:
        raise CorruptBaseline([(path, problem, statefile.keep_aside(path))])
    return data if data is not None else empty


def _load(path: Path, empty: dict) -> dict:
    data, problem = _read(path)
    if not problem:
        return data if data is not None else empty
    with statefile.locked(path):  # to keep it aside: read again under the lock (a writer may have replaced it)
        return _load_held(path, empty)


def scope_of(inv) -> tuple | None:
    """(key, path) of the inventory INV (rigbook.inventory.Inventory) whose section a run reads and writes: its
    paths.inventory_key and its resolved path as text; None without an inventory (nothing is read or written)."""
    if inv is None:
        return None
    key = inventory_key(inv.path)
    return (key, str(Path(inv.path).resolve())) if key else None


def run_inventory(run_dir) -> tuple | None:
    """(key, path) of the inventory the run RUN_DIR names (a run folder's path as a baselines file holds it) ran
    against, from its run record under <state>/runs, found by the folder's name alone (a path in a file never leads
    elsewhere); None when the record is gone or unusable or names no inventory. For the files written before
    baselines were kept per inventory; a run record never changes its inventory, so each is read once per process."""
    name = Path(run_dir).name if isinstance(run_dir, str) and "\0" not in run_dir else ""
    if name in ("", ".", ".."):
        return None
    folder = runs.runs_dir() / name
    if str(folder) not in _run_inventories:
        try:
            record = runs.read_record(folder)
        except runs.BadRecord:
            record = None
        key = runs.inventory_key_of(record) if record else None
        if not key:
            return None  # not kept: a run folder whose record is not written yet may have one later
        _run_inventories[str(folder)] = (key, str(record.get("inventory")))
    return _run_inventories[str(folder)]


_run_inventories: dict = {}  # run folder -> run_inventory's answer


def _view(data: dict, scope, whose: dict) -> dict:
    """What of DATA (a sound host or group file's) belongs to the inventory SCOPE (scope_of): WHOSE ({"host": NAME}
    or {"group": NAME}) with "inventory" (its path), "recorded" (the section's baseline; else one recorded before
    baselines were kept per inventory, by a run of this inventory: marked "legacy") and "history" (the entries
    recorded before that by runs of this inventory, oldest first, then the section's)."""
    if scope is None:
        return {**whose, "inventory": None, "recorded": None, "history": []}
    key, path = scope
    section = (data.get("inventories") or {}).get(key) or {}
    recorded, old = section.get("recorded"), data.get("recorded")
    if not _usable(recorded) and _usable(old) and (run_inventory(old.get("run_dir")) or (None,))[0] == key:
        recorded = {**old, "legacy": True}
    history = [entry for entry in data.get("history") or []
               if (run_inventory(entry.get("run_dir")) or (None,))[0] == key]
    return {**whose, "inventory": section.get("inventory") or path, "recorded": recorded,
            "history": history + list(section.get("history") or [])}


def load(host: str, inv) -> dict:
    """HOST's baseline and history for the inventory INV (_view: {"host", "inventory", "recorded", "history"});
    CorruptBaseline (exit 2) when the file is corrupt, after keeping it aside: the next load finds no file."""
    return _view(_load(_file(host), {"host": host}), scope_of(inv), {"host": host})


def _salvage(path: Path, empty: dict) -> dict:
    """For writes after the hosts ran: PATH's data, or (corrupt: kept aside, a warning on stderr) EMPTY. Holding
    statefile.locked(PATH)."""
    try:
        return _load_held(path, empty)
    except CorruptBaseline as exc:
        for where, problem, kept in exc.found:
            print(f"warning: baselines file {where} is corrupt ({problem}): kept aside as {kept}; "
                  "a new file starts with this run", file=sys.stderr)
        return empty


def preflight(hosts, inv=None) -> None:
    """Before any host is contacted: read every baselines file a run over HOSTS reads or writes (each host's own,
    and those of its groups); keep each corrupt one aside and raise one CorruptBaseline naming them all."""
    found = []
    paths = {_file(host): {"host": host} for host in hosts}
    for host in hosts:
        for group in host_groups(inv, host):
            paths.setdefault(_group_file(group), {"group": group})
    for path, empty in paths.items():
        try:
            _load(path, empty)
        except CorruptBaseline as exc:
            found += exc.found
    if found:
        raise CorruptBaseline(found)


def metrics_of(ladder: list, host: str = "") -> dict:
    """The figures a run's LADDER (HOST's, from the ladder module's results) measured: figures_of each layer's
    metrics, so what a box put in a figure's place is left out (and named), never recorded."""
    metrics = {}
    for verdict in ladder:
        where = f"{host or 'a host'}'s {verdict.get('layer')!s:.64} layer"
        metrics.update(figures_of(verdict.get("metrics"), where, once=False))
    return metrics


def versions_of(ladder: list) -> dict:
    """Kernel, driver/ROCm, NCCL and SGLang versions the figures were measured on (from the ladder's own readings;
    the serving layer's measured values are per serve profile)."""
    by_layer = {v.get("layer"): v.get("measured") or {} for v in ladder}
    out = {}
    for layer, key, name in (("kernel_state", "release", "kernel"), ("driver_state", "module", "nvidia_driver"),
                             ("driver_state", "rocm", "rocm"), ("nccl_transport", "nccl_version", "nccl")):
        value = by_layer.get(layer, {}).get(key) if isinstance(by_layer.get(layer), dict) else None
        if value:
            out[name] = value
    serving = by_layer.get("serving")
    engines = sorted({m.get("version") for m in serving.values() if isinstance(m, dict) and m.get("version")}
                     if isinstance(serving, dict) else [])
    if engines:
        out["sglang"] = ", ".join(engines)
    return out


NO_GROUP_BASELINE = ("all", "ungrouped")


def _group_file(group: str) -> Path:
    return _dir() / "groups" / name_file(group)


def load_group(group: str, inv) -> dict:
    """GROUP's baseline for the inventory INV (_view: {"group", "inventory", "recorded"}); CorruptBaseline (exit 2)
    when the file is corrupt, after keeping it aside."""
    view = _view(_load(_group_file(group), {"group": group}), scope_of(inv), {"group": group})
    view.pop("history")
    return view


def _save_section(path: Path, whose: dict, scope: tuple, change) -> None:
    """One locked read-modify-write of PATH (a host's or a group's file; WHOSE: {"host": NAME} or {"group": NAME}):
    CHANGE(section) edits the section of the inventory SCOPE (scope_of), made the newest; the rest of the file (the
    other inventories' sections, what was recorded before baselines were kept per inventory) is kept as it is, but
    for the sections beyond INVENTORY_LIMIT, written longest ago, which go (named on stderr). A corrupt file is
    kept aside, never overwritten."""
    key, inventory = scope
    with statefile.locked(path):
        data = _salvage(path, dict(whose))
        sections = dict(data.get("inventories") or {})
        section = dict(sections.pop(key, None) or {})
        section["inventory"] = inventory
        change(section)
        sections[key] = section  # last: the newest
        while len(sections) > INVENTORY_LIMIT:
            gone = next(iter(sections))
            print(f"warning: baselines file {path}: the baseline and history of inventory "
                  f"{sections.pop(gone).get('inventory') or gone} left out (a file keeps the {INVENTORY_LIMIT} "
                  "inventories written last)", file=sys.stderr)
        data["inventories"] = sections
        statefile.write_json_atomic(path, data)


def host_groups(inv, host: str) -> list:
    """The groups that list HOST under hosts:, in inventory order (all / ungrouped left out)."""
    if inv is None:
        return []
    mine = inv.groups_of(host)
    ordered = [g for g in inv.children if g in mine]
    ordered += sorted(mine - set(ordered))
    return [g for g in ordered if g not in NO_GROUP_BASELINE]


def inventory_order(inv, hosts) -> list:
    """HOSTS in the order the inventory names them (unknown ones last, by name)."""
    known = list(inv.hosts) if inv is not None else []
    return sorted(hosts, key=lambda h: (known.index(h) if h in known else len(known), h))


def _usable(recorded) -> bool:
    return bool(recorded and recorded.get("metrics"))


def _read_only(path: Path, empty: dict, notes: list) -> dict:
    """PATH's data (EMPTY when missing) for a command that only reads: a corrupt file is named in NOTES and left
    out, never moved."""
    data, problem = _read(path)
    if problem:
        notes.append(f"baselines file {path} is corrupt ({problem}): left out (the file was not moved)")
        return empty
    return data if data is not None else empty


def resolve(host: str, inv=None, notes=None) -> tuple:
    """(label, recorded) of the baseline that judges HOST in the inventory INV: its own ("host NAME"), else the first
    of its groups' in inventory order ("group NAME"), else ("none", None); only INV's (_view: never another
    inventory's), so without INV none. NOTES, a list, makes it read only (the report): a corrupt file is named there
    and left out; without it a corrupt file is kept aside (CorruptBaseline)."""
    scope = scope_of(inv)
    if scope is None:
        return "none", None

    def read(path: Path, whose: dict) -> dict:
        return _view(_load(path, whose) if notes is None else _read_only(path, whose, notes), scope, whose)

    own = read(_file(host), {"host": host})["recorded"]
    if _usable(own):
        return f"host {host}", own
    for group in host_groups(inv, host):
        recorded = read(_group_file(group), {"group": group})["recorded"]
        if _usable(recorded):
            return f"group {group}", recorded
    return reference_of(inv, host, notes)


def reference_of(inv, host: str, notes=None) -> tuple:
    """("reference NAME", {"metrics", "at": None, "source"}) of the shipped reference HOST's rigbook_reference names
    (the host model's `reference`; references.load), else ("none", None). Validation names a reference that is not
    shipped before any run; with NOTES (read only: the report) a reference that cannot be read is named there."""
    # deferred: rigbook.validate (the host model) costs ~19 ms at start-up; only a host without a baseline needs it
    from rigbook import references
    from rigbook.validate import host_model_of

    name = host_model_of(inv, host).get("reference")
    if not name:
        return "none", None
    try:
        reference = references.load(name)
    except UserError as exc:
        if notes is None:
            raise
        notes.append(str(exc))
        return "none", None
    return f"reference {name}", {"metrics": reference["metrics"], "at": None, "source": reference["source"]}


def history(host: str, inv, notes: list) -> list:
    """HOST's history in the inventory INV (_view), oldest first, read only: a corrupt file is named in NOTES and
    gives none (the report)."""
    return _view(_read_only(_file(host), {"host": host}, notes), scope_of(inv), {"host": host})["history"]


def extra_vars(hosts, inv=None) -> dict:
    """{"rigbook_baselines": {host: {"metrics", "at", "source"}}} for the hosts that a baseline judges (their own,
    or their group's when INV, the inventory, is given); source says which ("host NAME" / "group NAME").

    This is handed to the run as `-e @baselines.json`, and Ansible templates the strings of extra variables: so it
    holds figures only (figures_of), "at" only when it is a time (RECORDED_AT, else None), and a host only when its
    name and its label are plain (PLAIN_NAME, LABEL; else it is left out, named on stderr, and judged by none)."""
    found = {}
    for host in hosts:
        label, recorded = resolve(host, inv)
        if not recorded:
            continue
        if not (isinstance(host, str) and PLAIN_NAME.match(host) and LABEL.match(label)):
            # deferred: rigbook.display (rich) costs ~25 ms at start-up (benchmarks/cli_speed.py); only this needs it
            from rigbook.display import terminal_safe

            print(terminal_safe(f"warning: {host!r}: its baseline ({label}) is not handed to the run: a host or group "
                                "name of other characters than A-Z a-z 0-9 _ . : - is never given to Ansible"),
                  file=sys.stderr)
            continue
        at = recorded.get("at")
        found[host] = {"metrics": figures_of(recorded.get("metrics"), f"the baseline of {host}"),
                       "at": at if isinstance(at, str) and RECORDED_AT.match(at) else None, "source": label}
    return {"rigbook_baselines": found}


def judged_by(hosts, baselines_var: dict) -> dict:
    """{host: "host NAME" / "group NAME" / "none"} from extra_vars()' value, for each of HOSTS."""
    given = (baselines_var or {}).get("rigbook_baselines") or {}
    return {host: (given.get(host) or {}).get("source", "none") for host in hosts}


def judged_text(label: str, inventory) -> str:
    """Which baseline judged a host, for a person: LABEL ("host NAME", "group NAME", "none") and the INVENTORY (its
    path) it was recorded with; a run recorded before runs said it (None): "inventory not recorded"."""
    if label == "none":
        return label
    if label.startswith("reference "):
        return f"{label} (shipped figures of its hardware class, until a baseline of its own is recorded)"
    return f"{label} of inventory {inventory}" if inventory else f"{label} (inventory not recorded)"


def annotate(summary: dict, judged: dict, inventory=None) -> None:
    """Put which baseline judged each host into the run summary: the host entry's "baseline_source" (the label) and
    "baseline_inventory" (INVENTORY, the path of the run's inventory, whose baselines alone judge its hosts), and
    "baseline" (judged_text) on every layer verdict that measured figures."""
    for host, entry in summary.items():
        label = judged.get(host, "none")
        entry["baseline_source"] = label
        if label != "none" and inventory:
            entry["baseline_inventory"] = str(inventory)
        for verdict in entry.get("ladder") or []:
            if verdict.get("metrics"):
                verdict["baseline"] = judged_text(label, inventory)


def print_judged(judged: dict, stream, inventory=None) -> None:
    """One line per run: which baseline judged each host (judged_text; INVENTORY: the run's)."""
    if judged:
        # deferred: rigbook.display (rich) costs ~25 ms at start-up (benchmarks/cli_speed.py); validate needs none
        from rigbook.display import terminal_safe

        print(terminal_safe("baselines: " + "; ".join(f"{host} judged by {judged_text(label, inventory)}"
                                                      for host, label in sorted(judged.items()))), file=stream)


def _lower_is_better(name: str) -> bool:
    """Whether figure NAME is better low (a time: TTFT), as the serving judge compares it."""
    return name.endswith(("_ttft_s", "_latency_us"))


def default_fail_below() -> float:
    """The judges' default fail line (judges/expectations.DEFAULT_TOLERANCE: one place decides it)."""
    link_collection()
    # deferred: ansible_collections.rigbook.homelab is importable only after link_collection() (above)
    from ansible_collections.rigbook.homelab.plugins.module_utils.judges.expectations import DEFAULT_TOLERANCE

    return float(DEFAULT_TOLERANCE["fail_below"])


def group_figures(members: dict, fail_below: float | None = None) -> tuple:
    """(figures, kept, dropped) of a group's baseline from its MEMBERS ({host: {figure: value}}, the boxes recorded in
    one run), as fleet validators take one: the mean of each figure over the members, then every member with a
    figure below FAIL_BELOW x that mean (above mean / FAIL_BELOW for a time) dropped, and again over those left until
    none is; the best box is never below the mean, so one is always kept. KEPT: the hosts whose mean it is; DROPPED:
    [{"host", "figure", "ratio"}] in the order they went (the figure furthest below the mean of its round)."""
    fail_below = default_fail_below() if fail_below is None else fail_below
    kept = {host: dict(figures) for host, figures in members.items() if figures}
    dropped = []
    while True:
        mean = {}
        for name in sorted({n for figures in kept.values() for n in figures}):
            values = [figures[name] for figures in kept.values() if name in figures]
            mean[name] = sum(values) / len(values)
        outliers = []
        for host, figures in kept.items():
            worst = None
            for name, value in figures.items():
                if not mean[name]:
                    continue
                ratio = (mean[name] / value if value else 0.0) if _lower_is_better(name) else value / mean[name]
                if ratio < fail_below and (worst is None or ratio < worst[1]):
                    worst = (name, ratio)
            if worst:
                outliers.append({"host": host, "figure": worst[0], "ratio": round(worst[1], 3)})
        if not outliers or len(outliers) == len(kept):
            return {n: round(v, 4) for n, v in mean.items()}, sorted(kept), dropped
        for out in outliers:
            dropped.append(out)
            del kept[out["host"]]


def record_groups(inv, recorded: dict, only: str) -> dict:
    """Record the group baselines of a `baseline record --group` run: RECORDED, {host: its just-recorded baseline}
    in inventory order; ONLY: one group name, or "*" for every group of those hosts. Each group's figures are
    group_figures of its members recorded in this run (outliers dropped, named). Returns {host: what happened to its
    groups}, one line per host."""
    said = {host: [] for host in recorded}
    groups = []
    for host in recorded:
        mine = host_groups(inv, host)
        if only != "*" and only not in mine:
            said[host].append(f"group {only}: not recorded, {host} is not listed in it")
        for group in (mine if only == "*" else [only] if only in mine else []):
            if group not in groups:
                groups.append(group)
    for group in groups:
        members = {h: r["metrics"] for h, r in recorded.items() if group in host_groups(inv, h) and _usable(r)}
        figures, kept, dropped = group_figures(members)
        first = recorded[kept[0]]
        entry = {"at": first["at"], "metrics": figures, "versions": first.get("versions") or {},
                 "run_dir": first.get("run_dir"), "from_hosts": kept, "dropped": dropped}
        _save_section(_group_file(group), {"group": group}, scope_of(inv),
                      lambda section, entry=entry: section.update(recorded=entry))
        text = f"group {group}: recorded, the mean of {', '.join(kept)}"
        if dropped:
            text += "; dropped " + ", ".join(f"{d['host']} ({d['figure']} {d['ratio']:.2f}x the mean)"
                                             for d in dropped)
        for host in members:
            said[host].append(text)
    return {host: "; ".join(lines) or f"{host} is in no group that can hold a baseline" for host, lines in said.items()}


def check_group(inv, name: str | None) -> None:
    """A UserError when --group NAME names no group of the inventory (or one that cannot hold a baseline)."""
    if name in (None, "*"):
        return
    usable = sorted({g for h in inv.hosts for g in host_groups(inv, h)})
    if name not in usable:
        raise UserError(f"--group {name}: not a group that lists hosts in {inv.path} "
                        f"(groups: {', '.join(usable) or 'none'})")


def record(host: str, ladder: list, run_dir: str, inv) -> dict | None:
    """Record HOST's figures of LADDER (its run's, in RUN_DIR) as its baseline in the inventory INV; the baseline, or
    None when no figure was measured."""
    metrics = metrics_of(ladder, host)
    if not metrics:
        return None
    recorded = {"at": time.strftime("%Y-%m-%d %H:%M:%S"), "metrics": metrics, "versions": versions_of(ladder),
                "run_dir": run_dir}
    _append(host, inv, {"at": recorded["at"], "metrics": metrics, "versions": recorded["versions"],
                        "recorded": True, "run_dir": run_dir}, recorded)
    return recorded


def append_history(host: str, ladder: list, statuses: dict, run_dir: str | None, inv) -> bool:
    """Append a run's figures to HOST's history in the inventory INV (with RUN_DIR, its artifact folder, when given:
    the report links each charted point to its run)."""
    metrics = metrics_of(ladder, host)
    if not metrics:
        return False
    entry = {"at": time.strftime("%Y-%m-%d %H:%M:%S"), "metrics": metrics, "versions": versions_of(ladder),
             "statuses": statuses}
    if run_dir:
        entry["run_dir"] = run_dir
    _append(host, inv, entry)
    return True


def _append(host: str, inv, entry: dict, recorded: dict | None = None) -> None:
    """One locked read-modify-write of HOST's file (_save_section), in the section of the inventory INV: ENTRY
    appended to its history (the last HISTORY_LIMIT kept), RECORDED made its baseline when given."""
    scope = scope_of(inv)
    if scope is None:
        raise UserError(f"baseline of {host}: no inventory to keep it for")

    def change(section: dict) -> None:
        if recorded is not None:
            section["recorded"] = recorded
        section["history"] = ((section.get("history") or []) + [entry])[-HISTORY_LIMIT:]

    _save_section(_file(host), {"host": host}, scope, change)


def hosts_with_data() -> list:
    if not _dir().is_dir():
        return []
    return sorted(name_of_file(p) for p in _dir().glob("*.json"))


def groups_with_data() -> list:
    base = _dir() / "groups"
    return sorted(name_of_file(p) for p in base.glob("*.json")) if base.is_dir() else []


def _say_corrupt(path: Path, problem: str) -> None:
    # deferred: rigbook.display (rich) costs ~25 ms at start-up (benchmarks/cli_speed.py); validate needs none
    from rigbook.display import terminal_safe

    print(terminal_safe(f"error: baselines file {path} is corrupt ({problem}); left as it is here: the next run that "
                        f"reads it keeps it aside as {path.name}.corrupt-<UTC time> and stops once before contacting "
                        "any host"), file=sys.stderr)


def _show_groups(console, safe) -> bool:
    """Print each group baseline (each line through SAFE, display.terminal_safe); False when one is corrupt (named on
    stderr, left in place)."""
    sound = True
    for group in groups_with_data():
        data, problem = _read(_group_file(group))
        if problem:
            _say_corrupt(_group_file(group), problem)
            sound = False
            continue
        for where, recorded, _history in _blocks(data or {}):
            recorded = recorded or {}
            figures = ", ".join(f"{k} {v}" for k, v in sorted((recorded.get("metrics") or {}).items()))
            hosts = recorded.get("from_hosts") or [recorded.get("from_host")]  # from_host: one box, before the mean
            dropped = "".join(f"; dropped {d.get('host')} ({d.get('figure')} {d.get('ratio')}x the mean)"
                              for d in recorded.get("dropped") or [] if isinstance(d, dict))
            console.print(safe(f"group {group}: baseline of {recorded.get('at')} from host(s) "
                               f"{', '.join(str(h) for h in hosts)}{dropped}, {where} ({figures or 'no figures'})"))
    return sound


def _blocks(data: dict) -> list:
    """(whose, recorded, history) of each baseline a sound file's DATA holds: each inventory section's ("inventory
    PATH"), then the one recorded before baselines were kept per inventory (_legacy_origin), if any."""
    found = [(f"inventory {section.get('inventory') or key}", section.get("recorded"), section.get("history") or [])
             for key, section in (data.get("inventories") or {}).items()]
    if data.get("recorded") or data.get("history"):
        found.append((_legacy_origin(data.get("recorded")), data.get("recorded"), data.get("history") or []))
    return found


def _legacy_origin(recorded) -> str:
    """Which inventory a baseline recorded before baselines were kept per inventory belongs to, and what it judges."""
    found = run_inventory((recorded or {}).get("run_dir"))
    if found:
        return (f"inventory {found[1]} (recorded before baselines were kept per inventory, by a run of it: it judges "
                "that inventory's runs while it has no baseline of its own)")
    return ("inventory unknown (recorded before baselines were kept per inventory, and the run that recorded it is "
            "gone): it judges no run; record again with `provision baseline record -i INV`")


def show(hosts, stream, last: int = 8) -> int:
    """Print the baselines with their history; read-only (a corrupt file is named, not moved). Exit 2 when a file
    was corrupt, else 0."""
    # deferred: rich and rigbook.display cost ~25 ms at start-up (benchmarks/cli_speed.py); `provision validate`
    # imports this module (through rigbook.run) and needs neither
    from rich.table import Table

    from rigbook.display import make_console, terminal_safe

    console = make_console(stream)
    sound = _show_groups(console, terminal_safe) if not hosts else True
    hosts = list(hosts) or hosts_with_data()
    if not hosts and groups_with_data():
        return 0 if sound else 2
    if not hosts:
        console.print(terminal_safe(f"no baselines yet under {_dir()} "
                                    "(record one with `provision baseline record -i INV`)"))
        return 0
    for host in hosts:
        data, problem = _read(_file(host))
        if problem:
            _say_corrupt(_file(host), problem)
            sound = False
            continue
        blocks = _blocks(data or {})
        if not blocks:
            console.print(terminal_safe(f"{host}: no baseline recorded"))
        for where, recorded, history in blocks:
            if not recorded:
                console.print(terminal_safe(f"{host}: no baseline recorded, {where}"))
                continue
            versions = (", ".join(f"{k} {v}" for k, v in (recorded.get("versions") or {}).items())
                        or "versions unknown")
            console.print(terminal_safe(f"{host}: the baseline of {where}"))  # a line: a table's title is wrapped
            title = terminal_safe(f"{host}: baseline of {recorded.get('at')} ({versions})")
            table = Table(title=title, title_justify="left")
            table.add_column("metric")
            table.add_column("baseline", justify="right")
            table.add_column(f"last {last} runs (oldest first)")
            for name, value in sorted((recorded.get("metrics") or {}).items()):
                trend = [h["metrics"].get(name) for h in history[-last:] if name in (h.get("metrics") or {})]
                cells = " ".join(f"{v:.2f}" if isinstance(v, (int, float)) else str(v) for v in trend)
                table.add_row(name, f"{value:.2f}" if isinstance(value, (int, float)) else str(value), cells)
            console.print(table)
    return 0 if sound else 2
