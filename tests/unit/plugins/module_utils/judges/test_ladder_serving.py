"""The serving layer (10): its judge on evidence dicts, its collector against a tiny engine on 127.0.0.1, a
recorded tree replayed, and the ladder module's serving phase through real Ansible.

Seed figures: 004 (2x R9700, SGLang v0.5.18) TTFT 1K 0.654 s, MTP decode 44.04 tok/s; 000 (2x 3080) decode
~70 tok/s, TTFT 1K 0.8 s. Real SGLang logs: tests/fixtures/parse/sglang (SOURCES.md there).
"""

from __future__ import annotations

import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from ansible_collections.rigbook.homelab.plugins.module_utils import host_model
from ansible_collections.rigbook.homelab.plugins.module_utils.collect import serving_evidence as serving
from ansible_collections.rigbook.homelab.plugins.module_utils.facts import runner
from ansible_collections.rigbook.homelab.plugins.module_utils.judges.serving_layer import judge_serving, metric_names
from ansible_collections.rigbook.homelab.plugins.module_utils.ladder import climb, registry
from ansible_collections.rigbook.homelab.plugins.module_utils.serve import engine_api
from helpers.modules import local_playbook

from rigbook import baselines, snapshots

P2P = {"gpu": {"vendor": "amd", "count": 2}, "p2p": {"expected": True, "nccl_p2p_level": "PHB"}}
NO_P2P = {"gpu": {"vendor": "nvidia", "count": 2}, "p2p": {"expected": False, "reason": "BAR1 256 MiB"}}
SGLANG_LOGS = Path(__file__).resolve().parents[4] / "fixtures" / "parse" / "sglang"
TTFT, DECODE, ACCEPT = metric_names("qwen")
SEED_004_BASELINE = {TTFT: 0.654, DECODE: 44.04}
KEY = "sk-serving-test-7f3a9c"


def seed_004_item(**changes):
    """One serve profile's measured part as the collector returns it, with seed 004's MTP figures."""
    item = {
        "name": "qwen", "unit": "rigbook-serve-qwen.service", "address": "127.0.0.1:30000", "source": "live",
        "served_model_name": "qwen3.8-27b", "startup_timeout_s": 900, "tp_size": 2,
        "unit_state": {"available": True, "active_state": "active", "sub_state": "running", "n_restarts": 0},
        "previous_restarts": 0,
        "ready": {"ready": True, "waited_s": 0.4, "polls": 1, "last": "HTTP 200"},
        "models": {"ids": ["qwen3.8-27b"], "error": None},
        "stream": {"ttft_s": 0.654, "chunks": 43, "per_chunk_tok_s": 14.7, "completion_tokens": 128, "error": None},
        "decode": {"completion_tokens": 256, "elapsed_s": 6.47, "decode_tok_s": 44.04, "error": None},
        "journal": {"lines": 812, "error": None},
        "log": {"ready": True, "path": "p2p", "all_direct_p2p": True, "errors": [], "api_key_logged": False,
                "version": "0.5.18", "gen_throughput_tok_s": [44.1]},
    }
    for key, value in changes.items():
        item[key] = dict(item[key], **value) if isinstance(value, dict) and isinstance(item.get(key), dict) else value
    return item


def judge(*items, profile=P2P, baseline=None, tolerance=None):
    return judge_serving({"profiles": list(items), "error": None}, profile, baseline, tolerance)


# ------------------------------------------------------------------ the judge on evidence dicts


def test_seed_004_passes_against_its_baseline_and_records_its_figures():
    verdict = judge(seed_004_item(), baseline=SEED_004_BASELINE)
    assert verdict["status"] == "pass", verdict
    assert "code" not in verdict  # a pass carries no failure code
    assert verdict["metrics"] == {TTFT: 0.654, DECODE: 44.04}
    measured = verdict["measured"]["qwen"]
    assert measured["ttft_s"] == 0.654 and measured["decode_tok_s"] == 44.04 and measured["per_chunk_tok_s"] == 14.7
    assert measured["n_restarts"] == 0 and measured["path"] == "p2p" and measured["served"] == ["qwen3.8-27b"]
    assert verdict["expected"]["qwen"]["path"] == "p2p (isAllDirectP2p 1)"


def test_without_a_baseline_the_figures_are_recorded_as_a_pass():
    verdict = judge(seed_004_item())
    assert verdict["status"] == "pass" and "no baseline recorded" in verdict["why"]
    assert "provision baseline record" in verdict["why"] and verdict["metrics"][DECODE] == 44.04


def test_a_failed_unit_fails_naming_its_journal():
    verdict = judge(seed_004_item(unit_state={"active_state": "failed", "sub_state": "failed"},
                                  ready={"ready": False, "error": "not polled: the unit is failed"}))
    assert verdict["status"] == "fail" and "unit rigbook-serve-qwen.service is failed" in verdict["why"]
    assert verdict["code"] == "RB-SERVING-UNIT-INACTIVE"
    assert "journalctl -u rigbook-serve-qwen.service -b" in verdict["remedy"]
    assert "re-run the serve role" in verdict["remedy"]


def test_more_restarts_than_at_the_last_run_is_a_crash_loop():
    verdict = judge(seed_004_item(unit_state={"n_restarts": 3}, previous_restarts=1))
    assert verdict["status"] == "fail" and "crash-looping: NRestarts 3, 1 at the last run" in verdict["why"]
    assert verdict["code"] == "RB-SERVING-CRASH-LOOP"
    assert judge(seed_004_item(unit_state={"n_restarts": 3}, previous_restarts=3))["status"] == "pass"


