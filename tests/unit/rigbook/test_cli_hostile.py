"""Hostile input through the CLI: each case exits with its code, prints no traceback, names the problem, and changes
no file outside the state directory or the output path.

Every case runs `provision` as a subprocess in a fresh work folder (its inputs), with its own state directory and
its own TMPDIR; a listing of the work folder (names, kinds, sizes, modes, link targets, mtimes) and of TMPDIR is
taken before and after and must be equal. The inputs are hostile on purpose: inventories (bad bytes, YAML bombs,
host names that are paths, shell in the kernel command line), serve profiles (control characters, abbreviated
flags, NaN), snapshots (crafted tarballs), state files (a string where a mapping belongs, a Jinja2 expression or NaN
where a figure belongs, terminal escape sequences in what a box said, a manifest whose labels excuse its drift),
parse inputs (one that never ends) and arguments. No case's output holds an ESC byte. The tarballs are built here
with the tarfile module; nothing is extracted by the test itself.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest
import yaml
from helpers.cli import edit_yaml, provision, set_key, tree_listing

HOMELAB = Path(__file__).resolve().parents[3] / "inventory" / "homelab"
G3080 = "group_vars/x99_3080.yml"


@dataclass
class Work:
    """One case's folders: inputs under `root`, the state directory and TMPDIR beside it."""

    root: Path
    state: Path
    tmp: Path

    def inventory(self, name: str = "inv") -> Path:
        """A copy of inventory/homelab whose hosts point at a closed loopback port (a case that got past every
        check would meet a refused connection, never the placeholder addresses)."""
        dest = self.root / name
        shutil.copytree(HOMELAB, dest)
        hosts = yaml.safe_load((dest / "hosts.yml").read_text())
        for group in hosts["all"]["children"].values():
            for host_vars in group["hosts"].values():
                host_vars.update(ansible_host="127.0.0.1", ansible_port=9)
        (dest / "hosts.yml").write_text(yaml.safe_dump(hosts, sort_keys=False))
        return dest

    def edit(self, inv: Path, rel: str, mutate: Callable) -> Path:
        edit_yaml(inv / rel, mutate)
        return inv

    def write(self, rel: str, content) -> Path:
        path = self.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
        return path

    def state_file(self, rel: str, content) -> Path:
        path = self.state / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
        return path


# --- builders: each takes a Work and returns the provision arguments ----------------------------------------

def _serve(key: str, value):
    def mutate(data):
        data["rigbook_serve"][0][key] = value
    return mutate


def _extra(*words):
    def mutate(data):
        data["rigbook_serve"][0]["extra_args"] = list(words)
    return mutate


def validate_edit(rel: str, mutate) -> Callable:
    def build(w: Work):
        return ["validate", "-i", w.edit(w.inventory(), rel, mutate)]
    return build


def validate_raw(rel: str, content) -> Callable:
    """An inventory with the file REL (under it) replaced by CONTENT (bytes or text)."""
    def build(w: Work):
        inv = w.inventory()
        path = inv / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
        return ["validate", "-i", inv]
    return build


def hosts_yml(text: str) -> Callable:
    return validate_raw("hosts.yml", text)


def _hosts(*names) -> str:
    body = "".join(f"        {json.dumps(n)}:\n          ansible_host: 127.0.0.1\n" for n in names)
    return f"all:\n  children:\n    x99_3080:\n      hosts:\n{body}"


def _alias_bomb() -> str:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    for i in range(1, 12):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]")
    return "\n".join(lines) + "\nrigbook_gpu: *a11\n"


def hosts_is(kind: str) -> Callable:
    def build(w: Work):
        inv = w.inventory()
        (inv / "hosts.yml").unlink()
        if kind == "folder":
            (inv / "hosts.yml").mkdir()
        elif kind == "dangling":
            (inv / "hosts.yml").symlink_to(w.root / "nowhere.yml")
        elif kind == "loop":
            (inv / "hosts.yml").symlink_to(inv / "hosts.yml")
        return ["validate", "-i", inv]
    return build


