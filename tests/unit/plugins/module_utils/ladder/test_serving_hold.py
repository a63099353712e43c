"""ladder/serving_hold.py: this host's serve units around the runtime layers. systemctl is a stand-in that answers and
records each command (facts/runner's Result); the readiness wait is a stand-in returning what serve/readiness.wait
returns (its HTTP side has its own tests: tests/unit/plugins/module_utils/serve/test_readiness.py, and the module test
tests/unit/plugins/modules/test_ladder_beside_serving.py runs it against an engine on loopback). The /proc of an
engine started by hand is laid out by the test, as in tests/unit/plugins/module_utils/collect/test_engine_processes.py.
"""

from __future__ import annotations

import json
import os
import signal

import pytest
from ansible_collections.rigbook.homelab.plugins.module_utils.facts import runner
from ansible_collections.rigbook.homelab.plugins.module_utils.judges import verdict
from ansible_collections.rigbook.homelab.plugins.module_utils.ladder import climb as climb_mod
from ansible_collections.rigbook.homelab.plugins.module_utils.ladder import registry, serving_hold

UNIT = "rigbook-serve-qwen.service"
OTHER = "rigbook-serve-small.service"
PROFILES = [{"name": "qwen", "unit": UNIT, "bind": "127.0.0.1", "port": 30000, "startup_timeout_s": 900,
             "served_model_name": "qwen"},
            {"name": "small", "unit": OTHER, "bind": "127.0.0.1", "port": 30001, "startup_timeout_s": 900}]
RUNTIME = registry.of_phase(registry.RUNTIME)


class Systemctl:
    """systemctl and journalctl as the hold runs them: STATES {unit: ActiveState}; FAIL {verb: (rc, stderr)}."""

    def __init__(self, states, fail=None, journal=""):
        self.states = dict(states)
        self.fail = fail or {}
        self.journal = journal
        self.log = []

    def __call__(self, argv, timeout=None, **kwargs):
        argv = [str(a) for a in argv]
        self.log.append(argv)
        if argv[:2] == ["systemctl", "show"]:
            units = [a for a in argv[2:] if a.endswith(".service")]
            out = "\n\n".join(f"Id={u}\nActiveState={self.states.get(u, 'inactive')}\nSubState=x\nResult=success\n"
                              f"ControlGroup=/system.slice/{u}" for u in units)
            return runner.Result(argv, 0, out + "\n", "", None, False)
        if argv[0] == "journalctl":
            return runner.Result(argv, 0, self.journal, "", None, False)
        verb = argv[1]
        if verb in self.fail:
            rc, err = self.fail[verb]
            return runner.Result(argv, rc, "", err, f"{' '.join(argv)} exited {rc}: {err}", False)
        if verb == "stop":
            self.states[argv[2]] = "inactive"
        elif verb == "start":
            self.states[argv[2]] = "active"
        return runner.Result(argv, 0, "", "", None, False)

    def verbs(self):
        return [a[1] + " " + a[2] for a in self.log if a[0] == "systemctl" and a[1] != "show"]


class Ready:
    """serve/readiness.wait's stand-in: READY or not, with why; the calls kept (profile name, key)."""

    def __init__(self, ready=True, why=None):
        self.ready, self.why, self.calls = ready, why, []

    def __call__(self, profile, key, unit_state, root="/"):
        self.calls.append((profile["name"], key, unit_state().get("ActiveState")))
        return {"ready": self.ready, "seconds": 3.0, "why": self.why}


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        self.now += 6.0
        return self.now


def hold(tmp_path, systemctl, ready=None, mode="stop", check_mode=False, proc_root=None, root=None, vendor="nvidia",
         profiles=PROFILES, engine=None):
    proc = proc_root or tmp_path / "no-proc"
    return serving_hold.Hold(profiles, mode, check_mode, str(tmp_path / "hold.json"), engine, str(root or tmp_path),
                             vendor, run=systemctl, wait=ready or Ready(), clock=Clock(), proc_root=str(proc))


def ctx():
    return climb_mod.Context("/tree", {"measure": {"layers": True}})


