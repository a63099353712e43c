# -*- coding: utf-8 -*-
# Copyright: rigbook developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Pure judge of the serving layer (layer 10): each serve profile's unit, readiness, API and figures.

data is the `serving` evidence part (collect/serving_evidence.py): {"profiles": [one dict per serve profile],
"error": str|None}. ladder_view is {"gpu": rigbook_gpu, "p2p": rigbook_p2p, "pins": ...}. No I/O here.

A serve profile fails when its unit is not active or restarted more often than at the last run (crash-looping), is
not ready within its timeout, /v1/models lacks the served name, a completion returns no token, the engine's
log shows errors or a transport other than the expected one (P2P expected: `via P2P` and isAllDirectP2p 1,
seed 004's rule), the engine process has another NCCL/RCCL library mapped than the one the collectives tests load
(data["verified_library"]), or TTFT rises / decode tok/s / the speculative accept length falls against the
baseline beyond the tolerance (the same fail_below / warn_below as every layer; for TTFT, lower is better, so it
fails above baseline / fail_below).
"""

from __future__ import annotations

from ansible_collections.rigbook.homelab.plugins.module_utils.facts import libraries
from ansible_collections.rigbook.homelab.plugins.module_utils.judges import baseline_compare as baseline_mod
from ansible_collections.rigbook.homelab.plugins.module_utils.judges import expectations
from ansible_collections.rigbook.homelab.plugins.module_utils.judges.verdict import Findings, make

LAYER = "serving"
MAX_ERRORS_SHOWN = 3
SEED_004_RULE = ("seed 004's rule: SGLang's log must show `isAllDirectP2p 1` and `via P2P/IPC`, not SHM "
                 "(SHM cost it 23-27% TTFT and 31-37% long-context prefill)")

_UNIT = "the serve unit's systemd state (its ActiveState, SubState and NRestarts, read by facts/systemd)"
_LOG = "the engine's journal (`journalctl -u UNIT -b`), parsed by parse/sglang_log.py"
_FIGURE = ("one streaming and one plain chat completion of the serve profile's prompt; the figure against the "
           "host's baseline (`provision baseline record`) with the layer's fail_below / warn_below")
# The serving layer's codes (ladder/codes.py gathers them; docs/codes.md is generated from them). A code names one
# finding and never changes meaning; the ladder's serve-unit hold (ladder/serving_hold.py) and the health timer
# (ladder/health.py) give theirs from here too.
CODES = {
    "RB-SERVING-BAD-PROFILES": {
        "layer": LAYER, "title": "A serve profile could not be read",
        "cause": "A rigbook_serve entry the serving phase was given is not a valid serve profile (a bad name, port "
                 "or option): nothing of it was checked.",
        "measured": "The host model's reading of rigbook_serve (serve/profile.py) before the serving checks.",
        "action": "Fix the serve profile the why names (rigbook_serve[N].FIELD) and run `provision verify --tags "
                  "serving` again."},
    "RB-SERVING-UNIT-INACTIVE": {
        "layer": LAYER, "title": "The serve unit is not active",
        "cause": "The engine's systemd unit has stopped or failed (OOM in warm-up, a missing model path, a crashed "
                 "scheduler).",
        "measured": _UNIT + ": ActiveState is not active.",
        "action": "Read `journalctl -u UNIT -b` for why the engine stopped, fix the serve profile, then re-run the "
                  "serve role."},
    "RB-SERVING-UNIT-RESTARTED": {
        "layer": LAYER, "title": "The serve unit restarted, with no earlier count to compare",
        "cause": "systemd restarted the engine since the unit started; with no count from an earlier run it cannot "
                 "tell a crash loop from one restart.",
        "measured": _UNIT + ": NRestarts above 0 and no count kept from an earlier run.",
        "action": "Read `journalctl -u UNIT -b` for why the engine restarted; the next run compares against this "
                  "count."},
    "RB-SERVING-CRASH-LOOP": {
        "layer": LAYER, "title": "The serve unit is crash-looping",
        "cause": "systemd restarted the engine more often than at the last run: it keeps dying and being started "
                 "again.",
        "measured": _UNIT + ": NRestarts above the count kept at the last run.",
        "action": "Read `journalctl -u UNIT -b` for why the engine dies, fix the serve profile, then re-run the "
                  "serve role."},
    "RB-SERVING-NOT-READY": {
        "layer": LAYER, "title": "The engine is not ready within its startup timeout",
        "cause": "The engine did not answer /health_generate with 200 within the serve profile's startup_timeout_s "
                 "(still loading weights or capturing CUDA graphs, or stuck).",
        "measured": "/health_generate polled on the profile's address until 200 or startup_timeout_s.",
        "action": "Read `journalctl -u UNIT -b` (\"The server is fired up and ready to roll!\" marks the end); raise "
                  "startup_timeout_s if it was still loading, else fix what the log shows and re-run the serve "
                  "role."},
    "RB-SERVING-MODELS-API": {
        "layer": LAYER, "title": "GET /v1/models failed",
        "cause": "The engine's OpenAI API did not list its models: a wrong API key, port or a crashed server.",
        "measured": "GET /v1/models on the profile's address with the unit's API key.",
        "action": "Check the API key file (the unit's --api-key) and the port the serve profile names."},
    "RB-SERVING-WRONG-MODEL": {
        "layer": LAYER, "title": "The engine serves another model name",
        "cause": "/v1/models does not list the serve profile's served_model_name: clients asking for it fail.",
        "measured": "GET /v1/models against the profile's served_model_name.",
        "action": "Set served_model_name in the serve profile (the unit's --served-model-name) and re-run the serve "
                  "role."},
    "RB-SERVING-STREAM-NO-TOKEN": {
        "layer": LAYER, "title": "A streaming chat completion returned no token",
        "cause": "The engine answered the streaming request without one non-empty delta (an error, a stalled "
                 "scheduler).",
        "measured": "One streaming POST /v1/chat/completions: the first non-empty delta (what TTFT times).",
        "action": "Send the same request by hand (curl /v1/chat/completions) and read `journalctl -u UNIT -b`."},
    "RB-SERVING-COMPLETION-NO-TOKENS": {
        "layer": LAYER, "title": "A chat completion returned no tokens",
        "cause": "The engine answered the plain request with usage.completion_tokens 0 or an error.",
        "measured": "One POST /v1/chat/completions: its usage.completion_tokens (what decode tok/s divides).",
        "action": "Send the same request by hand (curl /v1/chat/completions) and read `journalctl -u UNIT -b`."},
    "RB-SERVING-SHM-TRANSPORT": {
        "layer": LAYER, "title": "The engine's NCCL/RCCL runs over SHM where P2P is expected",
        "cause": "The engine's collectives fell back to host shared memory (seed 004: SHM cost 23-27% TTFT and "
                 "31-37% long-context prefill), e.g. after an upgrade or without the serve profile's NCCL env.",
        "measured": _LOG + ": its NCCL channel lines say `via SHM`, not `via P2P`.",
        "action": "Check the nccl_transport layer first (`provision verify --tags nccl_transport`), then the serve "
                  "profile's env (NCCL_P2P_LEVEL; on AMD HSA_ENABLE_IPC_MODE_LEGACY=0 and the patched RCCL); re-run "
                  "the serve role."},
    "RB-SERVING-NOT-ALL-DIRECT-P2P": {
        "layer": LAYER, "title": "The engine logs isAllDirectP2p 0",
        "cause": "SGLang's custom all-reduce found a GPU pair without direct P2P and falls back (seed 004's rule: "
                 "`isAllDirectP2p 1` is required).",
        "measured": _LOG + ": its `isAllDirectP2p` line.",
        "action": "Check the peer_access and nccl_transport layers, then the serve profile's env; re-run the serve "
                  "role."},
    "RB-SERVING-TRANSPORT-UNCONFIRMED": {
        "layer": LAYER, "title": "The engine's transport is unconfirmed",
        "cause": "The engine's log shows no NCCL channel lines, so whether it runs over P2P is not known.",
        "measured": _LOG + ": no `Channel ... via` line with tensor parallelism above 1.",
        "action": "Set NCCL_DEBUG=INFO in the serve profile's env and re-run the serve role."},
    "RB-SERVING-P2P-UNEXPECTED": {
        "layer": LAYER, "title": "The engine uses P2P although P2P is declared unavailable",
        "cause": "The host model declares P2P unavailable (rigbook_p2p.expected false) but the engine's NCCL runs "
                 "over P2P: the declaration is out of date, or the box changed.",
        "measured": _LOG + ": its NCCL channel lines say `via P2P`.",
        "action": "Check rigbook_p2p in the host's variables (and the peer layers' verdicts); correct the "
                  "declaration."},
    "RB-SERVING-ENGINE-ERRORS": {
        "layer": LAYER, "title": "The engine's log shows errors",
        "cause": "The engine logged error lines (out of memory, a scheduler exception, a NCCL error).",
        "measured": _LOG + ": its error and traceback lines.",
        "action": "Read `journalctl -u UNIT -b` around the lines shown, fix the serve profile, then re-run the serve "
                  "role."},
    "RB-SERVING-API-KEY-LOGGED": {
        "layer": LAYER, "title": "The API key appears in the engine's log",
        "cause": "The engine printed its server_args with the API key: anyone who reads the journal has it.",
        "measured": _LOG + ": the key in its server_args line.",
        "action": "Rotate the key (api_key_file) and keep the journal root-only."},
    "RB-ENGINE-NCCL-VERSION": {
        "layer": LAYER, "title": "The engine logged another NCCL version than the collectives layer measured",
        "cause": "The engine initialised a NCCL/RCCL of another version than the library the collectives tests "
                 "load and verified.",
        "measured": _LOG + ": its `NCCL version` line against the verified library's version.",
        "action": "Re-run the sglang and serve roles (`provision site.yml -i INV --tags serve`) and read "
                  "`journalctl -u UNIT -b | grep 'NCCL version'`."},
    "RB-ENGINE-LIBRARY-PRELOADED": {
        "layer": LAYER, "title": "The verified library is used only through LD_PRELOAD",
        "cause": "Torch's bundled NCCL/RCCL is mapped beside the verified library; LD_PRELOAD loads the verified "
                 "one first, so it is the copy used only while the preload stays.",
        "measured": "/proc/PID/maps of the engine process (with each library's sha256) against the library the "
                    "collectives tests load.",
        "action": "Re-run the sglang role (`provision site.yml -i INV --tags sglang,serve`): it makes the venv's "
                  "bundled copy resolve to the verified library, so the engine needs no preload."},
    "RB-ENGINE-LIBRARY": {
        "layer": LAYER, "title": "The engine is not on the verified NCCL/RCCL library",
        "cause": "The engine process has another NCCL/RCCL mapped than the one the collectives layer measured "
                 "(torch's wheel finds its bundled copy through a DT_RPATH searched before LD_LIBRARY_PATH; on seed "
                 "004's box that was stock RCCL and the SHM fallback while the collectives passed).",
        "measured": "/proc/PID/maps of the engine process (with each library's sha256) against the library the "
                    "collectives tests load.",
        "action": "Re-run the sglang role (`provision site.yml -i INV --tags sglang,serve`): it makes the venv's "
                  "bundled copy resolve to the verified library and restarts the engine; then `provision verify "
                  "--tags serving`."},
    "RB-SERVING-TTFT-BASELINE": {
        "layer": LAYER, "title": "Time to first token rose against the baseline",
        "cause": "The engine takes longer to the first token than when the baseline was recorded (a silent SHM "
                 "fallback after an upgrade, a changed serve profile or engine version).",
        "measured": _FIGURE + " (lower is better: it fails above baseline / fail_below).",
        "action": "Check the lower layers (nccl_transport, p2p_bandwidth), then what changed in the serve profile "
                  "or the engine version (`provision baseline show`)."},
    "RB-SERVING-DECODE-BASELINE": {
        "layer": LAYER, "title": "Decode tok/s fell against the baseline",
        "cause": "The engine decodes fewer tokens a second than when the baseline was recorded.",
        "measured": _FIGURE + ": usage.completion_tokens over the request's time.",
        "action": "Check the lower layers (nccl_transport, p2p_bandwidth), then what changed in the serve profile "
                  "or the engine version (`provision baseline show`)."},
    "RB-SERVING-ACCEPT-LEN-BASELINE": {
        "layer": LAYER, "title": "The speculative decoder's accept length fell against the baseline",
        "cause": "The draft model accepts fewer tokens a step than when the baseline was recorded (seed 000: "
                 "DFlash accepted 2.1-2.4 on natural text): the draft stopped helping.",
        "measured": "The mean of the `accept len` figures of the engine's Decode batch lines, against the "
                    "baseline.",
        "action": "Check that speculative.draft_model_path is the draft made for this model and quantisation, and "
                  "what changed in the serve profile or the engine version (`provision baseline show`)."},
    "RB-SERVING-NOT-READY-AGAIN": {
        "layer": LAYER, "title": "A serve unit stopped for the runtime layers is not ready again",
        "cause": "The ladder stopped the serve unit for the runtime layers and started it again after them, and it "
                 "did not become ready within its startup timeout (or did not start): the task fails.",
        "measured": "`systemctl start` then the serve role's readiness wait (/health_generate, one chat "
                    "completion) within startup_timeout_s; the unit's last journal lines.",
        "action": "Read the journal lines the failure shows (`journalctl -u UNIT -b`), fix what they name and "
                  "re-run the serve role."},
    "RB-SERVING-HOLD-BUSY": {
        "layer": LAYER, "title": "Another ladder run holds the serve units",
        "cause": "Another ladder run stopped this host's serve units for its runtime layers and has not started "
                 "them again yet: this run measures nothing.",
        "measured": "The hold's record on the host (/var/lib/rigbook/serving-hold.json): its holder still runs.",
        "action": "Run again once the other run has ended."},
    "RB-SERVING-HELD": {
        "layer": LAYER, "title": "The serving layer is not judged while a ladder run holds the units",
        "cause": "A ladder run stopped the serve units for its runtime layers on purpose; the health timer does "
                 "not judge an engine stopped so (a skip).",
        "measured": "The hold's record on the host (/var/lib/rigbook/serving-hold.json): its holder still runs.",
        "action": "Nothing: the next health run after the ladder run judges the serving layer again."},
}


def metric_names(name):
    """(TTFT metric, decode metric, accept length metric) of serve profile NAME, as the baseline records them."""
    return "serve_%s_ttft_s" % name, "serve_%s_decode_tok_s" % name, "serve_%s_accept_len" % name


def accept_len(item):
    """The speculative decoder's accept length of a serve profile's item: the mean of the `accept len` figures of
    the engine's Decode batch lines (parse/sglang_log.py; the collector keeps the last ones), rounded to 3 places;
    None when the log shows none. Seed 000: DFlash accepted 2.1-2.4 tokens a step on natural text (3.4-3.9 on a
    random-token benchmark: the figure depends on the content, so the baseline is the engine's own, same prompts)."""
    figures = [f for f in ((item.get("log") or {}).get("accept_len") or []) if isinstance(f, (int, float))
               and not isinstance(f, bool)]
    return round(sum(figures) / len(figures), 3) if figures else None


def _speculative(item):
    """Whether the profile decodes speculatively: its speculative mapping, or accept lengths in its log (a recorded
    item may carry no profile)."""
    return isinstance(item.get("speculative"), dict) or accept_len(item) is not None


def compare_lower_is_better(name, measured, baseline, tolerance):
    """(status, text) for a figure where less is better (TTFT): the ratio baseline / measured is held to the
    same fail_below / warn_below as a throughput, so 0.8 means "fails above 1.25x the baseline"."""
    if measured is None:
        return "unknown", "%s: not measured" % name
    if baseline is None:
        return "skip", "%s %.3f (no baseline recorded)" % (name, measured)
    if baseline <= 0 or measured <= 0:
        return "unknown", "%s: %.3f vs baseline %.3f is not comparable" % (name, measured, baseline)
    ratio = float(measured) / float(baseline)
    text = "%s %.3f vs baseline %.3f (%.2fx)" % (name, measured, baseline, ratio)
    if ratio > 1.0 / tolerance["fail_below"]:
        return "fail", text + ", above %.2fx" % (1.0 / tolerance["fail_below"])
    if ratio > 1.0 / tolerance["warn_below"]:
        return "warn", text + ", above %.2fx" % (1.0 / tolerance["warn_below"])
    return "pass", text


def _unit_remedy(item):
    unit = item.get("unit") or "the serve unit"
    return ("Read `journalctl -u %s -b` for why the engine stopped (OOM in warm-up: mem_fraction_static 0.88 on "
            "a box with a desktop, seed 000; a missing model path; a crashed scheduler), fix the serve profile, "
            "then re-run the serve role." % unit)


def _check_unit(item, found, measured):
    """True when the unit is active (the HTTP checks mean something); records restarts."""
    name, state = item["name"], item.get("unit_state")
    if state is None:
        found.gap("%s: no systemd unit given, its state is not checked" % name)
        return True
    if not state.get("available"):
        found.gap("%s: the state of %s is unknown (%s)" % (name, item.get("unit"), state.get("error")))
        return True
    measured["unit"] = "%s/%s" % (state.get("active_state"), state.get("sub_state"))
    measured["n_restarts"] = state.get("n_restarts")
    if state.get("active_state") != "active":
        found.problem("%s: unit %s is %s (%s), not active" % (name, item.get("unit"), state.get("active_state"),
                                                              state.get("sub_state")), _unit_remedy(item),
                      code="RB-SERVING-UNIT-INACTIVE")
        return False
    _check_restarts(item, state.get("n_restarts"), found)
    return True


def _check_restarts(item, n_restarts, found):
    """More automatic restarts than at the last run is a crash loop; restarts with no earlier count a note."""
    previous = item.get("previous_restarts")
    if n_restarts is None:
        return
    if previous is None and n_restarts > 0:
        found.note("%s: %s restarted %d time(s) since it was started (no count from an earlier run)"
                   % (item["name"], item.get("unit"), n_restarts), _unit_remedy(item), code="RB-SERVING-UNIT-RESTARTED")
    elif previous is not None and n_restarts > previous:
        found.problem("%s: %s is crash-looping: NRestarts %d, %d at the last run"
                      % (item["name"], item.get("unit"), n_restarts, previous), _unit_remedy(item),
                      code="RB-SERVING-CRASH-LOOP")


def _check_ready(item, found, measured):
    ready = item.get("ready") or {}
    measured["ready_s"] = ready.get("waited_s")
    if ready.get("ready"):
        return True
    found.problem("%s: not ready within %ss on %s (/health_generate: %s)"
                  % (item["name"], item.get("startup_timeout_s"), item.get("address"),
                     ready.get("last") or ready.get("error") or "no answer"),
                  "Loading weights and capturing CUDA graphs can take minutes on a cold page cache: read `journalctl "
                  "-u %s -b` (\"The server is fired up and ready to roll!\" marks the end); raise the serve profile's "
                  "startup_timeout_s if it was still loading, else fix what the log shows and re-run the serve role."
                  % (item.get("unit") or "the serve unit"), code="RB-SERVING-NOT-READY")
    return False


def _check_models(item, found, measured):
    models = item.get("models") or {}
    ids = models.get("ids")
    measured["served"] = ids
    want = item.get("served_model_name")
    if ids is None:
        remedy = "Check the API key file (the unit's --api-key) and the port the serve profile names."
        found.problem("%s: GET /v1/models failed: %s" % (item["name"], models.get("error")), remedy,
                      code="RB-SERVING-MODELS-API")
    elif want and want not in ids:
        found.problem("%s: /v1/models lists %s, not %s" % (item["name"], ", ".join(ids) or "nothing", want),
                      "The engine serves another name: set served_model_name in the serve profile (the unit's "
                      "--served-model-name) and re-run the serve role.", code="RB-SERVING-WRONG-MODEL")


def _check_tokens(item, found, measured):
    stream, decode = item.get("stream") or {}, item.get("decode") or {}
    measured["ttft_s"] = stream.get("ttft_s")
    measured["per_chunk_tok_s"] = stream.get("per_chunk_tok_s")
    measured["decode_tok_s"] = decode.get("decode_tok_s")
    if _speculative(item):
        measured["accept_len"] = accept_len(item)
    remedy = "Send the same request by hand (curl /v1/chat/completions) and read `journalctl -u %s -b`." % (
        item.get("unit") or "the serve unit")
    if stream.get("ttft_s") is None:
        found.problem("%s: the streaming chat completion returned no token (%s)"
                      % (item["name"], stream.get("error") or "no non-empty delta"), remedy,
                      code="RB-SERVING-STREAM-NO-TOKEN")
    if not decode.get("completion_tokens"):
        found.problem("%s: the chat completion returned no tokens (%s)"
                      % (item["name"], decode.get("error") or "usage.completion_tokens 0"), remedy,
                      code="RB-SERVING-COMPLETION-NO-TOKENS")


def _transport_remedy(item):
    return ("Check the nccl_transport layer first (`provision verify --tags nccl_transport`), then the serve "
            "profile's env: NCCL_P2P_LEVEL (PHB on X99), on AMD HSA_ENABLE_IPC_MODE_LEGACY=0 and the patched RCCL "
            "(rccl role); re-run the serve role and read `journalctl -u %s -b | grep -E 'isAllDirectP2p|via'`."
            % (item.get("unit") or "the serve unit"))


def _transport_matters(item, ladder_view):
    gpus = (ladder_view.get("gpu") or {}).get("count")
    return item.get("tp_size") != 1 and gpus != 1


def _check_transport(item, log, ladder_view, found):
    """P2P expected: the log must say P2P and not isAllDirectP2p 0; declared unavailable: SHM is the path."""
    name, path = item["name"], log.get("path")
    if not _transport_matters(item, ladder_view):
        return
    if expectations.p2p_expected(ladder_view):
        if path == "shm":
            found.problem("%s: the engine's NCCL log shows SHM, not P2P: %s" % (name, SEED_004_RULE),
                          _transport_remedy(item), code="RB-SERVING-SHM-TRANSPORT")
        elif path == "p2p" and log.get("all_direct_p2p") is False:
            found.problem("%s: the engine's NCCL log shows isAllDirectP2p 0: %s" % (name, SEED_004_RULE),
                          _transport_remedy(item), code="RB-SERVING-NOT-ALL-DIRECT-P2P")
        elif path is None and (item.get("tp_size") or 0) > 1:
            found.note("%s: the engine's log shows no NCCL channel lines, the transport is unconfirmed (set "
                       "NCCL_DEBUG=INFO in the serve profile's env)" % name, code="RB-SERVING-TRANSPORT-UNCONFIRMED")
    elif path == "p2p":
        found.note("%s: the engine uses P2P although %s" % (name, expectations.declared(ladder_view)),
                   code="RB-SERVING-P2P-UNEXPECTED")


def _check_log(item, ladder_view, found, measured):
    log = item.get("log")
    journal = item.get("journal") or {}
    if log is None:
        if item.get("unit"):
            found.gap("%s: the engine's log was not read (%s)" % (item["name"], journal.get("error") or "no journal"))
        return
    measured["path"] = log.get("path")
    measured["all_direct_p2p"] = log.get("all_direct_p2p")
    measured["version"] = log.get("version")
    _check_transport(item, log, ladder_view, found)
    errors = log.get("errors") or []
    if errors:
        shown = "; ".join(str(e).strip()[:200] for e in errors[:MAX_ERRORS_SHOWN])
        found.problem("%s: the engine's log shows %d error line(s): %s" % (item["name"], len(errors), shown),
                      _unit_remedy(item), code="RB-SERVING-ENGINE-ERRORS")
    if log.get("api_key_logged"):
        found.note("%s: the API key appears in the engine's log (server_args); anyone who reads the journal has it"
                   % item["name"], "Rotate the key (api_key_file) and keep the journal root-only.",
                   code="RB-SERVING-API-KEY-LOGGED")


ENGINE_LIBRARY_FACT = ("torch's wheel finds its bundled copy through a DT_RPATH, searched before LD_LIBRARY_PATH, "
                       "so a library directory in the environment does not replace it (measured on a real H200 "
                       "host: torch 2.11+cu130's libtorch_cuda.so has DT_RPATH $ORIGIN/../../nvidia/nccl/lib); on "
                       "seed 004's box that is stock RCCL and the SHM fallback while the collectives passed")


def _check_library(item, verified, ladder_view, found, measured, expected):
    """The NCCL/RCCL library the engine process has mapped (/proc/PID/maps, with sha256) against VERIFIED, the one
    the collectives tests load; the GPU runtime it mapped and the NCCL version it logged are reported."""
    mapped_libraries = item.get("engine_libraries")
    if mapped_libraries is None:
        return
    mapped = [lib for lib in mapped_libraries if libraries.is_collectives(lib.get("path"))]
    measured["collectives_library"] = ", ".join("%s (sha256 %s)" % (lib["path"], (lib.get("sha256") or "?")[:12])
                                                for lib in mapped) or None
    measured["gpu_runtime"] = ", ".join(lib["path"] for lib in mapped_libraries
                                        if not libraries.is_collectives(lib.get("path"))) or None
    measured["nccl_version_logged"] = (item.get("log") or {}).get("nccl_version")
    if not _transport_matters(item, ladder_view) or not verified:
        return
    if verified.get("error"):
        found.gap("%s: the library the collectives tests load is unknown (%s)" % (item["name"], verified["error"]))
        return
    expected["collectives_library"] = "%s (sha256 %s)" % (verified.get("path"), (verified.get("sha256") or "?")[:12])
    if not mapped:
        found.gap("%s: the engine process has no NCCL/RCCL library mapped (not initialised yet?), so which one it "
                  "runs is unconfirmed" % item["name"])
        return
    others = [lib for lib in mapped if lib.get("sha256") != verified.get("sha256")]
    # the first-loaded copy is the one used: LD_PRELOAD's, although torch opens its bundled copy by path beside it
    first = [lib for lib in mapped if lib.get("preloaded") and lib.get("sha256") == verified.get("sha256")]
    logged = measured["nccl_version_logged"]
    if verified.get("version"):
        expected["nccl_version_logged"] = verified["version"]
    if logged and verified.get("version") and logged != verified["version"]:
        found.problem("%s: the engine logged NCCL version %s at init, the collectives layer measured %s (%s)"
                      % (item["name"], logged, verified["version"], verified.get("path")),
                      "The engine runs another NCCL/RCCL than the one verified: re-run the sglang and serve roles "
                      "(`provision site.yml -i INV --tags serve`) and read `journalctl -u %s -b | grep 'NCCL "
                      "version'`." % (item.get("unit") or "the serve unit"), code="RB-ENGINE-NCCL-VERSION")
    if others and first:
        found.note("%s: %s mapped too, but LD_PRELOAD loads the verified library (%s) first and the first-loaded "
                   "copy is the one used (measured on a real H200 host: NCCL logged the preloaded copy's version "
                   "with torch's bundled copy mapped beside it); it holds only while the preload stays"
                   % (item["name"], ", ".join(lib["path"] for lib in others), first[0]["path"]),
                   "Re-run the sglang role (`provision site.yml -i INV --tags sglang,serve`): it makes the venv's "
                   "bundled copy resolve to the verified library, so the engine needs no preload.",
                   code="RB-ENGINE-LIBRARY-PRELOADED")
    elif others:
        found.problem("%s: the engine has %s mapped, not the library the collectives layer measured (%s): %s"
                      % (item["name"], ", ".join(lib["path"] for lib in others), verified.get("path"),
                         ENGINE_LIBRARY_FACT),
                      "Re-run the sglang role (`provision site.yml -i INV --tags sglang,serve`): it makes the venv's "
                      "bundled copy resolve to the verified library and restarts the engine; then `provision "
                      "verify --tags serving`.", code="RB-ENGINE-LIBRARY")


ACCEPT_REMEDY = ("The draft model stopped helping (seed 000: DFlash accepted 2.1-2.4 tokens a step on natural "
                 "text and doubled decode over no drafting): check that speculative.draft_model_path is the draft "
                 "made for this model and quantisation, and what changed in the serve profile (algorithm, "
                 "num_draft_tokens, draft_kv_cache_dtype) or the engine version (`provision baseline show`).")


def _check_figures(item, found, metrics, expected, baseline, tol, texts):
    """TTFT (lower is better), decode tok/s and, decoding speculatively, the accept length against the baseline;
    each recorded as a metric."""
    ttft_name, decode_name, accept_name = metric_names(item["name"])
    ttft = (item.get("stream") or {}).get("ttft_s")
    decode = (item.get("decode") or {}).get("decode_tok_s")
    metrics[ttft_name] = None if ttft is None else round(ttft, 4)
    metrics[decode_name] = None if decode is None else round(decode, 3)
    remedy = ("The engine got slower than its baseline: check the lower layers (nccl_transport: a silent SHM "
              "fallback after an upgrade; p2p_bandwidth), then what changed in the serve profile or the engine "
              "version (`provision baseline show`).")
    results = [(compare_lower_is_better(ttft_name, ttft, baseline.get(ttft_name), tol), remedy,
                "RB-SERVING-TTFT-BASELINE"),
               (baseline_mod.compare(decode_name, decode, baseline.get(decode_name), tol), remedy,
                "RB-SERVING-DECODE-BASELINE")]
    if baseline.get(ttft_name):
        expected["ttft_s"] = "<= %.3f (%.2fx baseline %.3f)" % (baseline[ttft_name] / tol["fail_below"],
                                                                1.0 / tol["fail_below"], baseline[ttft_name])
    if baseline.get(decode_name):
        expected["decode_tok_s"] = ">= %.2f (%.2fx baseline %.2f)" % (baseline[decode_name] * tol["fail_below"],
                                                                      tol["fail_below"], baseline[decode_name])
    if _speculative(item):
        accept = accept_len(item)
        metrics[accept_name] = accept
        results.append((baseline_mod.compare(accept_name, accept, baseline.get(accept_name), tol), ACCEPT_REMEDY,
                        "RB-SERVING-ACCEPT-LEN-BASELINE"))
        if baseline.get(accept_name):
            expected["accept_len"] = ">= %.2f (%.2fx baseline %.2f)" % (
                baseline[accept_name] * tol["fail_below"], tol["fail_below"], baseline[accept_name])
    for (status, text), why, code in results:
        texts.append("%s: %s" % (item["name"], text))
        if status == "fail":
            found.problem("%s: %s" % (item["name"], text), why, code=code)
        elif status == "warn":
            found.note("%s: %s" % (item["name"], text), why, code=code)


def _expected_of(item, ladder_view):
    expected = {"unit": "active, no more restarts than at the last run",
                "ready_within_s": item.get("startup_timeout_s")}
    if item.get("served_model_name"):
        expected["served"] = item["served_model_name"]
    if _transport_matters(item, ladder_view):
        expected["path"] = "p2p (isAllDirectP2p 1)" if expectations.p2p_expected(ladder_view) else "shm"
    return expected


def judge_profile(item, ladder_view, baseline, tol, found, texts, verified=None):
    """(measured, expected, metrics) of one serve profile; its findings go into FOUND, figure texts to TEXTS.
    VERIFIED: the NCCL/RCCL library the collectives tests load (None: not known here)."""
    measured = {"source": item.get("source"), "unit": None}
    expected = _expected_of(item, ladder_view)
    metrics = {}
    if item.get("available") is False:
        found.gap("%s: %s" % (item.get("name"), item.get("error") or "nothing measured"))
        return measured, expected, metrics
    if not _check_unit(item, found, measured) or not _check_ready(item, found, measured):
        _check_log(item, ladder_view, found, measured)
        return measured, expected, metrics
    _check_models(item, found, measured)
    figures = item.get("figures") != "skipped"  # the health timer sends no chat request: no figures to judge
    if figures:
        _check_tokens(item, found, measured)
    _check_log(item, ladder_view, found, measured)
    _check_library(item, verified, ladder_view, found, measured, expected)
    if figures:
        _check_figures(item, found, metrics, expected, baseline, tol, texts)
    return _figures_first(measured), expected, metrics


FIRST = ("ttft_s", "decode_tok_s", "accept_len", "per_chunk_tok_s", "path", "unit", "n_restarts")


def _figures_first(measured):
    """MEASURED with the figures a reader looks for first (a table cell shows the start)."""
    return dict([(k, measured[k]) for k in FIRST if k in measured] +
                [(k, v) for k, v in measured.items() if k not in FIRST])


def judge_serving(data, ladder_view, baseline_metrics=None, tolerance=None):
    """The serving layer's verdict over every serve profile; its metrics are each serve profile's TTFT, decode tok/s
    and, decoding speculatively, accept length (recorded by `provision baseline record`)."""
    ladder_view = ladder_view or {}
    data = data or {}
    if data.get("error"):
        return make(LAYER, "fail", measured=None, expected="a valid serve option", why=data["error"],
                    remedy="Fix the serve profiles (rigbook_serve) the serving phase was given.",
                    code="RB-SERVING-BAD-PROFILES")
    items = data.get("profiles") or []
    if not items:
        return make(LAYER, "skip", measured=None, expected=None,
                    why="no serve profile to check (the serving phase runs after the serve role, with rigbook_serve)")
    tol = expectations.tolerance(ladder_view, tolerance)
    baseline = baseline_metrics or {}
    found, texts = Findings(), []
    measured, expected, metrics = {}, {}, {}
    for item in items:
        name = item.get("name") or "?"
        measured[name], expected[name], item_metrics = judge_profile(item, ladder_view, baseline, tol, found, texts,
                                                                     data.get("verified_library"))
        metrics.update(item_metrics)
    ok_text = "; ".join(texts) or "every serve profile answers"
    if any(item.get("figures") == "skipped" for item in items):
        ok_text += " (TTFT and decode not measured: no chat request this run; `provision verify` measures them)"
    if texts and not any(baseline.get(name) for name in metrics):
        ok_text += "; record a baseline with `provision baseline record`"
    verdict = found.verdict(LAYER, measured, expected, ok_text=ok_text)
    if metrics:
        verdict["metrics"] = metrics
    return verdict
