"""`provision bootstrap`: known_hosts handling, fingerprints, the inventory's connection settings, argument errors,
and the host key policy against an in-process SSH server on 127.0.0.1 (paramiko; it only authenticates).

The converge itself (user, key, sudoers, python3 on a bare lab host) is tested in
tests/integration/test_four_hosts_lab.py.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import threading
from pathlib import Path

import paramiko
import pytest
import yaml
from helpers.cli import provision, provision_argv

from rigbook import bootstrap
from rigbook.errors import UserError

KEYGEN = pytest.mark.skipif(not shutil.which("ssh-keygen"), reason="needs ssh-keygen (openssh-client)")


def _keypair(tmp_path: Path, name: str = "key") -> Path:
    path = tmp_path / name
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", name, "-f", str(path)], check=True)
    return path


# --- fingerprints and known_hosts -------------------------------------------------------------------------------


@KEYGEN
def test_fingerprint_is_ssh_keygens(tmp_path):
    path = _keypair(tmp_path)
    want = subprocess.run(["ssh-keygen", "-lf", f"{path}.pub"], capture_output=True, text=True,
                          check=True).stdout.split()[1]
    key = paramiko.Ed25519Key.from_private_key_file(str(path))
    assert bootstrap.fingerprint(key) == want
    assert want.startswith("SHA256:") and not want.endswith("=")


def test_normalize_fingerprint():
    fp = "SHA256:" + "A" * 43
    assert bootstrap.normalize_fingerprint(fp) == fp
    assert bootstrap.normalize_fingerprint("A" * 43) == fp
    assert bootstrap.normalize_fingerprint(f" {fp}= ") == fp
    for bad in ("", "SHA256:short", "MD5:" + "A" * 43, "SHA256:" + "!" * 43):
        with pytest.raises(UserError, match="not a SHA256 fingerprint"):
            bootstrap.normalize_fingerprint(bad)


def test_known_hosts_name():
    assert bootstrap.known_hosts_name("127.0.11.5", 22) == "127.0.11.5"
    assert bootstrap.known_hosts_name("127.0.11.1", 2222) == "[127.0.11.1]:2222"


@pytest.fixture
def hostkey():
    return paramiko.ECDSAKey.generate()


def test_lookup_plain_port_and_hashed_entries(tmp_path, hostkey):
    other = paramiko.ECDSAKey.generate()
    name = "[127.0.0.9]:2222"
    hashed = paramiko.HostKeys.hash_host("127.0.0.7")
    kh = tmp_path / "known_hosts"
    kh.write_text(
        "# a comment\n"
        f"{name} {hostkey.get_name()} {hostkey.get_base64()}\n"
        f"{hashed} {other.get_name()} {other.get_base64()}\n"
        f"[127.0.0.7]:2200,[127.0.0.8]:2200 {other.get_name()} {other.get_base64()}\n"
    )
    found = bootstrap.lookup_known(kh, "127.0.0.9", 2222)
    assert bootstrap.fingerprint(found[hostkey.get_name()]) == bootstrap.fingerprint(hostkey)
    assert bootstrap.lookup_known(kh, "127.0.0.9", 22) == {}  # another port is another host
    assert bootstrap.fingerprint(bootstrap.lookup_known(kh, "127.0.0.7", 22)[other.get_name()]) == \
        bootstrap.fingerprint(other)  # hashed entry
    assert bootstrap.lookup_known(kh, "127.0.0.8", 2200)  # a list of names
    assert bootstrap.lookup_known(tmp_path / "missing", "127.0.0.9", 2222) == {}


def test_record_host_key_appends_once_per_call(tmp_path, hostkey):
    kh = tmp_path / "ssh" / "known_hosts"
    line = bootstrap.record_host_key(kh, "[127.0.0.9]:2222", hostkey)
    assert line == f"[127.0.0.9]:2222 {hostkey.get_name()} {hostkey.get_base64()}"
    assert kh.read_text() == line + "\n"
    assert kh.stat().st_mode & 0o777 == 0o600
    kh.write_text(kh.read_text() + "[127.0.0.10]:22 ssh-ed25519 AAAA")  # no final newline
    bootstrap.record_host_key(kh, "127.0.0.11", hostkey)
    assert kh.read_text().splitlines()[-1].startswith("127.0.0.11 ")
    assert bootstrap.lookup_known(kh, "127.0.0.9", 2222)


@pytest.mark.parametrize("args, want", [
    ("-o StrictHostKeyChecking=yes -o UserKnownHostsFile=/x/known_hosts", "/x/known_hosts"),
    ("-oUserKnownHostsFile=/y/kh", "/y/kh"),
    ("-o 'UserKnownHostsFile /z/kh /z/kh2'", "/z/kh"),
    ("-o userknownhostsfile=/w/kh", "/w/kh"),
])
def test_known_hosts_file(args, want):
    assert bootstrap.known_hosts_file(args) == Path(want)


def test_known_hosts_file_default():
    assert bootstrap.known_hosts_file(None) == Path.home() / ".ssh" / "known_hosts"
    assert bootstrap.known_hosts_file("-o StrictHostKeyChecking=yes") == Path.home() / ".ssh" / "known_hosts"


@KEYGEN
def test_read_pubkey(tmp_path):
    path = _keypair(tmp_path)
    line, match = bootstrap.read_pubkey(Path(f"{path}.pub"))
    assert line.startswith("ssh-ed25519 ") and line.endswith(" key")
    assert match == " ".join(line.split()[:2])
    bad = tmp_path / "bad.pub"
    for text in ("", "not a key\n", f"{line}\n{line}\n", "ssh-ed25519 !!!notbase64\n"):
        bad.write_text(text)
        with pytest.raises(UserError):
            bootstrap.read_pubkey(bad)
    with pytest.raises(UserError, match="cannot read the public key"):
        bootstrap.read_pubkey(tmp_path / "missing.pub")


def test_parse_steps():
    steps, failure = bootstrap.parse_steps("rigbook-root-ok\nrigbook-step user changed rigbook created\n"
                                           "noise\nrigbook-step python3 ok Python 3.11.2\n")
    assert [(s.name, s.status, s.detail) for s in steps] == [("user", "changed", "rigbook created"),
                                                              ("python3", "ok", "Python 3.11.2")]
    assert failure is None
    assert bootstrap.parse_steps("rigbook-fail sudoers visudo -cf refused\n")[1] == "sudoers visudo -cf refused"


# --- the lab's bare hosts (planning only; booting them: tests/integration/test_four_hosts_lab.py) --------------


def test_lab_plan_bare_hosts():
    from rigbook.lab import state

    assert [h.bare for h in state.plan_hosts(None, None)] == [False, False]
    assert [h.bare for h in state.plan_hosts(None, None, [])] == [True, True]
    assert [(h.name, h.bare) for h in state.plan_hosts(None, None, ["lab-r9700"])] == [
        ("lab-3080", False), ("lab-r9700", True)]
    with pytest.raises(UserError, match=r"--bare lab-9: not a host of this lab \(hosts: lab-3080\)"):
        state.plan_hosts(1, ["x99-3080"], ["lab-9"])


def test_lab_cli_bare_argument():
    from rigbook.lab.cli import parser

    assert parser().parse_args(["up"]).bare is None
    assert parser().parse_args(["up", "--bare"]).bare == []
    assert parser().parse_args(["up", "--hosts", "1", "--bare", "lab-3080"]).bare == ["lab-3080"]


# --- the inventory ----------------------------------------------------------------------------------------------


def _inventory(tmp_path: Path, port: int, user: str = "rigbook", **extra) -> Path:
    inv = tmp_path / "inv"
    (inv / "group_vars").mkdir(parents=True)
    (inv / "hosts.yml").write_text(yaml.safe_dump({"all": {"hosts": {"box": {
        "ansible_host": "127.0.0.1", "ansible_port": port}}}}))
    (inv / "group_vars" / "all.yml").write_text(yaml.safe_dump({
        "ssh_dir": str(tmp_path / "ssh"), "ansible_user": user,
        "ansible_ssh_private_key_file": "{{ ssh_dir }}/id_ed25519",
        "ansible_ssh_common_args": "-o StrictHostKeyChecking=yes -o UserKnownHostsFile={{ ssh_dir }}/known_hosts",
        **extra}))
    return inv


def test_load_target_templates_the_inventory(tmp_path):
    target = bootstrap.load_target(str(_inventory(tmp_path, 2299)), "box")
    assert (target.address, target.port, target.ansible_user) == ("127.0.0.1", 2299, "rigbook")
    assert target.private_key == tmp_path / "ssh" / "id_ed25519"
    assert target.known_hosts == tmp_path / "ssh" / "known_hosts"


def test_load_target_lab_inventory(monkeypatch, tmp_path):
    monkeypatch.setenv("RIGBOOK_STATE_DIR", str(tmp_path))
    target = bootstrap.load_target("lab", "lab-3080")
    assert (target.address, target.port, target.ansible_user) == ("127.0.11.1", 2222, "rigbook")
    assert target.known_hosts == tmp_path.resolve() / "lab" / "ssh" / "known_hosts"


def test_load_target_errors(tmp_path):
    with pytest.raises(UserError, match=r"no host 'nope' in inventory .* \(hosts: box\)"):
        bootstrap.load_target(str(_inventory(tmp_path, 22)), "nope")
    with pytest.raises(UserError, match="not a plain user name"):
        bootstrap.load_target(str(_inventory(tmp_path / "b", 22, user="first.last")), "box")


# --- through the CLI: bad input, unreachable --------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("args, message", [
    (["box"], "the following arguments are required: -i/--inventory"),
    (["box", "-i", "INV", "--accept-new-host-key", "--host-key-fingerprint", "SHA256:" + "A" * 43],
     "not allowed with argument"),
    (["box", "-i", "INV", "--host-key-fingerprint", "nope"], "is not a SHA256 fingerprint"),
    (["box", "-i", "INV", "--identity", "/nonexistent/key"], "--identity /nonexistent/key: no such file"),
    (["other", "-i", "INV"], "no host 'other' in inventory"),
    (["box", "-i", "INV", "--pubkey", "/nonexistent/key.pub"], "cannot read the public key"),
])
def test_bad_input_exits_2(tmp_path, args, message):
    inv = _inventory(tmp_path, _free_port())
    proc = provision("bootstrap", *[str(inv) if a == "INV" else a for a in args],
                     env={"RIGBOOK_BOOTSTRAP_PASSWORD": "x"})
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr


@KEYGEN
def test_no_password_without_a_terminal(tmp_path):
    (tmp_path / "ssh").mkdir()
    _keypair(tmp_path / "ssh", "id_ed25519")
    proc = subprocess.run(provision_argv("bootstrap", "box", "-i", _inventory(tmp_path, _free_port())),
                          capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=60,
                          env={k: v for k, v in os.environ.items() if k != bootstrap.PASSWORD_ENV})
    assert proc.returncode == 2
    assert "there is no terminal to ask on: set RIGBOOK_BOOTSTRAP_PASSWORD" in proc.stderr


@KEYGEN
def test_unreachable_exits_3(tmp_path):
    (tmp_path / "ssh").mkdir()
    _keypair(tmp_path / "ssh", "id_ed25519")
    port = _free_port()  # nothing listens there
    proc = provision("bootstrap", "box", "-i", _inventory(tmp_path, port), env={"RIGBOOK_BOOTSTRAP_PASSWORD": "x"})
    assert proc.returncode == 3, proc.stderr
    assert f"error: box (127.0.0.1:{port}) is unreachable: connection refused" in proc.stderr
    assert "Traceback" not in proc.stderr


# --- host key policy against an SSH server on 127.0.0.1 ---------------------------------------------------------


class _Server(paramiko.ServerInterface):
    def check_auth_password(self, username, password):
        ok = (username, password) == ("admin", "secret")
        return paramiko.AUTH_SUCCESSFUL if ok else paramiko.AUTH_FAILED

    def get_allowed_auths(self, username):
        return "password"


@pytest.fixture
def sshd():
    """An SSH server on 127.0.0.1 that authenticates admin/secret and nothing more: (port, its host key)."""
    key = paramiko.Ed25519Key.from_private_key_file(str(_server_key()))
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    stop = threading.Event()
    transports = []

    def serve():
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                sock, _ = listener.accept()
            except OSError:
                continue
            t = paramiko.Transport(sock)
            t.add_server_key(key)
            transports.append(t)
            try:
                t.start_server(server=_Server())
            except (paramiko.SSHException, EOFError):
                pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield listener.getsockname()[1], key
    stop.set()
    thread.join(5)
    listener.close()
    for t in transports:
        t.close()


_SERVER_KEY: list = []


def _server_key() -> Path:
    if not _SERVER_KEY:
        import tempfile

        path = Path(tempfile.mkdtemp(prefix="rigbook-sshd-")) / "host_ed25519"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
        _SERVER_KEY.append(path)
    return _SERVER_KEY[0]


def _target(tmp_path, port) -> bootstrap.Target:
    return bootstrap.Target(name="box", inventory=tmp_path, address="127.0.0.1", port=port, ansible_user="rigbook",
                            private_key=None, known_hosts=tmp_path / "ssh" / "known_hosts")


@KEYGEN
def test_unknown_host_key_refused(tmp_path, sshd):
    port, key = sshd
    target = _target(tmp_path, port)
    with pytest.raises(UserError) as err:
        bootstrap.connect(target, "admin", password="secret")
    fp = bootstrap.fingerprint(key)
    assert f"offered an unknown host key: ssh-ed25519 {fp}" in str(err.value)
    assert f"--host-key-fingerprint {fp}" in str(err.value) and "--accept-new-host-key" in str(err.value)
    assert not target.known_hosts.exists()


@KEYGEN
def test_host_key_fingerprint_mismatch_refused(tmp_path, sshd):
    port, _key = sshd
    target = _target(tmp_path, port)
    policy = bootstrap.host_key_policy(target, expected="SHA256:" + "A" * 43)
    with pytest.raises(UserError, match="not the fingerprint given"):
        bootstrap.connect(target, "admin", password="secret", policy=policy)
    assert not target.known_hosts.exists()


@KEYGEN
@pytest.mark.parametrize("how", ["fingerprint", "accept-new"])
def test_host_key_accepted_is_recorded_then_known(tmp_path, sshd, capsys, how):
    port, key = sshd
    target = _target(tmp_path, port)
    fp = bootstrap.fingerprint(key)
    policy = bootstrap.host_key_policy(target, accept_new=how == "accept-new",
                                       expected=fp if how == "fingerprint" else None)
    bootstrap.connect(target, "admin", password="secret", policy=policy).close()
    out = capsys.readouterr().out
    assert f"host key: ssh-ed25519 {fp} for [127.0.0.1]:{port}" in out and "recorded in" in out
    assert target.known_hosts.read_text() == f"[127.0.0.1]:{port} ssh-ed25519 {key.get_base64()}\n"
    bootstrap.connect(target, "admin", password="secret").close()  # now known: the default policy lets it in
    assert len(target.known_hosts.read_text().splitlines()) == 1


@KEYGEN
def test_hashed_known_hosts_entry_is_used(tmp_path, sshd):
    port, key = sshd
    target = _target(tmp_path, port)
    target.known_hosts.parent.mkdir()
    hashed = paramiko.HostKeys.hash_host(f"[127.0.0.1]:{port}")
    target.known_hosts.write_text(f"{hashed} ssh-ed25519 {key.get_base64()}\n")
    bootstrap.connect(target, "admin", password="secret").close()


@KEYGEN
def test_changed_host_key_refused_never_replaced(tmp_path, sshd):
    port, _key = sshd
    target = _target(tmp_path, port)
    target.known_hosts.parent.mkdir()
    old = paramiko.Ed25519Key.from_private_key_file(str(_keypair(tmp_path, "old")))
    text = f"[127.0.0.1]:{port} ssh-ed25519 {old.get_base64()}\n"
    target.known_hosts.write_text(text)
    policy = bootstrap.host_key_policy(target, accept_new=True)
    with pytest.raises(bootstrap.HostFailed, match="the host key CHANGED") as err:
        bootstrap.connect(target, "admin", password="secret", policy=policy)
    assert err.value.exit_code == 1
    assert bootstrap.fingerprint(old) in str(err.value)
    assert target.known_hosts.read_text() == text


@KEYGEN
def test_wrong_password_through_the_cli(tmp_path, sshd):
    port, key = sshd
    (tmp_path / "ssh").mkdir()
    _keypair(tmp_path / "ssh", "id_ed25519")
    (tmp_path / "ssh" / "known_hosts").write_text(f"[127.0.0.1]:{port} ssh-ed25519 {key.get_base64()}\n")
    proc = provision("bootstrap", "box", "-i", _inventory(tmp_path, port), "--user", "admin",
                     env={"RIGBOOK_BOOTSTRAP_PASSWORD": "wrong"})
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == (f"error: authentication failed for admin@127.0.0.1:{port} with the password "
                                   "(wrong password or key, or no such user)")
