"""Errors meant for people: the CLI prints them on one line and exits with their code."""


class UserError(Exception):
    """Bad input (usage, inventory, missing file): printed without a traceback, exit 2."""

    exit_code = 2