def test_restarts_with_no_earlier_count_warn_once():
    verdict = judge(seed_004_item(unit_state={"n_restarts": 2}, previous_restarts=None))
    assert verdict["status"] == "warn" and "restarted 2 time(s)" in verdict["why"]
    assert verdict["code"] == "RB-SERVING-UNIT-RESTARTED"


def test_not_ready_within_the_timeout_fails_with_the_last_answer():
    verdict = judge(seed_004_item(ready={"ready": False, "waited_s": 900.2, "polls": 64, "last": "HTTP 503"}))
    assert verdict["status"] == "fail"
    assert "not ready within 900s on 127.0.0.1:30000 (/health_generate: HTTP 503)" in verdict["why"]
    assert verdict["code"] == "RB-SERVING-NOT-READY"
    assert "startup_timeout_s" in verdict["remedy"]


def test_models_without_the_served_name_fails():
    verdict = judge(seed_004_item(models={"ids": ["/srv/models/Qwen3.8-27B-AWQ"]}))
    assert verdict["status"] == "fail" and "lists /srv/models/Qwen3.8-27B-AWQ, not qwen3.8-27b" in verdict["why"]
    assert verdict["code"] == "RB-SERVING-WRONG-MODEL"
    assert "served_model_name" in verdict["remedy"]


def test_models_unreachable_fails_with_the_error():
    verdict = judge(seed_004_item(models={"ids": None, "error": "HTTP 401: unauthorized"}))
    assert verdict["status"] == "fail" and "GET /v1/models failed: HTTP 401" in verdict["why"]
    assert verdict["code"] == "RB-SERVING-MODELS-API"


def test_a_completion_with_no_tokens_fails():
    verdict = judge(seed_004_item(decode={"completion_tokens": 0, "decode_tok_s": None, "error": None},
                                  stream={"ttft_s": None, "chunks": 0, "error": "no non-empty delta in the stream"}))
    assert verdict["status"] == "fail"
    assert "streaming chat completion returned no token (no non-empty delta" in verdict["why"]
    assert "chat completion returned no tokens" in verdict["why"]
    # both findings, in the order found; no baseline, so no figure finding
    assert verdict["code"] == "RB-SERVING-STREAM-NO-TOKEN"
    assert verdict["codes"] == ["RB-SERVING-STREAM-NO-TOKEN", "RB-SERVING-COMPLETION-NO-TOKENS"]


def test_shm_in_the_engine_log_fails_naming_seed_004s_rule():
    verdict = judge(seed_004_item(log={"path": "shm", "all_direct_p2p": None}))
    assert verdict["status"] == "fail"
    assert "shows SHM, not P2P" in verdict["why"] and "seed 004" in verdict["why"]
    assert "isAllDirectP2p 1" in verdict["why"] and "nccl_transport" in verdict["remedy"]
    assert verdict["code"] == "RB-SERVING-SHM-TRANSPORT" and "codes" not in verdict


def test_the_readmes_example_is_what_the_summary_prints_for_it():
    """README.md's example of a code in the output: the SHM fallback's verdict as a CI log shows it."""
    from helpers.cli import REPO

    from rigbook import display

    verdict = judge(seed_004_item(log={"path": "shm", "all_direct_p2p": None}), baseline=SEED_004_BASELINE)
    lines = display.ladder_blocks("rig-r9700", [verdict])
    shown = lines[:2] + [line for line in lines if line.startswith(("    why: ", "    what to do: "))]
    assert lines[1] == "  serving: fail [RB-SERVING-SHM-TRANSPORT]" and len(shown) == 4
    assert "```\n" + "\n".join(shown) + "\n```\n" in (REPO / "README.md").read_text()


def test_is_all_direct_p2p_0_fails_where_p2p_is_expected():
    verdict = judge(seed_004_item(log={"path": "p2p", "all_direct_p2p": False}))
    assert verdict["status"] == "fail" and "isAllDirectP2p 0" in verdict["why"]
    assert verdict["code"] == "RB-SERVING-NOT-ALL-DIRECT-P2P"


PATCHED = {"path": "/opt/rigbook/rccl/2.27.7-ee773f82ce5b/lib/librccl.so.1.0", "sha256": "a" * 64}
BUNDLED = {"path": "/opt/rigbook/sglang/0.5.23-01b36f0cb60c/lib/python3.11/site-packages/torch/lib/librccl.so.1",
           "sha256": "b" * 64}
HIP = {"path": "/opt/rocm-7.1.0/lib/libamdhip64.so.7.1.0", "sha256": "c" * 64}


def judge_library(*libraries, verified=PATCHED, profile=P2P, **item):
    data = {"profiles": [seed_004_item(engine_libraries=list(libraries), **item)], "error": None,
            "verified_library": verified}
    return judge_serving(data, profile, SEED_004_BASELINE)


def test_the_engine_on_the_library_the_collectives_measured_passes_and_names_it_with_its_runtime():
    verdict = judge_library(HIP, PATCHED, log={"nccl_version": "2.27.7"})
    assert verdict["status"] == "pass", verdict["why"]
    measured = verdict["measured"]["qwen"]
    assert measured["collectives_library"] == f"{PATCHED['path']} (sha256 aaaaaaaaaaaa)"
    assert measured["gpu_runtime"] == HIP["path"] and measured["nccl_version_logged"] == "2.27.7"
    assert verdict["expected"]["qwen"]["collectives_library"].startswith(PATCHED["path"])


def test_torchs_bundled_copy_mapped_fails_even_beside_the_verified_one():
    # alone; beside the verified one with neither preloaded; or preloaded itself (then it is the copy used)
    for libraries in ((HIP, BUNDLED), (PATCHED, BUNDLED), (PATCHED, dict(BUNDLED, preloaded=True))):
        verdict = judge_library(*libraries)
        assert verdict["status"] == "fail", libraries
        assert BUNDLED["path"] in verdict["why"] and "DT_RPATH" in verdict["why"] and "seed 004" in verdict["why"]
        assert "--tags sglang" in verdict["remedy"]
        assert verdict["code"] == "RB-ENGINE-LIBRARY", libraries


