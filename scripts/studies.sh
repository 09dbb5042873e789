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
#   bash scripts/studies.sh stop       # stop them (a later start resumes)
#
# Logs: ../plelab-study-logs/<name>.log. Runs: ../plelab-study-<name>/runs/. Reports from current code:
#   python3 -m plelab report ../plelab-study-tokens/runs/deadzone-tokens
#   python3 -m plelab report ../plelab-study-ffn2/runs/ffn-study-2
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
LOGS="$REPO/../plelab-study-logs"

# name | pinned commit | sweep file (relative to the worktree) | prepared data the sweep reads | how to make it
# (last, not a study: issue 25's same-science check of dtype = "bf16-head", which a later study may then use)
STUDIES=(
  "ffn-pilot|becacde|configs/sweeps/ffn-pilot-2.toml|/tmp/plelab-data-4k|python3 -m plelab data prepare ../shared/data/train --tokenizer /tmp/plelab-tokenizer-4k.json --vocab-size 4096 --out /tmp/plelab-data-4k --no-progress"
  "ffn2|45c20da|configs/sweeps/ffn-study-2.toml|/tmp/plelab-data-4k|python3 -m plelab data prepare ../shared/data/train --tokenizer /tmp/plelab-tokenizer-4k.json --vocab-size 4096 --out /tmp/plelab-data-4k --no-progress"
  "tokens|f3c5f9e|configs/sweeps/deadzone-tokens.toml|/tmp/plelab-data|python3 -m plelab data prepare ../shared/data/train --tokenizer /tmp/plelab-tokenizer-8k.json --vocab-size 8192 --out /tmp/plelab-data --no-progress"
  "fastpath|fb553d6|configs/sweeps/fastpath-check.toml|/tmp/plelab-data|python3 -m plelab data prepare ../shared/data/train --tokenizer /tmp/plelab-tokenizer-8k.json --vocab-size 8192 --out /tmp/plelab-data --no-progress"
)

worktree() { echo "$REPO/../plelab-study-$1"; }

status() {
  for entry in "${STUDIES[@]}"; do
    IFS='|' read -r name commit sweep data _ <<<"$entry"
    dir=$(worktree "$name")
    if [[ ! -d "$dir" ]]; then
      echo "$name: not set up (worktree $dir at $commit; \`start\` makes it)"
      continue
    fi
    # -P: the installed plelab (this checkout's code, which reads older sweeps too and says more), not the
    # worktree's copy; the worktree's when plelab is not installed.
    (cd "$dir" && { python3 -P -m plelab sweep "$sweep" --status 2>/dev/null || python3 -m plelab sweep "$sweep" \
      --status; } | tail -n 2 | head -n 1) || echo "$name: status failed"
  done
  pgrep -af "plelab sweep" || echo "(no study running)"
}

start() {
  if pgrep -f "plelab sweep" >/dev/null; then
    echo "a sweep is already running (bash scripts/studies.sh stop first):" >&2
    pgrep -af "plelab sweep" >&2
    exit 2
  fi
  mkdir -p "$LOGS"
  chain=""
  for entry in "${STUDIES[@]}"; do
    IFS='|' read -r name commit sweep data prepare <<<"$entry"
    dir=$(worktree "$name")
    [[ -d "$dir" ]] || git worktree add --detach "$dir" "$commit"
    [[ "$(git -C "$dir" rev-parse --short=7 HEAD)" == "$commit" ]] \
      || { echo "$dir is not at $commit: a study runs from its pinned commit only" >&2; exit 2; }
    chain+="cd '$dir' && { [[ -f '$data/manifest.json' ]] || $prepare; } && "
    chain+="python3 -m plelab sweep '$sweep' --quiet >> '$LOGS/$name.log' 2>&1; "
  done
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
  # A sweep stops its runs at their next step and records them as interrupted: wait for it.
  for _ in $(seq 60); do pgrep -g "$group" >/dev/null || break; sleep 1; done
  pgrep -g "$group" >/dev/null && echo "still stopping: check again with status" >&2
  echo "stopped (resumable: bash scripts/studies.sh start)"
}

case "${1:-status}" in
  status) status ;;
  start) start ;;
  stop) stop ;;
  *) echo "usage: bash scripts/studies.sh [status|start|stop]" >&2; exit 2 ;;
esac
