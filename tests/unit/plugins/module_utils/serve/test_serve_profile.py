"""Serve profiles as data (rigbook_serve, plugins/module_utils/serve/profile.py): the engine's argv, and the traps
the seeds hit, caught before any host is touched (`provision`, exit 2 naming host and key path) or, for what only
the box knows, by check() with the box's facts. Warnings are printed and do not stop."""

from __future__ import annotations

import io
import os
import shlex
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import yaml
from ansible_collections.rigbook.homelab.plugins.action import host_model as host_model_action
from ansible_collections.rigbook.homelab.plugins.module_utils.serve import profile as serve

from rigbook import paths
from rigbook.validate import InventoryInvalid, validate

REPO = Path(__file__).resolve().parents[5]
BIN = Path(sys.executable).parent
G3080 = "group_vars/x99_3080.yml"
G9700 = "group_vars/x99_r9700.yml"
ENGINE = ["/opt/rigbook/sglang/bin/python", "-m", "sglang.launch_server"]

# Seed 000 (forum write-up, section 四), its launch command verbatim.
SEED_000_COMMAND = r"""
sglang serve --model-path ~/models/Qwen3.8-27B-AWQ --tp-size 2 \
  --quantization compressed-tensors --kv-cache-dtype fp8_e4m3 \
  --quantization-param-path scales/qwen38-fp8-kv-scales-per-head.json \
  --speculative-algorithm DFLASH --speculative-draft-model-path ~/models/Qwen3.8-27B-DFlash2-W4A16 \
  --speculative-draft-kv-cache-dtype fp8_e4m3 --speculative-num-draft-tokens 8 \
  --context-length 200000 --max-total-tokens 185000 \
  --max-running-requests 4 --cuda-graph-max-bs-decode 4 \
  --mem-fraction-static 0.88 --mamba-ssm-dtype bfloat16 \
  --mamba-radix-cache-strategy extra_buffer_lazy --disable-custom-all-reduce \
  --enable-hierarchical-cache --hicache-ratio 2 --hicache-size 15 \
  --hicache-io-backend direct --hicache-mem-layout page_first_direct \
  --hicache-write-policy write_through --page-size 64 \
  --default-chat-template-kwargs '{"reasoning_effort": "medium"}'
"""
# Where the homelab inventory puts what the write-up loads relative to its home and working directory (a unit has
# no shell to expand ~).
SEED_000_PLACES = (("~/models/", "/srv/models/"), ("scales/", "/srv/models/scales/"))


def _copy(tmp_path: Path) -> Path:
    dest = tmp_path / "inv"
    shutil.copytree(REPO / "inventory" / "homelab", dest)
    return dest


def _group(inv: Path, rel: str) -> dict:
    return yaml.safe_load((inv / rel).read_text())


def _write(inv: Path, rel: str, data: dict) -> None:
    (inv / rel).write_text(yaml.safe_dump(data, sort_keys=False))


def _set_serve(inv: Path, rel: str, change) -> None:
    """CHANGE(list of serve profiles) edits the group's rigbook_serve in place."""
    data = _group(inv, rel)
    change(data["rigbook_serve"])
    _write(inv, rel, data)


def _field(key, value):
    def change(profiles):
        profiles[0][key] = value

    return change


def _drop(key):
    def change(profiles):
        del profiles[0][key]

    return change


def _second(**fields):
    def change(profiles):
        profiles.append({"name": "second", "model_path": "/srv/models/other", **fields})

    return change


def _run_cli(*args, cwd: Path):
    env = {**os.environ, "RIGBOOK_STATE_DIR": str(cwd / "state")}
    return subprocess.run([sys.executable, "-m", "rigbook", *args], capture_output=True, text=True, timeout=120,
                          env=env, cwd=cwd)


def _pairs(argv) -> Counter:
    """The flags of ARGV as (flag, value or None); --flag=value and --flag value read the same."""
    pairs = []
    index = 0
    while index < len(argv):
        token = argv[index]
        if "=" in token:
            pairs.append(tuple(token.split("=", 1)))
        elif index + 1 < len(argv) and not argv[index + 1].startswith("--"):
            pairs.append((token, argv[index + 1]))
            index += 1
        else:
            pairs.append((token, None))
        index += 1
    return Counter(pairs)


