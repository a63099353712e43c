"""`provision bootstrap HOST -i INV`: a bare Debian/Ubuntu host, reached over SSH as an existing user, made
Ansible-ready (Fabric).

What it leaves on the host: the inventory's `ansible_user` (created when missing), the given public key in that
user's ~/.ssh/authorized_keys (once), a sudoers drop-in `/etc/sudoers.d/rigbook-<user>` (checked with `visudo -cf`
before it is put in place, atomically, 0440), python3. Each step is reported as changed or ok, so a second run says
that nothing changed. Then it logs in again as `ansible_user` with the private key and runs `sudo -n true`.

Host keys stay checked. Fabric's Connection sets paramiko's AutoAddPolicy and loads no known_hosts (fabric#2071);
here every connection loads the inventory's known_hosts (the `UserKnownHostsFile=` of the host's
ansible_ssh_common_args, else ~/.ssh/known_hosts) and gets a RejectPolicy: an unknown key is refused with its type
and SHA256 fingerprint, unless the user passes that fingerprint (--host-key-fingerprint) or --accept-new-host-key;
then it is appended to that file as `[address]:port type base64`. A changed key is always refused, never replaced.

Exit codes: 0 ready, 1 the host failed (a step, the final check, a changed host key), 2 bad input (arguments, the
inventory, an unknown host key not accepted or a fingerprint that does not match, a wrong password, a user
without sudo), 3 unreachable, 130 interrupted.
"""

from __future__ import annotations

import base64
import contextlib
import getpass
import hashlib
import io
import os
import re
import shlex
import socket
import sys
from dataclasses import dataclass
from pathlib import Path

import paramiko
from fabric import Config, Connection

from rigbook.errors import Reported, UserError
from rigbook.run import ansible_env, resolve_inventory

PASSWORD_ENV = "RIGBOOK_BOOTSTRAP_PASSWORD"
CONNECT_TIMEOUT = 10  # seconds: an unreachable host fails fast
COMMAND_TIMEOUT = 900  # the root script (an apt-get install of python3 included)
DPKG_LOCK_TIMEOUT = 300  # seconds apt waits for the dpkg lock before giving up
USER_NAME = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")  # no dots: sudo skips /etc/sudoers.d files with a '.'
FINGERPRINT = re.compile(r"^(?:SHA256:)?([A-Za-z0-9+/]{43})=?$")


class HostFailed(Reported):
    """The host did not become ready (a step failed, the final check failed, its host key changed): exit 1."""

    exit_code = 1


class Unreachable(Reported):
    """No SSH connection (refused, timed out, no route, no such name): exit 3, as for playbook runs."""

    exit_code = 3


# --- host keys --------------------------------------------------------------------------------------------------


def blob_fingerprint(blob: bytes) -> str:
    """OpenSSH's SHA256 fingerprint of a public key blob: `SHA256:` and the unpadded base64 of its sha256."""
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


def fingerprint(key) -> str:
    """The SHA256 fingerprint of a paramiko key (as `ssh-keygen -lf` prints it)."""
    return blob_fingerprint(key.asbytes())


def normalize_fingerprint(text: str) -> str:
    """`SHA256:<43 base64 chars>` from what a user typed (the prefix and a trailing '=' optional); UserError else."""
    match = FINGERPRINT.match(text.strip())
    if not match:
        raise UserError(f"--host-key-fingerprint {text!r} is not a SHA256 fingerprint (like SHA256:"
                        "AbC...43 characters, as `ssh-keygen -lf` or this command prints it)")
    return "SHA256:" + match.group(1)


def known_hosts_name(address: str, port: int) -> str:
    """How known_hosts names a host: the bare address on port 22, else `[address]:port`."""
    return address if int(port) == 22 else f"[{address}]:{port}"


def load_known_hosts(path: Path):
    """paramiko.HostKeys of PATH (hashed and `[host]:port` entries included); empty when the file is missing."""
    keys = paramiko.HostKeys()
    if path.is_file():
        try:
            keys.load(str(path))
        except (OSError, paramiko.SSHException, ValueError) as exc:
            raise UserError(f"cannot read known_hosts {path}: {exc}") from None
    return keys


