#!/usr/bin/env bash
# One line per install phase, the chatter in a log: `make env` runs each phase through this.
#
#   scripts/phase.sh LOG "LABEL" COMMAND [ARGS...]
#
# Prints "LABEL ... " and runs COMMAND with its stdout and stderr appended to LOG (after a header
# naming the phase and the command), then ends the line with "ok (N s)".  When COMMAND fails it
# ends the line with "FAILED (exit RC, N s)", prints the last PHASE_TAIL (default 40) lines of LOG
# and LOG's path to stderr, and exits with COMMAND's status: nothing is hidden, only moved.
set -u
if [ "$#" -lt 3 ]; then
    echo "usage: $0 LOG LABEL COMMAND [ARGS...]" >&2
    exit 2
fi
log=$1 label=$2
shift 2
mkdir -p "$(dirname "$log")" || exit 1
printf '%s ... ' "$label"
{
    printf '\n=== %s: %s (%s)\n' "$label" "$*" "$(date -u '+%Y-%m-%d %H:%M:%S UTC')"
} >>"$log"
start=$SECONDS
"$@" >>"$log" 2>&1
rc=$?
took=$((SECONDS - start))
if [ "$rc" -eq 0 ]; then
    printf 'ok (%d s)\n' "$took"
    exit 0
fi
printf 'FAILED (exit %d, %d s)\n' "$rc" "$took"
{
    echo "---- last ${PHASE_TAIL:-40} lines of $log ----"
    tail -n "${PHASE_TAIL:-40}" "$log"
    echo "---- full log: $log ----"
} >&2
exit "$rc"