# Bad serve profiles the real CLI path refuses before any host is touched: the traps are named per host (judged
# with its GPU count, vendor and rigbook_p2p.expected), schema problems per file and group.
# (case id, group file, change to its rigbook_serve, key path named, words expected).
TRAPS = [
    ("tp-above-gpu-count", G3080, _field("tp_size", 4), "rigbook_serve[0].tp_size",
     "4, but the box has 2 GPUs"),
    ("custom-all-reduce-on-without-p2p", G3080, _field("custom_all_reduce", True),
     "rigbook_serve[0].custom_all_reduce", "wrong results and hard resets (noonghunna/club-3090 #922, #1332)"),
    ("custom-all-reduce-engine-default-without-p2p", G3080, _drop("custom_all_reduce"),
     "rigbook_serve[0].custom_all_reduce", "not set, so the engine's default applies"),
    ("amd-legacy-ipc", G9700, _field("env", {"HSA_ENABLE_IPC_MODE_LEGACY": "1"}),
     "rigbook_serve[0].env.HSA_ENABLE_IPC_MODE_LEGACY", "RCCL fall back to SHM"),
    ("token-pool-at-full-context", G3080, _field("max_total_tokens", 200000), "rigbook_serve[0].max_total_tokens",
     "'Can not alloc mamba cache'"),
    ("eagle3-without-draft-model", G9700, _field("speculative", {"algorithm": "EAGLE3", "num_steps": 3}),
     "rigbook_serve[0].speculative.draft_model_path", "EAGLE3 drafts with a separate model"),
    ("extra-arg-duplicates-tp-size", G9700, _field("extra_args", ["--tp-size=2"]), "rigbook_serve[0].extra_args[0]",
     "--tp-size: the profile field tp_size sets it; set tp_size instead"),
    ("extra-arg-duplicates-speculative", G9700, _field("extra_args", ["--page-size", "64",
                                                                      "--speculative-num-steps", "2"]),
     "rigbook_serve[0].extra_args[2]", "set speculative.num_steps instead"),
    ("api-key-on-the-command-line", G9700, _field("extra_args", ["--api-key", "sk-secret"]),
     "rigbook_serve[0].extra_args[0]", "never put the API key on the command line"),
    # the engine's argparse takes unique prefixes: --hos is --host, --api-ke is --api-key
    ("abbreviated-host-binds-past-the-key-check", G9700, _field("extra_args", ["--hos", "0.0.0.0"]),
     "rigbook_serve[0].extra_args[0]", "--hos (the engine reads it as --host: its argument parser takes unique "
     "prefixes): the profile field bind sets it"),
    ("abbreviated-api-key", G9700, _field("extra_args", ["--api-ke=sk-secret"]), "rigbook_serve[0].extra_args[0]",
     "--api-ke (the engine reads it as --api-key"),
    # seed 000 loads its FP8 KV scales as scales/... from the directory it was started in; a unit has none of its own
    ("kv-scales-relative-path", G3080, _field("extra_args", ["--kv-cache-dtype=fp8_e4m3", "--quantization-param-path",
                                                             "scales/qwen38-fp8-kv-scales-per-head.json"]),
     "rigbook_serve[0].extra_args[1]", "--quantization-param-path scales/qwen38-fp8-kv-scales-per-head.json is a "
     "relative path"),
    ("mem-fraction-nan", G3080, _field("mem_fraction_static", float("nan")), "rigbook_serve[0].mem_fraction_static",
     "nan is not a number the engine can use"),
    ("port-clash", G9700, _second(), "rigbook_serve[1].port", "30000 is also rigbook_serve[0]'s port"),
    ("name-clash", G9700, _second(name="qwen38-27b-awq-mtp", port=30001), "rigbook_serve[1].name",
     "each profile is its own unit"),
]
SCHEMA = [
    ("mem-fraction-one", G3080, _field("mem_fraction_static", 1), "rigbook_serve[0].mem_fraction_static",
     "must be less than 1"),
    ("model-path-under-home", G3080, _field("model_path", "~/models/Qwen3.8-27B-AWQ"), "rigbook_serve[0].model_path",
     "an absolute path"),
    ("startup-timeout-too-short", G3080, _field("startup_timeout_s", 30), "rigbook_serve[0].startup_timeout_s",
     "at least 60"),
    # a newline would write extra lines ([Service], ExecStartPre=+...) into the unit file
    ("newline-in-served-name", G3080, _field("served_model_name", "q\n[Service]\nExecStartPre=+/bin/id"),
     "rigbook_serve[0].served_model_name", "control characters"),
    ("newline-in-extra-args", G3080, _field("extra_args", ["--page-size=64\nExecStartPre=+/bin/id"]),
     "rigbook_serve[0].extra_args[0]", "control characters"),
    ("newline-in-model-path", G3080, _field("model_path", "/srv/m\nUser=root"), "rigbook_serve[0].model_path",
     "control characters"),
]


CASES = [(*case, "host") for case in TRAPS] + [(*case, "group") for case in SCHEMA]


