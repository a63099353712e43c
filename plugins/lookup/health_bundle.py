# -*- coding: utf-8 -*-
# Copyright: rigbook developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

DOCUMENTATION = r"""
---
name: health_bundle
short_description: The path of rigbook-health.pyz, the health timer's program, built on the controller
description:
  - Builds the collection's module_utils into one zip Python runs (C(python3 rigbook-health.pyz --config FILE)),
    byte for byte reproducibly, into the controller's temporary directory, named by its sha256; returns its path.
    The health role copies it to the box.
version_added: "1.0.0"
author:
  - rigbook developers
"""

EXAMPLES = r"""
- name: Install the health timer's program
  ansible.builtin.copy:
    src: "{{ lookup('rigbook.homelab.health_bundle') }}"
    dest: /usr/local/lib/rigbook-health.pyz
    mode: "0644"
"""

RETURN = r"""
_raw:
  description: The path of the built rigbook-health.pyz on the controller.
  type: list
  elements: path
"""

import os

from ansible.errors import AnsibleLookupError
from ansible.plugins.lookup import LookupBase
from ansible_collections.rigbook.homelab.plugins.plugin_utils import health_bundle


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        module_utils = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "module_utils")
        try:
            return [health_bundle.bundle_path(module_utils)]
        except OSError as exc:  # the temporary directory refused the file (a link or another user's file there)
            raise AnsibleLookupError("cannot write rigbook-health.pyz: %s" % exc) from exc
