"""The state directory survives faults: a corrupt baselines file is kept aside and named (never overwritten, never
silently read as "no baseline"), concurrent writers lose no history entry and leave no temporary file, and a second
playbook run against the same state directory is refused (exit 4) while one runs, but not by a killed run's lock."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import ansible_runner
import pytest

from rigbook import baselines, statefile
from rigbook.cli import main
from rigbook.errors import StateBusy, UserError
from rigbook.inventory import load
from rigbook.run import RUN_LOCK, state_lock

# TEST-NET addresses: nothing answers there, and ansible_runner.run is replaced in every test that runs a playbook.
INVENTORY = """---
all:
  children:
    x99_r9700:
      hosts:
        box-a: {ansible_host: 192.0.2.1}
        box-b: {ansible_host: 192.0.2.2}
"""
FIGURES = {"all_reduce_busbw_gbs": 9.51}
CORRUPT = b'{"host": "box-a", "recorded": {"at": "2025-01-02 03:04:05", "metrics": {"all_reduce_busbw_g'
FIXED_UTC = time.struct_time((2025, 1, 2, 3, 4, 5, 3, 2, 0))


@pytest.fixture
def state(tmp_path, monkeypatch) -> Path:
    path = tmp_path / "state"
    monkeypatch.setenv("RIGBOOK_STATE_DIR", str(path))
    return path


@pytest.fixture
def inv_path(tmp_path, state) -> Path:
    path = tmp_path / "hosts.yml"
    path.write_text(INVENTORY)
    return path


@pytest.fixture
def no_ansible(monkeypatch):
    """ansible_runner.run replaced: a call fails the test (a host would have been contacted)."""
    calls = []

    def refuse(**kwargs):
        calls.append(kwargs)
        raise AssertionError("ansible_runner.run was called: a host would have been contacted")

    monkeypatch.setattr(ansible_runner, "run", refuse)
    return calls


def ladder(metrics: dict) -> list:
    return [{"layer": "collectives", "status": "pass", "metrics": metrics}]


def kept_copies(folder: Path, name: str) -> list:
    return sorted(folder.glob(f"{name}.corrupt-*"))


def leftovers(folder: Path) -> list:
    """Temporary files an atomic write left (facts/files.write_atomic names them .rigbook-*)."""
    return sorted(p.name for p in folder.rglob("*") if p.name.startswith(".rigbook-") or p.name.endswith(".tmp"))


# --- a corrupt baselines file ---------------------------------------------------------------------------------

def test_a_corrupt_host_file_stops_the_run_before_any_host_and_is_kept_aside(state, inv_path, no_ansible, capsys):
    baselines.record("box-a", ladder(FIGURES), "/runs/x", load(inv_path))
    host_file = state / "baselines" / "box-a.json"
    host_file.write_bytes(CORRUPT)

    assert main(["verify", "-i", str(inv_path)]) == 2
    err = capsys.readouterr().err
    [kept] = kept_copies(host_file.parent, "box-a.json")
    assert kept.read_bytes() == CORRUPT
    assert not host_file.exists()
    assert err.count("\n") == 1 and err.startswith("error: ")
    assert f"baselines file {host_file} is corrupt (not valid JSON: " in err
    assert f"kept aside as {kept}" in err and "Stopped before contacting any host" in err
    assert no_ansible == [] and not (state / "runs").exists()

    # the next run goes on without that baseline: box-a is judged by "none", the kept copy stays as it is
    assert baselines.resolve("box-a", load(inv_path)) == ("none", None)
    baselines.preflight(["box-a", "box-b"], load(inv_path))
    assert kept.read_bytes() == CORRUPT


def test_a_corrupt_group_file_is_kept_aside_and_named(state, inv_path, no_ansible, capsys):
    inv = load(inv_path)
    recorded = baselines.record("box-a", ladder(FIGURES), "/runs/x", inv)
    baselines.record_groups(inv, {"box-a": recorded}, "*")
    group_file = state / "baselines" / "groups" / "x99_r9700.json"
    assert baselines.resolve("box-b", inv)[0] == "group x99_r9700"
    corrupt = group_file.read_bytes()[:-30]
    group_file.write_bytes(corrupt)

    with pytest.raises(UserError) as caught:
        baselines.extra_vars(["box-b"], inv)
    [kept] = kept_copies(group_file.parent, "x99_r9700.json")
    assert caught.value.exit_code == 2
    assert f"baselines file {group_file} is corrupt (not valid JSON: " in str(caught.value)
    assert f"kept aside as {kept}" in str(caught.value)
    assert kept.read_bytes() == corrupt and not group_file.exists()
    assert baselines.resolve("box-b", inv) == ("none", None)
    assert baselines.resolve("box-a", inv)[0] == "host box-a"  # its own file was sound and is untouched


def test_every_corrupt_file_of_a_run_is_named_in_one_message(state, inv_path, capsys):
    inv = load(inv_path)
    (state / "baselines" / "groups").mkdir(parents=True)
    (state / "baselines" / "box-b.json").write_text('["not", "an", "object"]')
    (state / "baselines" / "groups" / "x99_r9700.json").write_text('{"group": "x99_r9700", "recorded": 7}')

    with pytest.raises(baselines.CorruptBaseline) as caught:
        baselines.preflight(sorted(inv.hosts), inv)
    message = str(caught.value)
    assert "box-b.json is corrupt (not a JSON object but list)" in message
    assert "x99_r9700.json is corrupt (its recorded baseline is not an object with metrics)" in message
    assert len(kept_copies(state / "baselines", "box-b.json")) == 1
    assert len(kept_copies(state / "baselines" / "groups", "x99_r9700.json")) == 1


def test_a_second_corruption_is_kept_under_another_name(state, inv_path, monkeypatch):
    monkeypatch.setattr(statefile.time, "gmtime", lambda *args: FIXED_UTC)  # both in the same second
    host_file = state / "baselines" / "box-a.json"
    host_file.parent.mkdir(parents=True)
    host_file.write_bytes(CORRUPT)
    with pytest.raises(baselines.CorruptBaseline):
        baselines.load("box-a", load(inv_path))
    host_file.write_bytes(b"\x00\xff second")
    with pytest.raises(baselines.CorruptBaseline) as caught:
        baselines.load("box-a", load(inv_path))

    first = host_file.with_name("box-a.json.corrupt-20250102T030405Z")
    second = host_file.with_name("box-a.json.corrupt-20250102T030405Z-2")
    assert kept_copies(host_file.parent, "box-a.json") == [first, second]
    assert first.read_bytes() == CORRUPT and second.read_bytes() == b"\x00\xff second"
    assert "not UTF-8 text" in str(caught.value) and str(second) in str(caught.value)


def test_a_file_found_corrupt_after_the_run_is_kept_aside_and_a_new_one_started(state, inv_path, capsys):
    inv = load(inv_path)
    baselines.record("box-a", ladder(FIGURES), "/runs/x", inv)
    host_file = state / "baselines" / "box-a.json"
    host_file.write_bytes(CORRUPT)

    assert baselines.append_history("box-a", ladder({"all_reduce_busbw_gbs": 9.4}), {"collectives": "pass"}, None,
                                    inv)
    [kept] = kept_copies(host_file.parent, "box-a.json")
    assert kept.read_bytes() == CORRUPT
    (fresh,) = json.loads(host_file.read_text())["inventories"].values()
    assert fresh.get("recorded") is None
    assert [h["metrics"] for h in fresh["history"]] == [{"all_reduce_busbw_gbs": 9.4}]
    err = capsys.readouterr().err
    assert f"warning: baselines file {host_file} is corrupt (not valid JSON: " in err
    assert f"kept aside as {kept}; a new file starts with this run" in err


def test_show_names_a_corrupt_file_and_moves_nothing(state, inv_path, capsys):
    baselines.record("box-b", ladder(FIGURES), "/runs/x", load(inv_path))
    host_file = state / "baselines" / "box-a.json"
    host_file.write_bytes(CORRUPT)

    assert main(["baseline", "show"]) == 2
    out, err = capsys.readouterr()
    assert f"error: baselines file {host_file} is corrupt (not valid JSON: " in err
    assert "keeps it aside as box-a.json.corrupt-<UTC time>" in err
    assert "box-b: baseline of" in out  # the sound file is still shown
    assert host_file.read_bytes() == CORRUPT and kept_copies(host_file.parent, "box-a.json") == []


# --- concurrent writers ---------------------------------------------------------------------------------------

def _append_many(writer: int, count: int, start, inv) -> None:
    start.wait()
    for i in range(count):
        figures = {"all_reduce_busbw_gbs": writer + i / 100}
        baselines.append_history("box-a", ladder(figures), {"writer": f"{writer}-{i}"}, None, inv)


def test_concurrent_appends_from_several_processes_lose_no_entry(state, inv_path):
    inv = load(inv_path)
    baselines.record("box-a", ladder(FIGURES), "/runs/x", inv)
    context = multiprocessing.get_context("fork")
    start = context.Event()
    writers = [context.Process(target=_append_many, args=(w, 20, start, inv)) for w in range(8)]
    for proc in writers:
        proc.start()
    start.set()
    for proc in writers:
        proc.join(60)
    assert [proc.exitcode for proc in writers] == [0] * 8

    (data,) = json.loads((state / "baselines" / "box-a.json").read_text())["inventories"].values()
    written = [h["statuses"]["writer"] for h in data["history"] if "statuses" in h]
    assert sorted(written) == sorted(f"{w}-{i}" for w in range(8) for i in range(20))
    assert data["recorded"]["metrics"] == FIGURES  # the recorded baseline survived every read-modify-write
    for w in range(8):  # each writer's entries in its own order
        assert [e for e in written if e.startswith(f"{w}-")] == [f"{w}-{i}" for i in range(20)]
    assert leftovers(state) == []
    assert sorted(p.name for p in (state / "baselines").iterdir()) == [".box-a.json.lock", "box-a.json"]


def test_a_failed_atomic_write_leaves_the_old_file_and_no_temporary_file(tmp_path):
    target = tmp_path / "state.json"
    statefile.write_json_atomic(target, {"good": 1})
    with pytest.raises(TypeError):
        statefile.write_json_atomic(target, {"bad": object()})
    assert json.loads(target.read_text()) == {"good": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json"]


def test_a_state_file_is_written_through_the_one_atomic_write_and_its_folder_synced(tmp_path, monkeypatch):
    from ansible_collections.rigbook.homelab.plugins.module_utils.facts import files

    synced = []
    monkeypatch.setattr(files, "fsync_folder", synced.append)
    statefile.write_json_atomic(tmp_path / "state.json", {"good": 1})
    assert synced == [str(tmp_path)] and json.loads((tmp_path / "state.json").read_text()) == {"good": 1}


def test_a_state_file_that_is_a_symbolic_link_is_refused_not_written_through(tmp_path):
    victim = tmp_path / "victim.json"
    victim.write_text('{"keep": 1}')
    (tmp_path / "state.json").symlink_to(victim)
    with pytest.raises(OSError, match="symbolic link"):
        statefile.write_json_atomic(tmp_path / "state.json", {"planted": 1})
    assert victim.read_text() == '{"keep": 1}' and leftovers(tmp_path) == []


def test_the_collection_link_is_made_and_repointed_in_one_rename(state, tmp_path, monkeypatch):
    from rigbook import paths

    monkeypatch.setattr(sys, "path", list(sys.path))  # link_collection puts this state's collections on it
    base = paths.link_collection()
    link = base / "ansible_collections" / "rigbook" / "homelab"
    assert base == state / "collections" and str(base) in sys.path
    assert Path(os.readlink(link)) == paths.collection_root()
    (tmp_path / "elsewhere").mkdir()
    link.unlink()
    link.symlink_to(tmp_path / "elsewhere")
    paths.link_collection()
    assert Path(os.readlink(link)) == paths.collection_root()
    link.unlink()
    link.write_text("not a link")
    monkeypatch.delitem(sys.modules, f"{paths.FACTS_PACKAGE}.files")  # as in a fresh process: loaded by its path
    paths.link_collection()
    assert Path(os.readlink(link)) == paths.collection_root()
    assert sorted(p.name for p in link.parent.iterdir()) == ["homelab"]  # no temporary link left


# --- two runs against one state directory ---------------------------------------------------------------------

HOLDER = textwrap.dedent("""
    import sys, time
    sys.argv = ["provision", "verify", "-i", "lab", "--limit", "box a"]
    from rigbook.run import state_lock
    with state_lock():
        print("held", flush=True)
        time.sleep(120)
