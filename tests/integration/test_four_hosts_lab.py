"""More than the session's lab, on one three-host lab of its own (marker: lab): lab-3080, lab-r9700 and
lab-3080-2, the second 3080 started bare, in a state directory of this module's own (no baseline or run of the
session's lab leaks into the twins' judgement). In order, each test building on the one before:

1. `provision bootstrap` of the bare twin: no rigbook user, key or sudoers drop-in, an `admin` account in group sudo
   with a password, its host key not in the lab's known_hosts. The unknown host key refused with nothing changed on
   the host, a wrong fingerprint refused, a wrong password (with --accept-new-host-key: the key printed and
   recorded), the converge, ssh as rigbook with the lab key and `sudo -n true`, a second run changing nothing, a
   user without sudo.
2. More hosts than the default layout get their own generated inventory, and Ansible reaches all three through it.
3. A second identical box: both 3080 twins converged by one site.yml run in parallel, their manifests diffed, and
   the twin with no baseline of its own held to the first box's group baseline; then `provision report` of that
   history in headless Chromium.
4. A rolling kernel upgrade (`--rolling 1`) of the two twins whose canary fails after its reboot: the roll stops
   there and the twin is untouched.

The twins' measured failure is the starting point of 3: twins share the lab's apt archive cache (as two boxes behind
one apt proxy share a mirror), so the second twin's kernel install met "Could not get lock
/var/cache/apt/archives/lock" while the first one installed. Here the first twin also has its dpkg lock held at the
start (as unattended-upgrades holds it for minutes after a fresh boot): rigbook's package runs wait for both.

The lab runs after every test of the session's lab (the fixture takes that one down first when one process runs every
test) and is taken down at the end of the module. Only 127.0.0.0/8 is contacted.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import time
from pathlib import Path

import yaml
from helpers.browser import browse, chromium, page_dom
from helpers.cli import REPO, changed_tasks, provision
from helpers.lab_host import LAB_MARKS, LabHost

from rigbook.lab import machine, state
from rigbook.paths import state_dir

pytestmark = LAB_MARKS
ARTIFACTS = REPO / "tests" / "artifacts-out"
FIRST, TWIN, GROUP = "lab-3080", "lab-3080-2", "x99_3080"  # the hosts of the `three_hosts` fixture
HOLD_S = 20
HOLDER = ("import fcntl, time; f = open('/var/lib/dpkg/lock-frontend', 'w'); fcntl.lockf(f, fcntl.LOCK_EX); "
          "open('/run/rigbook-test-hold', 'w').write('held'); "
          f"time.sleep({HOLD_S}); "
          "open('/var/tmp/rigbook-test-released', 'w').write(time.strftime('%Y-%m-%d %H:%M:%S'))")


def _fingerprint(pub) -> str:
    return subprocess.run(["ssh-keygen", "-lf", str(pub)], capture_output=True, text=True,
                          check=True).stdout.split()[1]


def _ssh_as_rigbook(host, command: str) -> subprocess.CompletedProcess:
    return subprocess.run(machine.ssh_command(host, command), capture_output=True, text=True, timeout=60)


def test_bootstrap_of_the_bare_twin(three_hosts):
    bootstrap_steps()


def bootstrap_steps():
    host = state.load().host(TWIN)
    assert host.bare
    inv = str(state.lab_dir() / "inventory")
    known = state.ssh_dir() / "known_hosts"
    root = host.root
    password = host.admin_password_file.read_text().strip()
    assert host.admin_password_file.stat().st_mode & 0o777 == 0o600
    fp = _fingerprint(host.dir / "ssh_host_ed25519_key.pub")
    # bare: no rigbook user, no drop-in, the host key unknown
    assert "rigbook:" not in (root / "etc/passwd").read_text()
    assert not (root / "etc/sudoers.d/rigbook").exists()
    assert host.address not in (known.read_text() if known.exists() else "")
    status = provision("lab", "status")
    assert f"password in {host.admin_password_file}" in status.stdout

    def boot(*args, pw=password):
        start = time.monotonic()
        proc = provision("bootstrap", TWIN, "-i", inv, "--user", state.BARE_ADMIN, *args,
                         env={"RIGBOOK_BOOTSTRAP_PASSWORD": pw}, timeout=300)
        print(f"bootstrap {' '.join(args)}: rc {proc.returncode} in {time.monotonic() - start:.1f} s")
        assert "Traceback" not in proc.stderr
        return proc

    # 1. an unknown host key is refused, naming its fingerprint and the two ways to accept it; nothing changes
    proc = boot()
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"offered an unknown host key: ssh-ed25519 {fp}" in proc.stderr
    assert f"--host-key-fingerprint {fp}" in proc.stderr and "--accept-new-host-key" in proc.stderr
    assert host.address not in (known.read_text() if known.exists() else "")
    assert "rigbook:" not in (root / "etc/passwd").read_text()
    # 2. a fingerprint that does not match is refused, nothing recorded
    proc = boot("--host-key-fingerprint", "SHA256:" + "A" * 43)
    assert proc.returncode == 2 and "not the fingerprint given" in proc.stderr, proc.stderr
    assert host.address not in (known.read_text() if known.exists() else "")
    # 3. a wrong password: one line, exit 2; --accept-new-host-key printed the fingerprint and recorded the key
    proc = boot("--accept-new-host-key", pw="wrong-" + password)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.strip() == (f"error: authentication failed for admin@{host.address}:2222 with the password "
                                   "(wrong password or key, or no such user)")
    assert f"host key: ssh-ed25519 {fp} for [{host.address}]:2222: accepted (--accept-new-host-key)" in proc.stdout
    pub = (host.dir / "ssh_host_ed25519_key.pub").read_text().split()
    assert f"[{host.address}]:2222 {pub[0]} {pub[1]}" in known.read_text().splitlines()
    # 4. the converge: user, key, sudoers drop-in (visudo-checked, 0440), python3; then ssh as rigbook works
    proc = boot()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "user     changed rigbook created" in out
    assert "key      changed" in out and "sudoers  changed /etc/sudoers.d/rigbook-rigbook" in out
    assert "visudo -cf ok" in out and "python3  ok      Python 3" in out
    assert f"ready: ssh as rigbook@{host.address}:2222 with" in out and "sudo -n true ok" in out
    assert f"{TWIN}: 3 changed (user, key, sudoers)" in out
    dropin = root / "etc/sudoers.d/rigbook-rigbook"
    assert dropin.read_text() == "rigbook ALL=(ALL) NOPASSWD: ALL\n"
    assert (dropin.stat().st_mode & 0o777, dropin.stat().st_uid) == (0o440, 0)
    assert not [p.name for p in (root / "etc/sudoers.d").iterdir() if p.name.startswith(".rigbook-")]
    ssh = _ssh_as_rigbook(host, "sudo -n true && id -un && stat -c '%a %U' ~/.ssh ~/.ssh/authorized_keys")
    assert ssh.returncode == 0, ssh.stderr
    assert ssh.stdout.split("\n")[:3] == ["rigbook", "700 rigbook", "600 rigbook"]
    # 5. a second run changes nothing and says so; the key is in authorized_keys once
    proc = boot()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"{TWIN}: nothing changed (already Ansible-ready)" in proc.stdout
    assert " changed " not in proc.stdout.replace("nothing changed", "")
    lab_pub = (state.ssh_dir() / "id_ed25519.pub").read_text().split()[1]
    assert (root / "home/rigbook/.ssh/authorized_keys").read_text().count(lab_pub) == 1
    # 6. a user without sudo: one line, exit 2
    make = _ssh_as_rigbook(host, "sudo -n useradd -m -s /bin/bash plain && echo plain:plainpw | sudo -n chpasswd")
    assert make.returncode == 0, make.stderr
    proc = provision("bootstrap", TWIN, "-i", inv, "--user", "plain", env={"RIGBOOK_BOOTSTRAP_PASSWORD": "plainpw"},
                     timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"error: plain on {TWIN} ({host.address}:2222) has no sudo" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_more_hosts_get_their_own_inventory_and_ansible_reaches_them(three_hosts):
    proc = provision("site.yml", "-i", three_hosts, "--tags", "preflight", "--json", timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads(proc.stdout)["hosts"]
    assert sorted(summary) == [FIRST, TWIN, "lab-r9700"], summary
    assert {entry["failed"] for entry in summary.values()} == {0}, summary


def test_two_twins_converge_in_parallel_diff_clean_and_the_twin_is_held_to_the_group_baseline(three_hosts):
    inventory = three_hosts
    first, twin = LabHost(FIRST), LabHost(TWIN)

    # unattended-upgrades on the first twin: its dpkg lock held when the run starts
    first.run(f"setsid nohup /usr/bin/python3 -c {shlex.quote(HOLDER)} >/dev/null 2>&1 &")
    deadline = time.monotonic() + 30
    while first.run("test -e /run/rigbook-test-hold", check=False).returncode != 0:
        assert time.monotonic() < deadline, "the lock holder did not start"
        time.sleep(0.3)

    started = time.monotonic()
    site = provision("site.yml", "-i", inventory, "--limit", GROUP, "--json", timeout=1800)
    elapsed = time.monotonic() - started
    assert site.returncode == 0, site.stdout[-3000:] + site.stderr[-3000:]
    summary = json.loads(site.stdout)["hosts"]
    assert {summary[h]["failed"] for h in (FIRST, TWIN)} == {0}, summary
    # both converged by the one run: each got the pinned kernel and its one reboot
    assert first.boots() == 2 and twin.boots() == 2
    # the first twin's kernel install waited for the held lock instead of failing
    released = first.out("cat /var/tmp/rigbook-test-released").strip()
    installs = re.findall(r"^(\S+ \S+) install linux-image-", first.out("cat /var/log/dpkg.log"), re.M)
    assert installs and min(installs) >= released, (released, installs)
    print(f"site.yml converged both twins in {elapsed:.0f} s")
    # one build for the group: one twin (the first of the play's hosts) built nccl-tests and left the archive on the
    # controller; the other installed it (its sha256 and stamp checked), compiling nothing: no build log there, the
    # same programs
    programs = "sha256sum /opt/rigbook/nccl-tests/current/bin/*_perf | sed 's| .*/| |'"
    assert first.out(programs) == twin.out(programs) and len(first.out(programs).splitlines()) == 4
    built = {box.name: box.run("test -e /opt/rigbook/nccl-tests/.nccl-tests-build.log", check=False).returncode == 0
             for box in (first, twin)}
    assert sorted(built.values()) == [False, True], (built, site.stdout[-3000:])
    [installer] = [box for box in (first, twin) if not built[box.name]]
    [archive] = (state_dir() / "builds").glob("nccl-tests-*.tar.gz")
    assert installer.out(f"sha256sum /var/cache/rigbook/builds/{archive.name}").split()[0] == archive.name[-71:-7]

    manifest = provision("manifest", "-i", inventory, "--limit", GROUP, timeout=600)
    assert manifest.returncode == 0, manifest.stdout[-2000:] + manifest.stderr[-2000:]
    diff = provision("diff", FIRST, TWIN, "--json")
    assert diff.returncode == 0, diff.stdout[-3000:] + diff.stderr[-3000:]
    result = json.loads(diff.stdout)
    assert result["pinned"] == {}, result["pinned"]
    unique = {row["item"] for row in result["unique"]}
    assert {"host.hostname", "host.machine_id", "bind.etc/systemd/system/rigbook-serve-standin.service"} <= unique
    assert result["same"] > 20

    # the first box's figures as the group's baseline; the twin has none of its own
    record = provision("baseline", "record", "-i", inventory, "--limit", FIRST, "--group", timeout=600)
    assert record.returncode == 0, record.stdout[-2000:] + record.stderr[-2000:]
    healthy = provision("verify", "-i", inventory, "--limit", TWIN, "--json", timeout=600)
    assert healthy.returncode == 0, healthy.stdout[-2000:] + healthy.stderr[-2000:]
    assert json.loads(healthy.stdout)["hosts"][TWIN]["baseline_source"] == f"group {GROUP}"

    # the 3080 box has no P2P: its held figures are the host-staged copies, so halving them fails p2p_bandwidth,
    # where the climb stops (its collectives, SHM at that copy rate, would fail too)
    broke = provision("lab", "break", TWIN, "p2p-bandwidth-half")
    assert broke.returncode == 0, broke.stdout + broke.stderr
    halved = provision("verify", "-i", inventory, "--limit", TWIN, "--json", timeout=600)
    assert halved.returncode == 1, halved.stdout[-2000:] + halved.stderr[-2000:]
    host = json.loads(halved.stdout)["hosts"][TWIN]
    assert host["baseline_source"] == f"group {GROUP}", host
    failed = [v for v in host["ladder"] if v["status"] == "fail"]
    assert [v["layer"] for v in failed] == ["p2p_bandwidth"], host["ladder"]
    assert "baseline" in failed[0]["why"], failed[0]
    report_of_the_lab_history(inventory, Path(json.loads(halved.stdout)["run_dir"]).name,
                              [v["layer"] for v in host["ladder"]])


def report_of_the_lab_history(inventory: str, halved_run: str, layers: list) -> None:
    """`provision report` of this lab history (a group baseline, a healthy and a halved verify of the twin) in
    headless Chromium with the network off: every host and layer, every recorded figure drawn, the halved run
    below the fail band; the screenshot kept (and made the README's picture with RIGBOOK_UPDATE_SCREENSHOT=1)."""

    out = state_dir() / "report.html"
    made = provision("report", "-i", inventory, "-o", str(out))
    assert made.returncode == 0, made.stdout + made.stderr
    assert "http://" not in out.read_text() and "https://" not in out.read_text()
    binary = chromium()
    profile = state_dir() / "chromium"
    profile.mkdir()
    find = page_dom(out, profile)

    for name in (FIRST, TWIN, "lab-r9700"):
        assert find("section", class_="host", data_host=name), name
    points = 0
    for name in (FIRST, TWIN):
        history = json.loads((state_dir() / "baselines" / f"{name}.json").read_text())["history"]
        for entry in history:
            for metric, value in entry["metrics"].items():
                if isinstance(value, (int, float)):
                    (point,) = find("circle", data_host=name, data_metric=metric,
                                    data_run=Path(entry["run_dir"]).name)
                    assert float(point["data-value"]) == value
                    points += 1
    assert points == len(find("circle")) and points >= 6, points  # every recorded figure, and nothing else
    assert [e["data-layer"] for e in find("tr", data_host=TWIN) if "data-layer" in e] == layers
    halved_points = [e for e in find("circle", data_host=TWIN, data_run=halved_run) if e["data-status"] == "fail"]
    assert halved_points, "the halved run drew no failing point"
    for point in halved_points:
        (band,) = find("rect", data_band="fail", data_host=TWIN, data_metric=point["data-metric"])
        top, bottom = float(band["y"]), float(band["y"]) + float(band["height"])
        assert top < float(point["cy"]) <= bottom, (point, band)  # drawn below the fail line

    shot = state_dir() / "report.png"
    taken = browse(binary, out, profile, f"--screenshot={shot}", "--window-size=1280,2400")
    assert taken.returncode == 0 and shot.is_file(), taken.stderr[-2000:]
    ARTIFACTS.mkdir(exist_ok=True)
    shutil.copy(shot, ARTIFACTS / "report-lab.png")
    if os.environ.get("RIGBOOK_UPDATE_SCREENSHOT"):
        shutil.copy(shot, REPO / "docs" / "report.png")


def test_a_rolling_kernel_upgrade_stops_at_the_box_that_fails_after_its_reboot(three_hosts, tmp_path):
    """`provision site.yml --rolling 1` of a kernel upgrade (6.1.0-47 -> 6.1.0-50, the pin changed in a copy of the
    inventory) across the two 3080 twins: the canary installs the new kernel, builds the fork for it, stops its
    engine and reboots, and then fails its ladder (fault iommu-flags-lost: the new kernel booted without the IOMMU
    flags); the roll stops there and the twin after it is untouched: its old kernel, no reboot, no new package."""
    first, twin = LabHost(FIRST), LabHost(TWIN)
    for host in (FIRST, TWIN):
        healed = provision("lab", "heal", host)
        assert healed.returncode == 0, healed.stdout + healed.stderr
    inv = tmp_path / "inv"
    inv.mkdir()
    shutil.copy(Path(three_hosts) / "hosts.yml", inv / "hosts.yml")
    shutil.copytree(REPO / "inventory/lab/group_vars", inv / "group_vars")
    shutil.copytree(REPO / "inventory/lab/locks", inv / "locks")
    group = inv / "group_vars" / f"{GROUP}.yml"
    old = yaml.safe_load(group.read_text())["rigbook_pins"]["kernel"]["release"]
    new = "6.1.0-50-amd64"
    group.write_text(group.read_text().replace(old, new))
    twin_boots, twin_packages = twin.boots(), twin.out("dpkg-query -W -f='${Package}\\n' 'linux-image-*'")
    broke = provision("lab", "break", FIRST, "iommu-flags-lost")
    assert broke.returncode == 0, broke.stdout + broke.stderr
    try:
        roll = provision("site.yml", "-i", inv, "--limit", GROUP, "--rolling", "1", "--json", timeout=1800)
        assert roll.returncode == 1, roll.stdout[-3000:] + roll.stderr[-3000:]
        data = json.loads(roll.stdout)
        assert data["rolling"]["batches"] == [{"batch": 1, "hosts": [FIRST], "exit_code": 1}]
        assert data["rolling"]["stopped_at_batch"] == 1 and data["rolling"]["untouched"] == [TWIN]
        assert f"rolling: stopped at batch 1/2 ({FIRST}): exit 1: {FIRST} at 'Ladder 1-5: " in roll.stderr
        canary = data["runs"][0]["hosts"][FIRST]
        assert [v["layer"] for v in canary["ladder"] if v["status"] == "fail"] == ["kernel_state"], canary["ladder"]
        done = [name for name, _ in changed_tasks(data["runs"][0]["run_dir"])[FIRST]]
        # its engine was stopped before the reboot, the reboot came after the new kernel and the fork's build for it
        assert done.index("Stop the serve units before the reboot") < done.index(
            "Reboot once into the new kernel, driver and boot target"), done
        assert first.out("cat /var/lib/rigbook-lab/evidence/proc/sys/kernel/osrelease").strip() == new
        # the twin: never contacted by the roll
        assert twin.boots() == twin_boots
        assert twin.out("cat /var/lib/rigbook-lab/evidence/proc/sys/kernel/osrelease").strip() == old
        assert twin.out("dpkg-query -W -f='${Package}\\n' 'linux-image-*'") == twin_packages
    finally:
        healed = provision("lab", "heal", FIRST)
        assert healed.returncode == 0, healed.stdout + healed.stderr
