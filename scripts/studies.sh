#!/usr/bin/env bash
# Resume the registered studies in the background, each from the commit its plan was registered at.
#
# A study's runs must all come from one commit (its sweep hashes and its evaluation are that commit's), so each
# study gets a git worktree pinned there, beside this checkout: ../plelab-study-<name> (so `../shared` resolves
# as it does here). Background jobs end with the session that started them; the sweeps are resumable, so
# `start` again continues where they stopped.
#
#   bash scripts/studies.sh status     # where each study stands (reads only)
#   bash scripts/studies.sh start      # prepare what is missing, then run the unfinished studies one after another
#   bash scripts/studies.sh start --dry-run   # make the worktrees, print the chain `start` would run, run nothing
#   bash scripts/studies.sh save       # snapshot each study's database into studies/<name>/<sweep>.sql (commit those)
#   bash scripts/studies.sh stop       # stop them, then save (a later start resumes)
#   bash scripts/studies.sh drain      # start no new run, let the running ones finish, then stop and save
#
# `stop` interrupts the running runs; they resume from their checkpoints on this machine, but a new machine has
# only the snapshot, so they train again from the start. Before a session (and perhaps its machine) ends, `drain`
# loses nothing: begin it when the runs in flight will finish in time (it prints their ETAs).
#
# The worktrees and their run folders live on this machine's disk only; a new machine starts without them. What
# carries a study across machines is studies/<name>/<sweep>.sql in its folder, its database as SQL text (`plelab
# sweep --snapshot`): every finished run's config, result, evaluation and timeline. `start` seeds a missing sweep folder from it
# (`plelab sweep --restore`, refused if the prepared data came out different), so only the runs that were
# unfinished at the last snapshot train again. A running chain saves every 10 minutes; commit studies/ often.
#
# Logs: ../plelab-study-logs/<name>.log. Runs: ../plelab-study-<name>/runs/. Reports from current code:
#   python3 -m plelab report ../plelab-study-tokens/runs/deadzone-tokens
#   python3 -m plelab report ../plelab-study-fastpath/runs/fastpath-check
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
LOGS="$REPO/../plelab-study-logs"
SNAPSHOTS="$REPO/studies"

# name | pinned commit | sweep file (its path in the pinned commit, inside the worktree) | its sweep folder |
# prepared data the sweep reads | how to make it. A commit from before studies had folders of their own keeps its
# sweep file under configs/sweeps/; the snapshot goes to this checkout's studies/<name>/<sweep file's stem>.sql
# whatever the commit.
# The n-gram study (token PLE against a hashed n-gram table, issue 36) runs first: 40 runs of 3,000 steps, ~6-7 hours
# of wall; its pilot (studies/ngram/ngram-pilot.toml at 6e99042, 10 of 10 runs, sizing only) is finished, snapshot
# studies/ngram/ngram-pilot.sql.
# The dead-zone law's third round ("where the dead zone begins"): its two sweeps run one after the other from one
# worktree pinned at their registration commit, H = 64 first.
# Finished studies leave this list (a new machine would otherwise prepare their data only to find nothing to run):
# the FFN pilot (configs/sweeps/ffn-pilot-2.toml at becacde; records in studies/ffn/ffn-pilot-2/) and the FFN study
# (configs/sweeps/ffn-study-2.toml at 45c20da, 18 of 18 runs; snapshot studies/ffn/ffn-study-2.sql, report
# studies/ffn/ffn-study-2/), the dead-zone tokens study (configs/sweeps/deadzone-tokens.toml at f3c5f9e, 75 of
# 75 runs; snapshot studies/tokens/deadzone-tokens.sql, report studies/tokens/deadzone-tokens/), and the fast
# path's same-science check (configs/sweeps/fastpath-check.toml at fb553d6, 12 of 12 runs, failed; snapshot and
# report in studies/fastpath/).
PREPARE_8K="python3 -m plelab data prepare ../shared/data/train --tokenizer /tmp/plelab-tokenizer-8k.json --vocab-size 8192 --out /tmp/plelab-data --no-progress"
STUDIES=(
  "ngram|cfa42b5|studies/ngram/ngram-study.toml|runs/ngram-study|/tmp/plelab-data|$PREPARE_8K"
  "onset|8a44de1|studies/onset/deadzone-onset-h64.toml|runs/deadzone-onset/h64|/tmp/plelab-data|$PREPARE_8K"
  "onset|8a44de1|studies/onset/deadzone-onset-h32.toml|runs/deadzone-onset/h32|/tmp/plelab-data|$PREPARE_8K"
)

