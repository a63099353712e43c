# -*- coding: utf-8 -*-
"""Parse an SGLang server log (`python -m sglang.launch_server` / `sglang serve` output).

Pure functions `parse(text) -> dict` and `redact(text, secrets) -> str`; standard library only, Python 3.8+.

Reads plain stdout or journald output: a journald prefix (`Dec 03 10:00:00 host python[123]: ` or the
short-iso form) and SGLang's own prefix (`[2025-06-01 10:00:00 TP0] `, `[... DP0 TP0 EP0] `, optionally
followed by `INFO file.py:123: `) are taken off each line. NCCL/RCCL lines are read by parse/nccl.py.

Formats (sgl-project/sglang source): "Load weight end. elapsed=%.2f s" (model_runner), "Capture cuda graph
end. Time elapsed: %.2f s" and the newer "Capture ... CUDA graph end. elapsed=%.2f s", "Decode batch[.,]
... accept len: %.2f ... gen throughput (token/s): %.2f" (scheduler_metrics_mixin), "The server is fired
up and ready to roll!" (http_server), "server_args=ServerArgs(...)" (dataclass repr) or
"server_args={...}" (resolved_dict() in newer releases). SGLang does not redact api_key in that line
(sgl-project/sglang#37457; the redaction PRs #18518 and #39449 were open, #19328 closed unmerged; the collection's
roles/sglang/files/patches/api-key-out-of-logs.patch does for 0.5.23).

redact() is the one redaction of engine log text rigbook keeps, prints or reports (the error lines of parse(), the
serving evidence, serve_units' failure message): the values of api_key / admin_api_key in a server_args line (either
form), of --api-key / --admin-api-key on a logged command line, and every given secret.
"""

from __future__ import annotations

import ast
import re

from ansible_collections.rigbook.homelab.plugins.module_utils.parse import nccl as parse_nccl
from ansible_collections.rigbook.homelab.plugins.module_utils.parse import text as parse_text

SERVER_ARG_KEYS = (
    "model_path", "served_model_name", "tp_size", "mem_fraction_static", "host", "port",
    "disable_custom_all_reduce", "context_length", "enable_p2p_check", "speculative_algorithm",
)
_SECRET_KEYS = ("api_key", "admin_api_key")
_REDACTED = ("", "[REDACTED]", "REDACTED", "***", "****", "<redacted>")
REDACTED = "<redacted>"
_SECRET_FLAG = r"(?<![\w-])--(?:admin-)?api-key"
_SECRET_NAME = r"(?<![\w-])(?:admin[_-])?api[_-]key"
_QUOTED = r"(?:'(?:\\.|[^'\\])*'|\"(?:\\.|[^\"\\])*\")"
# api_key='x' (the repr), 'api_key': 'x' (the dict), '--api-key', 'x' (an argv list), --api-key x / --api-key=x (a
# command line), api-key: x (YAML)
_SECRET_RES = (
    re.compile(r"(%s\s*=\s*)%s" % (_SECRET_NAME, _QUOTED)),
    re.compile(r"((['\"])%s\2\s*:\s*)%s" % (_SECRET_NAME, _QUOTED)),
    re.compile(r"((['\"])%s\2\s*,\s*)%s" % (_SECRET_FLAG, _QUOTED)),
    re.compile(r"(%s(?:=|\s+))(?!None\b)(?!--)\S+" % _SECRET_FLAG),
    re.compile(r"(^\s*%s\s*:\s+)(?!(?:null|~)\s*$)\S.*$" % _SECRET_NAME, re.M),
)
MAX_ERRORS = 100

