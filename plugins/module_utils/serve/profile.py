# -*- coding: utf-8 -*-
# Copyright: rigbook developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A serve profile (one item of rigbook_serve) as data: the engine's command line, and the traps it must avoid.

Pure; standard library only; no imports from the collection, so the controller can load this file by path.

- engine_argv(profile, engine): the engine's argv in SGLang's flag spelling, deterministic (a unit file built
  from it is stable), never with the API key or the admin API key (api_key_args: the engine reads them from one
  file, api_key_config).
- check(profile, host, index) / check_all(profiles, host): (errors, warnings), lists of "key path: why". HOST is
  what is known about the box: gpu_count, vendor, p2p_expected (inventory: rigbook_gpu, rigbook_p2p), and, only
  on the box itself, default_target, display_manager_enabled, mem_total_bytes (MemTotal of /proc/meminfo),
  model_path_exists, draft_model_path_exists, quantization_param_path_exists. A key is absent when it is not
  known, and its checks are skipped.
- extra_value(profile, flag): the value the engine reads for an extra_args flag (the one reading of a flag that no
  profile field owns).
- key_log_problems(profiles, sglang_pin): the profiles whose keys SGLang would write to the journal at every start,
  as the host's SGLang pin lacks KEY_LOG_PATCH (refused unless the profile sets key_may_reach_journal: true).

