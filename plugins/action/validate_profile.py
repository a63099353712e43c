# -*- coding: utf-8 -*-
# Copyright: rigbook developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action rigbook.homelab.validate_profile: check the host's rigbook_* variables against meta/profile.schema.json.

The preflight role's first task, for users who run ansible-playbook without the `provision` CLI (which checks
every inventory file before any run). Runs on the controller only: no connection, no remote module, the same in
check mode. Fails with each problem's key path, the bad value and what is allowed, worded as `provision validate`
words it (both use plugins/plugin_utils/profile_schema.py). Needs the Python package jsonschema on the controller.
The serve profiles (rigbook_serve) are checked for their traps with what the inventory says about the box, as
`provision` does: their errors fail the task, their warnings are shown as Ansible warnings and do not.

Not checked: extra variables (-e) and the variables the collection's own plays set or take as extra variables
(RUNTIME_VARS); `provision validate` does not check those either.
"""

from __future__ import annotations

from ansible.plugins.action import ActionBase
from ansible.utils.vars import load_extra_vars
from ansible_collections.rigbook.homelab.plugins.plugin_utils import profile_schema

# Set by the collection's plays (set_fact) or passed by the CLI as extra variables: not profile variables.
RUNTIME_VARS = frozenset(("rigbook_reboot_required", "rigbook_reboot_reasons", "rigbook_baselines",
                          "rigbook_snapshot_dir", "rigbook_sglang_venv", "rigbook_sglang_version"))


def plain(value):
    """The value with builtin types only (ansible-core tags str, int, dict, list values with subclasses)."""
    if isinstance(value, dict):
        return {plain(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if value is None or isinstance(value, bool):
        return value
    for kind in (str, int, float):
        if isinstance(value, kind):
            return kind(value)
    return value


def profile_names(variables, skip=()):
    """The rigbook_* names of VARIABLES that belong to the host profile (sorted)."""
    return sorted(k for k in variables if str(k).startswith(profile_schema.PREFIX)
                  and k not in RUNTIME_VARS and k not in skip)


def check(profile):
    """[(key path, message)] for one host's merged rigbook_* variables (builtin types); [] when valid.

    Raises profile_schema.SchemaUnavailable when jsonschema or the schema file is missing."""
    return profile_schema.host_problems(profile)


def findings(profile):
    """(problems, warnings), each [(key path, message)]: check's problems, and the serve profiles' warnings."""
    return profile_schema.host_findings(profile)


def failure_message(host, problems):
    count = len(problems)
    lines = "; ".join("%s: %s" % (where, message) for where, message in problems)
    return "%s: the rigbook_* profile is invalid (%d problem%s, schema %s): %s" % (
        host, count, "" if count == 1 else "s", profile_schema.SCHEMA_FILE, lines)


class ActionModule(ActionBase):
    _requires_connection = False
    _supports_check_mode = True
    _VALID_ARGS = frozenset()

    def run(self, tmp=None, task_vars=None):
        task_vars = task_vars or {}
        result = super().run(tmp, task_vars)
        result["changed"] = False
        host = task_vars.get("inventory_hostname", "?")
        try:
            skip = set(load_extra_vars(self._loader))
        except Exception:  # noqa: BLE001 - no CLI arguments (an embedding caller): nothing to leave out
            skip = set()
        names = profile_names(task_vars, skip)
        try:
            profile = {name: plain(self._templar.template(task_vars[name])) for name in names}
            problems, warnings = findings(profile)
        except profile_schema.SchemaUnavailable as exc:
            return {**result, "failed": True, "msg": "%s: %s" % (host, exc)}
        except Exception as exc:  # noqa: BLE001 - a template in a profile value that does not render
            return {**result, "failed": True, "msg": "%s: cannot read the rigbook_* profile: %s" % (host, exc)}
        result["checked"] = names
        result["problems"] = [{"key_path": where, "message": message} for where, message in problems]
        if warnings:
            result["warnings"] = ["%s: %s: %s" % (host, where, message) for where, message in warnings]
        if problems:
            result["failed"] = True
            result["msg"] = failure_message(host, problems)
        else:
            result["msg"] = "%s: rigbook_* profile valid (%s)" % (host, ", ".join(names) or "no rigbook_* variables")
        return result
