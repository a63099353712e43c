"""collect/engine_processes.py: the engines running on a box, read from a /proc tree laid out here by the test (a
recorded tree, reconstructed from what Linux shows for a process: NUL-separated cmdline and environ, the exe link,
cgroup v2 lines, maps lines)."""

from __future__ import annotations

import builtins
import hashlib
import os
import signal
import subprocess
import sys
import time

import pytest
from ansible_collections.rigbook.homelab.plugins.module_utils.collect import engine_processes as ep

VENV = "/opt/sglang-venv"
ENGINE = [f"{VENV}/bin/python3", "-m", "sglang.launch_server", "--model-path", "/srv/models/qwen", "--tp", "2",
          "--api-key", "sk-secret-1", "--port", "30000"]
ENVIRON = ["PATH=/usr/bin", "NCCL_P2P_LEVEL=PHB", "HSA_ENABLE_IPC_MODE_LEGACY=0", "HF_TOKEN=hf-secret-2",
           "SGLANG_API_KEY=sk-secret-3", "LD_LIBRARY_PATH=/opt/rccl/lib", "HOME=/root"]
MAPS = ("7f0000000000-7f0000100000 r-xp 00000000 08:01 1234 /opt/rccl/lib/librccl.so.1.0\n"
        "7f0000100000-7f0000200000 r--p 00100000 08:01 1234 /opt/rccl/lib/librccl.so.1.0\n"
        "7f0000300000-7f0000400000 r-xp 00000000 08:01 99 /usr/lib/x86_64-linux-gnu/libc.so.6\n"
        "7f0000500000-7f0000600000 r-xp 00000000 08:01 77 /opt/rocm/lib/libamdhip64.so.7\n"
        "7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0 [stack]\n")


