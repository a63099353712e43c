#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: rigbook developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

DOCUMENTATION = r"""
---
module: serve_units
short_description: One hardened systemd unit per serve profile, restarted only when it changed, then waited for
description:
  - Checks every profile of O(profiles) on the host first (the serve profile traps - tp size above the GPU count,
    custom all-reduce on a box without P2P, HSA_ENABLE_IPC_MODE_LEGACY=1, a token budget above the context, a model
    path missing here, a memory fraction above 0.88 with a desktop...); an error fails the task before anything is
    written or restarted.
  - Renders, per profile, C(rigbook-serve-<name>.service) (ExecStart built from the profile with no shell, the GPU
    environment file plus the profile's own environment file, an unprivileged user in video/render,
    Restart=on-failure with a start limit, TimeoutStartSec from the profile, LimitMEMLOCK, journald) and
    C(<config_dir>/<name>.env); with an API key file, a root-only C(<name>.key.env) that the unit reads and the
    engine gets as C(--api-key ${RIGBOOK_SERVE_API_KEY}), so the key is never in the unit, the argv on disk, the
    task result or the diff. Units of profiles no longer listed are stopped, disabled and removed.
  - One C(systemctl show) reads every unit's state. Files are written only when their content differs;
    C(daemon-reload) only when a unit file changed; a unit is restarted only when its unit, environment or key file
    changed or O(restart) is set, started when it is not running, enabled for multi-user.target. A converged host
    restarts nothing.
  - After a (re)start it waits for readiness, as SGLang has no sd_notify - C(/health_generate) polled until 200 (at
    most one request per 2 s, the unit's state checked in between), then one real chat completion - within the
    profile's C(startup_timeout_s); on a timeout or a unit that failed it fails with the unit's last journal lines.
  - Supports check mode and diff mode.
version_added: "1.0.0"
author:
  - rigbook developers
options:
  profiles:
    description: rigbook_serve, the serve profiles (meta/host_vars.schema.json).
    type: list
    elements: dict
    required: true
  engine:
    description: The engine command prefix the profile's flags follow (e.g. C([<venv>/bin/python, -m,
      sglang.launch_server])).
    type: list
    elements: str
    required: true
  user:
    description: The unprivileged system user the engine runs as (made here, with its group, when absent).
    type: str
    default: rigbook-serve
  supplementary_groups:
    description: Its device groups.
    type: list
    elements: str
    default: [video, render]
  home:
    description: The user's writable home (SGLang, Triton and flashinfer caches live under ~/.cache).
    type: path
    default: /var/lib/rigbook-serve
  env_files:
    description: The GPU stack's environment files every unit reads first (e.g. C(/etc/rigbook/gpu.env)); each must
      exist.
    type: list
    elements: path
    default: []
  host:
    description: What the inventory says about the box for the profile checks (gpu_count, vendor, p2p_expected).
    type: dict
    default: {}
  unit_dir:
    description: Where the unit files go.
    type: path
    default: /etc/systemd/system
  config_dir:
    description: Where the profiles' environment files go.
    type: path
    default: /etc/rigbook/serve
  restart:
    description: Restart every unit even when nothing of it changed (the GPU stack it runs on changed).
    type: bool
    default: false
  wait:
    description: Wait for readiness after a (re)start.
    type: bool
    default: true
extends_documentation_fragment:
  - rigbook.homelab.attributes.changes
"""

EXAMPLES = r"""
- name: The serve units
  rigbook.homelab.serve_units:
    profiles: "{{ rigbook_serve }}"
    engine: ["{{ rigbook_sglang_venv }}/bin/python", -m, sglang.launch_server]
    env_files: [/etc/rigbook/gpu.env]
    host: {gpu_count: 2, vendor: amd, p2p_expected: true}
"""

RETURN = r"""
account:
  description: What of the service account (its groups, the user, its group membership, its home) was made.
  returned: always
  type: list
  elements: str
units:
  description: Per profile name - unit, changed (what changed of unit/env/key), restarted, ready_s, started_at.
  returned: always
  type: dict
removed:
  description: Units of profiles no longer listed that were (or would be) removed.
  returned: always
  type: list
  elements: str
warnings_found:
  description: The profile checks' warnings (also shown as task warnings).
  returned: always
  type: list
  elements: str
"""

import os
import re

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.rigbook.homelab.plugins.module_utils import account as service_account
from ansible_collections.rigbook.homelab.plugins.module_utils.serve import profile as serve_profile
from ansible_collections.rigbook.homelab.plugins.module_utils.serve import readiness