The profile is assumed to have passed meta/host_vars.schema.json; a value of the wrong type is skipped, never a
traceback.
"""

from __future__ import annotations

import ipaddress
import json
import re

DEFAULT_PORT = 30000
DEFAULT_BIND = "127.0.0.1"
DEFAULT_STARTUP_TIMEOUT_S = 900
# The systemd unit of a serve profile: the one spelling of its name (serve_units writes it, the serving layer reads it).
UNIT_PREFIX = "rigbook-serve-"
UNIT_TEMPLATE = UNIT_PREFIX + "{name}.service"
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9-]*$")
# Seed 000: a desktop holds ~80 MB of GPU0; 0.90 OOMs in warm-up, 0.88 works.
DESKTOP_SAFE_MEM_FRACTION = 0.88
# Seed 000 (a hybrid Mamba model): --max-total-tokens 200000 at --context-length 200000 left the Mamba pool no room,
# and two 32K prefills at once hit "Can not alloc mamba cache" and killed the scheduler; 185000 held. The share that
# held, 185000/200000 = 0.925 (15000 tokens, 7.5% headroom), is the most a hybrid model's pool is given without a
# warning: nothing between 185000 and 200000 was measured. Kept as the seed's two numbers, compared in integers.
MAMBA_POOL_HELD = (185000, 200000)
# Flags only a hybrid (Mamba) model's engine takes: SGLang's --mamba-ssm-dtype, --mamba-full-memory-ratio,
# --mamba-radix-cache-strategy (seed 000's fork), ... and --max-mamba-cache-size.
HYBRID_FLAG_PREFIX = "--mamba-"
HYBRID_FLAGS = frozenset(("--max-mamba-cache-size",))
# Seed 000: --max-running-requests 2 with two long prefills at once crashed; 4 did not (odd, but measured; the
# write-up runs 4 since).
MAX_RUNNING_REQUESTS_FLAG = "--max-running-requests"
MIN_RUNNING_REQUESTS = 4
# The FP8 KV cache scales file (seed 000: per-head scales calibrated for its model at TP 2).
KV_SCALES_FLAG = "--quantization-param-path"
# The hierarchical cache's host pool: --hicache-size GB (10^9 bytes, SGLang's HostKVCache: host_size * 1e9) for each
# tensor-parallel rank, pinned host memory. Only with --enable-hierarchical-cache.
HICACHE_FLAG = "--enable-hierarchical-cache"
HICACHE_SIZE_FLAG = "--hicache-size"
# What the OS and everything else on the box keep of its RAM beside the host pools: 10 GiB, the reserve SGLang's own
# start-up check leaves free (HICACHE_HOST_MEMORY_RESERVE_BYTES, python/sglang/srt/mem_cache/pool_host/base.py). It
# is the same reserve on purpose: the engine refuses a pool that leaves less of the *available* memory when it
# starts, i.e. after the unit was restarted and the old engine is gone; refusing it here, before anything restarts,
# against MemTotal (which is never less than what is available) refuses nothing the engine would take. Seed 000 ran
# 15 GB a rank at TP 2 (30 GB) on a 62 GB box, and its write-up lists host layers of 9.5 (main KV) + 2.96 (draft KV)
# + 5.5 GB (Mamba): the draft and Mamba host pools may come on top, so ranks x --hicache-size is the least the
# engine pins and this check a floor, not a fit.
HOST_RESERVE_BYTES = 10 * 1024 ** 3
# The API key reaches the engine as a file, never as a word of its argv or its environment: the serve role writes a
# root-only YAML file holding it, the unit hands that file to the engine as a systemd credential (LoadCredential=,
# under this name in the unit's credentials directory, %d) and the engine reads it with `--config FILE.yaml`
# (SGLang's prepare_server_args merges the mapping's keys as flags, the command line winning). The admin API key
# (--admin-api-key, SGLang's admin endpoints) goes the same way, in the same file (SGLang takes one --config).
API_KEY_CREDENTIAL = "api-key.yaml"
# The profile fields naming a root-only file that holds a secret, and the engine flag each stands for.
SECRET_FILES = (("api_key_file", "--api-key"), ("admin_api_key_file", "--admin-api-key"))
SECRET_FIELDS = frozenset(field for field, _ in SECRET_FILES)
# SGLang logs its resolved arguments at every start, the keys included, to the journal (root and the adm group read
# it). The sglang role's patch (roles/sglang/files/patches/, made for 0.5.23) keeps them out; a profile with a key on
# a host whose SGLang pin does not apply it is refused, unless the profile accepts the journal with this field.
KEY_LOG_PATCH = "api-key-out-of-logs.patch"
KEY_MAY_REACH_JOURNAL = "key_may_reach_journal"
CONFIG_FLAG = "--config"
DISABLE_CUSTOM_ALL_REDUCE = "--disable-custom-all-reduce"
# Algorithms that draft with a separate model; NEXTN (a model's own MTP head) and NGRAM need none.
NEEDS_DRAFT_MODEL = frozenset(("EAGLE", "EAGLE3", "STANDALONE", "DFLASH"))
LOOPBACK_NAMES = frozenset(("localhost",))

# (profile field, engine flag), in argv order.
FIELD_FLAGS = (
    ("model_path", "--model-path"),
    ("served_model_name", "--served-model-name"),
    ("tp_size", "--tp-size"),
    ("mem_fraction_static", "--mem-fraction-static"),
    ("context_length", "--context-length"),
    ("max_total_tokens", "--max-total-tokens"),
)
SPECULATIVE_FLAGS = (
    ("algorithm", "--speculative-algorithm"),
    ("draft_model_path", "--speculative-draft-model-path"),
    ("num_steps", "--speculative-num-steps"),
    ("eagle_topk", "--speculative-eagle-topk"),
    ("num_draft_tokens", "--speculative-num-draft-tokens"),
    ("draft_kv_cache_dtype", "--speculative-draft-kv-cache-dtype"),
)


def _owned_flags():
    """{engine flag (and its aliases): the profile field that sets it} for extra_args."""
    owned = {flag: field for field, flag in FIELD_FLAGS}
    owned.update({flag: "speculative.%s" % field for field, flag in SPECULATIVE_FLAGS})
    owned.update({
        "--model": "model_path",
        "--tp": "tp_size",
        "--tensor-parallel-size": "tp_size",
        "--speculative-algo": "speculative.algorithm",
        "--speculative-draft": "speculative.draft_model_path",
        "--speculative-draft-model": "speculative.draft_model_path",
        DISABLE_CUSTOM_ALL_REDUCE: "custom_all_reduce",
        "--host": "bind",
        "--port": "port",
    })
    owned.update(dict((flag, field) for field, flag in SECRET_FILES))
    return owned


OWNED_FLAGS = _owned_flags()


# --- the command line ---------------------------------------------------------------------------------------------

def _text(value):
    """A flag value as the engine reads it: 0.88 -> "0.88", 2 -> "2"."""
    if isinstance(value, float):
        return repr(value)
    return str(value)


def _flag_pairs(values, table):
    argv = []
    for field, flag in table:
        if values.get(field) is not None:
            argv += [flag, _text(values[field])]
    return argv


def engine_argv(profile, engine):
    """ENGINE (the command prefix, e.g. [venv/bin/python, -m, sglang.launch_server]) + the profile's flags: the
    fields in FIELD_FLAGS order, the speculative ones, --disable-custom-all-reduce when custom_all_reduce is false,
    --host and --port (defaults 127.0.0.1, 30000), then extra_args as given. Never a key (api_key_args).

    Raises ValueError naming the problem for a profile without model_path or an engine that is not a list of str."""
    if not isinstance(profile, dict) or not isinstance(profile.get("model_path"), str) or not profile["model_path"]:
        raise ValueError("a serve profile needs model_path (a mapping with model_path: /srv/models/...)")
    if not isinstance(engine, (list, tuple)) or not engine or not all(isinstance(p, str) for p in engine):
        raise ValueError("the engine command must be a non-empty list of strings, got %r" % (engine,))
    argv = list(engine) + _flag_pairs(profile, FIELD_FLAGS)
    speculative = profile.get("speculative")
    if isinstance(speculative, dict):
        argv += _flag_pairs(speculative, SPECULATIVE_FLAGS)
    if profile.get("custom_all_reduce") is False:
        argv.append(DISABLE_CUSTOM_ALL_REDUCE)
    argv += ["--host", str(profile.get("bind") or DEFAULT_BIND), "--port", _text(profile.get("port") or DEFAULT_PORT)]
    argv += [str(arg) for arg in profile.get("extra_args") or []]
    return argv


def has_secret(profile):
    """Whether the profile names a key file (api_key_file or admin_api_key_file)."""
    return isinstance(profile, dict) and any(profile.get(field) for field, _ in SECRET_FILES)


def api_key_args(profile):
    """["--config", "%d/api-key.yaml"] when the profile has api_key_file or admin_api_key_file, else []: %d is
    systemd's specifier for the unit's credentials directory, where LoadCredential= puts the root-only key file
    (api_key_config), so no key is ever in the unit, the argv or the engine's environment."""
    if has_secret(profile):
        return [CONFIG_FLAG, "%d/" + API_KEY_CREDENTIAL]
    return []


