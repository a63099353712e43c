"""Run a playbook through the ansible_runner Python API and report per host."""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import signal
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from ansible import __version__ as ansible_version

from rigbook import baselines, junit, paths, runs, statefile
from rigbook.baselines import check_group, inventory_order
from rigbook.errors import StateBusy, UserError
from rigbook.lab.inventory import running_inventory
from rigbook.procs import terminate_tree
from rigbook.terminal import terminal_safe
from rigbook.tracker import Tracker
from rigbook.validate import run_roles, validate

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_UNREACHABLE, EXIT_INTERRUPTED = 0, 1, 2, 3, 130  # 4: errors.StateBusy
RUN_LOCK = "run.lock"


@dataclass
class RunOptions:
    playbook: str
    inventory: str
    limit: str | None = None
    tags: str | None = None
    skip_tags: str | None = None
    extra_vars: list = field(default_factory=list)
    check: bool = False
    diff: bool = False
    forks: int | None = None
    json: bool = False
    junit: str | None = None
    verbosity: int = 0
    baseline_mode: str = "compare"  # compare (and keep history), record, off
    baseline_group: str | None = None  # record: also record the hosts' group baselines ("*" all groups, or one)
    summaries: list | None = None  # --json of a rolling run: each run's summary goes here instead of stdout
    verify_builds: bool = False  # a second box of each group builds its group build too (roles/group_build)


def resolve_playbook(name: str) -> Path:
    given = Path(name)
    if given.is_file():
        return given.resolve()
    base = paths.collection_root() / "playbooks"
    for candidate in (base / name, base / f"{name}.yml"):
        if candidate.is_file():
            return candidate
    available = ", ".join(sorted(p.name for p in base.glob("*.yml")))
    raise UserError(f"playbook {name!r} not found (not a file, not in {base}; available: {available})")


def resolve_inventory(name: str) -> Path:
    """NAME as a path, else the collection's inventory of that name; `lab` is the lab that is up when its layout is
    not inventory/lab's (rigbook.lab.inventory.running_inventory)."""
    given = Path(name)
    if given.exists():
        return given.resolve()
    if name == "lab":
        running = running_inventory()
        if running is not None:
            return running
    base = paths.collection_root() / "inventory"
    candidate = base / name
    if candidate.exists():
        return candidate
    available = ", ".join(sorted(p.name for p in base.iterdir() if not p.name.startswith(".")))
    raise UserError(f"inventory {name!r} not found (not a path, not in {base}; available: {available})")


MITOGEN_OFF = ("0", "off", "no", "false")


def mitogen_strategy() -> tuple:
    """(strategy plugin dir, message) when mitogen is installed and supports the running ansible-core;
    (None, message) otherwise. The message says which, and why not (None message: not installed, say nothing).

    RIGBOOK_MITOGEN=off turns it off. ansible-core 2.19 deprecated third-party strategy plugins: mitogen's own
    release check (ansible_mitogen.loaders.assert_supported_release) decides whether this ansible-core is supported.
    """
    if os.environ.get("RIGBOOK_MITOGEN", "").strip().lower() in MITOGEN_OFF:
        return None, "mitogen: off (RIGBOOK_MITOGEN)"
    try:
        spec = importlib.util.find_spec("ansible_mitogen")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        return None, None
    try:
        # deferred: importlib.metadata costs ~18 ms at start-up (benchmarks/cli_speed.py); only mitogen's version
        from importlib.metadata import version

        mitogen_version = version("mitogen")
    except Exception:  # noqa: BLE001 - a source checkout without metadata
        mitogen_version = "unknown version"
    try:
        # deferred: ansible_mitogen is optional (the `fast` extra): a failure to import it is caught below
        from ansible_mitogen import loaders

        loaders.assert_supported_release()
        newest = getattr(loaders, "ANSIBLE_VERSION_MAX", None)
        if newest and tuple(int(p) for p in ansible_version.split(".")[:2]) > tuple(newest):
            raise RuntimeError(f"supports ansible-core up to {'.'.join(map(str, newest))}")
    except Exception as exc:  # noqa: BLE001 - any import or support failure means: run without it
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return None, (f"mitogen {mitogen_version} does not support ansible-core {ansible_version} ({reason}): "
                      "running with the default strategy")
    strategy = Path(list(spec.submodule_search_locations)[0]) / "plugins" / "strategy"
    if not (strategy / "mitogen_linear.py").is_file():
        return None, (f"mitogen {mitogen_version} has no strategy plugins at {strategy}: "
                      "running with the default strategy")
    return str(strategy), f"mitogen {mitogen_version}: on (strategy mitogen_linear, ansible-core {ansible_version})"


