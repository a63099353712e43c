"""More than the session's lab, on one four-host lab of its own (marker: lab): two boxes of each vendor - lab-3080 and
lab-3080-2 (started bare), lab-r9700 and lab-r9700-2 - in a state directory of this module's own (no baseline, run or
build of the session's lab leaks into the twins' judgement). Brought up once for every test here, in order, each
building on the one before:

1. `provision bootstrap` of the bare twin: no rigbook user, key or sudoers drop-in, an `admin` account in group sudo
   with a password, its host key not in the lab's known_hosts. The unknown host key refused with nothing changed on
   the host, a wrong fingerprint refused, a wrong password (with --accept-new-host-key: the key printed and
   recorded), the converge, ssh as rigbook with the lab key and `sudo -n true`, a second run changing nothing, a
   user without sudo.
2. More hosts than the default layout get their own generated inventory, and Ansible reaches all four through it.
3. Two groups of twins: all four boxes converged by one site.yml run in parallel; in each group one box builds (RCCL
   with rccl-tests; the NVIDIA fork through DKMS and nccl-tests) and the other installs that build (no build log on
   it, equal sha256; the fork's checked modules put in dkms's tree, no dkms command reading the archive); the
   controller's provenance record of each; `provision diff` of each pair shows no pinned
   difference and equal build hashes; the twin with no baseline of its own held
   to the first box's group baseline; then `provision report` of that history in headless Chromium.
3b. The NVIDIA twin given a tampered group archive: one changed in the controller's builds/ is not used (the run says
   why) and the twin builds its own, equal to its twin's but for the modules' signatures; ones handed to the module
   (an extra file, a changed .ko, a dkms.conf holding a command) are refused naming the archive, nothing installed,
   the command never run.
4. The health timer on the AMD twin: a lab fault in its Prometheus metrics (read through the host's node_exporter)
   within one interval, gone after heal.
5. A rolling kernel upgrade across all four (`--rolling 2`: a canary, then two per batch): the 3080 boxes get the
   next Debian kernel, the R9700 boxes the stock Debian kernel in place of their custom P2P kernel; the first R9700
   fails its ladder after its reboot (the stock kernel has no CONFIG_PCI_P2PDMA), the roll stops at its batch and
   the box after it keeps its old kernel.

The twins' measured failure is the starting point of 3: twins share the lab's apt archive cache (as two boxes behind
one apt proxy share a mirror), so the second twin's kernel install met "Could not get lock
/var/cache/apt/archives/lock" while the first one installed. Here the first twin also has its dpkg lock held at the
start (as unattended-upgrades holds it for minutes after a fresh boot): rigbook's package runs wait for both.

The lab runs after every test of the session's lab (the fixture takes that one down first when one process runs every
test) and is taken down at the end of the module. Only 127.0.0.0/8 is contacted.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import re
import shlex
import shutil
import subprocess
import tarfile
import time
from pathlib import Path

import yaml
from ansible_collections.rigbook.homelab.plugins.module_utils import safe_untar
from ansible_collections.rigbook.homelab.plugins.module_utils.facts import builds
from helpers import prometheus
from helpers.browser import browse, chromium, page_dom
from helpers.cli import REPO, changed_tasks, provision
from helpers.lab_host import LAB_MARKS, LabHost

from rigbook import baselines
from rigbook.inventory import load
from rigbook.lab import machine, state
from rigbook.paths import state_dir

pytestmark = LAB_MARKS
ARTIFACTS = REPO / "tests" / "artifacts-out"
FIRST, TWIN, GROUP = "lab-3080", "lab-3080-2", "x99_3080"  # the hosts of the `four_hosts` fixture
AMD, AMD_TWIN, AMD_GROUP = "lab-r9700", "lab-r9700-2", "x99_r9700"
HOSTS = [FIRST, TWIN, AMD, AMD_TWIN]  # inventory order: the groups as `lab up` names them
# each group's build: (the archive's name, its install root, the files compared between the twins)
BUILDS = {GROUP: ("nccl-tests", "/opt/rigbook/nccl-tests", "bin/*_perf"),
          AMD_GROUP: ("rccl", "/opt/rigbook/rccl", "lib/librccl.so.* bin/*_perf")}
PROM = "/var/lib/prometheus/node-exporter/rigbook.prom"
INTERVAL_S = 20  # rigbook_health.interval_s the health test gives its host with -e (the lab's own is 300 s)
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


def test_bootstrap_of_the_bare_twin(four_hosts):
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


def test_more_hosts_get_their_own_inventory_and_ansible_reaches_them(four_hosts):
    proc = provision("site.yml", "-i", four_hosts, "--tags", "preflight", "--json", timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads(proc.stdout)["hosts"]
    assert sorted(summary) == sorted(HOSTS), summary
    assert {entry["failed"] for entry in summary.values()} == {0}, summary


def test_two_groups_of_twins_converge_in_parallel_each_built_once_diff_clean_and_held_to_the_group_baseline(
        four_hosts):
    inventory = four_hosts
    first = LabHost(FIRST)

    # unattended-upgrades on the first twin: its dpkg lock held when the run starts
    first.run(f"setsid nohup /usr/bin/python3 -c {shlex.quote(HOLDER)} >/dev/null 2>&1 &")
    deadline = time.monotonic() + 30
    while first.run("test -e /run/rigbook-test-hold", check=False).returncode != 0:
        assert time.monotonic() < deadline, "the lock holder did not start"
        time.sleep(0.3)

    started = time.monotonic()
    site = provision("site.yml", "-i", inventory, "--json", timeout=2400)
    elapsed = time.monotonic() - started
    assert site.returncode == 0, site.stdout[-3000:] + site.stderr[-3000:]
    summary = json.loads(site.stdout)["hosts"]
    assert {summary[h]["failed"] for h in HOSTS} == {0}, summary
    # all four converged by the one run: each got the pinned kernel and its one reboot
    assert {name: LabHost(name).boots() for name in HOSTS} == dict.fromkeys(HOSTS, 2)
    # the first twin's kernel install waited for the held lock instead of failing
    released = first.out("cat /var/tmp/rigbook-test-released").strip()
    installs = re.findall(r"^(\S+ \S+) install linux-image-", first.out("cat /var/log/dpkg.log"), re.M)
    assert installs and min(installs) >= released, (released, installs)
    print(f"site.yml converged the four boxes in {elapsed:.0f} s")
    for group, pair in ((GROUP, (FIRST, TWIN)), (AMD_GROUP, (AMD, AMD_TWIN))):
        one_build_for_the_group(group, [LabHost(name) for name in pair], site.stdout)
    one_dkms_build_for_the_twins(json.loads(site.stdout)["run_dir"])

    manifest = provision("manifest", "-i", inventory, timeout=600)
    assert manifest.returncode == 0, manifest.stdout[-2000:] + manifest.stderr[-2000:]
    pins = yaml.safe_load((REPO / f"inventory/lab/group_vars/{GROUP}.yml").read_text())["rigbook_pins"]
    dkms = f"dkms.{pins['kernel']['release']}"  # the fork's modules DKMS installed for the pinned kernel
    for a, b, build in ((FIRST, TWIN, "nccl_tests"), (FIRST, TWIN, dkms), (AMD, AMD_TWIN, "rccl")):
        diff = provision("diff", a, b, "--json")
        assert diff.returncode == 0, diff.stdout[-3000:] + diff.stderr[-3000:]
        result = json.loads(diff.stdout)
        assert result["pinned"] == {}, result["pinned"]
        unique = {row["item"] for row in result["unique"]}
        assert {"host.hostname", "host.machine_id"} <= unique and result["same"] > 20
        equal = {row["build"]: row["equal"] for row in result["builds"]}
        assert equal.get(build) is True and all(equal.values()), result["builds"]
        plain = provision("diff", a, b)
        assert f"build {build}: equal, sha256 " in plain.stdout, plain.stdout
    assert any(row["item"] == "bind.etc/systemd/system/rigbook-serve-standin.service" for row in result["unique"])

    # before any baseline: the twin is judged from its first run by the shipped reference of its class (seed 000's
    # published figures, references/x99-3080-pair.yml), and at half its copy rate it fails against it
    first_run = provision("verify", "-i", inventory, "--limit", TWIN, "--json", timeout=600)
    assert first_run.returncode == 0, first_run.stdout[-2000:] + first_run.stderr[-2000:]
    host = json.loads(first_run.stdout)["hosts"][TWIN]
    assert host["baseline_source"] == "reference x99-3080-pair", host
    bandwidth = next(v for v in host["ladder"] if v["layer"] == "p2p_bandwidth")
    assert "vs baseline 6.00 (1.00x)" in bandwidth["why"] and bandwidth["baseline"].startswith("reference x99-3080")
    broke = provision("lab", "break", TWIN, "p2p-bandwidth-half")
    assert broke.returncode == 0, broke.stdout + broke.stderr
    halved = provision("verify", "-i", inventory, "--limit", TWIN, "--json", timeout=600)
    assert halved.returncode == 1, halved.stdout[-2000:] + halved.stderr[-2000:]
    host = json.loads(halved.stdout)["hosts"][TWIN]
    assert host["baseline_source"] == "reference x99-3080-pair", host
    assert [v["layer"] for v in host["ladder"] if v["status"] == "fail"] == ["p2p_bandwidth"], host["ladder"]
    healed = provision("lab", "heal", TWIN)
    assert healed.returncode == 0, healed.stdout + healed.stderr

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


def one_build_for_the_group(group: str, boxes: list, run_out: str) -> None:
    """One build for GROUP's BOXES: one of them (the first of the play's hosts needing it) built it and left the
    archive on the controller; the other installed it (its sha256 and stamp checked), compiling nothing: no build log
    there, the same files."""
    name, root, files = BUILDS[group]
    listing = f"cd {root}/current && sha256sum {files}"
    sums = [box.out(listing) for box in boxes]
    assert sums[0] == sums[1] and len(sums[0].splitlines()) >= 2, sums
    built = {box.name: box.run(f"test -e {root}/.{name}-build.log", check=False).returncode == 0 for box in boxes}
    assert sorted(built.values()) == [False, True], (group, built, run_out[-3000:])
    [installer] = [box for box in boxes if not built[box.name]]
    [archive] = (state_dir() / "builds").glob(f"{name}-*.tar.gz")
    assert installer.out(f"sha256sum /var/cache/rigbook/builds/{archive.name}").split()[0] == archive.name[-71:-7]
    # the controller's record of it: who built it, the sha256 it computed, its manifest of the installed files
    [record] = (state_dir() / "builds").glob(f"{archive.name[:-len('.tar.gz')]}.provenance-*.json")
    provenance = json.loads(record.read_text())
    [builder] = [box.name for box in boxes if built[box.name]]
    assert (provenance["host"], provenance["sha256"], record.stat().st_mode & 0o777) == (
        builder, archive.name[-71:-7], 0o600)
    assert group in provenance["group"].split(",") and provenance["manifest"][".rigbook-build.json"]["size"] > 0


def one_dkms_build_for_the_twins(run_dir: str) -> None:
    """The driver fork's DKMS build: one 3080 twin built it and exported its modules, the other put the checked
    modules in dkms's tree and installed them (dkms install, nothing compiled); the same module files on both."""
    results = {host: [res for _task, res in tasks if "/nvidia-" in str(res.get("export_path") or "")
                      + str(res.get("installed_from") or "")] for host, tasks in changed_tasks(run_dir).items()}
    ways = {host: ["built" if res.get("export_path") else "installed" for res in found]
            for host, found in results.items() if host in (FIRST, TWIN)}
    assert sorted(ways.values()) == [["built"], ["installed"]], ways
    [built] = [res for host in (FIRST, TWIN) for res in results[host] if res.get("export_path")]
    [installed] = [res for host in (FIRST, TWIN) for res in results[host] if res.get("installed_from")]
    assert Path(installed["installed_from"]).name == Path(built["export_path"]).name
    modules = "cd /lib/modules && sha256sum */updates/dkms/*"
    assert LabHost(FIRST).out(modules) == LabHost(TWIN).out(modules) != ""


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

    for name in HOSTS:
        assert find("section", class_="host", data_host=name), name
    points = 0
    inv = load(Path(inventory))
    for name in HOSTS:
        history = baselines.history(name, inv, [])  # this inventory's (a baselines file keeps one per inventory)
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


