"""Turn ansible-runner events into per-host state: what the live view shows and the summary reports."""

from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass, field

COUNTERS = ("ok", "changed", "failed", "unreachable", "skipped")
UNREACHABLE_HINT = ("the connection to the host was lost mid-run: once it answers SSH again, run the same command; "
                    "each role checks the host first and finishes what was cut short")
REBOOT_HINT = ("the host did not come back within rigbook_reboot_timeout after the reboot: look at its console "
               "(firmware, a kernel that does not boot, sshd not starting), then run the same command again")


@dataclass
class HostState:
    name: str
    state: str = "waiting"  # waiting, running, ok, changed, failed, unreachable
    task: str = ""
    tasks_done: int = 0
    counts: dict = field(default_factory=lambda: dict.fromkeys(COUNTERS, 0))
    failures: list = field(default_factory=list)  # {"task", "action", "msg"} and "code" when the result gave one
    warnings: list = field(default_factory=list)  # {"task", "msg"}: what a task warned (at most MAX_WARNINGS)
    notes: list = field(default_factory=list)  # {"task", "msg"}: what a task did that the summary says (its `notes`)
    ladder: list = field(default_factory=list)  # verdict dicts from the ladder module's runs
    reboot_requested: bool = False
    interrupted_in: str = ""  # the task a Ctrl-C cut short on this host
    task_started: float | None = None  # the tracker's clock when the current task started here; None between tasks
    polls: int = 0  # status checks of the current task so far (until/retries of async_status, async poll)


@dataclass(frozen=True)
class Running:
    """A host in a task right now, as the progress displays show it."""

    host: str
    task: str
    elapsed: float  # seconds in the task
    polls: int  # 0: not a polling task (or no check yet)


def _verdicts(res) -> list:
    """The ladder verdicts of a result (rigbook.homelab.ladder returns them under `ladder`), their failure codes as
    the box may send them (_typed_codes)."""
    found = res.get("ladder") if isinstance(res, dict) else None
    return [_typed_codes(v) for v in found if isinstance(v, dict) and v.get("layer")] if isinstance(found, list) else []


CODE = re.compile(r"RB-[A-Z0-9]+(?:-[A-Z0-9]+)+")
MAX_CODE = 64
MAX_CODES = 20


def _is_code(value) -> bool:
    return isinstance(value, str) and len(value) <= MAX_CODE and bool(CODE.fullmatch(value))


def _typed_codes(verdict: dict) -> dict:
    """VERDICT (a box's result: data) with `code` kept only when it is a failure code's form (CODE, at most MAX_CODE
    characters) and `codes` only as a list of at most MAX_CODES of them: anything else in their place is dropped, so
    the summary, JUnit, the report and the terminal get codes or nothing."""
    out = dict(verdict)
    if "code" in out and not _is_code(out["code"]):
        del out["code"]
    if "codes" in out:
        kept = [c for c in out["codes"] if _is_code(c)][:MAX_CODES] if isinstance(out["codes"], list) else []
        if kept:
            out["codes"] = kept
        else:
            del out["codes"]
    return out


MAX_WARNINGS = 20  # per host: a task that warns in a loop must not flood the summary


def _keep_warnings(h, task: str, res) -> None:
    """The warnings of a task's result (a list of strings; e.g. why a group build's archive was not used) kept on
    H for the summary, each one line of at most 500 characters."""
    said = res.get("warnings") if isinstance(res, dict) else None
    for text in said if isinstance(said, list) else []:
        if isinstance(text, str) and len(h.warnings) < MAX_WARNINGS:
            h.warnings.append({"task": task, "msg": " ".join(text.split())[:500]})


def _keep_notes(h, task: str, res) -> None:
    """The notes of a task's result (a list of strings: the ladder's "stopped rigbook-serve-x for the runtime layers,
    started again, ready in 41 s") kept on H for the summary, like its warnings."""
    said = res.get("notes") if isinstance(res, dict) else None
    for text in said if isinstance(said, list) else []:
        if isinstance(text, str) and len(h.notes) < MAX_WARNINGS:
            h.notes.append({"task": task, "msg": " ".join(text.split())[:500]})