def _process(root, pid, argv, environ=(), ppid=1, cgroup="0::/user.slice/session-1.scope\n", maps="", exe=None):
    folder = root / "proc" / str(pid)
    folder.mkdir(parents=True)
    (folder / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")
    (folder / "environ").write_bytes(b"\0".join(e.encode() for e in environ) + b"\0")
    (folder / "status").write_text(f"Name:\tpython3\nPid:\t{pid}\nPPid:\t{ppid}\n")
    (folder / "cgroup").write_text(cgroup)
    (folder / "maps").write_text(maps)
    if exe:
        os.symlink(exe, folder / "exe")


def _box(tmp_path):
    root = tmp_path / "root"
    (root / VENV.lstrip("/") / "bin").mkdir(parents=True)
    (root / VENV.lstrip("/") / "pyvenv.cfg").write_text("home = /usr/bin\n")
    lib = root / "opt/rccl/lib/librccl.so.1.0"
    lib.parent.mkdir(parents=True)
    lib.write_bytes(b"patched rccl")
    _process(root, 4100, ENGINE, ENVIRON, cgroup="0::/system.slice/sglang.service\n", maps=MAPS,
             exe="/usr/bin/python3.12")
    _process(root, 4188, ENGINE, ENVIRON, ppid=4100, cgroup="0::/system.slice/sglang.service\n")  # its scheduler
    _process(root, 5000, ["/usr/sbin/sshd", "-D"])
    return root


def test_an_engine_started_by_a_unit_with_its_venv_environment_and_libraries(tmp_path):
    root = _box(tmp_path)
    [engine] = ep.engines(str(root))
    assert engine["pid"] == 4100 and engine["unit"] == "sglang.service" and engine["venv"] == VENV
    assert engine["interpreter"] == "/usr/bin/python3.12"
    assert engine["args"][:4] == ["--model-path", "/srv/models/qwen", "--tp", "2"]
    assert engine["env"] == {"NCCL_P2P_LEVEL": "PHB", "HSA_ENABLE_IPC_MODE_LEGACY": "0",
                             "LD_LIBRARY_PATH": "/opt/rccl/lib"}
    assert engine["secret_env"] == ["SGLANG_API_KEY"]
    assert engine["libraries"] == [
        {"path": "/opt/rccl/lib/librccl.so.1.0", "sha256": hashlib.sha256(b"patched rccl").hexdigest()},
        {"path": "/opt/rocm/lib/libamdhip64.so.7", "sha256": None}]  # mapped, its file not under this root


def test_no_secret_of_the_process_reaches_the_result(tmp_path):
    found = repr(ep.engines(str(_box(tmp_path))))
    assert "sk-secret-1" not in found and "hf-secret-2" not in found and "sk-secret-3" not in found
    assert "'--api-key', '********'" in found


def test_an_engine_started_from_a_shell_has_no_unit_and_a_bare_box_has_no_engine(tmp_path):
    root = tmp_path / "root"
    _process(root, 77, ["/home/u/venv/bin/python3", "-m", "sglang.launch_server", "--model-path", "/m"])
    [engine] = ep.engines(str(root))
    assert engine["unit"] is None and engine["venv"] is None and engine["libraries"] == []
    assert ep.engines(str(tmp_path / "nothing")) == []


def test_redacted_argv_hides_every_spelling_of_the_key():
    from ansible_collections.rigbook.homelab.plugins.module_utils.serve.profile import redacted_argv

    assert redacted_argv(["--api-key", "a", "--api-ke=b", "--api-key", "--port", "1", "--x", "c"]) == [
        "--api-key", "********", "--api-ke=********", "--api-key", "--port", "1", "--x", "c"]


def test_the_login_service_a_shell_runs_in_is_not_the_engines_unit():
    # where no logind moves an SSH login into a session scope (a container, as the lab's hosts), a process started
    # from that shell stays in ssh.service's cgroup (seen on a lab host set up by `provision lab handmade`)
    assert ep.unit_of("0::/system.slice/ssh.service\n") is None
    assert ep.unit_of("0::/system.slice/system-getty.slice/getty@tty1.service\n") is None
    assert ep.unit_of("0::/system.slice/cron.service\n") is None
    assert ep.unit_of("0::/system.slice/sglang-qwen.service\n") == "sglang-qwen.service"


def test_a_library_replaced_since_it_was_mapped_is_hashed_through_its_mapping(tmp_path):
    """maps marks a file deleted (or replaced by a new install) after it was mapped with " (deleted)": its path now
    names another file, so the mapping itself (/proc/PID/map_files/RANGE) is hashed. A wheel's own NCCL that the
    pinned venv kept beside its link (NAME.rigbook-bundled) is a collectives library too."""
    root = tmp_path / "root"
    bundled = "/opt/v/lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2.rigbook-bundled"
    maps = ("7f0000000000-7f0000100000 r-xp 00000000 08:01 1234 /opt/rccl/lib/librccl.so.1.0 (deleted)\n"
            f"7f0000200000-7f0000300000 r-xp 00000000 08:01 55 {bundled}\n")
    _process(root, 4100, ENGINE, maps=maps)
    (root / "opt/rccl/lib").mkdir(parents=True)
    (root / "opt/rccl/lib/librccl.so.1.0").write_bytes(b"the rccl installed since")
    (root / "proc/4100/map_files").mkdir()
    (root / "proc/4100/map_files/7f0000000000-7f0000100000").write_bytes(b"the rccl the engine runs")
    mapped = ep.process_libraries(str(root), 4100)
    assert mapped == [
        {"path": "/opt/rccl/lib/librccl.so.1.0", "sha256": hashlib.sha256(b"the rccl the engine runs").hexdigest()},
        {"path": bundled, "sha256": None}]  # mapped, its file not under this root
    assert ep.collectives(mapped) == mapped


@pytest.fixture
def touched(monkeypatch):
    """Every path opened, stat-ed or read as a link (builtins.open, os.open, os.stat, os.lstat, os.readlink), as
    given."""
    seen = []

    def recording(real):
        def call(file, *args, **kwargs):
            seen.append(os.fspath(file) if isinstance(file, (str, bytes, os.PathLike)) else file)
            return real(file, *args, **kwargs)
        return call

    monkeypatch.setattr(builtins, "open", recording(builtins.open))
    for name in ("open", "stat", "lstat", "readlink"):
        monkeypatch.setattr(os, name, recording(getattr(os, name)))
    return seen


def _of(seen, root, pid):
    """The names under ROOT/proc/PID that SEEN touched."""
    folder = str(root / "proc" / str(pid)) + "/"
    return {p[len(folder):] for p in seen if isinstance(p, str) and p.startswith(folder)}


def test_an_engine_keep_refuses_is_read_no_further_than_its_cmdline_and_status(tmp_path, touched):
    root = _box(tmp_path)
    other = root / "home/mallory/v"
    (other / "bin").mkdir(parents=True)
    (other / "pyvenv.cfg").write_text("home = /usr/bin\n")
    argv = ["/home/mallory/v/bin/python3", "-m", "sglang.launch_server", "--model-path", "/m"]
    _process(root, 5100, argv, ["NCCL_DEBUG=mallory-env"], maps=MAPS, exe="/home/mallory/v/bin/python3",
             cgroup="0::/system.slice/mallory.service\n")
    _process(root, 5188, argv, ["NCCL_DEBUG=mallory-env"], ppid=5100, maps=MAPS)  # its scheduler
    asked = []
    found = ep.engines(str(root), keep=lambda pid: asked.append(pid) or pid != 5100)
    assert [e["pid"] for e in found] == [4100] and asked == [4100, 5100]  # each engine once, its worker not at all
    assert _of(touched, root, 5100) == {"cmdline", "status"} and _of(touched, root, 5188) == {"cmdline", "status"}
    assert not [p for p in touched if isinstance(p, str) and "mallory" in p]  # nor its venv
    assert {"environ", "exe", "cgroup", "maps"} <= _of(touched, root, 4100)  # the kept engine is read whole
    # without KEEP the same engine is read whole: what the recording above would have caught
    del touched[:]
    assert [e["pid"] for e in ep.engines(str(root))] == [4100, 5100]
    assert {"environ", "exe", "cgroup", "maps"} <= _of(touched, root, 5100)


# --- a wrapper script, as an owner writes one: real processes, their real /proc/PID/cmdline -------------------------

def _started(argv, tmp_path):
    """ARGV started in a session of its own (ended by the test that started it)."""
    return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            cwd=tmp_path, start_new_session=True)


