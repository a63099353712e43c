# -*- coding: utf-8 -*-
# Copyright: rigbook developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The serving engine's HTTP API as rigbook talks to it (standard library only): the address, the requests and the
readiness poll that the serving layer (collect/serving_evidence.py) and the serve units' readiness wait
(serve/readiness.py) share.

- Endpoint: the profile's bind address (0.0.0.0 / :: are reached through loopback), its port, the Bearer key.
- The key goes only to the engine's unit (key_verdict): before each request that carries it, the socket listening
  on the address must be held by processes of the unit's control group alone (facts/sockets.py: /proc/net/tcp{,6},
  /proc/PID/fd, /proc/PID/cgroup; the unit's ControlGroup from facts/systemd.show). While the engine loads, its
  port is free, and any local user may bind it to catch the key: then no request is sent, the key withheld
  (KeyWithheld, "a process outside UNIT listens on ADDRESS: the API key was not sent"), and the readiness wait ends
  at once with that verdict. Nothing listening is a refused connection, without connecting.
- Readiness: GET /health_generate (it generates one token; SGLang's own timeout is 20 s, so the client waits
  HEALTH_CLIENT_TIMEOUT_S), at most one request per MIN_POLL_GAP_S, the gap doubling up to MAX_POLL_GAP_S, within
  the profile's startup_timeout_s.
- chat_body: the canary chat request, deterministic (temperature 0, ignore_eos).
"""

from __future__ import annotations

import errno
import http.client
import ipaddress
import json
import socket
import time

from ansible_collections.rigbook.homelab.plugins.module_utils.facts import sockets, systemd

LOOPBACK_FOR = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}
HEALTH_PATH = "/health_generate"
HEALTH_CLIENT_TIMEOUT_S = 30.0  # above SGLANG_HEALTH_CHECK_TIMEOUT (20 s): a slow answer is not a timeout
MIN_POLL_GAP_S = 2.0
MAX_POLL_GAP_S = 15.0
REQUEST_TIMEOUT_S = 300.0
PROMPT = ("Count from one upwards in English words, one number per line, and do not stop: one, two, three, "
          "four, five, and so on.")


SEND, NOBODY, WITHHOLD = "send", "nobody", "withhold"


class KeyWithheld(OSError):
    """The API key was not sent: what listens on the engine's address is not (only) the engine's unit."""


def unit_control_group(unit, run=None):
    """UNIT's ControlGroup as `systemctl show` says it (facts/systemd.show), "" when it has none (not running) or
    cannot be read."""
    found, _error = systemd.show([unit], ["ControlGroup"], run=run)
    state = found.get(unit) or (list(found.values())[0] if len(found) == 1 else {})
    return (state.get("props") or {}).get("ControlGroup") or ""


def _reaches(listener, host):
    """Whether a connection to HOST may reach the socket LISTENER listens on (its own address, a wildcard of the
    family, a dual-stack ::, an IPv4-mapped address); a HOST that is no address: every listener of the port."""
    try:
        want = ipaddress.ip_address(host)
        have = ipaddress.ip_address(listener["address"])
    except ValueError:
        return True
    if have.is_unspecified:
        return have.version == 6 or want.version == 4
    return have == want or (have.version == 6 and want.version == 4 and have.ipv4_mapped == want)


def key_verdict(host, port, unit, control_group, root="/"):
    """(SEND | NOBODY | WITHHOLD, why) for a request carrying UNIT's API key to HOST:PORT: SEND when every socket
    listening there is held by processes of CONTROL_GROUP (UNIT's, as systemd names it) and by no other process;
    NOBODY when nothing listens there; WITHHOLD, with why, otherwise (the root group, an empty one, a process outside
    the unit, a socket no process could be found holding). ROOT: the evidence root ("/" live)."""
    address = ("[%s]:%d" if ":" in host else "%s:%d") % (host, int(port))
    listeners = [s for s in sockets.listening(root, port) if _reaches(s, host)]
    if not listeners:
        return NOBODY, "nothing listens on %s" % address
    group = (control_group or "").strip()
    if not group.startswith("/") or group.rstrip("/") == "":
        return WITHHOLD, ("%s has no control group of its own (%s): who listens on %s cannot be told apart from "
                          "it, the API key was not sent" % (unit, "none: not running" if not group else group,
                                                            address))
    held = sockets.holders(root, [s["inode"] for s in listeners])
    for listener in listeners:
        pids = held.get(listener["inode"]) or []
        if not pids:
            return WITHHOLD, ("no process of %s was found holding the socket that listens on %s: the API key was "
                              "not sent" % (unit, address))
        outside = [pid for pid in pids if not sockets.in_group(sockets.cgroups_of(root, pid), group)]
        if outside:
            return WITHHOLD, ("a process outside %s listens on %s (pid %s): the API key was not sent"
                              % (unit, address, ", ".join(str(pid) for pid in outside[:5])))
    return SEND, None


class Endpoint:
    """The engine's HTTP address (loopback for a wildcard bind), its Bearer key and the unit the key belongs to.

    With API_KEY and UNIT, the key goes only where key_verdict says SEND: CONTROL_GROUP() gives the unit's
    ControlGroup (default: unit_control_group), ROOT the evidence root the sockets are read under. Without UNIT
    there is nothing to check the listener against and the key goes as it is."""

    def __init__(self, bind, port, api_key=None, unit=None, control_group=None, root="/"):
        self.host = LOOPBACK_FOR.get(bind, bind)
        self.port = int(port)
        self.api_key = api_key
        self.unit = unit
        self.control_group = control_group or (lambda: unit_control_group(unit))
        self.root = root
        self.withheld = None  # why the last request was not sent, when its key was withheld
        self._group = ""  # the unit's ControlGroup once read (a unit's group path stays while it is the same unit)

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

    def check_listener(self):
        """Raise KeyWithheld (a refused connection when nothing listens) unless the key may go (key_verdict)."""
        self.withheld = None
        if not (self.api_key and self.unit):
            return
        self._group = self._group or self.control_group()  # one `systemctl show` per endpoint, not per request
        verdict, why = key_verdict(self.host, self.port, self.unit, self._group, self.root)
        if verdict == NOBODY:
            raise ConnectionRefusedError(errno.ECONNREFUSED, why)
        if verdict != SEND:
            self.withheld = why
            raise KeyWithheld(why)

    def open(self, method, path, body=None, timeout=REQUEST_TIMEOUT_S):
        """(connection, response) of one request; raises OSError / http.client.HTTPException, KeyWithheld (an
        OSError) before connecting when the key may not go there."""
        self.check_listener()
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
    if isinstance(exc, KeyWithheld):
        return exc.args[0]
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
    MIN_POLL_GAP_S (the gap doubling up to MAX_POLL_GAP_S), until TIMEOUT_S; STILL_RUNNING() false stops it, and so
    does a key withheld (KeyWithheld: "withheld" true, "error" why)."""
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
        if endpoint.withheld:
            return {"ready": False, "waited_s": waited, "polls": polls, "last": last, "error": endpoint.withheld,
                    "withheld": True}
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
