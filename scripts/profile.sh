#!/usr/bin/env bash
# Where a server's CPU goes under the benchmarks' load: `perf record` of one process for as
# long as a benchmark drives it (every case: the fixed rate and saturation), then the hottest
# shared objects and symbols. BENCHMARKS.md's profiles.
#
#   scripts/profile.sh gate        # keyward gate during `cargo bench --bench gate`
#   scripts/profile.sh serve       # keyward serve during `cargo bench --bench load`
#   scripts/profile.sh serve-lmeval|floor-lmeval   # keyward serve, or the load bench's floor, on
#                                  # the LMEval driver at 4,000 req/s only (KEYWARD_BENCH_ONLY): the
#                                  # serving path the CPU-per-admission target measures, 30 s
#   scripts/profile.sh nginx|haproxy   # the gate's peers, during the gate benchmark
#
# Needs perf (linux-perf) and permission to profile (root, or kernel.perf_event_paranoid <= 1).
set -euo pipefail
cd "$(dirname "$0")/.."
what="${1:?scripts/profile.sh gate|serve|serve-lmeval|floor-lmeval|nginx|haproxy}"
command -v perf >/dev/null || { echo "profile: perf is not installed (apt-get install linux-perf)" >&2; exit 1; }
out=target/profile
mkdir -p "$out"
report() {
  perf report -i "$out/$what.data" --no-children --sort dso --stdio -g none 2>/dev/null | grep -v '^#' | grep -v '^$' | head -12
  echo
  perf report -i "$out/$what.data" --no-children --sort symbol --stdio -g none 2>/dev/null | grep -v '^#' | grep -v '^$' | head -40
}
case "$what" in
  gate|nginx|haproxy) bench=gate; pattern="$what" ;;
  serve) bench=load; pattern="keyward.* serve" ;;
  serve-lmeval|floor-lmeval)
    only=keyward
    [[ "$what" == floor-lmeval ]] && only=floor
    KEYWARD_BENCH_ONLY=$only KEYWARD_BENCH_SECONDS=30 cargo bench -q --profile dist --bench load >"$out/$what-bench.txt" 2>&1 &
    bench_pid=$!
    pid=""
    for _ in $(seq 1200); do
      pid="$(sed -n 's/^measuring pid \([0-9]*\)$/\1/p' "$out/$what-bench.txt")"
      [[ -n "$pid" ]] && break
      kill -0 "$bench_pid" 2>/dev/null || break
      sleep 0.5
    done
    [[ -n "$pid" ]] || { echo "profile: the benchmark never reached its measured run (see $out/$what-bench.txt)" >&2; kill "$bench_pid" 2>/dev/null; exit 1; }
    perf record -F 999 --call-graph dwarf,16384 -p "$pid" -o "$out/$what.data" 2>/dev/null || true
    wait "$bench_pid" || { echo "profile: the benchmark failed (see $out/$what-bench.txt)" >&2; exit 1; }
    grep '^only ' "$out/$what-bench.txt"
    report
    exit 0 ;;
  *) echo "profile: $what: one of gate, serve, serve-lmeval, floor-lmeval, nginx, haproxy" >&2; exit 1 ;;
esac
[[ "$what" == gate ]] && pattern="keyward.* gate"
# The gate's benchmark without the peers when the gate is profiled (the same load, less time).
peers=1
[[ "$what" == gate ]] && peers=0
KEYWARD_BENCH_PEERS=$peers KEYWARD_BENCH_NEW_CONNECTIONS=200 KEYWARD_BENCH_TAIL_SECONDS=0 cargo bench -q --profile dist --bench "$bench" >"$out/$what-bench.txt" 2>&1 &
bench_pid=$!
pid=""
for _ in $(seq 600); do
  pid="$(pgrep -n -f "$pattern" || true)"
  [[ -n "$pid" ]] && break
  sleep 0.5
done
[[ -n "$pid" ]] || { echo "profile: no process matching '$pattern' appeared" >&2; kill "$bench_pid"; exit 1; }
# The whole run, until the process exits with the benchmark: every case it serves.
perf record -F 199 --call-graph dwarf,16384 -p "$pid" -o "$out/$what.data" 2>/dev/null || true
wait "$bench_pid" || true
report
