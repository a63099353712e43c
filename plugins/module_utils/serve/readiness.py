# -*- coding: utf-8 -*-
# Copyright: rigbook developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Waiting for a serve unit's engine to be ready after a (re)start (standard library only).

SGLang has no sd_notify: the port opens only after the weights, the KV pool and graph capture, then /health_generate
answers 503 until the warm-up generation is done (sgl-project/sglang python/sglang/srt/entrypoints/http_server.py:
launch_server, _wait_and_warmup, health_generate). Ready here means /health_generate answered 200 and then one real
chat completion returned tokens (a health endpoint alone can answer 200 after the scheduler died:
sgl-project/sglang#6624).
The HTTP side is the one the serving layer uses too (serve/engine_api.py): the same polling, timeouts and requests.
The API key goes only to the profile's unit: before each request the socket listening on its address must be held by
the unit's control group alone (engine_api.key_verdict, the unit's ControlGroup from UNIT_STATE); else the key is
withheld and the wait ends at once with why (a local user who bound the port while the engine loaded gets nothing).
"""

from __future__ import annotations

from ansible_collections.rigbook.homelab.plugins.module_utils.serve import engine_api

CANARY_TOKENS = 8
RUNNING = ("active", "activating", "reloading")


def wait(profile, api_key, unit_state, root="/"):
    """Poll until ready or the profile's startup_timeout_s. PROFILE is one of the host model's serve profiles
    (rigbook_host.serve: unit, bind, port, startup_timeout_s, served_model_name filled in by host_model.build).
    UNIT_STATE() returns the unit's systemctl properties (ActiveState, Result, ControlGroup): a unit that stopped ends
    the wait at once. ROOT: where the listening sockets are read (the evidence root, "/" live).
    Returns {ready, seconds, why}."""
    endpoint = engine_api.Endpoint(profile["bind"], profile["port"], api_key, unit=profile["unit"],
                                   control_group=lambda: unit_state().get("ControlGroup"), root=root)
    ready = engine_api.wait_ready(endpoint, profile["startup_timeout_s"],
                                  lambda: unit_state().get("ActiveState") in RUNNING)
    if not ready["ready"]:
        state = unit_state()
        if ready.get("withheld"):
            why = ready["error"]
        elif ready.get("error"):
            why = "the unit is %s (%s) after %.0f s" % (state.get("ActiveState"), state.get("Result"),
                                                        ready["waited_s"])
        else:
            why = "not ready after %.0f s (startup_timeout_s); last answer: %s" % (ready["waited_s"], ready["last"])
        return dict(ready=False, seconds=ready["waited_s"], why=why)
    model = profile.get("served_model_name") or profile.get("model_path")
    status, data, error = engine_api.http_json(endpoint, "POST", "/v1/chat/completions",
                                               engine_api.chat_body(model, CANARY_TOKENS, False))
    if endpoint.withheld:
        return dict(ready=False, seconds=ready["waited_s"], why=endpoint.withheld)
    usage = (data or {}).get("usage") if isinstance(data, dict) else None
    tokens = usage.get("completion_tokens") if isinstance(usage, dict) else None
    if status != 200 or not tokens:
        return dict(ready=False, seconds=ready["waited_s"],
                    why="/health_generate answered 200 but a chat completion %s" % (
                        "returned no tokens" if status == 200 else "failed: %s" % error))
    return dict(ready=True, seconds=ready["waited_s"], why=None)
