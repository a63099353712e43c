"""`provision lab handmade HOST [--as-seed 000|004]`: set a lab host up the way the seeds' owners set their boxes
up by hand, outside rigbook's roles, so that `provision adopt` and the first converge meet what they will meet on a
real box (issue 35). Every choice the write-ups leave open is written down in docs/lab.md ("Hand-made boxes").

Seed 000 (an NVIDIA rig; the write-up's section 二 and 三), with the lab's stand-ins for what cannot run here:
1. the kernel from .debs the owner downloaded into /root/kernel-debs: `dpkg -i`, then `apt-get -f install` for
   what they depend on; GRUB_DEFAULT and the command line's own parameters (intel_iommu=on iommu=pt) edited into
   /etc/default/grub;
2. the P2P driver fork the fork's way: cloned into the owner's home (a git work tree whose origin is the fork the
   seed names, at its branch), built with `make modules` as the owner and installed with `make modules_install` as
   root (into kernel/drivers/video, as the fork's own Makefile installs it), any old DKMS nvidia module cleared,
   then `depmod` ("清走舊 dkms module 後 depmod"); the userspace from the stand-in installer with
   --no-kernel-modules; HMM left at the driver's default (no modprobe.d file);
3. one venv, /opt/sglang, made with `python3 -m venv` and filled with pip: the CUDA wheels and SGLang (offline,
   from the lab's wheel folders), plus the owner's `ln -s lib lib64` in the CUDA wheels' folder;
4. the desktop kept: a display-manager stand-in (gdm.service, alias display-manager.service) enabled, and
   graphical.target the default (the seed runs mem-fraction 0.88 because the desktop holds ~80 MB of GPU0);
5. a reboot into the new kernel, then the engine started from a shell under the owner's user with nohup, as
   `sglang serve ...` with the seed's flags: no systemd unit. The lab's `sglang` command is a console script of
   the engine stand-in (/usr/local/bin/sglang, run by the venv's python: the process's command line is the one
   `sglang serve` gives on the seed's box); the venv's own bin/sglang needs torch, which the lab does not install.
The host's recorded tree is edited to what that box shows: nvidia_uvm's uvm_disable_hmm at the driver's default (N)
and its CPU (/proc/cpuinfo: an E5-2666 v3, 46-bit physical addresses). The fork's modules are the host's real ones
(kernel/drivers/video), which the tree shows once the host booted the installed kernel (the lab's boot hook).

Seed 004 (an AMD rig; the write-up's 第一部分): the custom kernel from .debs (the lab's stand-in kernel), ROCm from
amdgpu-install's own apt sources (/etc/apt/sources.list.d/rocm.list and amdgpu.list, keyring
/etc/apt/keyrings/rocm.gpg, pointing at the lab's stand-in repositories), the patched RCCL built by hand in the
owner's home (the collection's P2P-level patch applied with `patch -p1`, built with cmake), the SGLang venv, and the
engine started with the write-up's environment (HSA_ENABLE_IPC_MODE_LEGACY=0, NCCL_P2P_LEVEL=PHB, the patched RCCL
preloaded) from the owner's shell.

Nothing of rigbook's is written: no /etc/rigbook, no unit, no stamp. The lab's stand-ins are the only departure
from the seeds' steps, as everywhere in the lab (docs/lab.md).
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
OWNER = "owner"  # the box's own user, who runs the engine (the write-ups never run it as root)
HOME = f"/home/{OWNER}"
ENGINE_SCRIPT = f"{HOME}/serve.sh"
ENGINE_LOG = f"{HOME}/serve.log"
ENGINE_PORT = 30000
CONSOLE = "/usr/local/bin/sglang"  # the lab's `sglang` command: a console script of the engine stand-in
FORK_DIR = f"{HOME}/open-gpu-kernel-modules"
FORK_INSTALL_DIR = "kernel/drivers/video"  # where the fork's own `make modules_install` puts its modules
SCALES = "scales/qwen38-fp8-kv-scales-per-head.json"  # relative to the owner's shell's folder, as the seed runs it
MODEL = "/srv/models/standin-model"  # the lab's stand-in model (every lab host has it); the seed: ~/models/...
# Seed 000's command line (section 四), its models the lab's stand-in model (the draft too: the stand-in loads none),
# and its host KV cache scaled to a lab host's memory: --hicache-size 15 (GB a rank, on the seed's 62 GB box) would
# not fit the lab machine's 24 GiB, and serve_units refuses it there as it would on such a box (LAB_HICACHE_GB).
LAB_HICACHE_GB = "4"
SEED_000_FLAGS = [
    "--model-path", MODEL, "--tp-size", "2",
    "--quantization", "compressed-tensors", "--kv-cache-dtype", "fp8_e4m3",
    "--quantization-param-path", SCALES,
    "--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", MODEL,
    "--speculative-draft-kv-cache-dtype", "fp8_e4m3", "--speculative-num-draft-tokens", "8",
    "--context-length", "200000", "--max-total-tokens", "185000",
    "--max-running-requests", "4", "--cuda-graph-max-bs-decode", "4",
    "--mem-fraction-static", "0.88", "--mamba-ssm-dtype", "bfloat16",
    "--mamba-radix-cache-strategy", "extra_buffer_lazy", "--disable-custom-all-reduce",
    "--enable-hierarchical-cache", "--hicache-ratio", "2", "--hicache-size", LAB_HICACHE_GB,
    "--hicache-io-backend", "direct", "--hicache-mem-layout", "page_first_direct",
    "--hicache-write-policy", "write_through", "--page-size", "64",
    "--default-chat-template-kwargs", '{"reasoning_effort": "medium"}',
]
# The lab's stand-in reads its recorded behaviour from the host's evidence tree: the one variable that is the lab's.
LAB_ENV = {"RIGBOOK_EVIDENCE_ROOT": "/var/lib/rigbook-lab/evidence"}
# Seed 004 names no command line: its settings (第一部分 1. and 15.) as SGLang flags. TP=2; MTP steps=3 top_k=1
# draft_tokens=4; num_kv_splits=8; BF16 KV (the default for a BF16 model: no flag); the context of its near-256K
# runs. The flag names are SGLang's; which ones the owner typed is not in the write-up (docs/lab.md).
SEED_004_FLAGS = [
    "--model-path", MODEL, "--tp-size", "2", "--speculative-algorithm", "NEXTN", "--speculative-num-steps", "3",
    "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4", "--triton-attention-num-kv-splits", "8",
    "--context-length", "262144",
]
RCCL_DIR = f"{HOME}/rccl"
RCCL_LIBRARY = f"{RCCL_DIR}/build/librccl.so.1"
RCCL_PATCH = "/tmp/p2p-level-user-last.patch"  # the collection's P2P-level patch, copied where the owner reads it
# Seed 004's environment (第一部分 1.: HSA_ENABLE_IPC_MODE_LEGACY=0, NCCL_P2P_LEVEL=PHB) and its patched RCCL in
# front of the one the engine bundles.
SEED_004_ENV = {"HSA_ENABLE_IPC_MODE_LEGACY": "0", "NCCL_P2P_LEVEL": "PHB", "LD_PRELOAD": RCCL_LIBRARY}
ROCM_REPO = f"file://{ARTIFACTS}/rocm-repo"
AMDGPU_REPO = f"file://{ARTIFACTS}/rocm-repo/amdgpu"
SEEDS = {"000": "nvidia", "004": "amd"}
END = "RIGBOOK_LAB_END"  # the here-documents' terminator in the scripts below


def engine_script(bind: str, flags, env: dict, port: int = ENGINE_PORT) -> str:
    """The owner's start script: exports, then `sglang serve` in the foreground (nohup runs the script)."""
    lines = ["#!/bin/sh", f"# started by hand: cd ~ && nohup ./serve.sh > {ENGINE_LOG} 2>&1 &"]
    lines += [f"export {name}={shlex.quote(value)}" for name, value in sorted({**env, **LAB_ENV}.items())]
    argv = ["sglang", "serve", *flags, "--host", bind, "--port", str(port)]
    lines.append("exec " + " ".join(shlex.quote(a) for a in argv))
    return "\n".join(lines) + "\n"


