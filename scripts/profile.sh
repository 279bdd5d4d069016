#!/usr/bin/env bash
# Where a server's CPU goes under the benchmarks' load: `perf record` of one process for as
# long as a benchmark drives it (every case: the fixed rate and saturation), then the hottest
# shared objects and symbols. BENCHMARKS.md's profiles.
#
#   scripts/profile.sh gate        # keyward gate during `cargo bench --bench gate`
#   scripts/profile.sh serve       # keyward serve during `cargo bench --bench load`
#   scripts/profile.sh nginx|haproxy   # the gate's peers, during the gate benchmark
#
# Needs perf (linux-perf) and permission to profile (root, or kernel.perf_event_paranoid <= 1).
set -euo pipefail
cd "$(dirname "$0")/.."
what="${1:?scripts/profile.sh gate|serve|nginx|haproxy}"
command -v perf >/dev/null || { echo "profile: perf is not installed (apt-get install linux-perf)" >&2; exit 1; }
case "$what" in
  gate|nginx|haproxy) bench=gate; pattern="$what" ;;
  serve) bench=load; pattern="keyward.* serve" ;;
  *) echo "profile: $what: one of gate, serve, nginx, haproxy" >&2; exit 1 ;;
esac
[[ "$what" == gate ]] && pattern="keyward.* gate"
out=target/profile
mkdir -p "$out"
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
perf report -i "$out/$what.data" --no-children --sort dso --stdio 2>/dev/null | grep -v '^#' | grep -v '^$' | head -12
echo
perf report -i "$out/$what.data" --no-children --sort symbol --stdio -g none 2>/dev/null | grep -v '^#' | grep -v '^$' | head -30
