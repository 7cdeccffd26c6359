#!/usr/bin/env bash
# Helpers shared by the launch scripts in tpu/ (sourced, not run).
# run CMD...: prints CMD (shell-quoted, one line) when DRY_RUN=1, else runs it.
# run_bg CMD...: the same, in the background (collect with `wait_all`).

DRY_RUN="${DRY_RUN:-0}"
BG_PIDS=()

# Quotes one word for display only when it needs it.
quote_word() {
  local w="$1"
  if [[ "$w" =~ ^[A-Za-z0-9_./=:,@%+-]+$ ]]; then
    printf '%s' "$w"
  else
    printf "'%s'" "${w//\'/\'\\\'\'}"
  fi
}

show() {
  local out="" w
  for w in "$@"; do
    out+="$(quote_word "$w") "
  done
  printf '%s\n' "${out% }"
}

run() {
  if [[ "$DRY_RUN" == 1 ]]; then
    show "$@"
  else
    "$@"
  fi
}

run_bg() {
  if [[ "$DRY_RUN" == 1 ]]; then
    show "$@"
  else
    "$@" &
    BG_PIDS+=("$!")
  fi
}

wait_all() {
  local pid status=0
  for pid in "${BG_PIDS[@]}"; do
    wait "$pid" || status=$?
  done
  BG_PIDS=()
  return "$status"
}

die() {
  printf 'error: %s\n' "$*" >&2
  exit 2
}

# Joins the remaining arguments into one remote shell command line (each word quoted as needed).
remote_cmd() {
  show "$@"
}