def console_script() -> str:
    """The lab's `sglang` command: `sglang serve ARGS` runs the engine stand-in with ARGS, in the same process (its
    command line stays the one `sglang serve` gives), with the venv's python as its interpreter."""
    return f"""#!{VENV}/bin/python3
# TEST STAND-IN (rigbook lab) of SGLang's console command `sglang` (sglang.cli.main:main): `sglang serve ARGS` runs
# the lab's engine stand-in with ARGS. The venv's own bin/sglang needs torch, which the lab does not install.
import runpy
import sys

if sys.argv[1:2] != ["serve"]:
    sys.exit("sglang (lab stand-in): only `sglang serve ...` is provided")
sys.argv = ["{ARTIFACTS}/sglang-standin.py", *sys.argv[2:]]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def seed_fork() -> tuple:
    """(repository, branch) of the driver fork seed 000 built, as inventory/homelab pins it: the git work tree made
    here names it as its origin (nothing is fetched from it)."""
    pin = yaml.safe_load((paths.collection_root() / SEED_PINS).read_text())["rigbook_pins"]["nvidia_driver"]
    return pin["fork_repo"], pin["branch"]


def _head(packages: str, cmdline: str) -> str:
    """Both seeds: refuse a host already set up; the owner's user; the build tools; the kernel from downloaded .debs
    (dpkg -i, then apt-get -f install for what they depend on) with GRUB's default entry and command line."""
    return f"""set -eu
export DEBIAN_FRONTEND=noninteractive LC_ALL=C
A={ARTIFACTS}
if [ -e {ENGINE_SCRIPT} ]; then
  echo "already set up by hand ({ENGINE_SCRIPT} exists): a fresh host is needed" >&2
  exit 3
fi
id -u {OWNER} >/dev/null 2>&1 || useradd -m -s /bin/bash {OWNER}
as_owner() {{ su -s /bin/sh {OWNER} -c "$1"; }}
mkdir -p /root/kernel-debs
cp $A/kernel/linux-image-{KERNEL}_*.deb $A/kernel/linux-headers-*.deb /root/kernel-debs/
apt-get update -q >/dev/null
apt-get install -y -q --no-install-recommends {packages} >/dev/null
dpkg -i /root/kernel-debs/*.deb >/dev/null 2>&1 || apt-get -f install -y -q >/dev/null
dpkg-query -W -f '${{db:Status-Abbrev}}' linux-image-{KERNEL} | grep -q '^ii'
cat > /etc/default/grub <<'{END}'
GRUB_DEFAULT="Advanced options for Debian GNU/Linux>Debian GNU/Linux, with Linux {KERNEL}"
GRUB_TIMEOUT=5
GRUB_CMDLINE_LINUX_DEFAULT="quiet {cmdline}"
GRUB_CMDLINE_LINUX=""
{END}
"""