# ansible-core's own callback plugin path, kept after the collection's where the user set none
DEFAULT_CALLBACK_PLUGINS = "~/.ansible/plugins/callback:/usr/share/ansible/plugins/callback"


def ansible_env(mitogen: bool = True) -> dict:
    """Environment for ansible-playbook: rigbook's speed defaults, the collection, and our venv first.

    With MITOGEN (the default) the mitogen strategy is used when mitogen_strategy() finds it usable."""
    collections = paths.link_collection()
    state = paths.state_dir().resolve()
    bin_dir = str(Path(sys.executable).parent)
    env = {
        "PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""),
        "ANSIBLE_COLLECTIONS_PATH": str(collections),
        "ANSIBLE_COLLECTIONS_SCAN_SYS_PATH": "False",
        "RIGBOOK_STATE_DIR": str(state),
        "ANSIBLE_PIPELINING": "True",
        "ANSIBLE_SSH_ARGS": "-o ControlMaster=auto -o ControlPersist=120s",
        "ANSIBLE_GATHERING": "smart",
        "ANSIBLE_CACHE_PLUGIN": "ansible.builtin.jsonfile",
        "ANSIBLE_CACHE_PLUGIN_CONNECTION": str(state / "facts"),
        "ANSIBLE_CACHE_PLUGIN_TIMEOUT": "3600",
        "ANSIBLE_RETRY_FILES_ENABLED": "False",
        "ANSIBLE_INVENTORY_IGNORE": "~,.orig,.bak,.cfg,.retry,.pyc,.pyo,.md,.txt,.rst",
        "ANSIBLE_HOST_KEY_CHECKING": "True",
        "ANSIBLE_NOCOLOR": "True",
        "ANSIBLE_DEPRECATION_WARNINGS": "False",
        "ANSIBLE_LOCAL_TEMP": str(state / "tmp"),
        # the collection's callback folder loads ansiballz_cache (it needs no enabling): module payloads built once,
        # kept under the state directory, not again by every run; the user's own folders (or Ansible's) after it
        "ANSIBLE_CALLBACK_PLUGINS": os.pathsep.join([
            str(collections / "ansible_collections" / paths.COLLECTION_NAMESPACE / paths.COLLECTION_NAME / "plugins"
                / "callback"),
            os.environ.get("ANSIBLE_CALLBACK_PLUGINS") or DEFAULT_CALLBACK_PLUGINS]),
    }
    strategy = mitogen_strategy()[0] if mitogen else None
    if strategy:
        env["ANSIBLE_STRATEGY_PLUGINS"] = strategy
        env["ANSIBLE_STRATEGY"] = "mitogen_linear"
    return env


def _cmdline(opts: RunOptions) -> str:
    parts = []
    for item in opts.extra_vars:
        parts += ["-e", item]
    if opts.check:
        parts.append("--check")
    if opts.diff:
        parts.append("--diff")
    return " ".join(shlex.quote(p) for p in parts)


def run_playbook(opts: RunOptions) -> int:
    """Validate, run, report. Returns the process exit code."""
    playbook = resolve_playbook(opts.playbook)
    inventory = resolve_inventory(opts.inventory)
    # Before any host is contacted: the variables (the -e ones too, by the same schema), and every input the
    # play's roles need.
    inv = validate(inventory, roles=run_roles(playbook, opts.tags, opts.skip_tags), extra_vars=opts.extra_vars,
                   limit=opts.limit)
    if opts.baseline_mode == "record":
        check_group(inv, opts.baseline_group)
    with state_lock():  # held for the run's whole life; released on every way out (Ctrl-C included)
        return _run_locked(opts, playbook, inventory, inv)


