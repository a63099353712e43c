"""`provision adopt` of a box set up by hand, on a two-host lab of its own (marker: lab): lab-3080 set up the way seed
000's owner did it, outside rigbook's roles (`provision lab handmade --as-seed 000`: kernel .debs with dpkg -i, the
driver fork built and installed with its own `make modules_install`, HMM at the driver's default, one pip venv, a
display manager and graphical.target, the engine started as `sglang serve` with the seed's flags from the owner's
shell), and lab-3080-2, a fresh host that becomes its twin. In order, each test building on the one before:

1. adopt reads the box and changes nothing on it (a listing of its whole tree, every file's sha256, before and after
   is equal), and writes the group's pins and serve profile with where each value was read; what it could not pin
   (the fork's source tarball and the userspace installer: files on the owner's side) is listed, and filled in here
   as the list says, from the lab's artifacts.
2. check mode on the adopted box changes only rigbook's own files (its GRUB drop-in, apt preferences, modprobe and
   environment files, stamps, state file, unit), holds the kernel, and says, with its reason, each thing the converge
   changes beyond them: the hand-installed fork moved to DKMS (its files kept aside), the default boot target made
   multi-user.target (the seed's own advice: a reboot, never gdm stopped at runtime); no package installed, no
   module built, no venv made; the converge then does exactly that with one reboot, and the engine runs as the
   unit's (the one started by hand gone), the ladder passes, a re-run changes nothing, and the first baseline is
   recorded from the adopted box.
3. the twin converged from the adopted pins: `provision diff` of the two is clean apart from host-unique items, and
   the twin is judged by the group baseline.

Only 127.0.0.0/8 is contacted.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from helpers.cli import REPO, changed_tasks, provision, tree_listing
from helpers.handmade_box import ENGINES, VOLATILE
from helpers.lab_host import LAB_MARKS, LabHost
from helpers.owner_inventory import owner_inventory

from rigbook.adopt import emit
from rigbook.lab import handmade

pytestmark = LAB_MARKS
BOX, TWIN, GROUP = "lab-3080", "lab-3080-2", "x99_3080"
# The tasks that may report a change on the adopted box in check mode: rigbook's own files and the kernel's hold.
RIGBOOKS_OWN = {
    "Install and hold the pinned kernel",  # held, nothing installed (asserted below)
    "Create the GRUB drop-in directory",
    "Put the command line and default entry in the GRUB drop-in",
    "Keep apt from installing stock NVIDIA kernel modules again",
    "Keep unattended-upgrades away from the stock NVIDIA packages",
    "Keep unattended-upgrades from replacing the pinned kernel",
    "Blacklist nouveau",
    "Check the fork's DKMS builds for every installed kernel",  # stamped only (asserted below)
    "Report the default boot target change (check mode)",  # the seed's own advice: set-default, then a reboot
    "Reboot once into the new kernel, driver and boot target",  # that reboot, said
    # the one package the converge adds: DKMS itself (seed 000 built the fork without it; asserted below)
    "Install DKMS, the pinned kernel's headers and those of the other installed kernels the archive still has",
    "Create rigbook's state directory",
    "Record which kernels carry the fork",
    "Link lib64 to lib (nvcc.profile links from lib64)",
    "Write the toolchain's block of the GPU environment file (CUDA_HOME, CUDA_PATH)",
    "Check versions, then compile and link a test .cu",  # its stamp
    "Create the directory of the lock and the patch set",
    "Copy the lock and the patch set",
    "Check the SGLang venv (versions, commit, patches, stamp)",  # stamped only (asserted below)
    "Check the serve units (profiles, files, unit states)",
    "Install the health program (rigbook-health.pyz)",
    "Write the health timer, its service and its config; start the timer",
}


def _inventory(generated: str) -> Path:
    """The inventory an owner of these two boxes writes: the lab's hosts and connection, the group's rig, GPUs and
    P2P (inventory/lab's x99_3080.yml without its pins and serve profile: adopt writes those), each host's serve
    address of its own (the lab's hosts share this machine's network)."""
    return owner_inventory(generated, GROUP, {
        # the hand-made box has no collectives tool (no NCCL wheel, no nccl-tests): its owner allows that layer
        # unknown, as the ladder's failure on it says to
        "rigbook_verify": {"allow_unknown": ["collectives"]},
        # the owner runs the engine as themselves: adopt reads that user's engines, the unit runs as them
        "serve_user": handmade.OWNER})


def _adopted(inv: Path) -> Path:
    return inv / f"group_vars/{GROUP}/adopted.yml"


def test_adopt_reads_a_box_set_up_by_hand_and_changes_nothing_on_it(adopted_pair):
    inv = _inventory(adopted_pair)
    box = LabHost(BOX)
    made = provision("lab", "handmade", BOX, timeout=900)
    assert made.returncode == 0, made.stdout + made.stderr
    by_hand = int(box.out(ENGINES).strip())

    before = tree_listing(box.host.root, skip=[box.host.root / p for p in VOLATILE])
    adopt = provision("adopt", BOX, "-i", inv, "--group", "--debs-dir", "/root/kernel-debs", timeout=600)
    after = tree_listing(box.host.root, skip=[box.host.root / p for p in VOLATILE])
    # written and ready as it is: a driver pinned by its version alone on a box without P2P is left as the owner
    # installed it (the host model); naming the fork's source below hands it to the nvidia_p2p_driver role
    assert adopt.returncode == 0, adopt.stdout[-3000:] + adopt.stderr[-3000:]
    changed = sorted(p for p in set(before) | set(after) if before.get(p) != after.get(p))
    assert changed == [], changed[:20]
    assert int(box.out(ENGINES).strip()) == by_hand  # the engine kept running

    written = _adopted(inv)
    text = written.read_text()
    data = emit.load(text)
    pins = data["rigbook_pins"]
    assert pins["kernel"] == {"release": handmade.KERNEL, "source": "distro",
                              "packages": [f"linux-image-{handmade.KERNEL}", f"linux-headers-{handmade.KERNEL}"],
                              "cmdline": ["intel_iommu=on", "iommu=pt"]}
    driver = pins["nvidia_driver"]
    # the fork installed with its own make modules_install: the loaded module is the pin, HMM kept as the box has it
    # (its E5 v3's 46-bit addresses: judges/static_layers.hmm_confines_host_memory), no DKMS source to read
    assert driver == {"version": handmade.DRIVER, "userspace_version": handmade.DRIVER, "uvm_disable_hmm": False}
    assert pins["cuda_toolchain"] == {"version": handmade.CUDA, "venv": handmade.VENV,
                                      "packages": ["nvidia-cuda-nvcc", "nvidia-cuda-crt", "nvidia-nvvm"]}
    assert pins["sglang"]["version"] == handmade.SGLANG and pins["sglang"]["venv"] == handmade.VENV
    lock = (inv / pins["sglang"]["lock"]).read_text()
    assert f"sglang=={handmade.SGLANG}" in lock and f"nvidia-cuda-nvcc=={handmade.CUDA}" in lock
    # `sglang serve` with the seed's flags, from the owner's shell
    [profile] = data["rigbook_serve"]
    assert {k: profile.get(k) for k in ("name", "model_path", "tp_size", "mem_fraction_static", "context_length",
                                        "max_total_tokens", "custom_all_reduce", "bind", "port", "env")} == {
        "name": "engine", "model_path": handmade.MODEL, "tp_size": 2, "mem_fraction_static": 0.88,
        "context_length": 200000, "max_total_tokens": 185000, "custom_all_reduce": False, "bind": box.host.address,
        "port": handmade.ENGINE_PORT, "env": handmade.LAB_ENV}
    extra = profile["extra_args"]
    scales = f"{handmade.HOME}/{handmade.SCALES}"  # relative on the command line, absolute in the profile
    assert extra[extra.index("--quantization-param-path") + 1] == scales
    assert '{"reasoning_effort": "medium"}' in extra and "--enable-hierarchical-cache" in extra
    # where each value was read, and how the driver got there
    assert "# /sys/module/nvidia/version: the loaded module" in text and f"# {handmade.VENV}" in text
    assert "(started from a shell, no unit)" in text
    said = adopt.stdout
    assert f"{handmade.FORK_INSTALL_DIR}/nvidia.ko" in said and "installed by make modules_install" in said
    assert "is relative to the folder the engine was started in" in said
    # what could not be pinned, named
    assert "rigbook_pins.nvidia_driver: fork_repo and commit (or source: the fork's tarball)" in said

    # The owner fills in what the list names (the fork's tarball and the userspace installer), and where a twin gets
    # its wheels: files on the owner's side, as inventory/lab has them (the lab has no GPU: SGLang without its GPU
    # dependencies and no import check, as inventory/lab installs it).
    lab = yaml.safe_load((REPO / f"inventory/lab/group_vars/{GROUP}.yml").read_text())["rigbook_pins"]
    pins["nvidia_driver"].update(source=lab["nvidia_driver"]["source"],
                                 userspace_installer=lab["nvidia_driver"]["userspace_installer"],
                                 userspace_flags=lab["nvidia_driver"]["userspace_flags"])
    pins["cuda_toolchain"]["wheel_dir"] = lab["cuda_toolchain"]["wheel_dir"]
    pins["sglang"].update(wheel_dir=lab["sglang"]["wheel_dir"], no_deps=True, import_check=False)
    written.write_text(yaml.safe_dump(data, sort_keys=False))
    ready = provision("validate", "-i", inv)
    assert ready.returncode == 0, ready.stdout + ready.stderr


def test_check_mode_changes_only_rigbooks_files_and_the_converge_restarts_the_engine_once(adopted_pair):
    inv = _inventory(adopted_pair)
    box = LabHost(BOX)
    by_hand = int(box.out(ENGINES).strip())
    boots = box.boots()

    check = provision("site.yml", "-i", inv, "--limit", BOX, "--check", "--diff", "--json", timeout=900)
    assert check.returncode == 0, check.stdout[-3000:] + check.stderr[-3000:]
    tasks = changed_tasks(json.loads(check.stdout)["run_dir"])[BOX]
    names = [name for name, _ in tasks]
    assert set(names) <= RIGBOOKS_OWN, sorted(set(names) - RIGBOOKS_OWN)
    results = dict(tasks)
    assert results["Install and hold the pinned kernel"]["installed"] == []
    said = dict(changed_tasks(json.loads(check.stdout)["run_dir"], changed_only=False)[BOX])
    moved = said["Say why the fork installed by hand moves to DKMS"]["msg"]
    assert "installed by hand (make modules_install)" in moved and "/var/lib/rigbook/hand-installed" in moved
    assert "multi-user.target (now graphical.target) and ask for a reboot" in (
        results["Report the default boot target change (check mode)"]["msg"])
    dkms = results["Install DKMS, the pinned kernel's headers and those of the other installed kernels the archive "
                   "still has"]
    assert "dkms" in json.dumps(dkms) and "linux-image" not in json.dumps(dkms), dkms
    assert results["Check the SGLang venv (versions, commit, patches, stamp)"]["adopted"] is True
    units = results["Check the serve units (profiles, files, unit states)"]["units"]
    assert [p["pid"] for p in units["engine"]["stops_by_hand"]] == [by_hand]
    assert box.boots() == boots and int(box.out(ENGINES).strip()) == by_hand  # check mode touched nothing

    site = provision("site.yml", "-i", inv, "--limit", BOX, "--json", timeout=1800)
    assert site.returncode == 0, site.stdout[-3000:] + site.stderr[-3000:]
    assert box.boots() == boots + 1  # the boot target's reboot, the one the check said
    assert box.out("systemctl get-default").strip() == "multi-user.target"
    assert box.run(f"test -e /lib/modules/{handmade.KERNEL}/{handmade.FORK_INSTALL_DIR}/nvidia.ko",
                   check=False).returncode != 0  # moved aside (kept under /var/lib/rigbook/hand-installed)
    assert box.out(f"ls /lib/modules/{handmade.KERNEL}/updates/dkms/").split() == ["nvidia.ko"]
    ladder = json.loads(site.stdout)["hosts"][BOX]["ladder"]
    assert {v["layer"]: v["status"] for v in ladder}["serving"] == "pass", ladder
    assert not [v for v in ladder if v["status"] == "fail"], ladder
    # the engine restarted once: the one started by hand is gone, the unit's is the only one
    assert box.run(f"test -d /proc/{by_hand}", check=False).returncode != 0
    assert box.out("systemctl is-active rigbook-serve-engine.service").strip() == "active"
    [engine] = box.out(ENGINES).split()
    assert box.out("systemctl show -p MainPID --value rigbook-serve-engine.service").strip() == engine

    again = provision("site.yml", "-i", inv, "--limit", BOX, "--json", timeout=900)
    assert again.returncode == 0 and json.loads(again.stdout)["hosts"][BOX]["changed"] == 0, again.stdout[-3000:]
    record = provision("baseline", "record", "-i", inv, "--limit", BOX, "--group", timeout=600)
    assert record.returncode == 0, record.stdout[-2000:] + record.stderr[-2000:]


def test_a_twin_from_the_adopted_pins_diffs_clean_and_is_held_to_the_group_baseline(adopted_pair):
    inv = _inventory(adopted_pair)
    twin = LabHost(TWIN)
    # the twin's serve address is its own (host-unique): the adopted profile with the twin's bind
    profiles = emit.load(_adopted(inv).read_text())["rigbook_serve"]
    hosts = yaml.safe_load((inv / "hosts.yml").read_text())
    hosts["all"]["children"]["lab"]["children"][GROUP]["hosts"][TWIN]["rigbook_serve"] = [
        {**p, "bind": twin.host.address} for p in profiles]
    (inv / "hosts.yml").write_text(yaml.safe_dump(hosts, sort_keys=False))
    # the FP8 KV scales file the seed's command line names is a file of the owner's: preflight names it on the twin
    # before anything changes, and the owner copies it there
    scales = f"{handmade.HOME}/{handmade.SCALES}"
    first = provision("site.yml", "-i", inv, "--limit", TWIN, "--json", timeout=900)
    assert first.returncode != 0 and "not on the box yet (nothing was changed): rigbook_serve[0].extra_args" in (
        first.stdout + first.stderr) and scales in first.stdout, first.stdout[-3000:]
    twin.run(f"mkdir -p {Path(scales).parent} && cp /dev/null {scales}")
    site = provision("site.yml", "-i", inv, "--limit", TWIN, "--json", timeout=1800)
    assert site.returncode == 0, site.stdout[-3000:] + site.stderr[-3000:]
    assert json.loads(site.stdout)["hosts"][TWIN]["baseline_source"] == f"group {GROUP}"

    manifest = provision("manifest", "-i", inv, "--limit", GROUP, timeout=600)
    assert manifest.returncode == 0, manifest.stdout[-2000:] + manifest.stderr[-2000:]
    diff = provision("diff", BOX, TWIN, "--json")
    assert diff.returncode == 0, diff.stdout[-3000:] + diff.stderr[-3000:]
    result = json.loads(diff.stdout)
    assert result["pinned"] == {}, result["pinned"]
    unique = {row["item"] for row in result["unique"]}
    assert {"host.hostname", "host.machine_id"} <= unique
    verify = provision("verify", "-i", inv, "--limit", TWIN, "--json", timeout=600)
    assert verify.returncode == 0, verify.stdout[-2000:] + verify.stderr[-2000:]
    assert json.loads(verify.stdout)["hosts"][TWIN]["baseline_source"] == f"group {GROUP}"