def _venv_and_engine(bind: str, flags, env: dict, cuda: bool) -> str:
    """Both seeds: one venv filled with pip, the lab's `sglang` command, the owner's start script."""
    wheels = (f"""{VENV}/bin/pip install -q --no-index --find-links $A/wheels/cuda-{CUDA} nvidia-cuda-nvcc=={CUDA} \\
  nvidia-cuda-crt=={CUDA} nvidia-nvvm=={CUDA} nvidia-cuda-runtime=={CUDA}
# the owner's fix for the JIT link (seed 000: ln -s lib lib64)
cu13=$(ls -d {VENV}/lib/python3*/site-packages/nvidia/cu13)
[ -e "$cu13/lib64" ] || ln -s lib "$cu13/lib64"
""" if cuda else "")
    return f"""python3 -m venv {VENV}
{wheels}{VENV}/bin/pip install -q --no-index --no-deps --find-links $A/wheels/sglang-{SGLANG} sglang=={SGLANG}
cat > {CONSOLE} <<'{END}'
{console_script()}{END}
chmod 755 {CONSOLE}
cat > {ENGINE_SCRIPT} <<'{END}'
{engine_script(bind, flags, env)}{END}
chown {OWNER}: {ENGINE_SCRIPT}
chmod 755 {ENGINE_SCRIPT}
"""


