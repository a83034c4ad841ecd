#!/usr/bin/env bash
# examples/client_process as a user runs it: `chimaera runtime start --with-demo`, the
# example over each transport, `chimaera runtime stop`. Every step runs under `timeout`.
#   example_client_process.sh <dir with chimaera> <client_process binary>
set -euo pipefail
bin="$1"
example="$2"
source "$(dirname "${BASH_SOURCE[0]}")/claim_port.sh"  # CHI_PORT, held for the run
log="/tmp/chi_example_client_$$.log"
cleanup() {
  timeout 20 "$bin/chimaera" runtime stop >/dev/null 2>&1 || true
  rm -f "$log"
}
trap cleanup EXIT
fail() { echo "example_client_process: FAIL: $*" >&2; exit 1; }

timeout 60 "$bin/chimaera" runtime start --with-demo --log "$log" || fail "runtime start"
for mode in shm ipc tcp; do
  out=$(CHI_IPC_MODE=$mode timeout 60 "$example" 200 2>&1) || fail "over $mode: $out"
  grep -q "200 echoes over $mode, 0 wrong" <<<"$out" || fail "over $mode said: $out"
  echo "$out"
done
timeout 20 "$bin/chimaera" runtime stop || fail "runtime stop"
# With the runtime gone the example fails, saying why, instead of waiting.
if out=$(CHI_CONNECT_TIMEOUT=1 timeout 20 "$example" 1 2>&1); then
  fail "with no runtime the example succeeded: $out"
fi
grep -q "no runtime" <<<"$out" || fail "with no runtime the example said: $out"
echo "example_client_process: ok"
