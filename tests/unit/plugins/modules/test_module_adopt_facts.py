"""adopt_facts through its main(): what a box's local users can put in what adopt reads comes back typed and bounded
(control characters, an environment name with a template in it, credentials in URLs, the admin API key, over-long
words), another user's engine is skipped and named and nothing of its venv is read, a venv of another user or
reached through a link is not read, and a venv file that is a link (at the file or a folder on the way), a hard link
to a file the venv's owner cannot read, a FIFO, or a file swapped for a link while it is opened never reaches the
result (collect/adopt.py reads every venv file through facts/files.py's no-follow reader).

The box is a system root laid out here (reconstructed as Linux shows a process: NUL-separated cmdline and environ,
status with its Uid line, cgroup v2; a venv as pip leaves it: pyvenv.cfg, dist-info with RECORD, a wheel in a
folder), commands answered from the table run_module checks (dpkg-query, dkms status).
"""

from __future__ import annotations

import base64
import builtins
import hashlib
import json
import os
import threading
import zipfile

import pytest
from ansible_collections.rigbook.homelab.plugins.module_utils.facts import files, packages
from ansible_collections.rigbook.homelab.plugins.modules import adopt_facts
from helpers.modules import ok, run_module

VENV = "/opt/sgl"
SITE = VENV + "/lib/python3.11/site-packages"
ORIGINAL = "API_KEY = None\nDEBUG = False\n"
CHANGED = "API_KEY = None\nDEBUG = True\n"
SECRET = "root-only: hunter2-secret"
ATTACK = "{{ lookup('pipe', 'touch MARKER') }}"
PASSWD = ("root:x:0:0:root:/root:/bin/bash\nrigbook-serve:x:990:990::/var/lib/rigbook-serve:/usr/sbin/nologin\n"
          "mallory:x:1001:1001::/home/mallory:/bin/bash\n")
DKMS = "nvidia/615.71.09, 6.8.12, x86_64: installed\n"


