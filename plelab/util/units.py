"""Sizes as people write them on a command line: '20M', '1.5GB', '512k', '4MiB'."""

from __future__ import annotations

import re

from plelab.errors import PlelabError

_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?)\s*([kmgt]?)(i?b?)\s*$", re.IGNORECASE)


def parse_size(text: str) -> int | None:
    """'20M', '1.5GB', '512k', '100000' -> bytes (decimal units; 'MiB' style is binary); 'all'/'0' -> None."""
    if text.strip().lower() in ("all", "none", "0"):
        return None
    m = _SIZE.match(text)
    if not m:
        raise PlelabError(f"cannot read size {text!r} (examples: 20M, 1.5GB, 512k, all)")
    base = 1024 if m.group(3).lower().startswith("i") else 1000
    return int(float(m.group(1)) * base ** " kmgt".index((m.group(2) or " ").lower()))
