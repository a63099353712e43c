"""adopt_facts through its main(): what a box's local users can put in what adopt reads comes back typed and bounded
(control characters, an environment name with a template in it, credentials in URLs, the admin API key, over-long
words), another user's engine is skipped and named, a venv of another user is not read, and a file swapped for a
link while it was read never reaches the result.

The box is a system root laid out here (reconstructed as Linux shows a process: NUL-separated cmdline and environ,
status with its Uid line, cgroup v2; a venv as pip leaves it: pyvenv.cfg, dist-info with RECORD, a wheel in a
folder), commands answered from the table run_module checks (dpkg-query, dkms status).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import zipfile

import pytest
from ansible_collections.rigbook.homelab.plugins.module_utils.collect import adopt as collect
from ansible_collections.rigbook.homelab.plugins.module_utils.facts import packages
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


@pytest.fixture
def swapping(monkeypatch, tmp_path):
    """collect/adopt's checks answered, then the file checked swapped for a link to a root-only file before it is
    opened: the race a local user who owns the venv can run against any check-then-open read."""
    secret = tmp_path / "root-only"
    secret.write_text(SECRET + "\n")
    secret.chmod(0o600)
    stamp_secret = tmp_path / "root-only.json"
    stamp_secret.write_text(json.dumps({"no_deps": True, "find_links": [SECRET]}))
    stamp_secret.chmod(0o600)
    real_inside, real_stamp_file = collect._inside, collect._stamp_file
    calls = []

    def inside(site, rel):
        full = real_inside(site, rel)
        calls.append(rel)
        if full and rel.endswith("server_args.py") and calls.count(rel) == 2:  # local_patch's check, after RECORD's
            os.unlink(full)
            os.symlink(secret, full)
        return full

    def stamp_file(full):
        answer = real_stamp_file(full)
        if answer:
            os.unlink(full)
            os.symlink(stamp_secret, full)
        return answer

    monkeypatch.setattr(collect, "_inside", inside)
    monkeypatch.setattr(collect, "_stamp_file", stamp_file)
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
    assert swapping.count("sglang/srt/server_args.py") >= 2  # the race ran: collect/adopt read through the link
    [engine] = facts["engines"]
    assert engine["sglang_files"]["patch"] is None
    assert engine["sglang_files"]["problem"] == ("/opt/sgl/lib/python3.11/site-packages/sglang/srt/server_args.py: "
                                                 "a symbolic link on the way (not read)")
    assert engine["venv_stamp"] is None
    assert "rigbook's venv stamp /opt/sgl/.rigbook-venv.json: a symbolic link on the way (not read)" in (
        facts["checks"]["notes"])
    assert SECRET not in json.dumps(facts)


def test_a_diff_that_says_other_lines_than_the_file_holds_is_refused():
    files = {"sglang/a.py": "one\ntwo\nthree"}

    def read(rel):
        return (files[rel], None) if rel in files else (None, f"{rel}: missing")

    patch = ("--- a/sglang/a.py\n+++ b/sglang/a.py\n@@ -1,3 +1,3 @@\n one\n-TWO\n+two\n three\n"
             "\\ No newline at end of file\n")
    assert adopt_facts.patch_problem(patch, read) is None
    assert adopt_facts.patch_problem(patch.replace("+two", "+root:x:0:0"), read) == (
        "the installed file differs from what was read of it (changed or swapped while read)")
    assert adopt_facts.patch_problem(patch.replace("a.py", "b.py"), read) == "sglang/b.py: missing"
    assert adopt_facts.patch_problem(patch[:-40], read) == "the diff ends inside a hunk"
    assert adopt_facts.patch_problem("garbage\n", read) == "line 1 of the diff is not a line adopt writes"
