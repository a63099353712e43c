"""`provision snapshot` (pack each host's evidence into one tarball) and `provision verify --replay`."""

from __future__ import annotations

import json
import os
import shutil
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from rigbook import display
from rigbook.errors import UserError
from rigbook.paths import link_collection


def _module_utils():
    link_collection()
    # deferred: ansible_collections.rigbook.homelab is importable only after link_collection() (above)
    from ansible_collections.rigbook.homelab.plugins.module_utils.collect import static_evidence

    return static_evidence


def _safe_untar():
    link_collection()
    # deferred: ansible_collections.rigbook.homelab is importable only after link_collection() (above)
    from ansible_collections.rigbook.homelab.plugins.module_utils import safe_untar

    return safe_untar


# Caps on one evidence tarball (a host's evidence.tar.gz, a snapshot to replay): a real one is kilobytes.
EVIDENCE_MAX_MEMBERS = 100_000
EVIDENCE_MAX_BYTES = 256 << 20


def judge_tree(tree: str, ladder_view: dict, baseline_metrics: dict | None = None) -> list:
    """Every layer of the registry on a recorded tree, with the same collectors, judges and climb as a live run
    (no stop at the first fail: a replay shows the whole ladder). LADDER_VIEW: the host's ladder_view_of."""
    return _climb_tree(tree, ladder_view, baseline_metrics)[0]


def _climb_tree(tree: str, ladder_view: dict, baseline_metrics: dict | None = None) -> tuple:
    """(verdicts, evidence) of judge_tree's climb."""
    link_collection()
    # deferred: ansible_collections.rigbook.homelab is importable only after link_collection() (above)
    from ansible_collections.rigbook.homelab.plugins.module_utils.ladder import registry
    from ansible_collections.rigbook.homelab.plugins.module_utils.ladder.climb import Context, climb

    return climb(registry.LAYERS, Context(tree, ladder_view, baseline_metrics), stop_at_fail=False)


def replay_tree(tree: str, ladder_view: dict) -> list:
    """The layers a live `provision verify` of the host shows, judged on its recorded TREE (judge_tree's climb).
    The serving layer only where the live run has it: the p2p_verify role runs the serving phase only on a host with
    serve profiles (p2p_verify_phases; ladder/registry.expected_layers holds the same rule), so a replay shows it
    when the host's ladder view expects it (measure.serving) or the snapshot recorded a serve profile's
    measurements, and leaves it out otherwise, as the live run does (not a skip the live run never printed)."""
    verdicts, evidence = _climb_tree(tree, ladder_view)
    serving = evidence.get("serving") if isinstance(evidence.get("serving"), dict) else {}
    if (ladder_view.get("measure") or {}).get("serving") or serving.get("profiles") or serving.get("error"):
        return verdicts
    return [verdict for verdict in verdicts if verdict.get("layer") != "serving"]


def _in_snapshot(value, workdir: Path, shown: str):
    """VALUE (a verdict, or any part of one) with every path under WORKDIR, the temporary folder a snapshot tarball
    is unpacked into for its replay (deleted when the replay ends, another each time), named inside the snapshot
    instead: "SHOWN:HOST/tree/..." (SHOWN: the tarball as the command line gave it)."""
    if isinstance(value, str):
        for prefix in {str(workdir), os.path.realpath(workdir)}:
            value = value.replace(prefix + os.sep, f"{shown}:").replace(prefix, f"{shown}:")
        return value
    if isinstance(value, dict):
        return {_in_snapshot(k, workdir, shown): _in_snapshot(v, workdir, shown) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_in_snapshot(item, workdir, shown) for item in value]
    return value


# Per host in a snapshot: the ladder view the judges read. Snapshots made before the rename hold it as profile.json.
LADDER_VIEW_FILE = "ladder_view.json"
OLD_LADDER_VIEW_FILE = "profile.json"


def ladder_view_of(inv, host: str) -> dict:
    """What the ladder's judges read of HOST: its host model's ladder view, {gpu, p2p, pins, tolerance}
    (host_model.ladder_view)."""
    # deferred: rigbook.validate costs ~19 ms at start-up (benchmarks/cli_speed.py); verify --replay needs none
    from rigbook.validate import host_model_of

    link_collection()
    # deferred: ansible_collections.rigbook.homelab is importable only after link_collection() (above)
    from ansible_collections.rigbook.homelab.plugins.module_utils import host_model

    return host_model.ladder_view(host_model_of(inv, host))