def _process(system, pid, argv, environ=(), uid=0, unit="sglang.service"):
    folder = system / "proc" / str(pid)
    folder.mkdir(parents=True)
    (folder / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")
    (folder / "environ").write_bytes(b"\0".join(e.encode() for e in environ) + b"\0")
    (folder / "status").write_text(f"Name:\tpython3\nPid:\t{pid}\nPPid:\t1\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n")
    (folder / "cgroup").write_text(f"0::/system.slice/{unit}\n")
    (folder / "maps").write_text("")


def _venv(system, owner=0):
    """A venv with sglang 0.5.23 whose server_args.py was changed after install (RECORD has the original's sha256),
    and sglang's wheel in /srv/wheels."""
    site = system / SITE.lstrip("/")
    (site / "sglang/srt").mkdir(parents=True)
    (system / VENV.lstrip("/") / "bin").mkdir(parents=True)
    (system / VENV.lstrip("/") / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (site / "sglang/srt/server_args.py").write_text(CHANGED)
    info = site / "sglang-0.5.23.dist-info"
    info.mkdir()
    digest = base64.urlsafe_b64encode(hashlib.sha256(ORIGINAL.encode()).digest()).rstrip(b"=").decode()
    (info / "RECORD").write_text(f"sglang/srt/server_args.py,sha256={digest},{len(ORIGINAL)}\n")
    (info / "direct_url.json").write_text(json.dumps({"url": "https://deploy:ghp_t0ken@git.example/sglang.git",
                                                      "vcs_info": {"vcs": "git", "commit_id": "c" * 40}}))
    wheels = system / "srv/wheels"
    wheels.mkdir(parents=True)
    with zipfile.ZipFile(wheels / "sglang-0.5.23-py3-none-any.whl", "w") as archive:
        archive.writestr("sglang/srt/server_args.py", ORIGINAL)
    for top, dirs, names in os.walk(system / VENV.lstrip("/")):
        for name in dirs + names:
            os.chown(os.path.join(top, name), owner, owner)
    os.chown(system / VENV.lstrip("/"), owner, owner)
    return site


def _box(tmp_path):
    system = tmp_path / "system"
    (system / "proc/sys/kernel").mkdir(parents=True)
    (system / "proc/sys/kernel/osrelease").write_text("6.8.12\n")
    (system / "proc/cmdline").write_text("BOOT_IMAGE=/vmlinuz ro iommu=pt\n")
    (system / "etc").mkdir()
    (system / "etc/passwd").write_text(PASSWD)
    git = system / "usr/src/nvidia-615.71.09/.git"
    git.mkdir(parents=True)
    (git / "HEAD").write_text("3f2b1c0a" * 5 + "\n")
    (git / "config").write_text('[remote "origin"]\n\turl = https://owner:ghp_s3cret@github.com/x/fork.git\n')
    return system


def _adopt(system, **args):
    commands = [(packages.DPKG_QUERY + ["linux-*"], ok("")), (["dkms", "status"], ok(DKMS)),
                (packages.DPKG_QUERY, ok(""))]
    run = run_module(adopt_facts, {"system": str(system), "evidence_root": str(system), **args}, commands)
    assert not run.failed, run.msg
    return run.result["facts"]


def test_what_a_local_user_puts_in_argv_and_environment_comes_back_typed_and_bounded(tmp_path):
    system = _box(tmp_path)
    long = "x" * 5000
    argv = [VENV + "/bin/python3", "-m", "sglang.launch_server", "--model-path", ATTACK,
            "--served-model-name", "qwen\x1b[2J\nExecStartPre=+/bin/sh", "--admin-api-key", "adm-secret-1",
            "--admin-api-key=adm-secret-2", "--admin-api", "adm-secret-3", "--chat-template", long]
    environ = ["NCCL_DEBUG=" + ATTACK, "NCCL_{{ lookup('pipe','id') }}=1", "NCCL_" + "A" * 200 + "=1",
               "NCCL_IB_HCA=mlx5\x07\x1b]0;title\x07", "HF_TOKEN=hf-secret", "NCCL_TOKEN=nccl-secret"]
    _process(system, 4100, argv, environ)
    facts = _adopt(system)
    [engine] = facts["engines"]
    # a template is data: it comes back as it was given (emit writes it !unsafe; test_adopt.py runs Ansible on it)
    assert engine["args"][:2] == ["--model-path", ATTACK] and engine["env"]["NCCL_DEBUG"] == ATTACK
    # control characters stand replaced, never dropped into another value, never kept
    assert engine["args"][3] == "qwen\ufffd[2J\ufffdExecStartPre=+/bin/sh"
    assert engine["env"]["NCCL_IB_HCA"] == "mlx5\ufffd\ufffd]0;title\ufffd"
    # the admin API key is a secret as the API key is: every spelling's value hidden
    assert engine["args"][4:9] == ["--admin-api-key", "********", "--admin-api-key=********", "--admin-api",
                                   "********"]
    assert engine["args"][-1] == "x" * 4096  # a word cut to 4096 characters
    # names that are no shell names never come back as keys; each is said
    assert sorted(engine["env"]) == ["NCCL_DEBUG", "NCCL_IB_HCA"] and engine["secret_env"] == ["NCCL_TOKEN"]
    unpinned = facts["checks"]["unpinned"]
    assert any("\"NCCL_{{ lookup('pipe','id') }}\"" in u and "no shell name" in u for u in unpinned)
    assert any("'NCCL_AAAA" in u and "at most 128 characters" in u for u in unpinned)
    notes = facts["checks"]["notes"]
    assert any(n.startswith("control characters replaced by U+FFFD") and "engines[0].args[3]" in n
               and "engines[0].env.NCCL_IB_HCA" in n for n in notes)
    assert any(n.startswith("cut to 4096") and "engines[0].args[10]" in n for n in notes)
    text = json.dumps(facts, ensure_ascii=False)
    for secret in ("adm-secret-1", "adm-secret-2", "adm-secret-3", "hf-secret", "nccl-secret", "\x1b", "\x07"):
        assert secret not in text


def test_credentials_in_a_git_remote_and_a_package_origin_are_removed_and_said(tmp_path):
    system = _box(tmp_path)
    _venv(system)
    _process(system, 4100, [VENV + "/bin/python3", "-m", "sglang.launch_server", "--model-path", "/m"])
    facts = _adopt(system)
    [nvidia] = facts["dkms"]
    assert nvidia["git"]["repo"] == "https://***@github.com/x/fork.git"
    [sglang] = facts["engines"][0]["packages"]
    assert sglang["install"] == {"vcs": "git", "url": "https://***@git.example/sglang.git", "commit": "c" * 40}
    [note] = [n for n in facts["checks"]["notes"] if n.startswith("credentials removed from a URL")]
    assert "dkms[0].git.repo" in note and "engines[0].packages[0].install.url" in note
    assert "s3cret" not in json.dumps(facts) and "t0ken" not in json.dumps(facts)


def test_an_engine_of_another_user_is_skipped_and_named(tmp_path):
    system = _box(tmp_path)
    _process(system, 4100, ["/usr/bin/python3", "-m", "sglang.launch_server", "--model-path", "/root-model"])
    _process(system, 4200, ["/usr/bin/python3", "-m", "sglang.launch_server", "--model-path", "/serve-model"],
             uid=990)
    _process(system, 5100, ["/usr/bin/python3", "-m", "sglang.launch_server", "--model-path", ATTACK], uid=1001)
    _process(system, 5200, ["/usr/bin/python3", "-m", "sglang.launch_server", "--model-path", "/m"], uid=4242)
    facts = _adopt(system)
    assert [e["pid"] for e in facts["engines"]] == [4100, 4200]  # root's and the serve user's
    notes = facts["checks"]["notes"]
    assert any(n.startswith("the engine /proc/5100 runs as user mallory: skipped, not read") and
               "the serve user rigbook-serve" in n for n in notes)
    assert any(n.startswith("the engine /proc/5200 runs as user uid 4242: skipped") for n in notes)
    assert ATTACK not in json.dumps(facts["engines"])
    # the serve user named by the inventory (serve_user) is the one whose engines are read
    facts = _adopt(system, serve_user="mallory")
    assert [e["pid"] for e in facts["engines"]] == [4100, 5100]


def test_a_venv_owned_by_another_user_is_not_read(tmp_path):
    system = _box(tmp_path)
    _venv(system, owner=1001)  # mallory's venv; the engine runs as root
    _process(system, 4100, [VENV + "/bin/python3", "-m", "sglang.launch_server", "--model-path", "/m"])
    facts = _adopt(system, wheels_dir=["/srv/wheels"])
    [engine] = facts["engines"]
    assert engine["venv_refused"] == "owned by mallory, neither root nor the engine's user root"
    assert engine["packages"] == [] and engine["sglang_files"] is None and engine["venv_stamp"] is None
    [said] = [u for u in facts["checks"]["unpinned"] if u.startswith("rigbook_pins.sglang: the venv /opt/sgl")]
    assert "owned by mallory" in said and "does not read it" in said
    # the same venv owned by the engine's own user is read
    _venv_owner(system, 990)
    (system / "proc/4100/status").write_text("Name:\tpython3\nPid:\t4100\nPPid:\t1\nUid:\t990\t990\t990\t990\n")
    facts = _adopt(system, wheels_dir=["/srv/wheels"])
    assert [p["name"] for p in facts["engines"][0]["packages"]] == ["sglang"]


def _venv_owner(system, owner):
    for top, dirs, names in os.walk(system / VENV.lstrip("/")):
        for name in dirs + names:
            os.chown(os.path.join(top, name), owner, owner)
    os.chown(system / VENV.lstrip("/"), owner, owner)


def _secret_file(tmp_path, name, content):
    """A root-only file outside the box's venv (outside the system root too): what a venv owner would like to see."""
    secret = tmp_path / name
    secret.write_text(content)
    secret.chmod(0o600)
    return secret


@pytest.fixture
def swapping(monkeypatch, tmp_path):
    """The file about to be opened swapped for a link to a root-only file at the last moment: when its folder is
    already open and the open of the file itself is called (the race a local user who owns the venv can run against
    any check-then-open read). server_args.py is swapped on its second open (the patch's read, after RECORD's hash),
    the venv stamp on its first."""
    secret = _secret_file(tmp_path, "root-only", SECRET + "\n")
    stamp_secret = _secret_file(tmp_path, "root-only.json", json.dumps({"no_deps": True, "find_links": [SECRET]}))
    real_open = os.open
    calls = []

    def opener(path, flags, mode=0o777, *, dir_fd=None):
        if dir_fd is not None and path in ("server_args.py", ".rigbook-venv.json"):
            calls.append(path)
            if (path, calls.count(path)) in (("server_args.py", 2), (".rigbook-venv.json", 1)):
                os.unlink(path, dir_fd=dir_fd)
                os.symlink(secret if path == "server_args.py" else stamp_secret, path, dir_fd=dir_fd)
        return real_open(path, flags, mode, dir_fd=dir_fd)

    monkeypatch.setattr(os, "open", opener)
    return calls


def test_the_local_patch_and_the_stamp_are_read_as_they_are_without_a_race(tmp_path):
    system = _box(tmp_path)
    _venv(system, owner=990)
    stamp = system / VENV.lstrip("/") / ".rigbook-venv.json"
    stamp.write_text(json.dumps({"no_deps": True, "patches": []}))
    os.chown(stamp, 990, 990)
    _process(system, 4100, [VENV + "/bin/python3", "-m", "sglang.launch_server", "--model-path", "/m"], uid=990)
    facts = _adopt(system, wheels_dir=["/srv/wheels"])
    [engine] = facts["engines"]
    local = engine["sglang_files"]
    assert local["patch"] == ("--- a/sglang/srt/server_args.py\n+++ b/sglang/srt/server_args.py\n@@ -1,2 +1,2 @@\n"
                              " API_KEY = None\n-DEBUG = False\n+DEBUG = True\n") and local["problem"] is None
    assert engine["venv_stamp"] == {"no_deps": True, "patches": []}


def test_a_file_swapped_for_a_link_while_it_was_read_never_reaches_the_result(tmp_path, swapping):
    system = _box(tmp_path)
    _venv(system, owner=990)
    stamp = system / VENV.lstrip("/") / ".rigbook-venv.json"
    stamp.write_text(json.dumps({"no_deps": True, "patches": []}))
    _process(system, 4100, [VENV + "/bin/python3", "-m", "sglang.launch_server", "--model-path", "/m"], uid=990)
    facts = _adopt(system, wheels_dir=["/srv/wheels"])
    # the stamp, then server_args.py hashed (RECORD), read for the patch (swapped), read for the flags (a link now)
    assert swapping == [".rigbook-venv.json", "server_args.py", "server_args.py", "server_args.py"]
    assert (system / SITE.lstrip("/") / "sglang/srt/server_args.py").is_symlink()
    [engine] = facts["engines"]
    assert engine["sglang_files"]["patch"] is None
    assert engine["sglang_files"]["problem"] == ("/opt/sgl/lib/python3.11/site-packages/sglang/srt/server_args.py: "
                                                 "a symbolic link on the way (not read)")
    assert engine["venv_stamp"] is None and engine["sglang_flags"] is None
    assert "rigbook's venv stamp /opt/sgl/.rigbook-venv.json: a symbolic link on the way (not read)" in (
        facts["checks"]["notes"])
    assert SECRET not in json.dumps(facts)


def _link(path, target):
    path.unlink()
    path.symlink_to(target)


def _record_link(system, tmp_path):
    # a RECORD naming the root-only file's own content as paths: read, they would come back in "changed"
    target = _secret_file(tmp_path, "root-only-record", f"{SECRET},sha256=AAAA,1\n")
    _link(system / SITE.lstrip("/") / "sglang-0.5.23.dist-info/RECORD", target)
    return {"changed": [{"path": "sglang-0.5.23.dist-info/RECORD",
                         "state": "a symbolic link on the way (not read)"}]}


def _direct_url_link(system, tmp_path):
    target = _secret_file(tmp_path, "root-only.json", json.dumps({"url": "https://git.example/" + SECRET,
                                                                  "vcs_info": {"vcs": "git", "commit_id": "d" * 40}}))
    _link(system / SITE.lstrip("/") / "sglang-0.5.23.dist-info/direct_url.json", target)
    return {"install": {"local": "unreadable", "url": None}}


def _folder_link(system, tmp_path):
    # sglang/ itself a link to a folder outside the venv whose server_args.py holds the secret: the diff would show it
    outside = tmp_path / "outside/sglang/srt"
    outside.mkdir(parents=True)
    (outside / "server_args.py").write_text(f"API_KEY = None\n{SECRET}\n")
    (outside / "server_args.py").chmod(0o600)
    site = system / SITE.lstrip("/")
    os.rename(site / "sglang", tmp_path / "moved")
    (site / "sglang").symlink_to(tmp_path / "outside/sglang")
    return {"changed": [{"path": "sglang/srt/server_args.py",
                         "state": "outside site-packages or behind a link (not read)"}], "patch": None}


def _hard_link(system, tmp_path):
    # the serve user's venv holding a hard link to a root-only file: no link on the way, the owner check refuses it
    target = _secret_file(tmp_path, "root-only-hard", f"API_KEY = None\n{SECRET}\n")
    path = system / SITE.lstrip("/") / "sglang/srt/server_args.py"
    path.unlink()
    os.link(target, path)
    return {"changed": [{"path": "sglang/srt/server_args.py",
                         "state": "a file of uid 0 that uid 990 cannot read (not read)"}], "patch": None}


def _source_link(system, tmp_path):
    # a flag source that is a link, and a flag folder that is a link, both to root-only files naming a flag
    target = _secret_file(tmp_path, "root-only.py", f'x = "--{SECRET.split()[-1]}"\n')
    folder = tmp_path / "flags"
    folder.mkdir()
    (folder / "f.py").write_text(f'y = "--{SECRET.split()[-1]}-too"\n')
    (folder / "f.py").chmod(0o600)
    srt = system / SITE.lstrip("/") / "sglang/srt"
    (srt / "server_args.py").write_text('parser.add_argument("--config")\n')
    (srt / "arg_groups").mkdir()
    (srt / "arg_groups/a.py").symlink_to(target)
    (srt / "arg_groups/b").symlink_to(folder)
    return {"flags": ["--config"]}


@pytest.mark.parametrize("plant", [_record_link, _direct_url_link, _folder_link, _hard_link, _source_link])
def test_a_venv_file_that_leads_to_a_root_only_file_is_never_read(tmp_path, plant):
    system = _box(tmp_path)
    _venv(system, owner=990)
    expected = plant(system, tmp_path)
    _process(system, 4100, [VENV + "/bin/python3", "-m", "sglang.launch_server", "--model-path", "/m"], uid=990)
    facts = _adopt(system, wheels_dir=["/srv/wheels"])
    [engine] = facts["engines"]
    assert "venv_refused" not in engine  # the venv is read; the one file is not
    assert SECRET not in json.dumps(facts) and "hunter2" not in json.dumps(facts)
    local = engine["sglang_files"]
    for key in ("changed", "patch"):
        if key in expected:
            assert local[key] == expected[key]
    if "install" in expected:
        assert engine["packages"][0]["install"] == expected["install"]
    if "flags" in expected:
        assert engine["sglang_flags"] == expected["flags"]


def test_a_fifo_in_a_venv_is_refused_without_waiting_for_a_writer(tmp_path):
    system = _box(tmp_path)
    _venv(system, owner=990)
    record = system / SITE.lstrip("/") / "sglang-0.5.23.dist-info/RECORD"
    record.unlink()
    os.mkfifo(record)
    _process(system, 4100, [VENV + "/bin/python3", "-m", "sglang.launch_server", "--model-path", "/m"], uid=990)
    done = []
    reader = threading.Thread(target=lambda: done.append(_adopt(system)), daemon=True)
    reader.start()
    reader.join(60)
    assert done, "adopt_facts waited on a FIFO"
    assert done[0]["engines"][0]["sglang_files"]["changed"] == [
        {"path": "sglang-0.5.23.dist-info/RECORD", "state": "not a regular file (not read)"}]


@pytest.fixture
def opened(monkeypatch):
    """Every path the no-follow reader opens (under the system root) and every path open() is given."""
    seen = []
    real_nofollow, real_open = files.open_nofollow, builtins.open

    def nofollow(root, rel, directory=False):
        seen.append(("folder " if directory else "") + os.path.join("/", *[p for p in rel.split("/") if p]))
        return real_nofollow(root, rel, directory)

    def opener(file, *args, **kwargs):
        seen.append(str(file))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(files, "open_nofollow", nofollow)
    monkeypatch.setattr(builtins, "open", opener)
    return seen


def test_another_users_engine_and_venv_are_never_read(tmp_path, opened):
    system = _box(tmp_path)
    _venv(system, owner=1001)  # mallory's venv, run by root's engine 4100
    _process(system, 4100, [VENV + "/bin/python3", "-m", "sglang.launch_server", "--model-path", "/m"])
    other = tmp_path / "system/home/mallory/v"
    (other / "bin").mkdir(parents=True)
    (other / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (other / "lib/python3.11/site-packages/x-1.dist-info").mkdir(parents=True)
    _process(system, 5100, ["/home/mallory/v/bin/python3", "-m", "sglang.launch_server", "--model-path", "/m"],
             uid=1001)
    facts = _adopt(system, wheels_dir=["/srv/wheels"])
    assert [e["pid"] for e in facts["engines"]] == [4100]
    assert facts["engines"][0]["venv_refused"] == "owned by mallory, neither root nor the engine's user root"
    # of mallory's venv only its own folder was looked at (its owner); of mallory's engine's venv nothing at all
    assert [p for p in opened if VENV in p] == ["folder " + VENV]
    assert not [p for p in opened if "/home/mallory" in p]


def test_a_venv_reached_through_a_link_and_a_cuda_venv_not_roots_are_not_read(tmp_path):
    system = _box(tmp_path)
    _venv(system, owner=990)
    os.rename(system / "opt/sgl", system / "opt/real")
    (system / "opt/sgl").symlink_to("real")
    _process(system, 4100, [VENV + "/bin/python3", "-m", "sglang.launch_server", "--model-path", "/m"], uid=990)
    cuda = system / "opt/rigbook/cuda"
    (cuda / "lib/python3.11/site-packages/nvidia_cuda_nvcc-13.0.88.dist-info").mkdir(parents=True)
    (cuda / "pyvenv.cfg").write_text("home = /usr/bin\n")
    os.chown(cuda, 1001, 1001)
    facts = _adopt(system, wheels_dir=["/srv/wheels"])
    [engine] = facts["engines"]
    assert engine["venv_refused"] == "reached through a symbolic link" and engine["packages"] == []
    assert facts["cuda_venv"] is None
    unpinned = facts["checks"]["unpinned"]
    assert "rigbook_pins.cuda_toolchain: /opt/rigbook/cuda is owned by mallory, not root's: adopt does not read it" in (
        unpinned)
    os.chown(cuda, 0, 0)
    assert [p["name"] for p in _adopt(system)["cuda_venv"]["packages"]] == ["nvidia-cuda-nvcc"]
