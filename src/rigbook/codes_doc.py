"""docs/codes.md, generated from the one place the failure codes are defined (plugins/module_utils/ladder/codes.py,
which gathers each judge module's CODES): `python -m rigbook.codes_doc` rewrites the page; a test fails when the page
differs from what this renders (a code without its entry)."""

from __future__ import annotations

import sys
from pathlib import Path

from rigbook.paths import link_collection

PAGE = Path(__file__).resolve().parents[2] / "docs" / "codes.md"
HEAD = """# Failure codes

Every verdict that is not a pass carries a code (`code` in `--json`, the summary, JUnit, the report, the health
metrics' `code` label and `provision diagnose`). A code names one finding and never changes meaning: it may be added,
never removed or given to another layer (plugins/module_utils/ladder/codes_issued.txt). A verdict with several
findings lists them all in `codes`, the most severe first. This page is generated from the codes' one definition
(each judge module's `CODES`, gathered by plugins/module_utils/ladder/codes.py): `python -m rigbook.codes_doc`.
"""


def render() -> str:
    link_collection()
    # deferred: ansible_collections.rigbook.homelab is importable only after link_collection() (above)
    from ansible_collections.rigbook.homelab.plugins.module_utils.ladder import codes

    table = codes.all_codes()
    order = [name for name, _ in codes.layers()]
    groups = sorted({entry["layer"] for entry in table.values()},
                    key=lambda layer: (order.index(layer) if layer in order else len(order), layer))
    out = [HEAD]
    for layer in groups:
        out.append(f"\n## {layer}\n")
        own = sorted(c for c, e in table.items() if e["layer"] == layer and c not in codes.generic())
        generic = sorted(c for c, e in table.items() if e["layer"] == layer and c in codes.generic())
        for code in own + generic:
            entry = table[code]
            out.append(f"\n### {code}\n\n{entry['title']}\n\n- Cause: {entry['cause']}\n"
                       f"- Measured: {entry['measured']}\n- What to do: {entry['action']}\n")
    return "".join(out)


def main(argv=None) -> int:
    PAGE.write_text(render())
    sys.stdout.write(f"wrote {PAGE}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
