"""Baselines: the figures of a known-good run per host, and the history of every run after it.

Stored as one JSON file per host under <state>/baselines/. `provision baseline record` writes
the baseline from a full ladder run; every later run that measures figures is compared with it
by the ladder modules (extra variable rigbook_baselines) and appended to the history.

Group baselines (<state>/baselines/groups/<group>.json): `provision baseline record --group` also records the
figures of the first box (in inventory order) of each of its groups, so a twin built later is held to them. The
rule: a host with a baseline of its own is judged against it; a host without one is judged against the group
baseline of the first of its groups, in inventory order (the order the groups first appear in the inventory file),
that has one. A host's groups are those that list it under `hosts:`; parent groups (`lab`, which holds both an
NVIDIA and an AMD box) and `all` / `ungrouped` never lend a baseline. Every run says which baseline judged each
host: "host NAME", "group NAME" or "none".
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from rigbook.paths import state_dir

HISTORY_LIMIT = 200


def _dir() -> Path:
    return state_dir() / "baselines"


def _file(host: str) -> Path:
    return _dir() / f"{host}.json"


def load(host: str) -> dict:
    path = _file(host)
    if not path.is_file():
        return {"host": host, "recorded": None, "history": []}
    try:
        return json.loads(path.read_text())
    except ValueError:
        return {"host": host, "recorded": None, "history": [], "error": f"{path} is not valid JSON"}


def _save(host: str, data: dict) -> None:
    _dir().mkdir(parents=True, exist_ok=True)
    tmp = _file(host).with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    tmp.replace(_file(host))


def metrics_of(ladder: list) -> dict:
    metrics = {}
    for verdict in ladder:
        for name, value in (verdict.get("metrics") or {}).items():
            if value is not None:
                metrics[name] = value
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
    return _dir() / "groups" / f"{group}.json"


def load_group(group: str) -> dict:
    path = _group_file(group)
    if not path.is_file():
        return {"group": group, "recorded": None}
    try:
        return json.loads(path.read_text())
    except ValueError:
        return {"group": group, "recorded": None, "error": f"{path} is not valid JSON"}


def _save_group(group: str, data: dict) -> None:
    _group_file(group).parent.mkdir(parents=True, exist_ok=True)
    tmp = _group_file(group).with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    tmp.replace(_group_file(group))


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


def resolve(host: str, inv=None) -> tuple:
    """(label, recorded) of the baseline that judges HOST: its own ("host NAME"), else the first of its groups'
    in inventory order ("group NAME"), else ("none", None)."""
    own = load(host).get("recorded")
    if _usable(own):
        return f"host {host}", own
    for group in host_groups(inv, host):
        recorded = load_group(group).get("recorded")
        if _usable(recorded):
            return f"group {group}", recorded
    return "none", None


def extra_vars(hosts, inv=None) -> dict:
    """{"rigbook_baselines": {host: {"metrics", "at", "source"}}} for the hosts that a baseline judges (their own,
    or their group's when INV, the inventory, is given); source says which ("host NAME" / "group NAME")."""
    found = {}
    for host in hosts:
        label, recorded = resolve(host, inv)
        if recorded:
            found[host] = {"metrics": recorded["metrics"], "at": recorded.get("at"), "source": label}
    return {"rigbook_baselines": found}


def judged_by(hosts, baselines_var: dict) -> dict:
    """{host: "host NAME" / "group NAME" / "none"} from extra_vars()' value, for each of HOSTS."""
    given = (baselines_var or {}).get("rigbook_baselines") or {}
    return {host: (given.get(host) or {}).get("source", "none") for host in hosts}


def annotate(summary: dict, judged: dict) -> None:
    """Put which baseline judged each host into the run summary: the host entry's "baseline_source", and
    "baseline" on every layer verdict that measured figures."""
    for host, entry in summary.items():
        label = judged.get(host, "none")
        entry["baseline_source"] = label
        for verdict in entry.get("ladder") or []:
            if verdict.get("metrics"):
                verdict["baseline"] = label


def print_judged(judged: dict, stream) -> None:
    """One line per run: which baseline judged each host."""
    if judged:
        print("baselines: " + "; ".join(f"{host} judged by {label}" for host, label in sorted(judged.items())),
              file=stream)


def record_groups(host: str, inv, recorded: dict, only: str, done: dict) -> str:
    """Record HOST's just-recorded baseline as its groups' (ONLY: one group name, or "*" for all of them); a group
    DONE already took in this run (from an earlier box in inventory order) is left alone. Returns what happened."""
    groups = host_groups(inv, host)
    if only != "*":
        if only not in groups:
            return f"group {only}: not recorded, {host} is not listed in it"
        groups = [only]
    said = []
    for group in groups:
        if group in done:
            said.append(f"group {group}: kept the figures of {done[group]}")
            continue
        _save_group(group, {"group": group, "recorded": {**recorded, "from_host": host}})
        done[group] = host
        said.append(f"group {group}: recorded")
    return "; ".join(said) or f"{host} is in no group that can hold a baseline"


def check_group(inv, name: str | None) -> None:
    """A UserError when --group NAME names no group of the inventory (or one that cannot hold a baseline)."""
    if name in (None, "*"):
        return
    from rigbook.errors import UserError

    usable = sorted({g for h in inv.hosts for g in host_groups(inv, h)})
    if name not in usable:
        raise UserError(f"--group {name}: not a group that lists hosts in {inv.path} "
                        f"(groups: {', '.join(usable) or 'none'})")


def record(host: str, ladder: list, run_dir: str) -> dict | None:
    metrics = metrics_of(ladder)
    if not metrics:
        return None
    data = load(host)
    data["recorded"] = {"at": time.strftime("%Y-%m-%d %H:%M:%S"), "metrics": metrics,
                        "versions": versions_of(ladder), "run_dir": run_dir}
    data.setdefault("history", []).append({"at": data["recorded"]["at"], "metrics": metrics,
                                            "versions": data["recorded"]["versions"], "recorded": True})
    _save(host, data)
    return data["recorded"]


def append_history(host: str, ladder: list, statuses: dict) -> bool:
    metrics = metrics_of(ladder)
    if not metrics:
        return False
    data = load(host)
    data.setdefault("history", []).append({"at": time.strftime("%Y-%m-%d %H:%M:%S"), "metrics": metrics,
                                            "versions": versions_of(ladder), "statuses": statuses})
    data["history"] = data["history"][-HISTORY_LIMIT:]
    _save(host, data)
    return True


def hosts_with_data() -> list:
    if not _dir().is_dir():
        return []
    return sorted(p.stem for p in _dir().glob("*.json"))


def groups_with_data() -> list:
    base = _dir() / "groups"
    return sorted(p.stem for p in base.glob("*.json")) if base.is_dir() else []


def _show_groups(console) -> None:
    for group in groups_with_data():
        recorded = load_group(group).get("recorded") or {}
        figures = ", ".join(f"{k} {v}" for k, v in sorted((recorded.get("metrics") or {}).items()))
        console.print(f"group {group}: baseline of {recorded.get('at')} from host {recorded.get('from_host')} "
                      f"({figures or 'no figures'})")


def show(hosts, stream, last: int = 8) -> int:
    from rich.table import Table

    from rigbook.display import make_console

    console = make_console(stream)
    if not hosts:
        _show_groups(console)
    hosts = list(hosts) or hosts_with_data()
    if not hosts and groups_with_data():
        return 0
    if not hosts:
        console.print(f"no baselines yet under {_dir()} (record one with `provision baseline record -i INV`)")
        return 0
    for host in hosts:
        data = load(host)
        recorded = data.get("recorded")
        if not recorded:
            console.print(f"{host}: no baseline recorded")
            continue
        versions = ", ".join(f"{k} {v}" for k, v in (recorded.get("versions") or {}).items()) or "versions unknown"
        table = Table(title=f"{host}: baseline of {recorded['at']} ({versions})", title_justify="left")
        table.add_column("metric")
        table.add_column("baseline", justify="right")
        table.add_column(f"last {last} runs (oldest first)")
        history = data.get("history") or []
        for name, value in sorted(recorded["metrics"].items()):
            trend = [h["metrics"].get(name) for h in history[-last:] if name in (h.get("metrics") or {})]
            cells = " ".join(f"{v:.2f}" if isinstance(v, (int, float)) else str(v) for v in trend)
            table.add_row(name, f"{value:.2f}" if isinstance(value, (int, float)) else str(value), cells)
        console.print(table)
    return 0