def two_vendor_groups(w: Work):
    inv = w.inventory()
    data = yaml.safe_load((inv / "hosts.yml").read_text())
    data["all"]["children"]["x99_r9700"]["hosts"]["rig-3080"] = {"ansible_host": "x99-3080.lan.invalid"}
    (inv / "hosts.yml").write_text(yaml.safe_dump(data))
    return ["validate", "-i", inv]


def extra_var(text: str) -> Callable:
    """site.yml with -e TEXT over the loopback copy of homelab (refused before any host: homelab is not ready)."""
    def build(w: Work):
        return ["site.yml", "-i", w.inventory(), "-e", text]
    return build


# snapshots ---------------------------------------------------------------------------------------------------

def _member(name, kind=tarfile.REGTYPE, data=b"", link="", size=None):
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = link
    info.mode = 0o755 if kind == tarfile.DIRTYPE else 0o644
    info.size = len(data) if size is None else size
    return info, (io.BytesIO(data) if kind == tarfile.REGTYPE else None)


def _host_members(host="rig"):
    """The smallest well-formed host of a snapshot: HOST/ladder_view.json and HOST/tree/."""
    return [_member(host, tarfile.DIRTYPE), _member(f"{host}/ladder_view.json", data=b"{}"),
            _member(f"{host}/tree", tarfile.DIRTYPE)]


def tarball(*members, good_host=True) -> Callable:
    def build(w: Work):
        path = w.root / "snap.tar.gz"
        with tarfile.open(path, "w:gz") as tar:
            for info, data in ([*_host_members()] if good_host else []) + list(members):
                tar.addfile(info, data)
        return ["verify", "--replay", path]
    return build


def replay_path_with_markup(w: Work):
    return ["verify", "--replay", w.root / "[/x]" / "[bold]snap.tar.gz"]


# state files ---------------------------------------------------------------------------------------------------

def state_then(rel: str, content, *args) -> Callable:
    def build(w: Work):
        w.state_file(rel, content)
        swap = {"INV": lambda: w.inventory(), "OUT": lambda: w.root / "report.html"}
        return [swap[a]() if a in swap else a for a in args]
    return build


def state_files_then(files: dict, *args) -> Callable:
    """Several state files (REL -> content) written, then ARGS."""
    def build(w: Work):
        for rel, content in files.items():
            w.state_file(rel, content)
        return list(args)
    return build


# What a box or a hand edit can put in a state file: a Jinja2 expression where a figure belongs (handed to the next
# run as `-e @baselines.json`, Ansible would run it), NaN, and terminal escape sequences: ESC[1A ESC[2K (up a line,
# erase it), OSC 52 (write the clipboard), a one-byte C1 CSI, a right-to-left override.
TEMPLATE_FIGURE = "{{ lookup('pipe', 'touch MARKER') }}"
ESCAPES = "\x1b[1A\x1b[2K\x1b]52;c;ZXZpbA==\x07\x9b2K\u202e"
SHOWN = "\\x1b[1A\\x1b[2K\\x1b]52;c;ZXZpbA==\\x07\\x9b2K\\u202e"


def _baseline(metrics: dict, at="2026-01-01 00:00:00", versions=None) -> str:
    return json.dumps({"host": "rig-3080", "recorded": {"at": at, "metrics": metrics, "versions": versions or {}},
                       "history": [{"at": at, "metrics": metrics}]})


def _manifest(items: dict) -> str:
    return json.dumps({"schema": 1, "items": items})


MANIFESTS = "runs/20260101-000000-manifest-abcdef/manifests/"


def report_to(target: str) -> Callable:
    def build(w: Work):
        if target == "folder":
            out = w.root / "out"
            out.mkdir()
        else:
            out = w.root / "no" / "such" / "report.html"
        return ["report", "-i", w.inventory(), "-o", out]
    return build


# parse ---------------------------------------------------------------------------------------------------------

