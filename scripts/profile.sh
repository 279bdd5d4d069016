#!/usr/bin/env bash
# Where a server's CPU goes under the benchmarks' load: `perf record` of one process, then the
# hottest shared objects and symbols. BENCHMARKS.md's profiles.
#
# One case alone (KEYWARD_BENCH_ONLY: after a warm-up the benchmark prints the pid it measures,
# and only the measured run is recorded, at 999 Hz):
#   scripts/profile.sh serve-lmeval|floor-lmeval|floor-engine-lmeval   # keyward serve, the load
#                                  # bench's floor, or the floor serving keyward's engine, on
#                                  # the LMEval driver at 4,000 req/s for 30 s: the serving path
#                                  # the CPU-per-admission target measures
#   scripts/profile.sh gate|nginx|haproxy http|grpc|token|connect   # one proxy of the gate
#                                  # benchmark on one case at 1,000 req/s for 30 s (token: the
#                                  # gate only), or 3,000 new connections; `http:saturated`,
#                                  # `grpc:saturated`, `token:saturated`: 16 connections flat out
# Every case of a benchmark (the fixed rate and saturation), at 199 Hz:
#   scripts/profile.sh gate        # keyward gate during `cargo bench --bench gate`
#   scripts/profile.sh serve       # keyward serve during `cargo bench --bench load`
#   scripts/profile.sh nginx|haproxy   # the gate's peers, during the gate benchmark
#
# Needs perf (linux-perf) and permission to profile (root, or kernel.perf_event_paranoid <= 1).
set -euo pipefail
cd "$(dirname "$0")/.."
usage="scripts/profile.sh serve|serve-lmeval|floor-lmeval|floor-engine-lmeval, or gate|nginx|haproxy [http|grpc|token|connect|http:saturated|grpc:saturated|token:saturated]"
what="${1:?$usage}"
case_="${2:-}"
command -v perf >/dev/null || { echo "profile: perf is not installed (apt-get install linux-perf)" >&2; exit 1; }
out=target/profile
mkdir -p "$out"
name="$what${case_:+-${case_//:/-}}"

report() {
  perf report -i "$out/$name.data" --no-children --sort dso --stdio -g none 2>/dev/null | grep -v '^#' | grep -v '^$' | head -12 || true
  echo
  perf report -i "$out/$name.data" --no-children --sort symbol --stdio -g none 2>/dev/null | grep -v '^#' | grep -v '^$' | head -40 || true
}

# Runs a benchmark with KEYWARD_BENCH_ONLY=$2 and records the pid it says it measures.
focused() {
  local bench="$1" only="$2"
  shift 2
  env "$@" KEYWARD_BENCH_ONLY="$only" cargo bench -q --profile dist --bench "$bench" >"$out/$name-bench.txt" 2>&1 &
  local bench_pid=$! pid=""
  for _ in $(seq 1200); do
    pid="$(sed -n 's/^measuring pid \([0-9]*\)$/\1/p' "$out/$name-bench.txt")"
    [[ -n "$pid" ]] && break
    kill -0 "$bench_pid" 2>/dev/null || break
    sleep 0.5
  done
  [[ -n "$pid" ]] || { echo "profile: the benchmark never reached its measured run (see $out/$name-bench.txt)" >&2; kill "$bench_pid" 2>/dev/null; exit 1; }
  perf record -F 999 --call-graph dwarf,16384 -p "$pid" -o "$out/$name.data" 2>/dev/null || true
  wait "$bench_pid" || { echo "profile: the benchmark failed (see $out/$name-bench.txt)" >&2; exit 1; }
  grep '^only ' "$out/$name-bench.txt"
  report
}

case "$what:$case_" in
  serve-lmeval:) focused load keyward KEYWARD_BENCH_SECONDS=30; exit 0 ;;
  floor-engine-lmeval:) focused load floor-engine KEYWARD_BENCH_SECONDS=30; exit 0 ;;
  floor-lmeval:)
    focused load floor KEYWARD_BENCH_SECONDS=30
    exit 0 ;;
  gate:http | gate:grpc | gate:token | gate:connect | nginx:http | nginx:grpc | nginx:connect | haproxy:http | haproxy:grpc | haproxy:connect | \
  gate:http:saturated | gate:grpc:saturated | gate:token:saturated | nginx:http:saturated | nginx:grpc:saturated | haproxy:http:saturated | haproxy:grpc:saturated)
    # The peers run only when one of them is profiled.
    peers=1
    [[ "$what" == gate ]] && peers=0
    focused gate "$what:$case_" KEYWARD_BENCH_SECONDS=30 KEYWARD_BENCH_NEW_CONNECTIONS=3000 KEYWARD_BENCH_PEERS=$peers
    exit 0 ;;
  gate: | nginx: | haproxy:) bench=gate; pattern="$what" ;;
  serve:) bench=load; pattern="keyward.* serve" ;;
  *) echo "profile: '$*': $usage" >&2; exit 1 ;;
esac
[[ "$what" == gate ]] && pattern="keyward.* gate"
# The gate's benchmark without the peers when the gate is profiled (the same load, less time).
peers=1
[[ "$what" == gate ]] && peers=0
KEYWARD_BENCH_PEERS=$peers KEYWARD_BENCH_NEW_CONNECTIONS=200 KEYWARD_BENCH_TAIL_SECONDS=0 cargo bench -q --profile dist --bench "$bench" >"$out/$name-bench.txt" 2>&1 &
bench_pid=$!
pid=""
for _ in $(seq 600); do
  pid="$(pgrep -n -f "$pattern" || true)"
  [[ -n "$pid" ]] && break
  sleep 0.5
done
[[ -n "$pid" ]] || { echo "profile: no process matching '$pattern' appeared" >&2; kill "$bench_pid"; exit 1; }
# The whole run, until the process exits with the benchmark: every case it serves.
perf record -F 199 --call-graph dwarf,16384 -p "$pid" -o "$out/$name.data" 2>/dev/null || true
wait "$bench_pid" || true
report
