#!/usr/bin/env bash
# On the GPU machine, from the repository root: builds every GPU test, the GPU example and the
# GPU benchmark (CUDA on, sm_90, dependencies from the carried .debs), runs them with time
# limits, keeps the logs under $OUT (or ./gpu_out), and prints a short summary last.
# Usage: bash scripts/gpu_run.sh [--no-bench | --short] [--host-bench]
#   --short: one benchmark run (the default orchestrator) and no ctest re-run, to save
#   device time when the tests and figures are all that is needed.
#   --host-bench: also build and run the CPU benchmarks (cross_process, embedded, queues)
#   three times each: this machine's idle cores give quieter figures than a shared VM.
set -uo pipefail

out="${OUT:-$PWD/gpu_out}"
build="${CHI_GPU_BUILD_DIR:-build-gpu-run}"
bench=1
short=0
host_bench=0
for arg in "$@"; do
  [[ "$arg" == "--no-bench" ]] && bench=0
  [[ "$arg" == "--short" ]] && short=1
  [[ "$arg" == "--host-bench" ]] && host_bench=1
done
mkdir -p "$out"
summary="$out/summary.txt"
: > "$summary"
note() { echo "$*" | tee -a "$summary"; }

{ nvidia-smi -L; nvcc --version | tail -2; cmake --version | head -1; g++ --version | head -1; } \
  > "$out/machine.txt" 2>&1
# CPU topology and the GPU's local CPUs: where the GPU worker thread runs matters (GPU->CPU).
{ lscpu | grep -E "^(Model name|Socket|Core|Thread|NUMA)"; nvidia-smi topo -m;
  for d in /sys/bus/pci/devices/*; do
    [[ "$(cat "$d/vendor" 2>/dev/null)" == 0x10de && -f "$d/local_cpulist" ]] &&
      echo "$(basename "$d"): numa_node $(cat "$d/numa_node") local_cpulist $(cat "$d/local_cpulist")"
  done; } > "$out/topology.txt" 2>&1
note "machine: $(head -1 "$out/machine.txt")"

eval "$(bash scripts/unpack-debs.sh .debs /tmp/deps)"
# Lazy module loading can deadlock a kernel first launched while the orchestrator runs.
note "machine's CUDA_MODULE_LOADING: ${CUDA_MODULE_LOADING:-unset} (runs use EAGER)"
export CUDA_MODULE_LOADING=EAGER

start=$(date +%s)
if ! cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCHIMAERA_ENABLE_CUDA=ON \
     -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_PREFIX_PATH=/tmp/deps/usr \
     > "$out/configure.log" 2>&1; then
  tail -30 "$out/configure.log"
  note "configure: FAILED (see configure.log)"
  cat "$summary"
  exit 1
fi
targets=(chi_gpu_all test_gpu_protocol test_gpu_queue_inline)
[[ $host_bench == 1 ]] && targets+=(bench_cross_process bench_embedded bench_queues)
if ! ninja -C "$build" -j"$(nproc)" "${targets[@]}" > "$out/build.log" 2>&1; then
  grep -E "error|FAILED" "$out/build.log" | head -40
  note "build: FAILED (see build.log)"
  cat "$summary"
  exit 1
fi
note "configure + build: $(( $(date +%s) - start )) s"

run() {  # run <name> <timeout seconds> <command...>: logs to $out/<name>.log
  local name=$1 limit=$2
  shift 2
  local t0=$(date +%s)
  timeout --kill-after=10 "$limit" "$@" > "$out/$name.log" 2>&1
  local rc=$?
  note "$name: exit $rc in $(( $(date +%s) - t0 )) s"
  [[ $rc == 0 ]] || failures=$((failures + 1))
  return $rc
}
failures=0  # runs that exited non-zero: the script's exit status says whether any did

run test_gpu_protocol 120 "$build/tests/gpu/test_gpu_protocol"
run test_gpu_queue_inline 60 "$build/tests/gpu/test_gpu_queue_inline"
run test_gpu_runtime 180 "$build/tests/gpu/test_gpu_runtime"
run test_gpu_client_process 180 "$build/tests/gpu/test_gpu_client_process"
run test_gpu_memory 180 "$build/tests/gpu/test_gpu_memory"
run example_gpu_kernel 120 "$build/examples/gpu_kernel"
tail -1 "$out/example_gpu_kernel.log" | tee -a "$summary"
grep -E "test cases|assertions|ERROR|FAILED|skipped" "$out/test_gpu_protocol.log" \
  "$out/test_gpu_queue_inline.log" "$out/test_gpu_runtime.log" \
  "$out/test_gpu_client_process.log" "$out/test_gpu_memory.log" \
  | tee -a "$summary"
if [[ $bench == 1 ]]; then
  # A small orchestrator (2 x 256 threads), then one on half the SMs (the default).
  run bench_gpu 90 "$build/benchmarks/gpu/bench_gpu"
  if [[ $short == 0 ]]; then
    run bench_gpu_small 90 "$build/benchmarks/gpu/bench_gpu" --blocks 2
    # An orchestrator block on every SM: client kernels must share SMs with it.
    run bench_gpu_all_sms 45 "$build/benchmarks/gpu/bench_gpu" --blocks all
  fi
fi
if [[ $host_bench == 1 ]]; then
  for i in 1 2 3; do
    run "bench_cross_process_$i" 120 "$build/benchmarks/bench_cross_process"
    run "bench_embedded_$i" 60 "$build/benchmarks/bench_embedded"
  done
  run bench_queues 60 "$build/benchmarks/bench_queues"
fi
if [[ $short == 0 ]]; then
  run ctest_gpu_label 90 ctest --test-dir "$build" -L gpu --output-on-failure
  grep -E "tests passed|tests failed|Skipped|Failed" "$out/ctest_gpu_label.log" | tee -a "$summary"
fi

echo
echo "==== failures (first lines) ===="
grep -h -B2 -A6 -E "ERROR:|FAILED|CHECK\(|REQUIRE" "$out/test_gpu_runtime.log" "$out/test_gpu_memory.log" \
  2>/dev/null | head -60
echo
echo "==== summary ===="
cat "$summary"
if [[ $bench == 1 ]]; then
  for log in bench_gpu bench_gpu_small bench_gpu_all_sms; do
    [[ -f "$out/$log.log" ]] && { echo; cat "$out/$log.log"; }
  done
fi
note "runs that failed: $failures"
exit $(( failures == 0 ? 0 : 1 ))
