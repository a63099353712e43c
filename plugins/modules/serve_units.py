#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: rigbook developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

DOCUMENTATION = r"""
---
module: serve_units
short_description: One hardened systemd unit per serve profile, restarted only when it changed, then waited for
description:
  - Checks every profile of O(profiles) on the host first (the serve profile traps - tp size above the GPU count,
    custom all-reduce on a box without P2P, HSA_ENABLE_IPC_MODE_LEGACY=1, a token budget above the context, a model
    path or an FP8 KV scales file (C(--quantization-param-path)) missing here, hierarchical cache host pools
    (C(--hicache-size) per rank) that leave this box's RAM (MemTotal of /proc/meminfo) less than 10 GiB, a memory
    fraction above 0.88 with a desktop...); an error fails the task before anything is written or restarted.
  - Renders, per profile, C(rigbook-serve-<name>.service) (ExecStart built from the profile with no shell, the GPU
    environment file plus the profile's own root-only environment file C(<config_dir>/<name>.env) (mode 0600,
    as systemd reads it as root), an unprivileged user in video/render, Restart=on-failure with a start limit,
    TimeoutStartSec from the profile, LimitMEMLOCK, journald) and a sandbox that C(systemd-analyze security) rates 1.8
    (OK; 8.7 EXPOSED before) - no capabilities, ProtectSystem=strict with the home writable, ProtectHome (read-only
    when the model lies under /home), the kernel, clock, hostname, control groups and other users' processes
    protected, a system call deny list, RestrictAddressFamilies (AF_UNIX, AF_INET, AF_INET6, AF_NETLINK), UMask=0077,
    and DevicePolicy=closed with only the vendor's GPU nodes allowed (NVIDIA C(char-nvidia*), AMD C(char-kfd),
    C(char-drm)); what stays out and why (PrivateDevices hides the GPUs, MemoryDenyWriteExecute breaks the JIT,
    ...) is written in the unit.
  - With an API key file or an admin API key file, a root-only C(<config_dir>/<name>.key.yaml) (mode 0600, one YAML
    mapping of C(api-key) and C(admin-api-key) to the keys) that the unit hands to the engine as a systemd credential
    (C(LoadCredential=api-key.yaml:...)); the engine reads it with C(--config %d/api-key.yaml) (SGLang merges a
    --config YAML file's keys as flags, in-process). So no key is ever in the unit, any process's argv or
    environment, the task result or the diff. The key file of the older scheme
    (C(<name>.key.env), expanded into the argv) is removed, as is the key file of a profile that dropped its key.
    SGLang 0.5.23 logs its resolved arguments, the key included, at start; the sglang role's
    C(api-key-out-of-logs.patch) redacts it there; the failure message's journal lines are redacted here.
  - On an NVIDIA host, C(<modules_load_dir>/rigbook-serve.conf) loads nvidia-uvm at boot (and it is loaded now when
    the driver is but it is not), as the unit's device allow-list is made when it starts and the engine (no
    privileges) cannot load the module itself.
  - Units of profiles no longer listed are stopped, disabled and removed, with their files.
  - One C(systemctl show) reads every unit's state. Files are written only when their content differs;
    C(daemon-reload) only when a unit file changed; a unit is restarted only when its unit, environment or key file
    changed or O(restart) is set (a file whose mode or owner alone was wrong is fixed without a restart), started
    when it is not running, enabled for multi-user.target. A converged host restarts nothing.
  - After a (re)start it waits for readiness, as SGLang has no sd_notify - C(/health_generate) polled until 200 (at
    most one request per 2 s, the unit's state checked in between), then one real chat completion - within the
    profile's C(startup_timeout_s); on a timeout or a unit that failed it fails with the unit's last journal lines.
  - The API key goes with those requests only when the socket listening on the profile's address is held by
    processes of the unit's own control group (its C(ControlGroup); C(/proc/net/tcp), C(/proc/PID/fd),
    C(/proc/PID/cgroup)) - a local user who bound the port while the engine loaded gets no request, and the task
    fails with "a process outside UNIT listens on ADDRESS - the API key was not sent".
  - An engine started by hand (a box set up by hand, then adopted) that serves a profile's port and runs under no
    unit of rigbook's (read in C(/proc), a process of C(-m sglang.launch_server) or O(engine) and its C(--port)) is
    stopped (SIGTERM to its process group, SIGKILL after O(stop_timeout_s)) just before that profile's unit starts, so the
    engine restarts once, under its unit; check mode names it.
  - Supports check mode and diff mode.
version_added: "1.0.0"
author:
  - rigbook developers (!UNKNOWN)
options:
  profiles:
    description: The host model's serve profiles (C(rigbook_host.serve) - the C(rigbook_serve) items of
      meta/host_vars.schema.json with their unit, bind, port and C(startup_timeout_s) filled in, once, by the host model).
    type: list
    elements: dict
    required: true
  engine:
    description: The engine command prefix the profile's flags follow (e.g. C([<venv>/bin/python, -m,
      sglang.launch_server])).
    type: list
    elements: str
    required: true
  user:
    description: The unprivileged system user the engine runs as (made here, with its group, when absent).
    type: str
    default: rigbook-serve
  supplementary_groups:
    description: Its device groups.
    type: list
    elements: str
    default: [video, render]
  home:
    description: The user's writable home (SGLang, Triton and flashinfer caches live under ~/.cache).
    type: path
    default: /var/lib/rigbook-serve
  env_files:
    description: The GPU stack's environment files every unit reads first (e.g. C(/etc/rigbook/gpu.env)); each must
      exist.
    type: list
    elements: path
    default: []
  host:
    description: What the inventory says about the box for the profile checks (gpu_count, vendor, p2p_expected).
    type: dict
    default: {}
  unit_dir:
    description: Where the unit files go.
    type: path
    default: /etc/systemd/system
  config_dir:
    description: Where the profiles' environment and key files go.
    type: path
    default: /etc/rigbook/serve
  modules_load_dir:
    description: Where the NVIDIA host's modules-load.d file (nvidia-uvm) goes.
    type: path
    default: /etc/modules-load.d
  restart:
    description: Restart every unit even when nothing of it changed (the GPU stack it runs on changed).
    type: bool
    default: false
  wait:
    description: Wait for readiness after a (re)start.
    type: bool
    default: true
  stop_timeout_s:
    description: Seconds an engine started by hand is given to exit after SIGTERM before SIGKILL.
    type: int
    default: 60
extends_documentation_fragment:
  - rigbook.homelab.attributes.changes
"""

