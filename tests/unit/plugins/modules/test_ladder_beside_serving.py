"""rigbook.homelab.ladder's runtime phase on a box whose serve unit runs: the module stops the unit for layers 6-9 and
starts it again after, also when a layer fails, waits until it is ready (the serve role's readiness wait, against an
engine stand-in of this test on loopback), and the summary says so; check mode stops nothing and judges an
out-of-memory beside the engine as a skip naming its memory; site.yml's rule; the role's always task (resume); and the
role's tasks around it. In-process (tests/helpers/modules.py): systemctl is an exact table of commands, the GPUs are
the lab rig x99-r9700's recorded tree (src/rigbook/lab/rigs), the host model the lab inventory's."""

from __future__ import annotations

import copy
import functools
import http.server
import io
import json
import os
import threading
from pathlib import Path

import pytest
import yaml
from helpers.modules import fail, ok, run_module
from rich.console import Console

from rigbook import display
from rigbook.lab import faults, hardware_trees
from rigbook.paths import link_collection
from rigbook.tracker import Tracker
from rigbook.validate import host_model_of, validate

link_collection()
from ansible_collections.rigbook.homelab.plugins.module_utils.ladder import serving_hold  # noqa: E402
from ansible_collections.rigbook.homelab.plugins.modules import ladder  # noqa: E402

HOST = "lab-r9700"
UNIT = "rigbook-serve-standin.service"
TASK = "Ladder 6-9: peer access, P2P bandwidth, collectives, NCCL transport"
ROLE = Path(__file__).resolve().parents[4] / "roles" / "p2p_verify"
SHOW = ["systemctl", "show", UNIT, "-p", "Id,ActiveState,SubState,Result,ControlGroup", "--timestamp=unix"]
STOP = ["systemctl", "stop", UNIT]
RESET = ["systemctl", "reset-failed", UNIT]
START = ["systemctl", "start", UNIT]


@pytest.fixture(autouse=True)
def none_of_this_machines_engines(monkeypatch, tmp_path):
    """The hold reads the engines under no serve unit from /proc (what ran beside the runtime layers). This machine's
    /proc shows every lab container's processes (a hand-made seed box's `sglang serve`, while the lab tests run beside
    these), none of them this test's box: the hold reads an empty proc tree instead."""
    real = serving_hold.engine_processes.engines
    empty = tmp_path / "no-engines"
    empty.mkdir()

    def engines(root="/", engine=None, keep=None):
        return real(str(empty) if root == "/" else root, engine, keep)

    monkeypatch.setattr(serving_hold.engine_processes, "engines", engines)


def shown(state):
    return ok(f"Id={UNIT}\nActiveState={state}\nSubState=running\nResult=success\n"
              f"ControlGroup=/system.slice/{UNIT}\n")


class Engine(http.server.BaseHTTPRequestHandler):
    requests = []

    def _answer(self, body):
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):  # noqa: N802 (http.server's name)
        Engine.requests.append(("GET", self.path))
        self._answer({})

    def do_POST(self):  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        Engine.requests.append(("POST", self.path))
        self._answer({"usage": {"completion_tokens": 8}})

    def log_message(self, *args):
        pass


@pytest.fixture
def engine():
    Engine.requests = []
    server = http.server.HTTPServer(("127.0.0.1", 0), Engine)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


@functools.lru_cache(maxsize=1)
def lab_model():
    return host_model_of(validate("inventory/lab"), HOST)


@pytest.fixture
def box(tmp_path, engine):
    """(module args, tree): the lab-r9700 host model on its recorded tree, its serve profile on the test's engine."""
    tree = hardware_trees.materialize("x99-r9700", tmp_path / "tree")
    model = copy.deepcopy(lab_model())
    model["evidence_root"] = str(tree)
    model["serve"] = [dict(model["serve"][0], bind="127.0.0.1", port=engine)]
    assert model["serve"][0]["unit"] == UNIT
    args = {"phase": "runtime", "host": model, "hold_state": str(tmp_path / "hold.json"),
            "error_state": str(tmp_path / "error-counters.json")}
    return args, tree


def summary_of(result, failed=False):
    """What `provision` prints for a host whose runtime task returned RESULT (plain, as in a CI log)."""
    tracker = Tracker()
    tracker.handle({"event": "runner_on_failed" if failed else "runner_on_ok",
                    "event_data": {"host": HOST, "task": TASK, "task_action": "rigbook.homelab.ladder",
                                   "res": result}})
    out = io.StringIO()
    display.print_summary(tracker, Console(file=out, width=300), None)
    return tracker, out.getvalue()