def nvidia_script(bind: str) -> str:
    """The shell script, run as root on the host, that sets an NVIDIA lab host up by hand as seed 000 did."""
    fork, branch = seed_fork()
    git = "git -c user.name=owner -c user.email=owner@localhost"
    scales = '{"TEST STAND-IN": "FP8 KV scales (rigbook lab)"}'
    return _head("git build-essential python3-venv", "intel_iommu=on iommu=pt") + f"""\
# the P2P driver fork, the fork's way: cloned, `make modules` as the owner, `make modules_install` as root, any old
# DKMS module cleared, depmod (the stand-in's Makefile is kbuild's own: the fork's top-level Makefile runs these)
rm -rf {FORK_DIR}
as_owner "mkdir -p {FORK_DIR} && tar -xzf $A/nvidia-fork-standin-{DRIVER}.tar.gz -C {FORK_DIR} --strip-components=1"
as_owner "cd {FORK_DIR} && git init -q -b {branch} . && git remote add origin {fork} && {git} add -A \\
  && {git} commit -q -m 'the fork at {branch}'"
as_owner "make -s -C /lib/modules/{KERNEL}/build M={FORK_DIR} modules >/dev/null"
make -s -C /lib/modules/{KERNEL}/build M={FORK_DIR} INSTALL_MOD_DIR={FORK_INSTALL_DIR} modules_install \\
  >/dev/null 2>&1
test -f /lib/modules/{KERNEL}/{FORK_INSTALL_DIR}/nvidia.ko
if command -v dkms >/dev/null 2>&1; then
  for old in $(dkms status nvidia 2>/dev/null | sed -n 's|^nvidia/\\([^,: ]*\\).*|\\1|p' | sort -u); do
    dkms remove -m nvidia -v "$old" --all >/dev/null
  done
fi
depmod {KERNEL}
sh $A/nvidia-installer-standin-{DRIVER}.run --silent --no-kernel-modules >/dev/null
# HMM left at the driver's default: no modprobe.d file
{_venv_and_engine(bind, SEED_000_FLAGS, {}, cuda=True)}\
# the FP8 KV scales file the command line names, in the owner's folder (a stand-in: the lab loads none)
as_owner "mkdir -p {HOME}/scales"
echo {shlex.quote(scales)} > {HOME}/{SCALES}
chown {OWNER}: {HOME}/{SCALES}
# the desktop kept: a display-manager stand-in, graphical.target the default
cat > /etc/systemd/system/gdm.service <<'{END}'
[Unit]
Description=TEST STAND-IN of GNOME Display Manager (rigbook lab): holds no display
[Service]
ExecStart=/bin/sleep infinity
[Install]
Alias=display-manager.service
WantedBy=graphical.target
{END}
systemctl daemon-reload
systemctl enable gdm.service >/dev/null 2>&1
systemctl set-default graphical.target >/dev/null 2>&1
"""


def amd_script(bind: str) -> str:
    """The shell script, run as root on the host, that sets an AMD lab host up by hand as seed 004 did."""
    return _head("cmake make patch g++ gnupg python3-venv", "iommu=pt") + f"""\
# ROCm the way amdgpu-install sets it up: its keyring, rocm.list and amdgpu.list (the lab's stand-in repositories)
mkdir -p --mode=0755 /etc/apt/keyrings
gpg --dearmor < $A/rocm-repo/rocm.gpg.key > /etc/apt/keyrings/rocm.gpg
echo "deb [arch=amd64 signed-by=/etc/apt/keyrings/rocm.gpg] {ROCM_REPO} noble main" \\
  > /etc/apt/sources.list.d/rocm.list
echo "deb [arch=amd64 signed-by=/etc/apt/keyrings/rocm.gpg] {AMDGPU_REPO} noble main" \\
  > /etc/apt/sources.list.d/amdgpu.list
printf 'Package: *\\nPin: release o=rigbook-lab-rocm-standin\\nPin-Priority: 600\\n' \\
  > /etc/apt/preferences.d/rocm-pin-600
apt-get update -q >/dev/null
apt-get install -y -q rocm-core=7.1.0.70100-38~24.04 rocminfo=1.0.0.70100-38~24.04 \\
  rocm-smi-lib=7.8.0.70100-38~24.04 hip-runtime-amd=7.1.25424.70100-38~24.04 >/dev/null
# the patched RCCL, built by hand in the owner's home (the collection's P2P-level patch, cmake)
rm -rf {RCCL_DIR}
as_owner "mkdir -p {RCCL_DIR} && tar -xzf $A/rccl-standin-2.27.7.tar.gz -C {RCCL_DIR} --strip-components=1"
as_owner "cd {RCCL_DIR} && patch -s -p1 < {RCCL_PATCH}"
as_owner "cmake -S {RCCL_DIR} -B {RCCL_DIR}/build -DCMAKE_CXX_COMPILER=/usr/bin/g++ -DGPU_TARGETS=gfx1201 \\
  -DCMAKE_BUILD_TYPE=Release >/dev/null && cmake --build {RCCL_DIR}/build -j 2 >/dev/null"
test -f {RCCL_LIBRARY}
{_venv_and_engine(bind, SEED_004_FLAGS, SEED_004_ENV, cuda=False)}\
systemctl set-default multi-user.target >/dev/null 2>&1
"""


