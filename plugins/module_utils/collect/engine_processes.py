# -*- coding: utf-8 -*-
# Copyright: rigbook developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The SGLang engines running on a box, read from /proc (standard library only; read-only): what `provision adopt`
turns into serve profiles and pins on a box that was set up by hand.

Per engine process (a command line that starts SGLang's server: `python -m sglang.launch_server`, `sglang serve`,
`python -m sglang.cli.main serve`, a wrapper that execs one of them; serve/profile.py engine_args decides, the one
place): its pid, its argv (an API key's value replaced by ********: serve/profile.py redacted_argv), the interpreter
(/proc/PID/exe), the virtual environment it runs from (the folder holding pyvenv.cfg above the interpreter named in
argv[0]: as written, a console script's shebang gives its venv's python; a bare name such as `python3` found as the
shell found it, in the PATH of the process's environment; a relative one from its working folder), the
systemd unit that started it (/proc/PID/cgroup; None for a process started from a shell), the GPU environment it
was given (environ: the variables of GPU_ENV_PREFIXES and GPU_ENV_NAMES; a variable whose name looks like a secret
is never read into the result, only named), and the NCCL/RCCL and GPU runtime libraries it has mapped
(/proc/PID/maps, read by facts/libraries.py: NCCL/RCCL named there, a library deleted since it was mapped hashed
through /proc/PID/map_files) with each file's sha256.

Everything is read under ROOT ("/" on a box; a recorded tree in tests), so a process's paths are ROOT + path. Worker
processes of one engine are one engine: forked children carry the same command line (the process whose parent is not
an engine too is the engine), spawned ones run `python -c "from multiprocessing.spawn import ..."` and renamed ones
(sglang::scheduler) start no engine.
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


def interpreter_path(root, pid, word, environ):
    """The absolute path of ARGV[0] WORD of process PID as it was started: WORD itself when absolute; a name without
    a folder looked up as the shell did, in the PATH of the process's ENVIRON words (the first such file under
    ROOT); a relative path from the process's working folder (/proc/PID/cwd); None when it cannot be told."""
    if not word:
        return None
    if word.startswith("/"):
        return word
    if "/" in word:
        try:
            cwd = os.readlink(_under(root, "proc/%s/cwd" % pid))
        except OSError:
            return None
        return os.path.normpath(os.path.join(cwd, word)) if cwd.startswith("/") else None
    for entry in environ:
        if entry.startswith("PATH="):
            for folder in entry[5:].split(":"):
                if folder.startswith("/") and os.path.isfile(_under(root, os.path.join(folder, word))):
                    return os.path.join(folder, word)
    return None


# The engine's flags whose value is a file or folder on the box (SGLang's server args): a relative one is read from
# the engine's working folder, which a unit does not share.
PATH_FLAGS = frozenset(("--model-path", "--model", "--tokenizer-path", "--quantization-param-path",
                        "--speculative-draft-model-path", "--chat-template", "--config"))


def absolute_path_args(root, pid, args):
    """(ARGS with each relative value of a PATH_FLAGS flag made absolute from process PID's working folder, where that
    path exists under ROOT; [(flag, given, absolute)] of what was changed). A value that names nothing there (a model
    id such as Qwen/Qwen3-8B) is left as given."""
    try:
        cwd = os.readlink(_under(root, "proc/%s/cwd" % pid))
    except OSError:
        return list(args), []
    if not cwd.startswith("/"):
        return list(args), []
    out, changed = [], []
    for i, word in enumerate(args):
        flag, eq, inline = word.partition("=")
        previous = args[i - 1] if i else ""
        if eq and flag in PATH_FLAGS:
            value, prefix = inline, flag + "="
        elif not eq and previous in PATH_FLAGS and not word.startswith("--"):
            value, prefix, flag = word, "", previous
        else:
            out.append(word)
            continue
        full = os.path.normpath(os.path.join(cwd, value))
        if value and not value.startswith(("/", "~")) and os.path.exists(_under(root, full)):
            out.append(prefix + full)
            changed.append((flag, value, full))
        else:
            out.append(word)
    return out, changed


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


def preloaded(root, environ):
    """The files LD_PRELOAD names in ENVIRON (a process's environ words), each as the path its /proc/PID/maps shows
    once loaded (links followed, under ROOT): the copies the dynamic loader loads first."""
    value = next((w.split("=", 1)[1] for w in environ if w.startswith("LD_PRELOAD=")), "")
    top = os.path.realpath(root or "/")
    found = set()
    for word in re.split(r"[:\s]+", value):
        if word.startswith("/"):
            real = os.path.realpath(_under(root, word))
            found.add(real if top == "/" else "/" + os.path.relpath(real, top))
    return found


def process_libraries(root, pid, environ=None):
    """mapped_libraries of process PID under ROOT (its /proc/PID/maps), [] when it cannot be read; an entry its
    LD_PRELOAD loaded first has "preloaded": True. ENVIRON: its environ words when the caller read them already."""
    mapped = mapped_libraries(root, pid, libraries.read_maps(root, pid))
    if mapped and environ is None:
        environ = _words(_read(_under(root, "proc/%d/environ" % int(pid))))
    first = preloaded(root, environ) if mapped else set()
    for lib in mapped:
        if lib["path"] in first:
            lib["preloaded"] = True
    return mapped


def _parent(root, pid):
    status = _read(_under(root, "proc/%s/status" % pid)) or ""
    found = re.search(r"^PPid:\s*(\d+)", status, re.M)
    return found.group(1) if found else None


def engines(root="/", engine=None, keep=None):
    """[{pid, argv, args, interpreter, venv, unit, env, secret_env, libraries}] of the engines running under ROOT,
    by pid; ENGINE: the inventory's serve_engine argv, recognised besides SGLang's own (engine_args). KEEP(pid, an
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
        environ = _words(_read(os.path.join(proc, pid, "environ")))
        env, secret = gpu_environment(environ)
        try:
            exe = os.readlink(os.path.join(proc, pid, "exe"))
        except OSError:
            exe = None
        cgroup = _read(os.path.join(proc, pid, "cgroup")) or ""
        args, relative = absolute_path_args(root, pid, engine_args(argv, engine))
        found.append({
            "pid": int(pid),
            "argv": redacted_argv(argv),
            "args": redacted_argv(args),
            "relative_paths": relative,
            "interpreter": exe,
            "venv": venv_of(root, interpreter_path(root, pid, argv[0], environ)) or venv_of(root, exe),
            "unit": unit_of(cgroup),
            "env": env,
            "secret_env": secret,
            "libraries": process_libraries(root, pid, environ),
        })
    return found
