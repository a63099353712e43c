"""Text made safe for a terminal: the one place box text, state files and names pass before the CLI prints them
(standard library only, so every command can import it at its top without rich's start-up cost)."""

from __future__ import annotations

import re

# What a box (or a state file) may hold that a terminal would act on rather than show: C0 controls (ESC starts cursor
# moves, line erases and OSC 52 clipboard writes), DEL, C1 controls (0x9b is a one-byte CSI on some terminals) and the
# bidirectional overrides and isolates that reorder what a line seems to say. Tab is kept; newlines by request.
_UNSAFE_SET = "\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"
UNSAFE = re.compile(f"[{_UNSAFE_SET}]")
UNSAFE_LINES = re.compile(f"[\n{_UNSAFE_SET}]")


def _visible(found: re.Match) -> str:
    code = ord(found.group(0))
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def terminal_safe(value, newlines: bool = False) -> str:
    """VALUE as text a terminal shows and never obeys: every control character (ESC, CR, C1, ... and newline unless
    NEWLINES) and every bidirectional override written as a visible escape (\\x1b, \\u202e). The one place box
    text, state files and names are made safe before any console or stream of the CLI prints them."""
    text = value if isinstance(value, str) else str(value)
    return (UNSAFE if newlines else UNSAFE_LINES).sub(_visible, text)
