#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: rigbook developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

DOCUMENTATION = r"""
---
module: boot_state
short_description: What the host booted and what it would boot next
description:
  - Reads the running kernel release and command line under O(root) (V(/) on a real box; a lab host's recorded
    tree shows the kernel the lab "booted"), the kernels installed under C(/boot) and whether each has its
    headers (C(/lib/modules/<release>/build)), whether GRUB manages the boot (C(/boot/grub/grub.cfg) and
    C(update-grub) present) and whether C(update-initramfs) is there.
  - Compares them with O(release) and O(cmdline) when given and says what a reboot would change. Only these are
    reboot reasons; C(/run/reboot-required), which any package's postinst may touch (Ubuntu's
    update-notifier-common does on most library upgrades), is reported in RV(reboot_required_by) and never makes
    rigbook reboot a serving box.
  - With O(display), whether a display server holds the GPU (C(systemctl get-default) and
    C(systemctl show display-manager.service)), see RV(display_holds_gpu).
  - With O(secure_boot), whether Secure Boot is on and, when it is (or cannot be told), whether the certificate DKMS
    signs modules with is enrolled (module_utils/facts/secure_boot.py - the EFI variables under O(root), else
    C(mokutil --sb-state); C(mokutil --test-key)), see RV(secure_boot). The preflight role reads it before any
    package changes (docs/secure-boot.md).
  - Read-only; supports check mode.
version_added: "1.0.0"
author:
  - rigbook developers (!UNKNOWN)
options:
  root:
    description: Evidence root for the running kernel and command line.
    type: path
    default: /
  release:
    description: The pinned kernel release.
    type: str
  cmdline:
    description: Flags the kernel command line must carry.
    type: list
    elements: str
    default: []
  paths:
    description:
      - Files whose presence is reported in RV(exists), read before a role writes them (rigbook's GRUB drop-in, its
        driver state file), so that a first write on a box set up by hand asks for no reboot by itself.
    type: list
    elements: path
    default: []
  display:
    description: Also read the default boot target and the display manager's state (runs two systemctl reads).
    type: bool
    default: false
  secure_boot:
    description: Also read the Secure Boot state and the DKMS signing key's enrolment (see RV(secure_boot)).
    type: bool
    default: false
  os_id:
    description:
      - The host's OS (the host model's C(os.id)). On C(ubuntu) DKMS signs with update-secureboot-policy's key
        (/var/lib/shim-signed/mok/MOK.der), elsewhere with its own (/var/lib/dkms/mok.pub), unless
        /etc/dkms/framework.conf names another.
    type: str
    default: ""
extends_documentation_fragment:
  - rigbook.homelab.attributes.read_only
"""

EXAMPLES = r"""
- name: Read the boot state
  rigbook.homelab.boot_state:
    release: 6.1.0-47-amd64
    cmdline: [iommu=pt]
  register: boot

- name: Read whether Secure Boot is on and the DKMS signing key enrolled
  rigbook.homelab.boot_state:
    secure_boot: true
    os_id: ubuntu
  register: boot
"""

