"""Sweep snapshots: a sweep's database as SQL text a repository can hold, and a new sweep folder seeded from one.

A study can outlive the machine it runs on: its run folders (checkpoints) sit on local disk, which a new machine
does not have. The database alone holds what a report needs from a finished run (config, result summary,
per-domain evaluation, timeline, the registered plan), so committing its text form keeps every finished run.
Runs unfinished when the snapshot was taken train again from their start after a restore.

With `logs`, each finished run's training log (RUN_DIR/metrics.jsonl, gzip) is kept too, once, in FILE.logs/:
for studies whose checks read the per-step curves (the FFN and tokens studies' verdicts need only the database;
a curve comparison such as the fast path's same-science check needs the logs).

The snapshot also records which prepared data the runs read (tokenizer and shard hashes from each manifest): a
restore on a machine whose data came out different (another tokenizer, other shards) is refused, since runs
trained on other tokens are not comparable with the ones still to come.
"""

from __future__ import annotations

import gzip
import json
import os
import sqlite3
import time
from pathlib import Path
from typing import Any

from plelab.errors import PlelabError
from plelab.experiments.sweep import Sweep
from plelab.experiments.sweep_runner import sweep_lock
from plelab.experiments.sweep_store import SweepStore
from plelab.runs.run_dir import METRICS_FILE
from plelab.util.fs import atomic_write_bytes

FORMAT = "plelab-sweep-snapshot/1"
HEADER = "-- " + FORMAT + " "
LOG_SUFFIX = f".{METRICS_FILE}.gz"
"""A run's training log in FILE.logs/ is <run name><LOG_SUFFIX>."""


def data_identity(path: str) -> dict[str, Any] | None:
    """What a prepared token folder holds (tokenizer sha256, every shard's sha256), or None without a manifest."""
    manifest = Path(path) / "manifest.json"
    if not path or not manifest.is_file():
        return None
    try:
        info = json.loads(manifest.read_text(encoding="utf-8"))
        return {"tokenizer_sha256": info["tokenizer"]["sha256"],
                "shards": {split: [sh["sha256"] for sh in s["shards"]] for split, s in sorted(info["splits"].items())}}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise PlelabError(f"{manifest} is not a readable token manifest ({exc})") from None


def sweep_data(sweep: Sweep) -> dict[str, dict[str, Any] | None]:
    """{data path: its identity} for every prepared data folder the sweep's runs train on."""
    return {p: data_identity(p) for p in sorted({point.config.data for point in sweep.points if point.config.data})}


def logs_dir(snapshot: str | Path) -> Path:
    """Where a snapshot keeps its runs' training logs: FILE.logs/ beside it."""
    return Path(f"{snapshot}.logs")


def _save_logs(sweep: Sweep, copy: sqlite3.Connection, out: str | Path) -> int:
    """Copy each finished run's metrics.jsonl (gzip) into FILE.logs/ unless already there; returns how many."""
    folder, written = logs_dir(out), 0
    for (name,) in copy.execute("SELECT name FROM runs WHERE status = 'done' ORDER BY idx"):
        src, dest = sweep.run_dir(name) / METRICS_FILE, folder / f"{name}{LOG_SUFFIX}"
        if dest.is_file() or not src.is_file():  # a finished run's log does not change
            continue
        folder.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(dest, gzip.compress(src.read_bytes(), mtime=0))  # mtime 0: same log, same bytes
        written += 1
    return written


def _read_logs(source: str | Path) -> dict[str, bytes]:
    """{run: its training log} for every log in FILE.logs/, each checked to decompress."""
    out, folder = {}, logs_dir(source)
    for path in sorted(folder.glob(f"*{LOG_SUFFIX}")) if folder.is_dir() else []:
        try:
            out[path.name[: -len(LOG_SUFFIX)]] = gzip.decompress(path.read_bytes())
        except (OSError, EOFError) as exc:
            raise PlelabError(f"{path} is damaged ({exc}); nothing was restored") from None
    return out


def write_snapshot(sweep: Sweep, out: str | Path, logs: bool = False) -> dict[str, Any]:
    """Write the sweep database as SQL text (atomically) with a header naming the sweep and its data; with
    `logs`, also the finished runs' training logs not yet in FILE.logs/."""
    if not sweep.db_path.is_file():
        raise PlelabError(f"{sweep.folder} has no database yet ({sweep.db_path}): nothing to snapshot")
    if Path(out).exists():  # replaced only when it is this sweep's own earlier snapshot
        try:
            other = read_header(out).get("sweep")
        except PlelabError:
            raise PlelabError(f"{out} exists and is not a sweep snapshot: refusing to replace it") from None
        if other != sweep.options.name:
            raise PlelabError(f"{out} is a snapshot of sweep {other!r}, not {sweep.options.name!r}: refusing to "
                              "replace it")
    with SweepStore(sweep.db_path, readonly=True) as store:
        copy = sqlite3.connect(":memory:")
        store.db.backup(copy)  # one consistent read, even while a sweep writes (WAL)
    counts = dict(copy.execute("SELECT status, count(*) FROM runs GROUP BY status").fetchall())
    body = "\n".join(copy.iterdump()) + "\n"
    logs_written = _save_logs(sweep, copy, out) if logs else 0
    copy.close()
    header = {"sweep": sweep.options.name, "taken": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "runs": counts, "data": sweep_data(sweep)}
    if _body(out) == body:  # nothing new since the last snapshot: leave the file (and its git history) alone
        return {**read_header(out), "unchanged": True, "logs_written": logs_written}
    atomic_write_bytes(out, (HEADER + json.dumps(header, sort_keys=True) + "\n" + body).encode("utf-8"))
    return {**header, "logs_written": logs_written}


