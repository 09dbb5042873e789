"""Sweep files: a base training config, a grid of config values and options, expanded into named runs.

A sweep file (TOML/YAML/JSON) has three parts:

    [sweep]                      # options (SweepOptions below); all optional
    out = "runs/deadzone-small"
    [base]                       # a training config, same schema as `plelab train` files ...
    data = "/tmp/plelab-data"    # ... or, at the top level, base = "path/to/train.toml"
    [base.model]
    preset = "tiny"
    [grid]                       # dotted TrainConfig keys -> lists of values (cartesian product, file order)
    seed = [1, 2, 3]
    "model.ple.dim" = [0, 16, 64]

Every grid point becomes a run named from its grid values (`seed=1,dim=16`), stable across invocations.
Paths: `base = "..."` is relative to the sweep file; paths inside the training config (data, eval_data,
tokenizer) and `sweep.out` are relative to the current directory, as with `plelab train`.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from plelab.training.config import TrainConfig, load_train_config, train_config_dict
from plelab.util.dataclass_config import ConfigError, apply_overrides, from_dict, parse_override, read_file, to_dict

SECTIONS = ("sweep", "base", "grid")
RESOLVED_FILE = "sweep.json"
"""In the sweep folder: the sweep as expanded last (base inlined, overrides applied); subprocess runs read it."""
DB_FILE = "sweep.sqlite"
"""In the sweep folder: every run's config, status, metrics summary and final evaluation."""


@dataclass
class SweepOptions:
    """How a sweep runs (the `[sweep]` table)."""

    name: str = ""
    """Sweep name; empty = the sweep file's stem."""
    out: str = ""
    """Sweep folder (runs/, sweep.sqlite, reports); empty = runs/<name>. Relative to the current directory."""
    parallel: int = 1
    """Runs trained at once; above 1 each run is its own subprocess."""
    subprocess: bool = False
    """Train every run in a fresh Python subprocess even when parallel = 1."""
    threads: int = 0
    """Torch threads per run; 0 = torch's default in-process, (CPU cores / parallel) for subprocesses."""

    def __post_init__(self) -> None:
        if self.parallel < 1:
            raise ConfigError(f"sweep.parallel must be >= 1, got {self.parallel}")
        if self.threads < 0:
            raise ConfigError(f"sweep.threads must be >= 0, got {self.threads}")


@dataclass
class SweepPoint:
    """One grid point: its stable name, its grid values and the full training config."""

    index: int
    name: str
    values: dict[str, Any]
    config: TrainConfig

    def config_dict(self) -> dict[str, Any]:
        """The training config as a plain dict (what the database stores)."""
        return train_config_dict(self.config)

    @property
    def config_hash(self) -> str:
        """Hash of the full resolved training config: results and checkpoints are keyed by it."""
        return config_hash(self.config_dict())


