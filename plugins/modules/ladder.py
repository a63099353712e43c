#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: rigbook developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

DOCUMENTATION = r"""
---
module: ladder
short_description: Climb the P2P ladder in one module run, lowest layer first, and fail at the first failing layer
description:
  - Judges the selected layers in ladder order and stops at the first layer whose verdict is C(fail); the layers
    above it are neither collected nor judged. The layers, lowest first -
    static C(firmware), C(pcie_link), C(dma_window), C(kernel_state), C(driver_state) (sysfs, procfs, kernel
    config, module paths, nvidia-smi);
    runtime C(peer_access), C(p2p_bandwidth) (one GPU probe through the CUDA driver API or HIP, by ctypes),
    C(collectives) (nccl-tests / rccl-tests or a bundled torch.distributed benchmark) and C(nccl_transport)
    (the NCCL INFO log of that run, or the serving unit's journal);
    serving C(serving) (each serve profile's systemd unit, readiness, C(/v1/models), TTFT and decode tok/s of one
    chat completion each, and the engine's journal), run after the serve role has started the engine.
  - Every layer is defined once, in the collection's layer registry (module_utils/ladder/registry.py).
  - The task passes the host model (O(host)) and what is its own (O(phase), O(layers), O(baseline), ...); the
    evidence root, the tolerance, the GPU environment file, the collectives tests and their Python, the benchmark's
    environment and the serve profiles are read from the model, an option given only overriding one of them.
  - Under a recorded O(root) the saved outputs are judged (lab hosts, replays) with the same code.
  - The task fails when a layer fails, with that layer's measured and expected values and remedy in the
    message; C(warn) and C(unknown) verdicts are reported as warnings.
  - Reads and measures (device memory the probe allocates is freed). The serving layer keeps the last seen
    C(NRestarts) per unit in O(serving_state) (not written in check mode).
  - Runtime phase on a box whose serve units run (the host model's C(rigbook-serve-*.service), nothing else) - the
    engine holds most of the GPUs' memory and serves traffic, so with O(serving=stop) the units that run are stopped
    for the runtime layers only and started again after them, also when a layer fails (C(systemctl reset-failed),
    C(systemctl start), then the serve role's readiness wait - C(/health_generate) until 200 and one chat completion
    within the profile's C(startup_timeout_s)); the result's C(notes) say it ("stopped U for the runtime layers,
    started again, ready in N s") and a unit not ready again fails the task with its last journal lines. The hold is
    kept in O(hold_state) while it lasts and SIGHUP is ignored meanwhile, so that a run cut short leaves nothing
    stopped for long (O(serving=resume), the next runtime phase).
  - What runs beside the layers - every unit in check mode or with O(serving=keep), an engine under no serve unit
    of this host (started by hand, or a unit of the owner's; never stopped) - is named, with the GPUs' memory in
    use, on C(p2p_bandwidth) and C(collectives) (their figures may be low); a layer that came out unknown because
    the GPU ran out of memory beside it is a C(skip) saying so and what to do, not a failure.
  - O(serving_when=changed) (site.yml's ladder) - on a box whose serve units run, the runtime layers are measured
    only when O(changes) names what changed under the engine in this run or O(layers) / O(run_tags) name a runtime
    layer; otherwise each is a C(skip) saying why, and nothing is stopped.
  - The runtime layers are watched for hardware errors (PCIe AER, NVIDIA Xid, amdgpu resets, IOMMU faults);
    O(error_state) says how, live and under a recorded O(root). Replays and in-process climbs keep no state.
version_added: "1.0.0"
author:
  - rigbook developers (!UNKNOWN)
options:
  host:
    description:
      - "The host model, C(rigbook_host) (plugins/module_utils/host_model.py; the preflight role sets it). The judges
        read its GPUs, P2P expectation, pins, tolerance and the layers it expects measured; the module also reads
        its C(evidence_root), C(gpu_env_file), C(collectives_tests_dir), C(verify.collectives_python) and C(serve)
        (the serve profiles, each with its unit, bind, port and timeouts filled in)."
      - Serving phase - each of the model's serve profiles is checked; under a recorded O(root),
        C(var/lib/rigbook/commands/serving-NAME.json) holds a serve profile's measured part and is judged instead,
        and with no serve profile in the model there every recorded one is judged.
    type: dict
    default: {}
  root:
    description:
      - Evidence root; V(/) on a real box, a recorded tree on a lab host or in a replay (docs/evidence.md).
      - Omitted - the host model's C(evidence_root) (V(/) without a model).
    type: path
  phase:
    description:
      - V(static) climbs layers 1-5, V(runtime) layers 6-9, V(serving) layer 10, V(all) the whole ladder.
      - The p2p_verify role runs each phase as its own task, so a failure names the part of the ladder; the
        serving phase only where C(p2p_verify_phases) names it (after the serve role).
    type: str
    choices: [static, runtime, serving, all]
    default: all
  layers:
    description:
      - The layers to judge (layer names or tags), judged in ladder order whatever order they are given in; those
        of the other phase are left to it. A name that is no layer fails the task. Omitted - every layer of
        the phase, or those O(run_tags) names.
    type: list
    elements: str
  run_tags:
    description:
      - Ansible's run tags (V(ansible_run_tags)); the layers they name are judged, all when they name none.
        Tags that are no layer's are ignored. O(layers) wins when given.
    type: list
    elements: str
    default: []
  baseline:
    description: Recorded metrics of a known-good run (C(peer_gbs_0_1), C(sendrecv_busbw_gbs), ...).
    type: dict
    default: {}
  tolerance:
    description: C({fail_below, warn_below}) as fractions of the baseline, over the host model's tolerance (the
      defaults merged with C(rigbook_tolerance)); omitted - the model's alone.
    type: dict
    default: {}
  probe_bytes:
    description: Runtime phase. Bytes per probe copy.
    type: int
    default: 67108864
  reps:
    description: Runtime phase. Timed probe copies per figure.
    type: int
    default: 10
  deadline_s:
    description: Runtime phase. Soft time budget of the probe (10 s for CUDA, 20 s for HIP when omitted); it is killed 30 s later.
    type: float
  ipc_legacy:
    description:
      - Runtime phase, AMD only. HSA_ENABLE_IPC_MODE_LEGACY for the probe and its IPC child (true = C(1), false = C(0), DMA-BUF).
      - Defaults to the value pinned in C(pins.rocm.hsa_env), else the environment's.
    type: bool
  probe_result:
    description: Runtime phase. A probe result already taken; judged instead of probing again.
    type: dict
  python:
    description:
      - Runtime phase. Python with PyTorch (a venv with torch, e.g. the SGLang one - the role variable
        p2p_verify_python) for the bundled collectives benchmark.
      - Omitted - C(bin/python) of the host model's C(verify.collectives_python) (C(rigbook_verify.collectives_python)),
        none without it.
    type: path
  nccl_tests_dir:
    description: Runtime phase. Directory holding all_reduce_perf and sendrecv_perf, and all_gather_perf and
      reduce_scatter_perf when built (preferred over the bundled benchmark).
      When both are there they run whatever O(root) is, with the evidence root in RIGBOOK_EVIDENCE_ROOT and
      NCCL_DEBUG=INFO; the nccl_transport layer then reads that run's log (a lab host runs its built stand-ins).
      Serving phase too, with O(env_file) - the NCCL/RCCL library those tests load (ldd) is the one each engine
      must have mapped. Omitted - the host model's C(collectives_tests_dir) (the rccl or nccl_tests role's).
    type: path
  collective_bytes:
    description: Runtime phase. Message size of the collectives benchmark.
    type: int
    default: 268435456
  iters:
    description: Runtime phase. Timed iterations per collective operation.
    type: int
    default: 10
  env:
    description: Runtime phase. Extra environment for the benchmark (e.g. NCCL_P2P_LEVEL); not used for the tests of
      O(nccl_tests_dir) when O(env_file) is given. Omitted - the environment of the host model's first serve
      profile (the serving unit's), none without one.
    type: dict
  env_file:
    description: Runtime and serving phases. The GPU environment file (KEY=VALUE lines, e.g. /etc/rigbook/gpu.env) the tests of
      O(nccl_tests_dir) run with, alone, as the serving unit does (so what is verified is what serves). Omitted - the
      host model's C(gpu_env_file).
    type: path
  allow_unknown:
    description: Layers allowed to come out unknown on this run. An unknown verdict of a layer the host model expects
      this box to measure (the host model's C(verify.measure)) fails the task unless this option or the host model's
      C(rigbook_verify.allow_unknown) names it; an allowed one stays unknown and says so.
    type: list
    elements: str
    default: []
  ab:
    description: Runtime phase. With the tests of O(nccl_tests_dir), run sendrecv once more with NCCL_P2P_DISABLE=1
      and judge the gain (below 1.1x fails the collectives layer on a box that expects P2P).
    type: bool
    default: false
  log:
    description: Runtime phase. NCCL INFO log text to judge the transport from, instead of the benchmark's.
    type: str
  unit:
    description: Runtime phase. systemd unit whose journal holds the serving engine's NCCL log.
    type: str
  serving_state:
    description: Serving phase. JSON file keeping the last seen C(NRestarts) per unit, to tell a crash loop.
      Omitted - C(/var/lib/rigbook/serving-state.json).
    type: path
  serving:
    description:
      - Runtime phase. V(stop) - stop this host's serve units that run for the runtime layers and start them again
        after, waiting until each is ready; V(keep) - measure beside them; V(resume) - climb nothing, only start again
        the units a runtime phase cut short left stopped (O(hold_state)).
      - Check mode never stops or starts a unit.
    type: str
    choices: [stop, keep, resume]
    default: stop
  serving_when:
    description:
      - Runtime phase, on a box whose serve units run. V(always) measures the runtime layers; V(changed) only when
        O(changes) is not empty or O(layers) / O(run_tags) name a runtime layer (each layer a C(skip) otherwise).
    type: str
    choices: [always, changed]
    default: always
  serving_figures:
    description:
      - Serving phase. V(false) - each engine's unit, readiness, API, served model and log are judged without chat
        requests (no TTFT or decode figures, as the health timer does); omitted or V(true) - with them.
    type: bool
  changes:
    description: Runtime phase. What changed under the engine in this run (the roles' reboot reasons, a GPU library
      build switched), read with O(serving_when=changed).
    type: list
    elements: str
    default: []
  engine:
    description: The serve engine's command prefix (the inventory's C(serve_engine)), to recognise an engine under no
      serve unit of this host besides C(python -m sglang.launch_server) and C(sglang serve).
    type: list
    elements: str
  hold_state:
    description: Runtime phase. JSON file naming the serve units this run stopped while it holds them (its pid, start
      time and boot), removed once they are started again. Omitted - C(/var/lib/rigbook/serving-hold.json).
    type: path
  error_state:
    description:
      - Runtime phase. JSON file keeping the last reading of the hardware error counters (not written in check
        mode). Around the runtime layers the module reads, per GPU and its root port, the sysfs AER totals
        (C(aer_dev_correctable), C(aer_dev_nonfatal), C(aer_dev_fatal), C(aer_rootport_total_err_*)) and counts
        the kernel log's (C(journalctl -k -b -o short-monotonic)) NVIDIA Xid, amdgpu GPU reset / ring timeout
        and DMAR / AMD-Vi fault lines. The runtime layer during which a counter rose fails (new nonfatal or fatal
        AER, a critical Xid, a GPU reset, an IOMMU fault) or warns (new correctable AER above
        C(tolerance.aer_correctable_warn_above), default 0; any other Xid), with the counter and the log line.
      - Live (O(root) V(/)) - each runtime layer is judged on what rose while it ran (a reading just before the
        first runtime layer, then one after each).
      - Recorded O(root) - the tree cannot change during a run, so the first runtime layer is judged against
        the reading the last run stored here; on the first run (no file) only counts since boot of the fail
        class are judged (those counters reset at boot). A kernel log that cannot be read is unknown, never 0.
    type: path
    default: /var/lib/rigbook/error-counters.json
attributes:
  check_mode:
    support: full
    description: Runs the same checks; never stops or starts a serve unit (the runtime layers are then judged as
      measured beside a serving engine) and writes no state file.
  diff_mode:
    support: none
    description: Nothing to diff.
"""

