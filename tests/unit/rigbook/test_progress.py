"""Progress on long tasks: the tracker times each host's task (and counts an async build's status checks), the live
view shows the time, and in a pipe a ticker thread prints a "still in" line per long-running host.

Events are synthetic runner events in ansible-runner's shape (event, event_data: host, task, res); the clock is
fake, so nothing here waits on real time except the thread tests (a few hundredths of a second).
"""

from __future__ import annotations

import io
import re
import threading
import time

import pytest
from rich.console import Console

from rigbook import display
from rigbook.tracker import Running, Tracker


class Clock:
    def __init__(self, now: float = 1000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class Pipe(io.StringIO):
    def isatty(self) -> bool:
        return False


def ev(kind: str, host: str | None = None, **data) -> dict:
    if host:
        data["host"] = host
    return {"event": kind, "event_data": data}


def start(tracker: Tracker, task: str, *hosts: str) -> None:
    tracker.handle(ev("playbook_on_task_start", task=task))
    for host in hosts:
        tracker.handle(ev("runner_on_start", host, task=task))


def ok(tracker: Tracker, task: str, host: str) -> None:
    tracker.handle(ev("runner_on_ok", host, task=task, res={"changed": False}))


def retry(tracker: Tracker, task: str, host: str, attempts: int) -> None:
    tracker.handle(ev("runner_retry", host, task=task, res={"attempts": attempts, "retries": 361,
                                                            "finished": 0, "_ansible_retry": True}))


# --- the tracker ------------------------------------------------------------------------------------------------

def test_each_task_is_timed_from_its_own_start_per_host():
    clock = Clock()
    tracker = Tracker(clock=clock)
    start(tracker, "Build RCCL", "a", "b")
    clock.advance(40)
    assert tracker.running() == [Running("a", "Build RCCL", 40.0, 0), Running("b", "Build RCCL", 40.0, 0)]
    ok(tracker, "Build RCCL", "a")  # a is done: not in a task until its next one starts
    assert [r.host for r in tracker.running()] == ["b"]
    ok(tracker, "Build RCCL", "b")
    start(tracker, "Wait for the RCCL build", "a")
    clock.advance(5)
    tracker.handle(ev("runner_on_start", "b", task="Wait for the RCCL build"))
    clock.advance(2)
    assert tracker.running() == [Running("a", "Wait for the RCCL build", 7.0, 0),
                                 Running("b", "Wait for the RCCL build", 2.0, 0)]  # reset, not 47 s


def test_retries_of_an_async_status_task_are_counted_and_reset_by_the_next_task():
    clock = Clock()
    tracker = Tracker(clock=clock)
    start(tracker, "Wait for the RCCL build", "lab-r9700")
    for attempt in (1, 2, 3, 4, 5, 6):
        clock.advance(15)
        retry(tracker, "Wait for the RCCL build", "lab-r9700", attempt)
    assert tracker.running() == [Running("lab-r9700", "Wait for the RCCL build", 90.0, 6)]
    tracker.handle(ev("runner_retry", "lab-r9700", task="Wait for the RCCL build", res={}))  # no attempts: one more
    assert tracker.running()[0].polls == 7
    ok(tracker, "Wait for the RCCL build", "lab-r9700")
    start(tracker, "Install RCCL", "lab-r9700")
    assert tracker.running() == [Running("lab-r9700", "Install RCCL", 0.0, 0)]


def test_async_poll_events_count_as_polls():
    tracker = Tracker(clock=Clock())
    start(tracker, "Build the DKMS module", "h")
    for _ in range(3):
        tracker.handle(ev("runner_on_async_poll", "h", task="Build the DKMS module",
                          res={"ansible_job_id": "j1", "started": 1, "finished": 0}))
    assert tracker.running()[0].polls == 3


def test_failure_skip_unreachable_stats_and_interrupt_end_the_timing():
    clock = Clock()
    tracker = Tracker(clock=clock)
    start(tracker, "T", "f", "s", "u", "r", "i")
    tracker.handle(ev("runner_on_failed", "f", task="T", res={"msg": "no"}))
    tracker.handle(ev("runner_on_skipped", "s", task="T"))
    tracker.handle(ev("runner_on_unreachable", "u", task="T", res={"msg": "gone"}))
    assert [r.host for r in tracker.running()] == ["i", "r"]
    tracker.interrupt()
    assert tracker.running() == []
    assert tracker.hosts["i"].interrupted_in == "T"  # what the summary reports is unchanged
    start(tracker, "T2", "r")
    tracker.handle(ev("playbook_on_stats", ok={"r": 1}))
    assert tracker.running() == []


# --- the plain lines ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("seconds, text", [(0, "0s"), (3.9, "3s"), (59.99, "59s"), (60, "1m00s"), (90, "1m30s"),
                                           (130, "2m10s"), (3599, "59m59s"), (3600, "1h00m"), (7500, "2h05m")])
