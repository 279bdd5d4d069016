#!/usr/bin/env bash
# kubectl at the version CI renders deploy/ with (its built-in kustomize decides every rendered
# install), checked against the release's published SHA-256, into DIR. Used by the release
# workflow, whose runner's own kubectl is whatever the runner image ships this week.
#
#   scripts/install-kubectl.sh DIR
set -euo pipefail
version=v1.32.4 # kustomize v5.5.0, as on the machines .ci/run runs on
dir="${1:?usage: scripts/install-kubectl.sh DIR}"
arch="$(uname -m)"
case "$arch" in
  x86_64) arch=amd64 ;;
  aarch64) arch=arm64 ;;
  *) echo "install-kubectl: no kubectl build for $arch" >&2; exit 1 ;;
esac
base="https://dl.k8s.io/release/$version/bin/linux/$arch/kubectl"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
curl -fsSL --retry 3 -o "$tmp/kubectl" "$base"
curl -fsSL --retry 3 -o "$tmp/kubectl.sha256" "$base.sha256"
echo "$(cat "$tmp/kubectl.sha256")  $tmp/kubectl" | sha256sum --check --quiet
mkdir -p "$dir"
install -m 0755 "$tmp/kubectl" "$dir/kubectl"
"$dir/kubectl" version --client
