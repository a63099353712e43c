"""Ansible modules run in-process (community.general style): `run_module()` with a table of expected commands
(`ok()`, `fail()`), `run_module_real()` with the real run_command; and `local_playbook()`, tasks through real
ansible-playbook on localhost with the collection linked."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from unittest import mock

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
    unexpected or out-of-order command fails the test at once, and a row left over fails it afterwards. An answer
    may be a function of the argv returning that triple: a stand-in for a command that writes a file.
    BINS maps a program name to what AnsibleModule.get_bin_path returns (default /usr/bin/NAME; None: missing).
    Commands run through facts/runner.py's `run` (the one command runner) answer from the same table, as a
    runner.Result (an answer of rc None: the command could not start); their ENV is recorded in environs. A test
    that replaced runner.run itself keeps its own.
    exit_json and fail_json raise; anything else the module raises propagates (a traceback is a test failure).
    """
    from ansible.module_utils import basic
    from ansible_collections.rigbook.homelab.plugins.module_utils.facts import runner

    table = [(list(argv), answer) for argv, answer in commands]
    run = ModuleRun(result={}, failed=False)

    def run_command(self, argv, *unused, environ_update=None, **kwargs):
        argv = argv.split() if isinstance(argv, str) else [str(a) for a in argv]
        run.commands.append(argv)
        run.environs.append(environ_update)
        assert table, f"unexpected command {argv} (every expected command already ran: {run.commands[:-1]})"
        want, answer = table.pop(0)
        assert argv == want, f"command {len(run.commands)}: ran {argv}, expected {want}"
        return answer(argv) if callable(answer) else answer

    def runner_run(argv, timeout=None, env=None, clean_env=False, cwd=None, data=None, lines=None):
        argv = [str(a) for a in argv]
        rc, out, err = run_command(None, argv, environ_update=env)
        shown = " ".join(argv)[:300]
        if rc is None:
            return runner.Result(argv, None, out, err, f"{shown}: {err or 'could not start'}", False)
        error = None if rc == 0 else f"{shown} exited {rc}: {(err or out).strip()[-400:]}"
        return runner.Result(argv, rc, out, err, error, False)

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
        if getattr(runner.run, "__module__", None) == runner.__name__:  # not replaced by the test itself
            stack.enter_context(mock.patch.object(runner, "run", runner_run))
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
    """MODULE.main() in-process with the real run_command and the real facts/runner.py run; returns (result,
    failed, argvs run through either)."""
    from ansible.module_utils import basic
    from ansible_collections.rigbook.homelab.plugins.module_utils.facts import runner

    ran = []
    real_run = basic.AnsibleModule.run_command
    real_runner_run = runner.run

    def run_command(self, argv, *a, **kw):
        ran.append(list(argv))
        return real_run(self, argv, *a, **kw)

    def runner_run(argv, *a, **kw):
        ran.append([str(arg) for arg in argv])
        return real_runner_run(argv, *a, **kw)

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
        stack.enter_context(mock.patch.object(runner, "run", runner_run))
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
