#!/usr/bin/env bash
# Every container image in what keyward ships (the installs, their one-file renders, the
# audit) is the release placeholder, which the release workflow pins by digest, or a digest:
# never a tag that can change under an install. Used by .ci/run and `make image-refs`.
set -euo pipefail
cd "$(dirname "$0")/.."
python=target/ci-venv/bin/python
for install in deploy/overlays/cert-manager deploy/overlays/self-managed deploy/overlays/openshift deploy/audit; do
  echo "$install"
  kubectl kustomize "$install" | "$python" deploy/image_refs.py check -
done
"$python" deploy/image_refs.py check deploy/keyward.yaml deploy/keyward-self-managed.yaml
"$python" deploy/test_image_refs.py