def passing_climb(seen, tmp_path, systemctl):
    """A climb that judges each layer pass and notes, when it runs, what systemd and the record say then."""
    def run(layers, context):
        record = tmp_path / "hold.json"
        seen.append({"layers": [layer.name for layer in layers], "states": dict(systemctl.states),
                     "record": json.loads(record.read_text()) if record.exists() else None,
                     "sighup": signal.getsignal(signal.SIGHUP), "beside": context.options.get("beside")})
        return [verdict.make(layer.name, "pass", why="as expected") for layer in layers], {"root": context.root}
    return run


def test_the_running_units_are_stopped_for_the_runtime_layers_and_started_again_ready(tmp_path):
    systemctl = Systemctl({UNIT: "active", OTHER: "failed"})
    ready, seen = Ready(), []
    before = signal.getsignal(signal.SIGHUP)
    h = hold(tmp_path, systemctl, ready).begin()
    verdicts, _ = serving_hold.climb_around(RUNTIME, ctx(), passing_climb(seen, tmp_path, systemctl), h)
    assert [v["status"] for v in verdicts] == ["pass"] * 4
    # only the unit that ran was stopped (not the failed one), before the layers; started again after them
    assert systemctl.verbs() == [f"stop {UNIT}", f"reset-failed {UNIT}", f"start {UNIT}"]
    [during] = seen
    assert during["states"][UNIT] == "inactive" and during["beside"] is None
    assert during["record"]["units"] == [UNIT] and during["record"]["pid"] == os.getpid()
    assert during["record"]["started"] == serving_hold.process_start(os.getpid())
    assert during["sighup"] == signal.SIG_IGN and signal.getsignal(signal.SIGHUP) == before
    assert ready.calls == [("qwen", None, "active")]
    assert h.notes == [f"stopped {UNIT} for the runtime layers, started again, ready in 6 s"]
    assert h.report()["settled"] and h.report()["started"] == [{"unit": UNIT, "ready": True, "seconds": 6.0,
                                                                "why": None}]
    assert not (tmp_path / "hold.json").exists()


@pytest.mark.parametrize("how", ["a layer fails", "the climb raises"])
def test_the_units_are_started_again_whatever_the_layers_did(tmp_path, how):
    systemctl = Systemctl({UNIT: "active", OTHER: "active"})
    h = hold(tmp_path, systemctl).begin()

    def climb(layers, context):
        if how == "the climb raises":
            raise RuntimeError("a bug in a collector")
        return [verdict.make("peer_access", "fail", why="GPU0->GPU1: the peer copy came back wrong")], {}

    if how == "the climb raises":
        with pytest.raises(RuntimeError):
            serving_hold.climb_around(RUNTIME, ctx(), climb, h)
    else:
        verdicts, _ = serving_hold.climb_around(RUNTIME, ctx(), climb, h)
        assert verdicts[-1]["status"] == "fail"
    assert systemctl.states == {UNIT: "active", OTHER: "active"}
    assert sorted(v for v in systemctl.verbs() if v.startswith("start")) == [f"start {UNIT}", f"start {OTHER}"]
    assert not (tmp_path / "hold.json").exists()


def test_a_unit_not_ready_again_is_a_problem_with_its_journal_the_key_redacted(tmp_path):
    key_file = tmp_path / "key"
    key_file.write_text("sk-lab-secret\n")
    profiles = [dict(PROFILES[0], api_key_file=str(key_file))]
    journal = ("server_args=ServerArgs(api_key='sk-lab-secret', port=30000)\n"
               "torch.OutOfMemoryError: CUDA out of memory\n")
    systemctl = Systemctl({UNIT: "active"}, journal=journal)
    ready = Ready(False, "not ready after 900 s (startup_timeout_s); last answer: HTTP 503")
    h = hold(tmp_path, systemctl, ready, profiles=profiles).begin()
    serving_hold.climb_around(RUNTIME, ctx(), passing_climb([], tmp_path, systemctl), h)
    assert ready.calls == [("qwen", "sk-lab-secret", "active")]  # the key goes to the wait (to the unit's listener)
    [problem] = h.problems
    assert problem.startswith(f"{UNIT} was stopped for the runtime layers and is not ready again: not ready after "
                              "900 s")
    assert "torch.OutOfMemoryError" in problem and "sk-lab-secret" not in problem and "<redacted>" in problem
    assert h.report()["started"][0]["ready"] is False and h.notes == []


