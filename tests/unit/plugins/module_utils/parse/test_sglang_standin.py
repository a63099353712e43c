"""The SGLang TEST STAND-IN (tests/artifacts/sglang_standin.py): startup, endpoints, pacing, auth, exits, and its log
read back by the real log parser. Every server listens on a free 127.0.0.1 port and is stopped by its own Popen."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from ansible_collections.rigbook.homelab.plugins.module_utils.parse import sglang_log

STANDIN = Path(__file__).resolve().parents[4] / "artifacts" / "sglang_standin.py"
FAST = {"load_seconds": 0.3, "warmup_seconds": 0.3, "ttft_s": 0.1, "decode_tok_s": 200.0}
READY = "The server is fired up and ready to roll!"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """One stand-in process with its stdout collected line by line."""

    def __init__(self, argv, env, port):
        self.port = port
        self.lines = []
        self._eof = False
        self._cond = threading.Condition()
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            with self._cond:
                self.lines.append(line)
                self._cond.notify_all()
        with self._cond:
            self._eof = True
            self._cond.notify_all()

    def text(self) -> str:
        with self._cond:
            return "".join(self.lines)

    def wait_for(self, needle: str, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        with self._cond:
            while not any(needle in line for line in self.lines):
                left = deadline - time.monotonic()
                if left <= 0 or self._eof:
                    raise AssertionError(f"no {needle!r} in:\n{''.join(self.lines)}")
                self._cond.wait(min(left, 0.2))

    def exit_code(self, timeout: float = 10.0) -> int:
        code = self.proc.wait(timeout)
        with self._cond:
            self._cond.wait_for(lambda: self._eof, timeout)
        return code

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)

    # --- HTTP on loopback ---
    def request(self, path, body=None, key=None, timeout=10.0):
        """(status, parsed JSON body or raw bytes); raises ConnectionRefusedError while the port is unbound."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", data=data)
        if key:
            req.add_header("Authorization", f"Bearer {key}")
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                raw, status = resp.read(), resp.status
        except urllib.error.HTTPError as err:
            raw, status = err.read(), err.code
        except urllib.error.URLError as err:
            if isinstance(err.reason, ConnectionRefusedError):
                raise err.reason from None
            raise
        try:
            return status, json.loads(raw) if raw else None
        except ValueError:
            return status, raw

    def stream(self, body, key=None):
        """[(seconds since send, payload)] for each SSE `data:` line."""
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}/v1/chat/completions",
                                     data=json.dumps({**body, "stream": True}).encode())
        if key:
            req.add_header("Authorization", f"Bearer {key}")
        events, t0 = [], time.monotonic()
        with urllib.request.urlopen(req, timeout=30) as resp:
            for raw in resp:
                line = raw.decode().strip()
                if line.startswith("data: "):
                    payload = line[len("data: "):]
                    events.append((time.monotonic() - t0, payload if payload == "[DONE]" else json.loads(payload)))
        return events


@pytest.fixture
def launch(tmp_path):
    started = []
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"max_position_embeddings": 4096}))

    def start(evidence=FAST, *flags, model_path=None, python=sys.executable, env=None):
        root = tmp_path / f"root{len(started)}"
        if evidence is not None:
            target = root / "var/lib/rigbook/commands/sglang-standin.json"
            target.parent.mkdir(parents=True)
            target.write_text(json.dumps(evidence) if isinstance(evidence, dict) else evidence)
        port = free_port()
        argv = [str(python), str(STANDIN), "--model-path", str(model_path or model), "--port", str(port), *flags]
        server = Server(argv, {**os.environ, "RIGBOOK_EVIDENCE_ROOT": str(root), **(env or {})}, port)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


def chat(max_tokens, **extra):
    return {"model": "any", "messages": [{"role": "user", "content": "say something long"}],
            "max_tokens": max_tokens, **extra}


