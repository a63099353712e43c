"""`provision`: the command line. Imports stay lazy so --help answers at once."""

from __future__ import annotations

import argparse
import json
import sys

from rigbook.errors import UserError, guarded

SUBCOMMANDS = {
    "validate": "check an inventory's rigbook_* variables, name every input site.yml still needs (no host contacted)",
    "runs": "list recent runs and where their artifacts are",
    "lab": "local simulated rigs: up, status, down, break, heal",
    "bootstrap": "make a bare host Ansible-ready over SSH: ansible_user, its key, sudoers drop-in, python3",
    "report": "one HTML page per inventory: ladders, figures over time vs the baseline, the hosts side by side",
    "verify": "run the P2P ladder (verify.yml) on hosts, or judge a saved snapshot with --replay",
    "snapshot": "save each host's ladder evidence into one tarball for a bug report or a replay",
    "baseline": "record a known-good run's figures per host (record -i INV), or show them with history (show)",
    "manifest": "collect each host's manifest (kernels, DKMS, versions, hashes, GPUs) into the run's folder",
    "diff": "compare two manifests (hosts of the last manifest run, of -i INV, or saved files); exit 1 when a pin "
            "differs",
    "parse": "parse a pasted tool output (lspci, nvidia-smi-q, nvidia-smi-topo, nccl-tests, ...) to JSON",
    "diagnose": "judge pasted tool outputs (lspci -vv, NCCL logs, nccl-tests, p2pBandwidthLatencyTest, dmesg, ...) "
                "with the P2P ladder; contacts no host",
    "adopt": "read a box set up by hand (changes nothing) and write its pins and serve profiles as host_vars",
}

DESCRIPTION = "Provision and verify homelab multi-GPU LLM inference boxes with Ansible."
EPILOG = (
    "commands:\n"
    + "".join(f"  provision {name:<9} {text}\n" for name, text in SUBCOMMANDS.items())
    + "\nexamples:\n"
    "  provision site.yml -i homelab --check --diff\n"
    "  provision site.yml -i lab --limit x99_3080 --json\n"
    "  provision validate -i inventory/homelab\n"
    "\nexit codes: 0 fine, 1 a host failed, 2 bad input, 3 only unreachable hosts, 4 another run holds the state\n"
    "directory, 130 interrupted"
)


def _add_extra_vars(parser: argparse.ArgumentParser, help_text: str) -> None:
    """-e/--extra-vars, as ansible-playbook takes it: K=V or @FILE, repeatable, collected in order."""
    parser.add_argument("-e", "--extra-vars", action="append", default=[], metavar="K=V|@FILE", help=help_text)


def _add_allow_unknown(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--allow-unknown", metavar="LAYER[,LAYER]", action="append", default=[],
                        help="let these ladder layers come out unknown on this run (any other layer the box should "
                        "measure that comes out unknown fails the play); the summary says which were allowed")


def _allow_unknown_vars(values: list) -> list:
    """-e items that carry --allow-unknown's layers to the p2p_verify role; UserError (exit 2) for a name that is no
    layer of the ladder."""
    names = [name.strip() for value in values for name in value.split(",") if name.strip()]
    if not names:
        return []
    # deferred: rigbook.paths costs ~5 ms at start-up (benchmarks/cli_speed.py); --help needs none
    from rigbook.paths import link_collection

    link_collection()
    # deferred: ansible_collections.rigbook.homelab is importable only after link_collection() (above)
    from ansible_collections.rigbook.homelab.plugins.module_utils.ladder import registry

    wrong = [name for name in names if name not in registry.names()]
    if wrong:
        raise UserError(f"--allow-unknown: {', '.join(wrong)} is no ladder layer; the layers are "
                        f"{', '.join(registry.names())}")
    return [json.dumps({"p2p_verify_allow_unknown": sorted(set(names))})]