# Short options of the commands that take -e and take no value: they may stand before -e in one cluster (-Ce K=V).
_FLAGS_BEFORE_E = set("CDvh")


def _extra_vars_arg(arg: str):
    """How ARG carries extra variables, as argparse reads it: "next" (the value is the next argument), "joined" (it
    holds the value) or None. argparse takes a unique prefix of a long option (--ext for --extra-vars) and short
    flags clustered before -e (-Ce, -vvek=v)."""
    if arg.startswith("--"):
        name, joined, _ = arg.partition("=")
        if len(name) >= 3 and "--extra-vars".startswith(name):
            return "joined" if joined else "next"
        return None
    if arg.startswith("-") and len(arg) > 1:
        cluster = arg[1:]
        for index, char in enumerate(cluster):
            if char == "e":
                return "joined" if cluster[index + 1:] else "next"
            if char not in _FLAGS_BEFORE_E:
                return None
    return None


def _command_line(argv=None) -> str:
    """The command line for the run lock, with every extra-variable value replaced by <redacted>: -e may carry
    secrets, and the lock file is readable by whoever can read the state directory."""
    argv = list(sys.argv if argv is None else argv)
    if argv and Path(argv[0]).name in ("provision", "__main__.py"):
        argv[0] = "provision"
    shown, hide_next = argv[:1], False
    for arg in argv[1:]:
        if hide_next:
            shown.append("<redacted>")
            hide_next = False
            continue
        how = _extra_vars_arg(arg)
        if how == "next":
            shown.append(arg)
            hide_next = True
        elif how == "joined":
            option = arg.partition("=")[0] if arg.startswith("--") else arg[:arg.index("e") + 1]
            shown.append(f"{option}=<redacted>" if arg.startswith("--") else f"{option}<redacted>")
        else:
            shown.append(arg)
    return shlex.join(shown)


def _busy_message(state: Path, holder: dict) -> str:
    if holder:
        who = (f"pid {holder.get('pid', '?')}: {holder.get('command') or 'command unknown'}, "
               f"since {holder.get('since', '?')}")
    else:
        who = "its pid and command line are not in the lock file yet"
    return (f"another provision run is using the state directory {state} ({who}); nothing was started: wait for "
            f"it to finish, or give this run a state directory of its own with RIGBOOK_STATE_DIR=DIR "
            f"(lock file {state / RUN_LOCK})")


@contextmanager
def state_lock():
    """The state directory's run lock (<state>/run.lock, fcntl) for the block; StateBusy (exit 4) naming the
    other run when one holds it. Playbook runs take it; read-only commands never do."""
    state = paths.state_dir()
    info = {"pid": os.getpid(), "command": _command_line(),
            "since": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "started": time.time()}
    try:
        with statefile.exclusive(state / RUN_LOCK, info):
            yield
    except statefile.Busy as busy:
        raise StateBusy(_busy_message(state, busy.holder)) from None