RETURN = r"""
exists:
  description: "{path: whether it exists} of O(paths)."
  returned: always
  type: dict
running:
  description: The running kernel release (null when not readable).
  returned: always
  type: str
cmdline:
  description: The running kernel command line, split.
  returned: always
  type: list
  elements: str
installed:
  description: Kernel releases with a /boot/vmlinuz-<release>, oldest first.
  returned: always
  type: list
  elements: str
with_headers:
  description: Installed kernel releases whose headers are present (what DKMS can build for).
  returned: always
  type: list
  elements: str
grub:
  description: Whether GRUB manages the boot here (update-grub and /boot/grub/grub.cfg present).
  returned: always
  type: bool
initramfs:
  description: Whether update-initramfs is there (initramfs-tools, Debian's and Ubuntu's default).
  returned: always
  type: bool
reboot_reasons:
  description: Why the booted state differs from the pins (empty when it matches).
  returned: always
  type: list
  elements: str
reboot_required_by:
  description:
    - The packages /run/reboot-required.pkgs names when /run/reboot-required is present (C([]) when it names none),
      null when it is absent. Information only, never a reboot reason.
  returned: always
  type: list
  elements: str
default_target:
  description: C(systemctl get-default) (with O(display); else null).
  returned: always
  type: str
display_manager:
  description: "display-manager.service: {id, load_state, active_state, sub_state} (with O(display); else null)."
  returned: always
  type: dict
display_holds_gpu:
  description: Why a display server holds the GPU now or from the next boot (module_utils/display_state.py), null
    when none does or without O(display).
  returned: always
  type: str
secure_boot:
  description:
    - "With O(secure_boot) (else null): C(state) C(on), C(off), C(not-efi) (no /sys/firmware/efi: Secure Boot cannot
      be on) or C(unknown); C(why) (which variable or mokutil line decided); C(dkms_key) (null unless the state is
      C(on) or C(unknown)): C({path, state, why}), state C(enrolled), C(pending) (in the enrolment request, confirmed
      at the console at the next boot), C(not-enrolled), C(blocked), C(missing) (no certificate yet) or C(unknown)."
  returned: always
  type: dict
  sample: {state: "on", why: "EFI variables: SecureBoot is 1, SetupMode 0",
           dkms_key: {path: /var/lib/dkms/mok.pub, state: not-enrolled,
                      why: "mokutil --test-key: /var/lib/dkms/mok.pub is not enrolled"}}
"""

import glob
import os
import re

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.rigbook.homelab.plugins.module_utils import display_state
from ansible_collections.rigbook.homelab.plugins.module_utils.facts import files, kernel, secure_boot

# Touched by packages' postinst scripts (Debian Policy's convention), read for information only.
REBOOT_REQUIRED = "/run/reboot-required"


def version_key(release):
    return [int(p) if p.isdigit() else p for p in re.split(r"[.\-+~_]", release)]


def packages_asking_for_reboot():
    """The packages named in /run/reboot-required.pkgs when /run/reboot-required is there, else None."""
    if not os.path.exists(REBOOT_REQUIRED):
        return None
    return sorted(set((files.read_text(REBOOT_REQUIRED + ".pkgs") or "").split()))


def display(module):
    """(default target, display-manager.service state, why a display server holds the GPU or None)."""
    default, manager, error = display_state.read()
    if error:
        module.fail_json(msg=error)
    return default, manager, display_state.holds_gpu(default, manager)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            root=dict(type="path", default="/"),
            release=dict(type="str"),
            cmdline=dict(type="list", elements="str", default=[]),
            paths=dict(type="list", elements="path", default=[]),
            display=dict(type="bool", default=False),
            secure_boot=dict(type="bool", default=False),
            os_id=dict(type="str", default=""),
        ),
        supports_check_mode=True,
    )
    root = module.params["root"]
    running = kernel.release(root)
    cmdline = kernel.cmdline(root) or []
    installed = sorted((p[len("/boot/vmlinuz-"):] for p in glob.glob("/boot/vmlinuz-*")), key=version_key)
    with_headers = [k for k in installed if os.path.isdir("/lib/modules/%s/build" % k)]
    grub = bool(module.get_bin_path("update-grub")) and os.path.isfile("/boot/grub/grub.cfg")
    reasons = []
    pin = module.params["release"]
    if pin and running != pin:
        reasons.append("running kernel %s, pinned %s" % (running, pin))
    missing = [f for f in module.params["cmdline"] if f not in cmdline]
    if missing and (not pin or running == pin):
        reasons.append("kernel command line lacks %s" % " ".join(missing))
    default, manager, holds = display(module) if module.params["display"] else (None, None, None)
    boot = secure_boot.read(root, module.params["os_id"]) if module.params["secure_boot"] else None
    module.exit_json(changed=False, running=running, cmdline=cmdline, installed=installed,
                     with_headers=with_headers, grub=grub, initramfs=bool(module.get_bin_path("update-initramfs")),
                     reboot_reasons=reasons, reboot_required_by=packages_asking_for_reboot(),
                     default_target=default, display_manager=manager, display_holds_gpu=holds, secure_boot=boot,
                     exists=dict((path, os.path.exists(path)) for path in module.params["paths"]))


if __name__ == "__main__":
    main()