def test_a_unit_that_does_not_start_again_is_a_problem(tmp_path):
    systemctl = Systemctl({UNIT: "active"}, fail={"start": (1, "Job for rigbook-serve-qwen.service failed.")})
    ready = Ready()
    h = hold(tmp_path, systemctl, ready, profiles=PROFILES[:1]).begin()
    serving_hold.climb_around(RUNTIME, ctx(), passing_climb([], tmp_path, systemctl), h)
    assert ready.calls == [] and "systemctl start failed" in h.problems[0]
    assert "Job for rigbook-serve-qwen.service failed." in h.problems[0]


@pytest.mark.parametrize("mode, check_mode, said", [
    ("stop", True, "not stopped: check mode stops nothing"),
    ("keep", False, "not stopped: p2p_verify_stop_serving is false"),
])
def test_check_mode_and_keep_stop_nothing_and_measure_beside_the_engine_with_its_memory(tmp_path, mode, check_mode,
                                                                                        said):
    root = tmp_path / "tree"
    recording = root / "var/lib/rigbook/commands/nvidia-smi-memory.txt"
    recording.parent.mkdir(parents=True)
    # the query's format (csv, noheader, nounits); 88% of two 20 GiB 3080s (seed 000's --mem-fraction-static 0.88)
    recording.write_text("0, 18022, 20480\n1, 18022, 20480\n")
    systemctl, seen = Systemctl({UNIT: "active"}), []
    h = hold(tmp_path, systemctl, mode=mode, check_mode=check_mode, root=root, profiles=PROFILES[:1]).begin()
    context = ctx()
    serving_hold.climb_around(RUNTIME, context, passing_climb(seen, tmp_path, systemctl), h)
    assert systemctl.verbs() == [] and not (tmp_path / "hold.json").exists()
    beside = seen[0]["beside"]
    assert beside["engines"] == [f"{UNIT} ({said})"]
    assert beside["memory"]["used_mib"] == 36044 and beside["memory"]["total_mib"] == 40960
    assert ("--check" in beside["remedy"]) == check_mode
    assert h.notes == [f"the runtime layers ran beside {UNIT} ({said})"] and h.report()["settled"]