def test_the_verified_library_preloaded_is_the_copy_used_beside_torchs_bundled_one():
    """Under LD_PRELOAD both copies are mapped and the first-loaded one is used (shared/research/
    engine-library-facts.md, measured on a real H200 host): no fail, a warn that it holds only while the preload
    does."""
    verdict = judge_library(HIP, dict(PATCHED, preloaded=True), BUNDLED, log={"nccl_version": "2.27.7"})
    assert verdict["status"] == "warn", verdict["why"]
    assert f"{BUNDLED['path']} mapped too, but LD_PRELOAD loads the verified library ({PATCHED['path']})" in \
        verdict["why"] and "--tags sglang" in verdict["remedy"]
    assert verdict["code"] == "RB-ENGINE-LIBRARY-PRELOADED"


def test_another_nccl_version_logged_than_the_collectives_measured_fails():
    verified = dict(PATCHED, version="2.27.7")
    verdict = judge_library(HIP, PATCHED, verified=verified, log={"nccl_version": "2.26.6"})
    assert verdict["status"] == "fail" and "logged NCCL version 2.26.6" in verdict["why"]
    assert "measured 2.27.7" in verdict["why"] and verdict["expected"]["qwen"]["nccl_version_logged"] == "2.27.7"
    assert verdict["code"] == "RB-ENGINE-NCCL-VERSION"
    assert judge_library(HIP, PATCHED, verified=verified, log={"nccl_version": "2.27.7"})["status"] == "pass"


def test_what_the_library_check_cannot_know_is_unknown_not_a_pass_or_a_fail():
    assert judge_library(HIP)["status"] == "unknown"  # nothing mapped (yet)
    assert judge_library(HIP)["code"] == "RB-SERVING-UNKNOWN"  # what was not measured: the layer's generic code
    assert judge_library(PATCHED, verified={"error": "ldd: not found"})["status"] == "unknown"
    # no verified library (no collectives tests built: NVIDIA without one): the NCCL in use is named, not judged
    verdict = judge_library({"path": "/v/nvidia/nccl/lib/libnccl.so.2", "sha256": "d" * 64}, verified=None,
                            profile=NO_P2P, log={"path": "shm", "all_direct_p2p": False})
    assert verdict["status"] == "pass" and "libnccl.so.2" in verdict["measured"]["qwen"]["collectives_library"]
    # one GPU: nothing to hold
    assert judge_library(BUNDLED, tp_size=1)["status"] == "pass"


def test_shm_is_the_path_of_a_box_without_p2p_and_p2p_there_warns():
    assert judge(seed_004_item(log={"path": "shm"}), profile=NO_P2P)["status"] == "pass"
    verdict = judge(seed_004_item(log={"path": "p2p"}), profile=NO_P2P)
    assert verdict["status"] == "warn" and "P2P is declared unavailable (BAR1 256 MiB)" in verdict["why"]
    assert verdict["code"] == "RB-SERVING-P2P-UNEXPECTED"


def test_tp_1_has_no_transport_to_judge():
    verdict = judge(seed_004_item(tp_size=1, log={"path": "shm"}))
    assert verdict["status"] == "pass" and "path" not in verdict["expected"]["qwen"]


def test_errors_in_the_engine_log_fail():
    errors = ["torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB"]
    verdict = judge(seed_004_item(log={"errors": errors}))
    assert verdict["status"] == "fail" and "1 error line(s): torch.OutOfMemoryError" in verdict["why"]
    assert verdict["code"] == "RB-SERVING-ENGINE-ERRORS"


def test_a_logged_api_key_warns():
    verdict = judge(seed_004_item(log={"api_key_logged": True}))
    assert verdict["status"] == "warn" and "API key appears in the engine's log" in verdict["why"]
    assert verdict["code"] == "RB-SERVING-API-KEY-LOGGED"


def test_ttft_above_the_baseline_fails_and_decode_below_warns():
    slow_first = judge(seed_004_item(stream={"ttft_s": 0.654 * 1.3}), baseline=SEED_004_BASELINE)
    assert slow_first["status"] == "fail" and "(1.30x), above 1.25x" in slow_first["why"]
    assert "nccl_transport" in slow_first["remedy"]
    assert slow_first["expected"]["qwen"]["ttft_s"].startswith("<= 0.818")
    assert slow_first["code"] == "RB-SERVING-TTFT-BASELINE"
    slower = judge(seed_004_item(decode={"decode_tok_s": 44.04 * 0.9}), baseline=SEED_004_BASELINE)
    assert slower["status"] == "warn" and f"{DECODE} 39.64 vs baseline 44.04 (0.90x), below 0.95x" in slower["why"]
    assert slower["code"] == "RB-SERVING-DECODE-BASELINE"
    # seed 004's native decode (31.40) against its MTP baseline (44.04) is 0.71x: a fail
    assert judge(seed_004_item(decode={"decode_tok_s": 31.40}), baseline=SEED_004_BASELINE)["status"] == "fail"


def seed_000_item(accept_len, **changes):
    """Seed 000's DFlash profile measured (reconstructed from its write-up: decode ~70 tok/s, TTFT 1K 0.8 s, accept
    length 2.1-2.4 on natural text), its log's Decode batch figures ACCEPT_LEN."""
    return seed_004_item(speculative={"algorithm": "DFLASH", "draft_model_path": "/srv/models/Qwen3.8-27B-DFlash2"},
                         stream={"ttft_s": 0.8}, decode={"decode_tok_s": 70.0},
                         log={"path": "shm", "accept_len": accept_len}, **changes)


