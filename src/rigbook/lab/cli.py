"""`provision lab up|status|down|break|heal`: argument parsing; the work is in rigbook.lab.lab."""

from __future__ import annotations

import argparse
import os
import sys

from rigbook.errors import UserError, guarded
from rigbook.lab import lab
from rigbook.lab.faults import fault_names
from rigbook.lab.handmade import SEEDS, handmade
from rigbook.lab.hardware_trees import rig_names
from rigbook.lab.state import MAX_ADDRESS_BLOCK

USAGE_EXAMPLES = """\
examples:
  provision lab up                          # lab-3080 + lab-r9700
  provision lab up --hosts 3 --rig x99-r9700
  provision lab up --bare lab-3080          # lab-3080 as a fresh install: for `provision bootstrap`
  RIGBOOK_STATE_DIR=/tmp/lab2 provision lab up --address-block 1   # a second lab beside the first (127.1.x.x)
  provision lab status
  provision lab break lab-r9700 dma-window-above-44bit
  provision lab heal lab-r9700
  provision lab handmade lab-3080           # set up by hand as seed 000 did (--as-seed 004: an AMD rig)
  provision lab down
"""


class _Parser(argparse.ArgumentParser):
    """argparse that reports bad usage as one line (UserError, exit 2) instead of usage + exit."""

    def error(self, message):
        raise UserError(f"lab: {message} (see `provision lab --help`)")


class _DeprecatedRigAlias(argparse.Action):
    """`--profile NAME ...`: the old name of `--rig` (the lab's recorded hardware were "profiles"), still accepted
    for old scripts, hidden from --help, with a note on stderr."""

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"provision lab up: {option_string} is deprecated, use --rig", file=sys.stderr)
        setattr(namespace, self.dest, [*(getattr(namespace, self.dest) or []), *values])


def _block(text: str) -> int:
    if not text.isdigit() or int(text) > MAX_ADDRESS_BLOCK:
        raise argparse.ArgumentTypeError(f"not a whole number from 0 to {MAX_ADDRESS_BLOCK}: {text!r}")
    return int(text)


def default_block() -> int:
    """The address block of `lab up` without --address-block: $RIGBOOK_LAB_ADDRESS_BLOCK, else 0."""
    text = os.environ.get("RIGBOOK_LAB_ADDRESS_BLOCK", "").strip()
    if not text:
        return 0
    try:
        return _block(text)
    except argparse.ArgumentTypeError as err:
        raise UserError(f"RIGBOOK_LAB_ADDRESS_BLOCK: {err}") from None


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog="provision lab", description="Local simulated rigs: systemd-nspawn containers over SSH "
                "on 127.0.0.0/8 with recorded GPU hardware trees.", epilog=USAGE_EXAMPLES,
                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    up = sub.add_parser("up", help="build (once) and boot the lab hosts")
    up.add_argument("--hosts", type=int, metavar="N", help="number of hosts (default: one per rig)")
    up.add_argument("--rig", dest="rigs", action="extend", nargs="+", metavar="NAME",
                    help=f"lab rigs (recorded hardware), cycled over the hosts (known: {', '.join(rig_names())}; "
                         "default: x99-3080 x99-r9700)")
    up.add_argument("--profile", dest="rigs", action=_DeprecatedRigAlias, nargs="+", metavar="NAME",
                    help=argparse.SUPPRESS)
    up.add_argument("--bare", nargs="*", metavar="HOST",
                    help="start these hosts (no names: every host) as a fresh install: no rigbook user, key or "
                         "sudoers drop-in, an admin user with a password, the host key not in known_hosts")
    up.add_argument("--address-block", type=_block, default=None, metavar="B",
                    help="listen on 127.B.x.x (default: $RIGBOOK_LAB_ADDRESS_BLOCK, else 0): a second lab, in its "
                         "own state directory, runs beside the first in another block; a block other than 0 gets "
                         "its own inventory (printed)")
    sub.add_parser("status", help="the lab hosts, their state, boots, memory and faults")
    sub.add_parser("down", help="stop every lab host and remove what `up` made")
    brk = sub.add_parser("break", help="apply a fault to a host's recorded hardware tree")
    brk.add_argument("host")
    brk.add_argument("fault", help=f"one of: {', '.join(fault_names())}")
    heal = sub.add_parser("heal", help="restore a host's pristine hardware tree")
    heal.add_argument("host")
    made = sub.add_parser("handmade", help="set a host up by hand as the seeds' owners did, outside rigbook's roles "
                                           "(kernel .debs, the driver fork or ROCm and RCCL their way, a pip venv, "
                                           "the engine from the owner's shell): for adopt")
    made.add_argument("host")
    made.add_argument("--as-seed", choices=sorted(SEEDS), default=None,
                      help="the write-up to follow (000: an NVIDIA rig, 004: an AMD rig; default: the host's rig's)")
    return p


def run(argv: list) -> int:
    args = parser().parse_args(argv)
    if args.command == "up":
        block = default_block() if args.address_block is None else args.address_block
        return lab.up(args.hosts, args.rigs, args.bare, block)
    if args.command == "status":
        return lab.status()
    if args.command == "down":
        return lab.down()
    if args.command == "break":
        return lab.break_(args.host, args.fault)
    if args.command == "heal":
        return lab.heal(args.host)
    if args.command == "handmade":
        return handmade(args.host, args.as_seed)
    parser().print_help()
    return 2


def main(argv: list) -> int:
    return guarded(run, list(argv))
