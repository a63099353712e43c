# -*- coding: utf-8 -*-
# Copyright: rigbook developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)


class ModuleDocFragment:
    """Check and diff mode support, by what a module does to the host."""

    # Reads (and measures) only: check mode runs it the same, nothing to diff.
    READ_ONLY = r"""
attributes:
  check_mode:
    support: full
    description: Reads only; runs the same in check mode.
  diff_mode:
    support: none
    description: Nothing to diff.
"""

    # Changes the host: check mode says what would change, diff mode shows it.
    CHANGES = r"""
attributes:
  check_mode:
    support: full
    description: Reports what would change and changes nothing.
  diff_mode:
    support: full
    description: Shows the state before and after.
"""

    # Fetches or checks files: check mode says what would be fetched, nothing to diff.
    FETCHES = r"""
attributes:
  check_mode:
    support: full
    description: Reports what would be fetched and fetches nothing.
  diff_mode:
    support: none
    description: Nothing to diff.
"""