def config_hash(config: dict[str, Any]) -> str:
    """sha256 of a config dict in canonical JSON (sorted keys), so equal configs hash equal."""
    return hashlib.sha256(json.dumps(config, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


@dataclass
class Sweep:
    """An expanded sweep: options, grid, base config and every point."""

    options: SweepOptions
    base: dict[str, Any]
    grid: dict[str, list[Any]]
    points: list[SweepPoint]
    folder: Path
    source: str = ""
    overrides: list[str] = field(default_factory=list)

    @property
    def db_path(self) -> Path:
        """The sweep's SQLite database."""
        return self.folder / DB_FILE

    def run_dir(self, point: SweepPoint | str) -> Path:
        """Run directory of a point (by point or name)."""
        return self.folder / "runs" / (point if isinstance(point, str) else point.name)

    def point(self, name: str) -> SweepPoint:
        """The point called `name`."""
        for p in self.points:
            if p.name == name:
                return p
        raise ConfigError(f"no run named {name!r} in this sweep; runs: {', '.join(p.name for p in self.points)}")

    def resolved_dict(self) -> dict[str, Any]:
        """A self-contained sweep dict (base inlined, out absolute) that loads back to the same points."""
        options = {**to_dict(self.options), "out": str(self.folder.resolve())}
        return {"sweep": options, "base": self.base, "grid": self.grid}


def short_keys(keys: list[str]) -> dict[str, str]:
    """Shortest dotted suffix of each key that no other key shares (model.ple.dim -> dim)."""
    parts = {k: k.split(".") for k in keys}
    out = {}
    for k, p in parts.items():
        for n in range(1, len(p) + 1):
            suffix = ".".join(p[-n:])
            if not any(".".join(q[-n:]) == suffix for other, q in parts.items() if other != k):
                break
        out[k] = suffix
    return out


def format_value(value: Any) -> str:
    """A grid value as it appears in a run name: short, filesystem-safe, stable."""
    if isinstance(value, bool) or value is None:
        return str(value).lower()
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return f"{value:g}" if math.isfinite(value) else str(value)
    if isinstance(value, (list, tuple)):
        return "-".join(format_value(v) for v in value) or "empty"
    if isinstance(value, dict):
        return "-".join(f"{k}{format_value(v)}" for k, v in value.items()) or "empty"
    return re.sub(r"[^A-Za-z0-9._+-]+", "-", str(value)).strip("-") or "empty"


def run_name(values: dict[str, Any], shorts: dict[str, str]) -> str:
    """The run name of a grid point: `short=value` pairs in grid order, joined by commas."""
    return ",".join(f"{shorts[k]}={format_value(v)}" for k, v in values.items()) or "base"


def expand_grid(grid: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """Cartesian product of the grid in file order (the first key varies slowest)."""
    keys = list(grid)
    return [dict(zip(keys, combo, strict=True)) for combo in itertools.product(*(grid[k] for k in keys))]


def _point_overrides(values: dict[str, Any]) -> list[str]:
    # JSON round-trips every TOML value type through apply_overrides' parser.
    return [f"{k}={json.dumps(v)}" for k, v in values.items()]


def _read_sections(source: str | Path | dict[str, Any]) -> tuple[dict[str, Any], Path | None]:
    if isinstance(source, dict):
        return json.loads(json.dumps(source)), None
    path = Path(source)
    return read_file(path), path


def _inline_base(data: dict[str, Any], path: Path | None) -> dict[str, Any]:
    """Replace `base = "file"` by the file's contents (relative to the sweep file)."""
    base = data.get("base", {})
    if isinstance(base, str):
        ref = Path(base)
        if not ref.is_absolute() and path is not None:
            ref = path.parent / ref
        data["base"] = read_file(ref)
    elif not isinstance(base, dict):
        raise ConfigError("base must be a table of training config keys or the path of a training config file")
    return data


def _grid_lists(grid: Any) -> dict[str, list[Any]]:
    if not isinstance(grid, dict):
        raise ConfigError("[grid] must be a table of config keys -> lists of values")
    out = {}
    for key, values in grid.items():
        values = values if isinstance(values, list) else [values]
        if not values:
            raise ConfigError(f"grid key {key!r} has an empty list of values")
        out[key] = values
    return out


def load_sweep(source: str | Path | dict[str, Any], overrides: list[str] | None = None,
               out: str | Path | None = None) -> Sweep:
    """Read a sweep file (or dict), apply `--set` overrides (e.g. base.data=/x, grid.seed=[1]), expand the grid."""
    data, path = _read_sections(source)
    unknown = sorted(set(data) - set(SECTIONS))
    if unknown:
        raise ConfigError(f"unknown sweep section(s) {', '.join(unknown)}; a sweep file has [sweep], [base], [grid]")
    data = _inline_base(data, path)
    # Grid keys are themselves dotted (grid.model.ple.dim), so `grid.` overrides take the rest of the key whole.
    grid_sets = [o for o in overrides or [] if o.strip().startswith("grid.")]
    data = apply_overrides(data, [o for o in overrides or [] if o not in grid_sets])
    for text in grid_sets:
        key, value = parse_override(text)
        data.setdefault("grid", {})[key[len("grid."):].strip('"')] = value
    options = from_dict(SweepOptions, data.get("sweep", {}), prefix="sweep.")
    if not options.name:
        options.name = path.stem if path is not None else "sweep"
    folder = Path(out or options.out or Path("runs") / options.name)
    grid = _grid_lists(data.get("grid", {}))
    base = data.get("base", {})
    shorts = short_keys(list(grid))
    points, seen = [], {}
    for i, values in enumerate(expand_grid(grid)):
        name = run_name(values, shorts)
        if name in seen:
            raise ConfigError(f"grid points {seen[name]} and {values} both get the run name {name!r}")
        seen[name] = values
        try:
            cfg = load_train_config(base, _point_overrides(values))
        except ConfigError as exc:
            raise ConfigError(f"grid point {name}: {exc}") from exc
        points.append(SweepPoint(i, name, values, cfg))
    return Sweep(options, base, grid, points, folder, source=str(path) if path else "<dict>",
                 overrides=list(overrides or []))