def _body(path: str | Path) -> str | None:
    """A snapshot file's SQL (without its header line), or None when there is no such file."""
    try:
        return Path(path).read_text(encoding="utf-8").split("\n", 1)[1]
    except (OSError, UnicodeDecodeError, IndexError):
        return None


def read_header(path: str | Path) -> dict[str, Any]:
    """A snapshot file's header, checked to be one."""
    path = Path(path)
    try:
        with open(path, encoding="utf-8") as f:
            first = f.readline()
        if not first.startswith(HEADER):
            raise ValueError(f"its first line is not '{HEADER.strip()} {{...}}'")
        return json.loads(first[len(HEADER):])
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        raise PlelabError(f"{path} is not a plelab sweep snapshot ({exc})") from None


def restore_snapshot(sweep: Sweep, source: str | Path) -> dict[str, Any]:
    """Seed the sweep's new database from a snapshot; unfinished runs in it become pending (their work is gone).

    Refused when the sweep folder already has a database (nothing is overwritten), when the snapshot is of
    another sweep, or when the data the runs read differs from the data the snapshot's runs were trained on.
    """
    header = read_header(source)
    if header.get("sweep") != sweep.options.name:
        raise PlelabError(f"{source} is a snapshot of sweep {header.get('sweep')!r}, not {sweep.options.name!r}")
    if sweep.db_path.exists():
        raise PlelabError(f"{sweep.db_path} exists: a snapshot seeds only a sweep folder without a database "
                          "(move it aside to restore)")
    now = sweep_data(sweep)
    for path, was in (header.get("data") or {}).items():
        if was is None:
            continue
        if now.get(path) is None:
            raise PlelabError(f"the snapshot's runs read {path}, which is not prepared here: prepare it first "
                              "(with the same tokenizer settings), then restore")
        if now[path] != was:
            raise PlelabError(f"{path} differs from the data the snapshot's runs were trained on (tokenizer "
                              f"{was['tokenizer_sha256'][:12]} then, {now[path]['tokenizer_sha256'][:12]} now, or "
                              "other shards): runs on other tokens are not comparable; restore refused")
    try:
        sql = Path(source).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise PlelabError(f"cannot read {source} ({exc})") from None
    with sweep_lock(sweep.folder):  # no sweep may start in the folder meanwhile
        if sweep.db_path.exists():
            raise PlelabError(f"{sweep.db_path} appeared while restoring; nothing was restored")
        logs = _read_logs(source)  # all read before anything is written
        counts, done = _load_sql(sql, sweep.db_path, source)
        restored = [name for name in done if name in logs]
        for name in restored:  # a finished run's folder holds only its log: it is not trained again
            sweep.run_dir(name).mkdir(parents=True, exist_ok=True)
            atomic_write_bytes(sweep.run_dir(name) / METRICS_FILE, logs[name])
    return {**header, "restored": counts, "logs_restored": len(restored)}


def _load_sql(sql: str, db_path: Path, source: str | Path) -> tuple[dict[str, int], list[str]]:
    """Build the database from SQL text in a temp file, mark unfinished runs pending, then move it into place.

    Returns the runs' counts by status and the finished runs' names."""
    tmp = db_path.with_name(f".{db_path.name}.{os.getpid()}.restore")
    tmp.unlink(missing_ok=True)
    try:
        db = sqlite3.connect(tmp)
        try:
            db.executescript(sql)
            with db:
                db.execute("UPDATE runs SET status = 'pending', pid = NULL, host = NULL WHERE status != 'done'")
            counts = dict(db.execute("SELECT status, count(*) FROM runs GROUP BY status").fetchall())
            done = [r[0] for r in db.execute("SELECT name FROM runs WHERE status = 'done' ORDER BY idx")]
        finally:
            db.close()
        SweepStore(tmp, readonly=True).close()  # every page reads back (runs, read above, is the sweep's table)
        os.replace(tmp, db_path)
    except sqlite3.DatabaseError as exc:
        raise PlelabError(f"{source} does not load as a sweep database ({exc}); nothing was restored") from None
    finally:
        for leftover in (tmp, tmp.with_name(tmp.name + "-wal"), tmp.with_name(tmp.name + "-shm")):
            leftover.unlink(missing_ok=True)
    return counts, done
