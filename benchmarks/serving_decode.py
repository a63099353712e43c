"""Benchmark: the serving layer's decode tok/s against a known rate, one token a chunk and three a chunk.

Starts the lab's engine stand-in (tests/artifacts/sglang_standin.py: a TEST STAND-IN for SGLang's server, not
SGLang) on a free loopback port with its behaviour recorded in a temporary evidence root
(var/lib/rigbook/commands/sglang-standin.json: seed 004's TTFT 0.654 s; native decode 31.40 tok/s at one token a
chunk, MTP 44.04 tok/s at three tokens a chunk, its accepted length ~3.07), then runs the serving collector
(collect/serving_evidence.py: readiness poll, /v1/models, one streaming and one plain chat completion) and the
judge against it, and prints per mode:
  - decode tok/s as the layer measures it (usage.completion_tokens / (elapsed - TTFT)) against the configured
    rate, and the ratio (target: within 2%);
  - what a per-chunk timer would have reported (chunks/s): a third of the rate with three tokens a chunk;
  - TTFT measured vs configured, the transport the stand-in's log shows (parse/sglang_log.py);
  - the layer's own wall time (the readiness wait included, and shown on its own).
No systemd here: the unit checks are left out (the verdict says so). Exit 1 when a ratio misses the target.
Run: .venv/bin/python benchmarks/serving_decode.py
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STANDIN = REPO / "tests" / "artifacts" / "sglang_standin.py"
TARGET = 0.02
TTFT_S = 0.654
MODES = (("plain", 1, 31.40), ("multi-token chunks", 3, 44.04))
KEY = "sk-benchmark-only"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_standin(work: Path, tokens_per_chunk: int, rate: float, port: int):
    """(process, log path) of the stand-in serving TP=2 with an API key, its behaviour recorded under WORK."""
    commands = work / "root" / "var" / "lib" / "rigbook" / "commands"
    commands.mkdir(parents=True)
    (commands / "sglang-standin.json").write_text(json.dumps({
        "version": "0.5.18", "load_seconds": 0.5, "warmup_seconds": 0.5, "ttft_s": TTFT_S, "decode_tok_s": rate,
        "tokens_per_chunk": tokens_per_chunk, "transport": "p2p", "crash_after_s": None}))
    model = work / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"architectures": ["Qwen3ForCausalLM"]}))
    log = work / "standin.log"
    argv = [sys.executable, str(STANDIN), "--model-path", str(model), "--served-model-name", "standin",
            "--tp-size", "2", "--host", "127.0.0.1", "--port", str(port), "--api-key", KEY]
    env = {"RIGBOOK_EVIDENCE_ROOT": str(work / "root"), "PATH": "/usr/bin:/bin"}
    with open(log, "w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
    return proc, log


def run_layer(work: Path, port: int, log: Path):
    """(item, verdict, seconds) of the serving collector and judge against the stand-in on PORT."""
    from ansible_collections.rigbook.homelab.plugins.module_utils import host_model
    from ansible_collections.rigbook.homelab.plugins.module_utils.collect import serving_evidence as serving
    from ansible_collections.rigbook.homelab.plugins.module_utils.judges.serving_layer import judge_serving

    key_file = work / "api-key"
    key_file.write_text(KEY + "\n")
    # the serve profile as the ladder gets it: the host model's (rigbook_host.serve)
    model = host_model.build({"rigbook_serve": [{"name": "standin", "model_path": "/srv/models/standin", "port": port,
                                                 "served_model_name": "standin", "api_key_file": str(key_file),
                                                 "startup_timeout_s": 60, "tp_size": 2}]})
    assert not model["serve_errors"], model["serve_errors"]
    (profile,) = model["serve"]
    profile["unit"] = None  # no systemd unit here
    start = time.perf_counter()
    item = serving.measure_profile(profile)
    item["log"] = serving.log_summary(log.read_text())  # the journal a unit would have
    verdict = judge_serving({"profiles": [item], "error": None},
                            {"gpu": {"count": 2}, "p2p": {"expected": True}})
    return item, verdict, time.perf_counter() - start


def report(mode, tokens_per_chunk, rate, item, verdict, seconds) -> bool:
    decode = item.get("decode", {}).get("decode_tok_s")
    stream = item.get("stream", {})
    ratio = decode / rate if decode else 0.0
    ok = abs(ratio - 1.0) <= TARGET
    print(f"{mode}: {tokens_per_chunk} token(s)/chunk, configured {rate:.2f} tok/s, TTFT {TTFT_S:.3f} s")
    print(f"  layer decode tok/s   {decode or 0:8.2f}  ratio {ratio:.4f}  (target within {TARGET:.0%}: "
          f"{'ok' if ok else 'MISSED'})")
    print(f"  per-chunk timer      {stream.get('per_chunk_tok_s') or 0:8.2f}  ratio "
          f"{(stream.get('per_chunk_tok_s') or 0) / rate:.4f}  ({stream.get('chunks')} chunks, "
          f"{stream.get('tokens_per_chunk')} tokens each)")
    print(f"  TTFT                 {stream.get('ttft_s') or 0:8.3f}  s (configured {TTFT_S:.3f})")
    print(f"  transport in the log {(item.get('log') or {}).get('path')}, isAllDirectP2p "
          f"{(item.get('log') or {}).get('all_direct_p2p')}; verdict {verdict['status']}: {verdict['why'][:160]}")
    print(f"  layer wall time      {seconds:8.2f}  s (readiness wait {item['ready'].get('waited_s')} s, "
          f"{item['ready'].get('polls')} polls)")
    return ok


def main() -> int:
    if not STANDIN.is_file():
        print(f"{STANDIN} is not there yet: nothing to benchmark against")
        return 2
    from rigbook.paths import link_collection

    link_collection()
    results = []
    for mode, tokens_per_chunk, rate in MODES:
        with tempfile.TemporaryDirectory(prefix="rigbook-serving-bench-") as tmp:
            port = free_port()
            proc, log = start_standin(Path(tmp), tokens_per_chunk, rate, port)
            try:
                item, verdict, seconds = run_layer(Path(tmp), port, log)
            finally:
                proc.terminate()
                proc.wait(timeout=10)
            if not item["ready"]["ready"]:
                print(f"{mode}: the stand-in never became ready: {item['ready']}\n{log.read_text()[-2000:]}")
                return 1
            results.append(report(mode, tokens_per_chunk, rate, item, verdict, seconds))
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