def _code(res) -> str | None:
    """The failure code of a failed result (the ladder module's `code`: its failing verdict's, or a serve-unit hold
    problem's; docs/codes.md), None when it gives none."""
    code = res.get("code") if isinstance(res, dict) else None
    return code if _is_code(code) else None


def _message(res: dict) -> str:
    """The most useful one-line-ish message of a failed/unreachable result."""
    if not isinstance(res, dict):
        return str(res)
    for key in ("msg", "message", "reason"):
        value = res.get(key)
        if value:
            text = str(value)
            break
    else:
        text = ""
    stderr = (res.get("stderr") or "").strip()
    if stderr and stderr not in text:
        text = f"{text}: {stderr}" if text else stderr
    if not text and res.get("results"):
        failed = [r for r in res["results"] if isinstance(r, dict) and r.get("failed")]
        if failed:
            return _message(failed[0])
    return text or "failed (no message)"


class Tracker:
    """Consumes runner events (dicts), in the one thread ansible-runner calls the handler in. The progress displays
    read it from threads of their own (rich's refresh, the plain ticker): they go through running(), under the lock.

    CLOCK (monotonic seconds) times each host's current task; tests pass a fake one."""

    def __init__(self, clock=time.monotonic):
        self.clock = clock
        self.lock = threading.Lock()
        self.hosts: dict = {}
        self.play = ""
        self.task = ""
        self.stats: dict | None = None
        self.errors: list = []  # ansible error lines seen outside host results
        self.listeners: list = []
        # set (a plain assignment, safe in a signal handler) when Ctrl-C asked the run to stop: a task that fails
        # from then on failed because its processes were stopped, and the host is interrupted in it, not failed
        self.stopping = False

    def host(self, name: str) -> HostState:
        if name not in self.hosts:
            self.hosts[name] = HostState(name)
        return self.hosts[name]

    def handle(self, event: dict) -> bool:
        with self.lock:
            line = self._handle(event)
        if line:
            for listener in self.listeners:
                listener(line)
        return True

    def _handle(self, event: dict):
        kind = event.get("event", "")
        data = event.get("event_data") or {}
        host_name = data.get("host") or data.get("remote_addr")
        line = None
        if kind == "playbook_on_play_start":
            self.play = data.get("play") or data.get("name") or ""
            for name in data.get("hosts") or ():
                self.host(name)
            line = ("play", None, self.play)
        elif kind == "playbook_on_task_start":
            self.task = data.get("task") or data.get("name") or ""
            line = ("task", None, self.task)
        elif kind == "runner_on_start" and host_name:
            h = self.host(host_name)
            h.task = data.get("task") or self.task
            h.task_started = self.clock()
            h.polls = 0
            if h.state in ("waiting", "ok", "changed"):
                h.state = "running"
        elif kind == "runner_retry" and host_name:
            # an `until:` task checking again (async_status of a build): res["attempts"] is the check just made
            res = data.get("res")
            attempts = res.get("attempts") if isinstance(res, dict) else None
            h = self.host(host_name)
            h.polls = attempts if isinstance(attempts, int) and attempts > 0 else h.polls + 1
        elif kind == "runner_on_async_poll" and host_name:
            self.host(host_name).polls += 1  # `async:` with `poll:` > 0: ansible polls the job itself
        elif kind in ("runner_on_ok", "runner_on_failed", "runner_on_skipped", "runner_on_unreachable") and host_name:
            line = self._result(kind, host_name, data)
        elif kind == "playbook_on_stats":
            self.stats = data
            self._apply_stats(data)
            for h in self.hosts.values():
                h.task_started = None
        elif kind == "verbose":
            text = (event.get("stdout") or "").strip()
            if text.startswith("ERROR!") or "[ERROR]" in text:
                self.errors.append(text)
        elif kind == "error" or (kind == "" and "ERROR" in (event.get("stdout") or "")):
            self.errors.append((event.get("stdout") or "").strip())
        return line

    def running(self, now: float | None = None) -> list:
        """Every host in a task now, by name: Running(host, task, seconds in it, polls so far)."""
        with self.lock:
            now = self.clock() if now is None else now
            return [Running(h.name, h.task, max(0.0, now - h.task_started), h.polls)
                    for name, h in sorted(self.hosts.items()) if h.task_started is not None]

    def _result(self, kind: str, host_name: str, data: dict):
        h = self.host(host_name)
        res = data.get("res") or {}
        task = data.get("task") or self.task
        h.tasks_done += 1
        h.task_started = None
        h.ladder.extend(_verdicts(res))
        _keep_warnings(h, task, res)
        _keep_notes(h, task, res)
        if isinstance(res, dict) and res.get("reboot_required"):
            h.reboot_requested = True
        action = data.get("task_action", "")
        if kind == "runner_on_unreachable":
            h.state = "unreachable"
            msg = f"{_message(res)} ({UNREACHABLE_HINT})"
            h.failures.append({"task": task, "action": action, "msg": msg, "unreachable": True})
            return ("unreachable", host_name, f"{task}: {msg}")
        if kind in ("runner_on_failed", "runner_on_unreachable") and self.stopping and not data.get("ignore_errors"):
            h.state = "interrupted"
            h.interrupted_in = task
            return ("interrupted", host_name, task)
        if kind == "runner_on_failed":
            if data.get("ignore_errors"):
                return ("ignored", host_name, f"{task}: {_message(res)}")
            h.state = "failed"
            msg = _message(res)
            if action.endswith("reboot") and "timed out" in msg.lower():
                msg = f"{msg} ({REBOOT_HINT})"
            failure = {"task": task, "action": action, "msg": msg}
            code = _code(res)
            if code:
                failure["code"] = code
            h.failures.append(failure)
            return ("failed", host_name, f"{task}: {msg}")
        if kind == "runner_on_skipped":
            return ("skipped", host_name, task)
        changed = bool(res.get("changed")) if isinstance(res, dict) else False
        if h.state in ("waiting", "running"):
            h.state = "running"
        return ("changed" if changed else "ok", host_name, task)

    def _apply_stats(self, stats: dict) -> None:
        mapping = {"ok": "ok", "changed": "changed", "failures": "failed", "dark": "unreachable", "skipped": "skipped"}
        names = set()
        for key in mapping:
            names |= set((stats.get(key) or {}).keys())
        for name in names:
            h = self.host(name)
            for key, counter in mapping.items():
                h.counts[counter] = int((stats.get(key) or {}).get(name, 0))
            if h.counts["unreachable"]:
                h.state = "unreachable"
            elif h.counts["failed"]:
                h.state = "failed"
            elif h.counts["changed"]:
                h.state = "changed"
            else:
                h.state = "ok"

    def interrupt(self) -> None:
        """The run was stopped (Ctrl-C): a host still running is marked interrupted, in the task it was in."""
        for h in self.hosts.values():
            h.task_started = None
            if h.state == "running" or (h.state == "waiting" and h.task):
                h.state = "interrupted"
                h.interrupted_in = h.task or self.task

    def exit_code(self) -> int:
        """0 fine, 1 a host failed, 3 only unreachable hosts (caller handles 2 and 130)."""
        states = [h.state for h in self.hosts.values()]
        if "failed" in states:
            return 1
        if "unreachable" in states:
            return 3
        return 0

    def summary(self) -> dict:
        hosts = {}
        for name in sorted(self.hosts):
            h = self.hosts[name]
            entry = dict(h.counts)
            entry["state"] = h.state
            if h.failures:
                entry["failures"] = h.failures
            if h.ladder:
                entry["ladder"] = h.ladder
            if h.notes:
                entry["notes"] = h.notes
            if h.reboot_requested:
                entry["reboot_requested"] = True
            if h.interrupted_in:
                entry["interrupted_in"] = h.interrupted_in
            hosts[name] = entry
        return hosts
