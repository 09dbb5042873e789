"""Running a sweep: every grid point trained into its run folder, resumably, and recorded in the database.

Resumability rests on three facts: a run folder resumes from its newest checkpoint (Trainer(resume=True)),
a finished run writes RUN_DIR/result.json atomically before the database marks it done (so a kill between
the two loses no training), and the database skips runs marked done. A killed sweep therefore continues
where it stopped when started again; the run it was in resumes from its checkpoint.

A run's checkpoints and result belong to the config it was started with (RUN_DIR/sweep_config.json holds it
and its hash). When the sweep file later asks for another config, that work is never reused or resumed under
the new values: the sweep refuses, naming the runs and fields, or with `restart_changed` moves the old run
folder to SWEEP_DIR/superseded/ and trains the run again from scratch.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any, TextIO

from plelab.errors import PlelabError
from plelab.experiments.sweep import RESOLVED_FILE, Sweep, SweepPoint
from plelab.experiments.sweep_store import SweepStore, config_diff
from plelab.runs.lock import RUN_LOCK, SWEEP_LOCK, FolderLock
from plelab.runs.metrics import read_metrics
from plelab.training.callbacks import Callback
from plelab.training.config import TrainConfig, legacy_view, train_config_dict
from plelab.util.fs import atomic_write_bytes, check_output_path, pid_alive

RESULT_FILE = "result.json"
"""In a run folder: the run's result summary, written once it has finished training and evaluating."""
CONFIG_FILE = "sweep_config.json"
"""In a run folder: the full resolved config (and its hash) the run's checkpoints and result were made with."""
SUPERSEDED_DIR = "superseded"
"""In the sweep folder: run folders set aside by `restart_changed` because the sweep now asks for another config."""
LOG_FILE = "train.log"
"""In a run folder: the trainer's progress lines (appended on every attempt)."""
ERROR_FILE = "error.txt"
"""In a run folder: the traceback of the last failed attempt (removed when an attempt succeeds)."""
TAIL_FRACTION = 0.1
"""The recorded training loss is the mean over this final fraction of the logged steps (less noisy than one step)."""


class SweepLocked(PlelabError):
    """Another process is running this sweep."""


class ConfigChanged(PlelabError):
    """Runs whose checkpoints or result were made with another config than the sweep now asks for."""


def _has_work(run_dir: Path) -> bool:
    return (run_dir / RESULT_FILE).is_file() or any((run_dir / "checkpoints").glob("step_*"))


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise PlelabError(f"{path} is damaged ({exc}); move the run folder aside to retrain it") from None


def started_config(run_dir: Path, row: dict[str, Any] | None) -> dict[str, Any] | None:
    """The config a run's existing work (checkpoints, result, a `done` database row) was made with, else None."""
    if _has_work(run_dir):
        if (run_dir / CONFIG_FILE).is_file():
            return _read_json(run_dir / CONFIG_FILE)["config"]
        if (run_dir / "config.json").is_file():  # a run started before sweep_config.json existed
            return _read_json(run_dir / "config.json")
    if row is not None and row["status"] == "done":
        return row["config"]
    return None


def changed_fields(point: SweepPoint, run_dir: Path, row: dict[str, Any] | None) -> list[str]:
    """Dotted config keys where the point now differs from what its existing work was made with."""
    old = started_config(run_dir, row)
    # JSON round trip: the recorded config went through JSON (tuples became lists), compare like with like.
    if old is None:
        return []
    defaults = json.loads(json.dumps(train_config_dict(TrainConfig())))
    return config_diff(legacy_view(old), json.loads(json.dumps(legacy_view(point.config_dict()))), defaults)


def _fields_text(fields: list[str], limit: int = 6) -> str:
    more = f" and {len(fields) - limit} more" if len(fields) > limit else ""
    return ", ".join(fields[:limit]) + more


def reconcile_configs(sweep: Sweep, store: SweepStore, restart_changed: bool = False) -> list[str]:
    """Refuse runs whose work was made with another config; with `restart_changed`, set them aside to redo.

    Returns one message per run set aside; raises ConfigChanged (naming runs and fields) otherwise.
    """
    changed = {}
    for p in sweep.points:
        fields = changed_fields(p, sweep.run_dir(p), store.row(p.name))
        if fields:
            changed[p.name] = fields
    if changed and not restart_changed:
        runs = "; ".join(f"{name} ({_fields_text(fields)})" for name, fields in changed.items())
        raise ConfigChanged(f"the sweep now asks for another config than these runs were trained with: {runs}; "
                            "restore the old values, or pass --restart-changed to retrain them from scratch "
                            f"(their old folders move to {sweep.folder / SUPERSEDED_DIR})")
    messages = []
    for name, fields in changed.items():
        run_dir = sweep.run_dir(name)
        where = "no folder"
        if run_dir.exists():
            dest = sweep.folder / SUPERSEDED_DIR / f"{name}@{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
            dest.parent.mkdir(parents=True, exist_ok=True)
            os.rename(run_dir, dest)
            where = f"old folder moved to {dest}"
        store.forget(name)
        messages.append(f"{name}: config changed ({_fields_text(fields)}); {where}; training it again")
    return messages


def stamp_config(point: SweepPoint, run_dir: Path) -> None:
    """Record the config the run is trained with; refuse a folder whose work belongs to another config."""
    fields = changed_fields(point, run_dir, None)
    if fields:
        raise ConfigChanged(f"{run_dir} was trained with another config ({_fields_text(fields)}); "
                            "rerun `plelab sweep` with --restart-changed to retrain it")
    if not (run_dir / CONFIG_FILE).is_file() or not _has_work(run_dir):
        record = {"config_hash": point.config_hash, "config": point.config_dict()}
        atomic_write_bytes(run_dir / CONFIG_FILE, json.dumps(record, indent=2).encode())


@contextlib.contextmanager
def run_lock(run_dir: Path):
    """Hold the run folder's lock (the trainer's own), waiting for a previous holder (an orphaned run finishing
    its last step) to let go; the Trainer built inside takes it again (the lock is re-entrant in a process)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    with FolderLock(run_dir, RUN_LOCK, wait=True, share=True):
        yield


@contextlib.contextmanager
def sweep_lock(folder: Path):
    """Hold SWEEP_DIR/.lock for the duration (released by the OS even if the holder is killed)."""
    folder.mkdir(parents=True, exist_ok=True)
    with FolderLock(folder, SWEEP_LOCK, busy=lambda pid: SweepLocked(
            f"another `plelab sweep` (pid {pid}) is running {folder}")):
        yield


def _diagnostics(run_dir: Path) -> dict[str, Any]:
    """Early/final verdicts and the per-layer numbers the report plots, from RUN_DIR/diagnostics/final.json."""
    path = run_dir / "diagnostics" / "final.json"
    if not path.is_file():
        return {}
    data = json.loads(path.read_text())
    report = data.get("report") or {}
    layers = []
    for rec in report.get("layers", []):
        table = {view: {k: v.get(k) for k in ("metrics", "random_empirical", "random_like")}
                 for view, v in (rec.get("table") or {}).items() if isinstance(v, dict) and "metrics" in v}
        layers.append({k: rec.get(k) for k in ("layer", "verdict", "injection_ratio", "gate_mean_abs",
                                                "ablation_delta_loss", "ablation_se")} | {"table": table})
    matches = data.get("early_matches_final") or {}
    return {"final": data.get("summary") or {"verdict": data.get("verdict")}, "early": data.get("early"),
            "early_matches_final": matches, "layers": layers, "overall": report.get("overall")}


def read_timeline(run_dir: Path) -> list[dict[str, Any]]:
    """The run's timeline evaluations ("timeline": true lines of metrics.jsonl) as [{step, tokens, domains}]."""
    _, evals = read_metrics(run_dir)
    return [{"step": m["step"], "tokens": m.get("tokens"),
             "domains": {d: {"loss": r.get("loss"), "bpb": r.get("bpb")} for d, r in m["eval"]["domains"].items()}}
            for m in evals if m.get("timeline")]


def collect_result(point: SweepPoint, run_dir: Path, final: dict[str, Any], wall: float) -> dict[str, Any]:
    """The run's summary: headline numbers, final evaluation per domain, timeline, parameter counts, diagnostics."""
    train, _ = read_metrics(run_dir)
    losses = [m["loss"] for m in train if m.get("loss") is not None]
    tail = losses[-max(1, round(TAIL_FRACTION * len(losses))):] if losses else []
    params = point.config.param_counts()
    final_eval = final.get("final_eval") or {}
    diag = _diagnostics(run_dir)
    matches = diag.get("early_matches_final") or {}
    return {
        "name": point.name, "point": point.values, "solved": point.solved, "config_hash": point.config_hash,
        "steps": train[-1]["step"] if train else None,
        "tokens": train[-1].get("tokens") if train else None,
        "train_seconds": sum(m.get("step_time", 0.0) for m in train), "wall_seconds_last_attempt": wall,
        "params_total": params["total"], "params_base": params["base_total"], "params_added": params["ple_added"],
        "train_loss": sum(tail) / len(tail) if tail else None,
        "eval_loss": (final_eval.get("macro") or {}).get("loss"),
        "eval_bpb": (final_eval.get("macro") or {}).get("bpb"),
        "final_eval": final_eval,
        "timeline": read_timeline(run_dir),
        "verdict_final": (diag.get("final") or {}).get("verdict"),
        "verdict_early": (diag.get("early") or {}).get("verdict"),
        "early_step": (diag.get("early") or {}).get("step"),
        "early_matches": None if "verdict" not in matches else int(bool(matches["verdict"])),
        "diagnostics": diag,
    }


class _Tee:
    """Write to a log file and, optionally, to the console."""

    def __init__(self, log: TextIO, console: TextIO | None):
        self.log, self.console = log, console

    def write(self, text: str) -> int:
        self.log.write(text)
        if self.console is not None:
            self.console.write(text)
        return len(text)

    def flush(self) -> None:
        self.log.flush()
        if self.console is not None:
            self.console.flush()


class ParentWatch(Callback):
    """In a subprocess run: if the sweep process dies, stop cleanly (checkpoint, then exit) instead of orphaning."""

    def __init__(self) -> None:
        self.parent = os.getppid()

    def on_step_end(self, trainer: Any, metrics: dict[str, Any]) -> None:
        if os.getppid() != self.parent:
            # The trainer's own SIGTERM handling saves a checkpoint at the end of this step and stops.
            os.kill(os.getpid(), signal.SIGTERM)


def train_point(point: SweepPoint, run_dir: Path, quiet: bool = True, threads: int = 0,
                extra_callbacks: list[Callback] | None = None) -> dict[str, Any]:
    """Train (or resume) one grid point in this process and return its result summary."""
    import torch

    from plelab.training.trainer import trainer_for

    run_dir.mkdir(parents=True, exist_ok=True)
    old_threads = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    t0 = time.perf_counter()
    try:
        with open(run_dir / LOG_FILE, "a") as log, contextlib.redirect_stdout(_Tee(log, None if quiet else sys.stdout)):
            # The Trainer adds the callbacks the config asks for; resume=True starts at step 0 without a checkpoint.
            trainer = trainer_for(point.config)(point.config, run_dir, callbacks=extra_callbacks, resume=True)
            final = trainer.run()
    finally:
        torch.set_num_threads(old_threads)
    return collect_result(point, run_dir, final, time.perf_counter() - t0)


