"""Helpers shared by the tests: import them as `helpers` (tests/conftest.py puts tests/ on sys.path).

- `provision()`: the `provision` command as a subprocess (`python -m rigbook`).
- `tree_listing()`: what is under a folder, to show that a command changed nothing there.
- `edit_yaml()`, `set_key()`: change one value of an inventory file.
- Parse fixtures: `FIXTURES`, `expected()`, `cases()`, `fixture_names()`, `read()`, `check()`.
- The lab: `LAB_MARKS` (root only, marker `lab`) and `leftovers()`.
- Ansible module glue run in-process: `run_module()` with a table of expected commands (`ok()`, `fail()`),
  in the style of community.general's module tests.

No test module imports another test module; what two of them share lives here or in a conftest.py.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import stat
import subprocess
import sys
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from unittest import mock

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures" / "parse"


# --- the provision command ------------------------------------------------------------------------------------

def provision_argv(*args) -> list:
    return [sys.executable, "-m", "rigbook", *map(str, args)]


def provision(*args, env=None, timeout=600) -> subprocess.CompletedProcess:
    """Run `provision ARGS` (as `python -m rigbook`) with this environment plus ENV; capture text output."""
    return subprocess.run(provision_argv(*args), capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


# --- what a command changed ----------------------------------------------------------------------------------

def tree_listing(root: Path, skip=()) -> dict:
    """Every path under ROOT (links not followed; the paths in SKIP and what is under them left out) -> (its
    type, its mode, a file's sha256 or a link's target). Two listings are equal when nothing under ROOT was
    created, removed, rewritten, re-linked or re-moded."""
    skip = {Path(p) for p in skip}
    seen = {}
    for folder, dirs, files in os.walk(root):
        here = Path(folder)
        dirs[:] = [d for d in dirs if here / d not in skip]
        for name in dirs + files:
            path = here / name
            if path in skip:
                continue
            st = os.lstat(path)
            if stat.S_ISLNK(st.st_mode):
                what = os.readlink(path)
            elif stat.S_ISREG(st.st_mode):
                what = hashlib.sha256(path.read_bytes()).hexdigest()
            else:
                what = None
            seen[str(path.relative_to(root))] = (stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode), what)
    return seen


# --- inventories edited by a test ---------------------------------------------------------------------------

def edit_yaml(path: Path, mutate) -> Path:
    """Load the YAML file PATH ({} when missing), let MUTATE change the data in place, write it back."""
    data = yaml.safe_load(path.read_text()) if path.exists() else {}
    mutate(data)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def set_key(dotted: str, value):
    """A mutation for edit_yaml: set the key path DOTTED (a.b.c, mappings made on the way) to VALUE."""
    def mutate(data):
        node = data
        keys = dotted.split(".")
        for key in keys[:-1]:
            node = node.setdefault(key, {})
        node[keys[-1]] = value

    return mutate


# --- parse fixtures (tests/fixtures/parse/KIND/NAME.txt and KIND/expected.yml) --------------------------------

def expected(kind: str) -> dict:
    """NAME -> {path: value} facts each fixture of KIND must parse to."""
    return yaml.safe_load((FIXTURES / kind / "expected.yml").read_text())


def cases(kind: str) -> list:
    """The fixtures of KIND as pytest params (name, facts), each with its name as id."""
    return [pytest.param(name, facts, id=name) for name, facts in expected(kind).items()]


def fixture_names(kind: str) -> set:
    return {p.stem for p in (FIXTURES / kind).glob("*.txt")}


def read(kind: str, name: str) -> str:
    return (FIXTURES / kind / (name + ".txt")).read_text(encoding="utf-8")


def lookup(result, path: str):
    """Resolve 'a.b[2].c' (trailing '#' = length) against a parsed result."""
    want_len = path.endswith("#")
    if want_len:
        path = path[:-1]
    value = result
    for part in re.findall(r"[^.\[\]]+|\[\d+\]", path):
        if part.startswith("["):
            value = value[int(part[1:-1])]
        else:
            value = value[part]
    return len(value) if want_len else value


def check(parse, kind, name, facts):
    """PARSE the fixture KIND/NAME and compare every fact; numbers must come back as numbers."""
    result = parse(read(kind, name))
    for path, want in facts.items():
        got = lookup(result, path)
        assert got == want, f"{name}: {path} = {got!r}, expected {want!r}"
        if isinstance(want, (int, float)) and not isinstance(want, bool):
            assert isinstance(got, (int, float)) and not isinstance(got, bool), path


# --- the lab ---------------------------------------------------------------------------------------------------

# scripts/test runs the tests marked lab in one pytest process, every other test in a second one beside it.
LAB_MARKS = [
    pytest.mark.lab,
    pytest.mark.skipif(os.geteuid() != 0, reason="lab hosts need root (systemd-nspawn, mounts)"),
]


class LabHost:
    """One running lab host as a test drives it: a root shell over its SSH, its boot count, a reboot."""

    def __init__(self, name: str):
        self.name = name

    @property
    def host(self):
        from rigbook.lab import state

        return state.load().host(self.name)

    def run(self, command: str, check: bool = True, timeout: int = 600) -> subprocess.CompletedProcess:
        """COMMAND as root on the host (sudo -n sh -c), as Ansible reaches it."""
        import json
        import shlex

        from rigbook.lab import machine

        proc = subprocess.run(machine.ssh_command(self.host, f"sudo -n sh -c {shlex.quote(command)}"),
                              capture_output=True, text=True, timeout=timeout)
        if check:
            assert proc.returncode == 0, f"{self.name}: {json.dumps(command)}: {proc.stderr or proc.stdout}"
        return proc

    def out(self, command: str) -> str:
        return self.run(command).stdout

    def console(self, command: str) -> subprocess.CompletedProcess:
        """COMMAND as root inside the host without SSH (its sshd may be what a test stopped): nsenter into the
        namespaces of the container's PID 1, found among the host's processes by its in-container pid."""
        from rigbook.lab import tracking

        for pid in sorted(tracking.processes(self.host)):
            try:
                status = Path(f"/proc/{pid}/status").read_text()
            except OSError:
                continue
            nspid = next((line.split()[1:] for line in status.splitlines() if line.startswith("NSpid:")), [])
            if len(nspid) > 1 and nspid[-1] == "1":
                return subprocess.run(["nsenter", "-t", str(pid), "-m", "-u", "-i", "-n", "-p", "--", "sh", "-c",
                                       command], capture_output=True, text=True, timeout=120)
        raise AssertionError(f"{self.name}: no container init process found")

    def boots(self) -> int:
        return int((self.host.dir / "boots").read_text())

    def site(self, *args, inventory: str = "lab", timeout: int = 900) -> tuple:
        """`provision site.yml -i INVENTORY --limit HOST --json ARGS`: (process, the host's summary entry, the
        names of the tasks that changed it, seconds)."""
        import json
        import time

        started = time.monotonic()
        proc = provision("site.yml", "-i", inventory, "--limit", self.name, "--json", *args, timeout=timeout)
        elapsed = time.monotonic() - started
        summary = json.loads(proc.stdout) if proc.stdout.strip().startswith("{") else {}
        changed = [line.split(": ", 2)[2] for line in proc.stderr.splitlines()
                   if line.strip().startswith("changed: ")]
        return proc, summary.get("hosts", {}).get(self.name, {}), changed, elapsed

    def reboot(self, timeout: float = 180) -> None:
        """`systemctl reboot` on the host, then wait until it booted again and its sshd answers."""
        import time

        from rigbook.lab import machine

        count = self.boots()
        subprocess.run(machine.ssh_command(self.host, "sudo -n systemctl reboot"), capture_output=True, timeout=60)
        deadline = time.monotonic() + timeout
        while self.boots() == count:
            assert time.monotonic() < deadline, f"{self.name} did not reboot"
            time.sleep(0.5)
        machine.wait_ready([self.host], timeout=timeout)


def leftovers() -> list:
    """Anything of this state directory's lab still running, mounted or in the cgroup tree."""
    from rigbook.lab import state, tracking
    from rigbook.lab.system import mounts_under

    lab_dir = str(state.lab_dir())
    group = f"/rigbook-lab-{state.lab_id()}/"
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cgroups = (entry / "cgroup").read_text()
            args = (entry / "cmdline").read_bytes().decode(errors="replace").replace("\0", " ")
            if (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                continue  # exited, waiting for PID 1 to reap it: not running
        except (OSError, IndexError):
            continue
        if group in cgroups or (lab_dir in args and ("supervisor" in args or "nspawn" in args)):
            found.append(f"process {entry.name}: {args[:120]}")
    found += [f"mount {m}" for m in mounts_under(state.lab_dir())]
    for base in tracking.CGROUP_MOUNTS:
        cgroup = Path(base) / f"rigbook-lab-{state.lab_id()}"
        if cgroup.exists():
            found.append(f"cgroup {cgroup}")
    loops = subprocess.run(["losetup", "-a"], capture_output=True, text=True).stdout
    found += [f"loop {line}" for line in loops.splitlines() if lab_dir in line]
    return found


# --- Ansible modules in-process (community.general style) -----------------------------------------------------

class AnsibleExitJson(Exception):
    """exit_json was called: args[0] is the result."""


class AnsibleFailJson(Exception):
    """fail_json was called: args[0] is the result."""


def ok(out: str = "", err: str = "") -> tuple:
    """A command's (rc, stdout, stderr) that succeeded."""
    return 0, out, err


def fail(code: int, err: str = "", out: str = "") -> tuple:
    """A command's (rc, stdout, stderr) that failed with CODE."""
    return code, out, err


@dataclass
class ModuleRun:
    result: dict
    failed: bool
    commands: list = field(default_factory=list)  # every argv run_command got, in order
    environs: list = field(default_factory=list)  # the environ_update of each, in order

    @property
    def msg(self) -> str:
        return self.result.get("msg", "")


@contextmanager
def _module_args(args: dict):
    try:
        from ansible.module_utils.testing import patch_module_args
    except ImportError:  # ansible-core before 2.19: the _ANSIBLE_ARGS pattern
        from ansible.module_utils import basic
        from ansible.module_utils.common.text.converters import to_bytes

        with mock.patch.object(basic, "_ANSIBLE_ARGS", to_bytes(json.dumps({"ANSIBLE_MODULE_ARGS": args}))):
            yield
        return
    with patch_module_args(args):
        yield


def run_module(module, args: dict, commands=(), *, check_mode=False, diff=False, bins=None) -> ModuleRun:
    """Run MODULE.main() in-process with ARGS; every command it runs must be the next row of COMMANDS.

    COMMANDS is a table of (exact argv, (rc, stdout, stderr)) in the order the module must run them; an
    unexpected or out-of-order command fails the test at once, and a row left over fails it afterwards.
    BINS maps a program name to what AnsibleModule.get_bin_path returns (default /usr/bin/NAME; None: missing).
    exit_json and fail_json raise; anything else the module raises propagates (a traceback is a test failure).
    """
    from ansible.module_utils import basic

    table = [(list(argv), answer) for argv, answer in commands]
    run = ModuleRun(result={}, failed=False)

    def run_command(self, argv, *unused, environ_update=None, **kwargs):
        argv = argv.split() if isinstance(argv, str) else [str(a) for a in argv]
        run.commands.append(argv)
        run.environs.append(environ_update)
        assert table, f"unexpected command {argv} (every expected command already ran: {run.commands[:-1]})"
        want, answer = table.pop(0)
        assert argv == want, f"command {len(run.commands)}: ran {argv}, expected {want}"
        return answer

    def get_bin_path(self, arg, required=False, opt_dirs=None):
        path = (bins or {}).get(arg, "/usr/bin/" + arg)
        if path is None and required:
            self.fail_json(msg=f"Failed to find required executable {arg}")
        return path

    def exit_json(self, **kwargs):
        kwargs.setdefault("changed", False)
        raise AnsibleExitJson(kwargs)

    def fail_json(self, msg, **kwargs):
        kwargs.update(failed=True, msg=msg)
        raise AnsibleFailJson(kwargs)

    internal = {"_ansible_check_mode": check_mode, "_ansible_diff": diff}
    with ExitStack() as stack:
        stack.enter_context(_module_args({**args, **internal}))
        for name, fake in (("run_command", run_command), ("get_bin_path", get_bin_path), ("exit_json", exit_json),
                           ("fail_json", fail_json), ("_log_invocation", lambda self: None)):
            stack.enter_context(mock.patch.object(basic.AnsibleModule, name, fake))
        try:
            module.main()
        except AnsibleExitJson as done:
            run.result = done.args[0]
        except AnsibleFailJson as done:
            run.result, run.failed = done.args[0], True
        else:
            raise AssertionError("main() returned without exit_json or fail_json")
    assert not table, f"expected commands that did not run: {[argv for argv, _ in table]}"
    return run


def run_module_real(module, args: dict, *, check_mode=False, diff=False):
    """MODULE.main() in-process with the real run_command; returns (result, failed, argvs run)."""
    from ansible.module_utils import basic

    ran = []
    real_run = basic.AnsibleModule.run_command

    def run_command(self, argv, *a, **kw):
        ran.append(list(argv))
        return real_run(self, argv, *a, **kw)

    def exit_json(self, **kw):
        raise AnsibleExitJson(kw)

    def fail_json(self, msg, **kw):
        kw.update(failed=True, msg=msg)
        raise AnsibleFailJson(kw)

    with ExitStack() as stack:
        stack.enter_context(_module_args({**args, "_ansible_check_mode": check_mode, "_ansible_diff": diff}))
        for name, fake in (("run_command", run_command), ("exit_json", exit_json), ("fail_json", fail_json),
                           ("_log_invocation", lambda self: None)):
            stack.enter_context(mock.patch.object(basic.AnsibleModule, name, fake))
        try:
            module.main()
        except AnsibleExitJson as done:
            return done.args[0], False, ran
        except AnsibleFailJson as done:
            return done.args[0], True, ran
    raise AssertionError("main() returned without exit_json or fail_json")


def local_playbook(tmp_path, tasks: list, check: bool = True) -> subprocess.CompletedProcess:
    """ansible-playbook of TASKS on localhost (local connection, this interpreter), the collection linked."""
    from rigbook.paths import link_collection

    playbook = tmp_path / "play.yml"  # JSON is YAML
    playbook.write_text(json.dumps([{"hosts": "localhost", "gather_facts": False, "tasks": tasks,
                                     "vars": {"ansible_python_interpreter": sys.executable}}]))
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "ANSIBLE_COLLECTIONS_PATH": str(link_collection()),
           "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "ANSIBLE_NOCOLOR": "1"}
    argv = [str(bin_dir / "ansible-playbook"), "-i", "localhost,", "-c", "local"] + (["--check"] if check else [])
    return subprocess.run(argv + [str(playbook)], capture_output=True, text=True, env=env, timeout=300)


# --- a lab run history for `provision report` ----------------------------------------------------------------
# (tests/unit/rigbook/test_report.py, tests/integration/test_report_browser.py)

REPORT_HISTORY = (  # (when, playbook, fault on lab-r9700 or None); the first run records the baselines
    ("2026-03-02 09:14:05", "baseline", None),
    ("2026-03-03 09:15:41", "verify", None),
    ("2026-03-04 09:13:12", "verify", None),
    ("2026-03-05 09:16:58", "verify", "busbw-half"),
    ("2026-03-06 09:14:30", "verify", None),
)


def lab_report_history(work: Path) -> dict:
    """Write a lab run history into the state directory (RIGBOOK_STATE_DIR) through rigbook's own writers
    (baselines.record / append_history / annotate, runs.save_record), the way `provision baseline record -i lab`
    then four `provision verify -i lab` would: every ladder is the real climb (snapshots.judge_tree) over the lab's
    recorded hardware trees (src/rigbook/lab/rigs, the pinned kernel "booted" as the lab's boot hook records
    it), later runs judged against the recorded baseline; the fourth run has `provision lab break lab-r9700
    busbw-half` applied to the R9700 twin's tree (every recorded busbw figure times 0.5), the fifth is after `lab
    heal`. The figures are the recorded trees' (the two write-ups'): 3080 twin host-staged 6.00 GB/s, R9700 twin
    peer 10.29 GB/s, busbw 9.75 / 9.51 GB/s. Returns {"runs": [run folder names], "faulted": folder name,
    "hosts": {host: {run folder: ladder}}}."""
    import time as real_time

    from rigbook import baselines, runs
    from rigbook.lab import faults, hardware_trees
    from rigbook.snapshots import judge_tree, ladder_view_of
    from rigbook.validate import validate

    inventory = REPO / "inventory" / "lab"
    inv = validate(inventory)
    rigs = {"lab-3080": "x99-3080", "lab-r9700": "x99-r9700"}
    out = {"runs": [], "faulted": None, "hosts": {h: {} for h in rigs}}

    class Clock:  # baselines stamps "at" with time.strftime: each run gets its own day
        now = ""

        @classmethod
        def strftime(cls, fmt, *args):
            return cls.now if fmt == "%Y-%m-%d %H:%M:%S" and not args else real_time.strftime(fmt, *args)

        def __getattr__(self, name):
            return getattr(real_time, name)

    for number, (when, kind, fault) in enumerate(REPORT_HISTORY):
        Clock.now = when
        run_dir = runs.runs_dir() / f"{when[:10].replace('-', '')}-{when[11:].replace(':', '')}-verify-{number:06x}"
        run_dir.mkdir(parents=True)
        hosts = {}
        for host, rig in rigs.items():
            tree = hardware_trees.materialize(rig, work / f"run{number}" / host)
            release = inv.host_vars(host)["rigbook_pins"]["kernel"]["release"]
            (tree / "proc/sys/kernel/osrelease").write_text(release + "\n")
            module = tree / "lib/modules" / release / "updates/dkms/nvidia.ko"
            module.parent.mkdir(parents=True, exist_ok=True)
            module.write_text("")
            if fault and host == "lab-r9700":
                faults.apply(faults.plan(fault, tree, hardware_trees.load_rig(rig)))
            label, recorded = baselines.resolve(host, inv)
            ladder = judge_tree(str(tree), ladder_view_of(inv, host), (recorded or {}).get("metrics"))
            failed = any(v["status"] == "fail" for v in ladder)
            hosts[host] = {"ok": 20, "changed": 0, "failed": int(failed), "unreachable": 0, "skipped": 3,
                           "state": "failed" if failed else "ok", "ladder": ladder}
            with mock.patch.object(baselines, "time", Clock()):
                if kind == "baseline":
                    baselines.record(host, ladder, str(run_dir))
                    hosts[host]["baseline"] = "recorded"
                else:
                    baselines.append_history(host, ladder, {v["layer"]: v["status"] for v in ladder}, str(run_dir))
            out["hosts"][host][run_dir.name] = ladder
        if kind != "baseline":
            baselines.annotate(hosts, baselines.judged_by(list(hosts), baselines.extra_vars(list(hosts), inv)))
        code = 1 if any(h["state"] == "failed" for h in hosts.values()) else 0
        runs.save_record(run_dir, {"playbook": str(REPO / "playbooks" / "verify.yml"), "inventory": str(inventory),
                                   "limit": None, "check": False, "started": when, "exit_code": code,
                                   "duration_s": 9.5, "hosts": hosts, "status": "successful", "rc": code})
        out["runs"].append(run_dir.name)
        if fault:
            out["faulted"] = run_dir.name
    return out


def html_elements(text: str) -> tuple:
    """(elements, problems) of an HTML page: every start tag as {"tag", **attributes}, and what an HTML parser
    found unbalanced (a closing tag with no open one, an element left open at the end; void elements aside)."""
    from html.parser import HTMLParser

    void = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}
    elements, stack, problems = [], [], []

    class Collect(HTMLParser):
        def handle_starttag(self, tag, attrs):
            elements.append({"tag": tag, **{k: (v if v is not None else "") for k, v in attrs}})
            if tag not in void:
                stack.append(tag)

        def handle_startendtag(self, tag, attrs):
            elements.append({"tag": tag, **{k: (v if v is not None else "") for k, v in attrs}})

        def handle_endtag(self, tag):
            if tag in void:
                return
            if not stack or stack[-1] != tag:
                problems.append(f"</{tag}> closes <{stack[-1] if stack else 'nothing'}>")
                if tag in stack:
                    del stack[len(stack) - 1 - stack[::-1].index(tag):]
                return
            stack.pop()

    parser = Collect(convert_charrefs=True)
    parser.feed(text)
    parser.close()
    problems += [f"<{tag}> never closed" for tag in stack]
    return elements, problems