# Studies whose checks read the runs' per-step training curves (the fast path's curve comparison): their
# snapshots also keep each finished run's metrics.jsonl (studies/<name>/<sweep>.sql.logs/). The others' verdicts need
# only the database, and their logs would be megabytes a run.
WITH_LOGS=" "

worktree() { echo "$REPO/../plelab-study-$1"; }
# A study's snapshot: in its folder here, named after its sweep file ($1 name, $2 sweep file).
snapshot() { echo "$SNAPSHOTS/$1/$(basename "$2" .toml).sql"; }
q() { printf '%q' "$1"; }
# This checkout's plelab, whatever pip last installed (an editable install of another clone, or none): -P keeps the
# current folder (a worktree's pinned copy) off sys.path, PYTHONPATH puts this checkout first. The sweeps themselves
# run `python3 -m plelab` inside their worktree, so they run the pinned code.
here_py() { PYTHONPATH="$REPO" python3 -P "$@"; }

status() {
  for entry in "${STUDIES[@]}"; do
    IFS='|' read -r name commit sweep folder data _ <<<"$entry"
    dir=$(worktree "$name")
    snap=$(snapshot "$name" "$sweep")
    if [[ ! -f "$dir/$folder/sweep.sqlite" ]]; then
      if [[ -f "$snap" ]]; then
        echo "$name: not running here; its snapshot $snap says: $(here_py -c 'import sys
from plelab.experiments.sweep_snapshot import read_header
h = read_header(sys.argv[1]); print(h["runs"], "at", h["taken"])' "$snap")"
      else
        echo "$name: not started (worktree $dir at $commit; no snapshot at $snap; \`start\` makes it)"
      fi
      continue
    fi
    # This checkout's code (it reads older sweeps too and says more), else the worktree's pinned copy.
    (cd "$dir" && { here_py -m plelab sweep "$sweep" --status 2>/dev/null || python3 -m plelab sweep "$sweep" \
      --status; } | tail -n 2 | head -n 1) || echo "$name: status failed"
  done
  # the sweep processes only (the chain's bash -c names them too, in one line of a screen)
  pgrep -af -- "$SWEEP_PROC" || echo "(no study running)"
}

start() {
  case "${1:-}" in
    "") dry_run=false ;;
    --dry-run) dry_run=true ;;
    *) echo "start takes only --dry-run, got: $1" >&2; exit 2 ;;
  esac
  if ! $dry_run && pgrep -f "plelab sweep" >/dev/null; then
    echo "a sweep is already running (bash scripts/studies.sh stop first):" >&2
    pgrep -af "plelab sweep" >&2
    exit 2
  fi
  mkdir -p "$LOGS"
  chain=""
  for entry in "${STUDIES[@]}"; do
    IFS='|' read -r name commit sweep folder data prepare <<<"$entry"
    dir=$(worktree "$name")
    [[ -d "$dir" ]] || git worktree add --detach "$dir" "$commit"
    [[ "$(git -C "$dir" rev-parse --short=7 HEAD)" == "$commit" ]] \
      || { echo "$dir is not at $commit: a study runs from its pinned commit only" >&2; exit 2; }
    snap=$(snapshot "$name" "$sweep")
    # Every path goes into the chain through printf %q, so a checkout whose path has spaces or quotes works.
    chain+="cd $(q "$dir") && { [[ -f $(q "$data/manifest.json") ]] || $prepare; } && "
    # This checkout's plelab restores (the pinned commit may predate --restore); the sweep runs the pinned code.
    chain+="{ [[ -f $(q "$folder/sweep.sqlite") || ! -f $(q "$snap") ]] || PYTHONPATH=$(q "$REPO") python3 -P -m plelab "
    chain+="sweep $(q "$sweep") --restore $(q "$snap"); } && "
    chain+="python3 -m plelab sweep $(q "$sweep") --quiet >> $(q "$LOGS/$name.log") 2>&1; "
  done
  mkdir -p "$SNAPSHOTS"
  chain="(while sleep 600; do bash $(q "$REPO/scripts/studies.sh") save; done) & saver=\$!; $chain"
  chain+="kill \$saver; bash $(q "$REPO/scripts/studies.sh") save"
  if $dry_run; then
    printf '%s\n' "$chain"
    return
  fi
  # Its own process group, so `stop` ends the chain too (not only the running sweep, after which the chain
  # would start the next study).
  setsid bash -c "$chain" >> "$LOGS/studies.log" 2>&1 < /dev/null &
  echo $! > "$LOGS/studies.pid"
  echo "started in the background (process group $!): ${STUDIES[*]%%|*}; logs in $LOGS"
}