def _cmdline(pid):
    with open(f"/proc/{pid}/cmdline", "rb") as handle:
        return [w.decode() for w in handle.read().split(b"\0") if w]


def _children(pid):
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/status") as handle:
                status = handle.read()
        except OSError:
            continue
        if entry.isdigit() and f"\nPPid:\t{pid}\n" in status:
            found.append(int(entry))
    return found


def _until(check, seconds=20.0):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError("the started process did not get there in time")


def test_a_wrapper_that_execs_is_the_engine_and_one_that_does_not_is_its_shell_parent(tmp_path):
    """`sglang serve` as a venv's console script (its shebang the venv's python), started by two wrapper scripts: one
    that execs it (the process becomes [python, .../bin/sglang, serve, ARGS]) and one that runs it as a child (the
    shell stays, its own command line [/bin/sh, start.sh, ARGS], the engine below it). Both read from the kernel's
    own /proc, then laid out as a tree for engines()."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    script = venv / "bin/sglang"
    script.write_text(f"#!{sys.executable}\nimport time\ntime.sleep(60)\n")
    script.chmod(0o755)
    args = ["--model-path", "/srv/models/m", "--tp-size", "2"]
    for name, line in (("exec.sh", f'exec "{script}" serve "$@"\n'), ("child.sh", f'"{script}" serve "$@"\nexit 0\n')):
        (tmp_path / name).write_text("#!/bin/sh\n" + line)
        (tmp_path / name).chmod(0o755)
    started = [_started([str(tmp_path / "exec.sh"), *args], tmp_path),
               _started([str(tmp_path / "child.sh"), *args], tmp_path)]
    try:
        execd, shell = started[0].pid, started[1].pid
        _until(lambda: _cmdline(execd)[1:2] == [str(script)])
        [child] = _until(lambda: [c for c in _children(shell) if _cmdline(c)[1:2] == [str(script)]])
        seen = {pid: _cmdline(pid) for pid in (execd, shell, child)}
        # the kernel shows the exec'd console script as its interpreter, its path, then its words
        assert seen[execd] == [sys.executable, str(script), "serve", *args]
        assert seen[shell] == ["/bin/sh", str(tmp_path / "child.sh"), *args]
        assert ep.engine_args(seen[execd]) == args and ep.engine_args(seen[child]) == args
        assert ep.engine_args(seen[shell]) is None  # the shell parent is no engine
        root = tmp_path / "root"
        for pid, argv in seen.items():
            _process(root, pid, argv, ppid=shell if pid == child else 1)
        assert sorted(e["pid"] for e in ep.engines(str(root))) == sorted([execd, child])
    finally:
        for process in started:
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(timeout=30)


def test_a_relative_path_flag_is_made_absolute_from_the_engines_folder_where_it_exists(tmp_path):
    """Seed 000 starts its engine from its home with `--quantization-param-path scales/...json` (a path relative to
    that folder): a unit starts elsewhere, so the engine's args carry the absolute path; a model id that names no
    folder there stays as given."""
    root = tmp_path / "root"
    scales = root / "home/owner/scales/qwen38-fp8-kv-scales-per-head.json"
    scales.parent.mkdir(parents=True)
    scales.write_text("{}")
    argv = ["/opt/sglang/bin/python3", "/opt/sglang/bin/sglang", "serve", "--model-path", "Qwen/Qwen3-8B",
            "--quantization-param-path", "scales/qwen38-fp8-kv-scales-per-head.json", "--chat-template=scales"]
    _process(root, 300, argv)
    os.symlink("/home/owner", root / "proc/300/cwd")
    [engine] = ep.engines(str(root))
    assert engine["args"] == ["--model-path", "Qwen/Qwen3-8B", "--quantization-param-path",
                              "/home/owner/scales/qwen38-fp8-kv-scales-per-head.json",
                              "--chat-template=/home/owner/scales"]
    assert engine["relative_paths"] == [
        ("--quantization-param-path", "scales/qwen38-fp8-kv-scales-per-head.json",
         "/home/owner/scales/qwen38-fp8-kv-scales-per-head.json"),
        ("--chat-template", "scales", "/home/owner/scales")]
    # no readable working folder: the args as given
    os.unlink(root / "proc/300/cwd")
    [engine] = ep.engines(str(root))
    assert engine["args"][3] == "scales/qwen38-fp8-kv-scales-per-head.json" and engine["relative_paths"] == []


def _nccl_copy(folder, version: int):
    """A shared library named libnccl.so.2 in FOLDER (compiled here) whose ncclGetVersion says VERSION."""
    folder.mkdir(parents=True)
    (folder / "nccl.c").write_text(f"int ncclGetVersion(int *v) {{ *v = {version}; return 0; }}\n")
    subprocess.run(["cc", "-shared", "-fPIC", "-Wl,-soname,libnccl.so.2", "-o", str(folder / "libnccl.so.2"),
                    str(folder / "nccl.c")], check=True)
    return folder / "libnccl.so.2"


def test_a_preloaded_copy_is_marked_beside_the_one_opened_by_path_in_a_real_process(tmp_path):
    """A real process as torch under LD_PRELOAD runs: the preloaded copy (named through a link, as a library folder
    holds them) loaded first, the wheel's copy opened by path beside it; both mapped, the first one used."""
    system = _nccl_copy(tmp_path / "system", 22803)
    wheel = _nccl_copy(tmp_path / "venv/nvidia/nccl/lib", 22809)
    (tmp_path / "system/libnccl.so").symlink_to("libnccl.so.2")
    program = ("import ctypes, sys, time\n"
               "wheel = ctypes.CDLL(sys.argv[1])\n"
               "used = ctypes.c_int()\n"
               "ctypes.CDLL(None).ncclGetVersion(ctypes.byref(used))\n"
               "print(used.value, flush=True)\n"
               "time.sleep(60)\n")
    env = dict(os.environ, LD_PRELOAD=str(tmp_path / "system/libnccl.so"))
    proc = subprocess.Popen([sys.executable, "-c", program, str(wheel)], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "22803"  # the preloaded copy's symbols are the ones bound
        mapped = {lib["path"]: lib for lib in ep.process_libraries("/", proc.pid)}
    finally:
        proc.kill()
        proc.wait()
    assert mapped[str(system)] == {"path": str(system), "preloaded": True,
                                   "sha256": hashlib.sha256(system.read_bytes()).hexdigest()}
    assert mapped[str(wheel)] == {"path": str(wheel), "sha256": hashlib.sha256(wheel.read_bytes()).hexdigest()}
