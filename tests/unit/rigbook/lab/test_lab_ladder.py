"""Every lab fault breaks the ladder at exactly its declared layer (recorded trees, judged in-process).

The same matrix runs end to end over SSH in tests/integration/test_ladder_lab.py; this one is the
fast guard on the fault data and the judges.
"""

from __future__ import annotations

import pytest

from rigbook.baselines import metrics_of
from rigbook.lab import faults, hardware_trees
from rigbook.paths import link_collection
from rigbook.snapshots import judge_tree
from rigbook.snapshots import ladder_view_of as host_ladder_view
from rigbook.validate import validate

HOSTS = {"x99-r9700": "lab-r9700", "x99-3080": "lab-3080"}
# The lab pins Debian kernels (the 3080 twin's from apt, the R9700 twin's as a .deb set standing in for the
# seed's custom kernel): the recorded trees show the seeds' kernels until site.yml has installed and "booted"
# the pinned one.
PINNED_KERNEL = {rig: validate("inventory/lab").host_vars(host)["rigbook_pins"]["kernel"]["release"]
                 for rig, host in (("x99-3080", "lab-3080"), ("x99-r9700", "lab-r9700"))}
NEEDS_BASELINE = {"busbw-half", "p2p-bandwidth-half"}
# Faults that warn, not fail, at their layer, and only against the reading of an earlier run (error counters:
# a correctable AER rise needs a "before"; the lab keeps it in the host's error-counters state file).
WARN_ONLY = {name for name in faults.fault_names() if faults.get_fault(name).get("status") == "warn"}
# The X99 TF box already has these (BAR1 256 MiB, SHM path, no collective figures published).
ALREADY_TRUE = {("bar1-256m", "x99-3080"), ("rebar-off", "x99-3080"), ("nccl-shm-fallback", "x99-3080"),
                ("busbw-half", "x99-3080")}


def ladder_view_of(inv, host):
    """HOST's ladder view for a replay of its lab rig's recorded tree. The 3080 rig records no collectives run (seed
    000 published none; on a lab host the nccl_tests role's build measures them), so a replay allows that layer
    unknown, as the owner of a box without a collectives tool would."""
    view = host_ladder_view(inv, host)
    if host.startswith("lab-3080"):
        view["allow_unknown"] = [*view["allow_unknown"], "collectives"]
    return view


# Faults the play stops at before the ladder runs (preflight): judged where they stop it,
# tests/unit/rigbook/lab/test_lab_secure_boot.py.
BEFORE_THE_LADDER = {"secure-boot-on"}


def _cases():
    for name in faults.fault_names():
        fault = faults.get_fault(name)
        if name in BEFORE_THE_LADDER:
            continue
        if any(edit.get("scope") == "host" for edit in fault["edits"]):
            continue  # host files of what the roles built: test_ladder_rccl_tests.py here, test_rccl_lab.py on the lab
        if fault.get("restart_units"):
            continue  # read by a running engine (the serve units): tests/integration/test_serving_lab.py
        for rig in HOSTS:
            vendor = hardware_trees.load_rig(rig)["vendor"]
            if fault.get("vendors") and vendor not in fault["vendors"]:
                continue
            yield name, rig


def _booted(tree, release):
    """What the lab's boot hook records once site.yml installed the pinned kernel and the DKMS build of the
    driver for it (src/rigbook/lab/machine.py BOOT_HOOK): the tree's running kernel, and its modules."""
    (tree / "proc/sys/kernel/osrelease").write_text(release + "\n")
    module = tree / "lib/modules" / release / "updates/dkms/nvidia.ko"
    module.parent.mkdir(parents=True, exist_ok=True)
    module.write_text("")


def _tree(tmp_path, rig, fault=None):
    tree = hardware_trees.materialize(rig, tmp_path / f"{rig}-{fault or 'healthy'}")
    pinned = PINNED_KERNEL.get(rig)
    if pinned:
        _booted(tree, pinned)
    if fault:
        changes = faults.plan(fault, tree, hardware_trees.load_rig(rig))
        if not changes:
            return None
        faults.apply(changes)
    return str(tree)


@pytest.fixture(scope="module")
def inv():
    return validate("inventory/lab")


def test_unprovisioned_3080_twin_fails_at_kernel_state(tmp_path, inv):
    tree = hardware_trees.materialize("x99-3080", tmp_path / "fresh")
    kernel = [v for v in judge_tree(str(tree), ladder_view_of(inv, "lab-3080")) if v["layer"] == "kernel_state"][0]
    assert kernel["status"] == "fail" and f"pinned {PINNED_KERNEL['x99-3080']}" in kernel["why"]


def test_unprovisioned_r9700_twin_fails_at_kernel_state(tmp_path, inv):
    tree = hardware_trees.materialize("x99-r9700", tmp_path / "fresh")
    kernel = [v for v in judge_tree(str(tree), ladder_view_of(inv, "lab-r9700")) if v["layer"] == "kernel_state"][0]
    assert kernel["status"] == "fail", kernel
    assert "running kernel 6.8.12-r9700-p2p-dma44, pinned 6.1.0-47-amd64" in kernel["why"], kernel


def test_r9700_twin_on_another_kernel_fails_at_kernel_state_on_its_config(tmp_path, inv):
    """A kernel other than the pinned stand-in gets its own config (here one without P2PDMA, like Debian's):
    the recorded custom config is only under the pinned stand-in's release."""
    tree = hardware_trees.materialize("x99-r9700", tmp_path / "other")
    (tree / "proc/sys/kernel/osrelease").write_text("6.1.0-50-amd64\n")
    (tree / "boot/config-6.1.0-50-amd64").write_text("# CONFIG_PCI_P2PDMA is not set\nCONFIG_HSA_AMD=y\n")
    kernel = [v for v in judge_tree(str(tree), ladder_view_of(inv, "lab-r9700")) if v["layer"] == "kernel_state"][0]
    assert kernel["status"] == "fail", kernel
    assert "running kernel 6.1.0-50-amd64, pinned 6.1.0-47-amd64" in kernel["why"], kernel
    assert "CONFIG_PCI_P2PDMA=n CONFIG_HSA_AMD_P2P=missing" in str(kernel["measured"]), kernel