EXAMPLES = r"""
- name: The serve units
  rigbook.homelab.serve_units:
    profiles: "{{ rigbook_host.serve }}"
    engine: ["{{ rigbook_sglang_venv }}/bin/python", -m, sglang.launch_server]
    env_files: ["{{ rigbook_host.gpu_env_file }}"]
    host: "{{ rigbook_host.box_facts }}"
"""

RETURN = r"""
account:
  description: What of the service account (its groups, the user, its group membership, its home) was made.
  returned: always
  type: list
  elements: str
units:
  description: Per profile name - unit, changed (what changed of unit/env/key), restarted, started, enabled, ready_s,
    started_at, files_removed (old key files), modes_fixed (files whose mode or owner was fixed), stops_by_hand
    ([{pid, argv}] of engines started by hand on the profile's port, stopped (or to be) before its unit starts).
  returned: always
  type: dict
removed:
  description: Units of profiles no longer listed that were (or would be) removed.
  returned: always
  type: list
  elements: str
modules_load:
  description: On an NVIDIA host - file (the modules-load.d file), changed (written), load (nvidia-uvm loaded now);
    null elsewhere.
  returned: always
  type: dict
warnings_found:
  description: The profile checks' warnings (also shown as task warnings).
  returned: always
  type: list
  elements: str
"""

import os
import re
import signal
import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.rigbook.homelab.plugins.module_utils import account as service_account
from ansible_collections.rigbook.homelab.plugins.module_utils.collect import engine_processes
from ansible_collections.rigbook.homelab.plugins.module_utils.facts import api_key, files, runner, systemd
from ansible_collections.rigbook.homelab.plugins.module_utils.parse import sglang_log
from ansible_collections.rigbook.homelab.plugins.module_utils.serve import profile as serve_profile
from ansible_collections.rigbook.homelab.plugins.module_utils.serve import readiness

MARK = "# Managed by rigbook (serve role)"
PREFIX = serve_profile.UNIT_PREFIX
# The profile's API key for the engine's --config (root-only; the unit hands it over with LoadCredential=), and where
# rigbook kept it before (an EnvironmentFile= the engine's argv expanded: removed on converge).
KEY_SUFFIX = ".key.yaml"
OLD_KEY_SUFFIX = ".key.env"
_PLAIN = re.compile(r"^[A-Za-z0-9_@+=:,./-]+$")
# The box's RAM, for the hierarchical cache's host pools (serve/profile.py, _hicache_fits_ram).
MEMINFO = "/proc/meminfo"
# What one `systemctl show` reads of every unit (facts/systemd.py parses it).
SHOW_PROPERTIES = ("Id", "ActiveState", "SubState", "UnitFileState", "ExecMainStartTimestamp", "NRestarts", "Result",
                   "ControlGroup")
