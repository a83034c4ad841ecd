#!/usr/bin/env bash
# The standalone runtime's tools end to end: stopping when no runtime runs fails at once,
# a bad command line exits 2, then a runtime started in the background shows in `status`
# and `monitor` (once and --count/--every in both orders), stops with `chimaera runtime
# stop`, starts again and stops with chimaera_stop_runtime; after each stop status reports
# it gone and no segment is left behind. Last, a runtime killed with SIGKILL leaves its
# segments and ipc socket file, and `chimaera runtime clean` removes them. Every check
# runs under `timeout`, so a hang fails.
#   tools_smoke.sh <dir with chimaera, chimaera_start_runtime, chimaera_stop_runtime>
set -euo pipefail
bin="$1"
source "$(dirname "${BASH_SOURCE[0]}")/claim_port.sh"  # CHI_PORT, held for the run
log="/tmp/chi_tools_smoke_$$.log"
cleanup() {
  if "$bin/chimaera" runtime status >/dev/null 2>&1; then "$bin/chimaera_stop_runtime" >/dev/null 2>&1 || true; fi
  rm -f "$log"
}
trap cleanup EXIT

fail() { echo "tools_smoke: FAIL: $*" >&2; exit 1; }

# run SECONDS CMD...: runs CMD under timeout; sets $out (stdout and stderr) and $rc (124: hung).
run() {
  local secs="$1"
  shift
  rc=0
  out=$(timeout "$secs" "$@" 2>&1) || rc=$?
}

# expect_gone WHAT: status reports no runtime and no segment of the port is left.
expect_gone() {
  "$bin/chimaera" runtime status >/dev/null 2>&1 && fail "status still reports a runtime after $1"
  local leftover
  leftover=$(ls /dev/shm | grep -c -E "rt${CHI_PORT}_|shm_transport_${CHI_PORT}\$" || true)
  [[ "$leftover" == 0 ]] || fail "$leftover segments of port $CHI_PORT left in /dev/shm after $1"
}

# expect_reports N ARGS...: `chimaera monitor ARGS` prints exactly N reports and exits 0 in 10 s.
expect_reports() {
  local want="$1"
  shift
  run 10 "$bin/chimaera" monitor "$@"
  [[ "$rc" == 0 ]] || fail "monitor $* exited $rc (124: hung): ${out:0:400}"
  local got
  got=$(grep -c '^workers:' <<<"$out" || true)
  [[ "$got" == "$want" ]] || fail "monitor $* printed $got reports, expected $want"
}

# expect_stop_fails CMD...: with no runtime on the port, CMD fails within 5 s and says so.
expect_stop_fails() {
  run 5 "$@"
  [[ "$rc" != 0 && "$rc" != 124 ]] || fail "$* with no runtime exited $rc (124: hung)"
  grep -q "no runtime" <<<"$out" || fail "$* with no runtime said: $out"
}

"$bin/chimaera" runtime status >/dev/null 2>&1 && fail "a runtime already serves port $CHI_PORT"

expect_stop_fails "$bin/chimaera_stop_runtime"
expect_stop_fails "$bin/chimaera" runtime stop

run 5 "$bin/chimaera" monitor --every
[[ "$rc" == 2 ]] || fail "monitor --every (no value) exited $rc, expected 2"
grep -q -- "--every needs a value" <<<"$out" || fail "monitor --every said: $out"

"$bin/chimaera" runtime start --log "$log" || fail "runtime start"
run 10 "$bin/chimaera" runtime status
[[ "$rc" == 0 ]] || fail "status after start exited $rc: $out"
echo "$out"
for seg in "rt${CHI_PORT}_main" "rt${CHI_PORT}_cdata" "rt${CHI_PORT}_rdata" "shm_transport_${CHI_PORT}"; do
  grep -q "segment $seg " <<<"$out" || fail "status lists no segment $seg"
done
grep -Eq "^  started [0-9]{4}-[0-9]{2}-[0-9]{2} [0-9:]{8} UTC, up [0-9]+\.[0-9] s$" <<<"$out" ||
  fail "status gives no start time and uptime: $out"
grep -Eq "^  shm clients [0-9]+ of 32 slots \(shm.client_slots\)$" <<<"$out" ||
  fail "status gives no shm slot count (the default 32): $out"
run 10 "$bin/chimaera" monitor
[[ "$rc" == 0 ]] || fail "monitor exited $rc: $out"
echo "$out"
grep -q "worker" <<<"$out" || fail "monitor printed no worker line"
grep -qi "admin" <<<"$out" || fail "monitor printed no admin pool"
expect_reports 3 --every 0.2 --count 3
expect_reports 3 --count 3 --every 0.2
expect_reports 2 --count 2
run 30 "$bin/chimaera" runtime stop
[[ "$rc" == 0 ]] || fail "chimaera runtime stop exited $rc: $out"
expect_gone "chimaera runtime stop"

"$bin/chimaera" runtime start --log "$log" || fail "second runtime start"
"$bin/chimaera_stop_runtime" || fail "chimaera_stop_runtime"
expect_gone "chimaera_stop_runtime"

"$bin/chimaera" runtime start --log "$log" || fail "third runtime start"
run 10 "$bin/chimaera" runtime status
pid=$(sed -n 's/^runtime pid \([0-9]*\) serving.*/\1/p' <<<"$out")
[[ -n "$pid" ]] || fail "status named no runtime pid: $out"
kill -9 "$pid"
for ((i = 0; i < 500; ++i)); do
  [[ "$(ps -o stat= -p "$pid" 2>/dev/null)" =~ ^Z?$ ]] && break
  sleep 0.01
done
run 10 "$bin/chimaera" runtime status
[[ "$rc" == 1 ]] || fail "status after SIGKILL exited $rc: $out"
grep -q "stale segments" <<<"$out" || fail "status after SIGKILL named no stale segments: $out"
ipc_file="/tmp/chi_$(id -u)_${CHI_PORT}.ipc"
[[ -e "$ipc_file" ]] || fail "the killed runtime left no ipc socket file $ipc_file"
sleep 1.1  # --min-age 1: leftovers younger than a second may be a runtime starting
run 10 "$bin/chimaera" runtime clean --min-age 1
[[ "$rc" == 0 ]] || fail "runtime clean exited $rc: $out"
echo "$out"
grep -q "removed .*${CHI_PORT}" <<<"$out" || fail "runtime clean did not name port $CHI_PORT: $out"
expect_gone "chimaera runtime clean"
[[ ! -e "$ipc_file" ]] || fail "runtime clean left the ipc socket file $ipc_file"
echo "tools_smoke: 1 passed, 0 failed"
