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

# expect LABEL ACTUAL EXPECTED. An empty EXPECTED is refused: `expect L "$(cmd)" ""` passes
# when cmd fails (a refused pod prints nothing), so such a check is expect_output's.
expect() {
  if [[ -z "$3" ]]; then fail "$1: expects nothing, which a failed command prints too: check it with expect_output"; fi
  if [[ "$2" != "$3" ]]; then fail "$1: got '$2', expected '$3'"; fi
  echo "ok: $1 = $3"
}

# expect_output LABEL EXPECTED COMMAND...: COMMAND succeeds and prints exactly EXPECTED (which
# may be empty). A command that fails, a pod the API server refuses, fails the check.
expect_output() {
  local label="$1" expected="$2" out
  shift 2
  out="$("$@")" || fail "$label: the command failed: $*"
  if [[ "$out" != "$expected" ]]; then fail "$label: got '$out', expected '$expected'"; fi
  echo "ok: $label = '$expected'"
}

# expect_output_contains LABEL NEEDLE COMMAND...: COMMAND succeeds and prints NEEDLE.
expect_output_contains() {
  local label="$1" needle="$2" out
  shift 2
  out="$("$@")" || fail "$label: the command failed: $*"
  expect_contains "$label" "$out" "$needle"
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

# grpc_job_status NAME NAMESPACE: one gRPC message frame of fms-lm-eval-service's JobStatus
# {job_name: NAME (field 1), job_namespace: NAMESPACE (field 2)}, as the driver sends it to
# UpdateStatus; the fields the lmeval recipe's rule reads. Both under 60 bytes (one-byte
# lengths).
grpc_job_status() {
  local name="$1" namespace="$2"
  if (( ${#name} >= 60 || ${#namespace} >= 60 )); then
    echo "grpc_job_status: names under 60 bytes only" >&2
    return 1
  fi
  # shellcheck disable=SC2059 # the format is the escape of one byte, made from a number
  _byte() { printf "\\$(printf %03o "$1")"; }
  _byte 0; _byte 0; _byte 0; _byte 0; _byte $((4 + ${#name} + ${#namespace}))
  _byte 10; _byte "${#name}"; printf %s "$name"
  _byte 18; _byte "${#namespace}"; printf %s "$namespace"
}

# gate_check_verdict OUTPUT: gate-check.sh's OUTPUT says the job's own update passed
# (grpc-status 0) and another job's was refused (grpc-status 7, PERMISSION_DENIED).
gate_check_verdict() {
  local own other
  own="$(sed -n '/^CALL own$/,/^CALL other$/p' <<<"$1")"
  other="$(sed -n '/^CALL other$/,$p' <<<"$1")"
  expect_contains "the gate lets a job update its own status" "$own" "grpc-status: 0"
  expect_contains "the gate refuses another job's update" "$other" "grpc-status: 7"
}
