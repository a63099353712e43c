"""serve/engine_api.py: the engine's HTTP API as the serving layer and the serve units' readiness wait talk to it.
The readiness poll against an engine that answers 503 first is tested with the serving layer's in-test engine
(tests/unit/plugins/module_utils/judges/test_ladder_serving.py: test_the_readiness_poll_never_hammers)."""

from __future__ import annotations

import os
import socket
import time

import pytest
from ansible_collections.rigbook.homelab.plugins.module_utils.serve import engine_api
from helpers import recorded_proc


def test_a_wildcard_bind_is_reached_over_loopback_and_the_key_goes_as_a_bearer_token():
    assert engine_api.Endpoint("0.0.0.0", 30000).address == "127.0.0.1:30000"
    assert engine_api.Endpoint("::", "30001").address == "[::1]:30001"
    assert engine_api.Endpoint("192.0.2.7", 30000).address == "192.0.2.7:30000"
    keyed = engine_api.Endpoint("127.0.0.1", 30000, "sk-1").headers({"model": "m"})
    assert keyed["Authorization"] == "Bearer sk-1" and keyed["Content-Type"] == "application/json"
    assert "Authorization" not in engine_api.Endpoint("127.0.0.1", 30000).headers(None)


def test_the_canary_request_is_deterministic_and_a_stream_asks_for_usage():
    plain = engine_api.chat_body("qwen", 8, False)
    assert plain["temperature"] == 0 and plain["ignore_eos"] and plain["max_tokens"] == 8
    assert "stream_options" not in plain
    assert engine_api.chat_body("qwen", 8, True)["stream_options"] == {"include_usage": True}