def parse_input(kind: str, content) -> Callable:
    def build(w: Work):
        path = w.write("input.txt", content)
        return ["parse", kind, path]
    return build


def parse_folder(w: Work):
    (w.root / "folder").mkdir()
    return ["parse", "nvidia-smi-topo", w.root / "folder"]


@dataclass
class Case:
    id: str
    build: Callable
    words: str  # a piece of the message that names the problem
    code: int = 2  # 0: read past with a warning that names it
    output: str = ""  # the file (under the work folder) the command may write

    def param(self):
        return pytest.param(self, id=self.id)


BLANK_HOST = {"ansible_host": "127.0.0.1"}

CASES = [
    # --- inventories -----------------------------------------------------------------------------------------
    Case("group-vars-random-bytes", validate_raw(G3080, bytes(range(256)) * 4), "not UTF-8"),
    Case("hosts-random-bytes", validate_raw("hosts.yml", bytes(range(128, 256)) * 8), "not UTF-8"),
    Case("recursive-alias", validate_raw(G3080, "rigbook_gpu: &a\n  self: *a\n"), "recursive"),
    Case("alias-bomb", validate_raw(G3080, _alias_bomb()), "its aliases expand to"),
    Case("duplicate-key", validate_raw(G3080, "rigbook_gpu: {vendor: nvidia}\nrigbook_gpu: {vendor: amd}\n"),
         "rigbook_gpu"),
    Case("file-over-4mib", validate_raw(G3080, "# " + "x" * (5 << 20) + "\n"), "at most 4194304 bytes"),
    Case("yaml-python-tag", validate_raw(G3080, "rigbook_gpu: !!python/object/apply:os.system [id]\n"), ""),
    Case("top-level-list", validate_raw(G3080, "- rigbook_gpu\n"), G3080.split("/")[-1]),
    Case("yaml-syntax-error", validate_raw(G3080, "rigbook_gpu: [unclosed\n"), G3080.split("/")[-1]),
    Case("hosts-is-folder", hosts_is("folder"), "folder"),
    Case("hosts-dangling-link", hosts_is("dangling"), "hosts.yml"),
    Case("hosts-link-loop", hosts_is("loop"), "hosts.yml"),
    Case("hosts-empty", hosts_yml(""), "no hosts"),
    Case("host-name-climbs-out", hosts_yml(_hosts("../../victim/package")), "../../victim/package"),
    Case("host-name-backslash", hosts_yml(_hosts("rig\\evil")), "rig\\\\evil"),
    Case("host-name-leading-dot", hosts_yml(_hosts(".hidden")), ".hidden"),
    Case("host-name-control-char", hosts_yml(_hosts("rig\tx")), "host name"),
    Case("host-in-two-vendor-groups", two_vendor_groups, "rig-3080"),
    Case("unknown-rigbook-variable", validate_edit(G3080, set_key("rigbook_gpus", 2)), "unknown variable"),
    Case("vendor-is-a-list", validate_edit(G3080, set_key("rigbook_gpu.vendor", ["nvidia"])), "rigbook_gpu.vendor"),
    Case("cmdline-command-substitution",
         validate_edit(G3080, set_key("rigbook_pins.kernel.cmdline", ["iommu=pt $(reboot)"])),
         "rigbook_pins.kernel.cmdline"),
    Case("cmdline-backticks", validate_edit(G3080, set_key("rigbook_pins.kernel.cmdline", ["x=`id`"])),
         "rigbook_pins.kernel.cmdline"),
    Case("cmdline-newline", validate_edit(G3080, set_key("rigbook_pins.kernel.cmdline", ["iommu=pt\nGRUB_X=1"])),
         "rigbook_pins.kernel.cmdline"),
    Case("extra-var-shell-in-cmdline", extra_var('{"rigbook_pins": {"kernel": {"cmdline": ["$(id)"]}}}'),
         'rigbook_pins.kernel.cmdline[0]: bad value "$(id)"'),
    Case("extra-var-newline-in-unit", extra_var('{"rigbook_serve": [{"name": "x", "model_path": "/m\\n[Service]"}]}'),
         "rigbook_serve[0].model_path"),
    Case("extra-var-unclosed-quote", extra_var("a='x"), "No closing quotation"),
    Case("extra-var-not-key-value", extra_var("novalue"), "expected KEY=VALUE"),
    Case("extra-var-missing-file", extra_var("@/nonexistent/rigbook-vars.yml"), "does not exist"),
    # --- serve profiles ----------------------------------------------------------------------------------------
    Case("served-name-newline", validate_edit(G3080, _serve("served_model_name", "m\n[Service]\nExecStartPre=+/x")),
         "served_model_name"),
    Case("model-path-newline", validate_edit(G3080, _serve("model_path", "/srv/m\nExecStartPre=+/bin/id")),
         "model_path"),
    Case("extra-arg-newline", validate_edit(G3080, _extra("--x=1\n[Service]")), "extra_args"),
    Case("extra-arg-abbrev-host", validate_edit(G3080, _extra("--hos", "0.0.0.0")), "--host"),
    Case("extra-arg-abbrev-api-key", validate_edit(G3080, _extra("--api-ke", "KEY")), "--api-key"),
    Case("extra-arg-api-key", validate_edit(G3080, _extra("--api-key=KEY")), "api_key_file"),
    Case("mem-fraction-nan", validate_edit(G3080, _serve("mem_fraction_static", float("nan"))),
         "mem_fraction_static"),
    Case("mem-fraction-inf", validate_edit(G3080, _serve("mem_fraction_static", float("inf"))),
         "mem_fraction_static"),
    Case("public-bind-without-key", validate_edit(G3080, _serve("bind", "0.0.0.0")), "api_key_file"),
    Case("port-out-of-range", validate_edit(G3080, _serve("port", 70000)), "port"),
    Case("port-a-string", validate_edit(G3080, _serve("port", "30000; rm -rf /")), "port"),
    Case("profile-name-a-path", validate_edit(G3080, _serve("name", "../../etc/evil")), "name"),
    Case("env-value-newline", validate_edit(G3080, _serve("env", {"NCCL_P2P_LEVEL": "SYS\nLD_PRELOAD=/x.so"})),
         "env"),
    Case("env-name-not-a-name", validate_edit(G3080, _serve("env", {"A B": "1"})), "env"),
    # --- snapshots ---------------------------------------------------------------------------------------------
    Case("tar-too-many-members", tarball(*[_member(f"rig/tree/f{i}") for i in range(100_001)]), "members"),
    Case("tar-random-bytes", lambda w: ["verify", "--replay", w.write("snap.tar.gz", os.urandom(4096))],
         "not a snapshot tarball"),
    Case("tar-empty-file", lambda w: ["verify", "--replay", w.write("snap.tar.gz", b"")], "snap.tar.gz"),
    Case("tar-no-host", tarball(_member("readme.txt", data=b"hi"), good_host=False), "no host evidence"),
    Case("replay-path-markup", replay_path_with_markup, "[/x]"),
    # --- state files -------------------------------------------------------------------------------------------
    Case("baseline-a-string", state_then("baselines/rig-3080.json", '"oops"', "baseline", "show"), "rig-3080.json"),
    Case("baseline-not-json", state_then("baselines/rig-3080.json", "{not json", "baseline", "show"),
         "rig-3080.json"),
    Case("baseline-not-utf8", state_then("baselines/rig-3080.json", bytes(range(128, 256)), "baseline", "show"),
         "rig-3080.json"),
    Case("baseline-history-a-string",
         state_then("baselines/rig-3080.json", '{"host": "rig-3080", "recorded": {}, "history": "x"}',
                    "baseline", "show"), "rig-3080.json"),
    Case("baseline-inventories-a-list",
         state_then("baselines/rig-3080.json", '{"host": "rig-3080", "inventories": []}', "baseline", "show"),
         "its inventories is not an object but list"),
    Case("baseline-inventory-key-a-template",
         state_then("baselines/rig-3080.json", json.dumps({"host": "rig-3080", "inventories": {
             "{{ x }}": {"recorded": {"metrics": {"p2p_gbs": 1.0}}}}}), "report", "-i", "INV", "-o", "OUT"),
         "inventory section '{{ x }}': not an inventory key (16 of 0-9 a-f)): left out (the file was not moved)", 0,
         "report.html"),
    Case("baseline-old-run-dir-climbs-out",
         state_then("baselines/rig-3080.json", json.dumps({"host": "rig-3080", "recorded": {
             "metrics": {"p2p_gbs": 1.0}, "run_dir": "../../../../etc"}}), "baseline", "show"),
         "rig-3080: the baseline of inventory unknown", 0),
    Case("baseline-show-markup-host", lambda w: ["baseline", "show", "[/x]"], "[/x]: no baseline recorded", 0),
    Case("baseline-show-host-climbs-out", lambda w: ["baseline", "show", "../../../../etc/passwd"],
         "../../../../etc/passwd: no baseline recorded", 0),
    Case("run-record-a-list", state_then("runs/20260101-000000-x/run.json", "[1, 2]", "runs"),
         "run.json is unusable: not a JSON object but list", 0),
    Case("run-record-not-json", state_then("runs/20260101-000000-x/run.json", "{", "runs"),
         "run.json is unusable: not valid JSON", 0),
    Case("report-over-bad-run",
         state_then("runs/20260101-000000-x/run.json", '"x"', "report", "-i", "INV", "-o", "OUT"),
         "run.json is unusable: not a JSON object but str", 0, "report.html"),
    Case("report-over-bad-baseline",
         state_then("baselines/rig-3080.json", '["x"]', "report", "-i", "INV", "-o", "OUT"),
         "rig-3080.json is corrupt (not a JSON object but list): left out (the file was not moved)", 0, "report.html"),
    Case("baseline-figure-template-show",
         state_then("baselines/rig-3080.json", _baseline({"p2p_gbs": TEMPLATE_FIGURE}), "baseline", "show"),
         "figure 'p2p_gbs' left out (not a finite number but str)", 0),
    Case("baseline-figure-template-report",
         state_then("baselines/rig-3080.json", _baseline({"p2p_gbs": TEMPLATE_FIGURE, "bus_gbs": 3.5}),
                    "report", "-i", "INV", "-o", "OUT"),
         "figure 'p2p_gbs' left out (not a finite number but str)", 0, "report.html"),
    Case("baseline-figure-nan-report",
         state_then("baselines/rig-3080.json", _baseline({"p2p_gbs": float("nan")}), "report", "-i", "INV", "-o",
                    "OUT"), "figure 'p2p_gbs' left out (not a finite number but float)", 0, "report.html"),
    Case("baseline-figure-name-template-report",
         state_then("baselines/rig-3080.json", _baseline({TEMPLATE_FIGURE: 1.0}), "report", "-i", "INV", "-o",
                    "OUT"), "left out (its name is not 1-64 of a-z 0-9 _ -)", 0, "report.html"),
    Case("group-baseline-figure-template-report",
         state_then("baselines/groups/x99_3080.json",
                    json.dumps({"group": "x99_3080", "recorded": {"metrics": {"p2p_gbs": TEMPLATE_FIGURE}}}),
                    "report", "-i", "INV", "-o", "OUT"),
         "x99_3080.json: figure 'p2p_gbs' left out (not a finite number but str)", 0, "report.html"),
    Case("baseline-escape-sequences-show",
         state_then("baselines/rig-3080.json", _baseline({"p2p_gbs": 1.0}, at=f"2026{ESCAPES}",
                                                         versions={"kernel": f"6.8{ESCAPES}"}), "baseline", "show"),
         f"rig-3080: baseline of 2026{SHOWN} (kernel 6.8{SHOWN})", 0),
    Case("run-record-escape-sequences",
         state_then("runs/20260101-000000-x/run.json",
                    json.dumps({"playbook": f"site.yml{ESCAPES}", "started": "x", "exit_code": 1,
                                "hosts": {f"rig{ESCAPES}": {"state": "failed"}}}), "runs"),
         f"site.yml{SHOWN} -i ?  hosts=1  failed: rig{SHOWN}", 0),
    Case("manifest-escape-sequences",
         state_files_then({MANIFESTS + "a.json": _manifest({"kernel.running": {"value": "6.8"}}),
                           MANIFESTS + "b.json": _manifest({"kernel.running": {"value": f"6.8{ESCAPES}"},
                                                            f"kernel.x{ESCAPES}": {"value": ESCAPES}})},
                          "diff", "a", "b"), f"  kernel.x{SHOWN}\n", 1),
    Case("manifest-labels-excuse-drift",
         state_files_then({MANIFESTS + "a.json": _manifest({"file.etc/rigbook/gpu.env": {"value": "aa"}}),
                           MANIFESTS + "b.json": _manifest({"file.etc/rigbook/gpu.env": {
                               "value": "bb", "group": "host", "unique": True, "bits": True, "build": "x"}})},
                          "diff", "a", "b"), "1 pinned item(s) differ", 1),
    # --- outputs -----------------------------------------------------------------------------------------------
    Case("report-to-a-folder", report_to("folder"), "is a directory"),
    Case("report-missing-parent", report_to("missing-parent"), "no/such"),
    # --- parse -------------------------------------------------------------------------------------------------
    Case("parse-unrecognised", parse_input("nvidia-smi-topo", "hello world\n" * 50), "found nothing it reads"),
    Case("parse-random-bytes", parse_input("nccl", os.urandom(2048)), ""),
    Case("parse-unknown-kind", parse_input("no-such-kind", "x\n"), "no-such-kind"),
    Case("parse-missing-file", lambda w: ["parse", "nccl-log", w.root / "missing.txt"], "missing.txt"),
    Case("parse-a-folder", parse_folder, "folder"),
    Case("parse-dev-zero", lambda w: ["parse", "kernel-log", "/dev/zero"], "/dev/zero: more than 64 MiB"),
    # --- arguments ---------------------------------------------------------------------------------------------
    Case("unknown-command", lambda w: ["valdate"], "unknown command 'valdate'"),
    Case("missing-inventory", lambda w: ["site.yml"], "-i/--inventory"),
    Case("inventory-not-found", lambda w: ["validate", "-i", w.root / "nowhere"], "not found"),
]


