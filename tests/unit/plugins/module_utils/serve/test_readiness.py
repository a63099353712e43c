"""serve/readiness.py: the serve unit's readiness wait sends the API key only to the unit's own listener. A recorded
evidence root says who holds the port (the engine's unit, or a local user who bound it while the engine loaded); the
engine itself is an HTTP server of this test on loopback."""

from __future__ import annotations

import http.server
import json
import os
import threading

import pytest
from ansible_collections.rigbook.homelab.plugins.module_utils.serve import readiness

UNIT = "rigbook-serve-qwen.service"
GROUP = "/system.slice/rigbook-serve-qwen.service"


class Engine(http.server.BaseHTTPRequestHandler):
    seen = []  # the Authorization header of every request

    def _answer(self, body):
        Engine.seen.append(self.headers.get("Authorization"))
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):  # noqa: N802 (http.server's name)
        self._answer({})

    def do_POST(self):  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._answer({"usage": {"completion_tokens": 8}})

    def log_message(self, *args):
        pass


@pytest.fixture
def engine():
    Engine.seen = []
    server = http.server.HTTPServer(("127.0.0.1", 0), Engine)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def recorded_root(tmp_path, port, cgroup):
    """/proc as recorded: a socket (inode 4242) listening on 127.0.0.1:PORT, held by pid 700 of CGROUP."""
    root = tmp_path / "root"
    (root / "proc/net").mkdir(parents=True)
    (root / "proc/net/tcp").write_text(
        "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
        f"   0: 0100007F:{port:04X} 00000000:0000 0A 00000000:00000000 00:00000000 00000000   999        0 4242 1\n")
    (root / "proc/700/fd").mkdir(parents=True)
    (root / "proc/700/cgroup").write_text(f"0::{cgroup}\n")
    os.symlink("socket:[4242]", root / "proc/700/fd/7")
    return str(root)


def profile(port):
    return {"name": "qwen", "unit": UNIT, "bind": "127.0.0.1", "port": port, "startup_timeout_s": 30,
            "served_model_name": "qwen"}


def unit_state():
    return {"ActiveState": "active", "Result": "success", "ControlGroup": GROUP}


def test_the_units_own_listener_gets_the_key_and_the_engine_is_ready(tmp_path, engine):
    outcome = readiness.wait(profile(engine), "sk-secret", unit_state, root=recorded_root(tmp_path, engine, GROUP))
    assert outcome == {"ready": True, "seconds": outcome["seconds"], "why": None}
    assert Engine.seen == ["Bearer sk-secret", "Bearer sk-secret"]  # /health_generate, then the canary chat


def test_a_listener_outside_the_unit_gets_nothing_and_the_wait_says_why(tmp_path, engine):
    root = recorded_root(tmp_path, engine, "/user.slice/user-1000.slice/session-3.scope")
    outcome = readiness.wait(profile(engine), "sk-secret", unit_state, root=root)
    assert outcome["ready"] is False
    assert outcome["why"] == (f"a process outside {UNIT} listens on 127.0.0.1:{engine} (pid 700): the API key was not "
                              "sent")
    assert Engine.seen == []


def test_live_a_listener_of_this_process_is_outside_the_unit(engine):
    """Live: the engine stand-in runs in this test's process, in no serve unit's control group."""
    outcome = readiness.wait(profile(engine), "sk-secret", unit_state)
    assert outcome["ready"] is False and f"(pid {os.getpid()}): the API key was not sent" in outcome["why"]
    assert Engine.seen == []


def test_a_unit_that_is_not_running_has_no_control_group_and_gets_no_key(tmp_path, engine):
    outcome = readiness.wait(profile(engine), "sk-secret", lambda: {"ActiveState": "active", "ControlGroup": ""},
                             root=recorded_root(tmp_path, engine, GROUP))
    assert outcome["ready"] is False and "has no control group of its own" in outcome["why"]
    assert Engine.seen == []


def test_without_a_key_there_is_nothing_to_withhold(engine):
    outcome = readiness.wait(profile(engine), None, unit_state)
    assert outcome["ready"] is True and Engine.seen == [None, None]