def test_the_serve_unit_is_stopped_for_the_runtime_layers_started_again_and_the_summary_says_so(box):
    args, _tree = box
    events = []

    def answer(what, result):
        def run(argv):
            events.append((what, os.path.exists(args["hold_state"])))
            return result
        return run

    run = run_module(ladder, args, [(SHOW, shown("active")), (STOP, answer("stop", ok())), (RESET, ok()),
                                    (START, answer("start", ok()))])
    assert not run.failed, run.msg
    assert [(v["layer"], v["status"]) for v in run.result["ladder"]] == [
        ("peer_access", "pass"), ("p2p_bandwidth", "pass"), ("collectives", "pass"), ("nccl_transport", "pass")]
    # the hold is on the host from before the stop until the unit is started again, then gone
    assert events == [("stop", True), ("start", True)] and not os.path.exists(args["hold_state"])
    assert Engine.requests == [("GET", "/health_generate"), ("POST", "/v1/chat/completions")]  # ready again
    hold = run.result["serving_hold"]
    assert hold["stopped"] == [UNIT] and hold["started"][0]["ready"] and hold["settled"]
    [note] = run.result["notes"]
    assert note.startswith(f"stopped {UNIT} for the runtime layers, started again, ready in ") and note.endswith(" s")
    assert run.result["changed"] is False  # the unit ends as it was
    tracker, printed = summary_of(run.result)
    assert tracker.summary()[HOST]["notes"] == [{"task": TASK, "msg": note}]
    assert f"{HOST}: {note}\n" in printed


def test_a_failing_layer_fails_the_task_with_its_message_and_the_unit_is_started_again(box):
    args, tree = box
    faults.apply(faults.plan("p2p-bandwidth-half", tree, hardware_trees.load_rig("x99-r9700")))
    args["baseline"] = {"peer_gbs_0_1": 10.29, "peer_gbs_1_0": 10.29}  # seed 004's figures, the rig's healthy run
    run = run_module(ladder, args, [(SHOW, shown("active")), (STOP, ok()), (RESET, ok()), (START, ok())])
    assert run.failed and run.msg.startswith("p2p_bandwidth: fail:")
    assert run.result["ladder"][-1]["layer"] == "p2p_bandwidth"  # the climb stopped there, the unit started anyway
    assert run.result["notes"][0].startswith(f"stopped {UNIT} for the runtime layers, started again")
    code = run.result["ladder"][-1]["code"]
    assert run.result["code"] == code and code.startswith("RB-P2P-")  # the failing verdict's code is the task's
    tracker, printed = summary_of(run.result, failed=True)
    assert tracker.summary()[HOST]["failures"][0]["code"] == code
    assert f"{HOST}: FAILED at task '{TASK}' [{code}]: p2p_bandwidth: fail:" in printed
    assert f"{HOST}: stopped {UNIT}" in printed


def test_a_unit_not_ready_again_fails_the_task_after_the_layers_passed(box):
    args, _tree = box
    args["host"]["serve"][0]["port"] = 9  # nothing listens there: refused at once, the unit's state then checked
    journal = ["journalctl", "-u", UNIT, "-n", "30", "--no-pager", "-o", "cat"]
    run = run_module(ladder, args, [(SHOW, shown("active")), (STOP, ok()), (RESET, ok()), (START, ok()),
                                    (SHOW, shown("failed")), (SHOW, shown("failed")),
                                    (journal, ok("Scheduler hit an exception\n"))])
    assert run.failed and [v["status"] for v in run.result["ladder"]] == ["pass"] * 4
    assert run.msg.startswith(f"{UNIT} was stopped for the runtime layers and is not ready again: the unit is failed")
    assert "Scheduler hit an exception" in run.msg
    assert run.result["code"] == "RB-SERVING-NOT-READY-AGAIN"
    assert run.result["serving_hold"]["codes"] == ["RB-SERVING-NOT-READY-AGAIN"]


def _oom_probe(tree):
    """The recorded HIP probe as the probe returns it when hipMalloc fails on both GPUs (probe/engine.py: the device's
    error, every pair and the bidirectional copy skipped for want of buffers)."""
    path = tree / "var/lib/rigbook/commands/hip-probe.json"
    probe = json.loads(path.read_text())
    for device in probe["devices"]:
        device["errors"] = ["hipMalloc: hipErrorOutOfMemory"]
    for pair in probe["pairs"]:
        pair.update(pattern_ok=None, peer_gbs=None, host_staged_gbs=None, staged_pattern_ok=None,
                    errors=["skipped: buffers could not be allocated"])
        pair.pop("ipc", None)
    for entry in probe["bidir"]:
        entry.update(gbs=None, errors=["skipped: buffers could not be allocated"])
    path.write_text(json.dumps(probe))