EXAMPLES = r"""
- name: Judge the five static layers
  rigbook.homelab.ladder:
    phase: static
    host: "{{ rigbook_host }}"

- name: Judge the four runtime layers against the recorded baseline
  rigbook.homelab.ladder:
    phase: runtime
    host: "{{ rigbook_host }}"
    baseline: {peer_gbs_0_1: 10.29, sendrecv_busbw_gbs: 9.75}

- name: Check the serve units after the serve role started them
  rigbook.homelab.ladder:
    phase: serving
    host: "{{ rigbook_host }}"
    baseline: {serve_qwen-27b_ttft_s: 0.654, serve_qwen-27b_decode_tok_s: 44.04}

- name: Only the PCIe link and the DMA window of a recorded tree
  rigbook.homelab.ladder:
    phase: static
    root: /var/lib/rigbook-lab/evidence
    layers: [pcie_link, dma_window]
"""

RETURN = r"""
ladder:
  description: The verdicts in ladder order, up to and including the first C(fail).
  returned: always
  type: list
  elements: dict
  contains:
    layer: {description: "The layer id, e.g. V(p2p_bandwidth)", type: str}
    status: {description: "pass, warn, fail, skip or unknown", type: str}
    measured: {description: What was found., type: raw}
    expected: {description: What the host model and baseline ask for., type: raw}
    why: {description: The reason for the status., type: str}
    remedy: {description: What to do when it is not pass., type: str}
    metrics: {description: "Figures by name, for the baseline (runtime layers).", type: dict}
    code: {description: "The stable failure code of a verdict that is not C(pass) (docs/codes.md).", type: str}
    codes: {description: "Every finding's code, the most severe first, when there are several.", type: list,
            elements: str}
code:
  description: "The failure's code (docs/codes.md): the failing verdict's, or a serve unit's not ready again after the
    runtime layers."
  returned: when the task fails
  type: str
evidence:
  description: "What was judged, as far as the ladder got: the static evidence (C(gpus), C(kernel), ...) and
    C(probe), C(collectives), C(nccl_transport) and C(serving) (per serve profile, never the API key);
    C(beside_engine) when an engine ran beside the runtime layers."
  returned: always
  type: dict
serving_hold:
  description: "The serve units around the runtime layers: C(stopped), C(started) (each C({unit, ready, seconds,
    why})), C(not_stopped) (unit -> why), C(left_by) (the record of an earlier run cut short whose units this run
    started), C(settled), C(busy), C(notes), C(problems), C(codes) (the problems' failure codes, then the busy
    hold's)."
  returned: runtime phase, when the runtime layers run on the GPUs
  type: dict
notes:
  description: What the run did around the layers, one line each, for the summary (e.g. "stopped
    rigbook-serve-qwen.service for the runtime layers, started again, ready in 41 s").
  returned: with serving_hold
  type: list
  elements: str
"""

from ansible_collections.rigbook.homelab.plugins.module_utils.ladder.ansible_module import run_ladder_module


def main():
    run_ladder_module()


if __name__ == "__main__":
    main()