def test_port_refused_while_loading_then_503_then_200(launch):
    server = launch({**FAST, "load_seconds": 1.0, "warmup_seconds": 1.0})
    server.wait_for("Load weight begin")
    with pytest.raises(ConnectionRefusedError):
        server.request("/health")
    statuses, deadline = [], time.monotonic() + 10
    while 200 not in statuses and time.monotonic() < deadline:
        try:
            statuses.append(server.request("/health")[0])
            statuses.append(server.request("/health_generate")[0])
        except ConnectionRefusedError:
            time.sleep(0.05)
    assert statuses[0] == 503 and statuses[-1] == 200, statuses
    assert set(statuses) == {503, 200}
    server.wait_for(READY)  # /health_generate may answer 200 a moment before the ready line reaches the log file
    log = server.text()
    assert log.index("Load weight end") < log.index("Uvicorn running") < log.index(READY)


def test_models_and_model_info(launch):
    named = launch(FAST, "--served-model-name", "rig-model", "--context-length", "8192")
    plain = launch(FAST)
    for server in (named, plain):
        server.wait_for(READY)
    status, body = named.request("/v1/models")
    assert status == 200 and body["object"] == "list"
    assert [(m["id"], m["max_model_len"]) for m in body["data"]] == [("rig-model", 8192)]
    status, body = plain.request("/v1/models")
    model_path = plain.request("/get_model_info")[1]["model_path"]
    assert [(m["id"], m["max_model_len"]) for m in body["data"]] == [(model_path, 4096)]  # config.json's length


def test_decode_rate_ttft_and_usage(launch):
    ev = {**FAST, "ttft_s": 0.3, "decode_tok_s": 50.0, "tokens_per_chunk": 1}
    server = launch(ev)
    server.wait_for(READY)
    events = server.stream(chat(50, stream_options={"include_usage": True}))
    content = [(t, e) for t, e in events if e != "[DONE]" and e["choices"]]
    usage = [e for _, e in events if e != "[DONE]" and not e["choices"]][0]["usage"]
    ttft, t_end = content[0][0], content[-1][0]
    rate = usage["completion_tokens"] / (t_end - ttft)
    assert usage["completion_tokens"] == 50
    assert usage["total_tokens"] == usage["prompt_tokens"] + 50 and usage["prompt_tokens"] > 0
    # Paced against due times (TTFT, then one token every 1/50 s): never faster than the rate; slower only by what a
    # busy machine delays a thread (bounded loosely: this is no timing benchmark, the figures' accuracy is measured in
    # benchmarks/serving_decode.py)
    assert t_end - ttft >= 49 / 50.0 - 0.01, (ttft, t_end)
    assert rate >= 25.0, rate
    assert 0.3 <= ttft < 1.0, ttft
    tic = time.monotonic()
    status, body = server.request("/v1/chat/completions", chat(40))
    elapsed = time.monotonic() - tic
    assert status == 200 and body["usage"]["completion_tokens"] == 40
    assert len(body["choices"][0]["message"]["content"].split()) == 40
    assert elapsed >= 0.3 + 39 / 50.0 - 0.01, elapsed
    assert 40 / (elapsed - 0.3) >= 25.0, elapsed


def test_speculative_chunks_carry_tokens_per_chunk(launch):
    server = launch({**FAST, "tokens_per_chunk": 3}, "--speculative-algorithm", "EAGLE",
                    "--speculative-num-steps", "3", "--speculative-num-draft-tokens", "4")
    server.wait_for(READY)
    events = server.stream(chat(10, stream_options={"include_usage": True}))
    payloads = [e for _, e in events]
    assert payloads[-1] == "[DONE]"
    assert payloads[-2]["choices"] == [] and payloads[-2]["usage"]["completion_tokens"] == 10
    chunks = payloads[:-2]
    assert [len(c["choices"][0]["delta"]["content"].split()) for c in chunks] == [3, 3, 3, 1]
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None, None, None, "length"]
    no_usage = [e for _, e in server.stream(chat(4))]
    assert all(e == "[DONE]" or e["choices"] for e in no_usage)  # usage only when asked for
    server.wait_for("accept len: 3.00")
    assert sglang_log.parse(server.text())["accept_len"][0] == 3.0