KO_MAGIC = b"~Module signature appended~\n"


def _unsigned(module: bytes) -> bytes:
    """A kernel module's bytes without the signature a signing key appended (struct module_signature: its last 4 of
    12 bytes the signature's length), as built."""
    if not module.endswith(KO_MAGIC):
        return module
    info = module[-len(KO_MAGIC) - 12:-len(KO_MAGIC)]
    return module[:-len(KO_MAGIC) - 12 - int.from_bytes(info[8:12], "big")]


def _repacked(data: bytes, change) -> bytes:
    """The group archive DATA with CHANGE (dict of member name -> bytes) applied, packed as the module packs it."""
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        members = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}
    change(members)
    return builds.pack([(name, "bytes", body) for name, body in members.items()])


def _restamped(members: dict) -> None:
    """The archive's stamp rewritten to name its files as they are: a build host that lies consistently."""
    stamp = json.loads(members[builds.BUILD_STAMP])
    stamp["files"] = {n: hashlib.sha256(b).hexdigest() for n, b in members.items() if n != builds.BUILD_STAMP}
    members[builds.BUILD_STAMP] = json.dumps(stamp).encode()


def _manifest(data: bytes, tmp_path: Path) -> dict:
    """The controller's manifest of an archive: {path: sha256} of its regular files (safe_untar.listing)."""
    path = tmp_path / "listed.tar.gz"
    path.write_bytes(data)
    return {rel: e["sha256"] for rel, e in safe_untar.listing(str(path)).items() if e["kind"] == "file"}