def _playbook_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="provision",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("playbook", help="site.yml, verify.yml (from the collection's playbooks/) or a path")
    p.add_argument("-i", "--inventory", required=True, help="homelab, lab (from inventory/) or a path")
    p.add_argument("-l", "--limit", help="further limit the hosts (Ansible pattern)")
    p.add_argument("-t", "--tags", help="only run plays and tasks tagged with these")
    p.add_argument("--skip-tags", help="skip plays and tasks tagged with these")
    _add_extra_vars(p, "extra variables (repeatable)")
    _add_allow_unknown(p)
    p.add_argument("-C", "--check", action="store_true", help="change nothing; report what would change")
    p.add_argument("-D", "--diff", action="store_true", help="show file and template differences")
    p.add_argument("-f", "--forks", type=int, help="parallel hosts")
    p.add_argument("--rolling", nargs="?", const="1", metavar="N|N%",
                   help="site.yml in batches: one canary host, then N hosts (or N%% of them) per batch; each batch's "
                        "reboots, ladder and serving must pass before the next starts; the first failure stops it")
    p.add_argument("--verify-builds", action="store_true",
                   help="a group build is built by a second box of the group too, and the run fails when the two "
                        "archives differ (naming both boxes and both sha256)")
    p.add_argument("--json", action="store_true", help="print one JSON summary on stdout (progress goes to stderr)")
    p.add_argument("--junit", metavar="FILE", help="write a JUnit XML report")
    p.add_argument("-v", "--verbose", action="count", default=0, help="more Ansible detail (repeatable)")
    return p


def _sub_parser(name: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"provision {name}", description=SUBCOMMANDS[name])
    if name == "validate":
        p.add_argument("-i", "--inventory", required=True, help="homelab, lab or a path")
    elif name == "runs":
        p.add_argument("-n", "--count", type=int, default=20, help="how many runs to list")
    elif name in ("verify", "snapshot"):
        p.add_argument("-i", "--inventory", required=name == "snapshot", help="homelab, lab or a path")
        p.add_argument("-l", "--limit", help="further limit the hosts (Ansible pattern)")
        _add_extra_vars(p, "extra variables, e.g. a host variable override (repeatable)")
        p.add_argument("--json", action="store_true", help="one JSON summary on stdout")
        p.add_argument("--junit", metavar="FILE", help="write a JUnit XML report")
        p.add_argument("-v", "--verbose", action="count", default=0)
        if name == "verify":
            _add_allow_unknown(p)
            p.add_argument("-t", "--tags", help="only these layers (e.g. pcie_link,kernel_state)")
            p.add_argument("--replay", metavar="PATH", help="judge a snapshot tarball or folder; contacts no host")
        else:
            p.add_argument(
                "-o", "--output", metavar="FILE", help="tarball to write (default ./rigbook-snapshot-*.tar.gz)"
            )
    elif name == "baseline":
        p.add_argument("action", choices=["record", "show"])
        p.add_argument("hosts", nargs="*", help="show: only these hosts")
        p.add_argument("-i", "--inventory", help="record: homelab, lab or a path")
        p.add_argument("-l", "--limit", help="record: further limit the hosts")
        p.add_argument("--group", nargs="?", const="*", metavar="GROUP",
                       help="record: also record the figures as the baseline of the host's groups (or of GROUP "
                            "only); a host without a baseline of its own is judged against its group's")
        _add_extra_vars(p, "record: extra variables (repeatable)")
        p.add_argument("--json", action="store_true", help="record: one JSON summary on stdout")
        p.add_argument("-v", "--verbose", action="count", default=0)
    elif name in ("manifest", "diff"):
        _manifest_args(p, name)
    elif name == "bootstrap":
        _bootstrap_args(p)
    elif name == "adopt":
        p.add_argument("host", help="a host of the inventory, set up by hand and working")
        p.add_argument("-i", "--inventory", required=True, help="homelab, lab or a path")
        p.add_argument("-o", "--output", metavar="FILE", help="write here (default: the inventory's "
                       "host_vars/HOST.yml, group_vars/GROUP.yml with --group)")
        p.add_argument("--group", action="store_true", help="write the host's group's variables instead")
        p.add_argument("--force", action="store_true", help="replace an existing file")
        p.add_argument("--debs-dir", metavar="DIR",
                       help="a folder on the host holding the kernel .debs installed by hand")
        p.add_argument("--wheels-dir", metavar="DIR", action="append",
                       help="a folder on the host holding the wheels the engine's venv was installed from (the "
                       "lock's --hash lines, sglang's original files); again for another folder")
    elif name == "parse":
        p.add_argument("kind", help="lspci, nvidia-smi-q, nvidia-smi-topo, nccl-tests, nccl-log, p2p-bandwidth, "
                       "sglang-log, kernel-log (formats: docs/parse-formats.md)")
        p.add_argument("file", help="file with the pasted output, - for stdin")
    elif name == "diagnose":
        p.add_argument("files", nargs="+", metavar="FILE", help="files with pasted outputs (several in one file are "
                       "split: prompts, `$ command` lines, -- separators), - for stdin")
        p.add_argument("--vendor", choices=["nvidia", "amd"], help="the GPUs' vendor (else read from the pastes)")
        p.add_argument("--gpus", type=int, metavar="N", help="how many GPUs the box has (else read from the pastes)")
        p.add_argument("--vram-gib", type=float, metavar="GIB", help="one GPU's VRAM in GiB (the firmware layer "
                       "holds the VRAM BAR to it)")
        p.add_argument("--pcie", metavar="GENxWIDTH", help="the PCIe link the GPUs should train at, e.g. 3x16")
        p.add_argument("--p2p", choices=["yes", "no"], help="whether P2P is expected on this box (default: with "
                       "two or more GPUs)")
        p.add_argument("--json", action="store_true", help="one JSON object on stdout")
    return p


