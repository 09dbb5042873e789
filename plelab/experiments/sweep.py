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

A study that compares *variants* (several fields changed together) names them in `[variants.NAME]` tables
(dotted TrainConfig keys -> single values, file order), crossed with the grid:

    [sweep]
    baseline = "swiglu"          # the report's reference; empty = the first variant
    match_ffn = "ffn_params"     # optional: solve each variant's FFN width against the baseline's model
    [variants.swiglu]
    [variants.mglu4]
    "model.ffn.kind" = "mglu"
    "model.ffn.mask_count" = 4
    match = false                # keep this variant's own width

Runs are then named `variant=NAME,seed=1` and ordered grid point by grid point, every variant of a point
before the next point, so a study cut short still has each variant at its first seeds.
With `match_ffn` (a plelab.edge.budget.BUDGETS name), each matched variant's model is sized by
budget.match_ffn against the baseline variant's model at the same grid point; what it solved is part of the
run's config (and so of its hash, the database and the reports) and listed in SweepPoint.solved.
Paths: `base = "..."` is relative to the sweep file; paths inside the training config (data, eval_data,
tokenizer) and `sweep.out` are relative to the current directory, as with `plelab train`.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import itertools
import json
import math
import re
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import plelab.vision  # noqa: F401 - registers the [vision] section: sweeps train vision runs too
from plelab.errors import PlelabError
from plelab.training.config import (
    PLUGIN_SECTIONS,
    TrainConfig,
    legacy_view,
    load_train_config,
    train_config_dict,
)
from plelab.util.dataclass_config import ConfigError, apply_overrides, from_dict, parse_override, read_file, to_dict

SECTIONS = ("sweep", "base", "grid", "variants")
RESOLVED_FILE = "sweep.json"
"""In the sweep folder: the sweep as expanded last (base inlined, overrides applied); subprocess runs read it."""
DB_FILE = "sweep.sqlite"
"""In the sweep folder: every run's config, status, metrics summary, final evaluation and timeline."""
VARIANT_KEY = "variant"
"""The pseudo grid key a variant's name appears under in run names and SweepPoint.values."""
DIM_KEY = "model.ple.dim"
"""The grid key of the PLE width (dP): the dose most studies pair their runs over."""
SEED_KEY = "seed"
"""The grid key of the seed: the unit every study pairs on."""
MATCH_KEY = "match"
"""In a [variants.NAME] table: false keeps the variant's own FFN width under sweep.match_ffn."""
HASHED_KEYS_V1 = Path(__file__).with_name("hashed_keys_v1.json")
"""The config keys that existed when run hashes were introduced; later keys are hashed only off their default."""
PLUGIN_KEYS_V1 = frozenset({"vision.corpus", "vision.ple_dim", "vision.aux_weight", "vision.codebook",
                            "vision.patches", "vision.patch_size"})
"""The plug-in sections' fields as sweeps first hashed them (the visual PLE study): a field added to a section
since is hashed only off its default, as for HASHED_KEYS_V1."""


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
    baseline: str = ""
    """The variant the others are compared with (and matched against); empty = the first [variants] table."""
    match_ffn: Literal["", "ffn_params", "inference_bytes", "active_flops"] = ""
    """Size each variant's FFN to the baseline's budget: one of plelab.edge.budget.BUDGETS (ffn_params,
    inference_bytes, active_flops); empty = every variant keeps the width its config gives."""
    plan: str = ""
    """The study's analysis plan file (plelab.experiments.plan), relative to the sweep file: hashed into the
    sweep database before the first run, fixed from then on; `plelab report` computes its verdicts. Empty = none
    (every verdict a report prints is then post hoc)."""

    def __post_init__(self) -> None:
        if self.parallel < 1:
            raise ConfigError(f"sweep.parallel must be >= 1, got {self.parallel}")
        if self.threads < 0:
            raise ConfigError(f"sweep.threads must be >= 0, got {self.threads}")
        if self.match_ffn and self.match_ffn not in _budget().BUDGETS:
            raise ConfigError(f"sweep.match_ffn must be one of {', '.join(_budget().BUDGETS)}, "
                              f"got {self.match_ffn!r}")