MEM_TOTAL = re.compile(r"^MemTotal:\s+(\d+)\s+kB\s*$", re.M)


def systemd_quote(arg, keep=()):
    """ARG as one word of an ExecStart= line: % and $ escaped (but not in the words of KEEP: a specifier or a
    reference systemd must expand), quoted when needed."""
    if arg in keep:
        return arg
    text = arg.replace("%", "%%").replace("$", "$$")
    if _PLAIN.match(text):
        return text
    return '"%s"' % text.replace("\\", "\\\\").replace('"', '\\"')


def unit_name(profile):
    return serve_profile.unit_name(profile["name"])


def env_text(profile):
    lines = ["%s: environment of serve profile %s (systemd EnvironmentFile= format)" % (MARK, profile["name"])]
    for key in sorted(profile.get("env") or {}):
        value = str(profile["env"][key])
        lines.append('%s="%s"' % (key, value.replace("\\", "\\\\").replace('"', '\\"')))
    return "\n".join(lines) + "\n"


# The GPU device nodes the engine opens, by vendor, as systemd device groups (names in /proc/devices, globbed):
# NVIDIA's nvidia-frontend or nvidia (/dev/nvidia0..N, /dev/nvidiactl, 195:*), nvidia-uvm (/dev/nvidia-uvm, CUDA's
# unified memory: a dynamic major), nvidia-caps and nvidia-nvlink; AMD's kfd (/dev/kfd, ROCm's compute queues) and drm
# (/dev/dri/renderD*, card*). A vendor not known here gets both lists.
DEVICE_GROUPS = {
    "nvidia": ("char-nvidia*",),
    "amd": ("char-kfd", "char-drm"),
}
# The module whose device group the allow-list needs when the unit starts: the list is fixed then, and NVIDIA's
# userspace loads nvidia-uvm only on demand, through the setuid nvidia-modprobe, which NoNewPrivileges= disarms.
NVIDIA_UVM = "nvidia-uvm"
MODULES_LOAD_FILE = "rigbook-serve.conf"
# The profile's env variables that name a directory the engine writes (caches moved out of HOME): writable too.
WRITABLE_ENV = re.compile(r"^(TMPDIR|.*_(HOME|CACHE|CACHE_DIR|CACHE_PATH|CACHE_ROOT|DB_PATH|WORKSPACE_BASE))$")
HOME_TREES = ("/home", "/root", "/run/user")

# The sandbox of every serve unit. `systemd-analyze security` rated the unit 8.7 (EXPOSED) with NoNewPrivileges,
# ProtectSystem=full and PrivateTmp alone; with these 1.8 (OK, `systemd-analyze security --offline=true`,
# systemd 252). Each line is what a GPU inference engine (PyTorch, Triton, NCCL/RCCL, SGLang's HTTP server and its
# ZMQ-connected ranks) still works with.
HARDENING = (
    "NoNewPrivileges=yes",
    # runs as an unprivileged user and needs no capability: LimitMEMLOCK= lifts the pinned-memory limit instead
    "CapabilityBoundingSet=",
    "AmbientCapabilities=",
    # the OS read-only; writable: the home (caches, ReadWritePaths= below), a private /tmp, and /dev/shm (NCCL's SHM
    # transport and PyTorch's shared tensors, left shared between the engine's own processes)
    "ProtectSystem=strict",
    "PrivateTmp=yes",
    "UMask=0077",
    "ProtectKernelTunables=yes",
    "ProtectKernelModules=yes",
    "ProtectKernelLogs=yes",
    "ProtectControlGroups=yes",
    "ProtectClock=yes",
    "ProtectHostname=yes",
    # other users' processes hidden; the engine's own ranks stay visible (SGLang kills its process tree with psutil)
    "ProtectProc=invisible",
    "PrivateMounts=yes",
    "RestrictSUIDSGID=yes",
    "RestrictNamespaces=yes",
    "RestrictRealtime=yes",
    "LockPersonality=yes",
    # AF_INET/AF_INET6: the API and the ranks' NCCL/Gloo bootstrap; AF_UNIX: SGLang's ZMQ ipc sockets, NCCL's cuMem
    # handle exchange, multiprocessing; AF_NETLINK: getifaddrs(), which NCCL and Gloo use to pick an interface
    "RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6 AF_NETLINK",
    "SystemCallArchitectures=native",
    # a filtered call fails with EPERM instead of killing the engine mid-request
    "SystemCallFilter=~@clock @cpu-emulation @module @mount @obsolete @privileged @raw-io @reboot @swap",
    "SystemCallErrorNumber=EPERM",
    # every device node closed but the standard pseudo devices and the GPU's (DeviceAllow= lines below)
    "DevicePolicy=closed",
)
# Left out on purpose, each one's reason (systemd-analyze security still counts them):
LEFT_OUT = (
    "PrivateDevices=yes: a private /dev without the GPU nodes (/dev/nvidia*, /dev/kfd, /dev/dri); DevicePolicy=closed "
    "with the GPU groups allowed is the allow-list instead",
    "MemoryDenyWriteExecute=yes: PyTorch, Triton and the CUDA/HIP drivers JIT-compile kernels into writable "
    "executable memory",
    "PrivateNetwork=yes, IPAddressDeny=: the engine serves over the network (the bind address decides who reaches "
    "it) and NCCL/Gloo bootstrap its ranks over the host's interface address, not only loopback",
    "SystemCallFilter=~@resources: NCCL and PyTorch pin threads and memory to the GPU's NUMA node "
    "(sched_setaffinity, set_mempolicy, mbind)",
    "SystemCallFilter=~@debug: PyTorch shares CUDA memory between the engine's processes with pidfd_getfd "
    "(expandable segments), and profilers use perf_event_open",
    "ProcSubset=pid: psutil and PyTorch read /proc/meminfo, /proc/stat and /proc/cpuinfo",
    "PrivateUsers=yes: the GPU nodes are reached through the video and render groups, which a user namespace leaves "
    "unmapped",
    "RemoveIPC=yes: every serve unit runs as the same user; stopping one would remove the others' POSIX shared "
    "memory (/dev/shm, NCCL's SHM transport)",
    "RestrictAddressFamilies= without AF_NETLINK: NCCL and Gloo choose their interface with getifaddrs(), which "
    "asks over netlink (AF_PACKET and the other families stay denied)",
)


