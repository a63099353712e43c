# -*- coding: utf-8 -*-
# Copyright: rigbook developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)


class ModuleDocFragment:
    """The options and attributes every P2P-ladder module shares."""

    DOCUMENTATION = r"""
options:
  root:
    description: Evidence root; V(/) on a real box, a recorded tree on a lab host or in a replay.
    type: path
    default: /
  profile:
    description:
      - "The host profile, C({gpu: rigbook_gpu, p2p: rigbook_p2p, pins: rigbook_pins})."
    type: dict
    default: {}
attributes:
  check_mode:
    support: full
    description: Reads and measures only; runs the same in check mode.
  diff_mode:
    support: none
    description: Nothing to diff.
"""
