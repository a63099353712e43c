"""rigbook/inventory.py: the hosts a plain --limit selects (Inventory.limited), whose inputs the readiness check then
needs, and vars files read as Ansible reads them (tmp inventories written here)."""

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


def test_a_vars_file_beside_a_vars_folder_of_its_name_is_refused_as_ansible_ignores_it(tmp_path):
    import pytest

    from rigbook.errors import UserError

    (tmp_path / "hosts.yml").write_text(HOSTS)
    (tmp_path / "group_vars/x99_3080").mkdir(parents=True)
    (tmp_path / "group_vars/x99_3080/adopted.yml").write_text("rigbook_pins: {}\n")
    inventory.load(tmp_path)  # a folder alone is read
    (tmp_path / "group_vars/x99_3080.yml").write_text("rigbook_p2p: {expected: false}\n")
    with pytest.raises(UserError, match=r"x99_3080.yml: Ansible does not read it: .* it reads the first there, "
                                        r"x99_3080; move it into group_vars/x99_3080/"):
        inventory.load(tmp_path)