@pytest.mark.parametrize("case,rel,change,key_path,words,owner", CASES, ids=[c[0] for c in CASES])
def test_cli_refuses_bad_profile_before_touching_a_host(tmp_path, case, rel, change, key_path, words, owner):
    inv = _copy(tmp_path)
    _set_serve(inv, rel, change)
    proc = _run_cli("site.yml", "-i", str(inv), "--check", cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    named = {"host": "host rig-3080" if rel == G3080 else "host rig-r9700", "group": f"group {Path(rel).stem}"}
    lines = [line for line in proc.stderr.splitlines() if f": {key_path}: " in line]
    assert lines, proc.stderr
    assert any(words in line for line in lines), lines
    assert any(f"{Path(rel).name}: {named[owner]}: {key_path}: " in line for line in lines), lines
    assert not (tmp_path / "state" / "runs").exists()  # no run was started


def test_more_schema_problems_are_named(tmp_path):
    inv = _copy(tmp_path)
    _set_serve(inv, G9700, _field("name", "Qwen"))
    _set_serve(inv, G9700, _field("speculative", {"num_steps": 3}))
    _set_serve(inv, G9700, _field("env", {"NCCL_DEBUG": 1}))
    _set_serve(inv, G9700, _field("api_key_file", "keys/serve"))
    _set_serve(inv, G9700, _field("bind", "0.0.0.0 "))
    with pytest.raises(InventoryInvalid) as info:
        validate(inv)
    found = {p.key_path: p.message for p in info.value.problems}
    assert "must match" in found["rigbook_serve[0].name"]
    assert found["rigbook_serve[0].speculative"] == "missing required key 'algorithm'"
    assert "must be a string" in found["rigbook_serve[0].env.NCCL_DEBUG"]
    assert "an absolute path" in found["rigbook_serve[0].api_key_file"]
    assert "must match" in found["rigbook_serve[0].bind"]


def test_warnings_are_printed_and_do_not_stop(tmp_path):
    inv = _copy(tmp_path)
    data = _group(inv, G3080)
    data["rigbook_p2p"] = {"expected": True}  # a 3080 box with working P2P: custom all-reduce must be decided
    del data["rigbook_serve"][0]["custom_all_reduce"]
    _write(inv, G3080, data)
    proc = _run_cli("validate", "-i", str(inv), cwd=tmp_path)
    # the homelab inventory still lacks what only its owners have (readiness): exit 2, the warning printed too
    assert proc.returncode == 2 and "inventory is not ready" in proc.stderr, proc.stderr
    assert "rigbook_serve" not in proc.stderr.split("inventory is not ready")[1]
    warnings = [line for line in proc.stderr.splitlines() if line.startswith("warning: ")]
    assert len(warnings) == 1, proc.stderr
    assert "host rig-3080: rigbook_serve[0].custom_all_reduce: not set: the engine turns" in warnings[0]
    stream = io.StringIO()
    assert set(validate(inv, warn=stream).hosts) == {"rig-3080", "rig-r9700"}
    assert stream.getvalue().count("warning: ") == 1


def test_shipped_inventories_have_no_serve_warnings(capsys):
    for name in ("homelab", "lab"):
        validate(REPO / "inventory" / name)
    assert "warning" not in capsys.readouterr().err


# --- what only the box knows ----------------------------------------------------------------------------------------

def _seed(rel: str, root: str = "homelab") -> dict:
    return yaml.safe_load((REPO / "inventory" / root / rel).read_text())["rigbook_serve"][0]


NVIDIA_BOX = {"gpu_count": 2, "vendor": "nvidia", "p2p_expected": False}


@pytest.mark.parametrize("facts,warned", [
    ({"default_target": "graphical.target"}, "the default target is graphical.target"),
    ({"default_target": "multi-user.target", "display_manager_enabled": True}, "a display manager is enabled"),
    ({"default_target": "multi-user.target", "display_manager_enabled": False}, None),
    ({}, None),  # the controller does not know: no guess
])
def test_memory_fraction_above_088_on_a_desktop_warns(facts, warned):
    profile = {**_seed(G3080), "mem_fraction_static": 0.9}
    errors, warnings = serve.check(profile, {**NVIDIA_BOX, **facts})
    assert errors == []
    if warned is None:
        assert warnings == []
    else:
        assert len(warnings) == 1 and warnings[0].startswith("rigbook_serve[0].mem_fraction_static: 0.9 while ")
        assert warned in warnings[0] and "0.88 works" in warnings[0] and "multi-user.target" in warnings[0]
        assert "panicked" in warnings[0]
    assert serve.check(_seed(G3080), {**NVIDIA_BOX, **facts}) == ([], [])  # the seed's 0.88 is fine


def test_missing_model_on_the_box_is_an_error():
    facts = {**NVIDIA_BOX, "model_path_exists": False, "draft_model_path_exists": False}
    errors, _ = serve.check(_seed(G3080), facts, index=1)
    assert errors[0] == ("rigbook_serve[1].model_path: /srv/models/Qwen3.8-27B-AWQ does not exist on the box: "
                         "the unit is not (re)started; copy the model there or fix the path")
    assert errors[1].startswith("rigbook_serve[1].speculative.draft_model_path: /srv/models/Qwen3.8-27B-DFlash2")
    assert serve.check(_seed(G3080), {**NVIDIA_BOX, "model_path_exists": True})[0] == []


def _seed_000_args(old, new):
    """Seed 000's profile (inventory/homelab, reconstructed from its write-up) with one extra_args item replaced."""
    profile = _seed(G3080)
    index = profile["extra_args"].index(old)
    profile["extra_args"][index] = new
    return profile, index


@pytest.mark.parametrize("present,errors", [(False, 1), (True, 0), (None, 0)])
def test_a_kv_scales_file_missing_on_the_box_is_an_error(present, errors):
    facts = dict(NVIDIA_BOX) if present is None else {**NVIDIA_BOX, "quantization_param_path_exists": present}
    found, warnings = serve.check(_seed(G3080), facts)
    assert len(found) == errors and warnings == []
    if errors:
        index = _seed(G3080)["extra_args"].index(
            "--quantization-param-path=/srv/models/scales/qwen38-fp8-kv-scales-per-head.json")
        assert found[0].startswith(f"rigbook_serve[0].extra_args[{index}]: --quantization-param-path "
                                   "/srv/models/scales/qwen38-fp8-kv-scales-per-head.json does not exist on the box")
        assert "seed 000" in found[0] and "every scale at 1.0" in found[0] and "not (re)started" in found[0]


@pytest.mark.parametrize("args", [["--quantization-param-path="], ["--quantization-param-path", "None"],
                                  ["--quantization-param-path"]])
def test_no_kv_scales_file_named_is_nothing_to_check(args):
    profile = {"name": "a", "model_path": "/m", "extra_args": args}
    assert serve.check(profile, {"quantization_param_path_exists": False}) == ([], [])


# Seed 000's pool: 185000 of a 200000 context held (0.925); 200000 killed the scheduler; between, nothing measured.
@pytest.mark.parametrize("total,kind", [(185000, None), (185001, "warning"), (199999, "warning"), (200000, "error"),
                                        (250000, "error"), (100000, None)])
def test_a_hybrid_models_pool_above_seed_000s_share_warns_and_the_full_context_is_an_error(total, kind):
    errors, warnings = serve.check({**_seed(G3080), "max_total_tokens": total}, NVIDIA_BOX)
    found = errors + warnings
    assert [m.split(":")[0] for m in found] == ([] if kind is None else ["rigbook_serve[0].max_total_tokens"])
    if kind == "error":
        assert warnings == [] and "is not below context_length 200000" in errors[0]
    if kind == "warning":
        assert errors == []
        assert f"{total} leaves the Mamba pool {200000 - total} tokens of context_length 200000" in warnings[0]
        assert "(--mamba-ssm-dtype, --mamba-radix-cache-strategy)" in warnings[0]
        assert "seed 000" in warnings[0] and "Can not alloc mamba cache" in warnings[0]
        assert "0.925 of the context (15000 tokens, 7.5% headroom)" in warnings[0]
        assert warnings[0].endswith("set max_total_tokens to at most 185000 (0.925 x 200000)")


def test_the_mamba_share_scales_with_the_context_and_needs_a_hybrid_model():
    hybrid = {"name": "a", "model_path": "/m", "context_length": 32768, "max_total_tokens": 30400,
              "extra_args": ["--max-mamba-cache-size", "64"]}
    _, warnings = serve.check(hybrid, {})
    assert len(warnings) == 1 and "at most 30310 (0.925 x 32768)" in warnings[0] and "(--max-mamba-cache-size)" in (
        warnings[0])
    assert serve.check(dict(hybrid, max_total_tokens=30310), {}) == ([], [])
    # a model without Mamba layers has no Mamba pool: the seed's share says nothing about it
    assert serve.check(dict(hybrid, extra_args=["--page-size", "64"]), {}) == ([], [])
    # the lab's profiles (no Mamba flags) keep 30000 of 32768
    assert serve.check(_seed(G3080, "lab"), {}) == ([], [])


@pytest.mark.parametrize("new,warned", [("--max-running-requests=2", "2"), ("--max-running-requests=1", "1"),
                                        ("--max-running-requests=4", None), ("--max-running-requests=8", None)])
def test_fewer_than_4_running_requests_warns(new, warned):
    profile, index = _seed_000_args("--max-running-requests=4", new)
    errors, warnings = serve.check(profile, NVIDIA_BOX)
    assert errors == []
    if warned is None:
        assert warnings == []
    else:
        assert warnings == [f"rigbook_serve[0].extra_args[{index}]: --max-running-requests {warned}: seed 000 - with "
                            "2, two long prefills at once crashed the engine, with 4 they did not (odd, but measured, "
                            "and 4 is what it runs since); set it to 4 or more"]


def test_the_last_running_requests_flag_is_the_one_the_engine_reads():
    profile = {"name": "a", "model_path": "/m", "extra_args": ["--max-running-requests", "2", "--page-size", "64",
                                                               "--max-running-requests", "3"]}
    _, warnings = serve.check(profile, {})
    assert len(warnings) == 1 and warnings[0].startswith("rigbook_serve[0].extra_args[4]: --max-running-requests 3")
    assert serve.check(dict(profile, extra_args=profile["extra_args"][:4] + ["--max-running-requests=4"]), {}) == (
        [], [])


GIB = 1024 ** 3


# Seed 000's box: 62 GB of RAM, --hicache-size 15 at tp_size 2 (30 GB of host pools); 10 GiB kept for the rest.
@pytest.mark.parametrize("mem_total,tp,refused", [
    (62 * GIB, 2, False),
    (32 * GIB, 2, True),
    (32 * GIB, 1, False),  # 15 GB fits in 22 GiB
    (30 * 10 ** 9 + 10 * GIB, 2, False),  # exactly the pools and the reserve
    (30 * 10 ** 9 + 10 * GIB - 1024, 2, True),
    (None, 2, False),  # the controller does not know the RAM: no guess
])
def test_hierarchical_cache_host_pools_must_leave_the_os_its_reserve(mem_total, tp, refused):
    facts = dict(NVIDIA_BOX) if mem_total is None else {**NVIDIA_BOX, "mem_total_bytes": mem_total}
    errors, warnings = serve.check({**_seed(G3080), "tp_size": tp}, facts)
    assert warnings == []
    assert [e.split(":")[0] for e in errors] == (
        [f"rigbook_serve[0].extra_args[{_seed(G3080)['extra_args'].index('--hicache-size=15')}]"] if refused else [])
    if refused and mem_total == 32 * GIB:
        assert ("--hicache-size 15 is GB for each rank: 2 ranks pin 30.0 GB (27.9 GiB) of host memory, but the box "
                "has 32.0 GiB (MemTotal) and keeps 10.0 GiB") in errors[0]
        assert "seed 000" in errors[0] and errors[0].endswith("lower --hicache-size to at most 11.8")
        # what it names fits
        fixed, index = _seed_000_args("--hicache-size=15", "--hicache-size=11.8")
        assert serve.check(fixed, facts) == ([], [])
        over, _ = _seed_000_args("--hicache-size=15", "--hicache-size=11.9")
        assert len(serve.check(over, facts)[0]) == 1


@pytest.mark.parametrize("args", [["--hicache-size", "15"],  # no hierarchical cache: the size is not used
                                  ["--enable-hierarchical-cache", "--hicache-size", "0"],  # sized by --hicache-ratio
                                  ["--enable-hierarchical-cache", "--hicache-size", "inf"],
                                  ["--enable-hierarchical-cache", "--hicache-size", "lots"]])
def test_a_host_pool_that_is_not_sized_here_is_not_judged(args):
    profile = {"name": "a", "model_path": "/m", "tp_size": 2, "extra_args": args}
    assert serve.check(profile, {"mem_total_bytes": 16 * GIB}) == ([], [])
    assert serve.check(dict(profile, extra_args=["--enable-hierarchical-cache", "--hicache-size", "15"]),
                       {"mem_total_bytes": 16 * GIB})[0] != []


@pytest.mark.parametrize("args,value", [
    (["--hicache-size", "15"], "15"), (["--hicache-size=15"], "15"), (["--hicache-size"], None),
    (["--hicache-size", "--page-size", "64"], None), (["--hicache-size=8", "--hicache-size", "15"], "15"),
    (["--hicache-size-x", "3"], None), (["--hicache-si", "3"], None), ([], None),
    (["--hicache-size=8", "--hicache-size"], None),  # the engine's argparse refuses a flag without its value
])
def test_extra_value_reads_a_flag_as_the_engine_does(args, value):
    assert serve.extra_value({"extra_args": args}, "--hicache-size") == value


def test_mtp_and_ngram_need_no_draft_model():
    for algorithm in ("NEXTN", "NGRAM"):
        profile = {"name": "a", "model_path": "/m", "speculative": {"algorithm": algorithm}}
        assert serve.check(profile, {}) == ([], [])
    errors, _ = serve.check({"name": "a", "model_path": "/m", "speculative": {"algorithm": "dflash"}}, {})
    assert "DFLASH drafts with a separate model" in errors[0]


def test_amd_custom_all_reduce_with_p2p_and_legacy_zero_pass():
    assert serve.check(_seed(G9700), {"gpu_count": 2, "vendor": "amd", "p2p_expected": True}) == ([], [])
    legacy = {**_seed(G9700), "env": {"HSA_ENABLE_IPC_MODE_LEGACY": "1"}}
    assert serve.check(legacy, {"vendor": "nvidia"}) == ([], [])  # an NVIDIA box has no HIP IPC


def test_bad_input_is_an_error_not_a_traceback():
    assert serve.check_all({"name": "a"}, {})[0] == ["rigbook_serve: must be a list of serve profiles, got "
                                                     "{'name': 'a'}"]
    assert serve.check_all(["x"], {})[0][0].startswith("rigbook_serve[0]: must be a mapping")
    errors, _ = serve.check({"name": "a", "model_path": "/m", "tp_size": "2", "max_total_tokens": None}, None)
    assert errors == []  # wrong types are the schema's to name
    with pytest.raises(ValueError, match="needs model_path"):
        serve.engine_argv({"name": "a"}, ENGINE)
    with pytest.raises(ValueError, match="list of strings"):
        serve.engine_argv(_seed(G3080), "sglang serve")


# --- the engine argv ------------------------------------------------------------------------------------------------

def test_seed_000_profile_gives_exactly_seed_000s_flags():
    seed = shlex.split(SEED_000_COMMAND.replace("\\\n", " "))
    assert seed[:2] == ["sglang", "serve"]
    for home, placed in SEED_000_PLACES:
        seed = [token.replace(home, placed, 1) if token.startswith(home) else token for token in seed]
    argv = serve.engine_argv(_seed(G3080), ["sglang", "serve"])
    assert argv[:2] == ["sglang", "serve"]
    ours = _pairs(argv[2:])
    # --host/--port are always written; the seed used the engine's defaults (127.0.0.1, 30000).
    assert ours[("--host", "127.0.0.1")] == 1 and ours[("--port", "30000")] == 1
    ours -= Counter({("--host", "127.0.0.1"): 1, ("--port", "30000"): 1})
    assert ours == _pairs(seed[2:])


def test_seed_004_profile_argv_and_env():
    profile = _seed(G9700)
    argv = serve.engine_argv(profile, ENGINE)
    assert argv == ENGINE + ["--model-path", "/srv/models/Qwen3.8-27B-AWQ-MTP", "--tp-size", "2",
                             "--context-length", "196608",  # its MTP_FAST route: <=192K
                             "--speculative-algorithm", "NEXTN", "--speculative-num-steps", "3",
                             "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4",
                             "--host", "127.0.0.1", "--port", "30000", "--kv-cache-dtype=bf16",
                             "--triton-attention-num-kv-splits=8"]
    assert profile["env"]["HSA_ENABLE_IPC_MODE_LEGACY"] == "0" and profile["env"]["NCCL_P2P_LEVEL"] == "PHB"


def test_argv_is_deterministic_and_in_flag_order():
    profile = _seed(G3080)
    shuffled = dict(reversed(list(profile.items())))
    assert serve.engine_argv(profile, ENGINE) == serve.engine_argv(shuffled, ENGINE)
    argv = serve.engine_argv(profile, ENGINE)
    order = [argv.index(flag) for flag in ("--model-path", "--tp-size", "--mem-fraction-static", "--context-length",
                                           "--max-total-tokens", "--speculative-algorithm",
                                           "--disable-custom-all-reduce", "--host", "--port",
                                           "--quantization=compressed-tensors")]
    assert order == sorted(order)
    assert argv[-1] == '--default-chat-template-kwargs={"reasoning_effort": "medium"}'


@pytest.mark.parametrize("value,flag", [(False, True), (True, False), (None, False)])
def test_custom_all_reduce_flag(value, flag):
    profile = {"name": "a", "model_path": "/m", "tp_size": 2}
    if value is not None:
        profile["custom_all_reduce"] = value
    assert ("--disable-custom-all-reduce" in serve.engine_argv(profile, ENGINE)) is flag


def test_api_key_never_on_the_command_line():
    profile = {"name": "a", "model_path": "/m", "api_key_file": "/etc/rigbook/serve/a.key", "bind": "0.0.0.0",
               "port": 8000, "served_model_name": "qwen"}
    argv = serve.engine_argv(profile, ENGINE)
    assert "--api-key" not in argv and not any("a.key" in a for a in argv)
    assert argv[-4:] == ["--host", "0.0.0.0", "--port", "8000"]
    assert argv[argv.index("--served-model-name") + 1] == "qwen"
    # the engine reads the key from its systemd credential (%d: the credentials directory) with --config
    assert serve.api_key_args(profile) == ["--config", "%d/api-key.yaml"]
    assert serve.api_key_args({"name": "a", "model_path": "/m"}) == []
    assert serve.check(profile, {}) == ([], [])  # exposed, but with a key


@pytest.mark.parametrize("key", ["s3cret", "123", "true", "null", "*x", "# y", "a: b", "it's \"q\" \\", "ключ"])
def test_the_key_config_reads_back_as_the_same_string(key):
    text = serve.api_key_config(key, "qwen")
    assert yaml.safe_load(text) == {"api-key": key}  # SGLang: --api-key KEY
    assert text.startswith("# Managed by rigbook (serve role), serve profile qwen")


def test_a_config_file_of_its_own_clashes_with_the_key():
    """SGLang takes one --config; with api_key_file it is the key's."""
    profile = {"name": "a", "model_path": "/m", "api_key_file": "/k", "extra_args": ["--page-size", "64", "--config",
                                                                                    "/etc/x.yaml"]}
    errors, _ = serve.check(profile, {})
    assert [e.split(":")[0] for e in errors] == ["rigbook_serve[0].extra_args[2]"]
    assert "one --config file" in errors[0]
    assert serve.check(dict(profile, api_key_file=None), {}) == ([], [])


def test_the_admin_key_is_a_secret_as_the_api_key_is():
    """--admin-api-key on a command line shows in ps, /proc and the unit: a profile names admin_api_key_file and the
    engine reads the key from the same credential file as the API key."""
    profile = {"name": "a", "model_path": "/m", "admin_api_key_file": "/etc/rigbook/serve/a.admin"}
    argv = serve.engine_argv(profile, ENGINE)
    assert not any("admin" in a for a in argv)
    assert serve.api_key_args(profile) == ["--config", "%d/api-key.yaml"]
    assert serve.normalize(profile)[0]["admin_api_key_file"] == "/etc/rigbook/serve/a.admin"
    assert serve.normalize({"name": "b", "model_path": "/m"})[0]["admin_api_key_file"] is None
    assert yaml.safe_load(serve.api_key_config("k1", "a", "adm#2")) == {"api-key": "k1", "admin-api-key": "adm#2"}
    assert yaml.safe_load(serve.api_key_config(None, "a", "true")) == {"admin-api-key": "true"}
    assert serve.check(profile, {}) == ([], [])


@pytest.mark.parametrize("words", [["--admin-api-key", "adm-s3cret"], ["--admin-api-key=adm-s3cret"],
                                   ["--admin-api", "adm-s3cret"], ["--adm", "adm-s3cret"]])
def test_the_admin_key_in_extra_args_is_refused_without_its_value(words):
    errors, _ = serve.check({"name": "a", "model_path": "/m", "extra_args": words}, {})
    [error] = errors
    assert error.startswith("rigbook_serve[0].extra_args[0]: " + words[0].split("=")[0])
    assert "never put the admin API key on the command line" in error and "set admin_api_key_file" in error
    assert "adm-s3cret" not in error


def test_a_config_file_of_its_own_clashes_with_the_admin_key_too():
    errors, _ = serve.check({"name": "a", "model_path": "/m", "admin_api_key_file": "/k",
                             "extra_args": ["--config", "/etc/x.yaml"]}, {})
    assert [e.split(":")[0] for e in errors] == ["rigbook_serve[0].extra_args[0]"] and "one --config" in errors[0]


def test_a_newline_in_the_admin_key_file_is_refused_on_the_box_too():
    errors, _ = serve.check({"name": "a", "model_path": "/m", "admin_api_key_file": "/k\nExecStartPre=+/x"}, {})
    assert errors and errors[0].startswith("rigbook_serve[0].admin_api_key_file: ")


@pytest.mark.parametrize("spelling", [["--admin-api-key", "adm-s3cret"], ["--admin-api-key=adm-s3cret"],
                                      ["--admin-api", "adm-s3cret"]])
def test_an_admin_key_on_the_command_line_is_never_copied_or_shown(spelling):
    argv = [*ENGINE, "--model-path", "/srv/models/m", *spelling]
    profile, notes = serve.profile_from_argv(serve.engine_args(argv), "keyed")
    assert "adm-s3cret" not in repr(profile) + repr(notes)
    assert profile == {"name": "keyed", "model_path": "/srv/models/m"}
    assert len(notes) == 1 and "admin API key" in notes[0] and "set admin_api_key_file" in notes[0]
    assert "adm-s3cret" not in serve.redacted_argv(argv) and "********" in " ".join(serve.redacted_argv(argv))


KEY_LOG_PATCH = {"name": "api-key-out-of-logs.patch", "sha256": "a" * 64}


@pytest.mark.parametrize("profiles, pin, refused", [
    ([{"name": "a", "api_key_file": "/k"}], {"patches": []}, ["rigbook_serve[0].api_key_file"]),
    ([{"name": "a", "api_key_file": "/k"}], {}, ["rigbook_serve[0].api_key_file"]),
    ([{"name": "a"}, {"name": "b", "api_key_file": "/k", "admin_api_key_file": "/j"}], None,
     ["rigbook_serve[1].api_key_file", "rigbook_serve[1].admin_api_key_file"]),
    ([{"name": "a", "api_key_file": "/k"}], {"patches": [KEY_LOG_PATCH]}, []),
    ([{"name": "a", "api_key_file": "/k"}], {"patches": [{"path": "/srv/p/api-key-out-of-logs.patch",
                                                          "sha256": "b" * 64}]}, []),
    ([{"name": "a", "api_key_file": "/k", "key_may_reach_journal": True}], {"patches": []}, []),
    ([{"name": "a", "api_key_file": "/k", "key_may_reach_journal": "yes"}], {"patches": []},
     ["rigbook_serve[0].api_key_file"]),  # only an explicit true
    ([{"name": "a"}], {"patches": []}, []),
])
def test_a_key_is_refused_where_sglang_would_log_it(profiles, pin, refused):
    found = serve.key_log_problems(profiles, pin, "c" * 64)
    assert [where for where, _ in found] == refused
    for _where, why in found:
        assert f"add {{name: api-key-out-of-logs.patch, sha256: {'c' * 64}}} to rigbook_pins.sglang.patches" in why


def test_lab_serve_profiles_point_the_stand_in_at_the_evidence_root():
    root = yaml.safe_load((REPO / "inventory" / "lab" / "group_vars" / "lab.yml").read_text())["rigbook_evidence_root"]
    ports = []
    for rel in (G3080, G9700):
        profile = _seed(rel, "lab")
        assert profile["env"]["RIGBOOK_EVIDENCE_ROOT"] == root
        assert (profile["model_path"], profile["served_model_name"], profile["tp_size"]) == (
            "/srv/models/standin-model", "standin", 2)
        ports.append(profile["port"])
    assert len(set(ports)) == 2  # the lab's hosts share this machine's network: one port each
    for rel in (G3080, G9700):
        profile = _seed(rel, "lab")
        assert (profile["context_length"], profile["max_total_tokens"], profile["startup_timeout_s"]) == (
            32768, 30000, 60)
    assert _seed(G3080, "lab")["custom_all_reduce"] is False
    assert "--disable-custom-all-reduce" in serve.engine_argv(_seed(G3080, "lab"), ENGINE)


# --- the preflight action: the same checks, the same words ----------------------------------------------------------

def test_action_findings_match_the_cli():
    merged = {**yaml.safe_load((REPO / "inventory" / "homelab" / G3080).read_text())}
    merged["rigbook_serve"][0]["tp_size"] = 3
    merged["rigbook_serve"][0]["bind"] = "0.0.0.0"
    problems, warnings = host_model_action.findings(merged)
    assert [where for where, _ in problems] == ["rigbook_serve[0].tp_size", "rigbook_serve[0].bind"]
    assert warnings == []
    assert host_model_action.check(merged) == problems


def test_the_preflight_action_refuses_a_key_that_sglang_would_log_as_the_cli_does():
    merged = {**yaml.safe_load((REPO / "inventory" / "homelab" / G3080).read_text())}
    merged["rigbook_serve"][0]["api_key_file"] = "/etc/rigbook/api-key"
    problems, _warnings = host_model_action.findings(merged)
    assert [where for where, _ in problems] == ["rigbook_serve[0].api_key_file"]
    assert "the API key included, to the journal" in problems[0][1]
    merged["rigbook_serve"][0]["key_may_reach_journal"] = True  # the owner accepts it, in writing
    assert host_model_action.findings(merged)[0] == []


def test_action_task_fails_on_errors_and_shows_warnings(tmp_path):
    inv = _copy(tmp_path)
    _set_serve(inv, G3080, _field("tp_size", 4))
    _set_serve(inv, G9700, _field("bind", "0.0.0.0"))
    play = tmp_path / "play.yml"
    play.write_text("- hosts: all\n  gather_facts: false\n  tasks:\n    - rigbook.homelab.host_model:\n")
    env = {**os.environ, "ANSIBLE_COLLECTIONS_PATH": str(paths.link_collection()), "ANSIBLE_NOCOLOR": "1"}
    proc = subprocess.run([str(BIN / "ansible-playbook"), "-i", str(inv), str(play), "--check"],
                          capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out
    assert "rig-3080: the rigbook_* variables are invalid (1 problem" in out
    assert "rigbook_serve[0].tp_size: 4, but the box has 2 GPUs" in out
    assert "rig-r9700: the rigbook_* variables are invalid (1 problem" in out
    assert "rigbook_serve[0].bind: 0.0.0.0 without api_key_file" in out
    assert "unreachable=0" in out


@pytest.mark.parametrize("bind, exposed", [("127.0.0.1", False), ("127.0.12.1", False), ("localhost", False),
                                           ("::1", False), ("0.0.0.0", True), ("192.0.2.7", True), ("::", True),
                                           ("rig.lan.invalid", True)])
def test_only_loopback_binds_go_without_a_key(bind, exposed):
    profile = {"name": "a", "model_path": "/m", "bind": bind}
    errors, _warnings = serve.check(profile, {}, 0)
    assert any(m.startswith("rigbook_serve[0].bind: ") for m in errors) is exposed, errors


def test_normalize_fills_every_default_and_names_the_unit():
    (profile,), errors = serve.normalize_all([{"name": "qwen", "model_path": "/srv/m", "startup_timeout_s": 120}])
    assert errors == [] and profile["unit"] == "rigbook-serve-qwen.service" and profile["bind"] == "127.0.0.1"
    assert profile["port"] == 30000 and profile["startup_timeout_s"] == 120 and profile["api_key_file"] is None
    assert profile["model_path"] == "/srv/m" and profile["env"] == {} and profile["tp_size"] is None
    assert serve.unit_name("qwen") == "rigbook-serve-qwen.service"


def test_normalize_names_the_key_it_cannot_read():
    assert serve.normalize_all([{"name": "a", "port": "http"}], "serve")[1] == [
        "serve[0].port: 'http' is not a port number (1-65535)"]
    assert "not a port number" in serve.normalize_all([{"name": "a", "port": 70000}])[1][0]
    assert "not a positive number" in serve.normalize_all([{"name": "a", "startup_timeout_s": -1}])[1][0]
    assert "rigbook_serve[0].name: 'Qwen 27B' is not a profile name" in serve.normalize_all(
        [{"name": "Qwen 27B"}])[1][0]
    assert serve.normalize_all("qwen")[1] == ["rigbook_serve: a list of serve profiles, got 'qwen'"]
    assert serve.normalize_all(None) == ([], [])


def test_control_characters_are_refused_on_the_box_too():
    """serve_units runs check_all on the box: a value with a newline never reaches the unit file there either."""
    errors, _ = serve.check_all([{"name": "q", "model_path": "/srv/m", "served_model_name": "a\tb",
                                  "extra_args": ["--x=1\n[Service]"], "env": {"A": "1\r"}}], {})
    assert [e.split(":")[0] for e in errors] == ["rigbook_serve[0].served_model_name", "rigbook_serve[0].extra_args[0]",
                                                 "rigbook_serve[0].env.A"]
    assert all("contains a control character" in e for e in errors)


# --- a running engine's command line back to a profile (provision adopt) ------------------------------------------

def _lab_profile(group: str) -> dict:
    return yaml.safe_load((REPO / "inventory/lab" / group).read_text())["rigbook_serve"][0]


@pytest.mark.parametrize("group", [G3080, G9700])
def test_the_engine_argv_of_a_profile_reads_back_as_that_profile(group):
    written = dict(_lab_profile(group), custom_all_reduce=False, bind="127.0.11.2",
                   speculative={"algorithm": "EAGLE", "draft_model_path": "/srv/models/draft", "num_steps": 3})
    args = serve.engine_args(serve.engine_argv(written, ENGINE))
    profile, notes = serve.profile_from_argv(args, written["name"])
    fields = ("name", "model_path", "served_model_name", "tp_size", "mem_fraction_static", "context_length",
              "max_total_tokens", "bind", "port", "custom_all_reduce", "speculative")
    assert profile == {k: written[k] for k in fields if k in written} and notes == []


def test_seed_000s_command_line_by_hand_abbreviations_equals_signs_and_unknown_flags():
    """As a seed author starts it from a shell (reconstructed from seed 000's write-up: 185K context, a 15 GB
    hierarchical cache, 4 running requests): abbreviated flags (argparse reads unique prefixes), --flag=value, flags
    the schema has no field for (kept in extra_args as given, each named)."""
    argv = ["/home/u/venv/bin/python3", "-m", "sglang.launch_server", "--model", "/srv/models/qwen3.8-27b",
            "--tp", "2", "--mem-fraction-static=0.88", "--context-len", "185000", "--host", "0.0.0.0",
            "--port=30000", "--enable-hierarchical-cache", "--hicache-size", "15", "--max-running-requests", "4",
            "--disable-custom-all-reduce"]
    profile, notes = serve.profile_from_argv(serve.engine_args(argv), "main")
    assert profile == {"name": "main", "model_path": "/srv/models/qwen3.8-27b", "tp_size": 2,
                       "mem_fraction_static": 0.88, "context_length": 185000, "bind": "0.0.0.0", "port": 30000,
                       "custom_all_reduce": False,
                       "extra_args": ["--enable-hierarchical-cache", "--hicache-size", "15",
                                      "--max-running-requests", "4"]}
    assert notes == ["extra_args: --enable-hierarchical-cache (no profile field sets it)",
                     "extra_args: --hicache-size (no profile field sets it)",
                     "extra_args: --max-running-requests (no profile field sets it)"]


@pytest.mark.parametrize("spelling", [["--api-key", "sk-the-key"], ["--api-key=sk-the-key"],
                                      ["--api-ke", "sk-the-key"]])
def test_an_api_key_on_the_command_line_is_never_copied(spelling):
    argv = [*ENGINE, "--model-path", "/srv/models/m", *spelling]
    profile, notes = serve.profile_from_argv(serve.engine_args(argv), "keyed")
    assert "sk-the-key" not in repr(profile) + repr(notes)
    assert profile == {"name": "keyed", "model_path": "/srv/models/m"}
    assert len(notes) == 1 and "was not copied" in notes[0] and "api_key_file" in notes[0]


@pytest.mark.parametrize("argv", [["/usr/bin/python3", "-m", "http.server"], ["sglang.launch_server"], [], None,
                                  ["/usr/bin/python3", "-m"]])
def test_a_process_that_is_not_an_engine_has_no_engine_args(argv):
    assert serve.engine_args(argv) is None


def test_a_value_that_does_not_parse_is_kept_as_text_for_the_schema_to_name():
    profile, _ = serve.profile_from_argv(["--model-path", "/m", "--tp-size", "two", "--port", "80a"], "x")
    assert profile["tp_size"] == "two" and profile["port"] == "80a"


STANDIN = ["/usr/bin/python3", "/var/cache/rigbook/artifacts/sglang-standin.py"]


@pytest.mark.parametrize("interpreter", ["/usr/bin/python3", "/opt/sglang/bin/python"])
def test_a_process_started_by_the_inventorys_engine_command_is_an_engine_whatever_its_interpreter(interpreter):
    argv = [interpreter, STANDIN[1], "--model-path", "/m", "--tp-size", "2"]
    assert serve.engine_args(argv, STANDIN) == ["--model-path", "/m", "--tp-size", "2"]
    assert serve.engine_args(argv) is None
    assert serve.engine_args([interpreter, "/other.py", "--model-path", "/m"], STANDIN) is None
    assert serve.engine_args(["/usr/bin/python3", "-m", "x"], ["/usr/bin/python3", "-m"]) is None
