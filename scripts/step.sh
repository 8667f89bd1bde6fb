#!/usr/bin/env bash
# step.sh LABEL COMMAND...: runs one step of `make serve`/`make test`'s set-up and prints
# one line, "LABEL (N s)"; the step's own output goes to build/logs/ and is shown only
# when it fails. VERBOSE=1 shows it as it comes.
set -uo pipefail
label=$1
shift
root=$(cd "$(dirname "$0")/.." && pwd)
start=$SECONDS
if [ "${VERBOSE:-0}" = 1 ]; then
  "$@"
  rc=$?
else
  mkdir -p "$root/build/logs"
  log="$root/build/logs/$(echo "$label" | tr -c 'a-zA-Z0-9\n' '-' | cut -c1-40).log"
  "$@" >"$log" 2>&1
  rc=$?
  if [ $rc -ne 0 ]; then
    cat "$log" >&2
    echo "$label: FAILED (exit $rc; output above, also in ${log#"$root"/})" >&2
    exit $rc
  fi
fi
[ $rc -eq 0 ] && echo "$label ($((SECONDS - start)) s)"
exit $rc
