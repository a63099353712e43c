#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: rigbook developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

DOCUMENTATION = r"""
---
module: validate_profile
short_description: Check the host's rigbook_* variables against the collection's JSON Schema
description:
  - Checks the host's merged C(rigbook_*) variables (C(rigbook_gpu), C(rigbook_p2p), C(rigbook_pins), C(rigbook_serve),
    C(rigbook_tolerance), C(rigbook_evidence_root)) against C(meta/host_vars.schema.json), the same file and wording as
    C(provision validate).
  - Fails naming each key path, the bad value and what is allowed. Unknown C(rigbook_*) names are errors.
  - An action plugin - runs on the controller only, contacts no host. Needs the Python package jsonschema on the
    controller.
  - Extra variables (C(-e)) and the variables the collection's plays set themselves are not checked.
version_added: "1.0.0"
author:
  - rigbook developers
options: {}
attributes:
  action:
    support: full
    description: Runs on the controller only.
  check_mode:
    support: full
    description: Checks the same in check mode.
  diff_mode:
    support: none
    description: Nothing to diff.
"""

EXAMPLES = r"""
- name: Check the rigbook_* variables before touching the host
  rigbook.homelab.validate_profile:
"""

RETURN = r"""
checked:
  description: The rigbook_* variable names checked.
  returned: when the variables could be read
  type: list
  elements: str
problems:
  description: "Each problem found: C({key_path, message}); empty when the variables are valid."
  returned: when the variables could be read
  type: list
  elements: dict
"""
