#!/usr/bin/env python3
"""TEST STAND-IN for `python -m sglang.launch_server` -- this is NOT SGLang and moves no tensors.

It lets the lab (and the unit tests) exercise everything around an SGLang server on hosts without GPUs:
the systemd unit, readiness polling, the API-key middleware, the OpenAI endpoints and the log parser
(plugins/module_utils/parse/sglang_log.py). Standard library only, Python 3.11.

Behaviour comes from the recorded evidence, never from the hardware:
    $RIGBOOK_EVIDENCE_ROOT/var/lib/rigbook/commands/sglang-standin.json   (RIGBOOK_EVIDENCE_ROOT default "/")
    {"version": "0.5.23", "load_seconds": 2.0, "warmup_seconds": 1.0, "ttft_s": 0.65, "decode_tok_s": 31.4,
     "tokens_per_chunk": 1, "transport": "p2p" | "shm", "crash_after_s": null | seconds,
     "nccl_version": "2.27.7", "accept_len": null | tokens}
accept_len is what the Decode batch lines say as `accept len: X` when --speculative-algorithm is given (SGLang's
mean accepted tokens per verify step; seed 000's DFlash drafts reached 2.1-2.4 on natural text); null: the
tokens_per_chunk the stand-in streams.

Startup follows SGLang: the server_args line (api_key NOT redacted, as SGLang does not redact it), "Load weight
begin", load_seconds with the port not bound, "Load weight end. elapsed=...", NCCL INFO lines in NCCL's format when
--tp-size > 1, CUDA-graph capture lines (with "Registering N cuda graph addresses" when the custom all-reduce is
on, SGLang's "Custom allreduce is disabled because ..." warning when --enable-p2p-check meets an SHM transport,
and no line at all for --disable-custom-all-reduce, which SGLang only shows in server_args), then the HTTP port,
/health* answering 503 during warmup_seconds, then "The server is fired up and ready to roll!".
`--config FILE.yaml` is merged as SGLang's prepare_server_args does (sglang/srt/utils/server_args_config_parser.py,
ConfigArgumentMerger): only the exact word `--config`, once, followed by a path ending in .yaml or .yml that exists;
the file is one mapping whose keys become flags as written (`api-key: x` -> `--api-key x`; true -> the bare flag for
a store_true flag, false -> nothing; a list -> the flag and its items; a mapping -> its JSON), put before the command
line, so the command line wins. With --api-key (either way) every endpoint but /health* and /metrics needs
`Authorization: Bearer KEY`.
Differences from SGLang, on purpose: the first line is `sglang version: X` (the format of `sglang version`; the
real server log carries no version), unknown flags are logged and ignored instead of refused, every request
decodes exactly max_tokens tokens, a Decode batch line is also logged at the end of each generation, and without
PyYAML (a lab host's python3) the config file is read as the flat mapping rigbook writes (`key: scalar` lines,
comments; a nested value is refused).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

EVIDENCE = "var/lib/rigbook/commands/sglang-standin.json"
DEFAULTS = {
    "version": "0.5.23", "load_seconds": 2.0, "warmup_seconds": 1.0, "ttft_s": 0.65, "decode_tok_s": 31.4,
    "tokens_per_chunk": 1, "transport": "p2p", "crash_after_s": None, "nccl_version": "2.27.7", "accept_len": None,
}
DECODE_LOG_INTERVAL = 40  # SGLang's default --decode-log-interval
DEFAULT_MAX_TOKENS = 64
_PRINT_LOCK = threading.Lock()


class StandinError(Exception):
    """A startup problem: logged as one error line, exit 1."""


# --- logging in SGLang's format ---------------------------------------------------------------------------------

def _stamp() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S")


def emit(text: str) -> None:
    with _PRINT_LOCK:
        sys.stdout.write(text + "\n")
        sys.stdout.flush()


def log(message: str, rank=None) -> None:
    prefix = f"[{_stamp()}]" if rank is None else f"[{_stamp()} TP{rank}]"
    emit(f"{prefix} {message}")


def log_traceback(where: str, error: str) -> None:
    emit("Traceback (most recent call last):")
    emit(f'  File "{Path(__file__).name}", line 0, in {where}')
    emit(error)


# --- arguments and evidence --------------------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sglang_standin.py", description="TEST STAND-IN for sglang.launch_server")
    p.add_argument("--model-path", "--model", dest="model_path", required=True)
    p.add_argument("--served-model-name")
    p.add_argument("--tp-size", "--tp", "--tensor-parallel-size", dest="tp_size", type=int, default=1)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--api-key")
    p.add_argument("--mem-fraction-static", type=float)
    p.add_argument("--context-length", type=int)
    p.add_argument("--max-total-tokens", type=int)
    p.add_argument("--disable-custom-all-reduce", action="store_true")
    p.add_argument("--enable-p2p-check", action="store_true")
    p.add_argument("--disable-cuda-graph", action="store_true")
    p.add_argument("--speculative-algorithm")
    p.add_argument("--speculative-draft-model-path")
    p.add_argument("--speculative-num-steps", type=int)
    p.add_argument("--speculative-eagle-topk", type=int)
    p.add_argument("--speculative-num-draft-tokens", type=int)
    p.add_argument("--speculative-draft-kv-cache-dtype")
    p.add_argument("--skip-server-warmup", action="store_true")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error", "critical"])
    return p


CONFIG_FLAG = "--config"


def _scalar(text: str, where: str):
    """One YAML scalar of a flat mapping: quoted ("JSON-style" or 'single'), true/false, null/~, a number, or
    plain text (a trailing ` # comment` dropped)."""
    text = text.strip()
    if text.startswith('"'):
        try:
            value, end = json.JSONDecoder().raw_decode(text)
        except ValueError:
            raise StandinError(f"{where}: unreadable double-quoted value") from None
        if text[end:].strip() and not text[end:].strip().startswith("#"):
            raise StandinError(f"{where}: text after the quoted value")
        return value
    if text.startswith("'"):
        close = text.find("'", 1)
        while close != -1 and text[close + 1:close + 2] == "'":
            close = text.find("'", close + 2)
        if close == -1:
            raise StandinError(f"{where}: unterminated single-quoted value")
        return text[1:close].replace("''", "'")
    text = text.split(" #", 1)[0].strip()
    if text.startswith(("[", "{", "|", ">", "&", "*", "!")):
        raise StandinError(f"{where}: the stand-in reads flat mappings of scalars only (without PyYAML)")
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if lowered in ("", "null", "~"):
        return None
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def read_config(path: Path):
    """The YAML file at PATH: PyYAML's safe_load where installed (as SGLang), else the flat subset (_scalar)."""
    text = path.read_text(encoding="utf-8")
    try:
        import yaml
    except ImportError:
        yaml = None
    if yaml is not None:
        try:
            return yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise StandinError(f"config file {path}: {exc}") from None
    data = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#") or line.strip() == "---":
            continue
        if line[:1].isspace() or ":" not in line:
            raise StandinError(f"{path}:{number}: the stand-in reads flat `key: value` lines only (without PyYAML)")
        key, _, value = line.partition(":")
        data[key.strip()] = _scalar(value, f"{path}:{number}")
    return data or None


