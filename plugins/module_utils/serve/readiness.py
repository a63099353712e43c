# -*- coding: utf-8 -*-
# Copyright: rigbook developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Waiting for a serve unit's engine to be ready (standard library only).

SGLang has no sd_notify: the port opens only after the weights, the KV pool and graph capture, then /health_generate
answers 503 until the warm-up generation is done (research A1/A1b). Ready here means /health_generate answered 200
and then one real chat completion returned tokens (a health endpoint alone can answer 200 after the scheduler died).
"""

from __future__ import annotations

import json
import socket
import time

try:
    from urllib.error import HTTPError, URLError
    from urllib.request import Request, urlopen
except ImportError:  # pragma: no cover (Python 2 is not supported on targets)
    raise

from ansible_collections.rigbook.homelab.plugins.module_utils.serve import profile as serve_profile

# SGLang's own health check waits up to 20 s (SGLANG_HEALTH_CHECK_TIMEOUT): the client waits longer.
HEALTH_TIMEOUT_S = 30
POLL_INTERVAL_S = 2.0
CANARY = {"messages": [{"role": "user", "content": "Reply with one word: ready."}], "max_tokens": 8,
          "temperature": 0}


def base_url(profile):
    """http://HOST:PORT of the engine, reached on loopback when it binds every address."""
    bind = str(profile.get("bind") or serve_profile.DEFAULT_BIND)
    host = "127.0.0.1" if bind in ("0.0.0.0", "", "localhost") else "[::1]" if bind == "::" else bind
    if ":" in host and not host.startswith("["):
        host = "[%s]" % host
    return "http://%s:%s" % (host, serve_profile.port_of(profile))


def request(url, body=None, api_key=None, timeout=HEALTH_TIMEOUT_S):
    """(HTTP status or None when nothing answered, parsed JSON or text, error words)."""
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = "Bearer %s" % api_key
    data = json.dumps(body).encode() if body is not None else None
    try:
        with urlopen(Request(url, data=data, headers=headers), timeout=timeout) as response:
            raw = response.read().decode("utf-8", "replace")
            status = response.status
    except HTTPError as exc:
        return exc.code, exc.read().decode("utf-8", "replace")[-500:], "HTTP %d" % exc.code
    except (URLError, socket.timeout, ConnectionError, OSError) as exc:
        return None, None, str(getattr(exc, "reason", exc))
    try:
        return status, json.loads(raw), None
    except ValueError:
        return status, raw, None


def canary(profile, api_key=None, timeout=120):
    """(completion tokens, error words or None) of one real chat completion."""
    body = dict(CANARY, model=profile.get("served_model_name") or profile.get("model_path"))
    status, data, error = request(base_url(profile) + "/v1/chat/completions", body, api_key, timeout)
    if status != 200 or not isinstance(data, dict):
        return 0, "the chat completion answered %s" % (error or status)
    tokens = (data.get("usage") or {}).get("completion_tokens") or 0
    return tokens, None if tokens > 0 else "the chat completion returned no tokens"


def wait(profile, api_key, unit_state, clock=time.time, sleep=time.sleep):
    """Poll until ready or the profile's startup_timeout_s. UNIT_STATE() returns the unit's systemctl properties:
    a unit that failed stops the wait at once. Returns {ready, seconds, why}."""
    timeout = float(profile.get("startup_timeout_s") or serve_profile.DEFAULT_STARTUP_TIMEOUT_S)
    started = clock()
    last = "no answer yet"
    while clock() - started < timeout:
        state = unit_state()
        if state.get("ActiveState") in ("failed", "inactive") and state.get("SubState") != "auto-restart":
            return dict(ready=False, seconds=round(clock() - started, 1),
                        why="the unit is %s (%s) after %.0f s" % (state.get("ActiveState"), state.get("Result"),
                                                                 clock() - started))
        status, _, error = request(base_url(profile) + "/health_generate", timeout=HEALTH_TIMEOUT_S)
        if status == 200:
            tokens, why = canary(profile, api_key)
            if tokens > 0:
                return dict(ready=True, seconds=round(clock() - started, 1), why=None)
            last = why
        else:
            last = "/health_generate: %s" % (error or status)
        sleep(POLL_INTERVAL_S)
    return dict(ready=False, seconds=round(clock() - started, 1),
                why="not ready after %.0f s (startup_timeout_s); last: %s" % (timeout, last))
