# -*- coding: utf-8 -*-
# Copyright: rigbook developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The body of the runtime-layer modules (peer_access, p2p_bandwidth): probe, judge, exit; and of
runtime_ladder, which climbs layers 6-9 in one module run (one probe for 6-7, one benchmark for 8-9).

The probe is chosen by rigbook_gpu.vendor (CUDA driver API or HIP, through ctypes).
"""

from __future__ import annotations

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.rigbook.homelab.plugins.module_utils.ansible_glue import (
    finish,
    finish_ladder,
    selected_layers,
)
from ansible_collections.rigbook.homelab.plugins.module_utils.collect import collective_bench as collectives
from ansible_collections.rigbook.homelab.plugins.module_utils.collect import static_evidence as evidence_mod
from ansible_collections.rigbook.homelab.plugins.module_utils.judges.collective_layers import (
    judge_collectives,
    judge_nccl_transport,
)
from ansible_collections.rigbook.homelab.plugins.module_utils.judges.peer_layers import (
    judge_p2p_bandwidth,
    judge_peer_access,
)
from ansible_collections.rigbook.homelab.plugins.module_utils.probe import cuda as cuda_probe
from ansible_collections.rigbook.homelab.plugins.module_utils.probe import hip as hip_probe

RUNTIME_SPEC = dict(
    root=dict(type="path", default="/"),
    profile=dict(type="dict", default={}),
    baseline=dict(type="dict", default={}),
    tolerance=dict(type="dict", default={}),
    size_bytes=dict(type="int", default=cuda_probe.DEFAULT_SIZE),
    reps=dict(type="int", default=cuda_probe.DEFAULT_REPS),
    deadline_s=dict(type="float"),
    ipc_legacy=dict(type="bool"),
    evidence=dict(type="dict"),
)


def ipc_legacy_of(profile):
    """HSA_ENABLE_IPC_MODE_LEGACY pinned in rigbook_pins.rocm.hsa_env, as a bool (None when not pinned)."""
    env = (((profile.get("pins") or {}).get("rocm") or {}).get("hsa_env")) or {}
    value = env.get(hip_probe.IPC_ENV)
    return None if value is None else str(value).strip() not in ("0", "false", "False", "")


def collect_probe(root, profile, size_bytes=cuda_probe.DEFAULT_SIZE, reps=cuda_probe.DEFAULT_REPS,
                  deadline_s=None, ipc_legacy=None):
    """The runtime evidence: the vendor's probe (both tried when the vendor is unknown), live or recorded."""
    vendor = (profile.get("gpu") or {}).get("vendor")
    vendors = [vendor] if vendor in evidence_mod.PROBES else ["nvidia", "amd"]
    if ipc_legacy is None:
        ipc_legacy = ipc_legacy_of(profile)
    live = {
        "nvidia": lambda: cuda_probe.probe_isolated(
            size_bytes=size_bytes, reps=reps, deadline_s=deadline_s or cuda_probe.DEFAULT_DEADLINE_S),
        "amd": lambda: hip_probe.probe_isolated(
            size_bytes=size_bytes, reps=reps, deadline_s=deadline_s or hip_probe.DEFAULT_DEADLINE_S,
            ipc_legacy=ipc_legacy),
    }
    tried = []
    for name in vendors:
        data, source = evidence_mod.probe_output(root, evidence_mod.PROBES[name], live[name])
        data = dict(data, source=source)
        if data.get("available"):
            return data
        tried.append(data)
    if len(tried) > 1:
        return dict(tried[0], error="; ".join("%s: %s" % (t.get("api"), t.get("error")) for t in tried))
    return tried[0]


def run_runtime_layer(layer, judge):
    """A runtime layer's module: JUDGE(evidence, profile, params) -> verdict over the probe's evidence.

    The probe only reads and measures (device memory it allocates is freed), so check mode runs it too.
    params["evidence"] judges a probe result already taken (e.g. registered from peer_access) instead.
    """
    module = AnsibleModule(argument_spec=RUNTIME_SPEC, supports_check_mode=True)
    params = module.params
    profile = params["profile"] or {}
    evidence = params["evidence"]
    if not evidence:
        evidence = collect_probe(params["root"], profile, params["size_bytes"], params["reps"],
                                 params["deadline_s"], params["ipc_legacy"])
    finish(module, judge(evidence, profile, params), evidence)


RUNTIME_LAYERS = ("peer_access", "p2p_bandwidth", "collectives", "nccl_transport")
RUNTIME_LADDER_SPEC = dict(
    RUNTIME_SPEC,
    layers=dict(type="list", elements="str", default=list(RUNTIME_LAYERS)),
    python=dict(type="path"),
    nccl_tests_dir=dict(type="path"),
    collective_bytes=dict(type="int", default=256 << 20),
    iters=dict(type="int", default=10),
    env=dict(type="dict", default={}),
    log=dict(type="str"),
    unit=dict(type="str"),
)


def runtime_params(**given):
    """The module's parameters as AnsibleModule hands them over: RUNTIME_LADDER_SPEC's defaults, then GIVEN."""
    params = dict((name, spec.get("default")) for name, spec in RUNTIME_LADDER_SPEC.items())
    params.update(given)
    return params


def climb_runtime(params, layers, stop_at_fail=True):
    """(verdicts, evidence) of LAYERS in ladder order, stopping after the first fail (unless not STOP_AT_FAIL:
    a replay shows every layer). The probe runs once for peer_access and p2p_bandwidth, the collectives
    benchmark once for collectives and nccl_transport."""
    profile = params["profile"] or {}
    tolerance = dict(profile.get("tolerance") or {}, **(params["tolerance"] or {}))
    env = {k: str(v) for k, v in (params["env"] or {}).items()}
    evidence, verdicts = {}, []
    if "peer_access" in layers or "p2p_bandwidth" in layers:
        evidence["probe"] = params["evidence"] or collect_probe(
            params["root"], profile, params["size_bytes"], params["reps"], params["deadline_s"], params["ipc_legacy"])
    for layer in layers:
        if layer == "peer_access":
            verdict = judge_peer_access(evidence["probe"], profile)
        elif layer == "p2p_bandwidth":
            verdict = judge_p2p_bandwidth(evidence["probe"], profile, params["baseline"], tolerance)
        elif layer == "collectives":
            gpus = (profile.get("gpu") or {}).get("count") or 2
            evidence["collectives"] = collectives.collect_collectives(
                params["root"], params["python"], params["nccl_tests_dir"], params["collective_bytes"],
                params["iters"], gpus=gpus, env=env)
            verdict = judge_collectives(evidence["collectives"], profile, params["baseline"], tolerance or None)
        else:
            log = params["log"] or (evidence.get("collectives") or {}).get("nccl_log")
            text, source = collectives.collect_nccl_log(params["root"], log, params["unit"], params["python"],
                                                        env=env)
            evidence["nccl_transport"] = collectives.transport_evidence(text, source)
            verdict = judge_nccl_transport(evidence["nccl_transport"], profile)
        verdicts.append(verdict)
        if stop_at_fail and verdict["status"] == "fail":
            break
    return verdicts, evidence


def run_runtime_ladder():
    module = AnsibleModule(argument_spec=RUNTIME_LADDER_SPEC, supports_check_mode=True)
    layers = selected_layers(module, RUNTIME_LAYERS, "runtime")
    verdicts, evidence = climb_runtime(module.params, layers)
    finish_ladder(module, verdicts, evidence)
