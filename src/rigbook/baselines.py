"""Baselines: the figures of a known-good run per host, and the history of every run after it.

Stored as one JSON file per host under <state>/baselines/. `provision baseline record` writes
the baseline from a full ladder run; every later run that measures figures is compared with it
by the ladder modules (extra variable rigbook_baselines) and appended to the history.
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


def extra_vars(hosts) -> dict:
    """{"rigbook_baselines": {host: {"metrics": {...}}}} for the hosts that have a baseline."""
    found = {}
    for host in hosts:
        recorded = load(host).get("recorded")
        if recorded and recorded.get("metrics"):
            found[host] = {"metrics": recorded["metrics"], "at": recorded.get("at")}
    return {"rigbook_baselines": found}


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


def show(hosts, stream, last: int = 8) -> int:
    from rich.table import Table

    from rigbook.display import make_console

    console = make_console(stream)
    hosts = list(hosts) or hosts_with_data()
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
