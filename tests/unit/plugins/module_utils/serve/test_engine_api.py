"""serve/engine_api.py: the engine's HTTP API as the serving layer and the serve units' readiness wait talk to it.
The readiness poll against an engine that answers 503 first is tested with the serving layer's in-test engine
(tests/unit/plugins/module_utils/judges/test_ladder_serving.py: test_the_readiness_poll_never_hammers)."""

from __future__ import annotations

import socket
import time

from ansible_collections.rigbook.homelab.plugins.module_utils.serve import engine_api


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