def api_key_config(key, name=None, admin_key=None):
    """The text of the keys' config file for the engine's --config: one YAML mapping, `api-key: "KEY"` and/or
    `admin-api-key: "ADMIN_KEY"` (SGLang turns each key into the flag --KEY, so the flag's spelling, not the field's;
    each value JSON-quoted, which YAML reads as the same string whatever it looks like: digits, true, a leading `*`
    or `#`)."""
    head = "# Managed by rigbook (serve role)%s: the engine's API key, handed to it by systemd (LoadCredential=).\n" % (
        "" if name is None else ", serve profile %s" % name)
    lines = [("api-key", key), ("admin-api-key", admin_key)]
    return head + "".join("%s: %s\n" % (flag, json.dumps(str(value))) for flag, value in lines if value)


def port_of(profile):
    return profile.get("port") or DEFAULT_PORT


def unit_name(name, template=UNIT_TEMPLATE):
    """The systemd unit of the serve profile NAME."""
    return (template or UNIT_TEMPLATE).replace("{name}", str(name))


def normalize(raw, index=0, where="rigbook_serve"):
    """(profile, error): one rigbook_serve item with every default filled in - the one reading of a serve profile.

    The profile keeps every key it was given and gets: unit (its systemd unit), bind, port, startup_timeout_s,
    api_key_file and admin_api_key_file (None without one), served_model_name (None), tp_size (None when unset), env
    ({}). ERROR names the
    key path that cannot be read (a name that is no unit name, a port or timeout that is no number); the profile is
    None then."""
    at = "%s[%d]" % (where, index)
    if not isinstance(raw, dict):
        return None, "%s: a serve profile is a mapping (name, model_path, port, ...), got %r" % (at, raw)
    name = raw.get("name")
    if not isinstance(name, str) or not NAME_RE.match(name):
        return None, "%s.name: %r is not a profile name (lowercase letters, digits, -)" % (at, name)
    port = raw.get("port", DEFAULT_PORT)
    if isinstance(port, str) and port.isdigit():
        port = int(port)
    if _int(port) is None or not 1 <= port <= 65535:
        return None, "%s.port: %r is not a port number (1-65535)" % (at, port)
    timeout = raw.get("startup_timeout_s", DEFAULT_STARTUP_TIMEOUT_S)
    if _number(timeout) is None or timeout <= 0:
        return None, "%s.startup_timeout_s: %r is not a positive number of seconds" % (at, timeout)
    size = raw.get("tp_size")
    if size is not None and _int(size) is None:
        return None, "%s.tp_size: %r is not an integer" % (at, size)
    profile = dict(raw)
    profile.update({
        "name": name,
        "unit": str(raw.get("unit") or unit_name(name)),
        "bind": str(raw.get("bind") or DEFAULT_BIND),
        "port": port,
        "startup_timeout_s": timeout,
        "api_key_file": raw.get("api_key_file") or None,
        "admin_api_key_file": raw.get("admin_api_key_file") or None,
        "served_model_name": raw.get("served_model_name") or None,
        "tp_size": size,
        "env": dict(raw.get("env") or {}) if isinstance(raw.get("env"), dict) else {},
    })
    return profile, None


def normalize_all(raws, where="rigbook_serve"):
    """(profiles, errors) of a rigbook_serve list (None: none)."""
    if raws is None:
        return [], []
    if not isinstance(raws, list):
        return [], ["%s: a list of serve profiles, got %r" % (where, raws)]
    profiles, errors = [], []
    for index, raw in enumerate(raws):
        profile, error = normalize(raw, index, where)
        if error:
            errors.append(error)
        else:
            profiles.append(profile)
    return profiles, errors


# --- the traps ------------------------------------------------------------------------------------------------------

def _int(value):
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _number(value):
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _extra_flags(profile):
    """[(index, flag)] of the extra_args that are flags (--name or --name=value)."""
    found = []
    for index, arg in enumerate(profile.get("extra_args") or []):
        if isinstance(arg, str) and arg.startswith("--"):
            found.append((index, arg.split("=", 1)[0]))
    return found


def tp_size(profile):
    return _int(profile.get("tp_size")) or 1


def custom_all_reduce_on(profile):
    """Whether the engine runs its custom all-reduce kernel: custom_all_reduce when set; absent, the engine's
    default, which is on for TP=2 over PCIe (SGLang assumes P2P works unless told with --enable-p2p-check:
    sgl-project/sglang docs/advanced_features/server_arguments.md), unless --disable-custom-all-reduce is in
    extra_args. Off at tp_size 1 (nothing to reduce)."""
    if tp_size(profile) < 2:
        return False
    if isinstance(profile.get("custom_all_reduce"), bool):
        return profile["custom_all_reduce"]
    return DISABLE_CUSTOM_ALL_REDUCE not in [flag for _, flag in _extra_flags(profile)]


def _tp_size_fits(profile, host, where):
    gpus = _int(host.get("gpu_count"))
    size = _int(profile.get("tp_size"))
    if gpus is None or size is None or size <= gpus:
        return []
    return [("error", "%s.tp_size" % where,
             "%d, but the box has %d GPU%s (rigbook_gpu.count): tensor parallelism puts one shard on each GPU, so "
             "the engine cannot start; set tp_size to at most %d" % (size, gpus, "" if gpus == 1 else "s", gpus))]


