# -*- coding: utf-8 -*-
# Copyright: rigbook developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Whether a display server holds the GPUs: the one rule (standard library only).

The NVIDIA userspace installer (.run) must not run while a display server holds the GPU, and a display manager must
never be stopped on a live box to free it (seed 000: stopping gdm under the NVIDIA driver panicked the kernel and
rebooted the machine). The safe order is `systemctl set-default multi-user.target`, one reboot, then the installer.
The facts: `systemctl get-default` and `systemctl show display-manager.service` (the alias every display manager's
package links to its unit: gdm, sddm, lightdm), read through facts/systemd.py (`read`).
"""

from __future__ import annotations

from ansible_collections.rigbook.homelab.plugins.module_utils.facts import runner, systemd

GRAPHICAL = "graphical.target"
DISPLAY_MANAGER = "display-manager.service"
PROPERTIES = ("Id", "LoadState", "ActiveState", "SubState")
SHOW = systemd.show_argv([DISPLAY_MANAGER], PROPERTIES)
GET_DEFAULT = systemd.GET_DEFAULT
RUNNING = ("active", "activating", "reloading", "deactivating")


def read(run=None):
    """(default target, display-manager.service's {id, load_state, active_state, sub_state}, error) through RUN
    (facts/runner.run); error says which systemctl read failed (then the first two are None)."""
    run = run or runner.run
    default, error = systemd.default_target(run=run)
    if error:
        return None, None, "systemctl get-default failed: %s" % error
    result = run(SHOW, timeout=systemd.TIMEOUT_S)
    if result.rc != 0:
        return None, None, "systemctl show %s failed: %s" % (DISPLAY_MANAGER, result.error)
    blocks = systemd.parse_show(result.stdout)
    state = systemd.unit_state(blocks[0] if blocks else {})
    return default, dict((key, state[key]) for key in ("id", "load_state", "active_state", "sub_state")), None


def holds_gpu(default_target, manager):
    """Why a display server holds (or will hold at the next boot) the GPUs, or None. MANAGER is read's dict of
    display-manager.service with its Id. No display manager installed (LoadState not-found: a server, the lab's
    containers) holds nothing, whatever the default target says (Ubuntu Server and a bare Debian default to
    graphical.target without one)."""
    manager = manager or {}
    if manager.get("load_state") != "loaded":
        return None
    name = manager.get("id") or DISPLAY_MANAGER
    if manager.get("active_state") in RUNNING:
        return "display manager %s is %s (it holds the GPU; it is never stopped on a live box)" % (
            name, manager["active_state"])
    if (default_target or "").strip() == GRAPHICAL:
        return "the default target %s starts display manager %s at boot" % (GRAPHICAL, name)
    return None
