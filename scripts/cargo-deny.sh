#!/usr/bin/env bash
# cargo-deny at the version CI pins (installed into target/ci-tools on first use): licenses,
# duplicate crates and sources, by deny.toml. Used by .ci/run and `make deny`.
set -euo pipefail
cd "$(dirname "$0")/.."
deny_version=0.20.2
deny=target/ci-tools/bin/cargo-deny
if [[ ! -x "$deny" ]] || [[ "$("$deny" --version)" != "cargo-deny $deny_version" ]]; then
  cargo install --quiet --locked --no-default-features --version "$deny_version" --root target/ci-tools cargo-deny
fi
exec "$deny" --log-level error check licenses bans sources
