#!/usr/bin/env bash
# Runs keyward's benchmarks and prints the figures BENCHMARKS.md publishes, with the machine.
# Loopback only; bounded; stops by itself.
set -euo pipefail
cd "$(dirname "$0")/.."
# cargo's own output (compiling, warnings) is kept out of the figures, but shown if it fails:
# a benchmark that did not build must not look like one that printed nothing.
log=target/bench-cargo.log
mkdir -p target
# Everything is built with the `dist` profile, the image's (Cargo.toml): keyward as it ships,
# and the floors and load generators built the same way.
bench() {
  if ! cargo bench -q --profile dist "$@" 2>"$log"; then
    echo "cargo bench --profile dist $* failed:" >&2
    cat "$log" >&2
    exit 1
  fi
}
# The gate's peers (benches/peers): nginx and HAProxy from Debian's packages.
for package in nginx-light haproxy; do
  if [[ "$(dpkg-query -W -f='${db:Status-Status}' "$package" 2>/dev/null)" != installed ]]; then
    apt-get update -qq && apt-get install -y -qq --no-install-recommends nginx-light haproxy >/dev/null
    break
  fi
done
echo "## machine"
echo "- CPU: $(lscpu | sed -n 's/^Model name: *//p') ($(nproc) cores)"
echo "- memory: $(free -g | awk '/^Mem:/ {print $2}') GiB; kernel $(uname -r); $(rustc --version)"
echo "- peers: $(/usr/sbin/nginx -v 2>&1 | sed 's/^nginx version: //'), $(/usr/sbin/haproxy -v | head -1 | cut -d' ' -f1-3)"
echo "- date: $(date -u +%Y-%m-%dT%H:%MZ); commit $(git rev-parse --short HEAD)"
echo
echo "## engine (criterion, cargo bench --profile dist -p keyward-engine --bench decide)"
bench -p keyward-engine --bench decide | grep -E "time:" -B1 | grep -v "^--"
echo
echo "## server under load (cargo bench --profile dist --bench load)"
bench --bench load
echo
echo "## the controller at scale (cargo bench --profile dist --bench controller)"
bench --bench controller
echo
echo "## keyward audit at 10,000 pods (cargo bench --profile dist --bench audit)"
bench --bench audit
echo
echo "## keyward gate against the upstream directly (cargo bench --profile dist --bench gate)"
bench --bench gate
