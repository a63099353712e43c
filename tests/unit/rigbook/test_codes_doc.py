"""rigbook.codes_doc: docs/codes.md is what the codes' one definition renders (regenerate it with
`python -m rigbook.codes_doc`), so a code without its page entry fails here."""

from __future__ import annotations

from rigbook import codes_doc


def test_the_page_is_the_generated_one():
    assert codes_doc.PAGE.read_text() == codes_doc.render(), "run: python -m rigbook.codes_doc"


def test_every_code_has_its_entry():
    text = codes_doc.PAGE.read_text()
    # deferred: the collection is linked by render() above
    from ansible_collections.rigbook.homelab.plugins.module_utils.ladder import codes

    assert [c for c in codes.all_codes() if f"\n### {c}\n" not in text] == []
