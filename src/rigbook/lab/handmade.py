"""`provision lab handmade HOST`: set a lab host up the way the seeds' owners set their boxes up by hand, outside
rigbook's roles, so that `provision adopt` meets what it will meet on a real box (issue 22).

On an NVIDIA lab rig (seed 000's steps, with the lab's stand-ins for what cannot run here):
1. the kernel from .debs the owner downloaded into /root/kernel-debs: `dpkg -i`, then `apt-get -f install` for
   what they depend on; GRUB_DEFAULT and the command line's own parameters edited into /etc/default/grub;
2. the P2P driver fork cloned into /usr/src/nvidia-VERSION (the lab's stand-in source, made a git work tree whose
   origin is the fork the seed names, at its branch) and built with `dkms add/build/install` by hand; the userspace
   from the stand-in installer with --no-kernel-modules; uvm_disable_hmm in a modprobe.d file of the owner's;
3. one venv, /opt/sglang, made with `python3 -m venv` and filled with pip: the CUDA wheels and SGLang (offline,
   from the lab's wheel folders);
4. the headless boot target (`systemctl set-default multi-user.target`), a reboot into the new kernel, then the
   engine started from a shell script with nohup (the lab's engine stand-in, which takes SGLang's flags), with the
   seed's flags and GPU environment: no systemd unit.

Nothing of rigbook's is written: no /etc/rigbook, no unit, no stamp. The lab's stand-ins are the only departure
from the seed's steps, as everywhere in the lab (docs/lab.md).
"""

from __future__ import annotations

import shlex
import time

import yaml

from rigbook import paths
from rigbook.errors import UserError
from rigbook.lab import hardware_trees, machine, state
from rigbook.lab.system import LabFailure, progress
from rigbook.paths import facts

ARTIFACTS = "/var/cache/rigbook/artifacts"
KERNEL = "6.1.0-47-amd64"
DRIVER = "615.71.09"
SEED_PINS = "inventory/homelab/group_vars/x99_3080.yml"  # the fork and branch seed 000 names: one place
CUDA = "13.0.88"
SGLANG = "0.5.23"
VENV = "/opt/sglang"
ENGINE_SCRIPT = "/root/serve.sh"
ENGINE_PORT = 30000
# The seed's engine: two ranks, no custom all-reduce (no P2P on this box), the lab stand-in's recorded behaviour.
ENGINE_FLAGS = ["--model-path", "/srv/models/standin-model", "--served-model-name", "standin", "--tp-size", "2",
                "--mem-fraction-static", "0.88", "--context-length", "32768", "--max-total-tokens", "30000",
                "--disable-custom-all-reduce"]
ENGINE_ENV = {"CUDA_VISIBLE_DEVICES": "0,1", "NCCL_P2P_DISABLE": "1",
              "RIGBOOK_EVIDENCE_ROOT": "/var/lib/rigbook-lab/evidence"}


def engine_script(bind: str, port: int = ENGINE_PORT, flags=ENGINE_FLAGS, env=None) -> str:
    """The owner's start script: exports, then the engine in the foreground (nohup runs the script)."""
    lines = ["#!/bin/sh", "# started by hand: nohup /root/serve.sh > /root/serve.log 2>&1 &"]
    lines += [f"export {name}={shlex.quote(value)}" for name, value in sorted((env or ENGINE_ENV).items())]
    argv = [f"{VENV}/bin/python", f"{ARTIFACTS}/sglang-standin.py", *flags, "--host", bind, "--port", str(port)]
    lines.append("exec " + " ".join(shlex.quote(a) for a in argv))
    return "\n".join(lines) + "\n"


def seed_fork() -> tuple:
    """(repository, branch) of the driver fork seed 000 built, as inventory/homelab pins it: the git work tree made
    here names it as its origin (nothing is fetched from it)."""
    pin = yaml.safe_load((paths.collection_root() / SEED_PINS).read_text())["rigbook_pins"]["nvidia_driver"]
    return pin["fork_repo"], pin["branch"]


