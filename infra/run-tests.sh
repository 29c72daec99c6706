#!/usr/bin/env bash
# `make test` after setup and lint: every test, in the time two cores allow (issue 65).
#
#   1. The fast tests outside tests/spark_jobs, in two workers (a minute or two).
#      Several hold wall-clock bounds (supervisord restarting a program, a lock
#      waited for), so they run with the machine to themselves.
#   2. The integration tests, one at a time against one stack (they share it), and
#      beside them the Spark fast tests (tests/spark_jobs), in two workers, each
#      test on a temporary lake of its own, in a session of their own at the
#      lowest CPU priority.
#
# Why beside: the integration tests leave about 30 % of the two cores idle while
# they wait on services (stop 103's rehearsal: 2,438 busy CPU-s in 1,713 s), and
# the Spark fast tests are most of the fast tests' time (over 1,070 of 1,210
# worker-s).
# At the lowest priority they take that idle time and give way whenever a service,
# a stream or a test needs a core. The kernel groups each session's processes
# (autogroup) and shares CPU between the groups first, so nice alone would not do
# that: the Spark tests' group gets the lowest priority itself (proc(5),
# /proc/PID/autogroup).
#
# Measured (stop 104, fresh clones, CI=true):
#   - nice 19: `make test` took 33.7 and 33.4 minutes, where main without it took
#     38.2 the same evening (`docs/development.md`, "The suite's time"). The
#     integration tests took 1,895 and 1,884 s where main's took 1,679,
#     test_versions.py 516 and 409 where main's took 369; the Spark tests were
#     done 26 and 28 minutes into them.
#   - SCHED_IDLE (`chrt --idle`), which any waking task preempts at once: the
#     integration tests kept their pace, but the Spark tests ran 27 of their 251
#     tests in their first 9 minutes or so (107 in 13 at nice 19), so most of
#     them would have run after the integration tests. Stopped there.
#
# Usage: infra/run-tests.sh PYTEST STARTED BUDGET_MIN
#   PYTEST      the pytest to run
#   STARTED     when `make` began (seconds since the epoch), for the closing line
#   BUDGET_MIN  the suite's budget in minutes, printed beside its time
# Exits non-zero when any of the three runs failed; each runs to its end, so one
# run shows every failure. Ctrl-C stops everything, the Spark tests too.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2

if [ $# -ne 3 ]; then
  sed -n '/^# Usage:/,/^set /{/^set /d; s/^# \{0,1\}//; p}' "$0" >&2
  exit 2
fi
pytest=$1 started=$2 budget_min=$3

log=$(mktemp "${TMPDIR:-/tmp}/regauge-spark-tests.XXXXXX.log")
beside=""
stop_beside() {
  # The whole session: the pytest workers and the Spark JVMs they started.
  [ -n "$beside" ] && pkill -TERM -s "$beside" 2>/dev/null
  return 0
}
# Ctrl-C reaches every process of the terminal's group: the running pytest stops
# and tears down what it started. The Spark tests' session is not in that group,
# so it is stopped here. A TERM or HUP sent to this script alone takes effect
# when the running pytest ends (bash runs traps between commands); a kill -9 of
# this script runs no trap, so the session also ends itself when this script is
# gone (below).
trap 'stop_beside; rm -f "$log"; exit 130' INT
trap 'stop_beside; rm -f "$log"; exit 143' TERM
trap 'stop_beside; rm -f "$log"; exit 129' HUP

"$pytest" tests -m "not integration" --ignore=tests/spark_jobs -n 2 --dist loadfile --durations=10
others=$?

# setsid(1) does not fork here (a background job of this script leads no process
# group), so the job's pid is its session's id: what stop_beside and the
# integration tests' CPU accounting (tests/conftest.py) look for.
# fd 3 is this script's stderr, for the one warning the session may give.
# Each Spark test may take 30 minutes, not pyproject's 15: a precaution, since at the
# lowest priority a Spark test can be starved while the integration tests keep both
# cores busy (the slowest took 119 s in stop 105's run).
setsid bash -c '
  { echo 19 >/proc/self/autogroup; } 2>/dev/null ||
    echo "run-tests.sh: could not lower the autogroup of the Spark tests: they compete with the integration tests as equals" >&3
  parent=$1
  shift
  (while kill -0 "$parent" 2>/dev/null; do sleep 5; done; pkill -TERM -s $$) 3>&- &
  exec 3>&- nice -n 19 "$@"' _ "$$" \
  "$pytest" tests/spark_jobs -m "not integration" -n 2 --dist loadfile --durations=25 \
  -o cache_dir=.pytest_cache/spark_jobs -o timeout=1800 3>&2 >"$log" 2>&1 </dev/null &
beside=$!
printf '\n=== the Spark fast tests (tests/spark_jobs) run beside the integration tests, at the lowest priority: %s ===\n\n' "$log"

REGAUGE_TESTS_BESIDE_SESSION=$beside "$pytest" tests -m "integration and not full_cluster" --durations=25
integration=$?

if kill -0 "$beside" 2>/dev/null; then
  printf '\n=== the integration tests are done; waiting for the Spark fast tests (%s) ===\n' "$log"
fi
wait "$beside"
spark=$?
beside=""
printf '\n=== the Spark fast tests, run beside the integration tests ===\n'
cat "$log"
rm -f "$log"

took=$(($(date +%s) - started))
verdict="within"
[ "$took" -le $((budget_min * 60)) ] || verdict="OVER"
printf '\n=== make test took %d min %02d s, setup and lint included: %s its budget of %d minutes (CI stops at 90) ===\n' \
  $((took / 60)) $((took % 60)) "$verdict" "$budget_min"
[ "$others" -eq 0 ] && [ "$integration" -eq 0 ] && [ "$spark" -eq 0 ]