MARK = "# Managed by rigbook (serve role)"
PREFIX = serve_profile.UNIT_PREFIX
_PLAIN = re.compile(r"^[A-Za-z0-9_@+=:,./-]+$")


def systemd_quote(arg, keep=()):
    """ARG as one word of an ExecStart= line: % and $ escaped (except the references in KEEP), quoted when needed."""
    text = arg.replace("%", "%%")
    if arg not in keep:
        text = text.replace("$", "$$")
    if _PLAIN.match(text) or arg in keep:
        return text
    return '"%s"' % text.replace("\\", "\\\\").replace('"', '\\"')


def unit_name(profile):
    return serve_profile.unit_name(profile["name"])


def env_text(profile):
    lines = ["%s: environment of serve profile %s (systemd EnvironmentFile= format)" % (MARK, profile["name"])]
    for key in sorted(profile.get("env") or {}):
        value = str(profile["env"][key])
        lines.append('%s="%s"' % (key, value.replace("\\", "\\\\").replace('"', '\\"')))
    return "\n".join(lines) + "\n"


def unit_text(profile, p, files):
    argv = serve_profile.engine_argv(profile, p["engine"]) + serve_profile.api_key_args(profile)
    keep = tuple(a for a in serve_profile.api_key_args(profile) if a.startswith("${"))
    timeout = int(profile.get("startup_timeout_s") or serve_profile.DEFAULT_STARTUP_TIMEOUT_S)
    env_files = list(p["env_files"]) + [files["env"]] + ([files["key"]] if "key" in files else [])
    lines = [
        MARK + ": serve profile %s. Edit rigbook_serve in the inventory, not this file." % profile["name"],
        "[Unit]",
        # % starts a systemd specifier in Description= too: doubled
        "Description=rigbook serve %s (SGLang %s on port %s)" % (
            profile["name"], str(profile.get("served_model_name") or profile["model_path"]).replace("%", "%%"),
            serve_profile.port_of(profile)),
        "After=network-online.target",
        "Wants=network-online.target",
        # Restart=on-failure, but a crash loop stops after 5 starts in 10 minutes instead of hammering the GPUs
        "StartLimitIntervalSec=600",
        "StartLimitBurst=5",
        "",
        "[Service]",
        "Type=exec",
        "User=%s" % p["user"],
        "Group=%s" % p["user"],
        "SupplementaryGroups=%s" % " ".join(p["supplementary_groups"]),
        "WorkingDirectory=%s" % p["home"],
        "Environment=HOME=%s" % p["home"],
    ] + ["EnvironmentFile=%s" % path for path in env_files] + [
        "ExecStart=%s" % " ".join(systemd_quote(a, keep) for a in argv),
        "Restart=on-failure",
        "RestartSec=10",
        # weights, KV pool and graph capture come before the port opens (SGLang's launch_server, http_server.py)
        "TimeoutStartSec=%d" % timeout,
        "TimeoutStopSec=120",
        "LimitMEMLOCK=infinity",
        "StandardOutput=journal",
        "StandardError=journal",
        "SyslogIdentifier=%s%s" % (PREFIX, profile["name"]),
        "NoNewPrivileges=yes",
        "ProtectSystem=full",
        "PrivateTmp=yes",
        "",
        "[Install]",
        "WantedBy=multi-user.target",
    ]
    return "\n".join(lines) + "\n"


def read(path):
    try:
        with open(path) as handle:
            return handle.read()
    except OSError:
        return None


def write(path, text, mode):
    tmp = path + ".rigbook-new"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    os.chmod(tmp, mode)
    os.rename(tmp, path)


def parse_show(text):
    """{unit: {property: value}} from `systemctl show UNIT... -p ...` (blocks separated by blank lines, each with Id)."""
    units, block = {}, {}
    for line in text.splitlines() + [""]:
        if not line.strip():
            if block.get("Id"):
                units[block["Id"]] = block
            block = {}
            continue
        key, _, value = line.partition("=")
        block[key] = value
    return units