_JOURNALD_RE = re.compile(
    r"^(?:[A-Z][a-z]{2} [ \d]\d \d{2}:\d{2}:\d{2}"
    r"|\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:Z|[+-]\d{2}:?\d{2})?)"
    r" \S+ [^\s:\[]+(?:\[\d+\])?: "
)
_DOCKER_TS_RE = re.compile(r"^\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:Z|[+-]\d{2}:?\d{2})?\s+(?=\[)")
_SGLANG_PREFIX_RE = re.compile(
    r"^\[(?P<ts>\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2})(?P<ranks>(?: [A-Z]+\d+)*)\] "
    r"(?:(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) [\w.]+:\d+: )?"
)
_READY = "The server is fired up and ready to roll!"
_VERSION_RES = (
    re.compile(r"\bsglang version:\s*v?(\d+\.\d+[\w.+-]*)", re.I),
    re.compile(r"^sglang:\s*v?(\d+\.\d+[\w.+-]*)\s*$", re.I),
    re.compile(r"\bsglang==v?(\d+\.\d+[\w.+-]*)", re.I),
)
_SGLANG_NCCL_RE = re.compile(r"\bsglang is using nccl==(\d+\.\d+\.\d+)")
_LOAD_RE = re.compile(r"\bLoad weight end\. elapsed=([0-9.]+) s")
_GRAPH_RE = re.compile(r"\bCapture\b[\w ]*?\bgraph end\.\s*(?:Time elapsed:\s*|elapsed=)([0-9.]+)", re.I)
_DECODE_RE = re.compile(r"\bDecode batch(?: \[\d+\])?[.,] ")
_GEN_RE = re.compile(r"\bgen throughput \(token/s\):\s*([0-9.]+)")
_ACCEPT_RE = re.compile(r"\baccept len:\s*([0-9.]+)")
_CAR_OFF_RE = re.compile(r"\bcustom[ _-]?(?:all[ _-]?reduce|AR)\b.*?\bdisabled\b", re.I)
_CAR_ON_RE = re.compile(r"\bRegistering \d+ cuda graph addresses\b")
_SERVER_ARGS_RE = re.compile(r"\bserver_args=(?:ServerArgs\(|\{)")
_ERROR_RES = (
    re.compile(r"Traceback \(most recent call last\)"),
    re.compile(r"(?:^|[\s:])[A-Za-z_][\w.]*(?:Error|Exception):(?:\s|$)"),
    re.compile(r"\bout of memory\b|\bOutOfMemory|\bOOM\b", re.I),
    re.compile(r"Health check failed"),
    re.compile(r"\bkill_process_tree\b"),
    re.compile(r"Scheduler hit an exception|Received sigquit from a child process"),
    re.compile(r"\bNCCL WARN\b|Fatal Python error|Segmentation fault"),
)


def redact(text, secrets=()) -> str:
    """TEXT (engine log lines) with the API keys' values replaced by <redacted>: those of api_key and admin_api_key
    wherever SGLang logs them (server_args, a command line, a config file) and every string of SECRETS (the keys
    rigbook knows)."""
    if not isinstance(text, str) or not text:
        return text
    for pattern in _SECRET_RES:
        text = pattern.sub(lambda m: m.group(1) + (repr(REDACTED) if m.group(0)[len(m.group(1)):][:1] in "'\""
                                                   else REDACTED), text)
    for secret in secrets or ():
        if isinstance(secret, str) and secret:
            text = text.replace(secret, REDACTED)
    return text


def _strip_prefixes(raw: str):
    """(ranks, message, line without the journald prefix) for one normalised line."""
    line = _JOURNALD_RE.sub("", raw, count=1)
    line = _DOCKER_TS_RE.sub("", line, count=1)
    m = _SGLANG_PREFIX_RE.match(line)
    if not m:
        return "", line, line
    return m.group("ranks").strip(), line[m.end():], line


def _version(message: str):
    for pattern in _VERSION_RES:
        m = pattern.search(message.strip())
        if m:
            return m.group(1)
    return None


def _split_top_level(body: str):
    """Split 'a=1, b=[1, 2], c='x, y'' at the commas that are outside brackets and quotes."""
    items, depth, quote, start, i = [], 0, None, 0, 0
    while i < len(body):
        ch = body[i]
        if quote:
            if ch == "\\":
                i += 1
            elif ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            items.append(body[start:i])
            start = i + 1
        i += 1
    items.append(body[start:])
    return [item.strip() for item in items if item.strip()], depth == 0 and quote is None


def _literal(value: str):
    try:
        return ast.literal_eval(value)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return value