def snapshot(opts, output: str | None) -> int:
    """Run playbooks/snapshot.yml, then bundle tree + evidence.json + ladder_view.json per host."""
    # deferred: rigbook.run, rigbook.validate cost ~42 ms at start-up (benchmarks/cli_speed.py); replay needs neither
    from rigbook.run import resolve_inventory, run_playbook
    from rigbook.validate import validate

    inv = validate(resolve_inventory(opts.inventory))
    static_evidence = _module_utils()
    staging = Path(tempfile.mkdtemp(prefix="rigbook-snapshot-"))
    try:
        opts.playbook = "snapshot.yml"
        opts.extra_vars = [*opts.extra_vars, json.dumps({"rigbook_snapshot_dir": str(staging / "fetched")})]
        code = run_playbook(opts)
        bundle = staging / "bundle"
        hosts = []
        for archive in sorted((staging / "fetched").glob("*/evidence.tar.gz")):
            host = archive.parent.name
            target = bundle / host
            target.mkdir(parents=True)
            _unpack(archive, target, f"the evidence of {host} ({archive.name})", "an evidence tarball")
            ladder_view = ladder_view_of(inv, host) if host in inv.hosts else {}
            (target / LADDER_VIEW_FILE).write_text(json.dumps(ladder_view, indent=2) + "\n")
            collected = static_evidence.collect_static(str(target / "tree"))
            collected["root"] = "tree"
            (target / "evidence.json").write_text(json.dumps(collected, indent=2) + "\n")
            hosts.append(host)
        if not hosts:
            print("no evidence was fetched: nothing to bundle", file=sys.stderr)
            return code or 1
        out = Path(output or f"rigbook-snapshot-{time.strftime('%Y%m%d-%H%M%S')}.tar.gz").resolve()
        with tarfile.open(out, "w:gz") as tar:
            for host in hosts:
                tar.add(bundle / host, arcname=host)
        print(display.terminal_safe(f"snapshot of {', '.join(hosts)}: {out}"),
              file=sys.stderr if opts.json else sys.stdout)
        return code
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _unpack(archive: Path, dest: Path, what: str, kind: str) -> None:
    """ARCHIVE into the empty folder DEST, every member checked (module_utils/safe_untar.py). A refused archive is a
    UserError naming WHAT and the member; an unreadable one says WHAT is not KIND ("a snapshot tarball")."""
    safe_untar = _safe_untar()
    try:
        safe_untar.unpack(str(archive), str(dest), max_members=EVIDENCE_MAX_MEMBERS, max_bytes=EVIDENCE_MAX_BYTES)
    except safe_untar.UnsafeArchive as exc:
        raise UserError(f"{what}: refused: {exc}") from None
    except (tarfile.TarError, OSError) as exc:
        raise UserError(f"{what}: not {kind} ({exc})") from None


def _host_dirs(base: Path) -> list:
    found = sorted({p.parent for name in (LADDER_VIEW_FILE, OLD_LADDER_VIEW_FILE) for p in base.rglob(name)
                    if (p.parent / "tree").is_dir()})
    if not found and (base / "tree").is_dir():
        found = [base]
    return found


def _ladder_view(host_dir: Path, base: Path, shown: str) -> dict:
    """HOST_DIR's ladder view ({} when it has none). BASE and SHOWN: the replay folder and its name for errors."""
    for name in (LADDER_VIEW_FILE, OLD_LADDER_VIEW_FILE):
        if (host_dir / name).is_file():
            try:
                view = json.loads((host_dir / name).read_text())
            except (OSError, ValueError) as exc:
                raise UserError(f"--replay {shown}: {(host_dir / name).relative_to(base)}: not a ladder view ({exc})"
                                ) from None
            if not isinstance(view, dict):
                raise UserError(f"--replay {shown}: {(host_dir / name).relative_to(base)}: not a ladder view "
                                "(not a JSON object)")
            return view
    return {}


def _inside(base: Path, path: Path, shown: str) -> None:
    """PATH's real path must lie in BASE's: a recorded tree that leads out (a link to /) would make the judges read,
    or run, the live controller. SHOWN names the replay in the UserError."""
    real_base, real = os.path.realpath(base), os.path.realpath(path)
    if os.path.commonpath([real_base, real]) != real_base:
        rel = path.relative_to(base) if path.is_relative_to(base) else path
        raise UserError(f"--replay {shown}: {rel} leads out of the replay folder (to {real}); nothing was judged")


def _check_host_dir(base: Path, host_dir: Path, shown: str) -> None:
    """HOST, HOST/tree, its ladder view and every symlink under the tree must resolve inside BASE."""
    for path in (host_dir, host_dir / "tree", host_dir / LADDER_VIEW_FILE, host_dir / OLD_LADDER_VIEW_FILE):
        if path.exists() or path.is_symlink():
            _inside(base, path, shown)
    for folder, dirs, files in os.walk(host_dir / "tree"):
        for name in dirs + files:
            path = Path(folder) / name
            if path.is_symlink():
                _inside(base, path, shown)


def replay(path: str, as_json: bool) -> int:
    """Judge saved evidence with the live judges; no host is contacted."""
    source = Path(path)
    if not source.exists():
        raise UserError(f"--replay {path}: no such file or directory")
    workdir = None
    try:
        if source.is_file():
            workdir = Path(tempfile.mkdtemp(prefix="rigbook-replay-"))
            _unpack(source, workdir, f"--replay {path}", "a snapshot tarball")
            base = workdir
        else:
            base = source
        host_dirs = _host_dirs(base)
        if not host_dirs:
            raise UserError(f"--replay {path}: no host evidence (HOST/tree and HOST/ladder_view.json) inside")
        for host_dir in host_dirs:
            _check_host_dir(base, host_dir, path)
        hosts = {}
        for host_dir in host_dirs:
            ladder = replay_tree(str(host_dir / "tree"), _ladder_view(host_dir, base, path))
            hosts[host_dir.name] = {"ladder": _in_snapshot(ladder, workdir, path) if workdir else ladder}
    finally:
        if workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    failed = any(v["status"] == "fail" for h in hosts.values() for v in h["ladder"])
    code = 1 if failed else 0
    if as_json:
        print(json.dumps({"exit_code": code, "replay": str(source), "hosts": hosts}, indent=2))
    else:
        console = display.make_console(sys.stdout)
        for host, entry in hosts.items():
            display.print_ladder(console, host, entry["ladder"])
        console.print(display.terminal_safe(f"replayed {len(hosts)} host(s) from {source}: "
                                            f"{'FAILED' if failed else 'ok'}"))
    return code
