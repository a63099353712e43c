# -*- coding: utf-8 -*-
# Copyright: rigbook developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action rigbook.homelab.host_model: the host model of the host (plugins/module_utils/host_model.py), computed once
after its rigbook_* variables are checked against meta/host_vars.schema.json.

The preflight role's first task; for users who run ansible-playbook without the `provision` CLI (which checks every
inventory file before any run) it is also the schema check. Runs on the controller only: no connection, no remote
module, the same in check mode. Fails with each problem's key path, the bad value and what is allowed, worded as
`provision validate` words it (both use plugins/plugin_utils/host_vars_schema.py). Needs the Python package
jsonschema on the controller. The serve profiles (rigbook_serve) are checked for their traps with what the inventory
says about the box, as `provision` does: their errors fail the task, their warnings are shown as Ansible warnings
and do not.

It also computes the host model (plugins/module_utils/host_model.py) and returns it as `host_model`, with
`host_model.readiness` holding, per role, the inputs that role needs and the inventory lacks: the preflight role
sets it as the one fact rigbook_host, which every role reads; the task fails when a role this run applies (its
--tags and --skip-tags considered) lacks an input, before any role has changed anything.

With `secure_boot` (the preflight role's second call, after rigbook.homelab.boot_state read the box): what the roles
of this run need of the box's Secure Boot (host_vars_schema.secure_boot_needs: the DKMS signing key enrolled, a kernel
the owner built signed), failing before any package changes; `provision validate` cannot know it (docs/secure-boot.md).

Not checked: extra variables (-e) and the variables the collection's own plays set or take as extra variables
(RUNTIME_VARS); `provision validate` does not check those either.
"""

from __future__ import annotations

import hashlib
import json
import os

from ansible.plugins.action import ActionBase
from ansible.utils.vars import load_extra_vars
from ansible_collections.rigbook.homelab.plugins.module_utils import host_model
from ansible_collections.rigbook.homelab.plugins.module_utils.facts import files
from ansible_collections.rigbook.homelab.plugins.plugin_utils import collection_files, host_vars_schema

# Set by the collection's plays (set_fact) or passed by the CLI as extra variables: not host variables.
RUNTIME_VARS = frozenset(("rigbook_reboot_required", "rigbook_reboot_reasons", "rigbook_baselines",
                          "rigbook_snapshot_dir", "rigbook_sglang_venv", "rigbook_sglang_version", "rigbook_host",
                          "rigbook_gpu_stack_changed", "rigbook_run_dir", "rigbook_builds_dir",
                          "rigbook_verify_builds"))


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


def host_var_names(variables, skip=()):
    """The rigbook_* names of VARIABLES that are host variables (sorted)."""
    return sorted(k for k in variables if str(k).startswith(host_vars_schema.PREFIX)
                  and k not in RUNTIME_VARS and k not in skip)


def check(host_vars):
    """[(key path, message)] for one host's merged rigbook_* variables (builtin types); [] when valid.

    Raises host_vars_schema.SchemaUnavailable when jsonschema or the schema file is missing."""
    return host_vars_schema.host_problems(host_vars)


def findings(host_vars, model_of=None):
    """(problems, warnings), each [(key path, message)]: check's problems, and the serve profiles' warnings (judged
    with the model MODEL_OF() gives, when given)."""
    return host_vars_schema.host_findings(host_vars, model_of=model_of)


def model_of(host_vars, task_vars):
    """The host model with its readiness ({role: [need]}, every role of the host; run_needs picks this run's)."""
    # the OS decision reads the facts the play gathered (the preflight play gathers them before this task)
    facts = task_vars.get("ansible_facts") or {}
    model = host_model.build(host_vars, {k: plain(facts.get(k)) for k in host_model.MODEL_FACTS})
    inventory_dir = task_vars.get("inventory_dir")
    model["readiness"] = host_model.by_role(host_model.readiness(model, None, inventory_dir))
    return model


def run_roles(model, task_vars, roles=None):
    """The roles this run applies: ROLES (the play's; None: every role of the host), less those --tags /
    --skip-tags leave out."""
    chosen = host_model.roles_for_tags(task_vars.get("ansible_run_tags"), task_vars.get("ansible_skip_tags"))
    return [role for role in model["roles"] if role in chosen and (roles is None or role in roles)]


def run_needs(model, task_vars, roles=None):
    """The needs of the roles this run applies (run_roles)."""
    return [need for role in run_roles(model, task_vars, roles) for need in model["readiness"][role]]


def secure_boot_result(host, model, task_vars, args):
    """The second call of the preflight role (with secure_boot): what the roles of this run need of the box's Secure
    Boot (host_vars_schema.secure_boot_needs), after the box was read; fails naming them, nothing changed yet."""
    needs, warnings, notes = host_vars_schema.secure_boot_needs(
        model, plain(args.get("secure_boot")), plain(args.get("running_kernel") or ""),
        run_roles(model, task_vars, args.get("roles")))
    result = {"changed": False, "problems": [{"key_path": n["key"], "message": host_model.need_text(n)} for n in needs],
              "notes": notes}
    if warnings:
        result["warnings"] = ["%s: %s" % (host, warning) for warning in warnings]
    if needs:
        result["failed"] = True
        result["msg"] = "%s: not ready: %d thing%s only the owner can do at the box (nothing was changed): %s" % (
            host, len(needs), "" if len(needs) == 1 else "s", "; ".join(n["text"] for n in needs))
    else:
        result["msg"] = "%s: %s" % (host, "; ".join(notes + warnings) or "Secure Boot: nothing to check")
    return result


def role_var_names(variables):
    """The names of VARIABLES that set a role's variables (ROLE_*: the inventory's or -e's, templated before), and
    the connection's user (the roles put it in groups)."""
    prefixes = tuple(name + "_" for name, _, _ in host_model.ROLES) + ("group_build_",)
    return sorted(k for k in variables if str(k).startswith(prefixes) or k == "ansible_user")


# The run's own variables that change what a role does on a converged box: the controller's build store and whether
# builds are verified again (--verify-builds).
RECORDED_RUNTIME_VARS = ("rigbook_builds_dir", "rigbook_verify_builds")


def controller_files(pins, inventory_dir):
    """{path: sha256} of the controller's files the pins name for a role to copy to the box (a lock, a patch of the
    inventory's: each "lock" or "path" that is a file here, relative to the inventory's folder); an unreadable one
    maps to why."""
    found = {}

    def walk(value):
        if isinstance(value, dict):
            for key, item in value.items():
                if key in ("lock", "path") and isinstance(item, str) and item:
                    where = item if os.path.isabs(item) else os.path.join(inventory_dir or ".", item)
                    if os.path.isfile(where) and len(found) < 256:
                        found[item] = _file_sha256(where)
                else:
                    walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)

    walk(pins)
    return found


