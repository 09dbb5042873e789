"""Values made ready for strict JSON: what json.dumps would write as NaN, or cannot write at all."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch


def jsonable(obj: Any) -> Any:
    """Recursively turn tensors/numpy scalars into Python numbers, keys into str and NaN/inf into None."""
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, (np.generic, torch.Tensor)):
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj
