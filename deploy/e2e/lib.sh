# shellcheck shell=bash
# Helpers of deploy/e2e/kind.sh, kept apart so that tests/e2e_script.rs exercises them offline.
# Sourced; defines, runs nothing.

# The webhook's pods and the controller's: both carry app.kubernetes.io/name=keyward.
WEBHOOK_PODS="app.kubernetes.io/name=keyward,app.kubernetes.io/component=webhook"
CONTROLLER_PODS="app.kubernetes.io/name=keyward,app.kubernetes.io/component=controller"
export WEBHOOK_PODS CONTROLLER_PODS

# volume_jsonpath VOLUME FIELD: the kubectl jsonpath of FIELD in a pod's volume named VOLUME.
# Always by name, never by index: the ServiceAccount admission plugin adds kube-api-access-*
# before any webhook runs, and keyward appends its volumes after the pod's own.
volume_jsonpath() {
  printf '{.spec.volumes[?(@.name=="%s")].%s}' "$1" "$2"
}

# wait_for_cert_manager KUBECTL...: waits until cert-manager's webhook admits cert-manager
# resources. A rolled-out webhook Deployment is not enough: the apiserver cannot call it until
# cainjector has put its CA in the webhook configurations. cert-manager documents checking with
# `cmctl check api --wait`, which makes a server-side dry-run request; this does the same with
# kubectl alone. Tries WAIT_TRIES times (60), WAIT_INTERVAL seconds (2) apart.
wait_for_cert_manager() {
  local probe tries="${WAIT_TRIES:-60}" i
  probe='{"apiVersion": "cert-manager.io/v1", "kind": "Issuer",
          "metadata": {"name": "keyward-e2e-probe", "namespace": "cert-manager"},
          "spec": {"selfSigned": {}}}'
  for ((i = 1; i <= tries; i++)); do
    if printf '%s\n' "$probe" | "$@" apply --dry-run=server -f - >/dev/null 2>&1; then
      return 0
    fi
    sleep "${WAIT_INTERVAL:-2}"
  done
  echo "cert-manager's webhook did not admit a dry-run Issuer after $tries tries" >&2
  return 1
}

# cluster_exists NAME: whether kind already has a cluster of that name.
cluster_exists() {
  kind get clusters 2>/dev/null | grep -qxF "$1"
}

# === checks: each fails (exit 1, FAIL: on stderr) when its subject is broken ===

say() { printf '\n==> %s\n' "$*"; }
fail() { printf '\nFAIL: %s\n' "$*" >&2; exit 1; }

# expect LABEL ACTUAL EXPECTED
expect() {
  if [[ "$2" != "$3" ]]; then fail "$1: got '$2', expected '$3'"; fi
  echo "ok: $1 = $3"
}

# expect_contains LABEL HAYSTACK NEEDLE (an empty needle is refused: it would match anything)
expect_contains() {
  if [[ -z "$3" ]]; then fail "$1: nothing to look for"; fi
  if [[ "$2" != *"$3"* ]]; then fail "$1: '$3' not in '$2'"; fi
  echo "ok: $1 has $3"
}

# output_has NEEDLE COMMAND...: whether COMMAND succeeds and prints NEEDLE. The output is read
# whole: `COMMAND | grep -q` under pipefail fails when grep quits early and COMMAND gets SIGPIPE.
output_has() {
  local needle="$1" out
  shift
  out="$("$@" 2>/dev/null)" || return 1
  [[ "$out" == *"$needle"* ]]
}

# prints EXPECTED COMMAND...: whether COMMAND succeeds and prints exactly EXPECTED.
prints() {
  local expected="$1" out
  shift
  out="$("$@" 2>/dev/null)" || return 1
  [[ "$out" == "$expected" ]]
}

# line_with NEEDLE COMMAND...: the first line of COMMAND's output holding NEEDLE (empty if none).
line_with() {
  local needle="$1" out line
  shift
  out="$("$@" 2>/dev/null)" || return 0
  while IFS= read -r line; do
    if [[ "$line" == *"$needle"* ]]; then printf '%s\n' "$line"; return 0; fi
  done <<<"$out"
}

# wait_settled SELECTOR KUBECTL...: waits until no pod matching SELECTOR is terminating.
# `rollout status` returns while the old pods are still in their shutdown delay; a check that
# lists pods then reads one that is on its way out. Tries WAIT_TRIES times (60), WAIT_INTERVAL
# seconds (2) apart.
wait_settled() {
  local selector="$1" tries="${WAIT_TRIES:-60}" i out
  shift
  for ((i = 1; i <= tries; i++)); do
    if out="$("$@" get pods -l "$selector" -o jsonpath='{.items[*].metadata.deletionTimestamp}')" && [[ -z "$out" ]]; then
      return 0
    fi
    sleep "${WAIT_INTERVAL:-2}"
  done
  echo "pods $selector still terminating after $tries tries" >&2
  return 1
}