def test_check_mode_stops_nothing_and_an_out_of_memory_beside_the_engine_is_a_skip_naming_its_memory(box):
    args, tree = box
    _oom_probe(tree)
    for card in ("card0", "card1"):  # amdgpu's sysfs, in bytes: 88% of the R9700's 32 GiB (made up for this test)
        folder = tree / "sys/class/drm" / card / "device"
        folder.mkdir(parents=True)
        (folder / "mem_info_vram_used").write_text("30236569600\n")
        (folder / "mem_info_vram_total").write_text("34359738368\n")
    run = run_module(ladder, args, [(SHOW, shown("active"))], check_mode=True)
    assert not run.failed, run.msg
    statuses = {v["layer"]: v for v in run.result["ladder"]}
    for layer in ("peer_access", "p2p_bandwidth"):
        assert statuses[layer]["status"] == "skip", statuses[layer]
        assert statuses[layer]["why"].startswith(
            f"skipped: {UNIT} (not stopped: check mode stops nothing) holds 57670 MiB of the GPUs' 65536 MiB "
            "(GPU0 28835/32768 MiB, GPU1 28835/32768 MiB), and the layer ran out of GPU memory beside it "
            "(hipMalloc: hipErrorOutOfMemory)")
        assert "A run without --check stops the serve units" in statuses[layer]["remedy"]
    assert run.result["serving_hold"]["not_stopped"] == {UNIT: "not stopped: check mode stops nothing"}
    assert run.result["evidence"]["beside_engine"]["memory"]["used_mib"] == 57670
    assert Engine.requests == [] and not os.path.exists(args["hold_state"])


def test_the_site_plays_rule_leaves_a_converged_serving_box_alone_unless_asked(box):
    args, _tree = box
    args.update(serving_when="changed", run_tags=["all"])
    run = run_module(ladder, args, [(SHOW, shown("active"))])
    assert not run.failed and {v["status"] for v in run.result["ladder"]} == {"skip"}
    assert run.result["ladder"][0]["why"].startswith(f"not measured by this run: {UNIT} serves and nothing under it")
    assert Engine.requests == []
    args.update(run_tags=["peer_access"])  # --tags peer_access asks for it
    run = run_module(ladder, args, [(SHOW, shown("active")), (STOP, ok()), (RESET, ok()), (START, ok())])
    assert [(v["layer"], v["status"]) for v in run.result["ladder"]] == [("peer_access", "pass")]


def test_resume_starts_what_a_cut_short_run_left_stopped_and_a_live_hold_is_left_alone(box):
    args, _tree = box
    record = {"units": [UNIT], "pid": os.getpid(), "started": serving_hold.process_start(os.getpid()),
              "boot_id": serving_hold.boot_id(), "since": "2025-12-05T01:00:00+0000"}
    Path(args["hold_state"]).write_text(json.dumps(dict(record, started=record["started"] + 1)))  # that run ended
    run = run_module(ladder, dict(args, serving="resume"), [(SHOW, shown("inactive")), (RESET, ok()), (START, ok())])
    assert not run.failed and run.result["ladder"] == [] and not os.path.exists(args["hold_state"])
    assert "cut short" in run.result["notes"][0] and run.result["notes"][1].startswith(f"stopped {UNIT}")
    Path(args["hold_state"]).write_text(json.dumps(record))  # a run that still holds it: nothing touched
    run = run_module(ladder, args, [])
    assert run.failed and run.msg.startswith(f"another ladder run (pid {os.getpid()}) stopped the serve units {UNIT}")


def test_a_phase_without_gpu_work_touches_no_unit(box):
    args, _tree = box
    run = run_module(ladder, dict(args, phase="static", layers=["pcie_link"]), [])
    assert "serving_hold" not in run.result
    log = "NCCL INFO Channel 00 : 0[0] -> 1[1] via P2P/IPC"
    run = run_module(ladder, dict(args, layers=["nccl_transport"], log=log), [])
    assert "serving_hold" not in run.result


def test_a_unit_that_cannot_be_stopped_is_measured_beside(box):
    args, _tree = box
    run = run_module(ladder, args, [(SHOW, shown("active")), (STOP, fail(1, "Access denied"))])
    assert not run.failed
    assert "systemctl stop failed" in run.result["serving_hold"]["not_stopped"][UNIT]
    collectives = [v for v in run.result["ladder"] if v["layer"] == "collectives"][0]
    assert f"measured beside {UNIT} (not stopped: systemctl stop failed" in collectives["why"]


# --- the role around the module ------------------------------------------------------------------------------------

def test_the_role_passes_the_stop_rule_and_starts_again_in_always_what_a_cut_short_run_left():
    [block] = [t for t in yaml.safe_load((ROLE / "tasks" / "main.yml").read_text()) if "block" in t]
    [task] = block["block"]
    [resume] = block["always"]
    assert task["name"] == TASK and task["register"] == "p2p_verify_runtime"
    args = task["rigbook.homelab.ladder"]
    assert args["serving"] == "{{ 'stop' if p2p_verify_stop_serving | bool else 'keep' }}"
    assert args["serving_when"] == "{{ p2p_verify_runtime_when_serving }}"
    assert args["changes"] == "{{ p2p_verify_stack_changes }}"
    assert resume["rigbook.homelab.ladder"]["serving"] == "resume" and resume["rigbook.homelab.ladder"]["phase"] == \
        "runtime"
    assert resume["when"] == "p2p_verify_runtime.ladder is not defined"  # the module returned nothing: cut short
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    assert defaults["p2p_verify_stop_serving"] is True and defaults["p2p_verify_runtime_when_serving"] == "always"
