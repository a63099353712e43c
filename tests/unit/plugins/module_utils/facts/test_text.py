"""facts/text.py: the bounds every fact reader applies to what a box printed."""

from __future__ import annotations

from ansible_collections.rigbook.homelab.plugins.module_utils.facts import text


def test_bounded_drops_control_characters_and_cuts_to_the_limit():
    assert text.bounded("ok\x1b[31mred\x07\tand\nmore", 100) == "ok[31mred\tand\nmore"
    assert text.bounded("x" * 50, 10) == "x" * 10
    assert text.bounded(b"caf\xc3\xa9\xff") == "caf\u00e9\ufffd"
    assert text.bounded(None) is None


def test_line_is_the_first_line_stripped():
    assert text.line("  6.8.0-90-generic  \nsecond") == "6.8.0-90-generic"
    assert text.line(None) is None


def test_matching_refuses_text_outside_the_character_set_or_too_long():
    assert text.matching(" active ", r"[a-z]+") == "active"
    assert text.matching("active; rm -rf /", r"[a-z]+") is None
    assert text.matching("a" * 11, r"[a-z]+", limit=10) is None
    assert text.matching(5, r"[0-9]+") is None


def test_finite_and_integer_refuse_what_is_no_figure():
    assert text.finite("1.5") == 1.5 and text.finite(3) == 3.0
    for bad in ("nan", "inf", "-inf", True, None, "x", float("nan")):
        assert text.finite(bad) is None
    assert text.integer(" 42 ") == 42
    assert text.integer("4.2") is None and text.integer(False) is None


def test_templated_spots_every_jinja_mark():
    for marked in ("{{ lookup('pipe', 'id') }}", "{% if x %}", "{# c #}"):
        assert text.templated(marked)
    assert not text.templated("-m sglang.launch_server --port 30000")
    assert not text.templated(None)