def _run_locked(opts: RunOptions, playbook: Path, inventory: Path, inv) -> int:
    """run_playbook's part that holds the run lock: baselines, the run folder, ansible, the report."""
    given = judged = None
    if opts.baseline_mode in ("compare", "record"):
        baselines.preflight(sorted(inv.hosts), inv)  # a corrupt file: kept aside, exit 2 before any host
        if opts.baseline_mode == "compare":
            given = baselines.extra_vars(sorted(inv.hosts), inv)
            judged = baselines.judged_by(sorted(inv.hosts), given)

    # deferred: ansible_runner costs ~30 ms at start-up (benchmarks/cli_speed.py); `provision validate` needs none
    import ansible_runner

    # deferred: rigbook.display (rich) costs ~23 ms at start-up (benchmarks/cli_speed.py); validate needs none
    from rigbook import display

    tracker = Tracker()
    progress_stream = sys.stderr if opts.json else sys.stdout
    console = display.make_console(progress_stream)
    run_dir = runs.new_run_dir(playbook)
    started = time.time()
    record = {
        "playbook": str(playbook),
        "inventory": str(inventory),
        "inventory_key": paths.inventory_key(inventory),  # runs.inventory_key_of reads it back
        "limit": opts.limit,
        "check": opts.check,
        "started": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started)),
        "exit_code": None,
    }
    runs.save_record(run_dir, record)
    # rigbook_builds_dir: where a group's build host leaves its builds for the other boxes, and the controller its
    # provenance records (roles/group_build); rigbook_verify_builds: a second box of the group builds them too
    extra = list(opts.extra_vars) + [json.dumps({"rigbook_run_dir": str(run_dir),
                                                 "rigbook_builds_dir": str(paths.state_dir() / BUILDS_DIR),
                                                 "rigbook_verify_builds": opts.verify_builds})]
    if given is not None:
        baseline_file = run_dir / "baselines.json"
        statefile.write_json_atomic(baseline_file, given)
        extra.append("@" + str(baseline_file))
    opts = RunOptions(**{**opts.__dict__, "extra_vars": extra})

    interrupted = {"flag": False}

    def on_sigint(signum, frame):
        if interrupted["flag"]:
            raise KeyboardInterrupt
        interrupted["flag"] = True
        tracker.stopping = True  # a task its stop makes fail is the interruption, not a failure of the host
        print("interrupt: stopping ansible (Ctrl-C again to abort at once)", file=sys.stderr, flush=True)

    def cancel() -> bool:
        if interrupted["flag"] and not interrupted.get("stopped"):
            # ansible-playbook's own children (module processes, ssh) outlive a kill of the
            # playbook process alone: stop the whole tree we started.
            interrupted["stopped"] = True
            terminate_tree(os.getpid())
        return interrupted["flag"]

    mitogen_message = mitogen_strategy()[1]
    if mitogen_message:
        print(mitogen_message, file=progress_stream, flush=True)
    previous = signal.signal(signal.SIGINT, on_sigint)
    mode = " (check mode)" if opts.check else ""
    title = f"provision {playbook.name} -i {inventory.name}{mode}"
    env = ansible_env()
    every, every_warning = display.progress_every()
    if every_warning:
        print(every_warning, file=sys.stderr, flush=True)
    try:
        # the progress (and its "still in" ticker in a pipe) ends with the run, before the summary
        with display.progress_for(tracker, progress_stream, title, every):
            runner = ansible_runner.run(
                private_data_dir=str(run_dir),
                project_dir=str(playbook.parent),
                playbook=str(playbook),
                inventory=str(inventory),
                limit=opts.limit,
                tags=opts.tags,
                skip_tags=opts.skip_tags,
                forks=opts.forks,
                verbosity=opts.verbosity or None,
                cmdline=_cmdline(opts) or None,
                envvars=env,
                # ansible-runner points a "jsonfile" fact cache into each run's artifact folder, which would
                # forget every host's facts between runs; with the plugin's full name it leaves ours alone.
                fact_cache_type=env["ANSIBLE_CACHE_PLUGIN"],
                event_handler=tracker.handle,
                cancel_callback=cancel,
                quiet=True,
                suppress_env_files=True,
                json_mode=False,
            )
    finally:
        signal.signal(signal.SIGINT, previous)
        # ansible-runner's artifacts (the command line with every -e, each event), Ansible's fact cache and the
        # module payloads it keeps are written with their programs' own modes: made the user's alone, as every
        # state file is
        for written in (run_dir, paths.state_dir() / "facts", paths.state_dir() / "tmp",
                        paths.state_dir() / paths.collection_module("plugin_utils.private_folder").PAYLOAD_FOLDER):
            statefile.make_private(written)
    duration = time.time() - started

    if interrupted["flag"] or runner.status == "canceled":
        code = EXIT_INTERRUPTED
        tracker.interrupt()
    elif tracker.stats is None and runner.rc != 0:
        code = EXIT_USAGE
        tracker.errors.extend(_ansible_errors(runner))
    else:
        code = tracker.exit_code()
    hosts = tracker.summary()
    _update_baselines(opts, hosts, run_dir, code, inv)
    if judged is not None:
        baselines.annotate(hosts, judged, inv.path)
    record.update(exit_code=code, duration_s=round(duration, 2), hosts=hosts, status=runner.status, rc=runner.rc)
    runs.save_record(run_dir, record)

    display.print_summary(tracker, console, run_dir)
    if judged is not None:
        baselines.print_judged({h: judged.get(h, "none") for h in hosts}, progress_stream, inv.path)
    if opts.junit:
        junit.write(Path(opts.junit), f"rigbook {playbook.name}", hosts, duration)
    if opts.json or opts.summaries is not None:
        summary = {
            "exit_code": code,
            "playbook": str(playbook),
            "inventory": str(inventory),
            "check": opts.check,
            "duration_s": round(duration, 2),
            "run_dir": str(run_dir),
            "hosts": hosts,
        }
        if tracker.errors:
            summary["errors"] = tracker.errors
        if opts.summaries is not None:
            opts.summaries.append(summary)
        else:
            sys.stdout.write(json.dumps(summary, indent=2) + "\n")
            sys.stdout.flush()
    return code


