# -*- coding: utf-8 -*-
# Copyright: rigbook developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""This host's serve units around the runtime layers (all I/O; standard library only).

On a converged box the engine holds most of the GPUs' memory (seed 000: --mem-fraction-static 0.88) and serves
traffic, so the peer probe and the collectives tests run beside it out of memory or measure less than the link gives.
The rule, one climb of the runtime layers (climb_around):

- mode "stop" (the role's p2p_verify_stop_serving, the default): this host's serve units - the host model's
  (rigbook_host.serve[].unit), never another unit or process - that are running (active, activating, reloading) are
  stopped (`systemctl stop`: SIGTERM, then the unit's TimeoutStopSec) before the first runtime layer and started again
  after the last one, also when a layer fails or the climb raises: `systemctl reset-failed` (a start limit counts
  manual starts too) and `systemctl start`, then the serve role's readiness wait (serve/readiness.wait:
  /health_generate until 200, then one real chat completion, within the profile's startup_timeout_s; the API key
  only to the unit's own listener). The summary says it ("stopped U for the runtime layers, started again, ready in
  N s"); a unit that does not become ready again fails the task with its last journal lines (redacted).
- mode "keep", and check mode (which changes nothing): nothing is stopped; the layers are measured beside the engine
  and judged so (ladder/beside_engine.py: a note on the figures layers, an out-of-memory a skip naming the memory
  the engine holds).
- an engine under no serve unit of this host (started by hand on a box adopt read but the serve role has not
  converged, or a unit of the owner's: collect/engine_processes.py finds it) is never stopped: the same note.
- when "changed" (site.yml's ladder: the role's p2p_verify_runtime_when_serving) and a serve unit runs, the runtime
  layers are measured only when the GPU stack under the engine changed in this run (CHANGES: the roles' reboot
  reasons, a build switched) or a runtime layer was asked for by name (layers, --tags); otherwise each is a skip
  that says so, and nothing is stopped.

A hold is kept on the host while it lasts (STATE_FILE: the units, the holder's pid, its start time and the boot), so
that units a run cut short left stopped (the module killed, the connection lost) are started again by the role's
`always` task (mode "resume") or, at the latest, by the next runtime phase, which takes them over. The module ignores
SIGHUP while it holds units, so a connection lost mid-run does not stop it before it starts them again.
"""

from __future__ import annotations

import glob
import os
import re
import signal
import time

from ansible_collections.rigbook.homelab.plugins.module_utils.collect import engine_processes
from ansible_collections.rigbook.homelab.plugins.module_utils.facts import api_key, files, kernel, runner, systemd
from ansible_collections.rigbook.homelab.plugins.module_utils.facts import text as bounded
from ansible_collections.rigbook.homelab.plugins.module_utils.ladder import beside_engine, registry
from ansible_collections.rigbook.homelab.plugins.module_utils.parse import sglang_log
from ansible_collections.rigbook.homelab.plugins.module_utils.serve import readiness

STATE_FILE = "/var/lib/rigbook/serving-hold.json"
STOP_TIMEOUT_S = 180.0  # the serve unit's TimeoutStopSec=120 (roles/serve), then systemd's SIGKILL of what is left
COMMAND_TIMEOUT_S = 60.0
SHOW = ("ActiveState", "SubState", "Result", "ControlGroup")
RUNNING = readiness.RUNNING
JOURNAL_LINES = 30
MODES = ("stop", "keep", "resume")
WHEN = ("always", "changed")
NVIDIA_SMI_MEMORY = ["nvidia-smi", "--query-gpu=index,memory.used,memory.total", "--format=csv,noheader,nounits"]
MEMORY_LINE = re.compile(r"^\s*(\d+)\s*,\s*(\d+)\s*,\s*(\d+)\s*$")
CARD = re.compile(r"/card(\d+)/device/mem_info_vram_used$")
MIB = 1 << 20
# the codes of the hold's problems (defined in judges/serving_layer.CODES)
NOT_READY_AGAIN = "RB-SERVING-NOT-READY-AGAIN"
BUSY = "RB-SERVING-HOLD-BUSY"


# --------------------------------------------------------------------------------------------- what the GPUs hold

def parse_nvidia_memory(text):
    """[{gpu, used_mib, total_mib}] of `nvidia-smi --query-gpu=index,memory.used,memory.total
    --format=csv,noheader,nounits` TEXT (lines "0, 17800, 20480"); lines of another shape are left out."""
    gpus = []
    for line in (text or "").splitlines():
        found = MEMORY_LINE.match(line)
        if found:
            gpus.append({"gpu": found.group(1), "used_mib": bounded.integer(found.group(2)),
                         "total_mib": bounded.integer(found.group(3))})
    return gpus


def amd_memory(root):
    """[{gpu, used_mib, total_mib}] of amdgpu's mem_info_vram_used / mem_info_vram_total (bytes) under ROOT."""
    gpus = []
    for used_path in sorted(glob.glob(files.path(root, "sys/class/drm/card*/device/mem_info_vram_used"))):
        card = CARD.search(used_path)
        used = bounded.integer(files.read_text(used_path))
        total = bounded.integer(files.read_text(used_path[:-len("used")] + "total"))
        if card and used is not None:
            gpus.append({"gpu": card.group(1), "used_mib": used // MIB,
                         "total_mib": total // MIB if total is not None else None})
    return gpus


def gpu_memory(root, vendor):
    """{gpus, used_mib, total_mib, source, error}: the GPUs' memory in use under ROOT (nvidia-smi's query, recorded
    as var/lib/rigbook/commands/nvidia-smi-memory.txt under a recorded tree; amdgpu's sysfs), the vendor's way, both
    tried when VENDOR is not known."""
    gpus, source, errors = [], None, []
    if vendor != "amd":
        text, source = runner.recorded_or_live(root, "nvidia-smi-memory", NVIDIA_SMI_MEMORY, timeout=COMMAND_TIMEOUT_S)
        gpus = parse_nvidia_memory(text)
        if not gpus:
            errors.append("nvidia-smi: %s" % (source if text is None else "no memory line"))
    if not gpus and vendor != "nvidia":
        gpus, source = amd_memory(root), "amdgpu mem_info_vram_used"
        if not gpus:
            errors.append("amdgpu: no mem_info_vram_used under %s" % files.path(root, "sys/class/drm"))
    if not gpus:
        return {"gpus": [], "used_mib": None, "total_mib": None, "source": None, "error": "; ".join(errors)}
    totals = [g["total_mib"] for g in gpus]
    return {"gpus": gpus, "used_mib": sum(g["used_mib"] or 0 for g in gpus),
            "total_mib": sum(totals) if None not in totals else None, "source": source, "error": None}


# --------------------------------------------------------------------------------------------- the hold's record

def boot_id():
    return kernel.boot_id()


def process_start(pid, proc="/proc"):
    """The start time (clock ticks after boot, /proc/PID/stat's 22nd field) of a running process PID, None when it
    does not run (or is a zombie)."""
    stat = files.read_text(os.path.join(proc, str(pid), "stat"))
    fields = (stat or "").rsplit(")", 1)[-1].split()
    if len(fields) < 20 or fields[0] == "Z":
        return None
    return bounded.integer(fields[19])


def holder_alive(record, proc="/proc"):
    """Whether the run that wrote RECORD (read_record) still runs: the same boot, its pid running with the start time
    it had."""
    pid, started = record.get("pid"), record.get("started")
    if pid is None or started is None or record.get("boot_id") != boot_id():
        return False
    return process_start(pid, proc) == started


def read_record(state_path=STATE_FILE):
    """(record, error) of the hold kept at STATE_PATH, typed and bounded: {units: [unit names], pid, started,
    boot_id, since}; (None, None) when there is none; (None, why) when it cannot be read."""
    data, error = files.read_json(state_path)
    if error or data is None:
        return None, error
    if not isinstance(data, dict):
        return None, "not a JSON object"
    units = data.get("units") if isinstance(data.get("units"), list) else []
    return {"units": [u for u in (bounded.matching(u, systemd.UNIT_NAME) for u in units[:64]) if u],
            "pid": bounded.integer(data.get("pid")), "started": bounded.integer(data.get("started")),
            "boot_id": bounded.line(data.get("boot_id"), 64), "since": bounded.line(data.get("since"), 64)}, None


def held_now(state_path=STATE_FILE):
    """The record of a hold in progress (a ladder run that stopped the serve units for its runtime layers and still
    runs), or None: what the health timer reads so as not to judge an engine a ladder run stopped on purpose."""
    record, _error = read_record(state_path)
    return record if record is not None and holder_alive(record) else None


# --------------------------------------------------------------------------------------------- one hold

class Hold:
    """This host's serve units (PROFILES: the host model's, each with its unit) around one climb of the runtime
    layers. MODE: stop, keep or resume (the module doc); CHECK_MODE: nothing is stopped or started. RUN runs systemctl
    and journalctl (facts/runner.run); WAIT is serve/readiness.wait; PROC the /proc the engines are read in."""

    def __init__(self, profiles, mode="stop", check_mode=False, state_path=STATE_FILE, engine=None, root="/",
                 vendor=None, run=None, wait=None, clock=time.monotonic, proc_root="/"):
        self.profiles = dict((p["unit"], p) for p in profiles or [] if isinstance(p, dict) and p.get("unit"))
        self.mode = mode
        self.check_mode = check_mode
        self.state_path = state_path or STATE_FILE
        self.engine = engine or None
        self.root = root or "/"
        self.vendor = vendor
        self.run = run or runner.run
        self.wait = wait or readiness.wait
        self.clock = clock
        self.proc_root = proc_root
        self.states = {}
        self.state_error = None
        self.stopped = []  # the units this hold starts again: those it stopped, and those an earlier run left stopped
        self.left_by = None  # the record of an earlier run cut short whose units this hold took over
        self.not_stopped = {}  # unit -> why it still runs beside the layers
        self.started = []  # {unit, ready, seconds, why}
        self.notes = []
        self.problems = []
        self.problem_codes = []  # each problem's code (judges/serving_layer.CODES), in the problems' order
        self.busy = None
        self.settled = False
        self._sighup = None

    # --- reading
    def show(self, units):
        found, error = systemd.show(units, SHOW, run=self.run, timeout=systemd.TIMEOUT_S)
        return found, error

    def begin(self):
        """Read the units' states and a hold an earlier run left (STATE_FILE). A holder still running (another
        ladder run) sets busy; one that is gone hands its stopped units to this hold."""
        record, error = read_record(self.state_path)
        if error:
            self.notes.append("%s could not be read (%s): a new one is written" % (self.state_path, error))
        if record is not None:
            if holder_alive(record):
                self.busy = ("another ladder run (pid %s) stopped the serve units %s for its runtime layers at %s and "
                             "has not started them again yet: run again once it has ended"
                             % (record["pid"], ", ".join(record["units"]), record["since"]))
                self.settled = True  # nothing of this run's to start again
                return self
            self.left_by = record
        self.states, self.state_error = self.show(sorted(self.profiles)) if self.profiles else ({}, None)
        if self.state_error:
            self.notes.append("the serve units' state could not be read (%s): none stopped" % self.state_error)
        if self.left_by:
            left = [u for u in self.left_by["units"] if u in self.profiles]
            self.stopped = [u for u in left if not self.running(u)]
            if self.stopped:
                self.notes.append("%s: stopped by an earlier ladder run (pid %s, at %s) that was cut short before it "
                                  "started %s again" % (", ".join(self.stopped), self.left_by.get("pid"),
                                                        self.left_by.get("since"),
                                                        "it" if len(self.stopped) == 1 else "them"))
        return self

    def running(self, unit):
        return (self.states.get(unit) or {}).get("active_state") in RUNNING

    def running_units(self):
        return [u for u in sorted(self.profiles) if self.running(u) and u not in self.stopped]

    # --- the record on the host
    def _write(self, units):
        """Record UNITS as held by this run (STATE_FILE); the error text or None."""
        return files.write_json(self.state_path, {"units": list(units), "pid": os.getpid(),
                                                  "started": process_start(os.getpid()), "boot_id": boot_id(),
                                                  "since": time.strftime("%Y-%m-%dT%H:%M:%S%z")})

    def _forget(self):
        if self.check_mode or not os.path.lexists(self.state_path):
            return None
        try:
            os.unlink(self.state_path)
        except OSError as exc:
            return "cannot remove %s: %s" % (self.state_path, exc.strerror or exc)
        return None

    # --- stopping
    def stop(self):
        """Stop the running serve units (mode stop, not in check mode), the hold recorded on the host first: a unit
        whose hold cannot be recorded is not stopped (nothing would start it again after a run cut short)."""
        running = self.running_units()
        why = None
        if self.check_mode:
            why = "not stopped: check mode stops nothing"
        elif self.mode != "stop":
            why = "not stopped: p2p_verify_stop_serving is false"
        if why:
            self.not_stopped.update((u, why) for u in running)
            return self
        if not running:
            return self
        self._sighup = signal.signal(signal.SIGHUP, signal.SIG_IGN)  # a lost connection must not end the hold here
        error = self._write(self.stopped + running)
        if error:
            self.not_stopped.update((u, "not stopped: %s" % error) for u in running)
            return self
        for unit in running:
            result = self.run(["systemctl", "stop", unit], timeout=STOP_TIMEOUT_S)
            if result.rc == 0:
                self.stopped.append(unit)
            else:
                why = result.error or "rc %s" % result.rc
                self.not_stopped[unit] = "not stopped: systemctl stop failed: %s" % why
        if self.not_stopped:
            error = self._write(self.stopped) if self.stopped else self._forget()
            if error:
                self.notes.append(error)
        return self

    # --- what runs beside the layers
    def beside(self):
        """BESIDE of ladder/beside_engine.py (None when nothing runs beside the layers): the units left running with
        why, the engines under no serve unit of this host (collect/engine_processes.py), and the GPUs' memory in use."""
        labels, remedies = [], []
        for unit, why in sorted(self.not_stopped.items()):
            labels.append("%s (%s)" % (unit, why))
            if "check mode" in why:
                remedies.append("A run without --check stops the serve units for the runtime layers and starts "
                                "them again.")
            elif "p2p_verify_stop_serving" in why:
                remedies.append("Let the runtime phase stop the serve units for its layers (without -e "
                                "p2p_verify_stop_serving=false), or stop them yourself and run `provision verify` "
                                "again.")
            else:
                remedies.append("Stop %s yourself and run `provision verify` again." % unit)
        for proc in engine_processes.engines(self.proc_root, self.engine):
            unit = proc.get("unit")
            if unit in self.profiles and unit in self.states:
                continue  # one of this host's units: its state says whether it runs
            command = " ".join(proc.get("argv") or [])[:160]
            if unit in self.profiles:
                labels.append("the engine of %s (pid %d: %s; its state could not be read, not stopped)"
                              % (unit, proc["pid"], command))
                remedies.append("Stop %s yourself and run `provision verify` again." % unit)
                continue
            if unit:
                labels.append("the engine of %s (pid %d: %s; not a serve unit of this host, not stopped)"
                              % (unit, proc["pid"], command))
            else:
                labels.append("an engine started by hand (pid %d: %s; under no unit of rigbook's, not stopped)"
                              % (proc["pid"], command))
            remedies.append("Stop the engine that runs under no serve unit of this host (pid %d), or let the serve "
                            "role take it over (`provision site.yml --tags serve`: its unit then serves the port and "
                            "the runtime phase stops and starts it), then run `provision verify` again."
                            % proc["pid"])
        if not labels:
            return None
        seen = []
        for remedy in remedies:
            if remedy not in seen:
                seen.append(remedy)
        return {"engines": labels, "memory": gpu_memory(self.root, self.vendor), "remedy": " ".join(seen)}

    # --- starting again
    def release(self):
        """Start again every unit this hold stopped (or took over), wait until each is ready, forget the hold."""
        try:
            if self.check_mode:
                if self.stopped:
                    self.notes.append("check mode: %s left stopped by an earlier run would be started again"
                                      % ", ".join(self.stopped))
                self.settled = True
                return self
            begun = {}
            for unit in self.stopped:
                self.run(["systemctl", "reset-failed", unit], timeout=COMMAND_TIMEOUT_S)  # a start limit hit earlier
                begun[unit] = self.clock()
                result = self.run(["systemctl", "start", unit], timeout=COMMAND_TIMEOUT_S)
                if result.rc != 0:
                    begun.pop(unit)
                    self._not_ready(unit, "systemctl start failed: %s" % (result.error or "rc %s" % result.rc), None)
            for unit in self.stopped:
                if unit in begun:
                    self._wait(unit, begun[unit])
            error = self._forget()
            if error:
                self.notes.append(error)
            self.settled = True
        finally:
            if self._sighup is not None:
                signal.signal(signal.SIGHUP, self._sighup)
                self._sighup = None
        return self

    def _wait(self, unit, begun):
        profile = self.profiles[unit]
        key, key_error = api_key.read_key(profile.get("api_key_file"))

        def unit_state(unit=unit):
            found, _error = self.show([unit])
            state = found.get(unit) or {}
            return state.get("props") or {}

        outcome = self.wait(profile, key, unit_state)
        seconds = self.clock() - begun
        if outcome.get("ready"):
            self.started.append({"unit": unit, "ready": True, "seconds": round(seconds, 1), "why": None})
            self.notes.append("stopped %s for the runtime layers, started again, ready in %.0f s" % (unit, seconds))
            return
        why = outcome.get("why") or "not ready"
        self._not_ready(unit, why + ("; %s" % key_error if key_error else ""), key)

    def _not_ready(self, unit, why, key):
        self.started.append({"unit": unit, "ready": False, "seconds": None, "why": why})
        journal = self.run(["journalctl", "-u", unit, "-n", str(JOURNAL_LINES), "--no-pager", "-o", "cat"],
                           timeout=COMMAND_TIMEOUT_S)
        lines = sglang_log.redact((journal.stdout or journal.error or "").strip(), [key] if key else [])
        self.problems.append("%s was stopped for the runtime layers and is not ready again: %s. Its last journal "
                             "lines:\n%s" % (unit, why, bounded.bounded(lines, 4000)))
        self.problem_codes.append(NOT_READY_AGAIN)

    def report(self):
        """What the module returns as serving_hold (no key, no journal beyond the problems); codes: the problems'
        codes, then the busy hold's (judges/serving_layer.CODES)."""
        return {"stopped": list(self.stopped), "started": list(self.started),
                "not_stopped": dict(self.not_stopped), "left_by": self.left_by, "settled": self.settled,
                "busy": self.busy, "notes": list(self.notes), "problems": list(self.problems),
                "codes": list(self.problem_codes) + ([BUSY] if self.busy else [])}


# --------------------------------------------------------------------------------------------- one climb

def _failed(verdicts):
    return any(v["status"] == "fail" for v in verdicts)


def _merge(evidence, more):
    evidence.update((k, v) for k, v in more.items() if k != "root")
    return evidence


def climb_around(layers, ctx, climb, hold, when="always", changes=(), asked=False):
    """(verdicts, evidence) of LAYERS (registry.Layer, ladder order) climbed with CLIMB (ladder/climb.climb) through
    CTX, the runtime ones inside HOLD (begun): the serve units stopped before them and started again after, whatever
    happens (the module doc). WHEN "changed": on a box whose serve units run, the runtime layers are measured only when
    CHANGES names what changed under them in this run or they were ASKED for; otherwise each is a skip."""
    before = [layer for layer in layers if layer.phase == registry.STATIC]
    runtime = [layer for layer in layers if layer.phase == registry.RUNTIME]
    after = [layer for layer in layers if layer.phase == registry.SERVING]
    verdicts, evidence = climb(before, ctx) if before else ([], {"root": ctx.root})
    if _failed(verdicts) or not runtime:
        hold.release()
        return verdicts, evidence
    serving = hold.running_units()
    if when == "changed" and serving and not list(changes) and not asked:
        hold.release()  # only what an earlier run cut short left stopped
        why = ("not measured by this run: %s serves and nothing under it changed in this run (the roles changed no "
               "kernel, driver, boot target or GPU library); `provision verify` measures the runtime layers, stopping "
               "the engine for them" % ", ".join(serving))
        hold.notes.append("runtime layers not measured: %s serves and nothing under it changed in this run "
                          "(`provision verify` measures them)" % ", ".join(serving))
        return verdicts + beside_engine.not_measured([layer.name for layer in runtime], why), evidence
    if when == "changed" and serving and list(changes):
        hold.notes.append("runtime layers measured: the GPU stack under the engine changed in this run (%s)"
                          % "; ".join(changes))
    try:
        hold.stop()
        beside = hold.beside()
        ctx.options["beside"] = beside
        if beside:
            hold.notes.append("the runtime layers ran beside %s" % beside_engine.engines_text(beside))
        more, found = climb(runtime, ctx)
        verdicts += more
        _merge(evidence, found)
        if beside:
            evidence["beside_engine"] = beside
    finally:
        hold.release()
    if after and not _failed(verdicts) and not hold.problems:
        more, found = climb(after, ctx)
        verdicts += more
        _merge(evidence, found)
    return verdicts, evidence
