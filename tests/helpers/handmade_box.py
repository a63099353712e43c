"""A lab box set up by hand (`provision lab handmade`) as the adopt tests look at it: the command that finds its
engine's processes and the parts of its tree that may change while adopt reads it."""

from __future__ import annotations

from rigbook.lab import handmade

# the engine stand-in's processes (an interpreter running the script, or the lab's `sglang serve` console script as
# the owner started it), not a shell whose command line names it
ENGINES = ("pgrep -f '^[^ ]*python[^ ]* (/var/cache/rigbook/artifacts/sglang-standin.py|"
           f"{handmade.CONSOLE} serve)'")
# What may change on a host while adopt reads it: logins (journal, lastlog, wtmp), Ansible's temporary files, the
# runtime folders, the engine's own log.
VOLATILE = ("proc", "sys", "dev", "run", "tmp", "var/tmp", "var/log", "home/rigbook/.ansible", "root/.ansible",
            handmade.ENGINE_LOG.lstrip("/"), "var/lib/systemd")