def _results(run_dir: str, host: str) -> list:
    """[(task name, result)] of HOST's finished tasks in the run stored in RUN_DIR, in order (job events)."""
    events = []
    for path in Path(run_dir).glob("artifacts/*/job_events/*.json"):
        event = json.loads(path.read_text())
        if event.get("event") in ("runner_on_ok", "runner_on_failed") and event["event_data"].get("host") == host:
            events.append((event["counter"], event["event_data"]["task"], event["event_data"].get("res") or {}))
    return [(task, res) for _, task, res in sorted(events, key=lambda e: e[0])]


def test_a_twin_given_a_tampered_group_archive_refuses_it_and_installs_nothing_of_it(four_hosts, tmp_path):
    """The 3080 twins' DKMS build, from the run before (one twin built it, the first of the play's boxes needing it,
    and the controller recorded it; the other installed it). 1. Its archive
    changed in the controller's builds/ (a changed .ko under the old name): the controller no longer gets the recorded
    sha256, the run says why and the twin builds its own. 2. Tampered archives handed to the module on the twin, each
    with the controller's manifest of what it holds (an extra file, a changed .ko, a dkms.conf holding a command):
    each refused naming the archive, no module of it installed, the command never run (dkms ldtarball would have
    sourced that dkms.conf as root)."""
    pins = yaml.safe_load((REPO / f"inventory/lab/group_vars/{GROUP}.yml").read_text())["rigbook_pins"]
    kernel, driver = pins["kernel"]["release"], pins["nvidia_driver"]
    version = driver["version"]
    marker = "/var/tmp/rigbook-dkms-conf-ran"
    builds_dir = state_dir() / "builds"
    [archive] = builds_dir.glob("nvidia-*.tar.gz")
    [record_file] = builds_dir.glob(archive.name[:-len(".tar.gz")] + ".provenance-*.json")
    record = json.loads(record_file.read_text())
    genuine = archive.read_bytes()
    assert (record_file.stat().st_mode & 0o777, record["sha256"]) == (0o600, hashlib.sha256(genuine).hexdigest())
    assert record["host"] in (FIRST, TWIN), record["host"]
    other = TWIN if record["host"] == FIRST else FIRST  # the twin that installed the builder's archive
    twin, first = LabHost(other), LabHost(record["host"])
    arch = twin.out("uname -m").strip()
    ko_member = f"dkms_main_tree/{kernel}/{arch}/module/nvidia.ko"
    assert GROUP in record["group"].split(",") and record["inventory"] == str(Path(four_hosts).resolve())
    # the controller's manifest: the module the builder built, as the other twin installed it
    installed_ko = f"/lib/modules/{kernel}/updates/dkms/nvidia.ko"
    assert record["manifest"][ko_member]["sha256"] == twin.out(f"sha256sum {installed_ko}").split()[0]

    # 1. a changed .ko in builds/: not used (said), the twin builds its own, which replaces it in builds/
    tampered = _repacked(genuine, lambda m: m.update({ko_member: b"\x7fELF not the build"}))
    archive.write_bytes(tampered)
    twin.run(f"dkms remove nvidia/{version} -k {kernel}")
    started = time.monotonic()
    run = provision("site.yml", "-i", four_hosts, "--limit", other, "--tags", "nvidia_p2p_driver", "--json",
                    timeout=900)
    print(f"the twin's own DKMS build, the tampered archive refused: {time.monotonic() - started:.0f} s")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    results = _results(json.loads(run.stdout)["run_dir"], other)
    [plan] = [res for task, res in results if task.startswith("Plan this box's part") and res.get("why")]
    assert plan["part"] == "build" and plan["why"] == [
        f"{archive.name}: not used: its sha256 is now {hashlib.sha256(tampered).hexdigest()}, its provenance record "
        f"says {record['sha256']}"], plan
    [built] = [res for task, res in results if task == "Wait for the group's build" and res.get("export_path")]
    assert built["built"] == [kernel] and "installed_from" not in built
    [ours] = [json.loads(p.read_text()) for p in builds_dir.glob("nvidia-*.provenance-*.json")]
    assert ours["host"] == other and hashlib.sha256(tampered).hexdigest() not in {
        hashlib.sha256(p.read_bytes()).hexdigest() for p in builds_dir.glob("nvidia-*.tar.gz")}
    mine, theirs = (base64.b64decode(box.out(f"base64 -w0 {installed_ko}")) for box in (twin, first))
    # reproducible: the same module but for the signature each box's own key appends (dkms signs with
    # /var/lib/dkms/mok.key, made per box); the archives are equal exactly when the modules are
    assert _unsigned(mine) == _unsigned(theirs) and b"not the build" not in mine
    assert (ours["sha256"] == record["sha256"]) == (mine == theirs), (ours["sha256"], record["sha256"])
    print(f"DKMS build reproduced byte for byte across the twins: {mine == theirs} (signed: {mine.endswith(KO_MAGIC)})")

    # 2. tampered archives handed to the module on the twin, each with the controller's manifest of what it holds
    with tarfile.open(fileobj=io.BytesIO(genuine)) as tar:  # the pinned source's dkms.conf, as exported
        pinned_conf = tar.extractfile("dkms_binaries_only/dkms.conf").read()
    identity = builds.parse_archive_name(archive.name)["identity_id"]
    cases = {
        "extra file": (_repacked(genuine, lambda m: (m.update({"dkms_binaries_only/post.sh": b"touch /x\n"}),
                                                     _restamped(m))), None,
                       "dkms_binaries_only/post.sh is no part of a binaries-only build"),
        "changed .ko": (tampered, _manifest(genuine, tmp_path),
                        f"{ko_member} is not the file the controller's manifest names"),
        "dkms.conf with a command": (
            _repacked(genuine, lambda m: (m.update({"dkms_binaries_only/dkms.conf": pinned_conf
                                                    + f"\ntouch {marker}\n".encode()}), _restamped(m))), None,
            "its dkms_binaries_only/dkms.conf is not the pinned source's"),
    }
    folder = tmp_path / "tampered"
    folder.mkdir()
    tasks = [{"name": "Remove the twin's build (due again)", "ansible.builtin.command":
              f"dkms remove nvidia/{version} -k {kernel}"},
             {"name": "Copy the archives", "ansible.builtin.copy": {"src": f"{folder}/", "dest": "/var/tmp/tampered/"}}]
    given = {}
    for case, (data, files, _why) in cases.items():
        name = builds.archive_name("nvidia", identity, hashlib.sha256(data).hexdigest())
        (folder / name).write_bytes(data)
        given[case] = f"/var/tmp/tampered/{name}"
        tasks.append({"name": f"Install: {case}", "rigbook.homelab.dkms_module": {
            "name": "nvidia", "version": version, "src": driver["source"]["path"], "sha256": driver["source"]["sha256"],
            "kernels": [kernel], "install_from": given[case],
            "install_files": _manifest(data, tmp_path) if files is None else files}, "failed_when": False})
    tasks += [{"name": "What is installed now", "ansible.builtin.stat": {"path": installed_ko}},
              {"name": "Build it here again", "rigbook.homelab.dkms_module": {
                  "name": "nvidia", "version": version, "src": driver["source"]["path"],
                  "sha256": driver["source"]["sha256"], "kernels": [kernel]}}]
    playbook = tmp_path / "tampered.yml"
    playbook.write_text(json.dumps([{"hosts": other, "gather_facts": False, "become": True, "tasks": tasks}]))
    run = provision(str(playbook), "-i", four_hosts, "--limit", other, "--json", timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    results = dict(_results(json.loads(run.stdout)["run_dir"], other))
    for case, (_data, _files, why) in cases.items():
        res = results[f"Install: {case}"]
        assert res["msg"].startswith(f"refused {given[case]}: ") and why in res["msg"], (case, res["msg"])
        assert res["msg"].endswith("; no module was installed"), res["msg"]
    assert results["What is installed now"]["stat"]["exists"] is False  # nothing of the three installed
    assert twin.run(f"test -e {marker}", check=False).returncode != 0  # the dkms.conf's command never ran
    assert twin.run(f"cat /usr/src/nvidia-{version}/dkms.conf").stdout.encode() == pinned_conf
    assert results["Build it here again"]["built"] == [kernel]
    assert "/updates/dkms/" in twin.out(f"modinfo -k {kernel} -n nvidia")


def _metrics(box) -> dict:
    """BOX's metrics by series; a failing or warning layer's `code` label is kept apart, under "codes" (series ->
    code), so a series is found by its layer whatever its code."""
    # through node_exporter's HTTP endpoint (its textfile collector serving PROM), as Prometheus reads them
    out, codes = prometheus.series(box.scrape())
    out["codes"] = codes
    return out


def _metrics_once(box, predicate, what, limit_s=2 * INTERVAL_S + 15) -> dict:
    """BOX's metrics once PREDICATE holds of them, waiting at most LIMIT_S (a run ends within one interval)."""
    deadline = time.monotonic() + limit_s
    while True:
        metrics = _metrics(box)
        if predicate(metrics):
            return metrics
        assert time.monotonic() < deadline, f"{what}: not within {limit_s} s: {metrics}"
        time.sleep(2)


def test_the_health_timer_shows_a_fault_within_an_interval_and_clears_after_heal(four_hosts):
    """rigbook-health.timer on the AMD twin runs the static layers, the error counters and the serving layer without
    requests every rigbook_health.interval_s and writes node_exporter textfile metrics: a lab fault shows in them
    within one interval and clears after heal. Real systemd timer, real files; the GPUs are the lab's recorded trees."""
    box = LabHost(AMD_TWIN)
    quick = provision("site.yml", "-i", four_hosts, "--limit", AMD_TWIN, "--tags", "health", "-e",
                      json.dumps({"rigbook_health": {"interval_s": INTERVAL_S}}), timeout=600)
    assert quick.returncode == 0, quick.stdout[-3000:] + quick.stderr[-3000:]
    assert f"OnUnitActiveSec={INTERVAL_S}" in box.out("systemctl cat rigbook-health.timer").replace(" ", "")
    assert box.out("systemctl is-active rigbook-health.timer").strip() == "active"
    assert box.out("systemctl is-enabled rigbook-health.timer").strip() == "enabled"
    link = 'rigbook_layer_status{layer="pcie_link"}'
    healthy = _metrics_once(box, lambda m: m.get(link) == 0, "a healthy run")
    assert healthy['rigbook_layer_status{layer="serving"}'] == 0  # the engine: up, ready, on its transport
    assert healthy["rigbook_error_counters_status"] == 0
    broke = provision("lab", "break", AMD_TWIN, "link-x8")
    assert broke.returncode == 0, broke.stderr
    try:
        since = time.time()
        failed = _metrics_once(box, lambda m: m.get(link) == 2, "link-x8 in the metrics")
        assert failed["rigbook_health_last_run_timestamp_seconds"] >= since - 1
        assert failed["codes"][link].startswith("RB-PCIE-"), failed["codes"]  # the finding's code (docs/codes.md)
        assert "pcie_link: fail: " in box.out("journalctl -u rigbook-health.service --no-pager -o cat -n 40")
    finally:
        healed = provision("lab", "heal", AMD_TWIN)
        assert healed.returncode == 0, healed.stderr
    _metrics_once(box, lambda m: m.get(link) == 0, "the heal in the metrics")


def _kernel_pin(group_file: Path, pin: dict) -> str:
    """GROUP_FILE with its kernel pin replaced by PIN; returns the release it had."""
    data = yaml.safe_load(group_file.read_text())
    old = data["rigbook_pins"]["kernel"]["release"]
    data["rigbook_pins"]["kernel"] = pin
    group_file.write_text(yaml.safe_dump(data, sort_keys=False))
    return old


def test_a_rolling_kernel_upgrade_across_the_four_stops_at_the_box_that_fails_after_its_reboot(four_hosts, tmp_path):
    """`provision site.yml --rolling 2` of a kernel upgrade across the four boxes (the pins changed in a copy of the
    inventory): the 3080 boxes 6.1.0-47 -> 6.1.0-50 (Debian's), the R9700 boxes from their custom P2P kernel (its
    lab stand-in) to Debian's stock 6.1.0-50. Batches: the canary lab-3080; lab-3080-2 and lab-r9700; lab-r9700-2.
    Each box of a batch installs the new kernel (and the fork's DKMS build for it), stops its engine, reboots and
    runs the ladder: lab-r9700 fails it (the stock kernel has no CONFIG_PCI_P2PDMA), so the roll stops at batch 2 and
    lab-r9700-2 is untouched: its old kernel, no reboot, no new package."""
    for host in HOSTS:  # the faults of the tests before (the twin's halved bandwidth)
        healed = provision("lab", "heal", host)
        assert healed.returncode == 0, healed.stdout + healed.stderr
    inv = tmp_path / "inv"
    inv.mkdir()
    shutil.copy(Path(four_hosts) / "hosts.yml", inv / "hosts.yml")
    shutil.copytree(REPO / "inventory/lab/group_vars", inv / "group_vars")
    shutil.copytree(REPO / "inventory/lab/locks", inv / "locks")
    new = "6.1.0-50-amd64"
    nvidia_pin = yaml.safe_load((inv / "group_vars" / f"{GROUP}.yml").read_text())["rigbook_pins"]["kernel"]
    old = _kernel_pin(inv / "group_vars" / f"{GROUP}.yml",
                      {**nvidia_pin, "release": new, "packages": [f"linux-image-{new}", f"linux-headers-{new}"]})
    amd_pin = yaml.safe_load((inv / "group_vars" / f"{AMD_GROUP}.yml").read_text())["rigbook_pins"]["kernel"]
    amd_old = _kernel_pin(inv / "group_vars" / f"{AMD_GROUP}.yml",
                          {"release": new, "source": "distro", "cmdline": amd_pin["cmdline"],
                           "packages": [f"linux-image-{new}", f"linux-headers-{new}"]})
    last = LabHost(AMD_TWIN)
    last_boots, last_packages = last.boots(), last.out("dpkg-query -W -f='${Package}\\n' 'linux-image-*'")
    roll = provision("site.yml", "-i", inv, "--rolling", "2", "--json", timeout=2400)
    assert roll.returncode == 1, roll.stdout[-3000:] + roll.stderr[-3000:]
    data = json.loads(roll.stdout)
    assert data["rolling"]["batches"] == [{"batch": 1, "hosts": [FIRST], "exit_code": 0},
                                          {"batch": 2, "hosts": [TWIN, AMD], "exit_code": 1}], data["rolling"]
    assert data["rolling"]["stopped_at_batch"] == 2 and data["rolling"]["untouched"] == [AMD_TWIN]
    assert "rolling: stopped at batch 2/3 " in roll.stderr and f"{AMD} at 'Ladder 1-5: " in roll.stderr, roll.stderr
    # the canary and the 3080 twin: on the new kernel, every layer as before
    for run, name in ((0, FIRST), (1, TWIN)):
        host = data["runs"][run]["hosts"][name]
        assert host["failed"] == 0 and {v["status"] for v in host["ladder"]} <= {"pass", "warn"}, (name, host)
        assert LabHost(name).out("cat /var/lib/rigbook-lab/evidence/proc/sys/kernel/osrelease").strip() == new
    # the R9700: booted the stock kernel, and the ladder says what it lacks
    amd = data["runs"][1]["hosts"][AMD]
    failed = [v for v in amd["ladder"] if v["status"] == "fail"]
    assert [v["layer"] for v in failed] == ["kernel_state"] and "CONFIG_PCI_P2PDMA" in failed[0]["why"], amd["ladder"]
    assert LabHost(AMD).out("cat /var/lib/rigbook-lab/evidence/proc/sys/kernel/osrelease").strip() == new
    for name in (FIRST, TWIN, AMD):  # each box's engine stopped before its reboot, which came after the new kernel
        done = [task for task, _ in changed_tasks(data["runs"][0 if name == FIRST else 1]["run_dir"])[name]]
        assert done.index("Stop the serve units before the reboot") < done.index(
            "Reboot once into the new kernel, driver and boot target"), (name, done)
    # the box after the failing batch: never contacted by the roll
    assert last.boots() == last_boots
    assert last.out("cat /var/lib/rigbook-lab/evidence/proc/sys/kernel/osrelease").strip() == amd_old
    assert last.out("dpkg-query -W -f='${Package}\\n' 'linux-image-*'") == last_packages
    assert old == amd_old == "6.1.0-47-amd64"