SEED_000_BASELINE = {TTFT: 0.8, DECODE: 70.0, ACCEPT: 2.3}


def test_the_accept_length_is_a_serving_figure_held_to_the_baseline():
    verdict = judge(seed_000_item([2.2, 2.4, 2.3]), profile=NO_P2P, baseline=SEED_000_BASELINE)
    assert verdict["status"] == "pass", verdict
    assert verdict["metrics"] == {TTFT: 0.8, DECODE: 70.0, ACCEPT: 2.3}
    assert verdict["measured"]["qwen"]["accept_len"] == 2.3
    assert verdict["expected"]["qwen"]["accept_len"] == ">= 1.84 (0.80x baseline 2.30)"
    assert f"{ACCEPT} 2.30 vs baseline 2.30 (1.00x)" in verdict["why"]
    assert baselines.metrics_of([verdict]) == SEED_000_BASELINE
    # the draft stopped helping: about one token a step
    drafts_lost = judge(seed_000_item([1.1, 1.0, 1.05]), profile=NO_P2P, baseline=SEED_000_BASELINE)
    assert drafts_lost["status"] == "fail" and f"{ACCEPT} 1.05 vs baseline 2.30 (0.46x), below 0.80x" in (
        drafts_lost["why"])
    assert "draft model stopped helping" in drafts_lost["remedy"] and "seed 000" in drafts_lost["remedy"]
    assert drafts_lost["code"] == "RB-SERVING-ACCEPT-LEN-BASELINE"
    # the low end of the seed's own range against its middle: 0.91x, a warning at the default tolerance
    low = judge(seed_000_item([2.1]), profile=NO_P2P, baseline=SEED_000_BASELINE)
    assert low["status"] == "warn" and f"{ACCEPT} 2.10 vs baseline 2.30 (0.91x), below 0.95x" in low["why"]


def test_a_speculative_profile_whose_log_shows_no_accept_length_is_not_measured():
    verdict = judge(seed_000_item([]), profile=NO_P2P, baseline=SEED_000_BASELINE)
    assert verdict["metrics"][ACCEPT] is None and f"{ACCEPT}: not measured" in verdict["why"]
    assert ACCEPT not in baselines.metrics_of([verdict])
    # a recorded item carries no profile: accept lengths in its log are enough
    recorded = seed_004_item(log={"accept_len": [2.99, 2.84]})
    assert judge(recorded, baseline={})["metrics"][ACCEPT] == 2.915
    # no speculative decoding: no such figure at all
    assert ACCEPT not in judge(seed_004_item(), baseline={})["metrics"]


def test_the_tolerance_is_data():
    slightly_slow = seed_004_item(stream={"ttft_s": 0.654 * 1.1})
    assert judge(slightly_slow, baseline=SEED_004_BASELINE)["status"] == "warn"
    assert judge(slightly_slow, baseline=SEED_004_BASELINE, tolerance={"warn_below": 0.85})["status"] == "pass"
    assert judge(slightly_slow, baseline=SEED_004_BASELINE,
                 tolerance={"fail_below": 0.95, "warn_below": 0.99})["status"] == "fail"


def test_every_profile_is_judged_and_the_worst_wins():
    fast = seed_004_item(name="fast", stream={"ttft_s": 0.8}, decode={"decode_tok_s": 70.0})  # seed 000
    broken = seed_004_item(name="broken", models={"ids": []})
    verdict = judge(fast, broken)
    assert verdict["status"] == "fail" and set(verdict["measured"]) == {"fast", "broken"}
    assert "broken: /v1/models lists nothing" in verdict["why"]
    assert verdict["metrics"][metric_names("fast")[1]] == 70.0


def _serve_errors(*raws):
    """The host model's serve_errors of rigbook_serve RAWS (the items it could not read)."""
    return host_model.build({"rigbook_serve": list(raws)})["serve_errors"]


def test_no_profile_skips_and_a_profile_the_model_could_not_read_fails():
    assert judge_serving({"profiles": [], "error": None}, P2P)["status"] == "skip"
    assert judge_serving({"profiles": [], "error": None}, P2P)["code"] == "RB-SERVING-SKIP"
    bad = serving.collect_serving("/", [], errors=_serve_errors({"name": "Qwen 27B"}))
    verdict = judge_serving(bad, P2P)
    assert verdict["status"] == "fail" and "rigbook_serve[0].name: 'Qwen 27B' is not a profile name" in verdict["why"]
    assert verdict["code"] == "RB-SERVING-BAD-PROFILES"
    assert "rigbook_serve[0].port: 70000 is not a port number" in serving.collect_serving(
        "/", [], errors=_serve_errors({"name": "a", "port": 70000}))["error"]


def test_baseline_record_picks_up_the_serving_figures():
    verdict = judge(seed_004_item(), baseline={})
    assert baselines.metrics_of([verdict]) == {TTFT: 0.654, DECODE: 44.04}
    assert baselines.versions_of([verdict]) == {"sglang": "0.5.18"}


# ------------------------------------------------------------------ the collector against a tiny engine


class Engine:
    """What the in-test engine does: SSE chunks of TOKENS_PER_CHUNK tokens at RATE tok/s after TTFT seconds;
    /health_generate answers 503 to the first NOT_READY polls."""

    def __init__(self, rate=400.0, tokens_per_chunk=3, ttft=0.05, key=None, not_ready=0, models=("standin",)):
        self.rate, self.tokens_per_chunk, self.ttft, self.key = rate, tokens_per_chunk, ttft, key
        self.not_ready, self.models, self.requests = not_ready, list(models), []