@dataclass
class SweepPoint:
    """One grid point: its stable name, its grid values and the full training config."""

    index: int
    name: str
    values: dict[str, Any]
    config: TrainConfig
    solved: dict[str, Any] = field(default_factory=dict)
    """Dotted config keys sweep.match_ffn solved for this run, with their values (empty when unmatched)."""

    @property
    def variant(self) -> str:
        """The point's variant name ("" in a sweep without variants)."""
        return self.values.get(VARIANT_KEY, "")

    def config_dict(self) -> dict[str, Any]:
        """The training config as a plain dict (what the database stores)."""
        return train_config_dict(self.config)

    @property
    def config_hash(self) -> str:
        """Hash of the full resolved training config: results and checkpoints are keyed by it."""
        return config_hash(self.config_dict())


def _flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{dotted key: leaf value} of a nested dict."""
    out: dict[str, Any] = {}
    for k, v in tree.items():
        out.update(_flatten(v, f"{prefix}{k}.") if isinstance(v, dict) else {prefix + k: v})
    return out


@functools.cache
def _later_defaults() -> dict[str, Any]:
    """{dotted key: default} of the config fields added to plelab after run hashes were introduced (the plug-in
    sections' fields too, e.g. vision.pixels: a text TrainConfig does not carry them)."""
    known = set(json.loads(HASHED_KEYS_V1.read_text())) | PLUGIN_KEYS_V1
    tree = json.loads(json.dumps(train_config_dict(TrainConfig())))
    for section, cls in PLUGIN_SECTIONS.items():
        tree[section] = json.loads(json.dumps(to_dict(typing.get_type_hints(cls)[section]())))
    defaults = _flatten(tree)
    return {k: v for k, v in defaults.items() if k not in known}


def config_hash(config: dict[str, Any]) -> str:
    """sha256 of a config dict in canonical JSON (sorted keys), so equal configs hash equal.

    A field added to plelab later is hashed only when set off its default (the rule config_diff applies), and a
    changed default is hashed as the former one (training.config.LEGACY_DEFAULTS): adding a field or changing a
    default never re-keys the runs that existing sweep files describe.
    """
    later = _later_defaults()
    leaves = {k: v for k, v in _flatten(json.loads(json.dumps(legacy_view(config)))).items()
              if not (k in later and v == later[k])}
    tree: dict[str, Any] = {}
    for key, value in leaves.items():
        *parents, leaf = key.split(".")
        node = tree
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return hashlib.sha256(json.dumps(tree, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


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
    variants: dict[str, dict[str, Any]] = field(default_factory=dict)
    """{name: {dotted key: value, and "match": false where given}} in file order; empty = no variants."""
    baseline: str = ""
    """The reference variant (sweep.baseline, else the first variant); "" without variants."""

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
        return {"sweep": options, "base": self.base, "grid": self.grid,
                **({"variants": self.variants} if self.variants else {})}


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


def _budget():
    """plelab.edge.budget, imported when a sweep first needs it."""
    from plelab.edge import budget

    return budget


def _variant_tables(variants: Any, grid: dict[str, list[Any]]) -> dict[str, dict[str, Any]]:
    """{name: {dotted key: value, ...}} with nested tables flattened (`model.ffn.kind = ...` unquoted)."""
    if not isinstance(variants, dict) or not all(isinstance(v, dict) for v in variants.values()):
        raise ConfigError("[variants] must hold one table per variant ([variants.NAME] with config keys -> values)")
    out = {}
    for name, table in variants.items():
        if format_value(name) != name:
            raise ConfigError(f"variant name {name!r} must be letters, digits, '.', '_', '+' or '-' "
                              "(it becomes part of run names)")
        flat = _flatten(table)
        if not isinstance(flat.get(MATCH_KEY, True), bool):
            raise ConfigError(f"variants.{name}.{MATCH_KEY} must be true or false, got {flat[MATCH_KEY]!r}")
        swept = sorted(set(flat) & set(grid))
        if swept:
            raise ConfigError(f"variant {name} sets {', '.join(swept)}, which the grid also sweeps")
        out[name] = flat
    return out


def _baseline(options: SweepOptions, variants: dict[str, dict[str, Any]]) -> str:
    """The reference variant's name (checked); "" without variants."""
    if not variants:
        for key in ("baseline", "match_ffn"):
            if getattr(options, key):
                raise ConfigError(f"sweep.{key} needs [variants.NAME] tables to compare")
        return ""
    baseline = options.baseline or next(iter(variants))
    if baseline not in variants:
        raise ConfigError(f"sweep.baseline {baseline!r} is not a variant; variants: {', '.join(variants)}")
    return baseline


def _variant_config(base: dict[str, Any], table: dict[str, Any], values: dict[str, Any]) -> TrainConfig:
    """The training config of one run: base, then the variant's values, then the grid point's."""
    overrides = {k: v for k, v in table.items() if k != MATCH_KEY}
    return load_train_config(base, _point_overrides(overrides) + _point_overrides(values))


def _matched(cfg: TrainConfig, reference: TrainConfig, budget: str) -> tuple[TrainConfig, dict[str, Any]]:
    """`cfg` with its model sized by budget.match_ffn against `reference`'s, and the solved dotted keys."""
    model = _budget().match_ffn(cfg.model, reference.model, budget)
    before, after = _flatten(to_dict(cfg.model)), _flatten(to_dict(model))
    solved = {f"model.{k}": v for k, v in after.items() if before.get(k) != v}
    return dataclasses.replace(cfg, model=model), solved


def _points(options: SweepOptions, base: dict[str, Any], grid: dict[str, list[Any]],
            variants: dict[str, dict[str, Any]], baseline: str) -> list[SweepPoint]:
    """Every run of the sweep: grid points in order, each crossed with the variants (file order)."""
    shorts = short_keys([VARIANT_KEY, *grid] if variants else list(grid))
    points: list[SweepPoint] = []
    seen: dict[str, dict[str, Any]] = {}
    for values in expand_grid(grid):
        built: dict[str | None, SweepPoint] = {}
        # The baseline is built first (matched variants are sized against it), the points listed in file order.
        for variant in sorted(variants, key=lambda v: v != baseline) or [None]:
            named = {VARIANT_KEY: variant, **values} if variant is not None else values
            name = run_name(named, shorts)
            if name in seen:
                raise ConfigError(f"grid points {seen[name]} and {named} both get the run name {name!r}")
            seen[name] = named
            table, solved = variants.get(variant, {}), {}
            try:
                cfg = _variant_config(base, table, values)
                if variant not in (None, baseline) and options.match_ffn and table.get(MATCH_KEY, True):
                    cfg, solved = _matched(cfg, built[baseline].config, options.match_ffn)
            except PlelabError as exc:
                where = f"grid point {name}" if variant is None else f"variant {variant} ({name})"
                raise ConfigError(f"{where}: {exc}") from exc
            built[variant] = SweepPoint(0, name, named, cfg, solved)
        points += [built[v] for v in (list(variants) or [None])]
    for i, p in enumerate(points):
        p.index = i
    return points


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
        raise ConfigError(f"unknown sweep section(s) {', '.join(unknown)}; a sweep file has [sweep], [base], [grid], "
                          "[variants.NAME]")
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
    if options.plan and path is not None and not Path(options.plan).is_absolute():
        options.plan = str((path.parent / options.plan).resolve())
    folder = Path(out or options.out or Path("runs") / options.name)
    grid = _grid_lists(data.get("grid", {}))
    base = data.get("base", {})
    variants = _variant_tables(data.get("variants", {}), grid)
    baseline = _baseline(options, variants)
    points = _points(options, base, grid, variants, baseline)
    return Sweep(options, base, grid, points, folder, source=str(path) if path else "<dict>",
                 overrides=list(overrides or []), variants=variants, baseline=baseline)
