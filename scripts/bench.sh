#!/usr/bin/env bash
# Runs keyward's benchmarks and prints the figures BENCHMARKS.md publishes, with the machine.
# Loopback only; bounded; stops by itself.
set -euo pipefail
cd "$(dirname "$0")/.."
echo "## machine"
echo "- CPU: $(lscpu | sed -n 's/^Model name: *//p') ($(nproc) cores)"
echo "- memory: $(free -g | awk '/^Mem:/ {print $2}') GiB; kernel $(uname -r); $(rustc --version)"
echo "- date: $(date -u +%Y-%m-%dT%H:%MZ); commit $(git rev-parse --short HEAD)"
echo
echo "## engine (criterion, cargo bench -p keyward-engine --bench decide)"
cargo bench -q -p keyward-engine --bench decide 2>/dev/null | grep -E "time:" -B1 | grep -v "^--"
echo
echo "## server under load (cargo bench --bench load)"
cargo bench -q --bench load 2>/dev/null
echo
echo "## the controller at scale (cargo bench --bench controller)"
cargo bench -q --bench controller 2>/dev/null
echo
echo "## keyward audit at 10,000 pods (cargo bench --bench audit)"
cargo bench -q --bench audit 2>/dev/null