stop() {
  # Only what `start` launched (its process group): a sweep the user runs by hand is left alone.
  if [[ ! -f "$LOGS/studies.pid" ]] || ! kill -- "-$(cat "$LOGS/studies.pid")" 2>/dev/null; then
    rm -f "$LOGS/studies.pid"
    echo "nothing started by this script is running"
    return
  fi
  group=$(cat "$LOGS/studies.pid")
  rm -f "$LOGS/studies.pid"
  kill -CONT -- "-$group" 2>/dev/null || true  # a sweep paused by `drain` handles its SIGTERM only once resumed
  # A sweep stops its runs at their next step and records them as interrupted: wait for it.
  for _ in $(seq 60); do pgrep -g "$group" >/dev/null || break; sleep 1; done
  pgrep -g "$group" >/dev/null && echo "still stopping: check again with status" >&2
  echo "stopped (resumable: bash scripts/studies.sh start)"
  save
}

# A python process running `plelab sweep FILE` (not the chain's bash, whose command line holds the same words).
SWEEP_PROC='^[^ ]*python[^ ]* -m plelab sweep [^ ]*'

# The runs in flight in process group $1, one per line: pid and run folder.
runs_in_flight() {
  local pid args sweep_file name
  for pid in $(pgrep -g "$1" -f -- "$SWEEP_PROC --run " || true); do
    args=$(tr '\0' '\n' < "/proc/$pid/cmdline" 2>/dev/null) || continue
    sweep_file=$(grep -A1 -x -- sweep <<<"$args" | tail -n 1)
    name=$(grep -A1 -x -- --run <<<"$args" | tail -n 1)
    echo "$pid $(readlink "/proc/$pid/cwd")/$(dirname "$sweep_file")/runs/$name"
  done
}

drain() {
  if [[ ! -f "$LOGS/studies.pid" ]] || ! pgrep -g "$(cat "$LOGS/studies.pid")" >/dev/null; then
    echo "nothing started by this script is running"
    rm -f "$LOGS/studies.pid"
    return
  fi
  group=$(cat "$LOGS/studies.pid")
  # Pause the sweeps that launch runs (not the runs: `plelab sweep SWEEP_DIR/sweep.json --run NAME`). A run stops
  # when its sweep dies, but not when it is paused, so the runs train on and record themselves as done, while the
  # paused sweep launches nothing new and the chain behind it waits. `stop` then ends the chain.
  parents=$(pgrep -g "$group" -f -- "$SWEEP_PROC --quiet" || true)
  [[ -n "$parents" ]] && kill -STOP $parents
  echo "draining: no new run starts; waiting for the runs in flight (bash scripts/studies.sh stop interrupts them)"
  while in_flight=$(runs_in_flight "$group") && [[ -n "$in_flight" ]]; do
    while read -r pid dir; do
      echo "  $(date -u +%H:%M) pid $pid $(basename "$dir"): $(tail -n 1 "$dir/train.log" 2>/dev/null)"
    done <<<"$in_flight"
    sleep "${DRAIN_POLL_S:-300}"
  done
  echo "the runs in flight have finished"
  stop
}

save() {
  mkdir -p "$SNAPSHOTS"
  for entry in "${STUDIES[@]}"; do
    IFS='|' read -r name commit sweep folder _ <<<"$entry"
    dir=$(worktree "$name")
    [[ -f "$dir/$folder/sweep.sqlite" ]] || continue
    logs=()
    [[ "$WITH_LOGS" == *" $name "* ]] && logs=(--with-logs)
    snap=$(snapshot "$name" "$sweep")
    mkdir -p "$(dirname "$snap")"
    (cd "$dir" && here_py -m plelab sweep "$sweep" --snapshot "$snap" "${logs[@]}") \
      || echo "$name: snapshot failed" >&2
  done
}

case "${1:-status}" in
  status) status ;;
  start) start "${@:2}" ;;
  stop) stop ;;
  drain) drain ;;
  save) save ;;
  *) echo "usage: bash scripts/studies.sh [status|start [--dry-run]|save|stop|drain]" >&2; exit 2 ;;
esac