def test_the_accept_length_comes_from_the_evidence_when_it_is_recorded(launch):
    """Seed 000: DFlash accepted 2.1-2.4 tokens a step on natural text, which no whole tokens_per_chunk can say."""
    server = launch({**FAST, "tokens_per_chunk": 2, "accept_len": 2.3}, "--speculative-algorithm", "DFLASH",
                    "--speculative-num-draft-tokens", "8")
    server.wait_for(READY)
    assert server.request("/v1/chat/completions", chat(6))[0] == 200
    server.wait_for("accept len: 2.30, accept rate: 0.29")
    assert sglang_log.parse(server.text())["accept_len"] == [2.3]
    plain = launch({**FAST, "accept_len": 2.3})  # no speculative decoding: no accept length
    plain.wait_for(READY)
    assert plain.request("/v1/chat/completions", chat(6))[0] == 200
    plain.wait_for("Decode batch")
    assert "accept len" not in plain.text() and sglang_log.parse(plain.text())["accept_len"] == []


def test_api_key_guards_everything_but_health(launch):
    server = launch(FAST, "--api-key", "s3cret")
    server.wait_for(READY)
    for path in ("/v1/models", "/get_model_info"):
        assert server.request(path)[0] == 401
        assert server.request(path, key="wrong")[0] == 401
        assert server.request(path, key="s3cret")[0] == 200
    assert server.request("/v1/chat/completions", chat(2))[0] == 401
    assert server.request("/v1/chat/completions", chat(2), key="s3cret")[0] == 200
    assert server.request("/health")[0] == 200 and server.request("/health_generate")[0] == 200
    assert sglang_log.parse(server.text())["api_key_logged"] is True  # SGLang does not redact it either


