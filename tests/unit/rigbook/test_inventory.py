"""rigbook/inventory.py: the hosts a plain --limit selects (Inventory.limited), whose inputs the readiness check then
needs, and vars files read as Ansible reads them (tmp inventories written here)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from rigbook import inventory
from rigbook.errors import UserError

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
    (tmp_path / "hosts.yml").write_text(HOSTS)
    (tmp_path / "group_vars/x99_3080").mkdir(parents=True)
    (tmp_path / "group_vars/x99_3080/adopted.yml").write_text("rigbook_pins: {}\n")
    inventory.load(tmp_path)  # a folder alone is read
    (tmp_path / "group_vars/x99_3080.yml").write_text("rigbook_p2p: {expected: false}\n")
    with pytest.raises(UserError, match=r"x99_3080.yml: Ansible does not read it: .* it reads the first there, "
                                        r"x99_3080; move it into group_vars/x99_3080/"):
        inventory.load(tmp_path)


UNSAFE_VARS = """\
rigbook_serve:
  - name: !unsafe "{{ lookup('pipe', 'touch MARKER') }}"
    model_path: !unsafe "/srv/models/x"
    port: !unsafe "30000"
    extra_args: [!unsafe "--enable-metrics", !unsafe ""]
    env: !unsafe {NCCL_DEBUG: "{{ x }}"}
    !unsafe "key-from-the-box": !unsafe "true"
"""


def test_ansibles_unsafe_tag_reads_as_ansible_reads_it(tmp_path):
    """`!unsafe` (what provision adopt writes for every string a box said): a value Ansible never templates. rigbook's
    reader gives the value ansible-core gives (`ansible-inventory --host` on the same files): the text for text, and,
    as ansible-core 2.19 resolves a tagged scalar as if untagged, the number for "30000"."""
    (tmp_path / "hosts.yml").write_text("all:\n  hosts:\n    box-1: {}\n")
    (tmp_path / "host_vars").mkdir()
    (tmp_path / "host_vars/box-1.yml").write_text(UNSAFE_VARS)
    ours = inventory.load(tmp_path).host_vars("box-1")
    assert ours == {"rigbook_serve": [{
        "name": "{{ lookup('pipe', 'touch MARKER') }}", "model_path": "/srv/models/x", "port": 30000,
        "extra_args": ["--enable-metrics", None], "env": {"NCCL_DEBUG": "{{ x }}"}, "key-from-the-box": True}]}
    ansible_inventory = os.path.join(os.path.dirname(sys.executable), "ansible-inventory")
    proc = subprocess.run([ansible_inventory, "-i", str(tmp_path), "--host", "box-1"], capture_output=True,
                          text=True, timeout=120, cwd=tmp_path, env={**os.environ, "ANSIBLE_NOCOLOR": "1"})
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == ours
    assert not (tmp_path / "MARKER").exists()


def test_a_key_written_twice_is_refused_with_or_without_the_unsafe_tag(tmp_path):
    (tmp_path / "hosts.yml").write_text("all:\n  hosts:\n    box-1: {}\n")
    (tmp_path / "host_vars").mkdir()
    (tmp_path / "host_vars/box-1.yml").write_text('rigbook_pins: {sglang: 1, !unsafe "sglang": 2}\n')
    with pytest.raises(UserError, match="key 'sglang' is written twice in one mapping"):
        inventory.load(tmp_path)
    (tmp_path / "host_vars/box-1.yml").write_text("a: !unsafe [x, *y]\n")
    with pytest.raises(UserError, match=r"box-1.yml:.* not valid YAML"):
        inventory.load(tmp_path)