def test_elapsed(seconds, text):
    assert display.elapsed(seconds) == text


def test_still_line_format_and_silence_for_short_tasks():
    running = [Running("lab-3080", "Install the CUDA wheels", 29.9, 0),
               Running("lab-r9700", "Wait for the RCCL build", 90.0, 6),
               Running("lab-x", "Wait for the host to come back", 30.0, 0)]
    assert display.still_lines(running, 30) == [
        "  ... lab-r9700: still in 'Wait for the RCCL build' after 1m30s (poll 6)",
        "  ... lab-x: still in 'Wait for the host to come back' after 30s",  # poll only when known
    ]
    assert display.still_lines(running[:1], 30) == []
    assert display.still_lines([], 30) == []


def test_ticker_tick_reads_the_tracker():
    clock = Clock()
    tracker = Tracker(clock=clock)
    start(tracker, "Wait for the RCCL build", "lab-r9700", "lab-3080")
    ok(tracker, "Wait for the RCCL build", "lab-3080")
    got = []
    ticker = display.Ticker(tracker, 30, lambda line, stopped: got.append(line))
    clock.advance(10)
    assert ticker.tick() == [] and got == []  # nothing long-running: no line at all
    clock.advance(80)
    retry(tracker, "Wait for the RCCL build", "lab-r9700", 6)
    assert ticker.tick() == ["  ... lab-r9700: still in 'Wait for the RCCL build' after 1m30s (poll 6)"]
    assert got == ["  ... lab-r9700: still in 'Wait for the RCCL build' after 1m30s (poll 6)"]


@pytest.mark.parametrize("value, every, warned", [
    (None, 30.0, False), ("", 30.0, False), ("1", 1.0, False), ("0.25", 0.25, False), ("0", None, False),
    ("off", None, False), ("soon", 30.0, True), ("-3", 30.0, True), ("nan", 30.0, True), ("inf", 30.0, True),
])
def test_progress_every_from_the_environment(value, every, warned):
    environ = {} if value is None else {"RIGBOOK_PROGRESS_EVERY": value}
    got, warning = display.progress_every(environ)
    assert got == every
    assert bool(warning) == warned
    if warned:
        assert "RIGBOOK_PROGRESS_EVERY" in warning and "every 30s" in warning


# --- the thread ---------------------------------------------------------------------------------------------------

def _progress_threads() -> list:
    return [t for t in threading.enumerate() if t.name == "rigbook-progress"]


def test_plain_progress_prints_still_lines_during_the_run_and_nothing_after_it():
    tracker = Tracker()  # the real clock: the thread ticks every 0.02 s
    stream = Pipe()
    progress = display.progress_for(tracker, stream, "t", every=0.02)
    assert isinstance(progress, display.PlainProgress)
    with progress:
        assert len(_progress_threads()) == 1 and _progress_threads()[0].daemon
        start(tracker, "Sleep", "localhost")
        deadline = time.monotonic() + 5
        while "still in 'Sleep'" not in stream.getvalue() and time.monotonic() < deadline:
            time.sleep(0.01)
    assert _progress_threads() == []  # stopped and joined with the run
    ended = stream.getvalue()
    assert "  TASK Sleep\n" in ended
    assert "  ... localhost: still in 'Sleep' after 0s\n" in ended
    assert all(line.endswith("'Sleep' after 0s") for line in ended.splitlines() if "still in" in line)
    time.sleep(0.1)  # the host is still "in" its task, but the run is over: nothing more
    assert stream.getvalue() == ended


def test_plain_progress_is_silent_while_tasks_are_short():
    tracker = Tracker()
    stream = Pipe()
    with display.progress_for(tracker, stream, "t", every=0.05):
        for n in range(10):
            start(tracker, f"Quick {n}", "localhost")
            time.sleep(0.01)
            ok(tracker, f"Quick {n}", "localhost")
        time.sleep(0.15)  # three ticks with no host in a task
    assert "still in" not in stream.getvalue()


def test_the_ticker_stops_on_ctrl_c():
    tracker = Tracker()
    stream = Pipe()
    with pytest.raises(KeyboardInterrupt):
        with display.progress_for(tracker, stream, "t", every=0.01):
            start(tracker, "Sleep", "h")
            time.sleep(0.05)
            raise KeyboardInterrupt
    assert _progress_threads() == []
    ended = stream.getvalue()
    time.sleep(0.05)
    assert stream.getvalue() == ended


