#!/usr/bin/env bash
# Where a server's CPU goes under the benchmarks' load: `perf record` of one process while a
# benchmark drives it, then the hottest symbols and shared objects. BENCHMARKS.md's profiles.
#
#   scripts/profile.sh gate        # keyward gate during `cargo bench --bench gate`
#   scripts/profile.sh serve       # keyward serve during `cargo bench --bench load`
#   scripts/profile.sh nginx|haproxy   # the gate's peers, during the gate benchmark
#
# Needs perf (linux-perf) and permission to profile (root, or kernel.perf_event_paranoid <= 1).
set -euo pipefail
cd "$(dirname "$0")/.."
what="${1:?scripts/profile.sh gate|serve|nginx|haproxy}"
seconds="${PROFILE_SECONDS:-15}"
command -v perf >/dev/null || { echo "profile: perf is not installed (apt-get install linux-perf)" >&2; exit 1; }
case "$what" in
  gate|nginx|haproxy) bench=gate; pattern="$what" ;;
  serve) bench=load; pattern="keyward.* serve" ;;
  *) echo "profile: $what: one of gate, serve, nginx, haproxy" >&2; exit 1 ;;
esac
[[ "$what" == gate ]] && pattern="keyward.* gate"
out=target/profile
mkdir -p "$out"
KEYWARD_BENCH_SECONDS=20 KEYWARD_BENCH_TAIL_SECONDS=0 cargo bench -q --profile dist --bench "$bench" >"$out/$what-bench.txt" 2>&1 &
bench_pid=$!
pid=""
for _ in $(seq 600); do
  pid="$(pgrep -n -f "$pattern" || true)"
  [[ -n "$pid" ]] && break
  sleep 0.5
done
[[ -n "$pid" ]] || { echo "profile: no process matching '$pattern' appeared" >&2; kill "$bench_pid"; exit 1; }
sleep 5 # past start-up and the warm-up runs
perf record -F 999 -g -p "$pid" -o "$out/$what.data" -- sleep "$seconds" 2>/dev/null
wait "$bench_pid" || true
perf report -i "$out/$what.data" --no-children --sort dso --stdio 2>/dev/null | grep -v '^#' | grep -v '^$' | head -12
echo
perf report -i "$out/$what.data" --no-children --sort symbol --stdio -g none 2>/dev/null | grep -v '^#' | grep -v '^$' | head -30