def start_script(bind: str) -> str:
    """Start the engine from the owner's shell with nohup, detached from the SSH session, and wait until it
    listens."""
    return f"""set -eu
su -s /bin/sh {OWNER} -c 'cd {HOME} && setsid nohup ./serve.sh > {ENGINE_LOG} 2>&1 < /dev/null &'
for i in $(seq 1 60); do
  python3 -c "import socket; socket.create_connection(('{bind}', {ENGINE_PORT}), 2)" 2>/dev/null && exit 0
  sleep 1
done
echo "the engine did not listen on {bind}:{ENGINE_PORT} within 60 s:" >&2
tail -n 20 {ENGINE_LOG} >&2
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


# Seed 000's CPU as /proc/cpuinfo shows it (RECONSTRUCTED: an E5-2666 v3 is Haswell-EP, family 6 model 63, 46-bit
# physical addresses): what the HMM rule reads (judges/static_layers.hmm_confines_host_memory).
SEED_000_CPUINFO = ("processor\t: 0\nvendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 63\n"
                    "model name\t: Intel(R) Xeon(R) CPU E5-2666 v3 @ 2.90GHz\n"
                    "address sizes\t: 46 bits physical, 48 bits virtual\n\n")


def seed_000_tree(tree) -> None:
    """Edit a host's recorded tree (TREE, on this machine) to what seed 000's box shows: nvidia_uvm's HMM at the
    driver's default and its CPU. (Where the fork's modules sit needs no edit: after the reboot into the installed
    kernel the lab's boot hook links the tree's lib/modules/<release> to the host's real one, where `make
    modules_install` put them.)"""
    hmm = tree / "sys/module/nvidia_uvm/parameters/uvm_disable_hmm"
    if hmm.exists():
        hmm.write_text("N\n")
    (tree / "proc").mkdir(parents=True, exist_ok=True)
    (tree / "proc/cpuinfo").write_text(SEED_000_CPUINFO)


def handmade(name: str, seed: str | None = None) -> int:
    """Set lab host NAME up by hand as seed SEED's owner did (000: NVIDIA rigs, 004: AMD rigs; default: the one of
    the host's rig). The host must be up and reachable as rigbook (not bare)."""
    lab = state.load()
    if lab is None:
        raise UserError("the lab is not up: run `provision lab up` first")
    host = lab.host(name)
    if host.bare:
        raise UserError(f"{host.name} is bare: `provision bootstrap` it first (the lab reaches hosts as rigbook)")
    vendor = hardware_trees.load_rig(host.rig).get("vendor")
    if seed is None:
        seed = next((s for s, v in SEEDS.items() if v == vendor), None)
    if seed not in SEEDS or SEEDS[seed] != vendor:
        raise UserError(f"lab handmade: {host.name} is rig {host.rig} ({vendor}); "
                        + "; ".join(f"--as-seed {s} needs an {v} rig" for s, v in SEEDS.items()))
    if seed == "000":
        progress(f"{host.name}: setting it up by hand as seed 000 did (kernel .debs, the fork's make "
                 "modules_install, a pip venv, a desktop)")
        _as_root(host, nvidia_script(host.address), "setting it up by hand")
        seed_000_tree(host.evidence)
    else:
        progress(f"{host.name}: setting it up by hand as seed 004 did (kernel .debs, amdgpu-install's apt sources, "
                 "RCCL patched and built in the owner's home, a pip venv)")
        patch = (paths.collection_root() / "roles/rccl/files/patches/p2p-level-user-last.patch").read_text()
        _as_root(host, f"cat > {RCCL_PATCH} <<'{END}'\n{patch}{END}\nchmod 644 {RCCL_PATCH}\n",
                 "copying the RCCL patch")
        _as_root(host, amd_script(host.address), "setting it up by hand")
    progress(f"{host.name}: rebooting into {KERNEL}")
    _reboot(host)
    _as_root(host, start_script(host.address), "starting the engine from the owner's shell with nohup")
    progress(f"{host.name}: set up by hand as seed {seed}; the engine listens on {host.address}:{ENGINE_PORT} "
             "(no unit)")
    return 0