def _file_sha256(file_path):
    digest, why = files.digest(file_path)
    return digest or why


def inputs_digest(model, role_vars, collection):
    """The digest of everything a converged role's tasks take from the controller: the host model (readiness left
    out: it is derived), the role variables the inventory sets, the collection's files. A role whose converged state
    on the box (plugins/module_utils/converged.py) carries another digest runs."""
    data = {"model": dict((k, v) for k, v in model.items() if k != "readiness"), "role_vars": role_vars,
            "collection": collection}
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=repr).encode("utf-8")).hexdigest()


def failure_message(host, problems):
    count = len(problems)
    lines = "; ".join("%s: %s" % (where, message) for where, message in problems)
    return "%s: the rigbook_* variables are invalid (%d problem%s, schema %s): %s" % (
        host, count, "" if count == 1 else "s", host_vars_schema.SCHEMA_FILE, lines)


class ActionModule(ActionBase):
    _requires_connection = False
    _supports_check_mode = True
    _VALID_ARGS = frozenset(("roles", "secure_boot", "running_kernel"))

    def run(self, tmp=None, task_vars=None):
        task_vars = task_vars or {}
        result = super().run(tmp, task_vars)
        result["changed"] = False
        host = task_vars.get("inventory_hostname", "?")
        if "secure_boot" in self._task.args:
            model = plain(self._templar.template(task_vars.get("rigbook_host")))
            if not isinstance(model, dict) or "roles" not in model:
                return {**result, "failed": True, "msg": "%s: secure_boot is checked after the host model is set "
                        "(rigbook_host, the preflight role's first tasks)" % host}
            return {**result, **secure_boot_result(host, model, task_vars, self._task.args)}
        try:
            skip = set(load_extra_vars(self._loader))
        except Exception:  # noqa: BLE001 - no CLI arguments (an embedding caller): nothing to leave out
            skip = set()
        names = host_var_names(task_vars, skip)
        try:
            # Templated once: the schema checks the inventory's variables, the model reads them with any -e given.
            every = {name: plain(self._templar.template(task_vars[name])) for name in host_var_names(task_vars)}
            built = []

            def model_once():  # the host model of this run, built once: the serve checks read it, the run uses it
                if not built:
                    built.append(model_of(every, task_vars))
                return built[0]

            problems, warnings = findings({name: every[name] for name in names}, model_once)
        except host_vars_schema.SchemaUnavailable as exc:
            return {**result, "failed": True, "msg": "%s: %s" % (host, exc)}
        except Exception as exc:  # noqa: BLE001 - a template in a host variable's value that does not render
            return {**result, "failed": True, "msg": "%s: cannot read the rigbook_* variables: %s" % (host, exc)}
        result["checked"] = names
        if not problems:
            model = model_once()
            result["host_model"] = model
            try:
                role_vars = {name: plain(self._templar.template(task_vars[name])) for name in role_var_names(task_vars)}
                runtime = dict((name, plain(self._templar.template(task_vars[name])))
                               for name in RECORDED_RUNTIME_VARS if name in task_vars)
                copied = controller_files(model.get("pins"), task_vars.get("inventory_dir"))
                result["inputs_digest"] = inputs_digest(model, {**role_vars, **runtime, "controller_files": copied},
                                                        collection_files.digest())
                result["forced_roles"] = host_model.roles_named_by_tags(task_vars.get("ansible_run_tags"))
            except Exception as exc:  # noqa: BLE001 - a role variable that does not render: every role runs
                result["inputs_digest"] = ""
                result["inputs_unknown"] = "the role variables do not render (%s): every role runs" % exc
            roles = self._task.args.get("roles")
            problems = [(need["key"], host_model.need_text(need)) for need in run_needs(model, task_vars, roles)]
        result["problems"] = [{"key_path": where, "message": message} for where, message in problems]
        if warnings:
            result["warnings"] = ["%s: %s: %s" % (host, where, message) for where, message in warnings]
        if problems and "host_model" in result:
            result.pop("host_model")  # the message names what is missing; the whole model would bury it
            result["failed"] = True
            result["msg"] = "%s: not ready: %d input%s the play needs %s missing (nothing was changed): %s" % (
                host, len(problems), "" if len(problems) == 1 else "s", "is" if len(problems) == 1 else "are",
                "; ".join("%s: %s" % pair for pair in problems))
        elif problems:
            result["failed"] = True
            result["msg"] = failure_message(host, problems)
        else:
            result["msg"] = "%s: rigbook_* variables valid (%s)" % (host, ", ".join(names) or "no rigbook_* variables")
        return result
