"""`provision bootstrap` on a bare lab host (`provision lab up --bare`): no rigbook user, key or sudoers drop-in, an
`admin` account in group sudo with a password, its host key not in the lab's known_hosts.

One test, in order (each step needs the previous one): the unknown host key refused with nothing changed on the
host, a wrong fingerprint refused, a wrong password (with --accept-new-host-key: the key printed and recorded), the
converge, ssh as rigbook with the lab key and `sudo -n true`, a second run changing nothing, a user without sudo,
then Ansible reaching the host (`provision site.yml --tags preflight`) and, with RIGBOOK_TEST_BOOTSTRAP_CONVERGE=1,
a full site.yml converge of the bootstrapped host. Uses `no_lab` (after every test of the session's lab, which it
takes down): it brings up its own one-host bare lab, and takes that down at the end. Only 127.0.0.0/8 is contacted.
"""

from __future__ import annotations

import os
import subprocess
import time

from helpers import LAB_MARKS, provision

from rigbook.lab import machine, state

pytestmark = LAB_MARKS
HOST = "lab-3080"


def _fingerprint(pub) -> str:
    return subprocess.run(["ssh-keygen", "-lf", str(pub)], capture_output=True, text=True,
                          check=True).stdout.split()[1]


def _ssh_as_rigbook(host, command: str) -> subprocess.CompletedProcess:
    return subprocess.run(machine.ssh_command(host, command), capture_output=True, text=True, timeout=60)


def test_bootstrap_bare_host(no_lab):
    up = provision("lab", "up", "--hosts", "1", "--rig", "x99-3080", "--bare", timeout=900)
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        _steps()
    finally:
        down = provision("lab", "down")
        assert down.returncode == 0, down.stderr


def _steps():
    lab = state.load()
    host = lab.host(HOST)
    assert host.bare
    inv = str(state.lab_dir() / "inventory")
    known = state.ssh_dir() / "known_hosts"
    root = host.root
    password = host.admin_password_file.read_text().strip()
    assert host.admin_password_file.stat().st_mode & 0o777 == 0o600
    fp = _fingerprint(host.dir / "ssh_host_ed25519_key.pub")
    # bare: no rigbook user, no drop-in, the host key unknown
    assert "rigbook:" not in (root / "etc/passwd").read_text()
    assert not (root / "etc/sudoers.d/rigbook").exists()
    assert "127.0.11.1" not in (known.read_text() if known.exists() else "")
    status = provision("lab", "status")
    assert f"password in {host.admin_password_file}" in status.stdout

    def boot(*args, pw=password):
        start = time.monotonic()
        proc = provision("bootstrap", HOST, "-i", inv, "--user", state.BARE_ADMIN, *args,
                         env={"RIGBOOK_BOOTSTRAP_PASSWORD": pw}, timeout=300)
        print(f"bootstrap {' '.join(args)}: rc {proc.returncode} in {time.monotonic() - start:.1f} s")
        assert "Traceback" not in proc.stderr
        return proc

    # 1. an unknown host key is refused, naming its fingerprint and the two ways to accept it; nothing changes
    proc = boot()
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"offered an unknown host key: ssh-ed25519 {fp}" in proc.stderr
    assert f"--host-key-fingerprint {fp}" in proc.stderr and "--accept-new-host-key" in proc.stderr
    assert "127.0.11.1" not in (known.read_text() if known.exists() else "")
    assert "rigbook:" not in (root / "etc/passwd").read_text()
    # 2. a fingerprint that does not match is refused, nothing recorded
    proc = boot("--host-key-fingerprint", "SHA256:" + "A" * 43)
    assert proc.returncode == 2 and "not the fingerprint given" in proc.stderr, proc.stderr
    assert "127.0.11.1" not in (known.read_text() if known.exists() else "")
    # 3. a wrong password: one line, exit 2; --accept-new-host-key printed the fingerprint and recorded the key
    proc = boot("--accept-new-host-key", pw="wrong-" + password)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.strip() == ("error: authentication failed for admin@127.0.11.1:2222 with the password "
                                   "(wrong password or key, or no such user)")
    assert f"host key: ssh-ed25519 {fp} for [127.0.11.1]:2222: accepted (--accept-new-host-key)" in proc.stdout
    pub = (host.dir / "ssh_host_ed25519_key.pub").read_text().split()
    assert f"[127.0.11.1]:2222 {pub[0]} {pub[1]}" in known.read_text().splitlines()
    # 4. the converge: user, key, sudoers drop-in (visudo-checked, 0440), python3; then ssh as rigbook works
    proc = boot()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "user     changed rigbook created" in out
    assert "key      changed" in out and "sudoers  changed /etc/sudoers.d/rigbook-rigbook" in out
    assert "visudo -cf ok" in out and "python3  ok      Python 3" in out
    assert "ready: ssh as rigbook@127.0.11.1:2222 with" in out and "sudo -n true ok" in out
    assert f"{HOST}: 3 changed (user, key, sudoers)" in out
    dropin = root / "etc/sudoers.d/rigbook-rigbook"
    assert dropin.read_text() == "rigbook ALL=(ALL) NOPASSWD: ALL\n"
    assert (dropin.stat().st_mode & 0o777, dropin.stat().st_uid) == (0o440, 0)
    assert not [p.name for p in (root / "etc/sudoers.d").iterdir() if p.name.startswith(".rigbook-")]
    ssh = _ssh_as_rigbook(host, "sudo -n true && id -un && stat -c '%a %U' ~/.ssh ~/.ssh/authorized_keys")
    assert ssh.returncode == 0, ssh.stderr
    assert ssh.stdout.split("\n")[:3] == ["rigbook", "700 rigbook", "600 rigbook"]
    # 5. a second run changes nothing and says so; the key is in authorized_keys once
    proc = boot()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"{HOST}: nothing changed (already Ansible-ready)" in proc.stdout
    assert " changed " not in proc.stdout.replace("nothing changed", "")
    lab_pub = (state.ssh_dir() / "id_ed25519.pub").read_text().split()[1]
    assert (root / "home/rigbook/.ssh/authorized_keys").read_text().count(lab_pub) == 1
    # 6. a user without sudo: one line, exit 2
    make = _ssh_as_rigbook(host, "sudo -n useradd -m -s /bin/bash plain && echo plain:plainpw | sudo -n chpasswd")
    assert make.returncode == 0, make.stderr
    proc = provision("bootstrap", HOST, "-i", inv, "--user", "plain", env={"RIGBOOK_BOOTSTRAP_PASSWORD": "plainpw"},
                     timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "error: plain on lab-3080 (127.0.11.1:2222) has no sudo" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    # 7. Ansible reaches it (facts with become, the preflight play's group_by)
    start = time.monotonic()
    proc = provision("site.yml", "-i", inv, "--limit", HOST, "--tags", "preflight", timeout=600)
    print(f"site.yml --tags preflight: rc {proc.returncode} in {time.monotonic() - start:.1f} s")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # 8. the whole site.yml converges the bootstrapped host (about 4 minutes: opt-in)
    if os.environ.get("RIGBOOK_TEST_BOOTSTRAP_CONVERGE") == "1":
        start = time.monotonic()
        proc = provision("site.yml", "-i", inv, "--limit", HOST, timeout=900)
        print(f"site.yml (full converge): rc {proc.returncode} in {time.monotonic() - start:.1f} s")
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    else:
        print("full site.yml converge skipped (RIGBOOK_TEST_BOOTSTRAP_CONVERGE=1 runs it)")
