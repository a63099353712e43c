"""`provision snapshot` (pack each host's evidence into one tarball) and `provision verify --replay`."""

from __future__ import annotations

import json
import shutil
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from rigbook.errors import UserError
from rigbook.paths import link_collection


def _module_utils():
    link_collection()
    from ansible_collections.rigbook.homelab.plugins.module_utils.collect import static_evidence

    return static_evidence


def judge_tree(tree: str, ladder_view: dict, baseline_metrics: dict | None = None) -> list:
    """Every layer of the registry on a recorded tree, with the same collectors, judges and climb as a live run
    (no stop at the first fail: a replay shows the whole ladder). LADDER_VIEW: the host's ladder_view_of."""
    link_collection()
    from ansible_collections.rigbook.homelab.plugins.module_utils.ladder import registry
    from ansible_collections.rigbook.homelab.plugins.module_utils.ladder.climb import Context, climb

    verdicts, _ = climb(registry.LAYERS, Context(tree, ladder_view, baseline_metrics), stop_at_fail=False)
    return verdicts


# Per host in a snapshot: the ladder view the judges read. Snapshots made before the rename hold it as profile.json.
LADDER_VIEW_FILE = "ladder_view.json"
OLD_LADDER_VIEW_FILE = "profile.json"


def ladder_view_of(inv, host: str) -> dict:
    """What the ladder's judges read of HOST: its host model's ladder view, {gpu, p2p, pins, tolerance}
    (host_model.ladder_view)."""
    from rigbook.validate import host_model_of

    link_collection()
    from ansible_collections.rigbook.homelab.plugins.module_utils import host_model

    return host_model.ladder_view(host_model_of(inv, host))


def snapshot(opts, output: str | None) -> int:
    """Run playbooks/snapshot.yml, then bundle tree + evidence.json + ladder_view.json per host."""
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
            with tarfile.open(archive) as tar:
                tar.extractall(target, filter="data")
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
        print(f"snapshot of {', '.join(hosts)}: {out}", file=sys.stderr if opts.json else sys.stdout)
        return code
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _host_dirs(base: Path) -> list:
    found = sorted({p.parent for name in (LADDER_VIEW_FILE, OLD_LADDER_VIEW_FILE) for p in base.rglob(name)
                    if (p.parent / "tree").is_dir()})
    if not found and (base / "tree").is_dir():
        found = [base]
    return found


def _ladder_view(host_dir: Path) -> dict:
    for name in (LADDER_VIEW_FILE, OLD_LADDER_VIEW_FILE):
        if (host_dir / name).is_file():
            return json.loads((host_dir / name).read_text())
    return {}


def replay(path: str, as_json: bool) -> int:
    """Judge saved evidence with the live judges; no host is contacted."""
    from rigbook import display

    source = Path(path)
    if not source.exists():
        raise UserError(f"--replay {path}: no such file or directory")
    workdir = None
    try:
        if source.is_file():
            workdir = Path(tempfile.mkdtemp(prefix="rigbook-replay-"))
            try:
                with tarfile.open(source) as tar:
                    tar.extractall(workdir, filter="data")
            except (tarfile.TarError, OSError) as exc:
                raise UserError(f"--replay {path}: not a snapshot tarball ({exc})") from None
            base = workdir
        else:
            base = source
        host_dirs = _host_dirs(base)
        if not host_dirs:
            raise UserError(f"--replay {path}: no host evidence (HOST/tree and HOST/ladder_view.json) inside")
        hosts = {}
        for host_dir in host_dirs:
            hosts[host_dir.name] = {"ladder": judge_tree(str(host_dir / "tree"), _ladder_view(host_dir))}
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
        console.print(f"replayed {len(hosts)} host(s) from {source}: {'FAILED' if failed else 'ok'}")
    return code
