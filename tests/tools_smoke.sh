#!/usr/bin/env bash
# The standalone runtime's tools end to end: start a runtime in the background,
# see it in `status` and `monitor`, stop it with chimaera_stop_runtime, and check
# that status then reports it gone and no segment is left behind.
#   tools_smoke.sh <dir with chimaera, chimaera_start_runtime, chimaera_stop_runtime>
set -euo pipefail
bin="$1"
export CHI_PORT=$((30000 + $$ % 20000))
log="/tmp/chi_tools_smoke_$$.log"
cleanup() {
  if "$bin/chimaera" runtime status >/dev/null 2>&1; then "$bin/chimaera_stop_runtime" >/dev/null 2>&1 || true; fi
  rm -f "$log"
}
trap cleanup EXIT

fail() { echo "tools_smoke: FAIL: $*" >&2; exit 1; }

"$bin/chimaera" runtime status >/dev/null 2>&1 && fail "a runtime already serves port $CHI_PORT"
"$bin/chimaera" runtime start --log "$log" || fail "runtime start"
"$bin/chimaera" runtime status || fail "status after start"
out=$("$bin/chimaera" monitor) || fail "monitor"
echo "$out"
grep -q "worker" <<<"$out" || fail "monitor printed no worker line"
grep -qi "admin" <<<"$out" || fail "monitor printed no admin pool"
"$bin/chimaera_stop_runtime" || fail "chimaera_stop_runtime"
"$bin/chimaera" runtime status >/dev/null 2>&1 && fail "status still reports a runtime after stop"
leftover=$(ls /dev/shm | grep -c "rt${CHI_PORT}_" || true)
[[ "$leftover" == 0 ]] || fail "$leftover segments of port $CHI_PORT left in /dev/shm"
echo "tools_smoke: 1 passed, 0 failed"
