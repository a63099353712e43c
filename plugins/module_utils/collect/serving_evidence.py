# -*- coding: utf-8 -*-
# Copyright: rigbook developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Evidence of the serving layer (all I/O; standard library only): per serve profile, its systemd unit, a
readiness poll, /v1/models, one streaming and one plain chat completion, and the engine's journal.

- The unit: `systemctl show UNIT -p ...` (active state, NRestarts, the main process's start), and NRestarts at
  the last run from a small state file on the host (STATE_FILE), updated after each live measurement (not in
  check mode). A counter lower than the recorded one was reset by a manual start and counts from 0.
- Readiness: GET /health_generate (it generates one token; SGLang's own timeout is 20 s, so the client waits
  HEALTH_CLIENT_TIMEOUT_S), at most one request per MIN_POLL_GAP_S, the gap doubling up to MAX_POLL_GAP_S,
  within the profile's startup_timeout_s; a unit that is not running is not polled.
- TTFT: the time to the first non-empty delta (content or reasoning_content) of a streaming request with
  stream_options.include_usage. Decode tok/s: usage.completion_tokens / (elapsed - TTFT) of a plain request,
  never per-chunk gaps (speculative decoding sends several tokens a chunk); per_chunk_tok_s is what a per-chunk
  timer would have said (chunks/s), kept for comparison only.
- The journal since the main process started (`--since=@EPOCH`, else the boot), bounded to its first
  JOURNAL_HEAD_LINES and last JOURNAL_TAIL_LINES lines, read by parse/sglang_log.py; the text itself is never
  kept in the evidence.
- The API key is read from api_key_file and sent as a Bearer token; it is never put in the evidence (every
  string of a measured part is scrubbed of it and of any api_key value an engine log line shows:
  sglang_log.redact). The journal is parsed before that, so api_key_logged still says the engine logged a key.
- Connects only to the profile's bind address (0.0.0.0 / :: are reached through loopback).

Under a recorded root, var/lib/rigbook/commands/serving-<name>.json holds a profile's whole measured part and is
returned instead of measuring; without one the profiles given are measured live (a lab host runs the engine
stand-in under its recorded root), and with none given the recorded profiles are judged (replay).
"""

from __future__ import annotations

import collections
import glob
import http.client
import json
import os
import re
import socket
import subprocess
import threading
import time

from ansible_collections.rigbook.homelab.plugins.module_utils import host_state
from ansible_collections.rigbook.homelab.plugins.module_utils.collect import collective_bench, engine_processes, pci
from ansible_collections.rigbook.homelab.plugins.module_utils.collect import static_evidence as recorded
from ansible_collections.rigbook.homelab.plugins.module_utils.parse import sglang_log
from ansible_collections.rigbook.homelab.plugins.module_utils.serve import profile as serve_profile

STATE_FILE = "/var/lib/rigbook/serving-state.json"
RECORDING = "serving-%s.json"
LOOPBACK_FOR = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}

HEALTH_PATH = "/health_generate"
HEALTH_CLIENT_TIMEOUT_S = 30.0  # above SGLANG_HEALTH_CHECK_TIMEOUT (20 s): a slow answer is not a timeout
MIN_POLL_GAP_S = 2.0
MAX_POLL_GAP_S = 15.0
REQUEST_TIMEOUT_S = 300.0
STREAM_MAX_TOKENS = 32  # TTFT needs the first token; a few chunks show what a per-chunk timer would say
DECODE_MAX_TOKENS = 256  # long enough that decode time dwarfs TTFT jitter, short enough for every verify
PROMPT = ("Count from one upwards in English words, one number per line, and do not stop: one, two, three, "
          "four, five, and so on.")

SHOW_PROPERTIES = ("LoadState", "ActiveState", "SubState", "NRestarts", "ExecMainStartTimestamp", "MainPID")
COMMAND_TIMEOUT_S = 30.0
JOURNAL_HEAD_LINES = 3000
JOURNAL_TAIL_LINES = 2000
LOG_KEYS = ("version", "ready", "load_weight_s", "cuda_graph_s", "nccl_version", "path", "all_direct_p2p",
            "custom_all_reduce", "errors", "error_count", "gen_throughput_tok_s", "accept_len", "api_key_logged")
MAX_LOG_ERRORS = 10
MAX_LOG_FIGURES = 20


# --------------------------------------------------------------------------------------------- the profiles

def _number(value):
    if isinstance(value, bool):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def read_api_key(path):
    """(key, error) from API_KEY_FILE: its first line, stripped (None without a file)."""
    if not path:
        return None, None
    try:
        with open(path) as handle:
            key = handle.readline().strip()
    except (OSError, UnicodeDecodeError) as exc:
        return None, "api_key_file %s: %s" % (path, getattr(exc, "strerror", None) or exc)
    return (key or None), (None if key else "api_key_file %s is empty" % path)


# --------------------------------------------------------------------------------------------- the unit

def _run(argv, timeout=COMMAND_TIMEOUT_S):
    """(stdout, error) of ARGV."""
    try:
        proc = subprocess.run(argv, capture_output=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, "%s: %s" % (" ".join(argv), exc)
    if proc.returncode != 0:
        return None, "%s exited %d: %s" % (" ".join(argv), proc.returncode,
                                           proc.stderr.decode(errors="replace").strip()[-300:])
    return proc.stdout.decode(errors="replace"), None


def parse_show(text):
    """`systemctl show -p ...` output -> {id (with -p Id), load_state, active_state, sub_state, n_restarts, main_pid,
    started_at (as printed), started_epoch (float, when printed as @EPOCH)}."""
    props = {}
    for line in (text or "").splitlines():
        key, sep, value = line.partition("=")
        if sep:
            props[key.strip()] = value.strip()
    started = props.get("ExecMainStartTimestamp") or None
    epoch = None
    if started and re.match(r"^@\d+(\.\d+)?$", started):
        epoch = float(started[1:])
    return {
        "id": props.get("Id"),
        "load_state": props.get("LoadState"),
        "active_state": props.get("ActiveState"),
        "sub_state": props.get("SubState"),
        "n_restarts": _int_or_none(props.get("NRestarts")),
        "main_pid": _int_or_none(props.get("MainPID")),
        "started_at": started,
        "started_epoch": epoch,
    }


def _int_or_none(text):
    try:
        return int(text)
    except (TypeError, ValueError):
        return None


def unit_status(unit, run=_run):
    """The unit's state (parse_show) with available/error; timestamps as @EPOCH where systemctl can."""
    base = ["systemctl", "show", unit, "-p", ",".join(SHOW_PROPERTIES)]
    text, error = run(base + ["--timestamp=unix"])
    if text is None:  # systemd before 248 has no --timestamp
        text, error = run(base)
    if text is None:
        return {"available": False, "error": error}
    state = parse_show(text)
    if state["active_state"] is None:
        return {"available": False, "error": "systemctl show %s printed no ActiveState" % unit}
    state.update(available=True, error=None)
    if state["load_state"] == "not-found":
        state["error"] = "no unit %s on this host" % unit
    return state


def restarts_seen(state_path, unit, n_restarts, write=True):
    """(NRestarts at the last run or None, error) for UNIT; records N_RESTARTS when WRITE. A count lower than
    the recorded one means a manual start reset it: the last run's count is then taken as 0."""
    state, error = {}, None
    text = pci.read_text(state_path)
    if text:
        try:
            state = json.loads(text)
        except ValueError:
            state, error = {}, "%s is not valid JSON; starting a new one" % state_path
    if not isinstance(state, dict):
        state = {}
    entry = state.get(unit) if isinstance(state.get(unit), dict) else {}
    previous = _int_or_none(entry.get("n_restarts"))
    if previous is not None and n_restarts is not None and n_restarts < previous:
        previous = 0
    if write and n_restarts is not None:
        state[unit] = {"n_restarts": n_restarts, "at": int(time.time())}
        error = host_state.write_json(state_path, state) or error
    return previous, error


def _bounded_output(argv, timeout, head, tail):
    """(text, total lines, error) of ARGV's stdout: its first HEAD and last TAIL lines only, killed after
    TIMEOUT seconds (what it printed until then is kept)."""
    try:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    except OSError as exc:
        return None, 0, "%s: %s" % (argv[0], exc)
    timer = threading.Timer(timeout, proc.kill)
    deadline = time.monotonic() + timeout
    timer.start()
    first, last, total = [], collections.deque(maxlen=tail), 0
    try:
        for raw in proc.stdout:
            total += 1
            line = raw.decode(errors="replace")
            if len(first) < head:
                first.append(line)
            else:
                last.append(line)
        stderr = proc.stderr.read().decode(errors="replace")
        code = proc.wait()
    finally:
        timer.cancel()
    skipped = total - len(first) - len(last)
    text = "".join(first) + ("[... %d lines skipped ...]\n" % skipped if skipped else "") + "".join(last)
    if code != 0 and not total:
        return None, 0, "%s exited %d: %s" % (" ".join(argv), code, stderr.strip()[-300:])
    if code != 0 and time.monotonic() >= deadline:
        return text, total, "%s stopped after %ds; read what it printed until then" % (argv[0], timeout)
    return text, total, None


def read_journal(unit, started_epoch=None, timeout=COMMAND_TIMEOUT_S):
    """(text, info) of UNIT's journal since its main process started (the boot when that is unknown)."""
    since = ["--since=@%d" % int(started_epoch)] if started_epoch else ["-b"]
    argv = ["journalctl", "-u", unit] + since + ["-o", "cat", "--no-pager"]
    text, total, error = _bounded_output(argv, timeout, JOURNAL_HEAD_LINES, JOURNAL_TAIL_LINES)
    info = {"source": " ".join(argv), "lines": total, "error": error,
            "truncated": total > JOURNAL_HEAD_LINES + JOURNAL_TAIL_LINES}
    return text, info


def log_summary(text):
    """The keys of parse/sglang_log.py's parse(TEXT) the judge reads, lists bounded."""
    parsed = sglang_log.parse(text or "")
    summary = dict((key, parsed.get(key)) for key in LOG_KEYS)
    summary["errors"] = list(summary.get("errors") or [])[:MAX_LOG_ERRORS]
    for key in ("gen_throughput_tok_s", "accept_len"):
        summary[key] = list(summary.get(key) or [])[-MAX_LOG_FIGURES:]
    return summary


# --------------------------------------------------------------------------------------------- HTTP

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


def _error_text(exc):
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
        return None, None, _error_text(exc)
    try:
        raw = resp.read()
    except (OSError, http.client.HTTPException) as exc:
        return resp.status, None, _error_text(exc)
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


def list_models(endpoint):
    """{ids, error} of GET /v1/models (ids None when it failed)."""
    status, data, error = http_json(endpoint, "GET", "/v1/models")
    if status != 200:
        return {"ids": None, "error": error}
    rows = (data or {}).get("data") if isinstance(data, dict) else None
    if not isinstance(rows, list):
        return {"ids": None, "error": "/v1/models answered without a data list"}
    return {"ids": [str(row.get("id")) for row in rows if isinstance(row, dict)], "error": None}


def chat_body(model, max_tokens, stream):
    """The canary request: deterministic, long enough to time decoding (ignore_eos keeps it from stopping)."""
    body = {"model": model, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": max_tokens,
            "temperature": 0, "ignore_eos": True, "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


def _delta_text(chunk):
    """The text a stream chunk carries (content or reasoning_content), '' for none."""
    for choice in chunk.get("choices") or []:
        delta = (choice.get("delta") or {}) if isinstance(choice, dict) else {}
        text = (delta.get("content") or "") + (delta.get("reasoning_content") or "")
        if text:
            return text
    return ""


def _read_stream(resp, t0, clock):
    """{ttft_s, chunks, first_at, last_at, completion_tokens, error} from an SSE response."""
    out = {"ttft_s": None, "chunks": 0, "first_at": None, "last_at": None, "completion_tokens": None, "error": None}
    for raw in resp:
        line = raw.decode(errors="replace").strip()
        if not line.startswith("data:"):
            continue
        payload = line[len("data:"):].strip()
        if payload == "[DONE]":
            break
        try:
            chunk = json.loads(payload)
        except ValueError:
            continue
        if not isinstance(chunk, dict):
            continue
        if chunk.get("error"):
            out["error"] = "the stream sent an error: %s" % str(chunk["error"])[:200]
            break
        now = clock()
        if _delta_text(chunk):
            out["chunks"] += 1
            if out["first_at"] is None:
                out["first_at"], out["ttft_s"] = now, now - t0
            out["last_at"] = now
        usage = chunk.get("usage")
        if isinstance(usage, dict) and usage.get("completion_tokens") is not None:
            out["completion_tokens"] = usage["completion_tokens"]
    return out


def stream_chat(endpoint, model, max_tokens=STREAM_MAX_TOKENS, clock=time.monotonic):
    """{ttft_s, chunks, per_chunk_tok_s, tokens_per_chunk, completion_tokens, error} of one streaming request.
    per_chunk_tok_s counts a chunk as one token, as a per-chunk timer does."""
    t0 = clock()
    try:
        conn, resp = endpoint.open("POST", "/v1/chat/completions", chat_body(model, max_tokens, True))
    except (OSError, http.client.HTTPException) as exc:
        return {"ttft_s": None, "error": _error_text(exc)}
    try:
        if resp.status != 200:
            return {"ttft_s": None, "error": "HTTP %d: %s" % (resp.status, resp.read()[:200].decode(errors="replace"))}
        got = _read_stream(resp, t0, clock)
    except (OSError, http.client.HTTPException) as exc:
        return {"ttft_s": None, "error": _error_text(exc)}
    finally:
        conn.close()
    span = (got["last_at"] or 0) - (got["first_at"] or 0)
    per_chunk = (got["chunks"] - 1) / span if got["chunks"] > 1 and span > 0 else None
    tokens = got["completion_tokens"]
    return {
        "ttft_s": None if got["ttft_s"] is None else round(got["ttft_s"], 4),
        "chunks": got["chunks"],
        "per_chunk_tok_s": None if per_chunk is None else round(per_chunk, 3),
        "tokens_per_chunk": round(float(tokens) / got["chunks"], 2) if tokens and got["chunks"] else None,
        "completion_tokens": tokens,
        "error": got["error"] or (None if got["ttft_s"] is not None else "no non-empty delta in the stream"),
    }


def timed_chat(endpoint, model, ttft_s, max_tokens=DECODE_MAX_TOKENS, clock=time.monotonic):
    """{completion_tokens, elapsed_s, decode_tok_s, error} of one plain request: decode tok/s is
    usage.completion_tokens / (elapsed - TTFT), TTFT from the streaming request."""
    t0 = clock()
    status, data, error = http_json(endpoint, "POST", "/v1/chat/completions", chat_body(model, max_tokens, False))
    elapsed = clock() - t0
    out = {"completion_tokens": None, "elapsed_s": round(elapsed, 4), "decode_tok_s": None, "error": error}
    if status != 200:
        return out
    usage = (data or {}).get("usage") if isinstance(data, dict) else None
    tokens = usage.get("completion_tokens") if isinstance(usage, dict) else None
    out["completion_tokens"] = tokens
    if not tokens:
        out["error"] = "no usage.completion_tokens in the answer"
    elif ttft_s is None or elapsed <= ttft_s:
        out["error"] = "no TTFT to subtract (the streaming request failed)"
    else:
        out["decode_tok_s"] = round(tokens / (elapsed - ttft_s), 3)
    return out


# --------------------------------------------------------------------------------------------- one profile

def _redact(value, secret):
    """VALUE with, in each of its strings, SECRET and the API keys' values an engine log line may show replaced
    (parse/sglang_log.py's redact: the one redaction of engine log text)."""
    if isinstance(value, str):
        return sglang_log.redact(value, [secret] if secret else [])
    if isinstance(value, list):
        return [_redact(v, secret) for v in value]
    if isinstance(value, dict):
        return dict((k, _redact(v, secret)) for k, v in value.items())
    return value


def measure_requests(endpoint, profile, still_running=None, figures=True):
    """{ready, models, stream, decode} of the engine at ENDPOINT: the readiness wait, then the API checks. Without
    FIGURES (the health timer): one readiness poll and the model list, no chat request ("figures": "skipped")."""
    out = {"ready": wait_ready(endpoint, profile["startup_timeout_s"] if figures else 0, still_running)}
    if not out["ready"]["ready"]:
        return out
    out["models"] = list_models(endpoint)
    if not figures:
        out["figures"] = "skipped"
        return out
    model = profile.get("served_model_name") or ((out["models"].get("ids") or [None])[0]) or "default"
    out["stream"] = stream_chat(endpoint, model)
    out["decode"] = timed_chat(endpoint, model, out["stream"].get("ttft_s"))
    return out


def _still_running(unit, run):
    def check():
        state = unit_status(unit, run)
        return not state.get("available") or state.get("active_state") in ("active", "activating", "reloading")
    return check


def measure_profile(profile, state_path=STATE_FILE, write_state=True, run=_run, journal=None, figures=True):
    """A serve profile's whole measured part, live: unit, readiness, API, figures (unless not FIGURES), journal. RUN
    runs systemctl, JOURNAL(unit, started_epoch) -> (text, info) reads the journal (read_journal)."""
    key, key_error = read_api_key(profile.get("api_key_file"))
    endpoint = Endpoint(profile["bind"], profile["port"], key)
    item = dict(profile, address=endpoint.address, source="live", api_key_error=key_error,
                unit_state=None, previous_restarts=None, journal=None, log=None)
    unit = profile.get("unit")
    still_running = None
    if unit:
        item["unit_state"] = unit_status(unit, run)
        n_restarts = item["unit_state"].get("n_restarts")
        item["previous_restarts"], item["state_error"] = restarts_seen(state_path, unit, n_restarts, write_state)
        still_running = _still_running(unit, run)
        if item["unit_state"].get("main_pid"):  # the libraries the engine really runs (not what its env says)
            item["engine_libraries"] = engine_processes.process_libraries("/", item["unit_state"]["main_pid"])
    state = item["unit_state"] or {}
    if state.get("available") and state.get("active_state") not in ("active", "activating", "reloading"):
        item["ready"] = {"ready": False, "waited_s": 0, "polls": 0, "last": None,
                         "error": "not polled: the unit is %s" % state.get("active_state")}
    else:
        item.update(measure_requests(endpoint, profile, still_running, figures))
    if unit:
        text, item["journal"] = (journal or read_journal)(unit, state.get("started_epoch"))
        item["log"] = log_summary(text) if text is not None else None
    return _redact(item, key)


def recorded_profile(root, name):
    """A measured part recorded as var/lib/rigbook/commands/serving-NAME.json, or None when there is none."""
    rel = os.path.join(*recorded.COMMANDS_DIR + (RECORDING % name,))
    text = pci.read_text(recorded.path(root, rel))
    if text is None:
        return None
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if not isinstance(data, dict):
        return {"name": name, "available": False, "error": "garbled recording at " + rel, "source": "recorded " + rel}
    return dict(data, name=name, source="recorded " + rel)


def recorded_names(root):
    """The profile names recorded under ROOT (serving-*.json), sorted."""
    pattern = recorded.path(root, *recorded.COMMANDS_DIR + (RECORDING % "*",))
    names = [os.path.basename(p)[len("serving-"):-len(".json")] for p in glob.glob(pattern)]
    return sorted(n for n in names if serve_profile.NAME_RE.match(n))


def collect_profile(root, profile, state_path=STATE_FILE, write_state=True, figures=True):
    """PROFILE's measured part: its recording under a recorded ROOT when there is one, else measured live."""
    if not recorded.is_live(root):
        found = recorded_profile(root, profile["name"])
        if found is not None:
            return found
    return measure_profile(profile, state_path, write_state, figures=figures)


def collect_serving(root, serve, state_path=STATE_FILE, write_state=True, figures=True):
    """{"profiles": [measured part per profile], "error"}: the serve profiles given (the host model's, read again
    by serve/profile.normalize: one reading), else (recorded root) those recorded."""
    profiles, errors = serve_profile.normalize_all(serve, "serve")
    if errors:
        return {"profiles": [], "error": "; ".join(errors)}
    if not profiles and not recorded.is_live(root):
        return {"profiles": [recorded_profile(root, name) for name in recorded_names(root)], "error": None}
    return {"profiles": [collect_profile(root, p, state_path, write_state, figures) for p in profiles], "error": None}


def serving_part(ctx, evidence):
    """{"serving": ...} for the climb: ctx.options serve, serving_state, check_mode; with nccl_tests_dir (and
    env_file), "verified_library": the NCCL/RCCL library the collectives tests load (collective_bench), which each
    engine's mapped one is held to."""
    opts = ctx.options
    serving = collect_serving(ctx.root, opts.get("serve"), opts.get("serving_state") or STATE_FILE,
                              not opts.get("check_mode"), opts.get("serving_figures", True))
    if opts.get("nccl_tests_dir"):
        serving["verified_library"] = collective_bench.verified_library(opts["nccl_tests_dir"], opts.get("env"),
                                                                        opts.get("env_file"))
    return {"serving": serving}