def device_groups(vendor):
    """The DeviceAllow= groups of VENDOR's GPU nodes (both vendors' when VENDOR is not known)."""
    if vendor in DEVICE_GROUPS:
        return DEVICE_GROUPS[vendor]
    return tuple(g for groups in DEVICE_GROUPS.values() for g in groups)


def _under(path, trees):
    path = str(path or "")
    return any(path == tree or path.startswith(tree + "/") for tree in trees)


def _unit_path(path):
    """PATH as a word of a path-list setting (ReadWritePaths=): % doubled; None when it holds a space or quote."""
    if not path.startswith("/") or any(c.isspace() or c in "\"'\\:" for c in path):
        return None
    return path.replace("%", "%%")


def writable_paths(profile, p):
    """ReadWritePaths= words: the home, then the profile's env cache directories (prefixed -: absent is fine)."""
    words = [_unit_path(p["home"]) or p["home"]]
    env = profile.get("env") or {}
    for key in sorted(env):
        value = _unit_path(str(env[key]))
        if WRITABLE_ENV.match(key) and value and value != words[0]:
            words.append("-" + value)
    return words


def protect_home(profile, p):
    """yes: /home, /root, /run/user hidden; read-only when the model, the draft model, the engine or the home lies
    under one of them (a model under /home/USER is common)."""
    speculative = profile.get("speculative") or {}
    paths = [profile.get("model_path"), speculative.get("draft_model_path") if isinstance(speculative, dict) else None,
             p["engine"][0] if p["engine"] else None, p["home"]]
    return "read-only" if any(_under(path, HOME_TREES) for path in paths if path) else "yes"


