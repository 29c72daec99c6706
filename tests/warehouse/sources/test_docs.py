"""docs/contract.md's tables of the declared sources are the declarations'."""

from __future__ import annotations

import re

from warehouse import sources
from warehouse.base import declare, settings

CONTRACT_DOC = settings.REPO_ROOT / "docs" / "contract.md"


def test_the_contract_doc_shows_every_declared_source_as_declared():
    text = CONTRACT_DOC.read_text()
    (block,) = re.findall(r"<!-- sources:begin -->\n(.*?)<!-- sources:end -->", text, re.S)
    want = "\n".join(declare.markdown(s) for s in sources.discover().values())
    assert block == want, (
        "docs/contract.md's sources differ from warehouse/sources/: paste the output of "
        "`regauge sources show SOURCE --markdown` between its sources markers"
    )
