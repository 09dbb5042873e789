"""Where the real data lives (../shared/data, or $PLELAB_SHARED_DATA), for tests that need it at import time."""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("PLELAB_SHARED_DATA", REPO.parent / "shared" / "data"))