def execute_point(sweep: Sweep, point: SweepPoint, store: SweepStore, quiet: bool = True,
                  extra_callbacks: list[Callback] | None = None) -> str:
    """Run one point with database bookkeeping; returns its final status (done / failed)."""
    run_dir = sweep.run_dir(point)
    with run_lock(run_dir):
        return _execute_locked(point, run_dir, store, quiet, sweep.options.threads, extra_callbacks)


def _execute_locked(point: SweepPoint, run_dir: Path, store: SweepStore, quiet: bool, threads: int,
                    extra_callbacks: list[Callback] | None) -> str:
    store.mark_running(point.name, os.getpid())
    try:
        stamp_config(point, run_dir)
        result_file = run_dir / RESULT_FILE
        if result_file.is_file():  # trained and evaluated before a kill kept it from being recorded
            result = json.loads(result_file.read_text())
        else:
            result = train_point(point, run_dir, quiet, threads, extra_callbacks)
            atomic_write_bytes(result_file, json.dumps(result, indent=2).encode())
        store.mark_done(point.name, result)
        (run_dir / ERROR_FILE).unlink(missing_ok=True)  # an earlier attempt's traceback no longer applies
        return "done"
    except KeyboardInterrupt:
        store.mark_pending(point.name)
        raise
    except Exception as exc:  # a failed run must not stop the rest of the sweep
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / ERROR_FILE).write_text(traceback.format_exc())
        store.mark_failed(point.name, f"{type(exc).__name__}: {exc}")
        return "failed"


def status_text(store: SweepStore, sweep: Sweep, point: SweepPoint, status: str) -> str:
    """`status`, and for a failed run the reason recorded with it and where the traceback is."""
    if status != "failed":
        return status
    error = ((store.row(point.name) or {}).get("error") or "").strip().splitlines()
    where = sweep.run_dir(point) / ERROR_FILE
    more = f" (traceback in {where})" if where.is_file() else ""
    return f"failed: {error[0] if error else 'no reason recorded'}{more}"


def prepare(sweep: Sweep, restart_changed: bool = False) -> tuple[SweepStore, list[str]]:
    """Open the database, check every run's config, record the sweep and its points, write SWEEP_DIR/sweep.json.

    Returns the store and messages for the user; nothing is written before the config check passes.
    """
    from plelab.experiments.plan import check_plan_fits, load_plan, register_plan

    plan = load_plan(sweep.options.plan) if sweep.options.plan else None  # a bad plan file: refused before any write
    if plan is not None:
        check_plan_fits(plan, [p.values for p in sweep.points])
    sweep.folder.mkdir(parents=True, exist_ok=True)
    store = SweepStore(sweep.db_path)
    try:
        if plan is not None:  # registered (or checked unchanged) before any run of this invocation starts
            register_plan(store, plan, sweep.options.plan)
        messages = reconcile_configs(sweep, store, restart_changed)
        atomic_write_bytes(sweep.folder / RESOLVED_FILE, json.dumps(sweep.resolved_dict(), indent=2).encode())
        store.set_meta(name=sweep.options.name, source=sweep.source, overrides=sweep.overrides, grid=sweep.grid,
                       variants=sweep.variants, baseline=sweep.baseline,
                       match_ffn=sweep.options.match_ffn)
        store.sync_points(sweep.points)
        return store, messages
    except BaseException:
        store.close()
        raise


def _subprocess_cmd(sweep: Sweep, point: SweepPoint) -> list[str]:
    return [sys.executable, "-m", "plelab", "sweep", str(sweep.folder / RESOLVED_FILE), "--run", point.name]