def _bootstrap_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("host", help="a host of the inventory (its address, port, ansible_user and known_hosts are used)")
    p.add_argument("-i", "--inventory", required=True, help="homelab, lab or a path")
    p.add_argument("--user", help="the existing account to log in as (default: the inventory's ansible_user)")
    p.add_argument("--identity", metavar="PRIVATE_KEY",
                   help="log in with this key (default: a password, from RIGBOOK_BOOTSTRAP_PASSWORD or a prompt)")
    p.add_argument("--pubkey", metavar="FILE", help="the public key to install for ansible_user (default: the "
                   "inventory's ansible_ssh_private_key_file + .pub, else ~/.ssh/id_ed25519.pub)")
    trust = p.add_mutually_exclusive_group()
    trust.add_argument("--accept-new-host-key", action="store_true",
                       help="record an unknown host key (its fingerprint is printed); a changed one is still refused")
    trust.add_argument("--host-key-fingerprint", metavar="SHA256:...",
                       help="record an unknown host key only if it has this fingerprint")


def _manifest_args(p: argparse.ArgumentParser, name: str) -> None:
    if name == "manifest":
        p.add_argument("-i", "--inventory", required=True, help="homelab, lab or a path")
        p.add_argument("-l", "--limit", help="further limit the hosts (Ansible pattern)")
        p.add_argument("-v", "--verbose", action="count", default=0)
    else:
        p.add_argument("a", help="a host (of -i INV, else of the last manifest run), or a saved manifest file")
        p.add_argument("b", help="a host (of -i INV, else of the last manifest run), or a saved manifest file")
        p.add_argument("-i", "--inventory", help="homelab, lab or a path: A and B are its hosts, each by its newest "
                       "manifest from a `provision manifest -i INV` run")
    p.add_argument("--json", action="store_true", help="one JSON summary on stdout")


def _manifest_or_diff(name: str, args) -> int:
    # deferred: rigbook.manifests costs ~15 ms at start-up (benchmarks/cli_speed.py); --help needs none
    from rigbook import manifests

    if name == "diff":
        return manifests.diff_command(args.a, args.b, args.json, sys.stdout, inventory=args.inventory)
    # deferred: rigbook.run costs ~65 ms at start-up (benchmarks/cli_speed.py); diff and --help need none
    from rigbook.run import RunOptions

    opts = RunOptions(playbook=manifests.PLAYBOOK, inventory=args.inventory, limit=args.limit, json=args.json,
                      verbosity=args.verbose, baseline_mode="off")
    return manifests.manifest_command(opts, sys.stderr if args.json else sys.stdout)