class Units(object):
    def __init__(self, module):
        self.module = module
        self.p = module.params

    def run(self, argv, check=True):
        rc, out, err = self.module.run_command(argv, environ_update={"LC_ALL": "C", "SYSTEMD_PAGER": ""})
        if check and rc != 0:
            self.module.fail_json(msg="%s failed (rc %d): %s" % (" ".join(argv), rc, (err or out).strip()[-1500:]))
        return rc, out, err

    def show(self, names):
        if not names:
            return {}
        _, out, _ = self.run(["systemctl", "show"] + names + ["-p", "Id,ActiveState,SubState,UnitFileState,"
                                                                    "ExecMainStartTimestamp,NRestarts,Result"])
        return parse_show(out)

    def journal(self, unit, lines=30):
        _, out, err = self.run(["journalctl", "-u", unit, "-n", str(lines), "--no-pager", "-o", "cat"], check=False)
        return (out or err).strip()

    def host_facts(self, profiles):
        facts = dict(self.p["host"])
        _, out, _ = self.run(["systemctl", "get-default"], check=False)
        facts["default_target"] = out.strip()
        facts["display_manager_enabled"] = os.path.lexists(os.path.join(self.p["unit_dir"],
                                                                        "display-manager.service"))
        return facts


def profile_facts(facts, profile):
    out = dict(facts, model_path_exists=os.path.isdir(str(profile.get("model_path"))))
    draft = (profile.get("speculative") or {}).get("draft_model_path")
    if draft:
        out["draft_model_path_exists"] = os.path.isdir(str(draft))
    return out


def key_env(profile, module):
    """The root-only environment file text holding the profile's API key (read from its key file on the host)."""
    path = profile["api_key_file"]
    try:
        st = os.stat(path)
        with open(path) as handle:
            key = handle.read().strip()
    except OSError as exc:
        module.fail_json(msg="serve profile %s: api_key_file %s: %s" % (profile["name"], path, exc.strerror or exc))
    if st.st_mode & 0o077:
        module.fail_json(msg="serve profile %s: api_key_file %s is mode %04o; make it 0600 (readable by root only)"
                         % (profile["name"], path, st.st_mode & 0o777))
    if not key or "\n" in key:
        module.fail_json(msg="serve profile %s: api_key_file %s must hold the key alone, on one line"
                         % (profile["name"], path))
    return "%s=%s\n" % (serve_profile.API_KEY_ENV, key), key


def main():
    module = AnsibleModule(
        argument_spec=dict(
            profiles=dict(type="list", elements="dict", required=True),
            engine=dict(type="list", elements="str", required=True),
            user=dict(type="str", default="rigbook-serve"),
            supplementary_groups=dict(type="list", elements="str", default=["video", "render"]),
            home=dict(type="path", default="/var/lib/rigbook-serve"),
            env_files=dict(type="list", elements="path", default=[]),
            host=dict(type="dict", default={}),
            unit_dir=dict(type="path", default="/etc/systemd/system"),
            config_dir=dict(type="path", default="/etc/rigbook/serve"),
            restart=dict(type="bool", default=False),
            wait=dict(type="bool", default=True),
        ),
        supports_check_mode=True,
    )
    p = module.params
    u = Units(module)
    profiles = p["profiles"]
    facts = u.host_facts(profiles)
    errors, warnings = serve_profile.check_all(profiles, facts)
    for index, profile in enumerate(profiles):
        more_errors, _ = serve_profile.check(profile, profile_facts(facts, profile), index)
        errors += [e for e in more_errors if e not in errors]
    missing = [path for path in p["env_files"] if not os.path.isfile(path)]
    if missing and not module.check_mode:
        errors.append("the GPU environment file(s) %s do not exist: run the GPU stack's roles first"
                      % ", ".join(missing))
    if errors:
        module.fail_json(msg="serve profiles refused on this host, nothing was written or restarted:\n- %s"
                         % "\n- ".join(errors), errors=errors, warnings_found=warnings)
    for warning in warnings:
        module.warn(warning)

    plan = []
    for profile in profiles:
        item = dict(profile=profile, key=None, unit=unit_name(profile),
                    files={"unit": os.path.join(p["unit_dir"], unit_name(profile)),
                           "env": os.path.join(p["config_dir"], "%s.env" % profile["name"])})
        texts = {"env": (env_text(profile), 0o644)}
        if profile.get("api_key_file"):
            item["files"]["key"] = os.path.join(p["config_dir"], "%s.key.env" % profile["name"])
            text, item["key"] = key_env(profile, module)
            texts["key"] = (text, 0o600)
        texts["unit"] = (unit_text(profile, p, item["files"]), 0o644)
        item["texts"] = texts
        item["changed"] = [kind for kind in ("unit", "env", "key")
                           if kind in item["files"] and read(item["files"][kind]) != texts[kind][0]]
        plan.append(item)
    secrets = [item["key"] for item in plan if item["key"]]

    listed = set(item["unit"] for item in plan)
    stale = sorted(name for name in (os.listdir(p["unit_dir"]) if os.path.isdir(p["unit_dir"]) else [])
                   if name.startswith(PREFIX) and name.endswith(".service") and name not in listed
                   and (read(os.path.join(p["unit_dir"], name)) or "").startswith(MARK))
    states = u.show(sorted(listed) + stale)
    account = service_account.changes(p["user"], p["supplementary_groups"], p["home"], create=True)
    result = dict(changed=bool(stale or account), units={}, removed=stale, warnings_found=warnings,
                  account=[what for what, _ in account])
    diff_before, diff_after = [], []
    for item in plan:
        state = states.get(item["unit"], {})
        running = state.get("ActiveState") in ("active", "activating", "reloading")
        item["restart"] = bool(item["changed"]) or p["restart"] or not running
        item["enabled"] = state.get("UnitFileState") == "enabled"
        result["units"][item["profile"]["name"]] = dict(
            unit=item["unit"], changed=item["changed"], restarted=item["restart"] and running,
            started=item["restart"] and not running, enabled=item["enabled"],
            started_at=state.get("ExecMainStartTimestamp"))
        if item["changed"] or item["restart"] or not item["enabled"]:
            result["changed"] = True
        for kind in item["changed"]:
            path, before = item["files"][kind], read(item["files"][kind])
            hidden = "(the API key: not shown)\n"
            diff_before.append("%s:\n%s" % (path, "(absent)\n" if before is None else hidden if kind == "key"
                                              else before))
            diff_after.append("%s:\n%s" % (path, hidden if kind == "key" else item["texts"][kind][0]))
    if module._diff and result["changed"]:
        result["diff"] = dict(before="".join(diff_before) + "".join("%s: present\n" % s for s in stale),
                              after="".join(diff_after) + "".join("%s: removed\n" % s for s in stale))
    if module.check_mode or not result["changed"]:
        module.exit_json(**result)
    apply(module, u, plan, stale, secrets, result, account)
    module.exit_json(**result)


