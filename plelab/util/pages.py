"""Report pages: a list of blocks (headings, text, tables, figures) rendered as markdown and as HTML, and
written with their PNGs (and a study's records.json) in one checked step.

The .html page is self-contained: figures are embedded as base64 data: URIs and the style sheet is inline.
The .md page links the same figures as PNG files under plots/ next to it.
"""

from __future__ import annotations

import base64
import html
import json
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from plelab.util.fs import atomic_write_bytes, check_output_path
from plelab.util.tables import html_table, markdown_table

# ("h", level, text) | ("p", text) | ("list", items) | ("table", headers, rows) | ("img", stem, caption, png)
Block = tuple

CSS = """body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:1em 0;font-size:13px}td,th{border:1px solid #ccc;padding:3px 7px;text-align:right}
th{background:#f3f3f3}td:first-child,th:first-child{text-align:left}img{max-width:100%}
figure{margin:1.5em 0}figcaption{color:#555;font-size:13px}code{background:#f3f3f3;padding:0 3px}"""


def fmt(x: Any, spec: str = ".4f") -> str:
    """A number for a table cell ('-' for missing)."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    return format(x, spec)


def pm(mean: Any, std: Any, spec: str = ".4f") -> str:
    """mean +- std."""
    return f"{fmt(mean, spec)} ± {fmt(std, spec)}" if std is not None else fmt(mean, spec)


def to_markdown(blocks: Sequence[Block], image_paths: dict[str, str]) -> str:
    """Markdown; image_paths maps a figure stem to its path relative to the markdown file."""
    out = []
    for b in blocks:
        if b[0] == "h":
            out.append("#" * b[1] + " " + b[2])
        elif b[0] == "p":
            out.append(b[1])
        elif b[0] == "list":
            out.append("\n".join(f"- {item}" for item in b[1]))
        elif b[0] == "table":
            out.append(markdown_table(b[1], b[2]))
        elif b[0] == "img" and b[1] in image_paths:
            out.append(f"![{b[2]}]({image_paths[b[1]]})\n\n*{b[2]}*")
    return "\n\n".join(out) + "\n"


def _inline(text: str) -> str:
    """Escape, then render **bold** and `code` (the only markdown the blocks use)."""
    import re

    text = html.escape(text)
    text = re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", text)
    return re.sub(r"`(.+?)`", r"<code>\1</code>", text)


def to_html(blocks: Sequence[Block], title: str) -> str:
    """A self-contained HTML page: inline CSS, figures as data: URIs, no external references."""
    body = []
    for b in blocks:
        if b[0] == "h":
            body.append(f"<h{b[1]}>{_inline(b[2])}</h{b[1]}>")
        elif b[0] == "p":
            body.append(f"<p>{_inline(b[1])}</p>")
        elif b[0] == "list":
            body.append("<ul>" + "".join(f"<li>{_inline(i)}</li>" for i in b[1]) + "</ul>")
        elif b[0] == "table":
            body.append(html_table(b[1], b[2]))
        elif b[0] == "img":
            data = base64.b64encode(b[3]).decode("ascii")
            body.append(f'<figure><img alt="{html.escape(b[2])}" src="data:image/png;base64,{data}">'
                        f"<figcaption>{_inline(b[2])}</figcaption></figure>")
    return (f'<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
            f"<style>{CSS}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n")


def plain_data(obj: Any) -> Any:
    """Plain JSON data: keys as text, numpy scalars as numbers, tuples as lists, NaN and inf as None."""
    if isinstance(obj, dict):
        return {str(k): plain_data(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [plain_data(v) for v in obj]
    if hasattr(obj, "item") and not isinstance(obj, (str, bytes)):
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


RECORDS_FILE = "records.json"
"""Beside a study's report: the per-seed data it rests on (`plelab report OUT/records.json` recomputes it)."""


def write_pages(blocks: Sequence[Block], title: str, out_dir: str | Path, pngs: dict[str, bytes], *,
                plots_dir: str | Path | None = None, name: str = "report", overwrite: bool = True,
                inputs: Sequence[str | Path] = (), records: dict[str, Any] | None = None) -> list[Path]:
    """Write OUT/{name}.html, OUT/{name}.md, PLOTS/{stem}.png (default OUT/plots/) and, given `records`,
    OUT/records.json; return the paths written.

    Every target is checked before anything is written: none may be one of `inputs`, and without `overwrite`
    none may exist.
    """
    out_dir = Path(out_dir)
    plots = Path(plots_dir) if plots_dir else out_dir / "plots"
    check_output_path(out_dir, overwrite=True, is_dir=True, inputs=tuple(inputs))
    check_output_path(plots, overwrite=True, is_dir=True, inputs=tuple(inputs))
    files = {plots / f"{stem}.png": png for stem, png in pngs.items()}
    rel = {path.stem: os.path.relpath(path, out_dir) for path in files}
    pages = {out_dir / f"{name}.html": to_html(blocks, title).encode(),
             out_dir / f"{name}.md": to_markdown(blocks, rel).encode()}
    if records is not None:
        pages[out_dir / RECORDS_FILE] = json.dumps(plain_data(records), indent=1, allow_nan=False).encode()
    for path in [*pages, *files]:
        check_output_path(path, overwrite=overwrite, inputs=tuple(inputs))
    plots.mkdir(parents=True, exist_ok=True)
    for path, data in {**files, **pages}.items():
        atomic_write_bytes(path, data)
    return [*pages, *files]
