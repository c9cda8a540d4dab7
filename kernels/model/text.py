"""The text a model reads: the default text, text files, and what identifies a text in a row.

Default text: the prose of Python's own language reference as shipped in every CPython
(`pydoc_data.topics`, the text `help()` shows), topics in sorted order, indented blocks (code
and grammar) and reST underlines dropped. It is present wherever kvbench installs, needs no
network and is deterministic for a given Python minor version (its sha256 is reported with
the figures); it is technical English, so absolute perplexities are those of documentation
prose, while the deltas between cache formats are what kvbench ranks.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

DEFAULT_TEXT = "pydoc-topics"


def _prose(block: str) -> str:
    keep = []
    for line in block.splitlines():
        if line.startswith("   ") or set(line.strip()) <= set("*=-^~"):
            continue  # code / grammar block, or a heading underline (blank lines kept)
        keep.append(line)
    return "\n".join(keep)


def default_text() -> str:
    """The prose of CPython's pydoc topics (see module docstring), deterministic."""
    from pydoc_data.topics import topics

    text = "\n\n".join(_prose(topics[k]) for k in sorted(topics))
    while "\n\n\n" in text:
        text = text.replace("\n\n\n", "\n\n")
    return text.strip() + "\n"


def text_file(path: str | Path) -> str:
    """UTF-8 text of a file as its bytes say (no newline translation: a CRLF file keeps its
    \r, as llama.cpp reads it); ValueError naming the file if unreadable or empty."""
    try:
        with open(path, encoding="utf-8", newline="") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"cannot read text file {path}: {e}") from None
    if not text.strip():
        raise ValueError(f"text file {path} is empty")
    return text


def text_info(text: str) -> dict:
    """What identifies a text in a result row."""
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]
    return {"text_sha256": digest, "text_chars": len(text), "python": sys.version.split()[0]}