def test_no_ticker_when_turned_off():
    tracker = Tracker()
    with display.progress_for(tracker, Pipe(), "t", every=None) as progress:
        assert progress.ticker is None and _progress_threads() == []


def test_a_line_queued_behind_stop_is_dropped():
    stream = Pipe()
    progress = display.PlainProgress(Tracker(), stream, every=10)
    stopped = threading.Event()
    progress.write("  ... a: still in 'T' after 10s", stopped)
    stopped.set()
    progress.write("  ... a: still in 'T' after 20s", stopped)
    assert stream.getvalue() == "  ... a: still in 'T' after 10s\n"


# --- the live view ------------------------------------------------------------------------------------------------

def test_live_view_shows_each_running_hosts_time_in_its_task():
    clock = Clock()
    tracker = Tracker(clock=clock)
    start(tracker, "Wait for the RCCL build", "lab-r9700")
    start(tracker, "Install the CUDA wheels", "lab-3080")
    clock.advance(130)
    retry(tracker, "Wait for the RCCL build", "lab-r9700", 8)
    ok(tracker, "Install the CUDA wheels", "lab-3080")
    out = io.StringIO()
    console = Console(file=out, width=200, force_terminal=False, no_color=True)
    view = display.LiveProgress(tracker, console, "provision site.yml -i lab")
    console.print(view.render())
    rows = {line.split()[0]: line for line in out.getvalue().splitlines() if line.strip().startswith("lab-")}
    assert "Wait for the RCCL build" in rows["lab-r9700"] and "2m10s (poll 8)" in rows["lab-r9700"]
    assert "Install the CUDA wheels" in rows["lab-3080"]
    assert not re.search(r"\b\d+(m\d\d)?s\b", rows["lab-3080"])  # done with its task: no time


def test_a_task_that_fails_because_ctrl_c_stopped_it_is_the_interruption_not_a_failure():
    """Ctrl-C stops ansible's process tree: a module killed mid-task comes back as a failed result ("Module result
    deserialization failed") before ansible itself ends. Once the run is stopping, that host is interrupted in the
    task, as the summary says; a failure before Ctrl-C stays a failure."""
    tracker = Tracker()
    tracker.handle({"event": "playbook_on_task_start", "event_data": {"task": "Build"}})
    tracker.handle({"event": "runner_on_failed", "event_data": {"host": "rig-a", "task": "Build",
                                                                "res": {"msg": "compiler error"}}})
    tracker.handle({"event": "playbook_on_task_start", "event_data": {"task": "Sleep"}})
    tracker.handle({"event": "runner_on_start", "event_data": {"host": "rig-b", "task": "Sleep"}})
    tracker.stopping = True  # what the CLI's Ctrl-C handler sets
    tracker.handle({"event": "runner_on_failed", "event_data": {
        "host": "rig-b", "task": "Sleep", "res": {"msg": "Module result deserialization failed: No start of json"}}})
    tracker.interrupt()
    a, b = tracker.hosts["rig-a"], tracker.hosts["rig-b"]
    assert (a.state, [f["msg"] for f in a.failures]) == ("failed", ["compiler error"])
    assert (b.state, b.interrupted_in, b.failures) == ("interrupted", "Sleep", [])


def test_a_boxs_failure_codes_reach_the_summary_only_in_a_codes_form():
    """A verdict comes back from the box: its `code`/`codes` are kept only as failure codes (RB-..., bounded), so a
    lying box cannot put escape sequences, templates or megabytes where the summary, JUnit and the report print them."""
    tracker = Tracker()
    tracker.handle({"event": "playbook_on_task_start", "event_data": {"task": "Ladder"}})
    ladder = [{"layer": "pcie_link", "status": "fail", "code": "RB-PCIE-LINK-WIDTH",
               "codes": ["RB-PCIE-LINK-WIDTH", "\x1b[31m{{ lookup('pipe', 'id') }}", "RB-X-" + "Y" * 100, 7]},
              {"layer": "firmware", "status": "fail", "code": "\x1b]0;pwned\x07", "codes": "RB-FIRMWARE-FAIL"}]
    tracker.handle({"event": "runner_on_ok", "event_data": {"host": "rig-a", "task": "Ladder",
                                                            "res": {"ladder": ladder}}})
    kept = tracker.hosts["rig-a"].ladder
    assert kept[0]["code"] == "RB-PCIE-LINK-WIDTH" and kept[0]["codes"] == ["RB-PCIE-LINK-WIDTH"]
    assert "code" not in kept[1] and "codes" not in kept[1]