def _child_env(sweep: Sweep) -> dict[str, str]:
    threads = sweep.options.threads or max(1, (os.cpu_count() or 1) // sweep.options.parallel)
    return {**os.environ, "OMP_NUM_THREADS": str(threads), "PLELAB_SWEEP_THREADS": str(threads)}


def _run_subprocesses(sweep: Sweep, todo: list[SweepPoint], store: SweepStore, say) -> None:
    """Up to `parallel` runs at a time, each `plelab sweep SWEEP_DIR/sweep.json --run NAME`."""
    waiting, active = list(todo), {}
    try:
        while waiting or active:
            while waiting and len(active) < sweep.options.parallel:
                point = waiting.pop(0)
                run_dir = sweep.run_dir(point)
                run_dir.mkdir(parents=True, exist_ok=True)
                with open(run_dir / LOG_FILE, "a") as log:
                    proc = subprocess.Popen(_subprocess_cmd(sweep, point), stdout=log, stderr=subprocess.STDOUT,
                                            env=_child_env(sweep))
                active[proc] = point
                say(f"[{point.index + 1}/{len(sweep.points)}] {point.name}: started (pid {proc.pid})")
            time.sleep(0.2)
            for proc, point in list(active.items()):
                if proc.poll() is None:
                    continue
                del active[proc]
                status = store.status_of(point.name)
                if status not in ("done", "failed"):  # died before it could record itself (crash, kill -9)
                    store.mark_failed(point.name, f"subprocess exited with code {proc.returncode}; "
                                                  f"see {sweep.run_dir(point) / LOG_FILE}")
                    status = "failed"
                say(f"[{point.index + 1}/{len(sweep.points)}] {point.name}: {status_text(store, sweep, point, status)}")
    except KeyboardInterrupt:
        for proc in active:
            proc.send_signal(signal.SIGINT)  # each saves a checkpoint and marks itself pending
        for proc in active:
            proc.wait()
        raise


def _raise_interrupt(signum, frame) -> None:  # noqa: ARG001 - signal handler signature
    raise KeyboardInterrupt


@contextlib.contextmanager
def _terminate_as_interrupt():
    """SIGTERM (kill, a batch scheduler) stops the sweep like Ctrl-C: runs checkpoint and are marked pending."""
    old = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def run_sweep(sweep: Sweep, quiet: bool = False, say=print, restart_changed: bool = False) -> dict[str, int]:
    """Run every unfinished point (failed ones are retried, resuming from their checkpoints); return counts.

    Runs whose work was made with another config than the sweep's are refused, or redone with `restart_changed`.
    """
    check_output_path(sweep.folder, overwrite=True, is_dir=True)  # a file or dangling link: one line, not mkdir's
    with sweep_lock(sweep.folder), _terminate_as_interrupt():
        store, messages = prepare(sweep, restart_changed)
        with store:
            for message in messages:
                say(message)
            todo = [p for p in sweep.points if store.status_of(p.name) != "done"]
            say(f"sweep {sweep.options.name}: {len(sweep.points)} runs, {len(sweep.points) - len(todo)} done, "
                f"{len(todo)} to run -> {sweep.folder}")
            if sweep.options.parallel > 1 or sweep.options.subprocess:
                _run_subprocesses(sweep, todo, store, say)
            else:
                for point in todo:
                    say(f"[{point.index + 1}/{len(sweep.points)}] {point.name}: training")
                    status = execute_point(sweep, point, store, quiet=quiet)
                    say(f"[{point.index + 1}/{len(sweep.points)}] {point.name}: "
                        f"{status_text(store, sweep, point, status)}")
            counts: dict[str, int] = {}
            for run in store.runs():
                counts[run["status"]] = counts.get(run["status"], 0) + 1
            return counts


def run_one(sweep: Sweep, name: str) -> str:
    """Subprocess entry: run the point `name` (the parent holds the sweep lock)."""
    threads = int(os.environ.get("PLELAB_SWEEP_THREADS", "0") or 0)
    if threads:
        sweep.options.threads = threads
    with SweepStore(sweep.db_path) as store:
        # quiet: the parent already sends this process's stdout to RUN_DIR/train.log.
        return execute_point(sweep, sweep.point(name), store, quiet=True, extra_callbacks=[ParentWatch()])


RECENT_STEPS = 200
"""Steps of each running run's log that give the sweep's current pace."""


def training_left(runs: list[dict[str, Any]], parallel: int,
                  recent: dict[str, float] | None = None) -> float | None:
    """Wall seconds of training the unfinished runs still need, `parallel` at a time, evaluation not included.
    The pace per step is a variant's running runs' median over their last RECENT_STEPS steps (`recent`: variant ->
    seconds a step; what the machine gives now), else its finished runs' mean (which keeps whatever load they
    trained under), else the overall one. None before any run has finished or logged a step."""
    done = [r for r in runs if r["status"] == "done" and r["train_seconds"] and r["step"]]
    recent = recent or {}
    if not done and not recent:
        return None
    def rate(rs: list[dict[str, Any]]) -> float:
        return sum(r["train_seconds"] for r in rs) / sum(r["step"] for r in rs)
    overall = statistics.median(recent.values()) if recent else rate(done)
    by_variant = {v: rate([r for r in done if r["variant"] == v]) for v in {r["variant"] for r in done}}
    by_variant.update(recent)
    left = sum(max(0, r["max_steps"] - (r["step"] or 0)) * by_variant.get(r["variant"], overall)
               for r in runs if r["status"] != "done")
    return left / max(1, parallel)


def sweep_status(sweep: Sweep) -> dict[str, Any]:
    """Every run's state (done / running / interrupted / pending / failed), progress and headline numbers."""
    import socket

    from plelab.experiments.plan import registered_plan, status_of

    rows, plan, paces = {}, None, {}
    if sweep.db_path.is_file():
        with SweepStore(sweep.db_path, readonly=True) as store:
            rows = {r["name"]: r for r in store.runs(in_grid_only=False)}
            plan = registered_plan(store)
    runs, counts = [], {}
    for point in sweep.points:
        row = rows.pop(point.name, None) or {}
        state = row.get("status", "pending")
        here = row.get("host") == socket.gethostname()
        if state == "running" and here and not (row.get("pid") and pid_alive(row["pid"])):
            state = "interrupted"  # its process died (kill -9, power): the next `plelab sweep` resumes it
        train, _ = read_metrics(sweep.run_dir(point)) if state != "done" else ([], [])
        times = [m["step_time"] for m in train[-RECENT_STEPS:] if m.get("step_time")]
        if state == "running" and times:
            paces.setdefault(point.variant, []).append(statistics.median(times))
        step = row.get("steps") if state == "done" else (train[-1]["step"] if train else 0)
        runs.append({
            "name": point.name, "status": state, "step": step, "max_steps": point.config.max_steps,
            "variant": point.variant, "solved": point.solved,
            "attempts": row.get("attempts", 0), "ple_dim": point.config.model.ple.dim, "seed": point.config.seed,
            "eval_loss": row.get("eval_loss"), "train_loss": row.get("train_loss"),
            "verdict_early": row.get("verdict_early"), "verdict_final": row.get("verdict_final"),
            "train_seconds": row.get("train_seconds"), "error": row.get("error"),
        })
        counts[state] = counts.get(state, 0) + 1
    total_steps = sum(r["max_steps"] for r in runs)
    done_steps = sum(min(r["step"] or 0, r["max_steps"]) for r in runs)
    return {
        "training_left_seconds": training_left(runs, sweep.options.parallel,
                                               {v: statistics.median(p) for v, p in paces.items()}),
        "pace_from": "the running runs' last steps" if paces else "the finished runs",
        "parallel": sweep.options.parallel,
        "sweep": sweep.options.name, "folder": str(sweep.folder), "database": str(sweep.db_path),
        "runs": runs, "counts": counts, "total": len(runs),
        "progress": done_steps / total_steps if total_steps else 1.0,
        "not_in_grid": sorted(rows),
        "plan": None if plan is None else {"status": status_of(plan), "sha256": plan["sha256"],
                                           "source": plan["source"]},
    }