def _handler(engine):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def _json(self, status, data):
            body = json.dumps(data).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _authorized(self):
            return not engine.key or self.headers.get("Authorization") == "Bearer " + engine.key

        def do_GET(self):
            engine.requests.append((time.monotonic(), self.path, self.headers.get("Authorization")))
            if self.path == "/health_generate":
                polls = sum(1 for _, path, _ in engine.requests if path == self.path)
                self._json(503 if polls <= engine.not_ready else 200, {})
            elif not self._authorized():
                self._json(401, {"error": "unauthorized"})
            elif self.path == "/v1/models":
                self._json(200, {"object": "list", "data": [{"id": m, "max_model_len": 32768} for m in engine.models]})
            else:
                self._json(404, {})

        def do_POST(self):
            engine.requests.append((time.monotonic(), self.path, self.headers.get("Authorization")))
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if not self._authorized():
                return self._json(401, {"error": "unauthorized"})
            tokens = body["max_tokens"]
            if body.get("stream"):
                return self._stream(tokens, body.get("stream_options", {}).get("include_usage"))
            time.sleep(engine.ttft + tokens / engine.rate)
            self._json(200, {"choices": [{"message": {"content": "w " * tokens}}],
                             "usage": {"prompt_tokens": 30, "completion_tokens": tokens,
                                       "total_tokens": 30 + tokens}})

        def _send(self, data):
            payload = ("data: %s\n\n" % (data if isinstance(data, str) else json.dumps(data))).encode()
            self.wfile.write(b"%x\r\n%s\r\n" % (len(payload), payload))
            self.wfile.flush()

        def _stream(self, tokens, include_usage):
            t0 = time.monotonic()
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            self._send({"choices": [{"delta": {"role": "assistant", "content": ""}}]})  # no token: not the TTFT
            sent, k = 0, 0
            while sent < tokens:
                n = min(engine.tokens_per_chunk, tokens - sent)
                time.sleep(max(0.0, t0 + engine.ttft + k * engine.tokens_per_chunk / engine.rate - time.monotonic()))
                self._send({"choices": [{"delta": {"content": "w " * n}}]})
                sent, k = sent + n, k + 1
            if include_usage:
                self._send({"choices": [], "usage": {"prompt_tokens": 30, "completion_tokens": tokens}})
            self._send("[DONE]")
            self.wfile.write(b"0\r\n\r\n")

    return Handler


@pytest.fixture
def engine_server():
    """start(engine) -> port of a ThreadingHTTPServer on 127.0.0.1 serving ENGINE."""
    servers = []

    def start(engine):
        server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(engine))
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return server.server_address[1]

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def _profile(port, **extra):
    """A serve profile as the host model holds it (host_model.build normalised it: rigbook_host.serve)."""
    model = host_model.build({"rigbook_serve": [dict({"name": "standin", "model_path": "/srv/models/standin",
                                                      "port": port, "startup_timeout_s": 10}, **extra)]})
    assert model["serve_errors"] == []
    (profile,) = model["serve"]
    profile["unit"] = None  # no systemd here: the unit parts are covered with a fake runner below
    return profile


