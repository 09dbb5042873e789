"""The sweep database (SWEEP_DIR/sweep.sqlite): every run's config, status, metrics summary, final evaluation
and evaluation timeline (per-domain loss at the run's `eval_timeline` steps).

Every change is one transaction (`with self.db:` commits or rolls back), and SQLite's journal makes a
transaction all-or-nothing even when the process is killed in the middle, so the database is always
consistent: a run is `done` together with its evaluation rows, or not at all.
WAL mode lets `plelab sweep --status` and `plelab report` read while a sweep writes.
"""

from __future__ import annotations

import json
import socket
import sqlite3
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from plelab.errors import PlelabError

STATUSES = ("pending", "running", "done", "failed")

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS runs (
    name TEXT PRIMARY KEY,
    idx INTEGER NOT NULL,
    in_grid INTEGER NOT NULL DEFAULT 1,
    point TEXT NOT NULL,
    config TEXT NOT NULL,
    status TEXT NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'running', 'done', 'failed')),
    attempts INTEGER NOT NULL DEFAULT 0,
    pid INTEGER, host TEXT, started REAL, finished REAL, error TEXT,
    ple_dim INTEGER, seed INTEGER, max_steps INTEGER, steps INTEGER, tokens INTEGER, train_seconds REAL,
    params_total INTEGER, params_base INTEGER, params_added INTEGER,
    train_loss REAL, eval_loss REAL, eval_bpb REAL,
    verdict_early TEXT, verdict_final TEXT, early_step INTEGER, early_matches INTEGER,
    summary TEXT
);
CREATE TABLE IF NOT EXISTS evals (
    run TEXT NOT NULL REFERENCES runs(name) ON DELETE CASCADE,
    domain TEXT NOT NULL,
    loss REAL, bpb REAL, tokens INTEGER, loss_se REAL, windows INTEGER, sample TEXT,
    PRIMARY KEY (run, domain)
);
CREATE TABLE IF NOT EXISTS timeline (
    run TEXT NOT NULL REFERENCES runs(name) ON DELETE CASCADE,
    step INTEGER NOT NULL,
    tokens INTEGER,
    domain TEXT NOT NULL,
    loss REAL, bpb REAL,
    PRIMARY KEY (run, step, domain)
);
"""
# CREATE TABLE IF NOT EXISTS: a database written before a table existed gains it, empty, when opened; a column
# added later is added to an older table by ADDED_COLUMNS (NULL in the rows written before it).
ADDED_COLUMNS = {"evals": (("loss_se", "REAL"), ("windows", "INTEGER"), ("sample", "TEXT"))}

# Columns of `runs` filled from a finished run's result summary (see sweep_runner.collect_result).
RESULT_COLUMNS = (
    "steps", "tokens", "train_seconds", "params_total", "params_base", "params_added", "train_loss", "eval_loss",
    "eval_bpb", "verdict_early", "verdict_final", "early_step", "early_matches",
)


def config_diff(old: dict[str, Any], new: dict[str, Any], defaults: dict[str, Any] | None = None,
                prefix: str = "") -> list[str]:
    """Dotted keys whose values differ between two nested config dicts.

    A key the old config lacks (a field added to plelab after the run started) counts as unchanged when the new
    value is that field's default in `defaults`: the old code behaved as the default does.
    """
    defaults = defaults or {}
    out = []
    for k in sorted(set(old) | set(new)):
        a, b, d = old.get(k), new.get(k), defaults.get(k)
        if isinstance(a, dict) and isinstance(b, dict):
            out += config_diff(a, b, d if isinstance(d, dict) else {}, f"{prefix}{k}.")
        elif k not in old and k in defaults and b == d:
            continue
        elif a != b:
            out.append(prefix + k)
    return out


def _cannot_write(exc: sqlite3.DatabaseError) -> bool:
    """Whether an SQLite error means 'not allowed to write here' rather than 'damaged'."""
    text = str(exc).lower()
    return any(m in text for m in ("readonly", "read-only", "unable to open", "permission", "disk i/o"))


class SweepStore:
    """Read and write the sweep database; safe to open from several processes at once."""

    def __init__(self, path: str | Path, readonly: bool = False):
        """readonly: only read (reports, --status); a sweep folder that cannot be written to is read as it is."""
        self.path = Path(path)
        self.readonly = readonly
        if not readonly:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        self.db: sqlite3.Connection | None = None
        try:
            self.db = self._connect()
            self.db.row_factory = sqlite3.Row
            # quick_check reads every page (the database is small) so damage is found before anything is written.
            if self.db.execute("PRAGMA quick_check").fetchone()[0] != "ok":
                raise sqlite3.DatabaseError("damaged pages")
            if readonly:
                self._schema_for_reading()
            else:
                self.db.execute("PRAGMA journal_mode=WAL")
                self.db.execute("PRAGMA foreign_keys=ON")
                with self.db:
                    self.db.executescript(SCHEMA)
                    for table, columns in ADDED_COLUMNS.items():
                        have = {r["name"] for r in self.db.execute(f"PRAGMA table_info({table})")}
                        for name, kind in columns:
                            if name not in have:
                                self.db.execute(f"ALTER TABLE {table} ADD COLUMN {name} {kind}")
        except sqlite3.DatabaseError as exc:
            if self.db is not None:
                self.db.close()
            if _cannot_write(exc):  # a read-only folder or file: the records are fine, never advise moving them
                raise PlelabError(f"cannot open {self.path} for writing ({exc}): the file is missing or its folder "
                                  "or the file is read-only; reports and --status read it as it is") from None
            raise PlelabError(f"{self.path} is not a readable sweep database ({exc}); move it aside to start "
                              "the sweep's records afresh (run folders and their result.json are kept)") from None

    def _connect(self) -> sqlite3.Connection:
        # timeout: wait for another process's write transaction instead of failing at once.
        if not self.readonly:
            return sqlite3.connect(self.path, timeout=60.0)
        if not self.path.is_file():
            raise sqlite3.OperationalError("unable to open database file: no such file")
        uri = self.path.resolve().as_uri()
        db = sqlite3.connect(f"{uri}?mode=ro", uri=True, timeout=60.0)
        try:
            db.execute("SELECT count(*) FROM sqlite_master").fetchone()
            return db
        except sqlite3.OperationalError:
            # A WAL database in a folder nobody may write to: its -shm file cannot be made, so read the file as an
            # unchanging one (nothing can be writing to it there).
            db.close()
            return sqlite3.connect(f"{uri}?immutable=1", uri=True, timeout=60.0)

    def _schema_for_reading(self) -> None:
        """Tables a database written by an older plelab lacks, as empty temporary ones (reads see them empty)."""
        have = {r[0] for r in self.db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        for statement in SCHEMA.split(";"):
            words = statement.split()
            if len(words) > 5 and words[5] not in have:  # CREATE TABLE IF NOT EXISTS <name>
                self.db.execute(statement.replace("CREATE TABLE", "CREATE TEMP TABLE", 1))
        # Columns added since (ADDED_COLUMNS) read as NULL: a temporary view shadows the table of that name.
        for table, columns in ADDED_COLUMNS.items():
            if table not in have:
                continue
            cols = {r[1] for r in self.db.execute(f"PRAGMA main.table_info({table})")}
            missing = [name for name, _ in columns if name not in cols]
            if missing:
                extra = ", ".join(f"NULL AS {name}" for name in missing)
                self.db.execute(f"CREATE TEMP VIEW {table} AS SELECT *, {extra} FROM main.{table}")

    def close(self) -> None:
        """Close the connection."""
        self.db.close()

    def __enter__(self) -> SweepStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----------------------------------------------------------------- writes
    def set_meta(self, **values: Any) -> None:
        """Store sweep-level facts (name, grid, source) as JSON values."""
        with self.db:
            self.db.executemany("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)",
                                [(k, json.dumps(v)) for k, v in values.items()])

    def sync_points(self, points: Iterable[Any]) -> None:
        """Insert new grid points as pending, refresh unfinished ones; a finished run keeps its recorded config.

        The caller has already refused (or reset) finished runs whose config differs (sweep_runner.reconcile_configs).
        """
        with self.db:
            names = []
            for p in points:
                names.append(p.name)
                config = p.config_dict()
                row = self.db.execute("SELECT status, config FROM runs WHERE name = ?", (p.name,)).fetchone()
                fields = dict(idx=p.index, point=json.dumps(p.values), config=json.dumps(config),
                              ple_dim=p.config.model.ple.dim, seed=p.config.seed, max_steps=p.config.max_steps)
                if row is None:
                    cols = ", ".join(fields)
                    self.db.execute(f"INSERT INTO runs (name, {cols}) VALUES (?{', ?' * len(fields)})",
                                    (p.name, *fields.values()))
                elif row["status"] == "done":
                    self.db.execute("UPDATE runs SET idx = ?, in_grid = 1 WHERE name = ?", (p.index, p.name))
                else:
                    sets = ", ".join(f"{k} = ?" for k in fields)
                    self.db.execute(f"UPDATE runs SET {sets}, in_grid = 1 WHERE name = ?", (*fields.values(), p.name))
            marks = ",".join("?" * len(names))
            self.db.execute(f"UPDATE runs SET in_grid = 0 WHERE name NOT IN ({marks})", names)

    def forget(self, name: str) -> None:
        """Drop a run's row and evaluations (it is being redone from scratch)."""
        with self.db:
            self.db.execute("DELETE FROM runs WHERE name = ?", (name,))

    def row(self, name: str) -> dict[str, Any] | None:
        """One run's row (config decoded), or None."""
        row = self.db.execute("SELECT * FROM runs WHERE name = ?", (name,)).fetchone()
        return None if row is None else {**dict(row), "config": json.loads(row["config"])}

    def mark_running(self, name: str, pid: int) -> None:
        """A run starts (or resumes): count the attempt, remember who runs it."""
        with self.db:
            self.db.execute(
                "UPDATE runs SET status = 'running', attempts = attempts + 1, pid = ?, host = ?, started = ?, "
                "error = NULL WHERE name = ?", (pid, socket.gethostname(), time.time(), name))

    def mark_done(self, name: str, result: dict[str, Any]) -> None:
        """A run finished: its summary, headline numbers, per-domain evaluation and timeline, in one transaction."""
        domains = ((result.get("final_eval") or {}).get("domains") or {}).items()
        values = [result.get(c) for c in RESULT_COLUMNS]
        sets = ", ".join(f"{c} = ?" for c in RESULT_COLUMNS)
        with self.db:
            self.db.execute(
                f"UPDATE runs SET status = 'done', finished = ?, error = NULL, summary = ?, {sets} WHERE name = ?",
                (time.time(), json.dumps(result), *values, name))
            self.db.execute("DELETE FROM evals WHERE run = ?", (name,))
            self.db.executemany(
                "INSERT INTO evals (run, domain, loss, bpb, tokens, loss_se, windows, sample) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                [(name, d, r.get("loss"), r.get("bpb"), r.get("tokens"), r.get("loss_se"), r.get("windows"),
                  r.get("sample")) for d, r in sorted(domains)])
            self.db.execute("DELETE FROM timeline WHERE run = ?", (name,))
            self.db.executemany(
                "INSERT INTO timeline (run, step, tokens, domain, loss, bpb) VALUES (?, ?, ?, ?, ?, ?)",
                [(name, point["step"], point.get("tokens"), d, r.get("loss"), r.get("bpb"))
                 for point in result.get("timeline") or [] for d, r in sorted(point["domains"].items())])

    def mark_failed(self, name: str, error: str) -> None:
        """A run raised: keep the error (its checkpoints stay; the next sweep invocation resumes it)."""
        with self.db:
            self.db.execute("UPDATE runs SET status = 'failed', finished = ?, error = ? WHERE name = ?",
                            (time.time(), error, name))

    def mark_pending(self, name: str) -> None:
        """A run was interrupted on purpose (Ctrl-C): it will resume next time."""
        with self.db:
            self.db.execute("UPDATE runs SET status = 'pending', pid = NULL WHERE name = ?", (name,))

    # ----------------------------------------------------------------- reads
    def meta(self) -> dict[str, Any]:
        """Sweep-level facts."""
        return {r["key"]: json.loads(r["value"]) for r in self.db.execute("SELECT key, value FROM meta")}

    def runs(self, in_grid_only: bool = True) -> list[dict[str, Any]]:
        """Every run row as a dict (point, config and summary decoded), in grid order."""
        sql = "SELECT * FROM runs" + (" WHERE in_grid = 1" if in_grid_only else "") + " ORDER BY in_grid DESC, idx"
        out = []
        for row in self.db.execute(sql):
            d = dict(row)
            for key in ("point", "config", "summary"):
                d[key] = json.loads(d[key]) if d[key] else None
            out.append(d)
        return out

    def status_of(self, name: str) -> str | None:
        """Status of one run (None if unknown)."""
        row = self.db.execute("SELECT status FROM runs WHERE name = ?", (name,)).fetchone()
        return row["status"] if row else None

    def evals(self) -> dict[str, dict[str, dict[str, float]]]:
        """{run: {domain: {loss, bpb, tokens, loss_se, windows, sample}}} of the final evaluations.

        `sample` is how the tokens were picked (plelab.inference.evaluate); None for a row recorded before it
        was stored (a text domain was then read from its start: "head").
        """
        out: dict[str, dict[str, dict[str, float]]] = {}
        for r in self.db.execute("SELECT * FROM evals ORDER BY run, domain"):
            out.setdefault(r["run"], {})[r["domain"]] = {
                "loss": r["loss"], "bpb": r["bpb"], "tokens": r["tokens"], "loss_se": r["loss_se"],
                "windows": r["windows"], "sample": r["sample"]}
        return out

    def timeline(self) -> dict[str, list[dict[str, Any]]]:
        """{run: [{"step", "tokens", "domains": {domain: {"loss", "bpb"}}}]} in step order (finished runs)."""
        out: dict[str, list[dict[str, Any]]] = {}
        for r in self.db.execute("SELECT * FROM timeline ORDER BY run, step, domain"):
            points = out.setdefault(r["run"], [])
            if not points or points[-1]["step"] != r["step"]:
                points.append({"step": r["step"], "tokens": r["tokens"], "domains": {}})
            points[-1]["domains"][r["domain"]] = {"loss": r["loss"], "bpb": r["bpb"]}
        return out
