"""`provision adopt HOST -i INV`: a box that was set up by hand, written down as the pins and serve profiles that
reproduce it (issue 22, first part).

One module a job:
- command.py: the command: the host is read by playbooks/adopt.yml (module adopt_facts: read-only, changes
  nothing); what it stored is mapped, written (host_vars/HOST.yml of the inventory, group_vars/GROUP/adopted.yml with
  --group, or -o FILE, with the lock and patch beside them: all or none) and checked as `provision validate` does.
- mapping.py: what was read -> rigbook_* variables (`variables_of`, `adopt_of`), each value with where it was read.
  The pins' inverse is plugins/module_utils/host_pins.PINS, the one table of pins (beside the forward that
  host_model.build uses); here the serve profiles and the files beside the pins. What could not be pinned is listed
  with the reason, never guessed.
- emit.py: the YAML (`render`): every value with a comment saying where it was read, then what was not pinned; it
  reads back, as rigbook's inventory reader reads it, as exactly the adopted values. Every string is tagged
  `!unsafe`: Ansible reads it as data, never as a template.

What a box says is data, its local users' too (a process's command line and environment, a venv's files): the
box-side reader (plugins/module_utils/collect/adopt.py, called by the module plugins/modules/adopt_facts.py) reads
only the engines of root and the serve user (another user's engine is skipped and named) and no venv owned by
another user or reached through a link, deciding both before anything of the venv is opened; every venv file is
read through facts/files' no-follow reader (no link followed on the way, a regular file of bounded size). The
module types and bounds every value (`typed`: control characters replaced by U+FFFD, strings cut to 4096
characters, credentials removed from URLs, environment names shell names, key values hidden), and mapping applies
`typed` again to what the run stored. What was skipped, refused, removed or cut is said as a note or as not pinned.

Read so far: the kernel (release, source: distro or debs with each .deb's sha256, of the command line's own
parameters only those the P2P stack reads: facts/kernel.p2p_words, the rest named as left alone), each running
SGLang engine however it was started (`python -m sglang.launch_server`, `sglang serve`, `python -m sglang.cli.main
serve`, a wrapper that execs one: serve/profile.engine_args) with its command line as a serve profile (flags the
schema does not know in extra_args, named; an API key or admin API key on the command line never copied) and its
GPU environment, the SGLang version of its venv, the NVIDIA driver as the kernel has it loaded (its version pinned
whatever put its file there: DKMS, make modules_install, a package, none on disk; the DKMS source's repository and
commit when DKMS built the loaded module; the userspace version from the library the loader finds), the CUDA
toolchain wheels (the role's default venv, else the engine's), the engine's venv as a requirements lock written
beside the pins (hashes of the wheels found in --wheels-dir) and sglang's local changes as a patch, ROCm (release,
packages, apt repository and keyring sha256, AMD's graphics repository, amdgpu-dkms, HSA_* environment; the
existing apt sources named), and the mapped RCCL from rigbook's build stamp. A box its host boots (no
/lib/modules/<release>, no EFI, no GRUB) gets `rigbook_manage: {kernel: false, nvidia_driver: false}` instead of a
kernel pin. What cannot be pinned is listed with the reason, an NVIDIA box's driver and CUDA toolchain included.
The closing check reads the inventory with what was written (`-o FILE` as the host's host_vars).
"""

from __future__ import annotations

from rigbook.adopt.command import (
    FACTS_DIR,
    PLAYBOOK,
    _group_of,
    adopt_command,
    group_file_to_folder,
    output_path,
    write_together,
)
from rigbook.adopt.emit import render
from rigbook.adopt.mapping import adopt_of, lock_of, variables_of

__all__ = ["FACTS_DIR", "PLAYBOOK", "_group_of", "adopt_command", "adopt_of", "group_file_to_folder", "lock_of",
           "output_path", "render", "variables_of", "write_together"]
