"""`provision adopt` for real on this machine (inventory/localhost: a local connection, this machine's own /proc,
dpkg-query and apt-cache policy): the file written, then refused without --force, replaced with it."""

from __future__ import annotations

import shutil
from pathlib import Path

from helpers.cli import REPO, provision

from rigbook.adopt import emit


def test_adopt_this_machine_writes_what_it_runs_and_never_overwrites_without_force(tmp_path):
    inv = tmp_path / "inv"
    inv.mkdir()
    shutil.copy(REPO / "inventory/localhost/hosts.yml", inv / "hosts.yml")
    env = {"RIGBOOK_STATE_DIR": str(tmp_path / "state")}
    proc = provision("adopt", "localhost", "-i", inv, env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    written = inv / "host_vars/localhost.yml"
    data = emit.load(written.read_text())
    release = Path("/proc/sys/kernel/osrelease").read_text().strip()
    booted_by_itself = (Path(f"/lib/modules/{release}").is_dir() or Path("/sys/firmware/efi").is_dir()
                        or Path("/etc/default/grub").exists())
    if booted_by_itself:
        assert data["rigbook_pins"]["kernel"]["release"] == release
        assert "# /proc/sys/kernel/osrelease (the running kernel)" in written.read_text()
    else:  # a machine its host boots (a container or VM, as CI's): its kernel and driver are not rigbook's to manage
        assert data["rigbook_manage"] == {"kernel": False, "nvidia_driver": False}
        assert "kernel" not in data.get("rigbook_pins", {})
    assert f"wrote {written}" in proc.stdout and "validates with localhost.yml" in proc.stdout
    again = provision("adopt", "localhost", "-i", inv, env=env, timeout=300)
    assert again.returncode == 2 and "exists; --force replaces it" in again.stderr
    written.write_text("# edited by hand\n")
    forced = provision("adopt", "localhost", "-i", inv, "--force", env=env, timeout=300)
    assert forced.returncode == 0, forced.stderr[-3000:]
    assert emit.load(written.read_text()) == data