def _server_args_body(message: str):
    """The text inside ServerArgs(...) or {...}, and whether the closing bracket was seen."""
    m = _SERVER_ARGS_RE.search(message)
    body = message[m.end():].rstrip()
    closer = ")" if m.group(0).endswith("(") else "}"
    if body.endswith(closer):
        return body[:-1], True, closer == "}"
    return body, False, closer == "}"


def parse_server_args(message: str) -> dict:
    """All key -> value pairs readable from a `server_args=` line (values as Python literals)."""
    body, closed, is_dict = _server_args_body(message)
    items, balanced = _split_top_level(body)
    if not (closed and balanced) and items:
        items = items[:-1]  # the line was cut inside its last item
    out = {}
    for item in items:
        if is_dict:
            key, sep, value = item.partition(":")
            key = key.strip().strip("'\"")
        else:
            key, sep, value = item.partition("=")
            key = key.strip()
        if sep and re.match(r"^[A-Za-z_]\w*$", key):
            out[key] = _literal(value.strip())
    return out


def _secret_logged(args: dict) -> bool:
    for key in _SECRET_KEYS:
        value = args.get(key)
        if isinstance(value, str) and value.strip() not in _REDACTED:
            return True
    return False


def _rank_total(per_rank: dict):
    """Phases within one rank run one after another (sum); ranks run side by side (max)."""
    if not per_rank:
        return None
    return round(max(sum(values) for values in per_rank.values()), 3)


def _custom_all_reduce(disabled_line: bool, enabled_line: bool, args: dict):
    if disabled_line or args.get("disable_custom_all_reduce") is True:
        return False
    if enabled_line:
        return True
    return None


def _path(nccl: dict):
    return nccl["path"] if nccl["path"] in ("p2p", "shm") else None


def _is_error(message: str) -> bool:
    return any(pattern.search(message) for pattern in _ERROR_RES)


def parse(text) -> dict:
    """TEXT: the whole log (a str) or an iterable of its lines (an open file: read line by line)."""
    version = None
    ready = False
    sglang_nccl = None
    load, graph = {}, {}
    gen, accept, errors = [], [], []
    error_count = 0
    car_off = car_on = False
    args = {}
    nccl_reader = parse_nccl.LogReader()  # the NCCL/RCCL lines, read in the same pass (nothing is kept whole)
    for raw in parse_text.lines(text):
        ranks, message, line = _strip_prefixes(raw)
        nccl_reader.feed(parse_text.clean_line(line))
        if _SERVER_ARGS_RE.search(message):
            args = parse_server_args(message)
            continue
        version = version or _version(message)
        ready = ready or _READY in message
        m = _SGLANG_NCCL_RE.search(message)
        if m:
            sglang_nccl = sglang_nccl or m.group(1)
        m = _LOAD_RE.search(message)
        if m:
            load.setdefault(ranks, []).append(float(m.group(1)))
        m = _GRAPH_RE.search(message)
        if m:
            graph.setdefault(ranks, []).append(float(m.group(1).rstrip(".")))
        if _DECODE_RE.search(message):
            m = _GEN_RE.search(message)
            if m:
                gen.append(float(m.group(1)))
            m = _ACCEPT_RE.search(message)
            if m:
                accept.append(float(m.group(1)))
        car_off = car_off or bool(_CAR_OFF_RE.search(message))
        car_on = car_on or bool(_CAR_ON_RE.search(message))
        if _is_error(message):
            error_count += 1
            if len(errors) < MAX_ERRORS:
                errors.append(redact(line.strip()))
    nccl = nccl_reader.result()
    return {
        "version": version,
        "ready": ready,
        "load_weight_s": _rank_total(load),
        "cuda_graph_s": _rank_total(graph),
        "nccl_version": nccl["nccl_version"] or sglang_nccl,
        "all_direct_p2p": nccl["all_direct_p2p"],
        "path": _path(nccl),
        "transports": nccl["transports"],
        "custom_all_reduce": _custom_all_reduce(car_off, car_on, args),
        "gen_throughput_tok_s": gen,
        "accept_len": accept,
        "errors": errors,
        "error_count": error_count,
        "server_args": {key: args[key] for key in SERVER_ARG_KEYS if key in args},
        "api_key_logged": _secret_logged(args),
    }
