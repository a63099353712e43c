# -*- coding: utf-8 -*-
# Copyright: rigbook developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Evidence of the serving layer (all I/O; standard library only): per serve profile, its systemd unit, a
readiness poll, /v1/models, one streaming and one plain chat completion, and the engine's journal.

- The unit: facts/systemd.show (active state, NRestarts, the main process's start), and NRestarts at the last run
  from a small state file on the host (STATE_FILE), updated after each live measurement (not in check mode). A
  counter lower than the recorded one was reset by a manual start and counts from 0.
- Readiness: serve/engine_api.wait_ready (GET /health_generate, at most one request per MIN_POLL_GAP_S, the gap
  doubling, within the profile's startup_timeout_s); a unit that is not running is not polled.
- TTFT: the time to the first non-empty delta (content or reasoning_content) of a streaming request with
  stream_options.include_usage. Decode tok/s: usage.completion_tokens / (elapsed - TTFT) of a plain request,
  never per-chunk gaps (speculative decoding sends several tokens a chunk); per_chunk_tok_s is what a per-chunk
  timer would have said (chunks/s), kept for comparison only.
- The journal since the main process started (`--since=@EPOCH`, else the boot), bounded to its first
  JOURNAL_HEAD_LINES and last JOURNAL_TAIL_LINES lines (facts/runner.run's LINES), read by parse/sglang_log.py; the
  text itself is never kept in the evidence.
- The API key is read from api_key_file (facts/api_key.read_key) and sent as a Bearer token; it is never put in the
  evidence (every string of a measured part is scrubbed of it and of any api_key value an engine log line shows:
  sglang_log.redact). The journal is parsed before that, so api_key_logged still says the engine logged a key.
- Connects only to the profile's bind address (0.0.0.0 / :: are reached through loopback: serve/engine_api.py).

Under a recorded root, var/lib/rigbook/commands/serving-<name>.json holds a profile's whole measured part and is
returned instead of measuring; without one the profiles given are measured live (a lab host runs the engine
stand-in under its recorded root), and with none given the recorded profiles are judged (replay).
"""

from __future__ import annotations

import glob
import http.client
import json
import os
import time

from ansible_collections.rigbook.homelab.plugins.module_utils.collect import collective_bench, engine_processes
from ansible_collections.rigbook.homelab.plugins.module_utils.facts import api_key, files, runner, systemd
from ansible_collections.rigbook.homelab.plugins.module_utils.facts import text as bounded
from ansible_collections.rigbook.homelab.plugins.module_utils.parse import sglang_log
from ansible_collections.rigbook.homelab.plugins.module_utils.serve import engine_api
from ansible_collections.rigbook.homelab.plugins.module_utils.serve import profile as serve_profile

STATE_FILE = "/var/lib/rigbook/serving-state.json"
RECORDING = "serving-%s.json"

STREAM_MAX_TOKENS = 32  # TTFT needs the first token; a few chunks show what a per-chunk timer would say
DECODE_MAX_TOKENS = 256  # long enough that decode time dwarfs TTFT jitter, short enough for every verify

SHOW_PROPERTIES = ("LoadState", "ActiveState", "SubState", "NRestarts", "ExecMainStartTimestamp", "MainPID")
# unit_status's keys of facts/systemd.unit_state (its callers and the evidence read these)
UNIT_KEYS = ("id", "load_state", "active_state", "sub_state", "n_restarts", "main_pid", "started_at",
             "started_epoch")
COMMAND_TIMEOUT_S = 30.0
JOURNAL_HEAD_LINES = 3000
JOURNAL_TAIL_LINES = 2000
LOG_KEYS = ("version", "ready", "load_weight_s", "cuda_graph_s", "nccl_version", "path", "all_direct_p2p",
            "custom_all_reduce", "errors", "error_count", "gen_throughput_tok_s", "accept_len", "api_key_logged")
MAX_LOG_ERRORS = 10
MAX_LOG_FIGURES = 20


# --------------------------------------------------------------------------------------------- the unit

def unit_status(unit, run=runner.run):
    """The unit's state ({id, load_state, active_state, sub_state, n_restarts, main_pid, started_at, started_epoch}:
    facts/systemd.show, timestamps as @EPOCH where systemctl can) with available/error. RUN: facts/runner.run or a
    stand-in returning its Result."""
    found, error = systemd.show([unit], SHOW_PROPERTIES, run=run, timeout=COMMAND_TIMEOUT_S)
    if error:
        return {"available": False, "error": error}
    blocks = list(found.values())
    state = found.get(unit) or (blocks[0] if len(blocks) == 1 else None)
    if state is None or state["active_state"] is None:
        return {"available": False, "error": "systemd showed no ActiveState of %s" % unit}
    state = dict((key, state[key]) for key in UNIT_KEYS)
    state.update(available=True, error=None)
    if state["load_state"] == "not-found":
        state["error"] = "no unit %s on this host" % unit
    return state


def restarts_seen(state_path, unit, n_restarts, write=True):
    """(NRestarts at the last run or None, error) for UNIT; records N_RESTARTS when WRITE. A count lower than
    the recorded one means a manual start reset it: the last run's count is then taken as 0."""
    state, error = files.read_json(state_path)
    if error:
        error = "not valid JSON or unreadable (%s); starting a new one" % error
    if not isinstance(state, dict):
        state = {}
    entry = state.get(unit) if isinstance(state.get(unit), dict) else {}
    previous = bounded.integer(entry.get("n_restarts"))
    if previous is not None and n_restarts is not None and n_restarts < previous:
        previous = 0
    if write and n_restarts is not None:
        state[unit] = {"n_restarts": n_restarts, "at": int(time.time())}
        error = files.write_json(state_path, state) or error
    return previous, error


def read_journal(unit, started_epoch=None, timeout=COMMAND_TIMEOUT_S):
    """(text, info) of UNIT's journal since its main process started (the boot when that is unknown): its first
    JOURNAL_HEAD_LINES and last JOURNAL_TAIL_LINES lines, stopped after TIMEOUT seconds (what it printed until then
    is kept). text is None when journalctl printed nothing and failed."""
    since = ["--since=@%d" % int(started_epoch)] if started_epoch else ["-b"]
    argv = ["journalctl", "-u", unit] + since + ["-o", "cat", "--no-pager"]
    lines = (JOURNAL_HEAD_LINES, JOURNAL_TAIL_LINES)
    result = runner.run(argv, timeout=timeout, lines=lines)
    total = runner.lines_printed(result.stdout, lines)
    text = result.stdout if total or result.rc == 0 else None
    info = {"source": " ".join(argv), "lines": total, "error": result.error,
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

def list_models(endpoint):
    """{ids, error} of GET /v1/models (ids None when it failed)."""
    status, data, error = engine_api.http_json(endpoint, "GET", "/v1/models")
    if status != 200:
        return {"ids": None, "error": error}
    rows = (data or {}).get("data") if isinstance(data, dict) else None
    if not isinstance(rows, list):
        return {"ids": None, "error": "/v1/models answered without a data list"}
    return {"ids": [str(row.get("id")) for row in rows if isinstance(row, dict)], "error": None}


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
        conn, resp = endpoint.open("POST", "/v1/chat/completions", engine_api.chat_body(model, max_tokens, True))
    except (OSError, http.client.HTTPException) as exc:
        return {"ttft_s": None, "error": engine_api.error_text(exc)}
    try:
        if resp.status != 200:
            return {"ttft_s": None, "error": "HTTP %d: %s" % (resp.status, resp.read()[:200].decode(errors="replace"))}
        got = _read_stream(resp, t0, clock)
    except (OSError, http.client.HTTPException) as exc:
        return {"ttft_s": None, "error": engine_api.error_text(exc)}
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
    status, data, error = engine_api.http_json(endpoint, "POST", "/v1/chat/completions",
                                               engine_api.chat_body(model, max_tokens, False))
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
    out = {"ready": engine_api.wait_ready(endpoint, profile["startup_timeout_s"] if figures else 0, still_running)}
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


def measure_profile(profile, state_path=STATE_FILE, write_state=True, run=runner.run, journal=None, figures=True):
    """A serve profile's whole measured part, live: unit, readiness, API, figures (unless not FIGURES), journal. RUN
    runs systemctl (facts/runner.run), JOURNAL(unit, started_epoch) -> (text, info) reads the journal
    (read_journal)."""
    key, key_error = api_key.read_key(profile.get("api_key_file"))
    unit = profile.get("unit")
    # the key goes only to a listener of the engine's own unit (engine_api.key_verdict)
    endpoint = engine_api.Endpoint(profile["bind"], profile["port"], key, unit=unit,
                                   control_group=lambda: engine_api.unit_control_group(unit, run))
    item = dict(profile, address=endpoint.address, source="live", api_key_error=key_error,
                unit_state=None, previous_restarts=None, journal=None, log=None)
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
    rel = os.path.join(*runner.COMMANDS_DIR + (RECORDING % name,))
    data, error = files.read_json(files.path(root, rel))
    if data is None and error is None:
        return None
    if not isinstance(data, dict):
        return {"name": name, "available": False, "error": "garbled recording at %s (%s)" % (
            rel, error or "not a JSON object"), "source": "recorded " + rel}
    return dict(data, name=name, source="recorded " + rel)


def recorded_names(root):
    """The profile names recorded under ROOT (serving-*.json), sorted."""
    pattern = files.path(root, *runner.COMMANDS_DIR + (RECORDING % "*",))
    names = [os.path.basename(p)[len("serving-"):-len(".json")] for p in glob.glob(pattern)]
    return sorted(n for n in names if serve_profile.NAME_RE.match(n))


def collect_profile(root, profile, state_path=STATE_FILE, write_state=True, figures=True):
    """PROFILE's measured part: its recording under a recorded ROOT when there is one, else measured live."""
    if not files.is_live(root):
        found = recorded_profile(root, profile["name"])
        if found is not None:
            return found
    return measure_profile(profile, state_path, write_state, figures=figures)


def collect_serving(root, serve, state_path=STATE_FILE, write_state=True, figures=True, errors=()):
    """{"profiles": [measured part per profile], "error"}: the serve profiles given (the host model's, normalised
    once by host_model.build: unit, bind, port, timeouts filled in), else (recorded root) those recorded. ERRORS:
    the model's serve_errors (rigbook_serve items it could not read), the error when there are any."""
    if errors:
        return {"profiles": [], "error": "; ".join(errors)}
    profiles = list(serve or [])
    if not profiles and not files.is_live(root):
        return {"profiles": [recorded_profile(root, name) for name in recorded_names(root)], "error": None}
    return {"profiles": [collect_profile(root, p, state_path, write_state, figures) for p in profiles], "error": None}


def serving_part(ctx, evidence):
    """{"serving": ...} for the climb: ctx.options serve and serve_errors (the host model's), serving_state,
    check_mode; with nccl_tests_dir (and env_file), "verified_library": the NCCL/RCCL library the collectives tests
    load (collective_bench), which each engine's mapped one is held to."""
    opts = ctx.options
    serving = collect_serving(ctx.root, opts.get("serve"), opts.get("serving_state") or STATE_FILE,
                              not opts.get("check_mode"), opts.get("serving_figures", True),
                              opts.get("serve_errors") or ())
    if opts.get("nccl_tests_dir"):
        serving["verified_library"] = collective_bench.verified_library(opts["nccl_tests_dir"], opts.get("env"),
                                                                        opts.get("env_file"))
    return {"serving": serving}
