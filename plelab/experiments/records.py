"""`plelab report RECORDS.json`: reading the per-seed records a study report committed beside it.

Every study report writes OUT/records.json: the plain data its analysis rests on (per-seed final losses,
timelines, costs and table diagnostics for the variant studies, every run's record for the dead-zone law, and
the analysis plan's registration and inputs). A reviewer without the sweep folder regenerates the report, and
every verdict in it, from that file alone (`plelab report RECORDS.json`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from plelab.errors import PlelabError


def load_records(path: str | Path) -> dict[str, Any]:
    """A records.json, checked to be one (a clear one-line error otherwise)."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        raise PlelabError(f"{path} is not a readable records file ({exc})") from None
    if not isinstance(data, dict) or "kind" not in data:
        raise PlelabError(f"{path} is not a study's records.json (no 'kind'); give a sweep folder or a records file "
                          "a study report wrote")
    return data