def _engine_process(root, pid, argv, cgroup):
    folder = root / "proc" / str(pid)
    folder.mkdir(parents=True)
    (folder / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")
    (folder / "status").write_text(f"Name:\tpython3\nPid:\t{pid}\nPPid:\t1\n")
    (folder / "cgroup").write_text(cgroup)


def test_an_engine_started_by_hand_is_never_stopped_and_is_named_beside_the_layers(tmp_path):
    proc_root = tmp_path / "box"
    by_hand = ["/home/owner/venv/bin/python3", "/home/owner/venv/bin/sglang", "serve", "--model-path", "/srv/m",
               "--api-key", "sk-owner-secret", "--port", "30000"]
    _engine_process(proc_root, 4242, by_hand, "0::/user.slice/user-1000.slice/session-3.scope\n")
    # the engine of this host's own unit: its state, not the scan, says what it is
    _engine_process(proc_root, 5151, ["/opt/v/bin/python", "-m", "sglang.launch_server", "--port", "30001"],
                    f"0::/system.slice/{OTHER}\n")
    systemctl, seen = Systemctl({UNIT: "inactive", OTHER: "active"}), []
    h = hold(tmp_path, systemctl, proc_root=proc_root, vendor="amd").begin()
    serving_hold.climb_around(RUNTIME, ctx(), passing_climb(seen, tmp_path, systemctl), h)
    assert systemctl.verbs() == [f"stop {OTHER}", f"reset-failed {OTHER}", f"start {OTHER}"]  # never pid 4242
    [label] = seen[0]["beside"]["engines"]
    assert label.startswith("an engine started by hand (pid 4242: /home/owner/venv/bin/python3 /home/owner/venv/bin/"
                            "sglang serve --model-path /srv/m --api-key ********")
    assert "under no unit of rigbook's, not stopped" in label and "sk-owner-secret" not in repr(seen)
    assert "`provision site.yml --tags serve`" in seen[0]["beside"]["remedy"]
    assert seen[0]["beside"]["memory"]["error"].startswith("amdgpu: no mem_info_vram_used under")


def test_site_plays_rule_measures_a_serving_box_only_when_something_under_it_changed_or_it_is_asked(tmp_path):
    systemctl = Systemctl({UNIT: "active"})
    h = hold(tmp_path, systemctl, profiles=PROFILES[:1]).begin()
    verdicts, _ = serving_hold.climb_around(RUNTIME, ctx(), passing_climb([], tmp_path, systemctl), h, "changed")
    assert [(v["layer"], v["status"]) for v in verdicts] == [(layer.name, "skip") for layer in RUNTIME]
    assert verdicts[0]["why"].startswith(f"not measured by this run: {UNIT} serves and nothing under it changed")
    assert systemctl.verbs() == [] and "`provision verify` measures them" in h.notes[0]
    for changes, asked in ((["kernel: packages or GRUB drop-in changed"], False), ([], True)):
        systemctl = Systemctl({UNIT: "active"})
        h = hold(tmp_path, systemctl, profiles=PROFILES[:1]).begin()
        verdicts, _ = serving_hold.climb_around(RUNTIME, ctx(), passing_climb([], tmp_path, systemctl), h, "changed",
                                                changes, asked)
        assert [v["status"] for v in verdicts] == ["pass"] * 4
        assert systemctl.verbs() == [f"stop {UNIT}", f"reset-failed {UNIT}", f"start {UNIT}"]
    # nothing serving: measured, nothing to stop (a first converge)
    systemctl = Systemctl({UNIT: "inactive"})
    h = hold(tmp_path, systemctl, profiles=PROFILES[:1]).begin()
    verdicts, _ = serving_hold.climb_around(RUNTIME, ctx(), passing_climb([], tmp_path, systemctl), h, "changed")
    assert [v["status"] for v in verdicts] == ["pass"] * 4 and systemctl.verbs() == []


def _record(tmp_path, units, started_offset=0):
    """A hold record of this process (alive) or, with STARTED_OFFSET, of a process that has ended (its pid reused)."""
    (tmp_path / "hold.json").write_text(json.dumps({
        "units": units, "pid": os.getpid(), "started": serving_hold.process_start(os.getpid()) + started_offset,
        "boot_id": serving_hold.boot_id(), "since": "2025-12-05T01:00:00+0000"}))


def test_units_a_cut_short_run_left_stopped_are_taken_over_and_started_again(tmp_path):
    _record(tmp_path, [UNIT, OTHER, "rigbook-serve-gone.service"], started_offset=1)
    systemctl, seen = Systemctl({UNIT: "inactive", OTHER: "active"}), []
    h = hold(tmp_path, systemctl).begin()
    assert h.stopped == [UNIT]  # OTHER runs again (someone started it), the gone unit is no profile of this host
    assert h.notes[0].startswith(f"{UNIT}: stopped by an earlier ladder run (pid {os.getpid()}, at "
                                 "2025-12-05T01:00:00+0000) that was cut short")
    serving_hold.climb_around(RUNTIME, ctx(), passing_climb(seen, tmp_path, systemctl), h)
    assert seen[0]["record"]["units"] == [UNIT, OTHER]  # recorded before OTHER was stopped
    assert systemctl.verbs() == [f"stop {OTHER}", f"reset-failed {UNIT}", f"start {UNIT}", f"reset-failed {OTHER}",
                                 f"start {OTHER}"]
    assert not (tmp_path / "hold.json").exists()
    # the role's always task: resume alone starts them and measures nothing
    _record(tmp_path, [UNIT], started_offset=1)
    systemctl = Systemctl({UNIT: "inactive"})
    h = hold(tmp_path, systemctl, mode="resume").begin().release()
    assert systemctl.verbs() == [f"reset-failed {UNIT}", f"start {UNIT}"] and h.settled
    assert not (tmp_path / "hold.json").exists()


def test_a_hold_of_a_run_still_running_is_left_to_it(tmp_path):
    _record(tmp_path, [UNIT])
    systemctl = Systemctl({UNIT: "inactive"})
    h = hold(tmp_path, systemctl).begin()
    assert h.busy.startswith(f"another ladder run (pid {os.getpid()}) stopped the serve units {UNIT} ")
    assert systemctl.log == [] and (tmp_path / "hold.json").exists()
    assert serving_hold.held_now(str(tmp_path / "hold.json"))["units"] == [UNIT]
    _record(tmp_path, [UNIT], started_offset=1)
    assert serving_hold.held_now(str(tmp_path / "hold.json")) is None


def test_a_unit_whose_hold_cannot_be_recorded_or_that_does_not_stop_is_measured_beside(tmp_path):
    (tmp_path / "not-a-folder").write_text("")
    systemctl, seen = Systemctl({UNIT: "active"}), []
    h = serving_hold.Hold(PROFILES[:1], "stop", False, str(tmp_path / "not-a-folder" / "hold.json"), None,
                          str(tmp_path), "nvidia", run=systemctl, wait=Ready(), clock=Clock(),
                          proc_root=str(tmp_path)).begin()
    serving_hold.climb_around(RUNTIME, ctx(), passing_climb(seen, tmp_path, systemctl), h)
    assert systemctl.verbs() == [] and seen[0]["beside"]["engines"][0].startswith(f"{UNIT} (not stopped: cannot write")
    systemctl, seen = Systemctl({UNIT: "active"}, fail={"stop": (1, "Access denied")}), []
    h = hold(tmp_path, systemctl, profiles=PROFILES[:1]).begin()
    serving_hold.climb_around(RUNTIME, ctx(), passing_climb(seen, tmp_path, systemctl), h)
    assert systemctl.verbs() == [f"stop {UNIT}"] and not (tmp_path / "hold.json").exists()
    label = seen[0]["beside"]["engines"][0]
    assert "systemctl stop failed" in label and "Access denied" in label


def test_a_garbled_record_is_said_and_replaced(tmp_path):
    (tmp_path / "hold.json").write_text("{not json")
    systemctl = Systemctl({UNIT: "active"})
    h = hold(tmp_path, systemctl, profiles=PROFILES[:1]).begin()
    assert "could not be read" in h.notes[0] and h.busy is None
    serving_hold.climb_around(RUNTIME, ctx(), passing_climb([], tmp_path, systemctl), h)
    assert systemctl.verbs() == [f"stop {UNIT}", f"reset-failed {UNIT}", f"start {UNIT}"]


# --- what the GPUs hold ------------------------------------------------------------------------------------------

def test_the_memory_readers(tmp_path):
    assert serving_hold.parse_nvidia_memory("0, 18022, 20480\n1, 17990, 20480\n[N/A], 1, 2\n") == [
        {"gpu": "0", "used_mib": 18022, "total_mib": 20480}, {"gpu": "1", "used_mib": 17990, "total_mib": 20480}]
    card = tmp_path / "sys/class/drm/card1/device"
    card.mkdir(parents=True)
    # amdgpu's sysfs files hold bytes; 88% of the R9700's 32 GiB
    (card / "mem_info_vram_used").write_text("30236569600\n")
    (card / "mem_info_vram_total").write_text("34359738368\n")
    memory = serving_hold.gpu_memory(str(tmp_path), "amd")
    assert memory["gpus"] == [{"gpu": "1", "used_mib": 28835, "total_mib": 32768}] and memory["error"] is None
    none = serving_hold.gpu_memory(str(tmp_path / "empty"), "nvidia")
    assert none["used_mib"] is None and none["error"].startswith("nvidia-smi: no recording at")