""")


@pytest.fixture
def holder(state):
    """Another process holding the state directory's run lock (as `provision verify -i lab --limit 'box a'`)."""
    proc = subprocess.Popen([sys.executable, "-c", HOLDER], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "RIGBOOK_STATE_DIR": str(state)})
    assert proc.stdout.readline().strip() == "held"
    yield proc
    if proc.poll() is None:
        proc.kill()
    proc.wait(10)


def test_a_second_run_is_refused_while_another_holds_the_state(state, inv_path, holder, no_ansible, capsys):
    assert main(["verify", "-i", str(inv_path)]) == StateBusy.exit_code == 4
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith(f"error: another provision run is using the state directory {state} "
                          f"(pid {holder.pid}: provision verify -i lab --limit 'box a', since ")
    assert "wait for it to finish, or give this run a state directory of its own with RIGBOOK_STATE_DIR=DIR" in err
    assert no_ansible == [] and not (state / "runs").exists()
    assert main(["baseline", "record", "-i", str(inv_path)]) == 4
    with pytest.raises(StateBusy), state_lock():
        pass


def test_read_only_commands_do_not_take_the_run_lock(state, inv_path, holder, capsys):
    baselines.record("box-a", ladder(FIGURES), "/runs/x", load(inv_path))
    assert main(["validate", "-i", str(inv_path)]) == 0
    assert main(["baseline", "show"]) == 0
    assert main(["runs"]) == 0
    assert main(["diff", "box-a", "box-b"]) == 2  # no manifest run yet: bad input, not busy
    assert "another provision run" not in capsys.readouterr().err