def lookup_known(path: Path, address: str, port: int) -> dict:
    """{key type: paramiko key} that PATH records for ADDRESS:PORT (empty when none)."""
    found = load_known_hosts(path).lookup(known_hosts_name(address, port))
    return dict(found) if found else {}


def record_host_key(path: Path, hostname: str, key) -> str:
    """Append `HOSTNAME type base64` to the known_hosts file PATH (made 0600 with its directory when missing)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    line = f"{hostname} {key.get_name()} {key.get_base64()}\n"
    existing = path.read_text() if path.is_file() else ""
    with open(path, "a") as fh:
        if existing and not existing.endswith("\n"):
            fh.write("\n")
        fh.write(line)
    if not existing:
        path.chmod(0o600)
    return line.strip()


def known_hosts_file(common_args: str | None) -> Path:
    """The file named by `UserKnownHostsFile=` in an ansible_ssh_common_args string (first one), else
    ~/.ssh/known_hosts (what ssh reads by default)."""
    words = shlex.split(common_args or "")
    for i, word in enumerate(words):
        value = None
        if word in ("-o",) and i + 1 < len(words):
            value = words[i + 1]
        elif word.startswith("-o") and len(word) > 2:
            value = word[2:]
        if value:
            name, _, setting = value.partition("=")
            if not setting:
                name, _, setting = value.partition(" ")
            if name.strip().lower() == "userknownhostsfile" and setting.strip():
                return Path(os.path.expanduser(setting.strip().split()[0]))
    return Path.home() / ".ssh" / "known_hosts"


def _refuse_unknown_message(target, key, hostname: str) -> str:
    fp = fingerprint(key)
    return (f"{target.name} ({hostname}) offered an unknown host key: {key.get_name()} {fp}, not in "
            f"{target.known_hosts}. Check it on the host (ssh-keygen -lf /etc/ssh/ssh_host_*_key.pub), then rerun "
            f"with --host-key-fingerprint {fp} (or --accept-new-host-key) to record it")


def host_key_policy(target, accept_new: bool = False, expected: str | None = None, out=None):
    """A paramiko RejectPolicy that records an unknown key only when it is accepted explicitly."""
    class Policy(paramiko.RejectPolicy):
        def missing_host_key(self, client, hostname, key):
            fp = fingerprint(key)
            if expected is not None and fp != expected:
                raise UserError(f"{target.name} ({hostname}) offered host key {key.get_name()} {fp}, not the "
                                f"fingerprint given ({expected}): refused, nothing recorded")
            if expected is None and not accept_new:
                raise UserError(_refuse_unknown_message(target, key, hostname))
            record_host_key(target.known_hosts, hostname, key)
            client.get_host_keys().add(hostname, key.get_name(), key)
            how = "matches --host-key-fingerprint" if expected else "accepted (--accept-new-host-key)"
            print(f"host key: {key.get_name()} {fp} for {hostname}: {how}; recorded in {target.known_hosts}",
                  file=out or sys.stdout)

    return Policy()


# --- the inventory ----------------------------------------------------------------------------------------------


@dataclass
class Target:
    name: str
    inventory: Path
    address: str
    port: int
    ansible_user: str
    private_key: Path | None
    known_hosts: Path

    @property
    def where(self) -> str:
        return f"{self.address}:{self.port}"


def _ansible_env() -> None:
    """What the inventory's templates read (RIGBOOK_STATE_DIR as `provision` exports it), set before Ansible loads."""
    env = ansible_env(mitogen=False)  # what a playbook run of this inventory gets
    os.environ["RIGBOOK_STATE_DIR"] = env["RIGBOOK_STATE_DIR"]
    os.environ.setdefault("ANSIBLE_INVENTORY_IGNORE", env["ANSIBLE_INVENTORY_IGNORE"])
    os.environ.setdefault("ANSIBLE_INVENTORY_UNPARSED_WARNING", "False")
    os.environ.setdefault("ANSIBLE_LOCALHOST_WARNING", "False")