@pytest.mark.parametrize("case", [c.param() for c in CASES])
def test_hostile_input_is_refused_cleanly(tmp_path, case):
    w = Work(tmp_path / "work", tmp_path / "state", tmp_path / "tmp")
    for folder in (w.root, w.state, w.tmp):
        folder.mkdir(mode=0o700)
    args = case.build(w)
    # The state directory may gain the collection link (made on first use); nothing else in it may change.
    skip = {w.state / "collections"} | ({w.root / case.output} if case.output else set())
    before = tree_listing(tmp_path, skip=skip)
    proc = provision(*args, env={"RIGBOOK_STATE_DIR": str(w.state), "TMPDIR": str(w.tmp)}, timeout=120)
    after = tree_listing(tmp_path, skip=skip)
    text = proc.stdout + proc.stderr
    assert "Traceback" not in text, text
    assert "\x1b" not in text, text
    assert proc.returncode == case.code, text
    assert case.words in text, text
    assert before == after, {k: (before.get(k), after.get(k)) for k in set(before) ^ set(after) or before}
    assert not list(w.tmp.iterdir()), f"left in TMPDIR: {list(w.tmp.iterdir())}"


def test_matrix_is_at_least_sixty_cases():
    assert len(CASES) >= 60
    assert len({c.id for c in CASES}) == len(CASES)