def test_a_killed_runs_lock_blocks_nobody(state, inv_path, holder, monkeypatch, capsys):
    holder.send_signal(signal.SIGKILL)
    holder.wait(10)
    stale = json.loads((state / RUN_LOCK).read_text())
    assert stale["pid"] == holder.pid  # its details stay in the file, only as information

    def interrupted(**kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(ansible_runner, "run", interrupted)
    assert main(["verify", "-i", str(inv_path)]) == 130  # it got past the lock; Ctrl-C releases it
    with state_lock():
        assert json.loads((state / RUN_LOCK).read_text())["pid"] == os.getpid()
    assert (state / RUN_LOCK).read_text() == ""  # released: the file names no holder


def test_the_lock_is_held_for_the_run_and_released_after_it(state, inv_path, monkeypatch, capsys):
    seen = {}

    def finished(**kwargs):
        seen["holder"] = json.loads((state / RUN_LOCK).read_text())
        with pytest.raises(StateBusy):  # a second run during this one is refused
            with state_lock():
                pass
        return SimpleNamespace(status="successful", rc=0, stdout=None)

    monkeypatch.setattr(ansible_runner, "run", finished)
    main(["verify", "-i", str(inv_path)])
    assert seen["holder"]["pid"] == os.getpid()
    assert (state / RUN_LOCK).read_text() == ""
    with state_lock():
        pass


def test_the_lock_never_holds_an_extra_variable_value(state, monkeypatch):
    """-e may carry secrets; the lock file names the run's command with every extra-variable value redacted."""
    monkeypatch.setattr(sys, "argv", ["/x/bin/provision", "site.yml", "-i", "lab", "-e", "key=sk-secret",
                                      "--extra-vars", '{"t": "sk-two"}', "--extra-vars=sk-three", "-esk-four"])
    with state_lock():
        holder = json.loads((state / RUN_LOCK).read_text())
    assert holder["command"] == ("provision site.yml -i lab -e '<redacted>' --extra-vars '<redacted>' "
                                 "'--extra-vars=<redacted>' '-e<redacted>'")
    assert "sk-" not in json.dumps(holder)


def test_new_state_files_and_run_folders_are_the_users_alone(state, tmp_path):
    from rigbook import runs

    target = tmp_path / "baselines" / "box.json"
    statefile.write_json_atomic(target, {"metrics": {}})
    assert target.stat().st_mode & 0o777 == 0o600
    with statefile.locked(target):
        assert statefile.lock_path(target).stat().st_mode & 0o777 == 0o600
    target.chmod(0o640)
    statefile.write_json_atomic(target, {"metrics": {"x": 1}})
    assert target.stat().st_mode & 0o777 == 0o640  # an existing file keeps what its owner chose
    run_dir = runs.new_run_dir(Path("site.yml"))
    assert run_dir.is_relative_to(state) and run_dir.stat().st_mode & 0o777 == 0o700


def test_extra_variables_are_redacted_in_every_form_argparse_takes(monkeypatch):
    """argparse takes a unique prefix of --extra-vars (--ext, --e) and -e after clustered flags (-Ce, -vek=v): each
    value is redacted in the lock's command line, as -e and --extra-vars are."""
    from rigbook.cli import _playbook_parser
    from rigbook.run import _command_line

    argv = ["provision", "site.yml", "-i", "lab", "--extra", "a=sk-1", "--ext=sk-2", "--e", "sk-3", "-Ce", "sk-4",
            "-vvesk-5", "-l", "e", "--limit", "-e"]
    assert _playbook_parser().parse_args(argv[1:-2]).extra_vars == ["a=sk-1", "sk-2", "sk-3", "sk-4", "sk-5"]
    assert _command_line(argv) == ("provision site.yml -i lab --extra '<redacted>' '--ext=<redacted>' --e "
                                   "'<redacted>' -Ce '<redacted>' '-vve<redacted>' -l e --limit -e")


def _loose(root: Path) -> list:
    """Every file and folder under ROOT (ROOT too) that group or others may read, write or enter (links left out)."""
    found = [root] if root.stat().st_mode & 0o077 else []
    for path in root.rglob("*"):
        info = path.lstat()
        if not path.is_symlink() and info.st_mode & 0o077:
            found.append(f"{oct(info.st_mode & 0o777)} {path.relative_to(root)}")
    return found


def test_the_state_directory_is_made_0700_and_a_loose_one_tightened(tmp_path, monkeypatch):
    from rigbook.paths import state_dir

    monkeypatch.setenv("RIGBOOK_STATE_DIR", str(tmp_path / "new" / "state"))
    assert state_dir().stat().st_mode & 0o777 == 0o700
    loose = tmp_path / "loose"
    loose.mkdir(mode=0o755)
    loose.chmod(0o755)
    monkeypatch.setenv("RIGBOOK_STATE_DIR", str(loose))
    assert state_dir() == loose and loose.stat().st_mode & 0o777 == 0o700
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    monkeypatch.setenv("RIGBOOK_STATE_DIR", str(shared))
    with pytest.raises(UserError, match=f"state directory {shared} is a shared folder .mode 1777"):
        state_dir()
    assert shared.stat().st_mode & 0o7777 == 0o1777  # a shared folder is never changed


def test_after_a_run_nothing_under_the_state_directory_is_readable_by_others(state, inv_path, monkeypatch, capsys):
    """A run through the real writers (run folder, run record, baselines.json, the baselines history, the lock);
    ansible-runner stands in as it writes: artifacts and Ansible's fact cache with their own (0644/0755) modes.
    The state directory was made loose (0755) first: afterwards, nothing in it is group/other readable."""
    state.mkdir(mode=0o755)
    state.chmod(0o755)

    def runner(**kwargs):
        artifacts = Path(kwargs["private_data_dir"]) / "artifacts" / "ident"
        (artifacts / "job_events").mkdir(parents=True, mode=0o755)
        for name in ("command", "stdout", "rc", "status", "job_events/1-abc.json"):
            fd = os.open(artifacts / name, os.O_WRONLY | os.O_CREAT, 0o644)
            os.write(fd, b"-e secret=sk-1\n")
            os.close(fd)
        facts = Path(kwargs["envvars"]["ANSIBLE_CACHE_PLUGIN_CONNECTION"])
        facts.mkdir(mode=0o755, exist_ok=True)
        fd = os.open(facts / "box-a", os.O_WRONLY | os.O_CREAT, 0o644)
        os.close(fd)
        events = [{"event": "playbook_on_play_start", "event_data": {"play": "verify", "hosts": ["box-a"]}},
                  {"event": "runner_on_ok", "event_data": {"host": "box-a", "task": "ladder",
                                                           "res": {"ladder": ladder(FIGURES)}}},
                  {"event": "playbook_on_stats", "event_data": {"ok": {"box-a": 1}}}]
        for event in events:
            kwargs["event_handler"](event)
        return SimpleNamespace(status="successful", rc=0, stdout=None)

    monkeypatch.setattr(ansible_runner, "run", runner)
    assert main(["verify", "-i", str(inv_path), "-e", "secret=sk-1"]) == 0, capsys.readouterr()
    [run_dir] = (state / "runs").iterdir()
    assert (run_dir / "baselines.json").is_file() and (run_dir / "artifacts" / "ident" / "command").is_file()
    assert (state / "baselines" / "box-a.json").is_file() and (state / "facts" / "box-a").is_file()
    assert _loose(state) == []