def merge_config(argv, parser: argparse.ArgumentParser):
    """ARGV with its `--config FILE.yaml` replaced by the file's flags, put first (SGLang's ConfigArgumentMerger)."""
    found = [i for i, arg in enumerate(argv) if arg == CONFIG_FLAG]
    if not found:
        return list(argv)
    if len(found) > 1:
        raise StandinError("Multiple config files specified! Only one allowed.")
    index = found[0]
    if index == len(argv) - 1:
        raise StandinError("No config file specified after --config flag!")
    path = Path(argv[index + 1])
    if path.suffix.lower() not in (".yaml", ".yml"):
        raise StandinError(f"Config file must be YAML format, got: {path.suffix}")
    if not path.exists():
        raise StandinError(f"Config file not found: {path}")
    try:
        data = read_config(path)
    except (OSError, UnicodeDecodeError) as exc:
        raise StandinError(f"config file {path}: {exc}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise StandinError("Config file must contain a dictionary at root level")
    store_true = {opt[2:].replace("-", "_") for action in parser._actions
                  if isinstance(action, argparse._StoreTrueAction) for opt in action.option_strings}
    merged = []
    for key, value in data.items():
        key = str(key)
        if isinstance(value, bool):
            if key.replace("-", "_") in store_true:
                merged += [f"--{key}"] if value else []
            else:
                merged += [f"--{key}", str(value).lower()]
        elif isinstance(value, list):
            merged += [f"--{key}"] + [str(item) for item in value] if value else []
        elif isinstance(value, dict):
            merged += [f"--{key}", json.dumps(value)]
        else:
            merged += [f"--{key}", str(value)]
    return merged + list(argv[:index]) + list(argv[index + 2:])


def evidence_path() -> Path:
    return Path(os.environ.get("RIGBOOK_EVIDENCE_ROOT") or "/") / EVIDENCE


def _number(name: str, value, allow_none=False, minimum=0.0):
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < minimum:
        raise StandinError(f"{evidence_path()}: {name} must be a number >= {minimum}, got {value!r}")
    return float(value)


def load_evidence() -> dict:
    path = evidence_path()
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise StandinError(f"recorded evidence missing: {path}") from None
    except (OSError, ValueError) as exc:
        raise StandinError(f"recorded evidence unreadable: {path}: {exc}") from None
    if not isinstance(data, dict):
        raise StandinError(f"{path}: expected a JSON object")
    ev = {**DEFAULTS, **data}
    for key in ("load_seconds", "warmup_seconds", "ttft_s"):
        ev[key] = _number(key, ev[key])
    ev["decode_tok_s"] = _number("decode_tok_s", ev["decode_tok_s"], minimum=0.001)
    ev["crash_after_s"] = _number("crash_after_s", ev["crash_after_s"], allow_none=True)
    ev["accept_len"] = _number("accept_len", ev["accept_len"], allow_none=True, minimum=1.0)
    tpc = ev["tokens_per_chunk"]
    if isinstance(tpc, bool) or not isinstance(tpc, int) or tpc < 1:
        raise StandinError(f"{path}: tokens_per_chunk must be an integer >= 1, got {tpc!r}")
    if ev["transport"] not in ("p2p", "shm"):
        raise StandinError(f"{path}: transport must be 'p2p' or 'shm', got {ev['transport']!r}")
    return ev


def model_config(model_path: str) -> dict:
    """What SGLang (through transformers) needs first: a directory holding config.json."""
    path = Path(model_path)
    if not path.is_dir():
        log_traceback("get_config", f"OSError: Repo id must be in the form 'repo_name' or 'namespace/repo_name': "
                                    f"'{model_path}'. Use `repo_type` argument if needed.")
        raise StandinError(f"model path {model_path} is not a directory")
    config = path / "config.json"
    if not config.is_file():
        log_traceback("get_config", f"OSError: {model_path} does not appear to have a file named config.json.")
        raise StandinError(f"model path {model_path} has no config.json")
    try:
        data = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise StandinError(f"{config}: not JSON: {exc}") from None
    return data if isinstance(data, dict) else {}


# --- the server state --------------------------------------------------------------------------------------------

class Standin:
    def __init__(self, args, ev: dict, config: dict):
        self.args = args
        self.ev = ev
        self.served = args.served_model_name or args.model_path
        self.context_length = args.context_length or int(config.get("max_position_embeddings") or 32768)
        self.status = "starting"
        self.stop = threading.Event()
        self.started = time.monotonic()
        self.created = int(time.time())
        self.custom_ar = self._custom_all_reduce()

    def _custom_all_reduce(self):
        """SGLang's choice: off by flag; off when the P2P check runs and fails; else on (the check is patched out)."""
        if self.args.tp_size < 2 or self.args.disable_custom_all_reduce:
            return False
        return not (self.args.enable_p2p_check and self.ev["transport"] == "shm")

    def info(self, message: str, rank=None) -> None:
        if self.args.log_level in ("debug", "info"):
            log(message, rank)

    def server_args_line(self) -> str:
        a = self.args
        fields = [
            ("model_path", a.model_path), ("tokenizer_path", a.model_path), ("tokenizer_mode", "auto"),
            ("context_length", a.context_length), ("host", a.host), ("port", a.port),
            ("mem_fraction_static", a.mem_fraction_static), ("max_total_tokens", a.max_total_tokens),
            ("tp_size", a.tp_size), ("log_level", a.log_level), ("api_key", a.api_key), ("admin_api_key", None),
            ("served_model_name", self.served), ("speculative_algorithm", a.speculative_algorithm),
            ("speculative_draft_model_path", a.speculative_draft_model_path),
            ("speculative_num_steps", a.speculative_num_steps), ("speculative_eagle_topk", a.speculative_eagle_topk),
            ("speculative_num_draft_tokens", a.speculative_num_draft_tokens),
            ("disable_cuda_graph", a.disable_cuda_graph), ("disable_custom_all_reduce", a.disable_custom_all_reduce),
            ("enable_p2p_check", a.enable_p2p_check), ("skip_server_warmup", a.skip_server_warmup),
        ]
        return "server_args=ServerArgs(" + ", ".join(f"{k}={v!r}" for k, v in fields) + ")"

    def server_info(self) -> dict:
        a = self.args
        return {"model_path": a.model_path, "served_model_name": self.served, "tp_size": a.tp_size,
                "context_length": self.context_length, "version": self.ev["version"], "standin": True}


# --- startup -----------------------------------------------------------------------------------------------------

# The collectives library as torch's wheel finds it: its libtorch names libnccl.so.2 (CUDA) or librccl.so.1 (ROCm),
# found first through the DT_RPATH into the venv's own bundled copy, else through LD_LIBRARY_PATH and the loader's
# paths (../shared/research/engine-library-facts.md). Loaded for real, so /proc/PID/maps shows which one is mapped.
COLLECTIVES = ("librccl.so.1", "libnccl.so.2")
BUNDLED = ("torch/lib/librccl.so.1", "nvidia/nccl/lib/libnccl.so.2")


def load_collectives(state=None):
    """The path of the collectives library this process mapped (the venv's bundled copy first), or None (logged).
    When it is the lab's RCCL TEST STAND-IN (tests/artifacts/rccl-standin: it exports rcclStandinP2p), its own
    ncclCommInitAll decides the transport as RCCL would (a stock build keeps SHM on the Intel host, seed 004) and
    its ncclGetVersion the NCCL version logged; STATE's evidence can still force SHM (the serve-shm fault)."""
    import ctypes
    import sysconfig

    site = sysconfig.get_paths()["purelib"]
    for candidate in [os.path.join(site, rel) for rel in BUNDLED] + list(COLLECTIVES):
        if os.path.isabs(candidate) and not os.path.isfile(candidate):
            continue
        try:
            handle = ctypes.CDLL(candidate)
        except OSError:
            continue
        _LOADED.append(handle)  # kept: the library stays mapped for the engine's life
        if state is not None and hasattr(handle, "rcclStandinP2p"):
            _ask_the_library(handle, state)
        elif state is not None:  # a real NCCL (the lab's NVIDIA host: the pip wheel's) answers its version only
            _ask_the_version(handle, state)
        return candidate
    log("no collectives library (" + ", ".join(COLLECTIVES) + ") could be loaded: none is mapped", 0)
    return None


def _ask_the_library(handle, state) -> None:
    import ctypes

    quiet = os.environ.pop("NCCL_DEBUG", None)  # the engine logs the NCCL lines itself (log_nccl)
    try:
        comms = (ctypes.c_void_p * state.args.tp_size)()
        if handle.ncclCommInitAll(comms, state.args.tp_size, None) != 0:
            raise StandinError("the collectives library's ncclCommInitAll failed")
        if not handle.rcclStandinP2p(ctypes.c_void_p(comms[0])):
            state.ev["transport"] = "shm"
        _ask_the_version(handle, state)
    finally:
        if quiet is not None:
            os.environ["NCCL_DEBUG"] = quiet
    state.custom_ar = state._custom_all_reduce()


def _ask_the_version(handle, state) -> None:
    """The NCCL version the engine logs: the loaded library's ncclGetVersion (MAJOR*10000 + MINOR*100 + PATCH)."""
    import ctypes

    version = ctypes.c_int()
    if hasattr(handle, "ncclGetVersion") and handle.ncclGetVersion(ctypes.byref(version)) == 0:
        code = version.value
        state.ev["nccl_version"] = f"{code // 10000}.{code // 100 % 100}.{code % 100}"


_LOADED: list = []


def log_nccl(state: Standin) -> None:
    """NCCL INFO lines in NCCL's own format (host:pid:tid [dev] NCCL INFO ...)."""
    host, pid = socket.gethostname(), os.getpid()
    direct = 1 if state.ev["transport"] == "p2p" else 0
    via = "P2P/IPC" if direct else "SHM/direct/direct"
    size = state.args.tp_size
    emit(f"{host}:{pid}:{pid} [0] NCCL INFO NCCL version {state.ev['nccl_version']}")
    emit(f"{host}:{pid}:{pid} [0] NCCL INFO Check P2P Type isAllDirectP2p {direct} directMode 0")
    for rank in range(size):
        peer = (rank + 1) % size
        for channel in range(2):
            emit(f"{host}:{pid}:{pid + 1 + rank} [{rank}] NCCL INFO Channel {channel:02d}/0 : "
                 f"{rank}[{rank}] -> {peer}[{peer}] via {via}")


def log_cuda_graph(state: Standin) -> None:
    ranks = range(state.args.tp_size)
    if state.args.enable_p2p_check and state.args.tp_size > 1 and not state.custom_ar \
            and not state.args.disable_custom_all_reduce:
        for rank in ranks:
            log("Custom allreduce is disabled because your platform lacks GPU P2P capability or P2P test failed. "
                "To silence this warning, specify disable_custom_all_reduce=True explicitly.", rank)
    if state.args.disable_cuda_graph:
        return
    for rank in ranks:
        state.info("Capture cuda graph begin. This can take up to several minutes. avail mem=2.50 GB", rank)
    if state.custom_ar:
        state.info("Registering 2464 cuda graph addresses", 0)
    for rank in ranks:
        state.info("Capture cuda graph end. Time elapsed: 0.01 s. mem usage=0.00 GB. avail mem=2.50 GB.", rank)


def load_weights(state: Standin) -> bool:
    """Log the load; wait load_seconds with the port unbound. False when SIGTERM came meanwhile."""
    ranks = range(state.args.tp_size)
    for rank in ranks:
        state.info("Init torch distributed begin.", rank)
    if state.args.tp_size > 1:
        load_collectives(state)
        state.info(f"sglang is using nccl=={state.ev['nccl_version']}", 0)
    for rank in ranks:
        state.info("Load weight begin. avail mem=22.50 GB", rank)
    tic = time.monotonic()
    if state.stop.wait(state.ev["load_seconds"]):
        return False
    for rank in ranks:
        state.info(f"Load weight end. elapsed={time.monotonic() - tic:.2f} s, type=StandinForCausalLM, "
                   "dtype=torch.bfloat16, avail mem=12.50 GB, mem usage=10.00 GB.", rank)
    if state.args.tp_size > 1:
        log_nccl(state)
    log_cuda_graph(state)
    state.info(f"max_total_num_tokens={state.args.max_total_tokens or 65536}, chunked_prefill_size=8192, "
               f"max_prefill_tokens=16384, max_running_requests=48, context_len={state.context_length}, "
               "available_gpu_mem=2.50 GB", 0)
    return True


def warm_up(state: Standin) -> bool:
    if not state.args.skip_server_warmup:
        if state.stop.wait(state.ev["warmup_seconds"]):
            return False
        state.info("Prefill batch, #new-seq: 1, #new-token: 7, #cached-token: 0, token usage: 0.00, "
                   "#running-req: 0, #queue-req: 0, ", 0)
        state.info('INFO:     127.0.0.1:0 - "POST /generate HTTP/1.1" 200 OK')
    state.status = "up"
    state.info("The server is fired up and ready to roll!")
    return True


def arm_crash(state: Standin) -> None:
    after = state.ev["crash_after_s"]
    if after is None:
        return

    def crash():
        if state.stop.wait(max(0.0, after - (time.monotonic() - state.started))):
            return
        log("Scheduler hit an exception: Traceback (most recent call last):", 0)
        emit(f'  File "{Path(__file__).name}", line 0, in run_scheduler_process')
        emit(f"RuntimeError: stand-in crash after {after:g} s (recorded evidence crash_after_s)")
        log("Received sigquit from a child process. It usually means the child failed.")
        sys.stdout.flush()
        os._exit(1)

    threading.Thread(target=crash, name="crash", daemon=True).start()


# --- HTTP --------------------------------------------------------------------------------------------------------

def prompt_tokens(messages) -> int:
    words = 0
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, str):
            words += len(content.split())
        elif isinstance(content, list):
            words += sum(len(str(part.get("text", "")).split()) for part in content if isinstance(part, dict))
    return words + 4 * len(messages)


