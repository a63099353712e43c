#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: rigbook developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

DOCUMENTATION = r"""
---
module: health_timer
short_description: The rigbook-health timer, its service and its config, in one run
description:
  - Writes the health run's config (JSON, from the host model), C(rigbook-health.service) (a oneshot running
    C(PYTHON BUNDLE --config CONFIG)) and C(rigbook-health.timer) (every O(interval_s), and O(interval_s) after
    boot), each only when its content differs (atomically); reloads systemd when a unit changed and enables and
    starts the timer (restarting it when its interval changed). A converged host is one read of each file and
    two C(systemctl is-*) calls.
  - O(state=absent) stops and disables the timer and removes the three files.
  - Where systemd is not the init system (a container, a chroot), the files are written and the timer is neither
    enabled nor started; the module says so in a warning.
  - Supports check mode and diff mode.
version_added: "1.0.0"
author:
  - rigbook developers (!UNKNOWN)
options:
  bundle:
    description: The health program on the host (rigbook-health.pyz).
    type: path
    default: /usr/local/lib/rigbook-health.pyz
  host:
    description: The host model (rigbook_host); the health run's config is made from it (module_utils/ladder/health.py
      config_of) and written as JSON to O(config_path).
    type: dict
    required: true
  name:
    description: The host's inventory name (the run's journal lines and metrics file name it).
    type: str
    required: true
  config_path:
    description: Where the config is written.
    type: path
    default: /etc/rigbook/health.json
  interval_s:
    description: Seconds between two runs.
    type: int
    default: 300
  python:
    description: The Python that runs the program.
    type: path
    default: /usr/bin/python3
  unit_dir:
    description: Where the unit files go.
    type: path
    default: /etc/systemd/system
  state:
    description: present or absent.
    type: str
    choices: [present, absent]
    default: present
extends_documentation_fragment:
  - rigbook.homelab.attributes.changes
"""

EXAMPLES = r"""
- name: Run the health checks every 5 minutes
  rigbook.homelab.health_timer:
    host: "{{ rigbook_host }}"
    name: "{{ inventory_hostname }}"
    interval_s: "{{ rigbook_host.health.interval_s }}"
"""

RETURN = r"""
files_changed:
  description: The files written (or that would be).
  type: list
  elements: str
  returned: always
systemd:
  description: Whether systemd is the init system (false - files written, timer not started).
  type: bool
  returned: when state is present
timer:
  description: What was done to the timer (enabled, started, restarted, stopped), in order.
  type: list
  elements: str
  returned: always
"""

import json
import os

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.rigbook.homelab.plugins.module_utils.facts import files, runner
from ansible_collections.rigbook.homelab.plugins.module_utils.ladder import health

NAME = "rigbook-health"
# sd_booted(3): systemd is the init system when this folder exists (a container without it has none)
SYSTEMD_RUN = "/run/systemd/system"


def service_text(p):
    return ("# rigbook: P2P health between runs (the health role; docs/health.md)\n"
            "[Unit]\n"
            "Description=rigbook P2P health check (static layers, error counters, serving without requests)\n"
            "After=network-online.target\n\n"
            "[Service]\n"
            "Type=oneshot\n"
            "ExecStart=%s %s --config %s\n"
            "Nice=10\n"
            "TimeoutStartSec=%d\n" % (p["python"], p["bundle"], p["config_path"], max(60, p["interval_s"])))


def timer_text(p):
    return ("# rigbook: P2P health between runs (the health role; docs/health.md)\n"
            "[Unit]\n"
            "Description=rigbook P2P health check every %d s\n\n"
            "[Timer]\n"
            "OnBootSec=%ds\n"
            "OnUnitActiveSec=%ds\n"
            "AccuracySec=1s\n\n"
            "[Install]\n"
            "WantedBy=timers.target\n" % (p["interval_s"], p["interval_s"], p["interval_s"]))


