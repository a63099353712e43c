"""rigbook.runs: which inventory a run record belongs to (runs.inventory_key_of, over paths.inventory_key), for the
records run.py writes now and those an older rigbook wrote."""

from __future__ import annotations

import pytest

from rigbook import paths, runs


def test_a_record_belongs_to_the_inventory_key_it_recorded(tmp_path):
    key = paths.inventory_key(tmp_path / "inv")
    assert runs.INVENTORY_KEY.fullmatch(key)
    assert runs.inventory_key_of({"inventory": str(tmp_path / "inv"), "inventory_key": key}) == key
    # the key it recorded decides, not the path beside it
    other = paths.inventory_key(tmp_path / "other")
    assert runs.inventory_key_of({"inventory": str(tmp_path / "inv"), "inventory_key": other}) == other


def test_an_older_record_belongs_to_the_inventory_path_it_names(tmp_path):
    inv = tmp_path / "inv"
    inv.mkdir()
    link = tmp_path / "link"
    link.symlink_to(inv)
    assert runs.inventory_key_of({"inventory": str(inv)}) == paths.inventory_key(inv)
    assert runs.inventory_key_of({"inventory": str(link)}) == paths.inventory_key(inv)  # resolved: the same one
    assert paths.inventory_key(inv) != paths.inventory_key(tmp_path / "inv_fork")


@pytest.mark.parametrize("record", [
    {}, {"inventory": "inventory/lab"}, {"inventory": "/a\0b"}, {"inventory": "/inv", "inventory_key": "{{ x }}"},
    {"inventory": "/inv", "inventory_key": "0123456789ABCDEF"}, {"inventory": "/inv", "inventory_key": "0" * 17},
], ids=repr)
def test_a_record_of_no_known_inventory_belongs_to_none(record):
    """No path, a relative one (of no known folder), one that is no path, or a key not of paths.inventory_key's
    shape: None, so the run is shown for no inventory (never the wrong one, never a traceback)."""
    assert runs.inventory_key_of(record) is None


def test_record_problem_types_the_inventory_key():
    assert runs.record_problem({"inventory_key": ["x"]}) == "inventory_key is not a string but list"
    assert runs.record_problem({"inventory_key": "0123456789abcdef"}) is None