def chunk_sizes(total: int, per_chunk: int) -> list:
    return [min(per_chunk, total - start) for start in range(0, total, per_chunk)]


class Handler(BaseHTTPRequestHandler):
    server_version = "uvicorn"
    sys_version = ""
    state: Standin = None  # set by serve()

    # access log in uvicorn's format, through SGLang's prefix
    def log_message(self, fmt, *args):  # noqa: A003 - BaseHTTPRequestHandler's name
        pass

    def log_request(self, code="-", size="-"):
        try:
            code = int(code)
        except (TypeError, ValueError):
            pass
        phrase = self.responses.get(code, ("",))[0] if isinstance(code, int) else ""
        self.state.info(f'INFO:     {self.client_address[0]}:{self.client_address[1]} - '
                        f'"{self.command} {self.path} HTTP/1.1" {code} {phrase}')

    def _send_json(self, code: int, body) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _authorized(self) -> bool:
        """SGLang's add_api_key_middleware: /health* and /metrics are open, everything else needs the Bearer key."""
        key = self.state.args.api_key
        path = self.path.split("?", 1)[0]
        if not key or path.startswith("/health") or path.startswith("/metrics"):
            return True
        if self.headers.get("Authorization", "") == f"Bearer {key}":
            return True
        self._send_json(401, {"error": "Unauthorized"})
        return False

    def do_GET(self):  # noqa: N802 - http.server's name
        if not self._authorized():
            return
        path = self.path.split("?", 1)[0]
        state = self.state
        if path in ("/health", "/health_generate"):
            self.send_response(200 if state.status == "up" else 503)
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif path == "/get_model_info":
            self._send_json(200, {"model_path": state.args.model_path, "tokenizer_path": state.args.model_path,
                                  "is_generation": True, "preferred_sampling_params": None,
                                  "weight_version": "default"})
        elif path in ("/get_server_info", "/server_info"):
            self._send_json(200, state.server_info())
        elif path == "/v1/models":
            self._send_json(200, {"object": "list", "data": [{
                "id": state.served, "object": "model", "created": state.created, "owned_by": "sglang",
                "root": state.served, "max_model_len": state.context_length}]})
        else:
            self._send_json(404, {"detail": "Not Found"})

    def do_POST(self):  # noqa: N802
        if not self._authorized():
            return
        if self.path.split("?", 1)[0] != "/v1/chat/completions":
            self._send_json(404, {"detail": "Not Found"})
            return
        request = self._read_request()
        if request is not None:
            self._chat(request)

    def _bad_request(self, message: str) -> None:
        self._send_json(400, {"object": "error", "message": message, "type": "BadRequestError",
                              "param": None, "code": 400})

    def _read_request(self):
        try:
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length) or b"null")
        except ValueError as exc:
            self._bad_request(f"invalid JSON body: {exc}")
            return None
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list) or not body["messages"]:
            self._bad_request("'messages' must be a non-empty list")
            return None
        max_tokens = body.get("max_tokens", body.get("max_completion_tokens", DEFAULT_MAX_TOKENS))
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            self._bad_request("'max_tokens' must be an integer >= 1")
            return None
        body["max_tokens"] = max_tokens
        return body

    def _chat(self, request: dict) -> None:
        state = self.state
        plan = Generation(state, request)
        if request.get("stream"):
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Connection", "close")
            self.end_headers()
            try:
                for payload in plan.stream_events():
                    self.wfile.write(f"data: {payload}\n\n".encode())
                    self.wfile.flush()
            except (BrokenPipeError, ConnectionResetError):
                pass
            self.close_connection = True
        else:
            self._send_json(200, plan.complete())
        plan.log_decode_end()


