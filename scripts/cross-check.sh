#!/usr/bin/env bash
# The image's arm64 binary as the Dockerfile's build stage makes it, without Docker: cross-
# compiled on this (amd64) host with Debian's aarch64 gcc and cargo-auditable, at the versions
# and with the environment the Dockerfile names, then checked: an aarch64 ELF that needs no
# glibc newer than bookworm's (the distroless base's), that runs (`keyward version`, under
# qemu-user), and whose .dep-v0 section lists the crates cargo links for that target (what the
# image's SBOM is read from). The dev profile, for time; the Dockerfile builds `dist`.
# Used by .ci/run and `make cross-check`.
set -euo pipefail
cd "$(dirname "$0")/.."
target=aarch64-unknown-linux-gnu
auditable_version="$(sed -n 's/^ARG CARGO_AUDITABLE_VERSION=//p' Dockerfile)"
[[ -n "$auditable_version" ]] || { echo "cross-check: no ARG CARGO_AUDITABLE_VERSION in the Dockerfile" >&2; exit 1; }

packages=(gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user binutils-aarch64-linux-gnu file)
for package in "${packages[@]}"; do
  if [[ "$(dpkg-query -W -f='${db:Status-Status}' "$package" 2>/dev/null)" != installed ]]; then
    apt-get update -qq && apt-get install -y -qq --no-install-recommends "${packages[@]}" >/dev/null
    break
  fi
done
rustup target list --installed | grep -qx "$target" || rustup target add "$target"
tools=target/ci-tools
if [[ "$(cargo install --list --root "$tools" 2>/dev/null)" != *"cargo-auditable v$auditable_version:"* ]]; then
  cargo install --quiet --force --locked --version "$auditable_version" --root "$tools" cargo-auditable
fi

# The Dockerfile's environment for the aarch64 target (its ENV lines), then its build command.
while IFS= read -r assignment; do
  export "${assignment?}"
done < <(sed -n 's/^[ ]*\(ENV \)\{0,1\}\(CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER\|CC_aarch64_unknown_linux_gnu\|AR_aarch64_unknown_linux_gnu\)=\([^ \\]*\).*/\2=\3/p' Dockerfile)
[[ -n "${CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER:-}" ]] || { echo "cross-check: the Dockerfile sets no aarch64 linker" >&2; exit 1; }
PATH="$PWD/$tools/bin:$PATH" CARGO_TARGET_DIR=target/cross \
  cargo auditable build --locked --bin keyward --target "$target"
binary="target/cross/$target/debug/keyward"

file "$binary" | grep -q 'ARM aarch64' || { echo "cross-check: $binary is not an aarch64 binary" >&2; exit 1; }
newest_glibc="$(aarch64-linux-gnu-objdump -T "$binary" | grep -o 'GLIBC_[0-9.]*' | sort -Vu | tail -1)"
if [[ "$(printf '%s\nGLIBC_2.36\n' "$newest_glibc" | sort -V | tail -1)" != GLIBC_2.36 ]]; then
  echo "cross-check: $binary needs $newest_glibc, newer than bookworm's 2.36" >&2
  exit 1
fi
qemu-aarch64 -L /usr/aarch64-linux-gnu "$binary" version | head -1
python3 scripts/dep_section.py "$binary" "$target"