def write_config(tmp_path, text, name="api-key.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_the_key_from_a_config_file_guards_as_the_flag_does(launch, tmp_path):
    """What the serve unit does: `--config %d/api-key.yaml`, the key never on the command line."""
    config = write_config(tmp_path, '# Managed by rigbook\napi-key: "s3 cr#t\\"x"\n')
    server = launch(FAST, "--config", config)
    server.wait_for(READY)
    assert server.request("/v1/models")[0] == 401
    assert server.request("/v1/models", key='s3 cr#t"x')[0] == 200
    assert server.request("/health_generate")[0] == 200
    args = sglang_log.parse_server_args(next(line for line in server.lines if "server_args=" in line))
    assert args["api_key"] == 's3 cr#t"x'  # merged in-process, as SGLang: logged like the flag (unpatched SGLang)


def test_the_command_line_wins_over_the_config_file(launch, tmp_path):
    config = write_config(tmp_path, "api-key: from-file\nserved-model-name: from-file\ndisable-cuda-graph: true\n"
                                    "enable-p2p-check: false\n")
    server = launch(FAST, "--served-model-name", "from-cli", "--config", config)
    server.wait_for(READY)
    assert server.request("/v1/models", key="from-file")[1]["data"][0]["id"] == "from-cli"
    args = sglang_log.parse_server_args(next(line for line in server.lines if "server_args=" in line))
    assert args["disable_cuda_graph"] is True and args["enable_p2p_check"] is False


@pytest.mark.parametrize("flags, needle", [
    (["--config", "{cfg}", "--config", "{cfg}"], "Multiple config files specified"),
    (["--config"], "No config file specified after --config flag"),
    (["--config", "{txt}"], "Config file must be YAML format, got: .txt"),
    (["--config", "{missing}"], "Config file not found"),
    (["--config", "{list}"], "Config file must contain a dictionary at root level"),
])
def test_config_file_mistakes_are_one_error_line_and_exit_1(launch, tmp_path, flags, needle):
    paths = {"cfg": write_config(tmp_path, "api-key: k\n"), "txt": write_config(tmp_path, "api-key: k\n", "k.txt"),
             "missing": str(tmp_path / "absent.yaml"), "list": write_config(tmp_path, "- a\n- b\n", "l.yml")}
    server = launch(FAST, *[flag.format(**paths) for flag in flags])
    assert server.exit_code() == 1
    assert [line for line in server.lines if needle in line and "StandinError:" in line], server.text()


def test_only_the_exact_config_word_is_a_config_file(launch, tmp_path):
    """SGLang's merger looks for the word --config alone: --config=FILE is not merged (argparse keeps it)."""
    server = launch(FAST, "--config=" + write_config(tmp_path, "api-key: k\n"))
    server.wait_for(READY)
    assert server.request("/v1/models")[0] == 200  # no key was set


def test_the_flat_reader_without_pyyaml_reads_what_rigbook_writes(tmp_path, monkeypatch):
    """A lab host's python3 has no PyYAML: the stand-in's own reader of flat mappings gives what PyYAML gives."""
    standin = load_standin()
    path = tmp_path / "k.yaml"
    path.write_text('# comment\n---\napi-key: "a\\"b # c"\nport: 8000\nratio: 0.5\nflag: true\nname: x # note\n'
                    "quoted: 'it''s'\nnone: ~\n")
    with_pyyaml = standin.read_config(path)
    monkeypatch.setitem(sys.modules, "yaml", None)  # import yaml raises ImportError
    assert standin.read_config(path) == with_pyyaml == {
        "api-key": 'a"b # c', "port": 8000, "ratio": 0.5, "flag": True, "name": "x", "quoted": "it's", "none": None}
    path.write_text("api-key:\n  nested: 1\n")
    with pytest.raises(standin.StandinError, match="flat"):
        standin.read_config(path)


def load_standin():
    import importlib.util
    spec = importlib.util.spec_from_file_location("sglang_standin", STANDIN)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bad_requests_are_400(launch):
    server = launch(FAST)
    server.wait_for(READY)
    assert server.request("/v1/chat/completions", {"messages": []})[0] == 400
    assert server.request("/v1/chat/completions", chat(0))[0] == 400
    assert server.request("/nope")[0] == 404


def test_crash_after_s_exits_non_zero(launch):
    server = launch({**FAST, "crash_after_s": 1.0})
    server.wait_for(READY)
    assert server.exit_code() != 0
    result = sglang_log.parse(server.text())
    assert result["ready"] is True
    assert any("Traceback" in e for e in result["errors"])
    assert any("RuntimeError:" in e for e in result["errors"])


def test_crash_during_load_exits_before_binding(launch):
    server = launch({**FAST, "load_seconds": 5.0, "crash_after_s": 0.3})
    assert server.exit_code() == 1
    assert "Uvicorn running" not in server.text()


@pytest.mark.parametrize("when", ["loading", "serving"])
def test_sigterm_exits_zero(launch, when):
    server = launch({**FAST, "load_seconds": 5.0} if when == "loading" else FAST)
    server.wait_for("Load weight begin" if when == "loading" else READY)
    tic = time.monotonic()
    server.proc.send_signal(signal.SIGTERM)
    assert server.exit_code() == 0
    assert time.monotonic() - tic < 3


@pytest.mark.parametrize("evidence,needle", [
    (None, "recorded evidence missing"),
    ("{not json", "recorded evidence unreadable"),
    ({**FAST, "transport": "nvlink"}, "transport must be"),
    ({**FAST, "tokens_per_chunk": 0}, "tokens_per_chunk must be"),
    ({**FAST, "decode_tok_s": "fast"}, "decode_tok_s must be"),
    ({**FAST, "accept_len": 0.5}, "accept_len must be a number >= 1.0"),
])
def test_bad_evidence_is_one_error_line_and_exit_1(launch, evidence, needle):
    server = launch(evidence)
    assert server.exit_code() == 1
    errors = [line for line in server.lines if needle in line]
    assert len(errors) == 1 and "StandinError:" in errors[0], server.text()


def test_model_path_without_config_json_is_refused(launch, tmp_path):
    empty = tmp_path / "empty-model"
    empty.mkdir()
    for path in (empty, tmp_path / "missing"):
        server = launch(FAST, model_path=path)
        assert server.exit_code() == 1
        result = sglang_log.parse(server.text())
        assert any(e.startswith("OSError:") for e in result["errors"]), server.text()
        assert not result["ready"]


def test_unknown_flags_are_logged_not_fatal(launch):
    server = launch(FAST, "--quantization", "awq", "--hicache-ratio", "2")
    server.wait_for(READY)
    assert "--quantization awq --hicache-ratio 2" in server.text()


@pytest.mark.parametrize("transport,flags,path,direct,custom_ar", [
    ("p2p", [], "p2p", True, True),
    ("p2p", ["--disable-custom-all-reduce"], "p2p", True, False),
    ("shm", ["--enable-p2p-check"], "shm", False, False),
    ("shm", [], "shm", False, True),  # SGLang patches the P2P check out unless --enable-p2p-check
])
def test_parser_reads_the_standin_log(launch, transport, flags, path, direct, custom_ar):
    server = launch({**FAST, "transport": transport, "version": "0.5.18"}, "--tp-size", "2", *flags)
    server.wait_for(READY)
    assert server.request("/v1/chat/completions", chat(45))[0] == 200
    server.wait_for("gen throughput")
    result = sglang_log.parse(server.text())
    assert result["ready"] is True and result["version"] == "0.5.18"
    assert result["path"] == path and result["all_direct_p2p"] is direct
    assert result["custom_all_reduce"] is custom_ar
    assert result["server_args"]["tp_size"] == 2 and result["server_args"]["host"] == "127.0.0.1"
    assert abs(result["load_weight_s"] - 0.3) < 0.2
    assert result["cuda_graph_s"] is not None and result["errors"] == []
    assert result["gen_throughput_tok_s"] and result["api_key_logged"] is False


def test_single_gpu_prints_no_nccl_lines(launch):
    server = launch(FAST)
    server.wait_for(READY)
    result = sglang_log.parse(server.text())
    assert "NCCL INFO" not in server.text()
    assert result["path"] is None and result["all_direct_p2p"] is None and result["custom_all_reduce"] is None


def _shared_library(path: Path) -> Path:
    """A real, empty shared library at PATH (built with the C compiler), for the stand-in to load and map."""
    path.parent.mkdir(parents=True, exist_ok=True)
    source = path.parent / "empty.c"
    source.write_text("int rigbook_test_symbol(void) { return 0; }\n")
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(path), str(source)], check=True)
    return path