class Generation:
    """One request: TTFT, then tokens_per_chunk tokens per step at decode_tok_s."""

    def __init__(self, state: Standin, request: dict):
        self.state = state
        self.request = request
        self.id = "chatcmpl-" + uuid.uuid4().hex
        self.created = int(time.time())
        self.total = request["max_tokens"]
        self.prompt = prompt_tokens(request["messages"])
        self.sizes = chunk_sizes(self.total, state.ev["tokens_per_chunk"])
        self.start = time.monotonic()
        self.emitted = 0
        self.steps = 0
        self.log_tic = None
        self.log_tokens = 0
        state.info(f"Prefill batch, #new-seq: 1, #new-token: {self.prompt}, #cached-token: 0, token usage: 0.00, "
                   "#running-req: 0, #queue-req: 0, ", 0)

    def _due(self, index: int) -> float:
        """Chunk `index` (0-based) leaves at ttft, then one decode step of tokens_per_chunk tokens each."""
        ev = self.state.ev
        return self.start + ev["ttft_s"] + index * ev["tokens_per_chunk"] / ev["decode_tok_s"]

    def _wait_until(self, when: float) -> None:
        delay = when - time.monotonic()
        if delay > 0:
            time.sleep(delay)

    def _step(self, index: int, size: int) -> str:
        self._wait_until(self._due(index))
        if self.log_tic is None:
            self.log_tic = time.monotonic()
        text = "".join(f"tok{self.emitted + i} " for i in range(size))
        self.emitted += size
        self.steps += 1
        self.log_tokens += size
        if self.steps % DECODE_LOG_INTERVAL == 0:
            self._log_decode()
        return text

    def _log_decode(self) -> None:
        elapsed = time.monotonic() - self.log_tic
        rate = self.log_tokens / elapsed if elapsed > 0 else 0.0
        args, ev = self.state.args, self.state.ev
        spec = ""
        if args.speculative_algorithm:
            drafts = args.speculative_num_draft_tokens or (args.speculative_num_steps or 0) + 1
            accept = ev["tokens_per_chunk"] if ev["accept_len"] is None else ev["accept_len"]
            spec = f"accept len: {accept:.2f}, accept rate: {accept / drafts:.2f}, "
        graph = "False" if args.disable_cuda_graph else "True"
        self.state.info(f"Decode batch, #running-req: 1, #token: {self.prompt + self.emitted}, token usage: 0.00, "
                        f"{spec}cuda graph: {graph}, gen throughput (token/s): {rate:.2f}, #queue-req: 0, ", 0)
        self.log_tic, self.log_tokens = time.monotonic(), 0

    def log_decode_end(self) -> None:
        if self.log_tokens and self.log_tic is not None:
            self._log_decode()

    def usage(self) -> dict:
        return {"prompt_tokens": self.prompt, "completion_tokens": self.emitted,
                "total_tokens": self.prompt + self.emitted}

    def _chunk(self, delta: dict, finish=None) -> str:
        return json.dumps({"id": self.id, "object": "chat.completion.chunk", "created": self.created,
                           "model": self.state.served, "choices": [
                               {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
                           "usage": None})

    def stream_events(self):
        for index, size in enumerate(self.sizes):
            text = self._step(index, size)
            delta = {"role": "assistant", "content": text} if index == 0 else {"content": text}
            last = index == len(self.sizes) - 1
            yield self._chunk(delta, "length" if last else None)
        options = self.request.get("stream_options") or {}
        if isinstance(options, dict) and options.get("include_usage"):
            yield json.dumps({"id": self.id, "object": "chat.completion.chunk", "created": self.created,
                              "model": self.state.served, "choices": [], "usage": self.usage()})
        yield "[DONE]"

    def complete(self) -> dict:
        text = "".join(self._step(index, size) for index, size in enumerate(self.sizes))
        return {"id": self.id, "object": "chat.completion", "created": self.created, "model": self.state.served,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text,
                                                     "reasoning_content": None, "tool_calls": None},
                             "logprobs": None, "finish_reason": "length", "matched_stop": None}],
                "usage": self.usage()}