# --- a real headless browser (Debian's chromium) with the network off ------------------------------------------

OFFLINE = ["--proxy-server=127.0.0.1:9", "--host-resolver-rules=MAP * ~NOTFOUND", "--no-pings",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           "--disable-domain-reliability", "--no-first-run", "--no-default-browser-check"]


def chromium() -> str:
    """The chromium binary, installed with apt-get when missing (root on Debian), else a skip saying what to do."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found:
        return found
    apt = shutil.which("apt-get")
    if not apt or os.geteuid() != 0:
        pytest.skip("needs Debian's chromium package: `apt-get install chromium` as root")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    cmd = [apt, "install", "-y", "--no-install-recommends", "chromium"]
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    if result.returncode != 0:
        subprocess.run([apt, "update"], env=env, capture_output=True, text=True, timeout=600)
        result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    found = shutil.which("chromium")
    assert result.returncode == 0 and found, (result.stderr or result.stdout)[-2000:]
    return found


def browse(binary: str, page: Path, profile: Path, *args) -> subprocess.CompletedProcess:
    argv = [binary, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
            f"--user-data-dir={profile}", *OFFLINE, *args, page.as_uri()]
    return subprocess.run(argv, capture_output=True, text=True, timeout=180, cwd=profile)


def page_dom(page: Path, profile: Path):
    """Chromium's DOM of PAGE, the network off: find(tag, **attrs) over its elements (data_host= is data-host=,
    class_= is class=)."""
    dumped = browse(chromium(), page, profile, "--dump-dom")
    assert dumped.returncode == 0, dumped.stderr[-2000:]
    elements, _ = html_elements(dumped.stdout)

    def find(tag, **attrs):
        return [e for e in elements if e["tag"] == tag
                and all(e.get(k.rstrip("_").replace("_", "-")) == v for k, v in attrs.items())]
    return find


def leaves(value):
    """Every scalar inside a measured / expected / metrics value, as the text a person must find."""
    if isinstance(value, dict):
        for item in value.values():
            yield from leaves(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from leaves(item)
    elif value is not None:
        yield str(value)