def unit_text(profile, p, files):
    key_args = serve_profile.api_key_args(profile)
    argv = serve_profile.engine_argv(profile, p["engine"]) + key_args
    keep = tuple(a for a in key_args if a.startswith("%d/"))
    timeout = int(profile.get("startup_timeout_s") or serve_profile.DEFAULT_STARTUP_TIMEOUT_S)
    env_files = list(p["env_files"]) + [files["env"]]
    credential = (["LoadCredential=%s:%s" % (serve_profile.API_KEY_CREDENTIAL, files["key"])] if "key" in files
                  else [])
    vendor = (p.get("host") or {}).get("vendor")
    lines = [
        MARK + ": serve profile %s. Edit rigbook_serve in the inventory, not this file." % profile["name"],
        "[Unit]",
        # % starts a systemd specifier in Description= too: doubled
        "Description=rigbook serve %s (SGLang %s on port %s)" % (
            profile["name"], str(profile.get("served_model_name") or profile["model_path"]).replace("%", "%%"),
            serve_profile.port_of(profile)),
        "After=network-online.target systemd-modules-load.service",
        "Wants=network-online.target",
        # Restart=on-failure, but a crash loop stops after 5 starts in 10 minutes instead of hammering the GPUs
        "StartLimitIntervalSec=600",
        "StartLimitBurst=5",
        "",
        "[Service]",
        "Type=exec",
        "User=%s" % p["user"],
        "Group=%s" % p["user"],
        "SupplementaryGroups=%s" % " ".join(p["supplementary_groups"]),
        "WorkingDirectory=%s" % p["home"],
        "Environment=HOME=%s" % p["home"],
    ] + ["EnvironmentFile=%s" % path for path in env_files] + credential + [
        # the API key, if any, is no word of this line: the engine reads it from its credential (%d) with --config
        "ExecStart=%s" % " ".join(systemd_quote(a, keep) for a in argv),
        "Restart=on-failure",
        "RestartSec=10",
        # weights, KV pool and graph capture come before the port opens (SGLang's launch_server, http_server.py)
        "TimeoutStartSec=%d" % timeout,
        "TimeoutStopSec=120",
        "LimitMEMLOCK=infinity",
        "StandardOutput=journal",
        "StandardError=journal",
        "SyslogIdentifier=%s%s" % (PREFIX, profile["name"]),
        "",
        "# The sandbox (systemd-analyze security; roles/serve/README.md).",
    ] + list(HARDENING) + [
        "ReadWritePaths=%s" % " ".join(writable_paths(profile, p)),
        "ProtectHome=%s" % protect_home(profile, p),
    ] + ["DeviceAllow=%s rw" % group for group in device_groups(vendor)] + [
        "# Left out on purpose:",
    ] + ["# - %s" % why for why in LEFT_OUT] + [
        "",
        "[Install]",
        "WantedBy=multi-user.target",
    ]
    return "\n".join(lines) + "\n"


def read(path):
    """The text of the file at PATH as it is (not stripped), or None."""
    return files.read_text(path, strip=False)


def write(module, path, text, mode):
    """TEXT to PATH with MODE through the one atomic write (never through a link); fails the module when it cannot."""
    try:
        files.write_atomic(path, text, mode)
    except OSError as exc:
        module.fail_json(msg="cannot write %s: %s" % (path, getattr(exc, "strerror", None) or exc))


class Units(object):
    def __init__(self, module):
        self.module = module
        self.p = module.params
        self.notes = []  # what of the box could not be read for the profile checks: warnings

    def run(self, argv, check=True, timeout=None):
        """ARGV's runner.Result (facts/runner.py: LC_ALL=C, no pager); with CHECK a failure fails the module."""
        result = runner.run(argv, timeout=timeout)
        if check and result.rc != 0:
            detail = (result.stderr or result.stdout).strip() if result.rc is not None else result.error
            self.module.fail_json(msg="%s failed (rc %s): %s" % (" ".join(argv), result.rc, detail[-1500:]))
        return result

    def show(self, names):
        """{unit: {property: value}} of NAMES through one `systemctl show` (facts/systemd.py parses it)."""
        if not names:
            return {}
        result = self.run(systemd.show_argv(names, SHOW_PROPERTIES), timeout=systemd.TIMEOUT_S)
        return systemd.by_unit(result.stdout)

    def journal(self, unit, lines=30):
        result = self.run(["journalctl", "-u", unit, "-n", str(lines), "--no-pager", "-o", "cat"], check=False)
        return (result.stdout or result.stderr or result.error or "").strip()

    def host_facts(self, profiles):
        facts = dict(self.p["host"])
        # not readable (no systemd): "" - the profile checks then go by display-manager.service alone
        default, _error = systemd.default_target(run=runner.run)
        facts["default_target"] = default or ""
        facts["display_manager_enabled"] = os.path.lexists(os.path.join(self.p["unit_dir"],
                                                                        "display-manager.service"))
        total = mem_total_bytes(read(MEMINFO))
        if total is None and any(serve_profile.extra_value(profile, serve_profile.HICACHE_SIZE_FLAG)
                                 for profile in profiles):
            self.notes.append("%s has no readable MemTotal line: the hierarchical cache's host memory "
                              "(--hicache-size) is not checked against the box's RAM" % MEMINFO)
        elif total is not None:
            facts["mem_total_bytes"] = total
        return facts


def mem_total_bytes(text):
    """MemTotal of /proc/meminfo's TEXT in bytes (the kernel writes kB meaning KiB), or None."""
    match = MEM_TOTAL.search(text or "")
    return int(match.group(1)) * 1024 if match else None


def profile_facts(facts, profile):
    out = dict(facts, model_path_exists=os.path.isdir(str(profile.get("model_path"))))
    draft = (profile.get("speculative") or {}).get("draft_model_path")
    if draft:
        out["draft_model_path_exists"] = os.path.isdir(str(draft))
    scales = serve_profile.extra_value(profile, serve_profile.KV_SCALES_FLAG)
    if scales and os.path.isabs(scales):  # a relative path is an error of its own (serve/profile.py)
        out["quantization_param_path_exists"] = os.path.isfile(scales)
    return out