def rolling_batches(hosts: list, spec: str) -> list:
    """HOSTS in batches for a rolling run: a canary batch of the first host, then SPEC hosts per batch ("N", or "N%"
    of all the hosts, rounded up; at least one). A bad SPEC is a UserError."""
    text = (spec or "").strip()
    percent = text.endswith("%")
    number = text[:-1] if percent else text
    if not number.isdigit() or int(number) < 1 or (percent and int(number) > 100):
        raise UserError(f"--rolling {spec!r}: a number of hosts per batch (e.g. 2) or a percentage (e.g. 25%)")
    size = -(-len(hosts) * int(number) // 100) if percent else int(number)
    size = max(1, size)
    batches = [hosts[:1]] if hosts else []
    rest = hosts[1:]
    batches += [rest[i:i + size] for i in range(0, len(rest), size)]
    return batches


def run_rolling(opts: RunOptions, spec: str) -> int:
    """site.yml in batches (rolling_batches, in inventory order): each batch is one whole run (its reboots, the
    ladder and the serving layer after them), and the next starts only when it passed; the first batch that fails
    stops the roll, the hosts after it untouched. The summary says which batch stopped and why."""
    if opts.limit and any(c in opts.limit for c in "*?!&~[]"):
        raise UserError(f"--rolling with --limit {opts.limit!r}: name hosts or groups (no patterns), so the batches "
                        "are known before the first one starts")
    batches = rolling_batches([], spec)  # a bad SPEC is said before anything is read
    playbook = resolve_playbook(opts.playbook)
    inventory = resolve_inventory(opts.inventory)
    inv = validate(inventory, roles=run_roles(playbook, opts.tags, opts.skip_tags), extra_vars=opts.extra_vars,
                   limit=opts.limit)
    hosts = inventory_order(inv, inv.limited(opts.limit))
    batches = rolling_batches(hosts, spec)
    out = sys.stderr if opts.json else sys.stdout
    summaries = []  # each run's JSON summary: the reason a batch stopped, and --json's runs
    done, code, stopped = [], 0, None
    for number, batch in enumerate(batches, 1):
        kind = " (canary)" if number == 1 else ""
        print(f"rolling: batch {number}/{len(batches)}{kind}: {', '.join(batch)}", file=out, flush=True)
        code = run_playbook(RunOptions(**{**opts.__dict__, "limit": ",".join(batch), "summaries": summaries}))
        done.append({"batch": number, "hosts": batch, "exit_code": code})
        if code != 0:
            stopped = number
            break
    untouched = [h for batch in batches[len(done):] for h in batch]
    why = None
    if stopped is None:
        print(f"rolling: all {len(batches)} batches passed ({len(hosts)} hosts)", file=out, flush=True)
    else:
        failed = _failed_hosts(summaries[-1] if summaries else None)
        why = f"exit {code}" + (f": {failed}" if failed else "")
        print(terminal_safe(f"rolling: stopped at batch {stopped}/{len(batches)} ({', '.join(batches[stopped - 1])}): "
                            f"{why}; not reached, untouched: {', '.join(untouched) or 'none'}"), file=out, flush=True)
    rolling = {"spec": spec, "batches": done, "stopped_at_batch": stopped, "untouched": untouched}
    save_roll(dict(rolling, inventory=str(inventory), playbook=playbook.name, check=opts.check, exit_code=code,
                   why=why if stopped is not None else None))
    if opts.json:
        sys.stdout.write(json.dumps({"exit_code": code, "rolling": rolling, "runs": summaries}, indent=2) + "\n")
        sys.stdout.flush()
    return code


ROLLS_DIR = "rolls"
BUILDS_DIR = "builds"


def save_roll(record: dict) -> Path:
    """A rolling run's record (batches, where it stopped and why, what was not reached) under the state directory's
    rolls/, named by its end time: `provision report` shows the last one."""
    ended = time.time()
    record = dict(record, ended=time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ended)))
    path = paths.state_dir() / ROLLS_DIR / (time.strftime("%Y%m%d-%H%M%S", time.localtime(ended))
                                            + f"-{time.time_ns() % 10**9:09d}-{os.getpid()}.json")
    statefile.write_json_atomic(path, record)
    return path


