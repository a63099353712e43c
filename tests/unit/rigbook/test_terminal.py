"""rigbook.terminal: box text shown, never obeyed, by a terminal."""

from __future__ import annotations

from rigbook.terminal import terminal_safe

# ESC[1A ESC[2K: up a line and erase it (a "failed" line hidden); OSC 52: write the clipboard; 0x9b: a one-byte CSI;
# U+202E: right-to-left override (a line that reads otherwise than it is)
ATTACK = "\x1b[1A\x1b[2K\x1b]52;c;ZXZpbA==\x07\x9b2K\u202eok"
SHOWN = "\\x1b[1A\\x1b[2K\\x1b]52;c;ZXZpbA==\\x07\\x9b2K\\u202eok"


def test_terminal_safe_shows_every_control_character_and_bidi_override_as_an_escape():
    assert terminal_safe(ATTACK) == SHOWN
    assert terminal_safe("a\r\nb\tc\x00\x7f\x85") == "a\\x0d\\x0ab\tc\\x00\\x7f\\x85"
    assert terminal_safe("a\nb\rc", newlines=True) == "a\nb\\x0dc"
    assert terminal_safe("\u2066x\u2069\u200f\u061c") == "\\u2066x\\u2069\\u200f\\u061c"
    assert terminal_safe("rig-3080 é 🙂 [/x]") == "rig-3080 é 🙂 [/x]"  # printable text is left as it is
    assert terminal_safe(None) == "None" and terminal_safe(7) == "7"