def test_healthy_rigs(tmp_path, inv):
    r9700_view = ladder_view_of(inv, "lab-r9700")
    r9700 = {v["layer"]: v["status"] for v in judge_tree(_tree(tmp_path, "x99-r9700"), r9700_view)}
    assert r9700.pop("serving") == "skip"  # a hardware tree records no serving part (the serve role's engine)
    assert set(r9700.values()) == {"pass"}, r9700
    x3080 = judge_tree(_tree(tmp_path, "x99-3080"), ladder_view_of(inv, "lab-3080"))
    statuses = {v["layer"]: v["status"] for v in x3080}
    assert statuses.pop("serving") == "skip"
    assert statuses.pop("firmware") == "warn" and "BAR1 256 MiB" in x3080[0]["why"]
    assert statuses.pop("collectives") == "unknown"  # the write-up published no collective figures
    assert set(statuses.values()) == {"pass"}, statuses


@pytest.mark.parametrize("fault,rig", list(_cases()))
def test_fault_fails_at_its_layer(tmp_path, inv, fault, rig):
    host = HOSTS[rig]
    baseline = None
    if fault in NEEDS_BASELINE:
        baseline = metrics_of(judge_tree(_tree(tmp_path, rig), ladder_view_of(inv, host)))
    tree = _tree(tmp_path, rig, fault)
    if tree is None:  # already true of this rig: `lab break` refuses it
        assert (fault, rig) in ALREADY_TRUE
        return
    if fault in WARN_ONLY:
        _assert_warns_at_its_layer(tmp_path, inv, fault, rig, tree)
        return
    verdicts = judge_tree(tree, ladder_view_of(inv, host), baseline)
    if ladder_view_of(inv, host)["p2p"].get("expected") is False and faults.get_fault(fault)["layer"] == "firmware":
        # a box declared without P2P is told, not failed, about its firmware
        assert verdicts[0]["status"] == "warn" and "declared unavailable" in verdicts[0]["why"]
        return
    failed = [v for v in verdicts if v["status"] == "fail"]
    assert failed, f"{fault} on {rig} failed no layer"
    first = failed[0]
    assert first["layer"] == faults.get_fault(fault)["layer"], first
    assert first["measured"] is not None and first["why"]
    if fault in NEEDS_BASELINE:
        assert "vs baseline" in first["why"] and "(0.50x)" in first["why"]
    lower = [v for v in verdicts[: verdicts.index(first)] if v["status"] not in ("pass", "warn", "skip", "unknown")]
    assert not lower


def _assert_warns_at_its_layer(tmp_path, inv, fault, rig, tree):
    """A run on the healthy tree stores the error counters; the run on the faulted tree then warns at exactly the
    fault's layer and fails nowhere."""
    climb, registry = _climb()
    options = {"error_state": str(tmp_path / "error-counters.json")}
    ctx_of = lambda root: climb.Context(root, ladder_view_of(inv, HOSTS[rig]), options=options)  # noqa: E731
    climb.climb(registry.LAYERS, ctx_of(_tree(tmp_path, rig)), stop_at_fail=False)
    verdicts, _ = climb.climb(registry.LAYERS, ctx_of(tree), stop_at_fail=False)
    assert not [v for v in verdicts if v["status"] == "fail"], verdicts
    warned = [v for v in verdicts if "hardware errors" in v["why"]]
    assert [(v["layer"], v["status"]) for v in warned] == [(faults.get_fault(fault)["layer"], "warn")], verdicts
    assert warned[0]["measured"]["errors"]["aer"], warned[0]


def _climb():
    link_collection()
    from ansible_collections.rigbook.homelab.plugins.module_utils.ladder import climb, registry

    return climb, registry


def test_the_runtime_climb_stops_at_the_first_failing_layer(tmp_path, inv):
    climb, registry = _climb()
    ctx = climb.Context(_tree(tmp_path, "x99-r9700", "peer-map-failed"), ladder_view_of(inv, "lab-r9700"))
    verdicts, evidence_seen = climb.climb(registry.of_phase(registry.RUNTIME), ctx)
    assert [(v["layer"], v["status"]) for v in verdicts] == [("peer_access", "fail")]
    assert sorted(evidence_seen) == ["probe", "root"]  # the benchmark above it was never run
    everything, _ = climb.climb(registry.of_phase(registry.RUNTIME), ctx, stop_at_fail=False)
    assert [v["layer"] for v in everything] == registry.names(registry.RUNTIME)


def test_the_runtime_climb_judges_only_the_layers_asked(tmp_path, inv):
    climb, _ = _climb()
    ctx = climb.Context(_tree(tmp_path, "x99-r9700"), ladder_view_of(inv, "lab-r9700"))
    verdicts, seen = climb.climb(["nccl_transport", "p2p_bandwidth"], ctx)
    assert [(v["layer"], v["status"]) for v in verdicts] == [("p2p_bandwidth", "pass"), ("nccl_transport", "pass")]
    # the static "gpus" part too: nccl_transport counts the GPUs the box shows (one GPU: a skip)
    assert sorted(seen) == ["error", "gpus", "nccl_transport", "probe", "root", "uefi", "virtual"]