def last_roll(inventory_path: str):
    """The newest saved roll of INVENTORY_PATH, or None (an unreadable record is skipped)."""
    folder = paths.state_dir() / ROLLS_DIR
    for path in sorted(folder.glob("*.json"), reverse=True) if folder.is_dir() else []:
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(record, dict) and record.get("inventory") == str(inventory_path):
            return record
    return None


def _failed_hosts(summary) -> str:
    """"HOST at TASK: MSG" of each failed host of a run's JSON summary ("" without one)."""
    if not summary:
        return ""
    said = []
    for host, entry in (summary.get("hosts") or {}).items():
        for failure in entry.get("failures") or []:
            said.append(f"{host} at {failure.get('task')!r}: {str(failure.get('msg') or '').splitlines()[0][:200]}")
            break
    return "; ".join(said)


def _update_baselines(opts: RunOptions, hosts: dict, run_dir: Path, code: int, inv=None) -> None:
    """Record (baseline record, and its group baselines with --group) or append to the history (every other run
    that measured figures)."""
    if opts.baseline_mode == "off" or code == EXIT_INTERRUPTED:
        return
    recorded_now = {}
    for host in baselines.inventory_order(inv, hosts):
        entry = hosts[host]
        ladder = entry.get("ladder") or []
        if not ladder:
            continue
        if opts.baseline_mode == "record":
            if entry["state"] in ("failed", "unreachable"):
                entry["baseline"] = "not recorded: the host failed"
                continue
            recorded = baselines.record(host, ladder, str(run_dir), inv)
            entry["baseline"] = "recorded" if recorded else "not recorded: no figures measured"
            if recorded:
                recorded_now[host] = recorded
        else:
            baselines.append_history(host, ladder, {v["layer"]: v["status"] for v in ladder}, str(run_dir), inv)
    if recorded_now and opts.baseline_group:
        for host, text in baselines.record_groups(inv, recorded_now, opts.baseline_group).items():
            hosts[host]["group_baseline"] = text


def _ansible_errors(runner) -> list:
    """ERROR lines of a run that failed before reaching any host (syntax error, bad --limit)."""
    try:
        text = runner.stdout.read()
    except (OSError, ValueError, AttributeError):
        return [f"ansible-playbook exited with {runner.rc} before any host ran"]
    lines = [line.strip() for line in text.splitlines() if "ERROR" in line]
    return lines or [f"ansible-playbook exited with {runner.rc} before any host ran: {text.strip()[-500:]}"]
