"""Inventory validation: every bad value is named by file, group/host and key path (exit 2, no traceback)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers.cli import edit_yaml, provision, set_key, tree_listing

from rigbook.errors import UserError
from rigbook.validate import InventoryInvalid, validate

HOMELAB = Path(__file__).resolve().parents[3] / "inventory" / "homelab"


def _copy(tmp_path: Path) -> Path:
    dest = tmp_path / "inv"
    shutil.copytree(HOMELAB, dest)
    return dest


def _edit(inv: Path, rel: str, mutate) -> None:
    edit_yaml(inv / rel, mutate)


def _delete(path: str):
    def mutate(data):
        node = data
        keys = path.split(".")
        for key in keys[:-1]:
            node = node[key]
        del node[keys[-1]]

    return mutate


def _serve(key: str, value=None, delete=False):
    """Set (or delete) KEY of the first serve profile (rigbook_serve[0])."""
    def mutate(data):
        profile = data["rigbook_serve"][0]
        if delete:
            del profile[key]
        else:
            profile[key] = value

    return mutate


G3080 = "group_vars/x99_3080.yml"
G9700 = "group_vars/x99_r9700.yml"

# (case id, file edited, mutation, key path expected in the message, words expected in the message)
INVALID = [
    ("typo-in-pin-key", G3080, set_key("rigbook_pins.cuda_toolchain.verison", "13.0.88"),
     "rigbook_pins.cuda_toolchain.verison", "did you mean 'version'"),
    ("unknown-top-variable", G3080, set_key("rigbook_gpus", {"count": 2}), "rigbook_gpus", "unknown variable"),
    ("bad-vendor", G3080, set_key("rigbook_gpu.vendor", "intel"), "rigbook_gpu.vendor", '"nvidia", "amd"'),
    ("count-as-string", G3080, set_key("rigbook_gpu.count", "two"), "rigbook_gpu.count", "must be an integer"),
    ("count-too-large", G3080, set_key("rigbook_gpu.count", 64), "rigbook_gpu.count", "at most 16"),
    ("bad-pcie-width", G3080, set_key("rigbook_gpu.pcie.width", 12), "rigbook_gpu.pcie.width", "allowed values"),
    ("pcie-gen-zero", G3080, set_key("rigbook_gpu.pcie.gen", 0), "rigbook_gpu.pcie.gen", "at least 1"),
    ("p2p-false-without-reason", G3080, _delete("rigbook_p2p.reason"), "rigbook_p2p", "missing required key 'reason'"),
    ("p2p-expected-string", G9700, set_key("rigbook_p2p.expected", "yes"), "rigbook_p2p.expected", "boolean"),
    ("bad-p2p-level", G9700, set_key("rigbook_p2p.nccl_p2p_level", "ANY"), "rigbook_p2p.nccl_p2p_level", "PHB"),
    ("driver-version-garbled", G3080, set_key("rigbook_pins.nvidia_driver.version", "615-p2p"),
     "rigbook_pins.nvidia_driver.version", "must match"),
    ("cuda-version-two-parts", G3080, set_key("rigbook_pins.cuda_toolchain.version", "13.0"),
     "rigbook_pins.cuda_toolchain.version", "13.0"),
    ("cmdline-with-space", G3080, set_key("rigbook_pins.kernel.cmdline", ["intel_iommu=on iommu=pt"]),
     "rigbook_pins.kernel.cmdline[0]", "must match"),
    ("cmdline-shell-substitution", G3080, set_key("rigbook_pins.kernel.cmdline", ["iommu=$(reboot)"]),
     "rigbook_pins.kernel.cmdline[0]", "must match"),
    ("cmdline-backtick", G3080, set_key("rigbook_pins.kernel.cmdline", ["quiet`id`"]),
     "rigbook_pins.kernel.cmdline[0]", "must match"),
    ("artifact-without-sha", G9700, set_key("rigbook_pins.kernel.debs", [{"path": "/srv/linux-image.deb"}]),
     "rigbook_pins.kernel.debs[0]", "missing required key 'sha256'"),
    ("artifact-short-sha", G9700, set_key("rigbook_pins.kernel.debs", [{"path": "/srv/k.deb", "sha256": "abc"}]),
     "rigbook_pins.kernel.debs[0].sha256", "must match"),
    ("artifact-url-and-path", G9700,
     set_key("rigbook_pins.kernel.debs", [{"path": "/a", "url": "https://x.invalid/a", "sha256": "0" * 64}]),
     "rigbook_pins.kernel.debs[0]", "exactly one of"),
    ("sglang-neither-version-nor-repo", G9700, set_key("rigbook_pins.sglang", {"lock": "locks/sglang.txt"}),
     "rigbook_pins.sglang", "exactly one of"),
    ("sglang-branch-is-not-a-pin", G9700, set_key("rigbook_pins.sglang", {"repo": {"url": "https://x.invalid/s",
                                                                                 "commit": "main"}}),
     "rigbook_pins.sglang.repo.commit", "must match"),
    ("mem-fraction-one", G3080, _serve("mem_fraction_static", 1.0),
     "rigbook_serve[0].mem_fraction_static", "less than 1"),
    ("serve-without-model", G3080, _serve("model_path", delete=True), "rigbook_serve[0]", "'model_path'"),
    ("env-bad-name", G9700, _serve("env", {"1BAD": "x"}), "rigbook_serve[0].env", "bad key"),
    ("port-out-of-range", G9700, _serve("port", 70000), "rigbook_serve[0].port", "at most 65535"),
    ("serve-as-one-mapping", G9700, set_key("rigbook_serve", {"name": "a", "model_path": "/srv/m"}), "rigbook_serve",
     "must be an array"),
    ("serve-tp-above-gpu-count", G3080, _serve("tp_size", 4), "rigbook_serve[0].tp_size", "the box has 2 GPUs"),
    ("tolerance-above-one", "group_vars/all.yml", set_key("rigbook_tolerance", {"fail_below": 1.2}),
     "rigbook_tolerance.fail_below", "at most 1"),
    ("evidence-root-relative", "host_vars/rig-3080.yml", set_key("rigbook_evidence_root", "evidence"),
     "rigbook_evidence_root", "must match"),
    ("rocm-pinned-on-nvidia-box", G3080, set_key("rigbook_pins.rocm", {"version": "7.2"}),
     "rigbook_pins.rocm", "vendor is nvidia"),
    ("p2p-expected-with-one-gpu", G9700, set_key("rigbook_gpu.count", 1), "rigbook_p2p.expected", "P2P needs 2 GPUs"),
    ("rocm-repo-without-key-sha", G9700,
     set_key("rigbook_pins.rocm.repo", {"url": "https://repo.example.invalid/rocm/apt/7.1", "suite": "noble",
                                     "key_url": "https://repo.example.invalid/rocm/rocm.gpg.key"}),
     "rigbook_pins.rocm.repo", "missing required key 'key_sha256'"),
    ("rocm-repo-key-short-sha", G9700,
     set_key("rigbook_pins.rocm.repo", {"url": "file:///srv/rocm", "suite": "noble", "key_url": "file:///srv/k.asc",
                                     "key_sha256": "abc"}), "rigbook_pins.rocm.repo.key_sha256", "must match"),
    ("rocm-repo-and-debs", G9700,
     set_key("rigbook_pins.rocm", {"version": "7.1.0", "debs": [{"path": "/srv/rocm-core.deb", "sha256": "0" * 64}],
                                "repo": {"url": "file:///srv/rocm", "suite": "noble", "key_url": "file:///srv/k",
                                         "key_sha256": "0" * 64}}),
     "rigbook_pins.rocm", "set only one of repo or debs"),
    ("rocm-deb-without-sha", G9700, set_key("rigbook_pins.rocm.debs", [{"path": "/srv/rocm-core.deb"}]),
     "rigbook_pins.rocm.debs[0]", "missing required key 'sha256'"),
    ("rocm-dkms-string", G9700, set_key("rigbook_pins.rocm.dkms", "no"), "rigbook_pins.rocm.dkms", "boolean"),
    ("rocm-package-bad-name", G9700, set_key("rigbook_pins.rocm.packages", ["ROCm Core"]),
     "rigbook_pins.rocm.packages[0]", "must match"),
    ("rocm-typo", G9700, set_key("rigbook_pins.rocm.dkm", True), "rigbook_pins.rocm.dkm", "did you mean 'dkms'"),
    # A control character in an environment value or name would write extra lines into an environment file or unit.
    ("gpu-env-newline", G9700, set_key("rigbook_pins.rocm.hsa_env.HSA_ENABLE_IPC_MODE_LEGACY", "0\nLD_PRELOAD=/x.so"),
     "rigbook_pins.rocm.hsa_env.HSA_ENABLE_IPC_MODE_LEGACY", "control characters (a newline, a tab, ...) are not"),
    ("gpu-env-trailing-newline", G9700, set_key("rigbook_pins.rocm.hsa_env.HSA_ENABLE_IPC_MODE_LEGACY", "0\n"),
     "rigbook_pins.rocm.hsa_env.HSA_ENABLE_IPC_MODE_LEGACY", "control characters"),
    ("gpu-env-carriage-return", G9700, set_key("rigbook_pins.rocm.hsa_env.HSA_X", "a\rb"),
     "rigbook_pins.rocm.hsa_env.HSA_X", "control characters"),
    ("gpu-env-name-newline", G9700, set_key("rigbook_pins.rocm.hsa_env", {"HSA_X\n": "1"}),
     "rigbook_pins.rocm.hsa_env", "bad key \"HSA_X\\n\": names must match ^[A-Za-z_][A-Za-z0-9_]*$ (control"),
    ("serve-env-trailing-newline", G9700, _serve("env", {"NCCL_P2P_LEVEL": "PHB\n"}),
     "rigbook_serve[0].env.NCCL_P2P_LEVEL", "control characters"),
    ("serve-env-name-newline", G9700, _serve("env", {"NCCL_P2P_LEVEL\n": "PHB"}), "rigbook_serve[0].env",
     "bad key"),
    ("serve-name-trailing-newline", G9700, _serve("name", "qwen\n"), "rigbook_serve[0].name", "control characters"),
]


@pytest.mark.parametrize("case,rel,mutate,key_path,words", INVALID, ids=[c[0] for c in INVALID])
def test_invalid_inventory_names_file_owner_and_key(tmp_path, case, rel, mutate, key_path, words):
    inv = _copy(tmp_path)
    _edit(inv, rel, mutate)
    with pytest.raises(InventoryInvalid) as info:
        validate(inv)
    lines = [str(p) for p in info.value.problems]
    matching = [line for line in lines if f": {key_path}: " in line]
    assert matching, f"no problem names {key_path}: {lines}"
    assert any(words in line for line in matching), matching
    file_part = matching[0].split(":", 1)[0]
    assert Path(file_part).name == Path(rel).name


def test_a_rocm_repository_pin_and_an_offline_one_are_valid(tmp_path):
    inv = _copy(tmp_path)
    repo = {"url": "https://repo.example.invalid/rocm/apt/7.1", "suite": "noble", "components": ["main"],
            "key_url": "https://repo.example.invalid/rocm/rocm.gpg.key", "key_sha256": "a" * 64}
    _edit(inv, G9700, set_key("rigbook_pins.rocm", {"version": "7.1.0", "repo": repo, "dkms": False,
                                                 "packages": ["rocm-core", "rocminfo"], "version_glob": "*.70100-*"}))
    validate(inv)
    debs = [{"path": "/srv/r.deb", "sha256": "b" * 64}]
    _edit(inv, G9700, set_key("rigbook_pins.rocm", {"version": "7.1.0", "debs": debs}))
    validate(inv)


def test_lab_inventory_is_valid():
    validate(Path(__file__).resolve().parents[3] / "inventory" / "lab")


def test_homelab_is_valid():
    inv = validate(HOMELAB)
    assert set(inv.hosts) == {"rig-3080", "rig-r9700"}
    assert inv.host_vars("rig-3080")["rigbook_p2p"]["expected"] is False
    assert inv.host_vars("rig-r9700")["rigbook_pins"]["rccl"]["version"] == "2.27.7"


def test_host_vars_override_group_vars(tmp_path):
    inv = _copy(tmp_path)
    _edit(inv, "host_vars/rig-3080.yml", set_key("rigbook_gpu", {"vendor": "nvidia", "count": 1}))
    with pytest.raises(InventoryInvalid, match=r"host rig-3080: rigbook_serve\[0\].tp_size: 2, but the box has 1 GPU"):
        validate(inv)  # the group's tp_size 2 profile is judged against the host's own GPU count
    _edit(inv, "host_vars/rig-3080.yml", set_key("rigbook_serve", [{"name": "one-gpu", "model_path": "/srv/models/m"}]))
    loaded = validate(inv)
    assert loaded.host_vars("rig-3080")["rigbook_gpu"]["count"] == 1
    assert loaded.provenance("rig-3080", "rigbook_gpu").file.name == "rig-3080.yml"


def test_broken_yaml_is_one_clear_error(tmp_path):
    inv = _copy(tmp_path)
    (inv / G3080).write_text("rigbook_gpu: {vendor: nvidia\n")
    with pytest.raises(Exception) as info:
        validate(inv)
    assert "not valid YAML" in str(info.value) and "x99_3080.yml" in str(info.value)


def test_ini_inventory_is_refused_clearly(tmp_path):
    (tmp_path / "hosts").write_text("[x]\nlocalhost\n")
    with pytest.raises(Exception) as info:
        validate(tmp_path)
    assert "YAML inventories only" in str(info.value)


def test_cli_validate_typo_exits_2_without_traceback(tmp_path):
    inv = _copy(tmp_path)
    _edit(inv, G3080, set_key("rigbook_pins.nvidia_driver.brnach", "615.71.09-p2p"))
    proc = subprocess.run(
        [sys.executable, "-m", "rigbook", "validate", "-i", str(inv)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2
    assert "rigbook_pins.nvidia_driver.brnach" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("name", ["../../victim/package", "a/b", ".hidden", "tab\there", "back\\slash"])
def test_a_host_name_that_would_be_a_path_is_refused(tmp_path, name):
    """Host names become file names under the state directory (baselines/<host>.json): refused at validation, and
    a read-only command (report) given such an inventory changes no file."""
    inv = _copy(tmp_path)
    hosts = yaml.safe_load((inv / "hosts.yml").read_text())
    hosts["all"]["children"]["x99_3080"]["hosts"] = {name: {"ansible_host": "127.0.0.1"}}
    (inv / "hosts.yml").write_text(yaml.safe_dump(hosts))
    state = tmp_path / "state"
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    for command in (["validate", "-i", str(inv)], ["report", "-i", str(inv), "-o", str(tmp_path / "r.html")]):
        proc = subprocess.run([sys.executable, "-m", "rigbook", *command], capture_output=True, text=True, timeout=60,
                              env={**os.environ, "RIGBOOK_STATE_DIR": str(state)})
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        assert f"host name {name!r} cannot be used" in proc.stderr, proc.stderr
    after = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if not str(p).startswith(str(state)))
    assert after == before


@pytest.mark.parametrize("content,words", [
    (b"\xff\xfe\x00garbage\x81", "not UTF-8 text"),
    (b"rigbook_serve: &a [{name: a, model_path: /m, extra_args: *a}]\n", "or list that contains it"),
    (b"rigbook_gpu: {vendor: nvidia}\nrigbook_gpu: {vendor: amd}\n", "key 'rigbook_gpu' is written twice"),
    (b"a: &k0 [x, x, x, x, x, x, x, x, x]\n"  # an alias bomb: each level three times the one before
     + b"".join(b"k%d: &k%d [*k%d, *k%d, *k%d]\n" % (i, i, i - 1, i - 1, i - 1) for i in range(1, 400)),
     "YAML aliases"),
])
def test_a_hostile_vars_file_is_one_clear_error(tmp_path, content, words):
    inv = _copy(tmp_path)
    (inv / G3080).write_bytes(content)
    proc = subprocess.run([sys.executable, "-m", "rigbook", "validate", "-i", str(inv)], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert words in proc.stderr and "x99_3080.yml" in proc.stderr, proc.stderr


@pytest.mark.parametrize("kind", ["folder", "loop"])
def test_a_hosts_file_that_is_no_file_is_named(tmp_path, kind):
    inv = tmp_path / "inv"
    inv.mkdir()
    if kind == "folder":
        (inv / "hosts.yml").mkdir()
    else:
        (inv / "hosts.yml").symlink_to(inv / "hosts.yml")
    with pytest.raises(Exception) as info:
        validate(inv)
    assert "hosts.yml: " in str(info.value) and "not an inventory file" in str(info.value)
    assert ("a folder" if kind == "folder" else "a link that leads nowhere") in str(info.value)


def _also_list(inv: Path, host: str, group: str) -> None:
    def mutate(data):
        data["all"]["children"].setdefault(group, {}).setdefault("hosts", {})[host] = None

    _edit(inv, "hosts.yml", mutate)


def test_a_host_in_two_vendor_groups_names_the_host_and_both_groups(tmp_path):
    """rig-3080 listed in x99_r9700 too: one group says nvidia, the other amd; which wins used to be an accident of
    group names (silently valid). Now one problem naming the host, both groups, their vendors and files; exit 2."""
    inv = _copy(tmp_path)
    _also_list(inv, "rig-3080", "x99_r9700")
    with pytest.raises(InventoryInvalid) as info:
        validate(inv)
    [problem] = [p for p in info.value.problems if p.key_path == "rigbook_gpu.vendor"]
    assert problem.owner == "host rig-3080" and problem.file == inv
    assert (f"host rig-3080 is in groups that say different GPU vendors: group x99_3080 (vendor nvidia, in "
            f"{inv / G3080}), group x99_r9700 (vendor amd, in {inv / G9700}); a host has one GPU vendor") \
        in problem.message
    proc = subprocess.run([sys.executable, "-m", "rigbook", "validate", "-i", str(inv)], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "RIGBOOK_STATE_DIR": str(tmp_path / "state")})
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "host rig-3080 is in groups that say different GPU vendors: group x99_3080" in proc.stderr
    assert "group x99_r9700 (vendor amd" in proc.stderr


def test_a_run_stops_on_a_host_in_two_vendor_groups_before_any_host(tmp_path, monkeypatch, capsys):
    """Every run validates first: the same problem, exit 2, ansible never started."""
    import ansible_runner

    from rigbook.cli import main

    inv = _copy(tmp_path)
    _also_list(inv, "rig-r9700", "x99_3080")
    monkeypatch.setenv("RIGBOOK_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setattr(ansible_runner, "run", lambda **kw: pytest.fail("ansible was started"))
    assert main(["verify.yml", "-i", str(inv)]) == 2
    err = capsys.readouterr().err
    assert "host rig-r9700 is in groups that say different GPU vendors: group x99_3080 (vendor nvidia" in err


def test_a_child_group_overriding_its_parents_vendor_is_no_conflict(tmp_path):
    inv = _copy(tmp_path)
    _edit(inv, "group_vars/all.yml", set_key("rigbook_gpu", {"vendor": "amd", "count": 2}))
    _edit(inv, "hosts.yml", set_key("all.children.rigs.children", {"x99_3080": None}))
    _edit(inv, "group_vars/rigs.yml", set_key("rigbook_gpu", {"vendor": "amd", "count": 2}))
    loaded = validate(inv)  # x99_3080 (nvidia) is a child of rigs (amd): the child's value is meant to win
    assert loaded.host_vars("rig-3080")["rigbook_gpu"]["vendor"] == "nvidia"


def test_a_host_listed_in_the_other_vendors_play_group_is_named(tmp_path):
    """site.yml runs the AMD roles on gpu_vendor_amd: an NVIDIA host listed there statically would get both."""
    inv = _copy(tmp_path)
    _also_list(inv, "rig-3080", "gpu_vendor_amd")
    with pytest.raises(InventoryInvalid) as info:
        validate(inv)
    [problem] = [p for p in info.value.problems if p.key_path == "rigbook_gpu.vendor"]
    assert problem.message.startswith("host rig-3080 is listed in group gpu_vendor_amd, the group site.yml runs the "
                                      f"amd roles on, but its rigbook_gpu.vendor is nvidia (set in group x99_3080, "
                                      f"{inv / G3080})")
    inv = _copy(tmp_path / "again")
    _also_list(inv, "rig-3080", "gpu_vendor_nvidia")  # the group it would be in anyway: fine
    validate(inv)


@pytest.mark.parametrize("item,words", [
    ('{"rigbook_pins": {"kernel": {"release": "6.8.0-31-generic", "cmdline": ["iommu=pt $(reboot)"]}}}',
     '-e (command line): extra variables: rigbook_pins.kernel.cmdline[0]: bad value "iommu=pt $(reboot)"'),
    ("rigbook_gpu=nvidia", "-e (command line): extra variables: rigbook_gpu: bad value"),
    ('{"rigbook_serve": [{"name": "x", "model_path": "/m\\n[Service]"}]}', "rigbook_serve[0].model_path"),
])
def test_extra_variables_meet_the_same_schema_before_any_host(tmp_path, monkeypatch, capsys, item, words):
    """The host variables given with -e meet the same schema as the inventory's: a command line cannot slip shell
    into the kernel command line or a line into a unit."""
    import ansible_runner

    from rigbook.cli import main

    monkeypatch.setenv("RIGBOOK_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setattr(ansible_runner, "run", lambda **kw: pytest.fail("ansible was started"))
    assert main(["verify.yml", "-i", str(_copy(tmp_path)), "-e", item]) == 2
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err


@pytest.mark.parametrize("item,words", [
    ("novalue", "expected KEY=VALUE"), ("a=1 b", "expected KEY=VALUE"), ("=1", "expected KEY=VALUE"),
    ("a='unclosed", "-e number 1: No closing quotation"), ("@/nonexistent/vars.yml", "does not exist"),
    ('{"a": 1, "a": 2}', "key 'a' is written twice"), ("{a: [}", "-e number 1: line 1: not valid YAML"),
    ('{"a": *x}', "not valid YAML"),
])
def test_an_extra_variable_that_cannot_be_read_is_one_error(tmp_path, item, words):
    with pytest.raises(UserError, match=re.escape(words)):
        validate(_copy(tmp_path), extra_vars=[item])


# --- names Ansible's host patterns would misread ------------------------------------------------------------------

LAB = Path(__file__).resolve().parents[3] / "inventory" / "lab"
LAB_R9700 = "group_vars/x99_r9700.yml"


def _lab(tmp_path: Path) -> Path:
    dest = tmp_path / "lab"
    shutil.copytree(LAB, dest)
    return dest



def _rename_host(inv: Path, name: str, old: str = "rig-3080", group: str = "x99_3080") -> None:
    def mutate(data):
        hosts = data["all"]["children"][group]["hosts"]
        hosts[name] = hosts.pop(old)

    _edit(inv, "hosts.yml", mutate)


PATTERN_NAMES = [
    ("x,all", "',' makes it a list of patterns (x,all is x and every host)"),
    ("x:all", "':' makes it a list of patterns"),
    ("web[0:2]", "':' makes it a list of patterns"),
    ("web[1]", "'[' makes it a subscript or range of a group"),
    ("rig*", "'*' makes it a wildcard"),
    ("rig?", "'?' makes it a wildcard"),
    ("!rig", "a leading '!' makes it an exclusion"),
    ("&rig", "a leading '&' makes it an intersection"),
    ("~rig.*", "a leading '~' makes it a regular expression"),
    ("@hosts", "a leading '@' makes it a file of host names"),
    ("-rig", "a leading '-' makes it an option to ansible-playbook"),
    ("rig all", "whitespace separates patterns"),
    ("rig\u00a0x", "whitespace separates patterns"),
    ("r\u00efg", "'ï' is not among the characters rigbook lets into a host pattern"),
]


@pytest.mark.parametrize("name, words", PATTERN_NAMES, ids=[n for n, _ in PATTERN_NAMES])
def test_a_host_name_ansible_patterns_misread_is_refused(tmp_path, name, words):
    inv = _copy(tmp_path)
    _rename_host(inv, name)
    with pytest.raises(InventoryInvalid) as info:
        validate(inv)
    [problem] = [p for p in info.value.problems if p.key_path == "host name"]
    assert problem.owner == f"host {name}" and problem.file == inv
    assert problem.message.startswith(f"{name!r} cannot be a host name: Ansible reads names as host patterns")
    assert words in problem.message and "put an address in ansible_host" in problem.message


@pytest.mark.parametrize("name", ["all", "ungrouped", "x99_r9700"])
def test_a_host_named_like_a_group_is_refused(tmp_path, name):
    inv = _copy(tmp_path)
    _rename_host(inv, name)
    with pytest.raises(InventoryInvalid) as info:
        validate(inv)
    [problem] = [p for p in info.value.problems if p.key_path == "host name"]
    assert problem.message == (f"{name!r} is also a group name: --limit {name} would select that group's hosts, not "
                               "this host alone; rename the host")


def test_a_group_name_ansible_patterns_misread_is_refused(tmp_path):
    inv = _copy(tmp_path)

    def mutate(data):
        data["all"]["children"]["x99,all"] = data["all"]["children"].pop("x99_3080")

    _edit(inv, "hosts.yml", mutate)
    with pytest.raises(InventoryInvalid) as info:
        validate(inv)
    [problem] = [p for p in info.value.problems if p.key_path == "group name"]
    assert problem.owner == "group x99,all" and "',' makes it a list of patterns" in problem.message


@pytest.mark.parametrize("name", ["rig-3080", "rig_3080", "127.0.0.7", "RIG.lan", "_rig", "x99-3080.lan.example"])
def test_names_patterns_read_as_themselves_pass(tmp_path, name):
    inv = _copy(tmp_path)
    _rename_host(inv, name)
    assert name in validate(inv).hosts


@pytest.mark.parametrize("argv", [["site.yml", "--rolling", "1"], ["site.yml", "--rolling", "50%", "--limit", "x,all"],
                                  ["verify.yml"]])
def test_a_canary_named_x_all_stops_the_run_before_any_host(tmp_path, monkeypatch, capsys, argv):
    """`provision site.yml --rolling`: the first batch (the canary) would be `--limit x,all`, every host at once."""
    import ansible_runner

    from rigbook.cli import main

    inv = _lab(tmp_path)  # valid and ready as it is: only the name stops the run

    def rename(data):
        hosts = data["all"]["children"]["lab"]["children"]["x99_3080"]["hosts"]
        hosts["x,all"] = hosts.pop("lab-3080")

    _edit(inv, "hosts.yml", rename)
    monkeypatch.setenv("RIGBOOK_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setattr(ansible_runner, "run", lambda **kw: pytest.fail("ansible was started"))
    assert main([*argv, "-i", str(inv)]) == 2
    err = capsys.readouterr().err
    assert "host x,all: host name: 'x,all' cannot be a host name" in err and "Traceback" not in err
    assert not (tmp_path / "state" / "runs").exists()


# --- pip options posing as package names -----------------------------------------------------------------------

@pytest.mark.parametrize("key_path, value, words", [
    ("rigbook_pins.cuda_toolchain.versions", {"--index-url=https://evil.invalid/simple": "1.2.3"}, "bad key"),
    ("rigbook_pins.cuda_toolchain.versions", {"-e": "1.2.3"}, "bad key"),
    ("rigbook_pins.cuda_toolchain.versions", {"nvidia-nccl-cu13 ": "2.27.7"}, "bad key"),
    ("rigbook_pins.cuda_toolchain.packages", ["--pre"], "must match"),
    ("rigbook_pins.cuda_toolchain.packages", ["nvidia-cuda-nvcc", "-U"], "must match"),
])
def test_a_cuda_package_name_that_would_be_a_pip_option_is_refused(tmp_path, key_path, value, words):
    inv = _copy(tmp_path)
    _edit(inv, G3080, set_key(key_path, value))
    with pytest.raises(InventoryInvalid) as info:
        validate(inv)
    assert any(p.key_path.startswith(key_path) and words in p.message for p in info.value.problems), \
        [str(p) for p in info.value.problems]


# --- keys: the admin API key is a secret, and a key never reaches the journal unpatched -------------------------

def _without_key_log_patch(data):
    data["rigbook_pins"]["sglang"]["patches"] = [p for p in data["rigbook_pins"]["sglang"]["patches"]
                                                 if p["name"] != "api-key-out-of-logs.patch"]


@pytest.mark.parametrize("field", ["api_key_file", "admin_api_key_file"])
def test_a_key_on_a_host_whose_sglang_lacks_the_log_patch_is_refused_and_says_how_to_add_it(tmp_path, field):
    inv = _lab(tmp_path)
    _edit(inv, LAB_R9700, _serve(field, "/etc/rigbook/serve/key"))
    validate(inv)  # the lab pins the patch
    _edit(inv, LAB_R9700, _without_key_log_patch)
    with pytest.raises(InventoryInvalid) as info:
        validate(inv)
    [problem] = [p for p in info.value.problems if p.key_path == f"rigbook_serve[0].{field}"]
    assert problem.owner == "host lab-r9700" and problem.file.name == "x99_r9700.yml"
    sha = "45d3cd1fb210cd40b4bf857ee07d94b31c13cf35629a7fdbc4ff060cee5b0dda"  # the role's file, as the lab pins it
    assert f"add {{name: api-key-out-of-logs.patch, sha256: {sha}}} to rigbook_pins.sglang.patches" in problem.message
    assert "set key_may_reach_journal: true in this profile" in problem.message
    _edit(inv, LAB_R9700, _serve("key_may_reach_journal", True))
    validate(inv)  # the owner's explicit choice


def test_homelab_pins_without_the_patch_refuse_a_key_only_where_one_is_set(tmp_path):
    inv = _copy(tmp_path)
    validate(inv)  # no profile has a key
    _edit(inv, G9700, _serve("api_key_file", "/etc/rigbook/serve/key"))
    with pytest.raises(InventoryInvalid, match=r"host rig-r9700: rigbook_serve\[0\]\.api_key_file: SGLang logs"):
        validate(inv)
    _edit(inv, G9700, set_key("rigbook_pins.sglang.patches", [{"name": "api-key-out-of-logs.patch",
                                                               "sha256": "0" * 64}]))
    validate(inv)


@pytest.mark.parametrize("word", ["--admin-api-key=adm-s3cret", "--admin-api-key", "--admin-api-k", "--admin"])
def test_the_admin_key_on_the_command_line_is_refused_without_showing_it(tmp_path, word):
    inv = _copy(tmp_path)
    _edit(inv, G9700, _serve("extra_args", [word, "adm-s3cret"] if "=" not in word else [word]))
    with pytest.raises(InventoryInvalid) as info:
        validate(inv)
    text = str(info.value)
    assert "rigbook_serve[0].extra_args[0]: " in text and "never put the admin API key on the command line" in text
    assert "set admin_api_key_file to a root-only file" in text and "adm-s3cret" not in text


# --- the hostile matrix of these inputs, through the CLI ------------------------------------------------------
# Each case: `provision ARGS` as a subprocess over a copy of the lab inventory (valid and ready as it is), with its own
# state directory and TMPDIR; exit 2, no traceback, the words that name the problem, no secret shown, and nothing
# changed outside the state directory (a listing of the work folder and TMPDIR before and after).

def _lab_host(name):
    def mutate(data):
        hosts = data["all"]["children"]["lab"]["children"]["x99_3080"]["hosts"]
        hosts[name] = hosts.pop("lab-3080")
    return "hosts.yml", mutate


def _lab_group(name):
    def mutate(data):
        children = data["all"]["children"]["lab"]["children"]
        children[name] = children.pop("x99_3080")
    return "hosts.yml", mutate


def _lab_serve(**fields):
    def mutate(data):
        data["rigbook_serve"][0].update(fields)
    return LAB_R9700, mutate


def _lab_serve_unpatched(**fields):
    def mutate(data):
        data["rigbook_serve"][0].update(fields)
        _without_key_log_patch(data)
    return LAB_R9700, mutate


HOSTILE = [
    # (id, file and mutation, extra arguments, words, a secret the output must not hold)
    ("canary-named-x-all", _lab_host("x,all"), ["site.yml", "--rolling", "1"], "'x,all' cannot be a host name", None),
    ("host-named-x-all-validate", _lab_host("x,all"), ["validate"], "',' makes it a list of patterns", None),
    ("host-with-colon", _lab_host("x:all"), ["validate"], "'x:all' cannot be a host name", None),
    ("host-with-range", _lab_host("rig[1:3]"), ["validate"], "'rig[1:3]' cannot be a host name", None),
    ("host-leading-bang", _lab_host("!lab-r9700"), ["validate"], "a leading '!' makes it an exclusion", None),
    ("host-leading-tilde", _lab_host("~.*"), ["validate"], "a leading '~' makes it a regular expression", None),
    ("host-wildcard", _lab_host("lab-*"), ["validate"], "'*' makes it a wildcard", None),
    ("host-with-space", _lab_host("lab 3080"), ["validate"], "whitespace separates patterns", None),
    ("host-named-all", _lab_host("all"), ["site.yml", "--rolling", "1"], "'all' is also a group name", None),
    ("group-with-comma", _lab_group("x99,all"), ["validate"], "'x99,all' cannot be a group name", None),
    ("cuda-version-key-is-option", ("group_vars/x99_3080.yml", set_key(
        "rigbook_pins.cuda_toolchain.versions", {"--index-url=https://evil.invalid/simple": "1.2.3"})),
     ["validate"], "rigbook_pins.cuda_toolchain.versions: bad key", None),
    ("cuda-package-is-option", ("group_vars/x99_3080.yml", set_key(
        "rigbook_pins.cuda_toolchain.packages", ["--pre"])), ["validate"],
     "rigbook_pins.cuda_toolchain.packages[0]", None),
    ("admin-key-in-extra-args", _lab_serve(extra_args=["--admin-api-key=adm-s3cret"]), ["validate"],
     "never put the admin API key on the command line", "adm-s3cret"),
    ("admin-key-abbreviated", _lab_serve(extra_args=["--admin-api", "adm-s3cret"]), ["validate"],
     "--admin-api (the engine reads it as --admin-api-key", "adm-s3cret"),
    ("api-key-unpatched-sglang", _lab_serve_unpatched(api_key_file="/etc/rigbook/serve/key"), ["validate"],
     "rigbook_serve[0].api_key_file: SGLang logs its resolved arguments at every start", None),
    ("admin-key-unpatched-sglang", _lab_serve_unpatched(admin_api_key_file="/etc/rigbook/serve/admin"),
     ["site.yml", "--rolling", "1"], "rigbook_serve[0].admin_api_key_file: SGLang logs", None),
]


@pytest.mark.parametrize("case, edit, argv, words, secret", HOSTILE, ids=[c[0] for c in HOSTILE])
def test_hostile_names_keys_and_package_names_are_refused_cleanly(tmp_path, case, edit, argv, words, secret):
    work, state, tmp = tmp_path / "work", tmp_path / "state", tmp_path / "tmp"
    for folder in (work, state, tmp):
        folder.mkdir(mode=0o700)
    inv = _lab(work)
    edit_yaml(inv / edit[0], edit[1])
    skip = {state / "collections"}
    before = tree_listing(tmp_path, skip=skip)
    proc = provision(*argv, "-i", inv, env={"RIGBOOK_STATE_DIR": str(state), "TMPDIR": str(tmp)}, timeout=120)
    after = tree_listing(tmp_path, skip=skip)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 2 and "Traceback" not in text, text
    assert words in text, text
    assert secret is None or secret not in text
    assert before == after, {k: (before.get(k), after.get(k)) for k in set(before) ^ set(after) or before}
    assert not (state / "runs").exists() and not list(tmp.iterdir())


def test_the_hostile_matrixs_inventory_is_valid_and_ready_as_it_is(tmp_path):
    inv = _lab(tmp_path)
    proc = provision("validate", "-i", inv, env={"RIGBOOK_STATE_DIR": str(tmp_path / "state")}, timeout=120)
    assert proc.returncode == 0 and "valid and ready for site.yml" in proc.stdout, proc.stdout + proc.stderr


# --- inventory/homelab: the owners' inputs and the guesses listed apart -------------------------------------------

def _site_roles():
    from rigbook.run import resolve_playbook
    from rigbook.validate import run_roles

    return run_roles(resolve_playbook("site.yml"))


def test_homelab_lists_the_owners_inputs_and_the_unconfirmed_guesses_apart(tmp_path):
    import io

    stream = io.StringIO()
    with pytest.raises(InventoryInvalid) as info:
        validate(HOMELAB, warn=stream, roles=_site_roles())
    # what the play needs and the write-ups do not publish: the owners' inputs, each with how to get it
    assert all(p.message.startswith("needed by the ") for p in info.value.problems), info.value.problems
    inputs = [(p.owner, p.key_path) for p in info.value.problems]
    assert ("host rig-r9700", "rigbook_pins.sglang.patches[0].path") in inputs  # BF16 PV, the owner's
    assert ("host rig-r9700", "rigbook_pins.sglang.patches[1].path") in inputs  # RDNA4 Patch065
    # the guesses: listed with their values, none of them an input
    listing = stream.getvalue()
    head, *lines = listing.strip().splitlines()
    assert head.startswith("unconfirmed: 21 values of the inventory guessed, not the owner's (rigbook_unconfirmed)")
    guessed = {tuple(re.match(r"^\s+\S+: (host \S+): (\S+) = ", line).groups()) for line in lines}
    assert ("host rig-3080", "rigbook_pins.kernel.release") in guessed
    assert ("host rig-3080", "rigbook_serve[0].extra_args[2]") in guessed  # the scales file's place
    assert ("host rig-r9700", "rigbook_serve[0].model_path") in guessed
    assert not guessed & set(inputs)
    assert 'hosts.yml: host rig-r9700: ansible_user = "rigbook": ' in listing  # named with the file that sets it


def test_a_confirmed_guess_leaves_the_listing_and_a_stale_one_is_a_warning(tmp_path):
    import io

    inv = _copy(tmp_path)

    def confirm(data):
        data["rigbook_unconfirmed"] = [item for item in data["rigbook_unconfirmed"]
                                       if item["key"] != "rigbook_pins.kernel.release"]
        data["rigbook_unconfirmed"].append("rigbook_pins.nvidia_driver.nothing_here")

    _edit(inv, G3080, confirm)
    stream = io.StringIO()
    validate(inv, warn=stream)
    out = stream.getvalue()
    assert "rigbook_pins.kernel.release" not in out and "unconfirmed: 20 values" in out
    assert ("warning: " in out and "rigbook_unconfirmed[10]: 'rigbook_pins.nvidia_driver.nothing_here' names no value "
            "of this host") in out


@pytest.mark.parametrize("item", ["rigbook_pins..kernel", "rigbook_serve[x]", {"why": "no key"},
                                  {"key": "ansible_user", "why": "two\nlines"}], ids=str)
def test_an_unconfirmed_item_that_is_no_key_path_is_refused(tmp_path, item):
    inv = _copy(tmp_path)
    _edit(inv, G3080, set_key("rigbook_unconfirmed", [item]))
    with pytest.raises(InventoryInvalid) as info:
        validate(inv)
    assert [p.key_path.split("]")[0] for p in info.value.problems] == ["rigbook_unconfirmed[0"], info.value.problems


def test_a_box_that_leaves_its_kernel_to_its_provider_is_not_asked_for_kernel_debs(tmp_path):
    inv = _copy(tmp_path)
    _edit(inv, G9700, set_key("rigbook_manage", {"kernel": False}))
    with pytest.raises(InventoryInvalid) as info:
        validate(inv, roles=_site_roles())
    keys = [p.key_path for p in info.value.problems]
    assert "rigbook_pins.kernel.debs" not in keys and "rigbook_pins.rocm.version" in keys
    _edit(inv, G9700, set_key("rigbook_manage", {"kernel": "no"}))
    with pytest.raises(InventoryInvalid, match=r"rigbook_manage\.kernel: bad value \"no\" \(str\): must be a boolean"):
        validate(inv)


def test_a_one_gpu_box_declared_without_p2p_on_its_stock_driver_is_ready(tmp_path):
    """The single-H200 cloud VM (shared/research/real-gpu-run.md): no P2P driver fork, no userspace installer, no
    kernel .debs asked for."""
    inv = tmp_path / "vm"
    inv.mkdir()
    (inv / "hosts.yml").write_text("all:\n  hosts:\n    h200-vm:\n      ansible_host: 127.0.0.1\n")
    edit_yaml(inv / "host_vars" / "h200-vm.yml", lambda data: data.update({
        "rigbook_gpu": {"vendor": "nvidia", "model": "H200", "count": 1},
        "rigbook_p2p": {"expected": False, "reason": "one GPU"},
        "rigbook_manage": {"kernel": False},
        "rigbook_pins": {"kernel": {"release": "6.8.0-1030-aws"}, "nvidia_driver": {"version": "580.159.04"},
                         "cuda_toolchain": {"version": "13.0.88"}}}))
    loaded = validate(inv, roles=_site_roles())
    assert "h200-vm" in loaded.hosts


def test_amdgpu_dkms_names_its_repository(tmp_path):
    inv = _copy(tmp_path)
    _edit(inv, G9700, set_key("rigbook_pins.rocm.dkms", True))
    with pytest.raises(InventoryInvalid) as info:
        validate(inv, roles=_site_roles())
    (need,) = [p for p in info.value.problems if p.key_path.startswith("rigbook_pins.rocm.amdgpu")]
    assert need.key_path == "rigbook_pins.rocm.amdgpu_repo" and "graphics repository" in need.message
    _edit(inv, G9700, set_key("rigbook_pins.rocm.amdgpu_repo", {"url": "https://repo.radeon.com/amdgpu/7.1/ubuntu",
                                                               "key_url": "https://repo.radeon.com/rocm/rocm.gpg.key"}))
    with pytest.raises(InventoryInvalid) as info:
        validate(inv)
    assert {p.key_path for p in info.value.problems} == {"rigbook_pins.rocm.amdgpu_repo"}
    assert {m for p in info.value.problems for m in ("suite", "key_sha256") if m in p.message} == {"suite",
                                                                                                  "key_sha256"}
