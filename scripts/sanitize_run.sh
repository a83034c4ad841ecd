#!/usr/bin/env bash
# Builds every target of the asan or tsan preset and runs the whole suite under it, keeping
# the logs under $OUT (or ./sanitize_out). Meant for a machine with many cores (the GPU
# machine builds the TSan suite in minutes; the 2-core VM needs most of an hour).
# With a .debs folder present (the GPU machine's recipe), dependencies come from it.
# Usage: bash scripts/sanitize_run.sh asan|tsan [build|test|all]
set -uo pipefail

preset="${1:?usage: sanitize_run.sh asan|tsan [build|test|all]}"
step="${2:-all}"
out="${OUT:-$PWD/sanitize_out}"
mkdir -p "$out"
jobs="$(nproc)"

if [[ -d .debs ]]; then
  eval "$(bash scripts/unpack-debs.sh .debs /tmp/deps)"
fi

if [[ "$step" == build || "$step" == all ]]; then
  start=$(date +%s)
  cmake --preset "$preset" -DCHIMAERA_BUILD_EXAMPLES=OFF > "$out/$preset-configure.log" 2>&1 ||
    { tail -30 "$out/$preset-configure.log"; echo "configure: FAILED"; exit 1; }
  cmake --build --preset "$preset" -j "$jobs" > "$out/$preset-build.log" 2>&1 ||
    { grep -E "error|FAILED" "$out/$preset-build.log" | head -40; echo "build: FAILED"; exit 1; }
  echo "$preset configure + build: $(( $(date +%s) - start )) s on $jobs cores"
fi

if [[ "$step" == test || "$step" == all ]]; then
  start=$(date +%s)
  # Reports go to files as well, so a forked runtime's report is seen even when its test
  # passes. The tests' own suppressions are appended to TSAN_OPTIONS (tests/CMakeLists.txt).
  reports="$out/$preset-reports"
  rm -rf "$reports" && mkdir -p "$reports"
  export TSAN_OPTIONS="log_path=$reports/tsan" ASAN_OPTIONS="log_path=$reports/asan"
  export UBSAN_OPTIONS="log_path=$reports/ubsan:print_stacktrace=1"
  # Tests spawn runtimes and worker threads of their own: run a quarter as many at once as
  # there are cores. setarch -R turns address randomization off for ctest and its children:
  # older TSan runtimes abort on kernels with wide mmap randomization.
  setarch "$(uname -m)" -R ctest --preset "$preset" -j "$(( jobs > 4 ? jobs / 4 : 1 ))" \
    > "$out/$preset-ctest.log" 2>&1
  rc=$?
  grep -E "tests passed|tests failed|\(Failed\)|\(Timeout\)|\(SEGFAULT\)|Subprocess" \
    "$out/$preset-ctest.log" | tail -30
  found=$(grep -l -E "WARNING: ThreadSanitizer|ERROR: AddressSanitizer|ERROR: LeakSanitizer|runtime error:" \
    "$reports"/* 2>/dev/null | wc -l)
  echo "files with sanitizer reports: $found (under $preset-reports)"
  (( found > 0 )) && rc=1
  echo "$preset ctest: $(( $(date +%s) - start )) s, rc $rc"
  exit $rc
fi