def bind(state: Standin) -> ThreadingHTTPServer:
    handler = type("BoundHandler", (Handler,), {"state": state})
    try:
        server = ThreadingHTTPServer((state.args.host, state.args.port), handler)
    except OSError as exc:
        log_traceback("launch_server", f"OSError: [Errno {exc.errno}] {exc.strerror}: "
                                       f"{state.args.host}:{state.args.port}")
        raise StandinError(f"cannot bind {state.args.host}:{state.args.port}: {exc.strerror}") from None
    server.daemon_threads = True
    state.info(f"INFO:     Started server process [{os.getpid()}]")
    state.info("INFO:     Waiting for application startup.")
    state.info("INFO:     Application startup complete.")
    state.info(f"INFO:     Uvicorn running on http://{state.args.host}:{state.args.port} (Press CTRL+C to quit)")
    return server


# --- main --------------------------------------------------------------------------------------------------------

def run(argv) -> int:
    parser = build_parser()
    args, unknown = parser.parse_known_args(merge_config(argv, parser))
    ev = load_evidence()
    config = model_config(args.model_path)
    state = Standin(args, ev, config)
    # set from a thread of its own: a handler that takes the event's lock itself could run while the main thread,
    # entering stop.wait(), holds it (a non-reentrant lock: the engine would hang instead of stopping)
    stopper = lambda *_: threading.Thread(target=state.stop.set, daemon=True).start()  # noqa: E731
    signal.signal(signal.SIGTERM, stopper)
    signal.signal(signal.SIGINT, stopper)
    emit(f"sglang version: {ev['version']}")
    log(state.server_args_line())
    if unknown:
        log(f"WARNING: the stand-in ignores arguments it does not model: {' '.join(unknown)}")
    arm_crash(state)
    if not load_weights(state):
        return shut_down(state, None)
    server = bind(state)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, name="http",
                     daemon=True).start()
    if warm_up(state):
        while not state.stop.wait(0.2):
            pass
    return shut_down(state, server)


def shut_down(state: Standin, server) -> int:
    state.info("INFO:     Shutting down")
    if server is not None:
        server.shutdown()
        server.server_close()
    state.info("INFO:     Finished server process")
    return 0


def main(argv=None) -> int:
    try:
        return run(sys.argv[1:] if argv is None else argv)
    except StandinError as exc:
        log(f"StandinError: {exc}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