def read_secret(profile, field, module):
    """The key in the file the profile's FIELD (api_key_file, admin_api_key_file) names on the host (facts/api_key.py:
    its first line), which must be root's alone; None when the profile names none."""
    path = profile.get(field)
    if not path:
        return None
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        module.fail_json(msg="serve profile %s: %s %s: %s" % (
            profile["name"], field, path, getattr(exc, "strerror", None) or exc))
    if mode & 0o077:
        module.fail_json(msg="serve profile %s: %s %s is mode %04o; make it 0600 (readable by root only)"
                         % (profile["name"], field, path, mode & 0o777))
    key, error = api_key.read_key(path)
    if error:
        module.fail_json(msg="serve profile %s: %s" % (profile["name"], error.replace("api_key_file", field, 1)))
    return key


def key_config(profile, module):
    """(the root-only config file text holding the profile's API key and admin API key for the engine's --config, the
    API key, the admin API key): each read from its file on the host (read_secret)."""
    key = read_secret(profile, "api_key_file", module)
    admin = read_secret(profile, "admin_api_key_file", module)
    return serve_profile.api_key_config(key, profile["name"], admin), key, admin


def file_state(path, text, mode):
    """(content differs, mode or owner differs) of the file at PATH against TEXT written with MODE by this user."""
    try:
        st = os.lstat(path)
    except OSError:
        return True, False
    if read(path) != text:
        return True, False
    return False, (st.st_mode & 0o7777) != mode or st.st_uid != os.geteuid()


def modules_text():
    return ("# %s: the device group of %s must exist when a serve unit starts (its DeviceAllow= list is fixed then)\n"
            "%s\n" % (MARK[2:], NVIDIA_UVM, NVIDIA_UVM))


def uvm_missing(sys_module="/sys/module"):
    """Whether NVIDIA's driver is loaded here but nvidia-uvm is not."""
    return os.path.isdir(os.path.join(sys_module, "nvidia")) and not os.path.isdir(
        os.path.join(sys_module, NVIDIA_UVM.replace("-", "_")))


def engines_by_hand(profiles, engine, root="/"):
    """{profile name: [{pid, argv}]} of the engines running under no unit of rigbook's that serve a profile's port (a
    box set up by hand: nohup, tmux, a unit of the owner's)."""
    found = {}
    ports = dict((serve_profile.port_of(profile), profile["name"]) for profile in profiles)
    for proc in engine_processes.engines(root, engine):
        if (proc.get("unit") or "").startswith(PREFIX):
            continue
        given, _ = serve_profile.profile_from_argv(proc.get("args") or [], "by-hand")
        name = ports.get(serve_profile.port_of(given))
        if name is not None:
            found.setdefault(name, []).append(dict(pid=proc["pid"], argv=proc["argv"]))
    return found


def _alive(pid):
    """Whether PID runs (a zombie waiting for its parent to reap it has ended)."""
    stat = files.read_text(files.path("/", "proc", str(pid), "stat"))
    try:
        return stat is not None and stat.rsplit(")", 1)[-1].split()[0] != "Z"
    except IndexError:
        return False


def stop_by_hand(pid, timeout_s, sleep=time.sleep, clock=time.monotonic):
    """Stop an engine started by hand: SIGTERM to its process group when it leads one (nohup/setsid: its workers go
    too), else to it; SIGKILL after TIMEOUT_S. Returns how it ended: "exited", "killed" or "gone"."""
    try:
        group = os.getpgid(pid) == pid
        (os.killpg if group else os.kill)(pid, signal.SIGTERM)
    except ProcessLookupError:
        return "gone"
    deadline = clock() + timeout_s
    while clock() < deadline:
        if not _alive(pid):
            return "exited"
        sleep(0.2)
    try:
        (os.killpg if group else os.kill)(pid, signal.SIGKILL)
    except ProcessLookupError:
        return "exited"
    return "killed"