def main():
    module = AnsibleModule(
        argument_spec=dict(
            bundle=dict(type="path", default="/usr/local/lib/rigbook-health.pyz"),
            host=dict(type="dict", required=True),
            name=dict(type="str", required=True),
            config_path=dict(type="path", default="/etc/rigbook/health.json"),
            interval_s=dict(type="int", default=300),
            python=dict(type="path", default="/usr/bin/python3"),
            unit_dir=dict(type="path", default="/etc/systemd/system"),
            state=dict(type="str", choices=["present", "absent"], default="present"),
        ),
        supports_check_mode=True,
    )
    p = module.params
    if p["interval_s"] < 1:
        module.fail_json(msg="interval_s %d: at least 1 second" % p["interval_s"])
    service = os.path.join(p["unit_dir"], NAME + ".service")
    timer = os.path.join(p["unit_dir"], NAME + ".timer")
    result = dict(changed=False, files_changed=[], timer=[])

    def systemctl(*args):
        return runner.run(["systemctl"] + list(args))

    if p["state"] == "absent":
        present = [f for f in (timer, service, p["config_path"]) if os.path.exists(f)]
        if present:
            booted = os.path.isdir(SYSTEMD_RUN)
            result.update(changed=True, files_changed=present, timer=["stopped", "disabled"] if booted else [])
            if not module.check_mode:
                if booted:
                    systemctl("disable", "--now", NAME + ".timer")
                for path in present:
                    os.unlink(path)
                if booted:
                    systemctl("daemon-reload")
        module.exit_json(**result)
    try:
        config = health.config_of(p["host"], p["name"])
        config["interval_s"] = p["interval_s"]  # the timer's own, written as a metric (the stale alert's unit)
    except (KeyError, TypeError) as exc:
        module.fail_json(msg="host: not a host model (rigbook_host): %s missing" % exc)
    # root's alone: it names the serve units' key files and the box's layout (the service runs as root)
    wanted = [(p["config_path"], json.dumps(config, indent=2, sort_keys=True) + "\n", 0o600),
              (service, service_text(p), 0o644), (timer, timer_text(p), 0o644)]
    before, after = "", ""
    for path, text, _mode in wanted:
        now = files.read_text(path, strip=False)
        if now != text:
            result["files_changed"].append(path)
            before += "--- %s\n%s" % (path, now or "(none)\n")
            after += "--- %s\n%s" % (path, text)
    booted = os.path.isdir(SYSTEMD_RUN)
    if not booted:
        module.warn("systemd is not the init system here (no %s): the health timer's files are written, the timer "
                    "is not started" % SYSTEMD_RUN)
    enabled = not booted or systemctl("is-enabled", NAME + ".timer").stdout.strip() == "enabled"
    active = not booted or systemctl("is-active", NAME + ".timer").stdout.strip() == "active"
    units_changed = any(path in result["files_changed"] for path in (service, timer))
    result["systemd"] = booted
    if booted and not enabled:
        result["timer"].append("enabled")
    if booted and not active:
        result["timer"].append("started")
    elif booted and timer in result["files_changed"]:
        result["timer"].append("restarted")
    result["changed"] = bool(result["files_changed"] or result["timer"])
    if result["changed"] and not module.check_mode:
        for path, text, mode in wanted:
            if path in result["files_changed"]:
                try:
                    files.write_atomic(path, text, mode, make_parents=True)
                except OSError as exc:
                    module.fail_json(msg="cannot write %s: %s" % (path, getattr(exc, "strerror", None) or exc),
                                     **result)
        if units_changed and booted:
            done = systemctl("daemon-reload")
            if done.rc != 0:
                module.fail_json(msg=done.error, **result)
        for action, argv in (("enabled", ["enable", NAME + ".timer"]), ("started", ["start", NAME + ".timer"]),
                             ("restarted", ["restart", NAME + ".timer"])):
            if action in result["timer"]:
                done = systemctl(*argv)
                if done.rc != 0:
                    module.fail_json(msg=done.error, **result)
    if module._diff and result["files_changed"]:
        result["diff"] = dict(before=before, after=after)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