def _desktop_leaves_room(profile, host, where):
    fraction = _number(profile.get("mem_fraction_static"))
    graphical = host.get("default_target") == "graphical.target" or host.get("display_manager_enabled") is True
    if fraction is None or fraction <= DESKTOP_SAFE_MEM_FRACTION or not graphical:
        return []
    desktop = ("the default target is graphical.target" if host.get("default_target") == "graphical.target"
               else "a display manager is enabled")
    return [("warning", "%s.mem_fraction_static" % where,
             "%s while %s: seed 000 - a desktop holds ~80 MB of GPU0, 0.90 ran out of memory in warm-up and 0.88 "
             "works; set it to 0.88, or run `systemctl set-default multi-user.target` and reboot (stopping gdm on "
             "a live box panicked the NVIDIA driver and rebooted the machine)" % (_text(fraction), desktop))]


def _custom_all_reduce_needs_p2p(profile, host, where):
    if host.get("p2p_expected") is not False or not custom_all_reduce_on(profile):
        return []
    if isinstance(profile.get("custom_all_reduce"), bool):
        state = "true"
    else:
        state = ("not set, so the engine's default applies (custom all-reduce on at tp_size %d over PCIe)"
                 % tp_size(profile))
    return [("error", "%s.custom_all_reduce" % where,
             "%s, but this box has no working GPU P2P (rigbook_p2p.expected is false): the custom all-reduce kernel "
             "writes through peer mappings; over a broken or patched consumer P2P path it gave wrong results and "
             "hard resets (noonghunna/club-3090 #922, #1332); set custom_all_reduce: false (NCCL still does the "
             "all-reduce)" % state)]


def _custom_all_reduce_decided(profile, host, where):
    """NVIDIA, P2P expected, TP>=2, custom_all_reduce not set: the engine turns the kernel on unchecked."""
    if (host.get("vendor") != "nvidia" or host.get("p2p_expected") is not True or tp_size(profile) < 2
            or isinstance(profile.get("custom_all_reduce"), bool) or not custom_all_reduce_on(profile)):
        return []
    return [("warning", "%s.custom_all_reduce" % where,
             "not set: the engine turns its custom all-reduce on at tp_size %d over PCIe without checking P2P; on "
             "patched consumer cards it gave wrong results and hard resets (noonghunna/club-3090 #922, #1332); set "
             "custom_all_reduce: false, or true once a correctness A/B has passed on this box" % tp_size(profile))]


def _ipc_not_legacy(profile, host, where):
    env = profile.get("env")
    if host.get("vendor") != "amd" or not isinstance(env, dict):
        return []
    if str(env.get("HSA_ENABLE_IPC_MODE_LEGACY", "")).strip() != "1":
        return []
    return [("error", "%s.env.HSA_ENABLE_IPC_MODE_LEGACY" % where,
             "1 on an AMD box: legacy HIP IPC makes RCCL fall back to SHM instead of P2P/IPC (seed 004 serves with "
             "0 and must see `isAllDirectP2p 1` and `via P2P/IPC` in the engine's log); set it to \"0\"")]


def extra_value(profile, flag):
    """The value the engine reads for FLAG from extra_args: `FLAG value` or `FLAG=value`, the last one winning (as in
    argparse); None when FLAG is absent or has no value. FLAG is matched as written (not an abbreviation of it)."""
    args = profile.get("extra_args") if isinstance(profile, dict) else None
    value = None
    for index, arg in enumerate(args if isinstance(args, list) else []):
        if not isinstance(arg, str):
            continue
        given, eq, inline = arg.partition("=")
        if given != flag:
            continue
        following = args[index + 1] if index + 1 < len(args) else None
        if eq:
            value = inline
        elif isinstance(following, str) and not following.startswith("--"):
            value = following
        else:
            value = None
    return value


def _extra_index(profile, flag):
    """The index in extra_args of the last FLAG (`FLAG` or `FLAG=...`), for the key path; None without one."""
    found = [index for index, given in _extra_flags(profile) if given == flag]
    return found[-1] if found else None


def hybrid_flags(profile):
    """The extra_args flags that only a hybrid (Mamba) model's engine takes, in order; [] for any other model."""
    return [flag for _, flag in _extra_flags(profile) if flag.startswith(HYBRID_FLAG_PREFIX) or flag in HYBRID_FLAGS]


def _token_budget_below_context(profile, host, where):
    """The token pool against the context: an error at or above it (any model); for a hybrid model, a warning above
    seed 000's share that held (MAMBA_POOL_HELD)."""
    total = _int(profile.get("max_total_tokens"))
    context = _int(profile.get("context_length"))
    if total is None or context is None:
        return []
    if total >= context:
        return [("error", "%s.max_total_tokens" % where,
                 "%d is not below context_length %d: seed 000 pinned the pool at the full context (200000/200000) and "
                 "two long prefills at once hit the 'Can not alloc mamba cache' assert, which killed the scheduler; "
                 "185000 under 200000 is stable; set max_total_tokens below context_length" % (total, context))]
    held, full = MAMBA_POOL_HELD
    hybrid = hybrid_flags(profile)
    if not hybrid or total * full <= context * held:
        return []
    most = context * held // full
    return [("warning", "%s.max_total_tokens" % where,
             "%d leaves the Mamba pool %d tokens of context_length %d (%.1f%%) on a hybrid model (%s): seed 000 "
             "pinned 200000 of 200000 and two 32K prefills at once hit 'Can not alloc mamba cache', which killed "
             "the scheduler; 185000 held, i.e. 0.925 of the context (15000 tokens, 7.5%% headroom), and nothing "
             "between was measured; set max_total_tokens to at most %d (0.925 x %d)"
             % (total, context - total, context, 100.0 * (context - total) / context, ", ".join(hybrid), most,
                context))]