def _mapped(pid: int) -> set:
    return {line.split()[-1] for line in Path(f"/proc/{pid}/maps").read_text().splitlines()
            if line.split()[-1].startswith("/")}


def test_the_collectives_library_is_mapped_from_the_library_path_and_the_bundled_copy_wins(launch, tmp_path):
    """As torch's wheel resolves it (../shared/research/engine-library-facts.md): a library on LD_LIBRARY_PATH is
    mapped when the venv bundles none; once the venv bundles one (torch/lib), that copy is mapped instead."""
    patched = _shared_library(tmp_path / "rccl/lib/librccl.so.1")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin/python"
    server = launch(FAST, "--tp-size", "2", python=python, env={"LD_LIBRARY_PATH": str(patched.parent)})
    server.wait_for(READY)
    assert str(patched) in _mapped(server.proc.pid)
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    bundled = _shared_library(Path(site) / "torch/lib/librccl.so.1")
    server = launch(FAST, "--tp-size", "2", python=python, env={"LD_LIBRARY_PATH": str(patched.parent)})
    server.wait_for(READY)
    mapped = _mapped(server.proc.pid)
    assert str(bundled) in mapped and str(patched) not in mapped
    # one GPU: no collectives, nothing loaded
    server = launch(FAST, python=python, env={"LD_LIBRARY_PATH": str(patched.parent)})
    server.wait_for(READY)
    assert not {m for m in _mapped(server.proc.pid) if "librccl" in m}


def test_without_any_collectives_library_the_engine_says_so_and_serves(launch):
    server = launch(FAST, "--tp-size", "2", env={"LD_LIBRARY_PATH": ""})
    server.wait_for(READY)
    assert "no collectives library (librccl.so.1, libnccl.so.2) could be loaded" in server.text()