def main():
    module = AnsibleModule(
        argument_spec=dict(
            profiles=dict(type="list", elements="dict", required=True),
            engine=dict(type="list", elements="str", required=True),
            user=dict(type="str", default="rigbook-serve"),
            supplementary_groups=dict(type="list", elements="str", default=["video", "render"]),
            home=dict(type="path", default="/var/lib/rigbook-serve"),
            env_files=dict(type="list", elements="path", default=[]),
            host=dict(type="dict", default={}),
            unit_dir=dict(type="path", default="/etc/systemd/system"),
            config_dir=dict(type="path", default="/etc/rigbook/serve"),
            modules_load_dir=dict(type="path", default="/etc/modules-load.d"),
            restart=dict(type="bool", default=False),
            wait=dict(type="bool", default=True),
            stop_timeout_s=dict(type="int", default=60),
        ),
        supports_check_mode=True,
    )
    p = module.params
    u = Units(module)
    profiles = p["profiles"]
    facts = u.host_facts(profiles)
    errors, warnings = serve_profile.check_all(profiles, facts)
    warnings = u.notes + warnings
    for index, profile in enumerate(profiles):
        more_errors, _ = serve_profile.check(profile, profile_facts(facts, profile), index)
        errors += [e for e in more_errors if e not in errors]
    missing = [path for path in p["env_files"] if not os.path.isfile(path)]
    if missing and not module.check_mode:
        errors.append("the GPU environment file(s) %s do not exist: run the GPU stack's roles first"
                      % ", ".join(missing))
    if errors:
        module.fail_json(msg="serve profiles refused on this host, nothing was written or restarted:\n- %s"
                         % "\n- ".join(errors), errors=errors, warnings_found=warnings)
    for warning in warnings:
        module.warn(warning)

    plan = []
    for profile in profiles:
        base = os.path.join(p["config_dir"], profile["name"])
        item = dict(profile=profile, key=None, unit=unit_name(profile),
                    files={"unit": os.path.join(p["unit_dir"], unit_name(profile)), "env": base + ".env"})
        # the profile's env is root's alone too: systemd reads EnvironmentFile= as root
        texts = {"env": (env_text(profile), 0o600)}
        item["secrets"] = []
        if serve_profile.has_secret(profile):
            item["files"]["key"] = base + KEY_SUFFIX
            text, item["key"], admin = key_config(profile, module)
            item["secrets"] = [k for k in (item["key"], admin) if k]
            texts["key"] = (text, 0o600)
        texts["unit"] = (unit_text(profile, p, item["files"]), 0o644)
        item["texts"] = texts
        item["changed"], item["chmod"] = [], []
        for kind in ("unit", "env", "key"):
            if kind in item["files"]:
                differs, mode = file_state(item["files"][kind], *texts[kind])
                item["changed"] += [kind] if differs else []
                item["chmod"] += [kind] if mode else []
        # the key's old places: the environment file of rigbook before the credential, a key the profile dropped
        item["remove"] = [path for path in [base + OLD_KEY_SUFFIX] + ([] if "key" in item["files"] else
                                                                      [base + KEY_SUFFIX]) if os.path.lexists(path)]
        plan.append(item)
    secrets = [key for item in plan for key in item["secrets"]]

    modules = None
    if (p["host"] or {}).get("vendor") == "nvidia":
        path = os.path.join(p["modules_load_dir"], MODULES_LOAD_FILE)
        modules = dict(file=path, changed=read(path) != modules_text(), load=uvm_missing())

    listed = set(item["unit"] for item in plan)
    stale = sorted(name for name in (os.listdir(p["unit_dir"]) if os.path.isdir(p["unit_dir"]) else [])
                   if name.startswith(PREFIX) and name.endswith(".service") and name not in listed
                   and (read(os.path.join(p["unit_dir"], name)) or "").startswith(MARK))
    states = u.show(sorted(listed) + stale)
    account = service_account.changes(p["user"], p["supplementary_groups"], p["home"], create=True)
    result = dict(changed=bool(stale or account or (modules and (modules["changed"] or modules["load"]))),
                  units={}, removed=stale, warnings_found=warnings, account=[what for what, _ in account],
                  modules_load=modules)
    diff_before, diff_after = [], []
    hidden = "(the API key: not shown)\n"
    starting = [item for item in plan if item["changed"] or p["restart"] or
                states.get(item["unit"], {}).get("ActiveState") not in ("active", "activating", "reloading")]
    by_hand = engines_by_hand([item["profile"] for item in starting], p["engine"]) if starting else {}
    for item in plan:
        state = states.get(item["unit"], {})
        running = state.get("ActiveState") in ("active", "activating", "reloading")
        item["restart"] = bool(item["changed"]) or p["restart"] or not running
        item["enabled"] = state.get("UnitFileState") == "enabled"
        result["units"][item["profile"]["name"]] = dict(
            unit=item["unit"], changed=item["changed"], restarted=item["restart"] and running,
            started=item["restart"] and not running, enabled=item["enabled"],
            started_at=state.get("ExecMainStartTimestamp"), files_removed=item["remove"],
            modes_fixed=[item["files"][kind] for kind in item["chmod"]],
            stops_by_hand=by_hand.get(item["profile"]["name"], []))
        item["by_hand"] = by_hand.get(item["profile"]["name"], [])
        if item["changed"] or item["restart"] or not item["enabled"] or item["remove"] or item["chmod"]:
            result["changed"] = True
        for kind in item["changed"]:
            path, before = item["files"][kind], read(item["files"][kind])
            diff_before.append("%s:\n%s" % (path, "(absent)\n" if before is None else hidden if kind == "key"
                                            else before))
            diff_after.append("%s:\n%s" % (path, hidden if kind == "key" else item["texts"][kind][0]))
        for path in item["remove"]:
            diff_before.append("%s: present (it may hold the API key: not shown)\n" % path)
            diff_after.append("%s: removed\n" % path)
    if module._diff and result["changed"]:
        result["diff"] = dict(before="".join(diff_before) + "".join("%s: present\n" % s for s in stale),
                              after="".join(diff_after) + "".join("%s: removed\n" % s for s in stale))
    if module.check_mode or not result["changed"]:
        module.exit_json(**result)
    apply(module, u, plan, stale, secrets, result, account, modules)
    module.exit_json(**result)