def _print_box_paths(path, roles) -> None:
    """What must already be on each box (models, wheel directories): no controller can see it; the preflight role
    looks for it before any role changes the box. Printed on stderr, before the verdict."""
    # deferred: rigbook.inventory, rigbook.validate cost ~33 ms at start-up (benchmarks/cli_speed.py); --help needs none
    from rigbook import inventory
    from rigbook.validate import host_model_of

    try:
        inv = inventory.load(path)
        lines = []
        for host in sorted(inv.hosts):
            for item in host_model_of(inv, host)["box_paths"]:
                lines.append(f"  host {host}: {item['key']}: {item['path']} ({item['why']})")
    except UserError:
        return  # an unreadable inventory: validate() below says why, with exit 2
    if lines:
        print("on the boxes before site.yml changes anything (the preflight role looks for each):\n"
              + "\n".join(lines), file=sys.stderr, flush=True)


def _validate(args) -> int:
    # deferred: rigbook.run, rigbook.validate cost ~65 ms at start-up (benchmarks/cli_speed.py); --help needs none
    from rigbook.run import resolve_inventory, resolve_playbook
    from rigbook.validate import run_roles, validate

    path = resolve_inventory(args.inventory)
    roles = run_roles(resolve_playbook("site.yml"))
    _print_box_paths(path, roles)
    inv = validate(path, roles=roles)
    groups = sorted(g for g in inv.all_groups() if g != "all")
    print(f"{path}: valid and ready for site.yml ({len(inv.hosts)} hosts; groups: {', '.join(groups) or '-'})")
    return 0


def _baseline(args) -> int:
    if args.action == "show":
        if args.group:
            raise UserError("provision baseline show: --group is for record (show lists group baselines too)")
        # deferred: rigbook.baselines costs ~10 ms at start-up (benchmarks/cli_speed.py); --help needs none
        from rigbook.baselines import show

        return show(args.hosts, sys.stdout)
    if not args.inventory:
        raise UserError("provision baseline record: -i INVENTORY is required")
    # deferred: rigbook.run costs ~65 ms at start-up (benchmarks/cli_speed.py); baseline show and --help need none
    from rigbook.run import RunOptions, run_playbook

    return run_playbook(
        RunOptions(playbook="verify.yml", inventory=args.inventory, limit=args.limit, json=args.json,
                   extra_vars=args.extra_vars, verbosity=args.verbose, baseline_mode="record",
                   baseline_group=args.group)
    )


def _verify_or_snapshot(name: str, args) -> int:
    if name == "verify" and args.replay:
        if args.inventory:
            raise UserError("--replay judges saved evidence: give it no -i")
        # deferred: rigbook.snapshots costs ~50 ms at start-up (benchmarks/cli_speed.py); only verify, snapshot need it
        from rigbook.snapshots import replay

        return replay(args.replay, args.json)
    if not args.inventory:
        raise UserError(f"provision {name}: -i INVENTORY is required (or --replay PATH)")
    # deferred: rigbook.run costs ~65 ms at start-up (benchmarks/cli_speed.py); --help and --replay need none
    from rigbook.run import RunOptions, run_playbook

    opts = RunOptions(
        playbook="verify.yml" if name == "verify" else "snapshot.yml",
        inventory=args.inventory,
        limit=args.limit,
        tags=getattr(args, "tags", None),
        extra_vars=args.extra_vars + _allow_unknown_vars(getattr(args, "allow_unknown", [])),
        json=args.json,
        junit=args.junit,
        verbosity=args.verbose,
        baseline_mode="compare" if name == "verify" else "off",
    )
    if name == "verify":
        return run_playbook(opts)
    # deferred: rigbook.snapshots costs ~50 ms at start-up (benchmarks/cli_speed.py); only verify, snapshot need it
    from rigbook.snapshots import snapshot

    return snapshot(opts, args.output)


