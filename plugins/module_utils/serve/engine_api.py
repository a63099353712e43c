# -*- coding: utf-8 -*-
# Copyright: rigbook developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The serving engine's HTTP API as rigbook talks to it (standard library only): the address, the requests and the
readiness poll that the serving layer (collect/serving_evidence.py) and the serve units' readiness wait
(serve/readiness.py) share.

- Endpoint: the profile's bind address (0.0.0.0 / :: are reached through loopback), its port, the Bearer key.
- Readiness: GET /health_generate (it generates one token; SGLang's own timeout is 20 s, so the client waits
  HEALTH_CLIENT_TIMEOUT_S), at most one request per MIN_POLL_GAP_S, the gap doubling up to MAX_POLL_GAP_S, within
  the profile's startup_timeout_s.
- chat_body: the canary chat request, deterministic (temperature 0, ignore_eos).
"""

from __future__ import annotations

import http.client
import json
import socket
import time

LOOPBACK_FOR = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}
HEALTH_PATH = "/health_generate"
HEALTH_CLIENT_TIMEOUT_S = 30.0  # above SGLANG_HEALTH_CHECK_TIMEOUT (20 s): a slow answer is not a timeout
MIN_POLL_GAP_S = 2.0
MAX_POLL_GAP_S = 15.0
REQUEST_TIMEOUT_S = 300.0
PROMPT = ("Count from one upwards in English words, one number per line, and do not stop: one, two, three, "
          "four, five, and so on.")


class Endpoint:
    """The engine's HTTP address (loopback for a wildcard bind) and its Bearer key."""

    def __init__(self, bind, port, api_key=None):
        self.host = LOOPBACK_FOR.get(bind, bind)
        self.port = int(port)
        self.api_key = api_key

    @property
    def address(self):
        return ("[%s]:%d" if ":" in self.host else "%s:%d") % (self.host, self.port)

    def headers(self, body):
        headers = {"Accept": "application/json, text/event-stream"}
        if body is not None:
            headers["Content-Type"] = "application/json"
        if self.api_key:
            headers["Authorization"] = "Bearer " + self.api_key
        return headers

    def open(self, method, path, body=None, timeout=REQUEST_TIMEOUT_S):
        """(connection, response) of one request; raises OSError / http.client.HTTPException."""
        conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        payload = None if body is None else json.dumps(body).encode()
        try:
            conn.request(method, path, body=payload, headers=self.headers(body))
            return conn, conn.getresponse()
        except BaseException:
            conn.close()
            raise


def error_text(exc):
    """What a failed request says: "timed out", "connection refused", or the exception's own text."""
    if isinstance(exc, socket.timeout):
        return "timed out"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    return str(exc) or type(exc).__name__


def http_json(endpoint, method, path, body=None, timeout=REQUEST_TIMEOUT_S):
    """(status, parsed JSON or None, error) of one request; status None when no answer came."""
    try:
        conn, resp = endpoint.open(method, path, body, timeout)
    except (OSError, http.client.HTTPException) as exc:
        return None, None, error_text(exc)
    try:
        raw = resp.read()
    except (OSError, http.client.HTTPException) as exc:
        return resp.status, None, error_text(exc)
    finally:
        conn.close()
    try:
        data = json.loads(raw.decode(errors="replace")) if raw else None
    except ValueError:
        data = None
    error = None if resp.status == 200 else "HTTP %d: %s" % (resp.status, raw.decode(errors="replace")[:200])
    return resp.status, data, error


def wait_ready(endpoint, timeout_s, still_running=None, clock=time.monotonic, sleep=time.sleep):
    """{ready, waited_s, polls, last}: GET /health_generate until it answers 200, at most one request per
    MIN_POLL_GAP_S (the gap doubling up to MAX_POLL_GAP_S), until TIMEOUT_S; STILL_RUNNING() false stops it."""
    start, gap, polls, last = clock(), MIN_POLL_GAP_S, 0, None
    while True:
        sent = clock()
        polls += 1
        remaining = timeout_s - (sent - start)
        status, _, error = http_json(endpoint, "GET", HEALTH_PATH, None,
                                     max(1.0, min(HEALTH_CLIENT_TIMEOUT_S, remaining)))
        waited = round(clock() - start, 3)
        if status == 200:
            return {"ready": True, "waited_s": waited, "polls": polls, "last": "HTTP 200"}
        last = "HTTP %d" % status if status else error
        if still_running is not None and not still_running():
            return {"ready": False, "waited_s": waited, "polls": polls, "last": last,
                    "error": "the unit stopped while waiting"}
        next_at = sent + gap
        gap = min(gap * 2, MAX_POLL_GAP_S)
        if next_at - start >= timeout_s:
            return {"ready": False, "waited_s": waited, "polls": polls, "last": last}
        sleep(max(0.0, next_at - clock()))


def chat_body(model, max_tokens, stream):
    """The canary request: deterministic, long enough to time decoding (ignore_eos keeps it from stopping)."""
    body = {"model": model, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": max_tokens,
            "temperature": 0, "ignore_eos": True, "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body
