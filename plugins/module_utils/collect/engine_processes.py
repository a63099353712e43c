# -*- coding: utf-8 -*-
# Copyright: rigbook developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The SGLang engines running on a box, read from /proc (standard library only; read-only): what `provision adopt`
turns into serve profiles and pins on a box that was set up by hand.

Per engine process (a command line that starts sglang.launch_server, serve/profile.py engine_args): its pid, its
argv (an API key's value replaced by ********: serve/profile.py redacted_argv), the interpreter (/proc/PID/exe),
the virtual environment it runs from (the folder holding pyvenv.cfg above the interpreter named in argv[0]), the
systemd unit that started it (/proc/PID/cgroup; None for a process started from a shell), the GPU environment it
was given (environ: the variables of GPU_ENV_PREFIXES and GPU_ENV_NAMES; a variable whose name looks like a secret
is never read into the result, only named), and the NCCL/RCCL and GPU runtime libraries it has mapped
(/proc/PID/maps, read by facts/libraries.py: NCCL/RCCL named there, a library deleted since it was mapped hashed
through /proc/PID/map_files) with each file's sha256.

Everything is read under ROOT ("/" on a box; a recorded tree in tests), so a process's paths are ROOT + path. Worker
processes of one engine (the scheduler and detokenizer children carry the same command line) are one engine: the
process whose parent is not an engine too.
"""

from __future__ import annotations

import os
import re

from ansible_collections.rigbook.homelab.plugins.module_utils.facts import files, libraries
from ansible_collections.rigbook.homelab.plugins.module_utils.serve.profile import engine_args, redacted_argv

# RIGBOOK_: rigbook's own (the lab's engine stand-in reads RIGBOOK_EVIDENCE_ROOT, its recorded hardware)
GPU_ENV_PREFIXES = ("NCCL_", "RCCL_", "HSA_", "HIP_", "ROCR_", "ROCM_", "CUDA_", "NVIDIA_", "PYTORCH_", "TORCH_",
                    "SGLANG_", "GPU_", "AMD_", "MIOPEN_", "RIGBOOK_")
GPU_ENV_NAMES = frozenset(("LD_LIBRARY_PATH", "LD_PRELOAD", "OMP_NUM_THREADS"))
SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSW|CREDENTIAL|AUTH", re.I)
LOGIN_UNIT = re.compile(r"^(ssh|sshd|cron|atd|systemd-logind|(serial-|console-|container-)?getty(@.*)?)\.service$")
# The GPU runtime libraries kept beside the collectives one (NCCL or RCCL: facts/libraries.collective_kind).
RUNTIMES = re.compile(r"/(libcudart\.so[.0-9]*|libamdhip64\.so[.0-9]*|libcuda\.so[.0-9]*|"
                      r"libhsa-runtime64\.so[.0-9]*)$")


def _under(root, path):
    return files.path(root, path.lstrip("/"))


def _read(path):
    """The text of a /proc file (facts/files.read_text, unstripped: NULs kept), or None."""
    return files.read_text(path, strip=False)


def _words(text):
    """The NUL-separated words of a /proc cmdline or environ file."""
    return [w for w in (text or "").split("\0") if w]


def gpu_environment(words):
    """({name: value} of the GPU environment among WORDS ("NAME=value"), [names left out as secrets])."""
    kept, secret = {}, []
    for word in words:
        name, eq, value = word.partition("=")
        if not eq:
            continue
        if not (name.startswith(GPU_ENV_PREFIXES) or name in GPU_ENV_NAMES):
            continue
        if SECRET_NAME.search(name):
            secret.append(name)
            continue
        kept[name] = value
    return kept, sorted(secret)


def unit_of(cgroup_text):
    """The systemd service a process runs in, from its /proc/PID/cgroup text, or None: a process started from a
    shell (a user session, or the login service itself where no logind moves sessions into scopes: ssh, a getty,
    cron) was not started by a unit of its own."""
    for line in (cgroup_text or "").splitlines():
        path = line.rsplit(":", 1)[-1]
        for part in reversed(path.split("/")):
            if part.endswith(".service") and not part.startswith("user@") and not part.startswith("session-"):
                return None if LOGIN_UNIT.match(part) else part
    return None


def venv_of(root, interpreter):
    """The virtual environment holding INTERPRETER (its folder's parent with pyvenv.cfg), or None."""
    if not interpreter or not interpreter.startswith("/"):
        return None
    top = os.path.dirname(os.path.dirname(interpreter))
    return top if os.path.isfile(_under(root, os.path.join(top, "pyvenv.cfg"))) else None


def mapped_libraries(root, pid, maps_text):
    """[{path, sha256}] of the NCCL/RCCL and GPU runtime libraries in process PID's /proc/PID/maps text MAPS_TEXT,
    each once, in order (libraries.parse_maps); sha256 None when the file cannot be read (libraries.mapping_digest:
    a deleted one through its mapping)."""
    found = []
    for mapping in libraries.parse_maps(maps_text):
        if libraries.is_collectives(mapping["path"]) or RUNTIMES.search(mapping["path"]):
            found.append({"path": mapping["path"], "sha256": libraries.mapping_digest(root, pid, mapping)[0]})
    return found


def collectives(mapped):
    """The NCCL/RCCL entries of MAPPED (mapped_libraries)."""
    return [lib for lib in mapped or [] if libraries.is_collectives(lib.get("path"))]


def process_libraries(root, pid):
    """mapped_libraries of process PID under ROOT (its /proc/PID/maps), [] when it cannot be read."""
    return mapped_libraries(root, pid, libraries.read_maps(root, pid))


def _parent(root, pid):
    status = _read(_under(root, "proc/%s/status" % pid)) or ""
    found = re.search(r"^PPid:\s*(\d+)", status, re.M)
    return found.group(1) if found else None


def engines(root="/", engine=None, keep=None):
    """[{pid, argv, args, interpreter, venv, unit, env, secret_env, libraries}] of the engines running under ROOT,
    by pid; ENGINE: the inventory's serve_engine argv, recognised besides `-m sglang.launch_server`. KEEP(pid, an
    int), when given, is asked of each engine once its cmdline and status (its parent; the owner's line) are read
    and before anything else of it is: an engine it refuses is left out unread (no environ, exe, cgroup, maps,
    libraries or venv), its workers with it."""
    proc = _under(root, "proc")
    try:
        pids = sorted((p for p in os.listdir(proc) if p.isdigit()), key=int)
    except OSError:
        return []
    argvs = {}
    for pid in pids:
        argv = _words(_read(os.path.join(proc, pid, "cmdline")))
        if engine_args(argv, engine) is not None:
            argvs[pid] = argv
    found = []
    for pid, argv in argvs.items():
        if _parent(root, pid) in argvs:
            continue  # a worker of an engine: listed with it, or left out with it
        if keep is not None and not keep(int(pid)):
            continue
        env, secret = gpu_environment(_words(_read(os.path.join(proc, pid, "environ"))))
        try:
            exe = os.readlink(os.path.join(proc, pid, "exe"))
        except OSError:
            exe = None
        cgroup = _read(os.path.join(proc, pid, "cgroup")) or ""
        found.append({
            "pid": int(pid),
            "argv": redacted_argv(argv),
            "args": redacted_argv(engine_args(argv, engine)),
            "interpreter": exe,
            "venv": venv_of(root, argv[0]) or venv_of(root, exe),
            "unit": unit_of(cgroup),
            "env": env,
            "secret_env": secret,
            "libraries": process_libraries(root, pid),
        })
    return found