_PLUGINS_READY = False


def load_target(inventory: str, name: str) -> Target:
    """HOST's connection settings from INVENTORY, templated by Ansible itself (InventoryManager, VariableManager,
    Templar), so `{{ lab_ssh_dir }}` and its lookups resolve as they do for a playbook run."""
    path = resolve_inventory(inventory)
    _ansible_env()
    with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
        # deferred: Ansible reads its ANSIBLE_* settings when imported: after _ansible_env() sets them, and under
        # this redirect, which keeps its import-time warnings off the terminal
        from ansible.inventory.manager import InventoryManager
        from ansible.parsing.dataloader import DataLoader
        from ansible.plugins.loader import init_plugin_loader
        from ansible.template import Templar
        from ansible.vars.manager import VariableManager

        global _PLUGINS_READY
        if not _PLUGINS_READY:
            init_plugin_loader([])
            _PLUGINS_READY = True
        loader = DataLoader()
        inv = InventoryManager(loader=loader, sources=[str(path)])
        host = inv.get_host(name)
        names = sorted(h.name for h in inv.get_hosts())
    if host is None:
        raise UserError(f"no host {name!r} in inventory {path} (hosts: {', '.join(names) or 'none'})")
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            hostvars = VariableManager(loader=loader, inventory=inv).get_vars(host=host)
            templar = Templar(loader=loader, variables=hostvars)

            def var(*keys, default=None):
                for key in keys:
                    if hostvars.get(key) is not None:
                        return templar.template(hostvars[key])
                return default

            address = str(var("ansible_host", "ansible_ssh_host", default=name))
            port = int(var("ansible_port", "ansible_ssh_port", default=22))
            user = var("ansible_user", "ansible_ssh_user")
            key = var("ansible_ssh_private_key_file", "ansible_private_key_file")
            common = var("ansible_ssh_common_args")
    except Exception as exc:  # noqa: BLE001 - a template or lookup error in the inventory: bad input
        raise UserError(f"inventory {path}: cannot resolve {name}'s connection variables: "
                        f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from None
    if not user:
        raise UserError(f"inventory {path}: {name} has no ansible_user (the account to create)")
    user = str(user)
    if not USER_NAME.match(user):
        raise UserError(f"inventory {path}: ansible_user {user!r} of {name} is not a plain user name "
                        "(lower case letters, digits, '_' and '-'; sudo ignores sudoers.d files with a '.')")
    return Target(name=name, inventory=path, address=address, port=port, ansible_user=user,
                  private_key=Path(os.path.expanduser(str(key))) if key else None,
                  known_hosts=known_hosts_file(common))


# --- the public key ---------------------------------------------------------------------------------------------


def read_pubkey(path: Path) -> tuple:
    """(whole line, 'type base64') of an OpenSSH public key file; UserError when it is not one."""
    try:
        lines = [ln.strip() for ln in path.read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    except OSError as exc:
        raise UserError(f"cannot read the public key {path}: {exc.strerror}") from None
    words = lines[0].split() if len(lines) == 1 else []
    if len(words) < 2 or not (words[0].startswith(("ssh-", "ecdsa-", "sk-"))):
        raise UserError(f"{path} is not one OpenSSH public key line (like `ssh-ed25519 AAAA... comment`)")
    try:
        base64.b64decode(words[1], validate=True)
    except ValueError:
        raise UserError(f"{path}: the key's base64 is damaged") from None
    return lines[0], f"{words[0]} {words[1]}"


def default_pubkey(target: Target) -> Path:
    """The key to install: the inventory's private key + .pub, else ~/.ssh/id_ed25519.pub."""
    if target.private_key and Path(f"{target.private_key}.pub").is_file():
        return Path(f"{target.private_key}.pub")
    fallback = Path.home() / ".ssh" / "id_ed25519.pub"
    if fallback.is_file():
        return fallback
    where = f"{target.private_key}.pub nor " if target.private_key else ""
    raise UserError(f"no public key to install for {target.ansible_user}: neither {where}{fallback} exists "
                    "(give --pubkey FILE)")


# --- connecting -------------------------------------------------------------------------------------------------


def connect(target: Target, user: str, *, password: str | None = None, key_file: Path | None = None,
            policy=None, timeout: int = CONNECT_TIMEOUT):
    """An open fabric Connection to TARGET as USER: the inventory's known_hosts loaded, unknown keys handled by
    POLICY (default: refused), a changed key refused; every failure a one-line Reported error."""
    connect_kwargs = {"look_for_keys": False, "allow_agent": False, "banner_timeout": timeout,
                      "auth_timeout": timeout}
    if key_file:
        connect_kwargs["key_filename"] = str(key_file)
    else:
        connect_kwargs["password"] = password or ""
    config = Config(overrides={"load_ssh_configs": False, "run": {"hide": True, "warn": True}})
    conn = Connection(host=target.address, port=target.port, user=user, config=config, connect_timeout=timeout,
                      connect_kwargs=connect_kwargs)
    # Fabric's Connection set AutoAddPolicy and loaded nothing: load the inventory's known_hosts and reject.
    if target.known_hosts.is_file():
        conn.client.load_host_keys(str(target.known_hosts))
    conn.client.set_missing_host_key_policy(policy or host_key_policy(target))
    who = f"{user}@{target.where}"
    try:
        conn.open()
    except paramiko.BadHostKeyException as exc:
        conn.close()
        raise HostFailed(f"{target.name} ({target.where}) offered {exc.key.get_name()} {fingerprint(exc.key)} but "
                         f"{target.known_hosts} records {exc.expected_key.get_name()} "
                         f"{fingerprint(exc.expected_key)} for it: the host key CHANGED (a reinstall, or someone "
                         "in between). Refused; nothing changed. If the change is expected, remove the old line "
                         f"(ssh-keygen -R '{known_hosts_name(target.address, target.port)}' -f {target.known_hosts}) "
                         "and rerun") from None
    except paramiko.BadAuthenticationType as exc:
        conn.close()
        allowed = ", ".join(exc.allowed_types) or "none"
        raise UserError(f"{who}: the server does not take this kind of login (it allows: {allowed}); "
                        f"{'give --identity KEY' if not key_file else 'use a password'}") from None
    except paramiko.PasswordRequiredException:
        conn.close()
        raise UserError(f"{key_file}: the private key is encrypted; decrypt a copy, or use a password") from None
    except paramiko.AuthenticationException:
        conn.close()
        how = f"the key {key_file}" if key_file else "the password"
        raise UserError(f"authentication failed for {who} with {how} (wrong password or key, or no such user)") \
            from None
    except Reported:
        conn.close()
        raise
    except (socket.timeout, TimeoutError):
        conn.close()
        raise Unreachable(f"{target.name} ({target.where}) is unreachable: no answer within {timeout} s") from None
    except (paramiko.ssh_exception.NoValidConnectionsError, ConnectionError, socket.gaierror, OSError) as exc:
        conn.close()
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError):
            reason = "connection refused" if all(
                getattr(e, "errno", None) == 111 for e in exc.errors.values()) else str(exc)
        raise Unreachable(f"{target.name} ({target.where}) is unreachable: {reason}") from None
    except paramiko.SSHException as exc:
        conn.close()
        raise Unreachable(f"{target.name} ({target.where}): SSH failed: {exc}") from None
    return conn


# --- on the host ------------------------------------------------------------------------------------------------

PROBE = ("printf 'uid=%s\\n' \"$(id -u)\"; "
         "if command -v sudo >/dev/null 2>&1; then "
         "if sudo -n true >/dev/null 2>&1; then echo sudo=nopasswd; else echo sudo=password; fi; "
         "else echo sudo=missing; fi")

# Runs as root (sh -c). Prints `rigbook-step NAME changed|ok DETAIL` per step; `rigbook-fail NAME DETAIL` and exit 1
# on a failure. Values come in as shell-quoted assignments at the top.
ROOT_SCRIPT = r"""
set -u
echo rigbook-root-ok
step() { n=$1; s=$2; shift 2; echo "rigbook-step $n $s $*"; }
fail() { n=$1; shift; echo "rigbook-fail $n $*"; exit 1; }
export DEBIAN_FRONTEND=noninteractive
# needrestart (Ubuntu 24.04 restarts services after an upgrade on its own) only lists: never sshd mid-bootstrap
export NEEDRESTART_MODE=l NEEDRESTART_SUSPEND=1
apt_install() {  # apt_install STEP PACKAGE: waits up to $lock_timeout s for the dpkg lock
  out=$(apt-get -q -o DPkg::Lock::Timeout="$lock_timeout" update 2>&1 \
        && apt-get -q -y -o DPkg::Lock::Timeout="$lock_timeout" install "$2" 2>&1) && return 0
  if printf '%s' "$out" | grep -q 'Could not get lock\|Unable to acquire the dpkg'; then
    fail "$1" "apt-get install $2: the dpkg lock stayed taken for $lock_timeout s" \
      "(another apt run, unattended-upgrades?): rerun when it is done"
  fi
  fail "$1" "apt-get install $2 failed: $(printf '%s' "$out" | tail -n 3 | tr '\n' ' ')"
}
# 1. the user Ansible logs in as
if id -u "$user" >/dev/null 2>&1; then
  step user ok "$user exists (uid $(id -u "$user"))"
else
  err=$(useradd -m -s /bin/bash "$user" 2>&1) || fail user "useradd $user: $err"
  step user changed "$user created (useradd -m -s /bin/bash)"
fi
home=$(getent passwd "$user" | cut -d: -f6)
group=$(id -gn "$user")
# 2. its authorized key (once), ~/.ssh 0700 and authorized_keys 0600, owned by the user
c=""
dir="$home/.ssh"
ak="$dir/authorized_keys"
if [ ! -d "$dir" ]; then mkdir -p "$dir" || fail key "mkdir $dir"; c="made $dir"; fi
if [ "$(stat -c '%a %U' "$dir")" != "700 $user" ]; then
  chmod 700 "$dir" && chown "$user:$group" "$dir" || fail key "chmod/chown $dir"; c="${c:+$c, }$dir 0700 $user"
fi
if [ -f "$ak" ] && grep -qF -- "$keymatch" "$ak"; then :; else
  if [ -s "$ak" ] && [ -n "$(tail -c 1 "$ak")" ]; then echo >> "$ak"; fi
  printf '%s\n' "$keyline" >> "$ak" || fail key "cannot write $ak"
  c="${c:+$c, }added $keyfp to $ak"
fi
if [ "$(stat -c '%a %U' "$ak")" != "600 $user" ]; then
  chmod 600 "$ak" && chown "$user:$group" "$ak" || fail key "chmod/chown $ak"; c="${c:+$c, }$ak 0600 $user"
fi
if [ -n "$c" ]; then step key changed "$c"; else step key ok "$keyfp already in $ak"; fi
# 3. sudo and the sudoers drop-in: written to a temp file sudo ignores (its name has a '.'), checked with
#    visudo -cf, then renamed into place
if command -v visudo >/dev/null 2>&1; then
  step sudo ok "installed"
else
  apt_install sudo sudo
  step sudo changed "installed (apt-get install sudo)"
fi
f="/etc/sudoers.d/rigbook-$user"
want="$user ALL=(ALL) NOPASSWD: ALL"
if [ -f "$f" ] && [ "$(cat "$f")" = "$want" ] && [ "$(stat -c '%a %U %G' "$f")" = "440 root root" ]; then
  step sudoers ok "$f"
else
  mkdir -p /etc/sudoers.d
  tmp=$(mktemp /etc/sudoers.d/.rigbook-XXXXXX) || fail sudoers "mktemp in /etc/sudoers.d"
  printf '%s\n' "$want" > "$tmp" && chown root:root "$tmp" && chmod 440 "$tmp" \
    || { rm -f "$tmp"; fail sudoers "cannot write $tmp"; }
  if ! check=$(visudo -cf "$tmp" 2>&1); then rm -f "$tmp"; fail sudoers "visudo -cf refused the drop-in: $check"; fi
  mv -f "$tmp" "$f" || { rm -f "$tmp"; fail sudoers "cannot rename into $f"; }
  step sudoers changed "$f ($want; visudo -cf ok)"
fi
if ! grep -Eq '^[[:space:]]*[@#]includedir[[:space:]]+/etc/sudoers.d' /etc/sudoers; then
  fail sudoers "/etc/sudoers does not read /etc/sudoers.d (no @includedir line): add it with visudo"
fi
# 4. python3 for Ansible's modules
if command -v python3 >/dev/null 2>&1; then
  step python3 ok "$(python3 -V 2>&1)"
else
  apt_install python3 python3
  step python3 changed "installed: $(python3 -V 2>&1)"
fi
"""


@dataclass
class Step:
    name: str
    status: str  # changed | ok
    detail: str


def root_script(target: Target, keyline: str, keymatch: str, keyfp: str) -> str:
    head = "".join(f"{k}={shlex.quote(v)}\n" for k, v in (
        ("user", target.ansible_user), ("keyline", keyline), ("keymatch", keymatch), ("keyfp", keyfp),
        ("lock_timeout", str(DPKG_LOCK_TIMEOUT))))
    return head + ROOT_SCRIPT


def parse_steps(stdout: str) -> tuple:
    """([Step], failure line or None) from the root script's output."""
    steps, failure = [], None
    for line in stdout.splitlines():
        if line.startswith("rigbook-step "):
            parts = line.split(" ", 3)
            steps.append(Step(parts[1], parts[2], parts[3] if len(parts) > 3 else ""))
        elif line.startswith("rigbook-fail "):
            failure = line[len("rigbook-fail "):]
    return steps, failure


def _sudo_error(target: Target, user: str, stderr: str) -> Reported:
    text = " ".join(stderr.split())
    who = f"{user} on {target.name} ({target.where})"
    if "not in the sudoers" in text or "not allowed to" in text or "may not run sudo" in text:
        return UserError(f"{who} has no sudo ({text[-200:]}): add it to group sudo (or sudoers) as root, or "
                         "bootstrap as a user that has sudo (--user)")
    if "incorrect password" in text or "password is required" in text or "no password was provided" in text:
        return UserError(f"sudo refused the password for {who}: give that user's sudo password "
                         f"({PASSWORD_ENV} or the prompt)")
    return HostFailed(f"sudo failed for {who}: {text[-300:] or 'no message'}")


def apply(conn, target: Target, user: str, password: str | None, script: str) -> list:
    """Run SCRIPT as root through sudo (`sudo -S` fed the password when sudo wants one); its steps."""
    probe = conn.run(PROBE, in_stream=False, timeout=60)
    facts = dict(line.split("=", 1) for line in probe.stdout.splitlines() if "=" in line)
    sudo = facts.get("sudo", "missing")
    # The script goes in as an argument (base64, decoded by the login shell): invoke feeds in_stream to the remote
    # process about one character per 10 ms, fine for a password line, 40 s for this script.
    inner = f"sh -c \"$(printf %s '{base64.b64encode(script.encode()).decode()}' | base64 -d)\""
    stdin = None
    if facts.get("uid") == "0":
        command = inner
    elif sudo == "missing":
        raise UserError(f"{target.name} ({target.where}) has no sudo and {user} is not root: install sudo as root "
                        "(apt-get install sudo), or bootstrap as root (--user root)")
    elif sudo == "nopasswd":
        command = f"sudo -n -- {inner}"
    else:
        if password is None:
            password = _ask_password(f"sudo password for {user}@{target.where}: ")
        check = conn.run("sudo -k -S -p '' -- true", in_stream=io.StringIO(password + "\n"), timeout=60)
        if check.exited != 0:
            raise _sudo_error(target, user, check.stderr)
        command, stdin = f"sudo -k -S -p '' -- {inner}", password + "\n"
    result = conn.run(command, in_stream=io.StringIO(stdin) if stdin else False, timeout=COMMAND_TIMEOUT)
    steps, failure = parse_steps(result.stdout)
    if "rigbook-root-ok" not in result.stdout:
        raise _sudo_error(target, user, result.stderr)
    if failure or result.exited != 0:
        name, _, detail = (failure or "script").partition(" ")
        raise HostFailed(f"{target.name}: step {name} failed: {detail or (result.stderr.strip()[-300:])}")
    return steps


def _ask_password(prompt: str) -> str:
    env = os.environ.get(PASSWORD_ENV)
    if env is not None:
        return env
    if not sys.stdin.isatty():
        raise UserError(f"a password is needed and there is no terminal to ask on: set {PASSWORD_ENV}, or give "
                        "--identity KEY (for a user with passwordless sudo)")
    return getpass.getpass(prompt)


def ready_check(target: Target) -> str:
    """Log in as ansible_user with the private key (host key now known), `sudo -n true`: what works."""
    conn = connect(target, target.ansible_user, key_file=target.private_key)
    try:
        result = conn.run("sudo -n true && python3 -c 'import sys; print(sys.version.split()[0])'", in_stream=False,
                          timeout=60)
    finally:
        conn.close()
    if result.exited != 0:
        raise HostFailed(f"{target.name}: the final check as {target.ansible_user} failed: "
                         f"{' '.join(result.stderr.split())[-300:]}")
    return result.stdout.strip().splitlines()[-1] if result.stdout.strip() else "?"


# --- the command ------------------------------------------------------------------------------------------------


def bootstrap(host: str, inventory: str, user: str | None = None, identity: str | None = None,
              pubkey: str | None = None, accept_new: bool = False, host_key_fingerprint: str | None = None,
              out=None) -> int:
    out = out or sys.stdout
    if accept_new and host_key_fingerprint:
        raise UserError("give --accept-new-host-key or --host-key-fingerprint, not both")
    expected = normalize_fingerprint(host_key_fingerprint) if host_key_fingerprint else None
    key_file = Path(identity).expanduser() if identity else None
    if key_file and not key_file.is_file():
        raise UserError(f"--identity {identity}: no such file")
    target = load_target(inventory, host)
    pub_path = Path(pubkey).expanduser() if pubkey else default_pubkey(target)
    keyline, keymatch = read_pubkey(pub_path)
    keyfp = blob_fingerprint(base64.b64decode(keymatch.split(" ", 1)[1]))
    user = user or target.ansible_user
    if not USER_NAME.match(user) and user != "root":
        raise UserError(f"--user {user!r} is not a plain user name")
    password = None if key_file else _ask_password(f"password for {user}@{target.where}: ")
    print(f"bootstrap {target.name}: {user}@{target.where} ({'key ' + str(key_file) if key_file else 'password'}), "
          f"host keys from {target.known_hosts}", file=out)
    policy = host_key_policy(target, accept_new=accept_new, expected=expected, out=out)
    conn = connect(target, user, password=password, key_file=key_file, policy=policy)
    try:
        steps = apply(conn, target, user, password, root_script(target, keyline, keymatch, keyfp))
    finally:
        conn.close()
    for step in steps:
        print(f"  {step.name:<8} {step.status:<7} {step.detail}", file=out)
    changed = [s.name for s in steps if s.status == "changed"]
    if target.private_key and target.private_key.is_file() and pub_path == Path(f"{target.private_key}.pub"):
        version = ready_check(target)
        print(f"ready: ssh as {target.ansible_user}@{target.where} with {target.private_key} works, sudo -n true "
              f"ok, python3 {version}", file=out)
    else:
        print(f"not checked: no private key of {pub_path} in the inventory (ansible_ssh_private_key_file) to log in "
              f"as {target.ansible_user} with", file=out)
    print(f"{target.name}: {len(changed)} changed ({', '.join(changed)})" if changed
          else f"{target.name}: nothing changed (already Ansible-ready)", file=out)
    return 0