def test_not_ready_stops_at_the_timeout():
    """Nothing listens: connection refused until startup_timeout_s, polled twice in 3 s, then not ready."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, not listening: refused
        start = time.monotonic()
        ready = engine_api.wait_ready(engine_api.Endpoint("127.0.0.1", port), 3)
    assert not ready["ready"] and ready["polls"] == 2 and ready["last"] == "connection refused"
    assert time.monotonic() - start < 4.5


def test_a_unit_that_stopped_ends_the_wait_at_once():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        ready = engine_api.wait_ready(engine_api.Endpoint("127.0.0.1", sock.getsockname()[1]), 60, lambda: False)
    assert ready["polls"] == 1 and ready["error"] == "the unit stopped while waiting"


# --- the key goes to the unit's own listener only (key_verdict) -------------------------------------------------

UNIT = "rigbook-serve-qwen.service"
GROUP = "/system.slice/rigbook-serve-qwen.service"
# /proc/net/tcp in the kernel's format (an x86-64 box's byte order): 127.0.0.1:30000 (inode 4242), 0.0.0.0:30001
# (4243), 192.0.2.7:30002 (4244) and 127.0.0.1:30002 (4245) listening
TCP = ("  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
       "   0: 0100007F:7530 00000000:0000 0A 00000000:00000000 00:00000000 00000000   999        0 4242 1\n"
       "   1: 00000000:7531 00000000:0000 0A 00000000:00000000 00:00000000 00000000   999        0 4243 1\n"
       "   2: 070200C0:7532 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 4244 1\n"
       "   3: 0100007F:7532 00000000:0000 0A 00000000:00000000 00:00000000 00000000   999        0 4245 1\n")
# /proc/net/tcp6: [::]:30003 (5001)
TCP6 = ("  sl  local_address                         remote_address                        st tx_queue rx_queue\n"
        "   0: 00000000000000000000000000000000:7533 00000000000000000000000000000000:0000 0A 00000000:00000000 "
        "00:00000000 00000000  1000        0 5001 1 0 100 0 0 10 0\n")


def recorded_root(tmp_path, procs):
    return recorded_proc.recorded_root(tmp_path, TCP, TCP6, procs)


ENGINE = "0::" + GROUP + "\n"
HYBRID = "1:name=systemd:" + GROUP + "\n4:memory:/\n"
USER = "0::/user.slice/user-1000.slice/session-3.scope\n"


@pytest.mark.parametrize("host, port, procs, group, verdict, words", [
    ("127.0.0.1", 30000, {700: (ENGINE, [4242]), 701: (ENGINE, [4242])}, GROUP, "send", None),
    ("127.0.0.1", 30000, {700: (HYBRID, [4242])}, GROUP, "send", None),  # cgroup v1 with systemd's hierarchy
    ("127.0.0.1", 30000, {700: ("0::" + GROUP + "/scheduler\n", [4242])}, GROUP, "send", None),  # a sub-group
    ("127.0.0.1", 30001, {700: (ENGINE, [4243])}, GROUP, "send", None),  # 0.0.0.0 reached over loopback
    ("127.0.0.1", 30002, {700: (ENGINE, [4245]), 900: (USER, [4244])}, GROUP, "send", None),  # 192.0.2.7: not ours
    # a local user bound the port while the engine loaded
    ("127.0.0.1", 30000, {900: (USER, [4242])}, GROUP, "withhold",
     f"a process outside {UNIT} listens on 127.0.0.1:30000 (pid 900): the API key was not sent"),
    # the engine's socket, but another process holds it too
    ("127.0.0.1", 30000, {700: (ENGINE, [4242]), 900: (USER, [4242])}, GROUP, "withhold", "(pid 900)"),
    # a dual-stack [::]:30003 of another user takes IPv4 connections too
    ("127.0.0.1", 30003, {900: (USER, [5001])}, GROUP, "withhold", "listens on 127.0.0.1:30003 (pid 900)"),
    ("::1", 30003, {900: (USER, [5001])}, GROUP, "withhold", "listens on [::1]:30003 (pid 900)"),
    # a group whose name only starts like the unit's
    ("127.0.0.1", 30000, {900: ("0::" + GROUP + "-evil\n", [4242])}, GROUP, "withhold", "(pid 900)"),
    ("127.0.0.1", 30000, {}, GROUP, "withhold", "no process of " + UNIT + " was found holding the socket"),
    ("127.0.0.1", 30000, {700: (ENGINE, [4242])}, "", "withhold", "has no control group of its own (none"),
    ("127.0.0.1", 30000, {700: ("0::/\n", [4242])}, "/", "withhold", "has no control group of its own (/)"),
    ("127.0.0.1", 30009, {}, GROUP, "nobody", "nothing listens on 127.0.0.1:30009"),
], ids=["engine", "v1-hierarchy", "sub-group", "wildcard", "other-address", "squatter", "shared-socket",
        "dual-stack-v4", "dual-stack-v6", "prefix-group", "no-holder", "no-group", "root-group", "nothing"])
def test_the_key_goes_only_to_a_listener_held_by_the_units_control_group_alone(tmp_path, host, port, procs, group,
                                                                               verdict, words):
    decided, why = engine_api.key_verdict(host, port, UNIT, group, recorded_root(tmp_path, procs))
    assert decided == verdict
    assert (why is None) if words is None else words in why


def test_a_request_to_a_squatter_is_never_sent_and_says_why(tmp_path):
    root = recorded_root(tmp_path, {900: (USER, [4242])})
    endpoint = engine_api.Endpoint("127.0.0.1", 30000, "sk-secret", unit=UNIT, control_group=lambda: GROUP, root=root)
    status, data, error = engine_api.http_json(endpoint, "GET", "/v1/models")
    assert (status, data) == (None, None)
    assert error == f"a process outside {UNIT} listens on 127.0.0.1:30000 (pid 900): the API key was not sent"
    assert "sk-secret" not in error


class Listener:
    """A TCP listener on a free loopback port, in this test's own process (not in any serve unit's control group);
    `connections()` says how many connections reached it."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.sock.settimeout(0.3)
        self.port = self.sock.getsockname()[1]

    def connections(self):
        count = 0
        try:
            while True:
                conn, _ = self.sock.accept()
                conn.close()
                count += 1
        except socket.timeout:
            return count

    def close(self):
        self.sock.close()


def test_live_a_listener_outside_the_unit_gets_no_request_and_the_wait_ends_at_once():
    """Live, on loopback: this process listens on the engine's port, as a local user could while the engine loads."""
    listener = Listener()
    try:
        endpoint = engine_api.Endpoint("127.0.0.1", listener.port, "sk-secret", unit=UNIT, control_group=lambda: GROUP)
        start = time.monotonic()
        ready = engine_api.wait_ready(endpoint, 60)
        assert time.monotonic() - start < 5
        assert ready["ready"] is False and ready["withheld"] is True and ready["polls"] == 1
        assert ready["error"] == (f"a process outside {UNIT} listens on 127.0.0.1:{listener.port} (pid {os.getpid()}):"
                                  " the API key was not sent")
        assert listener.connections() == 0  # nothing was sent, not even a connection made
        # the same listener without a key: the request goes (nothing to withhold)
        status, _, _ = engine_api.http_json(engine_api.Endpoint("127.0.0.1", listener.port, None, unit=UNIT,
                                                                control_group=lambda: GROUP), "GET", "/x", timeout=1)
        assert status is None and listener.connections() == 1
    finally:
        listener.close()