def apply(module, u, plan, stale, secrets, result, account, modules):
    """Make the account, write what differs, remove stale units and old key files, reload, enable, (re)start and
    wait for readiness."""
    p = module.params
    service_account.apply(account, u.run, p["home"], p["user"])
    if not os.path.isdir(p["config_dir"]):
        os.makedirs(p["config_dir"], 0o755)
    if modules and modules["changed"]:
        if not os.path.isdir(p["modules_load_dir"]):
            os.makedirs(p["modules_load_dir"], 0o755)
        write(module, modules["file"], modules_text(), 0o644)
    if modules and modules["load"]:
        # before any (re)start: the unit's device allow-list is made from /proc/devices when it starts
        loaded = u.run(["modprobe", NVIDIA_UVM], check=False)
        if loaded.rc != 0:
            module.warn("modprobe %s failed (%s): a serve unit started now cannot open /dev/nvidia-uvm"
                        % (NVIDIA_UVM, (loaded.stderr or loaded.error or "").strip()[-300:]))
    reload_needed = bool(stale)
    for item in plan:
        for kind in item["changed"]:
            text, mode = item["texts"][kind]
            write(module, item["files"][kind], text, mode)
            reload_needed = reload_needed or kind == "unit"
        for kind in item["chmod"]:
            os.chown(item["files"][kind], os.geteuid(), os.getegid())
            os.chmod(item["files"][kind], item["texts"][kind][1])
        for path in item["remove"]:
            os.unlink(path)
    for name in stale:
        u.run(["systemctl", "disable", "--now", name], check=False)
        os.unlink(os.path.join(p["unit_dir"], name))
        base = name[len(PREFIX):-len(".service")]
        for suffix in (".env", KEY_SUFFIX, OLD_KEY_SUFFIX):
            path = os.path.join(p["config_dir"], base + suffix)
            if os.path.lexists(path):
                os.unlink(path)
    if reload_needed:
        u.run(["systemctl", "daemon-reload"])
    for item in plan:
        if not item["enabled"]:
            u.run(["systemctl", "enable", item["unit"]])
    restarts = [item for item in plan if item["restart"]]
    for item in restarts:
        for proc in item["by_hand"]:  # an engine started by hand on this port: the unit takes over from it
            ended = stop_by_hand(proc["pid"], p["stop_timeout_s"])
            module.warn("stopped the engine started by hand on port %s (pid %d, %s: %s) so that %s serves it"
                        % (serve_profile.port_of(item["profile"]), proc["pid"], ended, " ".join(proc["argv"])[:300],
                           item["unit"]))
        u.run(["systemctl", "reset-failed", item["unit"]], check=False)  # a start limit hit earlier
        # Type=exec: the restart returns once the engine is exec'd (loading and warm-up are waited for below)
        u.run(["systemctl", "restart", item["unit"]])
    for item in restarts if p["wait"] else []:
        unit = item["unit"]
        # the key goes only to a listener of this unit's control group (serve/engine_api.key_verdict)
        outcome = readiness.wait(dict(item["profile"], unit=unit), item["key"],
                                 lambda unit=unit: u.show([unit]).get(unit, {}))
        entry = result["units"][item["profile"]["name"]]
        if not outcome["ready"]:
            # the engine's own start-up line holds the key unless SGLang is patched (roles/sglang): redacted here
            journal = sglang_log.redact(u.journal(unit), secrets)
            module.fail_json(msg="%s is not ready: %s. Its last journal lines:\n%s" % (unit, outcome["why"], journal),
                             units=result["units"])
        entry["ready_s"] = outcome["seconds"]
        entry["started_at"] = u.show([unit]).get(unit, {}).get("ExecMainStartTimestamp")


if __name__ == "__main__":
    main()