def _max_running_requests(profile, host, where):
    text = extra_value(profile, MAX_RUNNING_REQUESTS_FLAG)
    if text is None or not text.strip().isdigit() or int(text) >= MIN_RUNNING_REQUESTS:
        return []
    return [("warning", "%s.extra_args[%d]" % (where, _extra_index(profile, MAX_RUNNING_REQUESTS_FLAG)),
             "%s %s: seed 000 - with 2, two long prefills at once crashed the engine, with 4 they did not (odd, but "
             "measured, and 4 is what it runs since); set it to %d or more"
             % (MAX_RUNNING_REQUESTS_FLAG, text, MIN_RUNNING_REQUESTS))]


def _kv_scales_on_host(profile, host, where):
    path = extra_value(profile, KV_SCALES_FLAG)
    if path in (None, "", "None"):  # SGLang reads "" and "None" as no file (nullable_str)
        return []
    at = "%s.extra_args[%d]" % (where, _extra_index(profile, KV_SCALES_FLAG))
    if not path.startswith("/"):
        return [("error", at,
                 "%s %s is a relative path: the unit runs the engine without a shell from a working directory of its "
                 "own (seed 000 started it by hand next to scales/); set an absolute path" % (KV_SCALES_FLAG, path))]
    if host.get("quantization_param_path_exists") is not False:
        return []
    return [("error", at,
             "%s %s does not exist on the box: the engine does not stop for that, it logs the error and runs its FP8 "
             "KV cache with every scale at 1.0 (SGLang's kv_cache_scales_loader), a silent loss of quality; seed 000 "
             "serves FP8 KV with per-head scales calibrated for its model at TP 2; the unit is not (re)started; copy "
             "the scales file there or fix the path" % (KV_SCALES_FLAG, path))]


def _gib(size):
    return "%.1f GiB" % (size / 1024.0 ** 3)