def test_decode_from_usage_is_the_configured_rate_while_per_chunk_is_not(engine_server, tmp_path):
    """Three tokens a chunk (speculative decoding): usage tokens / (elapsed - TTFT) is the rate, a per-chunk timer
    reads a third of it. The key goes as a Bearer token and never into the evidence. The stand-in paces its tokens
    with sleeps, which run late on a loaded machine (373 of 400 tok/s measured with the lab tests beside it): the
    rate may read lower (never higher), so the band is wide below and still above what a per-chunk timer reads; the
    stream is a request of its own, timed apart from the decode one, so its rate is judged on its own terms."""
    engine = Engine(rate=400.0, tokens_per_chunk=3, ttft=0.05, key=KEY)
    port = engine_server(engine)
    key_file = tmp_path / "api-key"
    key_file.write_text(KEY + "\n")
    item = serving.measure_profile(_profile(port, api_key_file=str(key_file), served_model_name="standin"))
    assert item["ready"]["ready"] and item["models"]["ids"] == ["standin"]
    decode, stream = item["decode"]["decode_tok_s"], item["stream"]
    assert 400.0 * 0.6 < decode < 400.0 * 1.15, item  # a per-chunk timer would read 133
    # a per-chunk timer reads about a third (133 tok/s) when idle; under load late sleeps both slow the chunks (69
    # read beside CI's lab groups) and bunch them (155, 248): below the configured rate, chunks of 3
    assert 0 < stream["per_chunk_tok_s"] < 400.0 and stream["tokens_per_chunk"] == round(
        serving.STREAM_MAX_TOKENS / -(-serving.STREAM_MAX_TOKENS // 3), 2)  # chunks of 3, the last one shorter
    assert 0.05 <= stream["ttft_s"] < 0.5 and item["decode"]["completion_tokens"] == serving.DECODE_MAX_TOKENS
    assert all(auth == "Bearer " + KEY for _, path, auth in engine.requests if path.startswith("/v1/"))
    assert KEY not in json.dumps(item)
    verdict = judge(item, profile={"gpu": {"count": 1}})
    assert verdict["status"] == "unknown" and "no systemd unit given" in verdict["why"]  # measured, unit unchecked
    assert verdict["metrics"][metric_names("standin")[1]] == decode


def test_one_token_a_chunk_agrees_with_the_per_chunk_rate(engine_server):
    item = serving.measure_profile(_profile(engine_server(Engine(rate=300.0, tokens_per_chunk=1, ttft=0.02))))
    assert 300.0 * 0.6 < item["decode"]["decode_tok_s"] < 300.0 * 1.15  # sleeps run late under load, never early
    # two requests, each timed on its own: the same rate within what a loaded machine's sleeps allow
    assert item["stream"]["per_chunk_tok_s"] == pytest.approx(item["decode"]["decode_tok_s"], rel=0.3)


def test_without_the_key_the_api_checks_fail(engine_server):
    item = serving.measure_profile(_profile(engine_server(Engine(key=KEY)), served_model_name="standin"))
    assert item["ready"]["ready"]  # /health* needs no key (SGLang's middleware)
    assert item["models"]["ids"] is None and item["models"]["error"].startswith("HTTP 401")
    verdict = judge(item, profile={"gpu": {"count": 1}})
    assert verdict["status"] == "fail" and "GET /v1/models failed: HTTP 401" in verdict["why"]


def test_the_readiness_poll_never_hammers(engine_server):
    """Two 503s: three polls, at least MIN_POLL_GAP_S apart, the gap doubling."""
    engine = Engine(not_ready=2)
    ready = engine_api.wait_ready(engine_api.Endpoint("127.0.0.1", engine_server(engine)), 30)
    polls = [t for t, path, _ in engine.requests if path == "/health_generate"]
    assert ready["ready"] and ready["polls"] == 3 and len(polls) == 3
    slack = 0.05  # the client times the sends; the server sees them after connect and parse
    assert polls[1] - polls[0] >= engine_api.MIN_POLL_GAP_S - slack
    assert polls[2] - polls[1] >= 2 * engine_api.MIN_POLL_GAP_S - slack


def test_a_wildcard_bind_is_reached_over_loopback(engine_server):
    item = serving.measure_profile(_profile(engine_server(Engine(ttft=0.01, rate=2000.0)), bind="0.0.0.0"))
    assert item["address"].startswith("127.0.0.1:") and item["ready"]["ready"]


def _systemctl(n_restarts, active="active"):
    """A stand-in for facts/runner.run: `systemctl show` as systemd 252 prints it with --timestamp=unix."""
    def run(argv, timeout=None):
        assert argv[:3] == ["systemctl", "show", "rigbook-serve-standin.service"] and "--timestamp=unix" in argv
        return runner.Result(argv, 0, "Id=rigbook-serve-standin.service\nLoadState=loaded\n"
                             f"ActiveState={active}\nSubState=running\nNRestarts={n_restarts}\n"
                             "ExecMainStartTimestamp=@1764700000\nMainPID=4242\n", "", None, False)
    return run


def _journal(name):
    seen = []

    def read(unit, started_epoch):
        seen.append((unit, started_epoch))
        return (SGLANG_LOGS / name).read_text(), {"lines": 100, "error": None}
    read.seen = seen
    return read


def test_unit_journal_and_restarts_across_runs(engine_server, tmp_path):
    """The unit's state, its journal since the main process started (a real SGLang log with P2P/IPC) and
    NRestarts against the last run's, kept in the state file."""
    port = engine_server(Engine(ttft=0.01, rate=2000.0))
    profile = dict(_profile(port, tp_size=2), unit="rigbook-serve-standin.service")
    state = tmp_path / "serving-state.json"
    journal = _journal("nvidia_sglang8974_nccl_p2p_ipc.txt")
    first = serving.measure_profile(profile, str(state), True, _systemctl(0), journal)
    assert journal.seen == [("rigbook-serve-standin.service", 1764700000.0)]
    assert first["log"]["path"] == "p2p" and first["log"]["all_direct_p2p"] is True
    assert first["previous_restarts"] is None and json.loads(state.read_text())[profile["unit"]]["n_restarts"] == 0
    assert judge(first, profile={**P2P, "gpu": {"vendor": "nvidia", "count": 2}})["status"] == "pass"
    crashed = serving.measure_profile(profile, str(state), True, _systemctl(2), journal)
    verdict = judge(crashed)
    assert crashed["previous_restarts"] == 0 and verdict["status"] == "fail" and "crash-looping" in verdict["why"]
    checked = serving.measure_profile(profile, str(state), False, _systemctl(5), journal)  # check mode
    assert checked["previous_restarts"] == 2 and json.loads(state.read_text())[profile["unit"]]["n_restarts"] == 2


def test_the_key_is_withheld_from_a_listener_outside_the_engines_unit(engine_server, tmp_path):
    """Live, on loopback: the port is held by this test's process, not by the unit's control group (a local user
    who bound the engine's port while it loaded). The serving layer sends no request with the key."""
    engine = Engine(ttft=0.01, rate=2000.0, key=KEY)
    port = engine_server(engine)
    key_file = tmp_path / "api-key"
    key_file.write_text(KEY + "\n")
    profile = dict(_profile(port, api_key_file=str(key_file)), unit="rigbook-serve-standin.service")

    def run(argv, timeout=None):  # systemctl show: the unit runs, in a control group this process is not in
        assert argv[:3] == ["systemctl", "show", "rigbook-serve-standin.service"]
        return runner.Result(argv, 0, "Id=rigbook-serve-standin.service\nLoadState=loaded\nActiveState=active\n"
                             "SubState=running\nNRestarts=0\nExecMainStartTimestamp=@1764700000\nMainPID=4242\n"
                             "ControlGroup=/system.slice/rigbook-serve-standin.service\n", "", None, False)

    journal = _journal("nccl_shm_2gpu_tp2_vllm9920.txt")
    item = serving.measure_profile(profile, str(tmp_path / "s.json"), True, run, journal)
    assert item["ready"]["ready"] is False
    assert f"listens on 127.0.0.1:{port}" in item["ready"]["error"]
    assert item["ready"]["error"].endswith("the API key was not sent")
    assert not any(auth for _, _, auth in engine.requests)  # the key never left the box's reader
    assert KEY not in json.dumps(item)


def test_shm_in_the_units_journal_fails_through_the_real_parser(engine_server, tmp_path):
    port = engine_server(Engine(ttft=0.01, rate=2000.0))
    profile = dict(_profile(port, tp_size=2), unit="rigbook-serve-standin.service")
    item = serving.measure_profile(profile, str(tmp_path / "s.json"), True, _systemctl(0),
                                   _journal("nccl_shm_2gpu_tp2_vllm9920.txt"))
    verdict = judge(item)
    assert item["log"]["path"] == "shm" and verdict["status"] == "fail" and "seed 004" in verdict["why"]


def test_the_accept_length_of_a_real_eagle3_log_reaches_the_baseline(engine_server, tmp_path):
    """A real SGLang log with EAGLE3 (accept len 2.17, 1.95, 1.80, 2.05, 1.80) read from the unit's journal."""
    port = engine_server(Engine(ttft=0.01, rate=2000.0))
    profile = dict(_profile(port, speculative={"algorithm": "EAGLE3", "draft_model_path": "/srv/models/draft"}),
                   unit="rigbook-serve-standin.service")
    item = serving.measure_profile(profile, str(tmp_path / "s.json"), True, _systemctl(0),
                                   _journal("cuda_eagle3_sglang11948_decode.txt"))
    assert item["log"]["accept_len"] == [2.17, 1.95, 1.80, 2.05, 1.80]
    accept_name = metric_names("standin")[2]
    verdict = judge(item, profile={"gpu": {"count": 1}}, baseline={accept_name: 2.5})
    assert verdict["metrics"][accept_name] == 1.954
    assert f"{accept_name} 1.95 vs baseline 2.50 (0.78x), below 0.80x" in verdict["why"] and (
        verdict["status"] == "fail")


def test_a_stopped_unit_is_not_polled(engine_server, tmp_path):
    engine = Engine()
    profile = dict(_profile(engine_server(engine)), unit="rigbook-serve-standin.service")
    item = serving.measure_profile(profile, str(tmp_path / "s.json"), True, _systemctl(0, "failed"),
                                   _journal("nvidia_sglang8974_nccl_p2p_ipc.txt"))
    assert engine.requests == [] and item["ready"]["error"] == "not polled: the unit is failed"


def test_unit_status_keeps_its_shape_and_falls_back_for_an_old_systemd():
    """systemd before 248 has no --timestamp: the second `systemctl show` prints the time as text (no epoch)."""
    calls = []

    def run(argv, timeout=None):
        calls.append(argv)
        if "--timestamp=unix" in argv:
            return runner.Result(argv, 1, "", "Unknown option", "systemctl exited 1: Unknown option", False)
        return runner.Result(argv, 0, "Id=u.service\nLoadState=loaded\nActiveState=active\nSubState=running\n"
                             "NRestarts=1\nExecMainStartTimestamp=Wed 2025-12-03 10:00:00 UTC\nMainPID=7\n", "",
                             None, False)

    state = serving.unit_status("u.service", run)
    assert len(calls) == 2 and state == {
        "id": "u.service", "load_state": "loaded", "active_state": "active", "sub_state": "running",
        "n_restarts": 1, "main_pid": 7, "started_at": "Wed 2025-12-03 10:00:00 UTC", "started_epoch": None,
        "available": True, "error": None}

    def missing(argv, timeout=None):
        return runner.Result(argv, None, "", "", "systemctl: No such file or directory", False)

    assert serving.unit_status("u.service", missing) == {"available": False,
                                                         "error": "systemctl: No such file or directory"}


def test_restart_counter_reset(tmp_path):
    path = str(tmp_path / "state.json")
    assert serving.restarts_seen(path, "u", 4) == (None, None)
    assert serving.restarts_seen(path, "u", 1) == (0, None)  # a manual start reset the counter: counts from 0
    Path(path).write_text("{not json")
    previous, error = serving.restarts_seen(path, "u", 1)
    assert previous is None and "not valid JSON" in error and json.loads(Path(path).read_text())["u"]["n_restarts"] == 1


def test_the_journal_is_bounded_to_its_head_and_tail(monkeypatch):
    """read_journal through facts/runner.run's LINES: a journal of 1000 lines (a stand-in for journalctl) is read
    as its first and last lines, counted whole."""
    monkeypatch.setattr(serving, "JOURNAL_HEAD_LINES", 5)
    monkeypatch.setattr(serving, "JOURNAL_TAIL_LINES", 3)
    real, seen = runner.run, []

    def journalctl(argv, **kwargs):
        seen.append((argv, kwargs["lines"]))
        return real([sys.executable, "-c", "for i in range(1000): print('line', i)"], **kwargs)

    monkeypatch.setattr(runner, "run", journalctl)
    text, info = serving.read_journal("u.service", 1764700000.5)
    lines = text.splitlines()
    assert seen == [(["journalctl", "-u", "u.service", "--since=@1764700000", "-o", "cat", "--no-pager"], (5, 3))]
    assert info["error"] is None and info["lines"] == 1000 and info["truncated"] and len(lines) == 9
    assert lines[:2] == ["line 0", "line 1"] and lines[5] == "[... 992 lines skipped ...]" and lines[-1] == "line 999"
    monkeypatch.setattr(runner, "run", lambda argv, **kwargs: real(["/nonexistent/journalctl"], **kwargs))
    text, info = serving.read_journal("u.service")
    assert text is None and info["lines"] == 0 and info["error"].startswith("/nonexistent/journalctl:")


# ------------------------------------------------------------------ a recorded tree


def _record(tree, item):
    commands = tree / "var" / "lib" / "rigbook" / "commands"
    commands.mkdir(parents=True, exist_ok=True)
    (commands / f"serving-{item['name']}.json").write_text(json.dumps(item))


def test_a_recorded_tree_is_judged_without_any_request(tmp_path):
    """serving-NAME.json is the whole measured part: returned instead of measuring (port 9 is never asked)."""
    tree = tmp_path / "tree"
    _record(tree, seed_004_item())
    ctx = climb.Context(str(tree), P2P, SEED_004_BASELINE, options={"serve": [{"name": "qwen", "port": 9}]})
    verdicts, evidence = climb.climb(registry.of_phase(registry.SERVING), ctx)
    assert [v["layer"] for v in verdicts] == ["serving"] and verdicts[0]["status"] == "pass", verdicts
    assert evidence["serving"]["profiles"][0]["source"] == "recorded var/lib/rigbook/commands/serving-qwen.json"
    _record(tree, seed_004_item(log={"path": "shm"}))
    (verdict,), _ = climb.climb(["serving"], climb.Context(str(tree), P2P))  # no serve option: what is recorded
    assert verdict["status"] == "fail" and "SHM" in verdict["why"]
    (tree / "var/lib/rigbook/commands/serving-qwen.json").write_text("{garbled")
    (verdict,), _ = climb.climb(["serving"], climb.Context(str(tree), P2P))
    assert verdict["status"] == "unknown" and "garbled recording" in verdict["why"]


def test_replay_shows_the_serving_layer(tmp_path, capsys, fixtures):
    """The real H200 capture plus a recorded serving part: replayed as the tenth layer; none recorded and no serve
    profile, no serving layer (as a live verify shows none)."""
    import shutil

    h200 = {"gpu": {"vendor": "nvidia", "count": 1, "vram_gib": 141, "pcie": {"gen": 5, "width": 16}},
            "pins": {"nvidia_driver": {"version": "580.159.04"}}}
    shutil.copytree(fixtures / "evidence" / "h200-vm", tmp_path / "h1" / "tree", symlinks=True)
    (tmp_path / "h1" / "ladder_view.json").write_text(json.dumps(h200))
    assert snapshots.replay(str(tmp_path), as_json=True) == 0
    ladder = json.loads(capsys.readouterr().out)["hosts"]["h1"]["ladder"]
    assert "serving" not in [v["layer"] for v in ladder] and len(ladder) == 9
    _record(tmp_path / "h1" / "tree", seed_004_item(tp_size=1, models={"ids": ["other"]}))
    assert snapshots.replay(str(tmp_path), as_json=True) == 1
    ladder = json.loads(capsys.readouterr().out)["hosts"]["h1"]["ladder"]
    assert ladder[-1]["layer"] == "serving" and ladder[-1]["status"] == "fail"
    assert "lists other, not qwen3.8-27b" in ladder[-1]["why"]


# ------------------------------------------------------------------ the module, through real Ansible


def test_the_ladder_module_runs_the_serving_phase(tmp_path):
    """phase: serving on a recorded tree, the serve profiles read from the host model (rigbook_host.serve); a
    rigbook_serve item the model could not read fails the task with its key path, no traceback."""

    tree = tmp_path / "tree"
    _record(tree, seed_004_item())
    serve = [{"name": "qwen", "model_path": "/srv/models/q", "served_model_name": "qwen3.8-27b", "port": 30000}]
    ladder = "rigbook.homelab.ladder"
    tasks = [
        {ladder: {"phase": "serving", "root": str(tree),
                  "host": host_model.build({"rigbook_gpu": P2P["gpu"], "rigbook_p2p": P2P["p2p"],
                                            "rigbook_serve": serve}),
                  "baseline": SEED_004_BASELINE}, "register": "served"},
        {"debug": {"msg": "SERVED {{ served.ladder[0].status }} {{ served.ladder[0].metrics['" + DECODE + "'] }}"}},
        {ladder: {"phase": "serving", "root": str(tree),
                  "host": host_model.build({"rigbook_serve": [{"name": "q", "port": "x"}]})},
         "register": "bad", "ignore_errors": True},
        {"debug": {"msg": "BAD {{ bad.msg }}"}},
    ]
    proc = local_playbook(tmp_path, tasks)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "SERVED pass 44.04" in out
    assert "BAD serving: fail: rigbook_serve[0].port: 'x' is not a port number" in out
    assert "Traceback" not in out


def test_a_journal_that_shows_the_key_leaves_no_trace_of_it_in_the_evidence(engine_server, tmp_path):
    """An unpatched SGLang logs api_key in its server_args line, and an error line can carry a command line: the
    evidence says a key was logged (api_key_logged) and holds neither that key nor the profile's."""
    port = engine_server(Engine(ttft=0.01, rate=2000.0, key=KEY))
    key_file = tmp_path / "api-key"
    key_file.write_text(KEY + "\n")
    profile = dict(_profile(port, api_key_file=str(key_file)), unit="rigbook-serve-standin.service")
    text = (f"[2026-01-01 10:00:00] server_args=ServerArgs(model_path='/m', api_key='{KEY}', "
            "admin_api_key='adm-other', port=30000)\n"
            "[2026-01-01 10:00:01] RuntimeError: bad launch: python -m sglang.launch_server --api-key other-key\n")

    def journal(unit, started_epoch):
        return text, {"lines": 2, "error": None}

    item = serving.measure_profile(profile, str(tmp_path / "s.json"), True, _systemctl(0), journal)
    assert item["log"]["api_key_logged"] is True and item["log"]["errors"]
    dumped = json.dumps(item)
    for secret in (KEY, "adm-other", "other-key"):
        assert secret not in dumped
    assert "--api-key <redacted>" in dumped