def _check_playbook_word(word: str) -> None:
    """A first word that is no command must name a playbook (a .yml file, or one of the collection's): otherwise it
    is a mistyped command, said as such (not "-i is required")."""
    # deferred: pathlib and rigbook.run cost ~65 ms at start-up (benchmarks/cli_speed.py); --help needs neither
    from pathlib import Path

    from rigbook.run import resolve_playbook

    if word.endswith((".yml", ".yaml")) or Path(word).exists():
        return
    try:
        resolve_playbook(word)
    except UserError:
        commands = ", ".join(sorted(set(SUBCOMMANDS) | {"report"}))
        raise UserError(f"unknown command {word!r}: the commands are {commands}; anything else is a playbook "
                        "(site.yml, verify.yml or a path to a .yml file)") from None


def _dispatch(argv: list) -> int:
    if argv and argv[0] == "report":  # one HTML page of an inventory, from the saved state (rigbook/report.py)
        # deferred: rigbook.report costs ~110 ms at start-up (benchmarks/cli_speed.py); only report needs it
        from rigbook.report import main as report_main

        return report_main(argv[1:])
    if argv and argv[0] in SUBCOMMANDS:
        name, rest = argv[0], argv[1:]
        if name == "lab":
            # deferred: rigbook.lab.cli costs ~110 ms at start-up (benchmarks/cli_speed.py); only lab needs it
            from rigbook.lab.cli import main as lab_main

            return lab_main(rest)
        args = _sub_parser(name).parse_args(rest)
        if name == "validate":
            return _validate(args)
        if name == "runs":
            # deferred: rigbook.runs costs ~13 ms at start-up (benchmarks/cli_speed.py); --help needs none
            from rigbook.runs import print_recent

            return print_recent(args.count, sys.stdout)
        if name == "parse":
            # deferred: rigbook.parse_cmd costs ~9 ms at start-up (benchmarks/cli_speed.py); --help needs none
            from rigbook.parse_cmd import main as parse_main

            return parse_main(args.kind, args.file)
        if name == "diagnose":
            # deferred: rigbook.diagnose loads the collection's parsers and judges; --help needs none
            from rigbook.diagnose import Facts
            from rigbook.diagnose import main as diagnose_main

            return diagnose_main(args.files, args.json, Facts(vendor=args.vendor, gpus=args.gpus,
                                                              vram_gib=args.vram_gib, pcie=args.pcie, p2p=args.p2p))
        if name == "baseline":
            return _baseline(args)
        if name == "bootstrap":
            # deferred: rigbook.bootstrap costs ~150 ms at start-up (benchmarks/cli_speed.py); only bootstrap needs it
            from rigbook.bootstrap import bootstrap

            return bootstrap(args.host, args.inventory, user=args.user, identity=args.identity, pubkey=args.pubkey,
                             accept_new=args.accept_new_host_key, host_key_fingerprint=args.host_key_fingerprint)
        if name in ("manifest", "diff"):
            return _manifest_or_diff(name, args)
        if name == "adopt":
            # deferred: rigbook.adopt costs ~70 ms at start-up (benchmarks/cli_speed.py); only adopt needs it
            from rigbook.adopt import adopt_command

            return adopt_command(args.host, args.inventory, output=args.output, group=args.group, force=args.force,
                                 debs_dir=args.debs_dir, wheels_dir=args.wheels_dir)
        return _verify_or_snapshot(name, args)
    if argv and not argv[0].startswith("-"):
        _check_playbook_word(argv[0])
    args = _playbook_parser().parse_args(argv)
    # deferred: rigbook.run costs ~65 ms at start-up (benchmarks/cli_speed.py); --help, runs, parse need none
    from rigbook.run import RunOptions, run_playbook, run_rolling

    run = (lambda o: run_rolling(o, args.rolling)) if args.rolling is not None else run_playbook
    return run(
        RunOptions(
            playbook=args.playbook,
            inventory=args.inventory,
            limit=args.limit,
            tags=args.tags,
            skip_tags=args.skip_tags,
            extra_vars=args.extra_vars + _allow_unknown_vars(args.allow_unknown),
            check=args.check,
            diff=args.diff,
            forks=args.forks,
            json=args.json,
            junit=args.junit,
            verbosity=args.verbose,
            verify_builds=args.verify_builds,
        )
    )


def main(argv: list | None = None) -> int:
    return guarded(_dispatch, sys.argv[1:] if argv is None else list(argv))


if __name__ == "__main__":
    sys.exit(main())
