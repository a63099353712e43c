"""Errors meant for people: the CLI prints them on one line and exits with their code.

Exit codes: 0 fine, 1 a host failed, 2 bad input (UserError: usage, inventory, a corrupt baselines file),
3 only unreachable hosts, 4 the state directory is busy with another run (StateBusy), 130 interrupted."""

from __future__ import annotations

import sys

from rigbook.terminal import terminal_safe


class Reported(Exception):
    """An error printed on one line without a traceback; the process exits with exit_code."""

    exit_code = 1


class UserError(Reported):
    """Bad input (usage, inventory, missing file): printed without a traceback, exit 2."""

    exit_code = 2


class StateBusy(Reported):
    """Another `provision` run holds the state directory's run lock: printed on one line, exit 4."""

    exit_code = 4


def guarded(command, argv: list) -> int:
    """COMMAND(argv)'s exit code; a Reported error is printed on one line, Ctrl-C exits 130."""
    try:
        return command(argv)
    except Reported as exc:
        print(terminal_safe(f"error: {exc}", newlines=True), file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
