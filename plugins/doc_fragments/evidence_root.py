# -*- coding: utf-8 -*-
# Copyright: rigbook developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)


class ModuleDocFragment:
    """Where a module reads the hardware facts, and the host profile it judges them against."""

    DOCUMENTATION = r"""
options:
  root:
    description: Evidence root; V(/) on a real box, a recorded tree on a lab host or in a replay (docs/evidence.md).
    type: path
    default: /
"""

    PROFILE = r"""
options:
  profile:
    description:
      - "The host profile, C({gpu: rigbook_gpu, p2p: rigbook_p2p, pins: rigbook_pins})."
    type: dict
    default: {}
"""
