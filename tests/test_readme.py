"""The README documents every CSV column (the Record's fields are the header)."""

from __future__ import annotations

from pathlib import Path

from kvbench.store.schema import COLUMNS


def test_every_column_is_documented():
    text = Path("README.md").read_text()
    section = text[text.index("## CSV columns") : text.index("## Layout")]
    assert [c for c in COLUMNS if c not in section] == []