def _hicache_fits_ram(profile, host, where):
    total = _int(host.get("mem_total_bytes"))
    text = extra_value(profile, HICACHE_SIZE_FLAG)
    if total is None or text is None or HICACHE_FLAG not in [flag for _, flag in _extra_flags(profile)]:
        return []
    try:
        size_gb = float(text)
    except ValueError:
        return []
    # 0 (the default): sized by --hicache-ratio from the GPU pool, unknown here; nan/inf: the engine refuses them
    if not 0 < size_gb < float("inf"):
        return []
    ranks = tp_size(profile)
    pinned = int(ranks * size_gb * 1e9)
    room = total - HOST_RESERVE_BYTES
    if pinned <= room:
        return []
    return [("error", "%s.extra_args[%d]" % (where, _extra_index(profile, HICACHE_SIZE_FLAG)),
             "%s %s is GB for each rank: %d rank%s pin %.1f GB (%s) of host memory, but the box has %s "
             "(MemTotal) and keeps %s for the OS and the engine's own processes (the reserve SGLang's own start-up "
             "check leaves), so at most %s is left; seed 000 ran 15 GB a rank at tp_size 2 (30 GB) on a 62 GB "
             "box; the engine finds out only once the unit has restarted (the old engine is gone by then); lower "
             "%s to at most %s"
             % (HICACHE_SIZE_FLAG, text, ranks, "" if ranks == 1 else "s", pinned / 1e9, _gib(pinned), _gib(total),
                _gib(HOST_RESERVE_BYTES), _gib(max(room, 0)), HICACHE_SIZE_FLAG,
                "%.1f" % (max(room, 0) // ranks // 10 ** 8 / 10.0)))]


def _model_on_host(profile, host, where):
    problems = []
    if host.get("model_path_exists") is False:
        problems.append(("error", "%s.model_path" % where,
                         "%s does not exist on the box: the unit is not (re)started; copy the model there or fix the "
                         "path" % profile.get("model_path")))
    speculative = profile.get("speculative")
    if host.get("draft_model_path_exists") is False and isinstance(speculative, dict):
        problems.append(("error", "%s.speculative.draft_model_path" % where,
                         "%s does not exist on the box: the unit is not (re)started; copy the draft model there or "
                         "fix the path" % speculative.get("draft_model_path")))
    return problems


def _draft_model_when_needed(profile, host, where):
    speculative = profile.get("speculative")
    if not isinstance(speculative, dict) or speculative.get("draft_model_path"):
        return []
    algorithm = str(speculative.get("algorithm") or "").upper()
    if algorithm not in NEEDS_DRAFT_MODEL:
        return []
    return [("error", "%s.speculative.draft_model_path" % where,
             "missing: speculative.algorithm %s drafts with a separate model (%s need one; NEXTN uses the model's "
             "own MTP head, NGRAM none); set speculative.draft_model_path"
             % (algorithm, ", ".join(sorted(NEEDS_DRAFT_MODEL))))]


def owned_flag(flag):
    """(the owned flag FLAG stands for, the profile field that owns it), or (None, None). The engine's argument
    parser (argparse) takes any unique prefix of a flag, so --hos is --host and --api-ke is --api-key: a prefix of
    an owned flag counts as that flag (the shortest owned flag it abbreviates is named)."""
    if flag in OWNED_FLAGS:
        return flag, OWNED_FLAGS[flag]
    if len(flag) > 3:
        longer = sorted((o for o in OWNED_FLAGS if o.startswith(flag)), key=len)
        if longer:
            return longer[0], OWNED_FLAGS[longer[0]]
    return None, None


# The type of each field an engine flag sets (what profile_from_argv turns a flag's text into).
INT_FIELDS = frozenset(("tp_size", "context_length", "max_total_tokens", "port", "speculative.num_steps",
                        "speculative.eagle_topk", "speculative.num_draft_tokens"))
FLOAT_FIELDS = frozenset(("mem_fraction_static",))
# Every way SGLang's server is started, each decided by engine_args: {python module: the subcommand words that
# follow it}: `python -m sglang.launch_server ARGS`, `python -m sglang.cli.main serve ARGS` (the console entry point
# sglang.cli.main:main); ENGINE_COMMANDS: {console script: subcommand words}, `sglang serve ARGS` as the kernel shows
# a console script started through its shebang: [<venv>/bin/python3, <venv>/bin/sglang, serve, ARGS...].
ENGINE_MODULES = {"sglang.launch_server": (), "sglang.cli.main": ("serve",)}
ENGINE_COMMANDS = {"sglang": ("serve",)}
PYTHON = re.compile(r"^python[0-9.]*$")
# Python's own options that take the next word as their value (-W ignore, -X dev, --check-hash-based-pycs always)
PYTHON_VALUE_OPTIONS = ("W", "X")


def _typed(field, text):
    """TEXT as FIELD holds it (int, float or str); the text itself where it does not parse (the schema names it)."""
    try:
        if field in INT_FIELDS:
            return int(text)
        if field in FLOAT_FIELDS:
            return float(text)
    except ValueError:
        pass
    return text


def _python_target(argv):
    """(module, None, the words after it) or (None, script, the words after it) of a Python command line ARGV
    (argv[0] an interpreter: python, python3, python3.12, a path to one), read as Python reads its options; None
    for another program, `-c` (a command string: multiprocessing's spawn workers and resource tracker) or nothing
    to run."""
    if not argv or not PYTHON.match(argv[0].rsplit("/", 1)[-1]):
        return None
    i = 1
    while i < len(argv):
        word = argv[i]
        if word == "--check-hash-based-pycs":
            i += 2
            continue
        if word == "--":
            return (None, argv[i + 1], argv[i + 2:]) if i + 1 < len(argv) else None
        if word == "-":
            return None  # the program on stdin
        if word.startswith("--"):
            i += 1  # --help, --version, ...
            continue
        if word.startswith("-"):
            cluster = word[1:]
            for at, flag in enumerate(cluster):
                rest = cluster[at + 1:]
                if flag == "c":
                    return None
                if flag == "m":
                    if rest:
                        return rest, None, argv[i + 1:]
                    return (argv[i + 1], None, argv[i + 2:]) if i + 1 < len(argv) else None
                if flag in PYTHON_VALUE_OPTIONS:
                    i += 0 if rest else 1
                    break
            i += 1
            continue
        return None, word, argv[i + 1:]
    return None


def _after(words, expected):
    """The words after EXPECTED (the subcommand words) at the start of WORDS, or None."""
    expected = list(expected)
    return words[len(expected):] if words[:len(expected)] == expected else None


def engine_args(argv, engine=None):
    """The engine's own arguments in a process's ARGV, or None when ARGV does not start an engine. The one place
    that decides what starts SGLang (ENGINE_MODULES, ENGINE_COMMANDS):
    - `python -m sglang.launch_server ARGS` and `python -m sglang.cli.main serve ARGS`;
    - the console command `sglang serve ARGS`: [<venv>/bin/python3, <venv>/bin/sglang, "serve", ARGS] as the kernel
      starts a script through its shebang, or `python3 /path/bin/sglang serve ARGS` typed as such;
    - a wrapper script that execs one of them: the process is then the exec'd command line, read as above (a shell
      that runs one without exec is a parent whose own command line, [bash, start.sh], starts no engine);
    - with ENGINE (the inventory's serve_engine argv, e.g. the lab's stand-in script), the words after ENGINE's own
      words past its interpreter (any interpreter: a box set up by hand runs it from a venv of its own).
    Python's -c (multiprocessing's spawn workers, its resource tracker) starts no engine, nor does a process that
    renamed itself (SGLang's schedulers: sglang::scheduler)."""
    argv = [a for a in argv or [] if isinstance(a, str)]
    own = [a for a in engine or [] if isinstance(a, str)][1:]
    if own and own != ["-m"] and argv[1:1 + len(own)] == own:
        return argv[1 + len(own):]
    target = _python_target(argv)
    if target is not None:
        module, script, rest = target
        if module is not None:
            return _after(rest, ENGINE_MODULES[module]) if module in ENGINE_MODULES else None
        name = script.rsplit("/", 1)[-1]
        return _after(rest, ENGINE_COMMANDS[name]) if name in ENGINE_COMMANDS else None
    name = argv[0].rsplit("/", 1)[-1] if argv else ""
    return _after(argv[1:], ENGINE_COMMANDS[name]) if name in ENGINE_COMMANDS else None


def redacted_argv(argv):
    """ARGV with the value of every key flag (--api-key, --admin-api-key, any spelling the engine reads as one)
    replaced by ********."""
    out, hide = [], False
    for word in argv or []:
        if hide and not word.startswith("--"):
            out.append("********")
            hide = False
            continue
        hide = False
        given, eq, _value = word.partition("=")
        if given.startswith("--") and owned_flag(given)[1] in SECRET_FIELDS:
            if eq:
                out.append(given + "=********")
                continue
            hide = True
        out.append(word)
    return out


def profile_from_argv(args, name):
    """(profile, notes) from the engine's own arguments ARGS (engine_args): each owned flag (an abbreviation too,
    as the engine's argparse reads it; `--flag=value` as well) becomes its profile field, typed;
    --disable-custom-all-reduce becomes custom_all_reduce: false; every other flag, with the words up to the next
    flag, goes to extra_args as given, each named in NOTES. An API key on the command line is never copied: NOTES
    says where it was and that the profile needs api_key_file instead."""
    profile, speculative, extra, notes = {"name": name}, {}, [], []
    i = 0
    while i < len(args):
        word = args[i]
        if not word.startswith("--"):
            extra.append(word)
            notes.append("extra_args: %r is not a flag (kept as given)" % word)
            i += 1
            continue
        given, eq, inline = word.partition("=")
        flag, field = owned_flag(given)
        values = [inline] if eq else []
        j = i + 1
        if not eq:
            while j < len(args) and not args[j].startswith("--"):
                values.append(args[j])
                j += 1
        if field == "custom_all_reduce":
            profile["custom_all_reduce"] = False
        elif field in SECRET_FIELDS:
            notes.append("%s: the %s is on the engine's command line (every user of the box can read it in "
                         "/proc); it was not copied: put it in a root-only file and set %s"
                         % (given, _secret_name(field), field))
        elif field is not None and len(values) == 1:
            target = speculative if field.startswith("speculative.") else profile
            target[field.split(".", 1)[-1]] = _typed(field, values[0])
        else:
            extra += [word] + ([] if eq else values)
            notes.append("extra_args: %s%s (no profile field sets it)"
                         % (given, "" if field is None else " with %d values" % len(values)))
        i = j
    if speculative:
        profile["speculative"] = speculative
    if extra:
        profile["extra_args"] = extra
    return profile, notes


def _secret_name(field):
    return "admin API key" if field == "admin_api_key_file" else "API key"


def _extra_args_not_owned(profile, host, where):
    problems = []
    for index, given in _extra_flags(profile):
        flag, field = owned_flag(given)
        if field is None:
            continue
        if flag != given:
            flag = "%s (the engine reads it as %s: its argument parser takes unique prefixes)" % (given, flag)
        if field in SECRET_FIELDS:
            why = ("never put the %s on the command line (ps, /proc and the unit file show it): set %s to a "
                   "root-only file holding it" % (_secret_name(field), field))
        else:
            why = "the profile field %s sets it; set %s instead of the flag" % (field, field)
        problems.append(("error", "%s.extra_args[%d]" % (where, index), "%s: %s" % (flag, why)))
    if has_secret(profile):
        for index, arg in enumerate(profile.get("extra_args") or []):
            if arg == CONFIG_FLAG:
                problems.append(("error", "%s.extra_args[%d]" % (where, index),
                                 "%s: with api_key_file or admin_api_key_file the engine reads its keys through its "
                                 "one %s file (SGLang takes only one); put those options in extra_args instead"
                                 % (arg, CONFIG_FLAG)))
    return problems


def _not_a_number(profile, host, where):
    """NaN passes every range check (each comparison is false) and would land in the unit: refused."""
    return [("error", "%s.%s" % (where, key), "%r is not a number the engine can use; set a finite value" % value)
            for key, value in sorted(profile.items()) if isinstance(value, float) and value != value]


def _control_characters(profile, host, where):
    """A newline or other control character in a value that reaches the unit file would write extra lines into it
    ([Service], ExecStartPre=+...): refused on the box too, whatever the controller checked."""
    values = [(key, profile.get(key)) for key in ("model_path", "served_model_name", "api_key_file",
                                                  "admin_api_key_file", "bind")]
    speculative = profile.get("speculative")
    if isinstance(speculative, dict):
        values.append(("speculative.draft_model_path", speculative.get("draft_model_path")))
    values += [("extra_args[%d]" % i, arg) for i, arg in enumerate(profile.get("extra_args") or [])]
    env = profile.get("env")
    values += [("env.%s" % key, value) for key, value in sorted(env.items())] if isinstance(env, dict) else []
    return [("error", "%s.%s" % (where, key), "%r contains a control character: it would write extra lines into the "
             "unit file; remove it" % value)
            for key, value in values if isinstance(value, str) and any(ord(c) < 32 or ord(c) == 127 for c in value)]


def is_loopback(bind):
    """Whether BIND is a loopback address (all of 127.0.0.0/8, ::1) or localhost: reachable from this host only."""
    if str(bind) in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(str(bind)).is_loopback
    except ValueError:
        return False


def _exposed_without_key(profile, host, where):
    bind = profile.get("bind") or DEFAULT_BIND
    if is_loopback(bind) or profile.get("api_key_file"):
        return []
    return [("error", "%s.bind" % where,
             "%s without api_key_file: anyone who reaches this address could use the engine; set api_key_file (a "
             "0600 file holding the key), or bind to 127.0.0.1" % bind)]


RULES = (
    _tp_size_fits,
    _desktop_leaves_room,
    _custom_all_reduce_needs_p2p,
    _custom_all_reduce_decided,
    _ipc_not_legacy,
    _token_budget_below_context,
    _max_running_requests,
    _model_on_host,
    _kv_scales_on_host,
    _hicache_fits_ram,
    _draft_model_when_needed,
    _extra_args_not_owned,
    _exposed_without_key,
    _control_characters,
    _not_a_number,
)


def _split(findings):
    errors = ["%s: %s" % (where, why) for kind, where, why in findings if kind == "error"]
    warnings = ["%s: %s" % (where, why) for kind, where, why in findings if kind == "warning"]
    return errors, warnings


def _findings(profile, host, where):
    if not isinstance(profile, dict):
        return [("error", where, "must be a mapping (name, model_path, ...), got %r" % (profile,))]
    found = []
    for rule in RULES:
        found += rule(profile, host, where)
    return found


def check(profile, host=None, index=0):
    """(errors, warnings) of one serve profile, the item INDEX of rigbook_serve, on a box described by HOST (see
    the module docstring). Each message starts with the key path, e.g. "rigbook_serve[0].tp_size: ...". A list
    PROFILE is checked whole (check_all)."""
    if isinstance(profile, list):
        return check_all(profile, host)
    return _split(_findings(profile, host or {}, "rigbook_serve[%d]" % index))


def _clashes(profiles, key, value_of, what):
    """Errors for each profile whose KEY (VALUE_OF it) an earlier profile already has."""
    findings = []
    first = {}
    for index, profile in enumerate(profiles):
        if not isinstance(profile, dict):
            continue
        value = value_of(profile)
        if value not in first:
            first[value] = index
            continue
        other = first[value]
        owner = "" if key == "name" else " (%s)" % profiles[other].get("name")
        findings.append(("error", "rigbook_serve[%d].%s" % (index, key),
                         "%s is also rigbook_serve[%d]'s %s%s: %s" % (_text(value), other, key, owner, what)))
    return findings


def _applies_key_log_patch(sglang_pin):
    patches = (sglang_pin or {}).get("patches") if isinstance(sglang_pin, dict) else None
    for patch in patches if isinstance(patches, list) else []:
        if isinstance(patch, dict) and KEY_LOG_PATCH in (patch.get("name"), str(patch.get("path") or "")
                                                         .rsplit("/", 1)[-1]):
            return True
    return False


def key_log_problems(profiles, sglang_pin, patch_sha256=None):
    """[(key path, why)] for each profile of PROFILES (rigbook_serve, in order) with api_key_file or
    admin_api_key_file on a host whose SGLang pin (rigbook_pins.sglang; its patches) does not apply KEY_LOG_PATCH
    (by name, or a path of that file name), unless the profile sets key_may_reach_journal: true. PATCH_SHA256: the
    patch file's sha256, written into the entry the message asks for."""
    if _applies_key_log_patch(sglang_pin):
        return []
    entry = "{name: %s, sha256: %s}" % (KEY_LOG_PATCH, patch_sha256 or "<sha256sum of roles/sglang/files/patches/%s>"
                                        % KEY_LOG_PATCH)
    found = []
    for index, profile in enumerate(profiles if isinstance(profiles, list) else []):
        if not isinstance(profile, dict) or profile.get(KEY_MAY_REACH_JOURNAL) is True:
            continue
        for field, _flag in SECRET_FILES:
            if profile.get(field):
                found.append(("rigbook_serve[%d].%s" % (index, field),
                              "SGLang logs its resolved arguments at every start, the %s included, to the journal "
                              "(readable by root and the adm group), and this host's SGLang pin does not apply the "
                              "patch that keeps it out; add %s to rigbook_pins.sglang.patches (made for SGLang "
                              "0.5.23: check that it applies to your pin), or set %s: true in this profile to accept "
                              "that the key reaches the journal" % (_secret_name(field), entry,
                                                                    KEY_MAY_REACH_JOURNAL)))
    return found


def check_all(profiles, host=None):
    """(errors, warnings) of the whole rigbook_serve list: each profile (check), then unique names (each is one
    unit) and unique ports (two engines cannot listen on one port; an absent port is 30000)."""
    if not isinstance(profiles, list):
        return ["rigbook_serve: must be a list of serve profiles, got %r" % (profiles,)], []
    found = []
    for index, profile in enumerate(profiles):
        found += _findings(profile, host or {}, "rigbook_serve[%d]" % index)
    found += _clashes(profiles, "name", lambda p: p.get("name"), "each profile is its own unit; rename one")
    found += _clashes(profiles, "port", port_of,
                      "two engines cannot listen on one port (an unset port is %d); give each its own port"
                      % DEFAULT_PORT)
    return _split(found)