def nvidia_script(bind: str) -> str:
    """The shell script, run as root on the host, that sets an NVIDIA lab host up by hand."""
    start = engine_script(bind)
    fork, branch = seed_fork()
    return f"""set -eu
export DEBIAN_FRONTEND=noninteractive LC_ALL=C
A={ARTIFACTS}
if [ -e {ENGINE_SCRIPT} ]; then
  echo "already set up by hand ({ENGINE_SCRIPT} exists): a fresh host is needed" >&2
  exit 3
fi
# 1. the kernel from downloaded .debs
mkdir -p /root/kernel-debs
cp $A/kernel/linux-image-{KERNEL}_*.deb $A/kernel/linux-headers-*.deb /root/kernel-debs/
apt-get update -q >/dev/null
apt-get install -y -q --no-install-recommends dkms git build-essential python3-venv >/dev/null
dpkg -i /root/kernel-debs/*.deb >/dev/null 2>&1 || apt-get -f install -y -q >/dev/null
dpkg-query -W -f '${{db:Status-Abbrev}}' linux-image-{KERNEL} | grep -q '^ii'
cat > /etc/default/grub <<'EOF'
GRUB_DEFAULT="Advanced options for Debian GNU/Linux>Debian GNU/Linux, with Linux {KERNEL}"
GRUB_TIMEOUT=5
GRUB_CMDLINE_LINUX_DEFAULT="quiet intel_iommu=on iommu=pt"
GRUB_CMDLINE_LINUX=""
EOF
# 2. the P2P driver fork, cloned and built with dkms by hand
rm -rf /usr/src/nvidia-{DRIVER}
mkdir -p /usr/src/nvidia-{DRIVER}
tar -xzf $A/nvidia-fork-standin-{DRIVER}.tar.gz -C /usr/src/nvidia-{DRIVER} --strip-components=1
cd /usr/src/nvidia-{DRIVER}
git init -q -b {branch} .
git remote add origin {fork}
git -c user.name=owner -c user.email=owner@localhost add -A
git -c user.name=owner -c user.email=owner@localhost commit -q -m "the fork at {branch}"
cd /
dkms add -m nvidia -v {DRIVER} >/dev/null
dkms build -m nvidia -v {DRIVER} -k {KERNEL} >/dev/null
dkms install -m nvidia -v {DRIVER} -k {KERNEL} >/dev/null
sh $A/nvidia-installer-standin-{DRIVER}.run --silent --no-kernel-modules >/dev/null
echo 'options nvidia_uvm uvm_disable_hmm=1' > /etc/modprobe.d/nvidia-uvm-hmm.conf
# 3. one venv, filled with pip
python3 -m venv {VENV}
{VENV}/bin/pip install -q --no-index --find-links $A/wheels/cuda-{CUDA} nvidia-cuda-nvcc=={CUDA} \\
  nvidia-cuda-crt=={CUDA} nvidia-nvvm=={CUDA} nvidia-cuda-runtime=={CUDA}
{VENV}/bin/pip install -q --no-index --no-deps --find-links $A/wheels/sglang-{SGLANG} sglang=={SGLANG}
# 4. the engine's start script (started after the reboot into the new kernel)
cat > {ENGINE_SCRIPT} <<'EOF'
{start}EOF
chmod 755 {ENGINE_SCRIPT}
# 5. headless: no display server on the GPUs
systemctl set-default multi-user.target >/dev/null 2>&1
"""


def start_script(bind: str) -> str:
    """Start the engine from its script with nohup, detached from the SSH session, and wait until it listens."""
    return f"""set -eu
setsid nohup {ENGINE_SCRIPT} > /root/serve.log 2>&1 < /dev/null &
for i in $(seq 1 60); do
  python3 -c "import socket; socket.create_connection(('{bind}', {ENGINE_PORT}), 2)" 2>/dev/null && exit 0
  sleep 1
done
echo "the engine did not listen on {bind}:{ENGINE_PORT} within 60 s:" >&2
tail -n 20 /root/serve.log >&2
exit 1
"""


def _as_root(host, script: str, what: str) -> None:
    machine.run_as_root(host, script, what, timeout=900)


def _reboot(host, timeout: float = 180.0) -> None:
    """`systemctl reboot` as the owner would, then wait for the next boot and its sshd."""
    boots = host.dir / "boots"
    count = boots.read_text().strip() if boots.exists() else ""
    # its exit status is not looked at: the connection may drop as the host goes down
    asked = facts("runner").run(machine.ssh_command(host, "sudo -n systemctl reboot"), timeout=60)
    if asked.rc is None:
        raise LabFailure(f"{host.name}: asking it to reboot: {asked.error}")
    deadline = time.monotonic() + timeout
    while (boots.read_text().strip() if boots.exists() else "") == count:
        if time.monotonic() > deadline:
            raise LabFailure(f"{host.name} did not reboot within {timeout:.0f} s")
        time.sleep(0.5)
    machine.wait_ready([host], timeout=timeout)


def handmade(name: str) -> int:
    """Set lab host NAME up by hand (nvidia rigs). The host must be up and reachable as rigbook (not bare)."""
    lab = state.load()
    if lab is None:
        raise UserError("the lab is not up: run `provision lab up` first")
    host = lab.host(name)
    if host.bare:
        raise UserError(f"{host.name} is bare: `provision bootstrap` it first (the lab reaches hosts as rigbook)")
    rig = hardware_trees.load_rig(host.rig)
    if rig.get("vendor") != "nvidia":
        raise UserError(f"lab handmade: only NVIDIA rigs are set up by hand so far; {host.name} is rig {host.rig} "
                        f"({rig.get('vendor')})")
    progress(f"{host.name}: setting it up by hand (kernel .debs, dkms, a pip venv)")
    _as_root(host, nvidia_script(host.address), "setting it up by hand")
    progress(f"{host.name}: rebooting into {KERNEL}")
    _reboot(host)
    _as_root(host, start_script(host.address), "starting the engine with nohup")
    progress(f"{host.name}: set up by hand; the engine listens on {host.address}:{ENGINE_PORT} (no unit)")
    return 0
