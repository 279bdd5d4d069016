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