def apply(module, u, plan, stale, secrets, result, account):
    """Make the account, write what differs, remove stale units, reload, enable, (re)start and wait for readiness."""
    p = module.params
    service_account.apply(account, u.run, p["home"], p["user"])
    if not os.path.isdir(p["config_dir"]):
        os.makedirs(p["config_dir"], 0o755)
    reload_needed = bool(stale)
    for item in plan:
        for kind in item["changed"]:
            text, mode = item["texts"][kind]
            write(item["files"][kind], text, mode)
            reload_needed = reload_needed or kind == "unit"
    for name in stale:
        u.run(["systemctl", "disable", "--now", name], check=False)
        os.unlink(os.path.join(p["unit_dir"], name))
        base = name[len(PREFIX):-len(".service")]
        for suffix in (".env", ".key.env"):
            path = os.path.join(p["config_dir"], base + suffix)
            if os.path.exists(path):
                os.unlink(path)
    if reload_needed:
        u.run(["systemctl", "daemon-reload"])
    for item in plan:
        if not item["enabled"]:
            u.run(["systemctl", "enable", item["unit"]])
    restarts = [item for item in plan if item["restart"]]
    for item in restarts:
        u.run(["systemctl", "reset-failed", item["unit"]], check=False)  # a start limit hit earlier
        # Type=exec: the restart returns once the engine is exec'd (loading and warm-up are waited for below)
        u.run(["systemctl", "restart", item["unit"]])
    for item in restarts if p["wait"] else []:
        unit = item["unit"]
        outcome = readiness.wait(item["profile"], item["key"], lambda unit=unit: u.show([unit]).get(unit, {}))
        entry = result["units"][item["profile"]["name"]]
        if not outcome["ready"]:
            journal = u.journal(unit)
            for secret in secrets:
                journal = journal.replace(secret, "(API key)")
            module.fail_json(msg="%s is not ready: %s. Its last journal lines:\n%s" % (unit, outcome["why"], journal),
                             units=result["units"])
        entry["ready_s"] = outcome["seconds"]
        entry["started_at"] = u.show([unit]).get(unit, {}).get("ExecMainStartTimestamp")


if __name__ == "__main__":
    main()
