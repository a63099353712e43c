"""Inventory.limited: the hosts a plain --limit selects, whose inputs the readiness check then needs (tmp
inventories written here)."""

from __future__ import annotations

from rigbook import inventory

HOSTS = """\
all:
  children:
    x99_3080:
      hosts: {a: {}, b: {}}
    x99_r9700:
      hosts: {c: {}}
"""


def _inv(tmp_path):
    (tmp_path / "hosts.yml").write_text(HOSTS)
    return inventory.load(tmp_path / "hosts.yml")


def test_a_plain_limit_selects_its_hosts_and_groups(tmp_path):
    inv = _inv(tmp_path)
    assert inv.limited("a") == ["a"]
    assert inv.limited("x99_r9700,a") == ["a", "c"]
    assert inv.limited("b:c") == ["b", "c"]
    assert inv.limited("nobody") == []


def test_no_limit_or_a_pattern_leaves_every_host_to_ansible(tmp_path):
    inv = _inv(tmp_path)
    for limit in (None, "", "x99*", "all:!a", "@retry"):
        assert inv.limited(limit) == ["a", "b", "c"]
