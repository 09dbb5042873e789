"""Typed dataclass configs: field docstrings, loading from TOML/YAML/JSON, dotted overrides.

One mechanism for every config in plelab (model, training, sweeps). A config is a plain
dataclass whose fields carry attribute docstrings (a string literal right after the field),
which `field_docs` reads back so `--help` and error messages can quote them.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import functools
import inspect
import json
import math
import textwrap
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

from plelab.errors import PlelabError

T = TypeVar("T")


class ConfigError(PlelabError, ValueError):
    """A config that cannot be built: unknown key, wrong type or failed validation."""


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """Return {field name: docstring} read from the attribute docstrings of a dataclass."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError):
            continue
        body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
        for node, nxt in zip(body, body[1:], strict=False):
            if (
                isinstance(node, ast.AnnAssign)
                and isinstance(node.target, ast.Name)
                and isinstance(nxt, ast.Expr)
                and isinstance(nxt.value, ast.Constant)
                and isinstance(nxt.value.value, str)
            ):
                docs[node.target.id] = " ".join(nxt.value.value.split())
    return docs


def _resolved_hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _coerce(value: Any, hint: Any, where: str) -> Any:
    """Convert a value parsed from a file or the command line into the annotated type."""
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None or (isinstance(value, str) and value.lower() in ("none", "null")):
            if type(None) in args:
                return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, where)
            except ConfigError as exc:
                errors.append(str(exc))
        raise ConfigError(errors[0] if errors else f"{where}: cannot use {value!r}")
    if dataclasses.is_dataclass(hint):
        if isinstance(value, hint):
            return value
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a table of fields, got {value!r}")
        return from_dict(hint, value, prefix=where + ".")
    if origin in (list, tuple):
        if isinstance(value, str):
            value = [v for v in (s.strip() for s in value.split(",")) if v] if value.strip() else []
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        inner = args[0] if args else Any
        items = [_coerce(v, inner, f"{where}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a table, got {value!r}")
        return dict(value)
    if origin is typing.Literal:
        if value not in args:
            choices = ", ".join(repr(a) for a in args)
            raise ConfigError(f"{where} must be one of {choices}, got {value!r}")
        return value
    if hint is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "1", "yes", "on", "false", "0", "no", "off"):
            return value.lower() in ("true", "1", "yes", "on")
        raise ConfigError(f"{where}: expected true/false, got {value!r}")
    if hint is int:
        if isinstance(value, bool):
            raise ConfigError(f"{where}: expected an integer, got {value!r}")
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str):
            try:
                return int(value.replace("_", ""))
            except ValueError:
                pass
        raise ConfigError(f"{where}: expected an integer, got {value!r}")
    if hint is float:
        number = None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            number = float(value)
        elif isinstance(value, str):
            with contextlib.suppress(ValueError):
                number = float(value.replace("_", ""))
        if number is None:
            raise ConfigError(f"{where}: expected a number, got {value!r}")
        # TOML, YAML and JSON (as Python parses it) all accept nan/inf; no config field means either.
        if not math.isfinite(number):
            raise ConfigError(f"{where}: expected a finite number, got {value!r}")
        return number
    if hint is str:
        if isinstance(value, (dict, list)):
            raise ConfigError(f"{where}: expected a string, got {value!r}")
        return str(value)
    return value


def from_dict(cls: type[T], data: dict[str, Any], prefix: str = "") -> T:
    """Build dataclass `cls` from a nested dict, rejecting unknown keys with a clear message."""
    hints = _resolved_hints(cls)
    names = {f.name for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ConfigError(
            f"unknown config key(s) {', '.join(prefix + u for u in unknown)}; "
            f"known: {', '.join(sorted(names))}"
        )
    kwargs = {k: _coerce(v, hints[k], prefix + k) for k, v in data.items()}
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{prefix or cls.__name__}: {exc}") from exc


LATER = {"omit_at_default": True}
"""Field metadata (`field(..., metadata=LATER)`) of a field added after files were written from its dataclass:
`to_dict` leaves it out while it holds its default, so a config that does not use it is written exactly as before
(checkpoint configs, the .ple header, hashes), and `from_dict` gives it its default back."""


def _default(f: dataclasses.Field) -> Any:
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


def _plain(obj: Any) -> Any:
    """`dataclasses.asdict`, leaving out LATER fields at their defaults."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: _plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)
                if not (f.metadata.get("omit_at_default") and getattr(obj, f.name) == _default(f))}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    return obj


def to_dict(obj: Any) -> dict[str, Any]:
    """Plain nested dict of a dataclass config (JSON/TOML friendly); LATER fields only where set off default."""
    return json.loads(json.dumps(_plain(obj)))


def parse_override(text: str) -> tuple[str, Any]:
    """Split `a.b=value` into a key path and a value parsed as JSON when possible."""
    if "=" not in text:
        raise ConfigError(f"override {text!r} must look like key=value (e.g. ple.dim=128)")
    key, raw = text.split("=", 1)
    key = key.strip()
    if not key:
        raise ConfigError(f"override {text!r} has an empty key")
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        value = raw
    return key, value


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply dotted `key=value` overrides to a nested dict (returns a new dict)."""
    out = json.loads(json.dumps(data))
    for text in overrides:
        key, value = parse_override(text)
        node = out
        parts = key.split(".")
        for part in parts[:-1]:
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                raise ConfigError(f"override {text!r}: {part!r} is not a table")
            node = child
        node[parts[-1]] = value
    return out


def read_file(path: str | Path) -> dict[str, Any]:
    """Read a TOML, YAML or JSON config file into a dict, with a clear error on failure."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"config file {path} is not UTF-8 text (byte {exc.start}); save it as UTF-8") from exc
    suffix = path.suffix.lower()
    try:
        if suffix == ".toml":
            try:
                import tomllib
            except ModuleNotFoundError:  # Python 3.10
                import tomli as tomllib  # type: ignore[no-redef]
            data = tomllib.loads(text)
        elif suffix in (".yaml", ".yml"):
            import yaml

            data = yaml.safe_load(text) or {}
        elif suffix == ".json":
            data = json.loads(text)
        else:
            raise ConfigError(f"config file {path}: use .toml, .yaml or .json")
    except ConfigError:
        raise
    except Exception as exc:  # parser errors differ per format; report them uniformly
        raise ConfigError(f"config file {path} is not valid {suffix[1:].upper()}: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a table of keys at the top level")
    return data


def describe(cls: type, prefix: str = "") -> list[tuple[str, str, str]]:
    """List (dotted key, default, docstring) for every field, descending into nested configs."""
    rows = []
    docs = field_docs(cls)
    hints = _resolved_hints(cls)
    inst = cls()
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        val = getattr(inst, f.name)
        if dataclasses.is_dataclass(hint):
            rows.extend(describe(hint, prefix + f.name + "."))
        else:
            rows.append((prefix + f.name, repr(val), docs.get(f.name, "")))
    return rows
