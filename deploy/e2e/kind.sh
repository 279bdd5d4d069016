#!/usr/bin/env bash
# End to end on a real cluster: kind + cert-manager + keyward, for a person with Docker.
#
#   deploy/e2e/kind.sh            # create, test (cert-manager, then self-managed), delete
#   KEEP=1 deploy/e2e/kind.sh     # keep the cluster afterwards to poke at it
#
# Needs: docker (with BuildKit), kind (v0.31.0 or later, for Kubernetes 1.35), kubectl, openssl.
# Covers: the cert-manager install (webhook, controller, serving certificate and its rotation),
# injection of the built-ins and leaving other pods alone, the attestation and its admission
# policy, client certificates by Secret and by pod certificate with an mTLS handshake, the server
# CA's provisioning and removal, the self-managed install (its CAs, caBundle repair, a CA
# rotation under load), keyward gate as the lm-eval operator's native sidecar with the lmeval
# recipe (a job's own update passes, another job's is refused, the gate's metrics), and the
# monitoring component (admitted by the Prometheus Operator's CRDs; no Prometheus runs) and the
# audit CronJob (a Job from it runs the install's image and reads the cluster). Not covered:
# account provisioning (--provision-accounts), OpenShift, scraping by a real Prometheus.
# The cluster runs Kubernetes 1.35 with pod certificates on (deploy/e2e/kind-config.yaml), so
# both deliveries of the client certificate run: a Secret, then a pod certificate. Pulls
# kindest/node, cert-manager and
# two small images from the internet. Exits non-zero on the first failure, and deletes the
# cluster it created either way (unless KEEP=1); a cluster of that name that was already there
# is refused, never deleted.
set -euo pipefail

CLUSTER="${CLUSTER:-keyward-e2e}"
# kind v0.31.0's image; pod certificates need Kubernetes >= 1.35 (matchConditions, >= 1.30).
KIND_NODE_IMAGE="${KIND_NODE_IMAGE:-kindest/node:v1.35.0@sha256:452d707d4862f52530247495d180205e029056831160e22870e37e3f6c1ac31f}"
# A supported cert-manager whose support matrix holds the node's Kubernetes (README, "Deploy").
CERT_MANAGER_VERSION="${CERT_MANAGER_VERSION:-v1.21.1}"
# The Prometheus Operator's CRDs only (its release's stripped-down-crds.yaml), for the monitoring
# component's objects.
PROMETHEUS_OPERATOR_VERSION="${PROMETHEUS_OPERATOR_VERSION:-v0.93.1}"
IMAGE="keyward:dev"                                           # what deploy/overlays/local installs
NS="keyward-e2e-jobs"
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
CTX="kind-${CLUSTER}"
K=(kubectl --context "$CTX")
WORK="$(mktemp -d)"
CREATED=0
# shellcheck source=deploy/e2e/lib.sh
source "$ROOT/deploy/e2e/lib.sh"

cleanup() {
  status=$?
  if [[ $status -ne 0 && $CREATED == 1 ]]; then
    echo "--- keyward logs ---" >&2
    "${K[@]}" -n keyward-system logs -l app.kubernetes.io/name=keyward --tail=50 --prefix >&2 || true
  fi
  rm -rf "$WORK"
  if [[ $CREATED != 1 ]]; then
    :
  elif [[ "${KEEP:-0}" == "1" ]]; then
    echo "cluster kept: kubectl --context $CTX ..."
  else
    kind delete cluster --name "$CLUSTER" >/dev/null 2>&1 || true
  fi
  exit $status
}
trap cleanup EXIT

for tool in docker kind kubectl openssl; do
  command -v "$tool" >/dev/null || fail "$tool is not installed"
done

# rolled_out: both Deployments rolled out, and their old pods gone (not merely terminating).
rolled_out() {
  "${K[@]}" -n keyward-system rollout status deploy/keyward --timeout=180s
  "${K[@]}" -n keyward-system rollout status deploy/keyward-controller --timeout=180s
  wait_settled "$WEBHOOK_PODS" "${K[@]}" -n keyward-system || fail "old webhook pods did not go"
  wait_settled "$CONTROLLER_PODS" "${K[@]}" -n keyward-system || fail "old controller pods did not go"
}

say "kind cluster $CLUSTER ($KIND_NODE_IMAGE)"
if cluster_exists "$CLUSTER"; then
  fail "a kind cluster named $CLUSTER exists already (KEEP=1 leaves one behind); delete it with 'kind delete cluster --name $CLUSTER', or run with CLUSTER=another-name"
fi
kind create cluster --name "$CLUSTER" --image "$KIND_NODE_IMAGE" --config "$ROOT/deploy/e2e/kind-config.yaml" --wait 120s
CREATED=1

say "cert-manager $CERT_MANAGER_VERSION"
"${K[@]}" apply -f "https://github.com/cert-manager/cert-manager/releases/download/${CERT_MANAGER_VERSION}/cert-manager.yaml"
"${K[@]}" -n cert-manager rollout status deploy/cert-manager deploy/cert-manager-webhook deploy/cert-manager-cainjector --timeout=180s
wait_for_cert_manager "${K[@]}" || fail "cert-manager is not ready"

say "build and load $IMAGE"
# No provenance attestation: with Docker's containerd image store, `kind load` fails on an
# image that carries one (kind #3795).
DOCKER_BUILDKIT=1 docker build --provenance=false -t "$IMAGE" --build-arg VERSION="e2e-$(git -C "$ROOT" describe --tags --always --dirty 2>/dev/null || echo unknown)" "$ROOT"
kind load docker-image "$IMAGE" --name "$CLUSTER"

say "the fms-lm-eval-service operator's side: its namespace and gRPC serving certificate"
# deploy/gate/example's own Issuer and Certificate (as fms-lm-eval-service's config/certmanager
# makes them: a self-signed certificate whose Secret grpc-server-cert, with ca.crt, keyward
# copies into each opted-in namespace), taken from the gate step's install by its label, so
# that they exist before keyward does, as the operator's would.
"${K[@]}" create namespace lm-eval
"${K[@]}" apply -k "$ROOT/deploy/e2e/gate" -l e2e.keyward.io/step=operator-certificate
"${K[@]}" -n lm-eval wait certificate/lm-eval-grpc-server-cert --for=condition=Ready --timeout=120s

say "apply deploy/overlays/local (the cert-manager install, with $IMAGE)"
"${K[@]}" apply -k "$ROOT/deploy/overlays/local"
"${K[@]}" -n keyward-system wait certificate/keyward-serving --for=condition=Ready --timeout=120s
rolled_out
ca_bundle="$("${K[@]}" get mutatingwebhookconfiguration keyward -o jsonpath='{.webhooks[0].clientConfig.caBundle}')"
[[ -n "$ca_bundle" ]] || fail "cainjector did not fill caBundle"
echo "ok: caBundle injected"

say "a namespace that opts in, with what the profiles refer to"
"${K[@]}" create namespace "$NS"
"${K[@]}" label namespace "$NS" keyward.io/inject=enabled
# The ServiceAccount admission plugin refuses pods until the namespace's default account exists.
for _ in $(seq 30); do "${K[@]}" -n "$NS" get serviceaccount default >/dev/null 2>&1 && break; sleep 1; done
# keyward's controller provisions the server CA, copied from lm-eval/grpc-server-cert.
for _ in $(seq 60); do "${K[@]}" -n "$NS" get configmap keyward-lmeval-server-ca >/dev/null 2>&1 && break; sleep 1; done
expect "server CA provisioned" "$("${K[@]}" -n "$NS" get configmap keyward-lmeval-server-ca -o jsonpath='{.data.ca\.crt}')" \
  "$("${K[@]}" -n lm-eval get secret grpc-server-cert -o jsonpath='{.data.ca\.crt}' | base64 -d)"
expect "provisioned by keyward" "$("${K[@]}" -n "$NS" get configmap keyward-lmeval-server-ca -o jsonpath='{.metadata.labels.app\.kubernetes\.io/managed-by}')" keyward
# The operator's account lives in its own namespace: the shipped manifests pin the lmeval
# built-in to lm-eval (--operator-namespace=lmeval=lm-eval).
"${K[@]}" -n lm-eval create serviceaccount lm-eval-controller-manager
# The operator's service account may create pods here (we impersonate it below).
"${K[@]}" -n "$NS" create role pod-creator --verb=create --resource=pods
"${K[@]}" -n "$NS" create rolebinding operators-create-pods --role=pod-creator \
  --serviceaccount="lm-eval:lm-eval-controller-manager"

# Server-side dry run: the apiserver runs every admission webhook (keyward is sideEffects:
# None) and returns the pod it would store. Owner references need no real owner.
dry_create() { # USER FILE JSONPATH
  "${K[@]}" --as="$1" --as-group=system:serviceaccounts create --dry-run=server -n "$NS" -f "$2" -o jsonpath="$3"
}

say "an LMEvalJob driver pod (fms-lm-eval-service), created by the operator's service account"
cat > "$WORK/lmeval.yaml" <<YAML
apiVersion: v1
kind: Pod
metadata:
  name: evaljob-sample
  labels: {app.kubernetes.io/name: fms-lm-eval-service}
  ownerReferences:
    - {apiVersion: foundation-model-stack.github.com.github.com/v1beta1, kind: LMEvalJob, name: evaljob-sample, uid: 4b7a8a1e-9f7e-4c1b-9d52-3c0e4d1c2a11, controller: true}
spec:
  restartPolicy: Never
  initContainers:
    - {name: driver, image: registry.k8s.io/pause:3.10}
  containers:
    - {name: main, image: registry.k8s.io/pause:3.10}
YAML
LMEVAL_USER="system:serviceaccount:lm-eval:lm-eval-controller-manager"
# The account is kept and its token no longer mounted: only keyward sets the second.
expect_output "lmeval keeps its service account, without its token" "default false" \
  dry_create "$LMEVAL_USER" "$WORK/lmeval.yaml" '{.spec.serviceAccountName} {.spec.automountServiceAccountToken}'
expect_output "lmeval volumes" "keyward-client-cert keyward-server-ca" dry_create "$LMEVAL_USER" "$WORK/lmeval.yaml" '{.spec.volumes[*].name}'
expect "lmeval client Secret" \
  "$(dry_create "$LMEVAL_USER" "$WORK/lmeval.yaml" "$(volume_jsonpath keyward-client-cert secret.secretName)")" evaljob-sample-lmeval-client
# Injected (the volumes), and the init container left as it was (no mounts).
expect_output "lmeval driver init container untouched" "keyward-client-cert keyward-server-ca|" \
  dry_create "$LMEVAL_USER" "$WORK/lmeval.yaml" '{.spec.volumes[*].name}|{.spec.initContainers[0].volumeMounts}'
expect_output "lmeval main env" "GRPC_CLIENT_CERT GRPC_CLIENT_KEY GRPC_SERVER_CA" \
  dry_create "$LMEVAL_USER" "$WORK/lmeval.yaml" '{.spec.containers[0].env[*].name}'
expect_output_contains "lmeval audit annotation" '"profile":"lmeval"' \
  dry_create "$LMEVAL_USER" "$WORK/lmeval.yaml" '{.metadata.annotations.keyward\.io/injected}'
# The admission attestation the controller checks before it issues (the key is the Secret
# keyward-attestation, which the controller created and the webhook mounts).
attestation="$(dry_create "$LMEVAL_USER" "$WORK/lmeval.yaml" '{.metadata.annotations.keyward\.io/attestation}')"
expect_contains "lmeval admission attestation" "$attestation" 'v2.'
# A copy of it on a pod of one's own: removed by the webhook where the webhook sees the pod
# (not selected by any profile, here), refused by the admission policy where it does not.
sed -e "s#^  labels: {app.kubernetes.io/name: fms-lm-eval-service}#  labels: {app: tenant}\n  annotations: {keyward.io/attestation: \"$attestation\"}#" \
  "$WORK/lmeval.yaml" > "$WORK/copied.yaml"
expect_output "a copied attestation is removed by the webhook" "tenant|" \
  dry_create "$LMEVAL_USER" "$WORK/copied.yaml" '{.metadata.labels.app}|{.metadata.annotations}'
sed -e 's#{app: tenant}#{app: tenant, keyward.io/inject: disabled}#' "$WORK/copied.yaml" > "$WORK/copied-opted-out.yaml"
if out="$("${K[@]}" create --dry-run=server -n "$NS" -f "$WORK/copied-opted-out.yaml" 2>&1)"; then
  fail "a pod labelled out of the webhook's reach was created with a copied attestation: $out"
fi
expect_contains "a copied attestation on an opted-out pod" "$out" "keyward.io/attestation is written only by keyward's webhook"
# The pod opt-out: labelled keyward.io/inject=disabled, it is never sent to keyward.
sed 's#labels: {app.kubernetes.io/name: fms-lm-eval-service}#labels: {app.kubernetes.io/name: fms-lm-eval-service, keyward.io/inject: disabled}#' \
  "$WORK/lmeval.yaml" > "$WORK/lmeval-opted-out.yaml"
expect_output "opted-out pod not injected" "disabled|" \
  dry_create "$LMEVAL_USER" "$WORK/lmeval-opted-out.yaml" '{.metadata.labels.keyward\.io/inject}|{.metadata.annotations}'
if out="$("${K[@]}" create --dry-run=server -n "$NS" -f "$WORK/lmeval.yaml" 2>&1)"; then
  fail "a user copying the operator's labels was admitted: $out"
fi
expect_contains "lmeval from another user" "$out" 'profile "lmeval" selects this pod, and only'

say "a Kubeflow Pipelines persistence agent Deployment without its token (real pods, created by the ReplicaSet controller)"
cat > "$WORK/kfp.yaml" <<YAML
apiVersion: apps/v1
kind: Deployment
metadata:
  name: ml-pipeline-persistenceagent
spec:
  replicas: 1
  selector:
    matchLabels: {app: ml-pipeline-persistenceagent}
  template:
    metadata:
      labels: {app: ml-pipeline-persistenceagent}
    spec:
      containers:
        - {name: ml-pipeline-persistenceagent, image: registry.k8s.io/pause:3.10}
YAML
"${K[@]}" -n "$NS" apply -f "$WORK/kfp.yaml"
"${K[@]}" -n "$NS" rollout status deploy/ml-pipeline-persistenceagent --timeout=120s
kfp_name="$("${K[@]}" -n "$NS" get pods -l app=ml-pipeline-persistenceagent -o jsonpath='{.items[0].metadata.name}')"
kfp_pod() { "${K[@]}" -n "$NS" get pod "$kfp_name" -o jsonpath="$1"; }
expect_contains "kfp token volume" "$(kfp_pod '{.spec.volumes[*].name}')" "persistenceagent-sa-token"
expect "kfp token audience" \
  "$(kfp_pod "$(volume_jsonpath persistenceagent-sa-token 'projected.sources[0].serviceAccountToken.audience')")" pipelines.kubeflow.org
# The agent re-reads its token hourly: a lifetime it never outlives (webhooks/profiles/kfp.yaml).
expect "kfp token lifetime" \
  "$(kfp_pod "$(volume_jsonpath persistenceagent-sa-token 'projected.sources[0].serviceAccountToken.expirationSeconds')")" 21600
expect_contains "kfp keeps the API token" "$(kfp_pod '{.spec.volumes[*].name}')" "kube-api-access-"
expect_contains "kfp token mount" "$(kfp_pod '{.spec.containers[0].volumeMounts[*].mountPath}')" "/var/run/secrets/kubeflow/tokens"

say "a pod no built-in serves (a KubeRay worker) is left alone"
cat > "$WORK/ray.yaml" <<YAML
apiVersion: v1
kind: Pod
metadata:
  generateName: raycluster-sample-worker-
  labels: {ray.io/is-ray-node: "yes", ray.io/cluster: raycluster-sample, ray.io/node-type: worker}
spec:
  containers:
    - {name: ray-worker, image: registry.k8s.io/pause:3.10}
YAML
expect_output "ray pod unchanged" "raycluster-sample||" \
  dry_create "$LMEVAL_USER" "$WORK/ray.yaml" '{.metadata.labels.ray\.io/cluster}|{.metadata.annotations}|{.spec.volumes[?(@.name=="keyward-client-cert")].name}'

say "an LMEvalJob driver pod reaches Running and completes an mTLS handshake with the operator's side"
# A TLS server in lm-eval standing in for the operator's gRPC server: its certificate is
# grpc-server-cert, and it requires client certificates from keyward's client CA (the
# ConfigMap the controller publishes to lm-eval, as the operator would mount for GRPC_CLIENT_CA).
for _ in $(seq 60); do "${K[@]}" -n lm-eval get configmap keyward-client-ca >/dev/null 2>&1 && break; sleep 1; done
"${K[@]}" apply -f - <<YAML
apiVersion: apps/v1
kind: Deployment
metadata: {name: tls-echo, namespace: lm-eval}
spec:
  selector: {matchLabels: {app: tls-echo}}
  template:
    metadata: {labels: {app: tls-echo}}
    spec:
      containers:
        - name: server
          image: docker.io/alpine/openssl:3.3.2
          command: [openssl, s_server, -accept, "8443", -cert, /srv/tls.crt, -key, /srv/tls.key,
                    -Verify, "1", -verify_return_error, -CAfile, /client-ca/ca.crt, -www]
          volumeMounts:
            - {name: cert, mountPath: /srv, readOnly: true}
            - {name: client-ca, mountPath: /client-ca, readOnly: true}
      volumes:
        - {name: cert, secret: {secretName: grpc-server-cert}}
        - {name: client-ca, configMap: {name: keyward-client-ca}}
---
apiVersion: v1
kind: Service
metadata: {name: tls-echo, namespace: lm-eval}
spec:
  selector: {app: tls-echo}
  ports: [{port: 8443, targetPort: 8443}]
YAML
"${K[@]}" -n lm-eval rollout status deploy/tls-echo --timeout=120s
# The LMEvalJob kind, and one job: the owner keyward checks before issuing.
"${K[@]}" apply -f - <<YAML
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: lmevaljobs.foundation-model-stack.github.com.github.com}
spec:
  group: foundation-model-stack.github.com.github.com
  names: {kind: LMEvalJob, plural: lmevaljobs, singular: lmevaljob}
  scope: Namespaced
  versions:
    - name: v1beta1
      served: true
      storage: true
      schema: {openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}}
YAML
"${K[@]}" wait crd/lmevaljobs.foundation-model-stack.github.com.github.com --for=condition=Established --timeout=60s
# new_job NAME: an LMEvalJob in $NS; prints its UID.
new_job() {
  printf 'apiVersion: foundation-model-stack.github.com.github.com/v1beta1\nkind: LMEvalJob\nmetadata: {name: %s}\nspec: {}\n' "$1" \
    | "${K[@]}" -n "$NS" apply -f - >/dev/null
  "${K[@]}" -n "$NS" get lmevaljob "$1" -o jsonpath='{.metadata.uid}'
}
job_uid="$(new_job e2e-eval)"
# The check the driver runs is deploy/e2e/mtls-check.sh, the same file tests/e2e_script.rs runs
# offline against a local openssl s_server (and a rogue client certificate, which must fail).
"${K[@]}" -n "$NS" create configmap e2e-mtls-check --from-file=mtls-check.sh="$ROOT/deploy/e2e/mtls-check.sh"
cat > "$WORK/driver.yaml" <<YAML
apiVersion: v1
kind: Pod
metadata:
  name: e2e-eval
  labels: {app.kubernetes.io/name: fms-lm-eval-service}
  ownerReferences:
    - {apiVersion: foundation-model-stack.github.com.github.com/v1beta1, kind: LMEvalJob, name: e2e-eval, uid: $job_uid, controller: true}
spec:
  restartPolicy: Never
  containers:
    - name: main
      image: docker.io/alpine/openssl:3.3.2
      command: [sh, -ec]
      args:
        - |
          sh /e2e/mtls-check.sh tls-echo.lm-eval.svc 8443 "\$GRPC_CLIENT_CERT" "\$GRPC_CLIENT_KEY" "\$GRPC_SERVER_CA"
          sleep 3600
      volumeMounts:
        - {name: e2e, mountPath: /e2e, readOnly: true}
  volumes:
    - {name: e2e, configMap: {name: e2e-mtls-check}}
YAML
"${K[@]}" --as="$LMEVAL_USER" --as-group=system:serviceaccounts -n "$NS" create -f "$WORK/driver.yaml"
# Created before its Secret exists: keyward's controller issues it, the kubelet retries the mount.
# The check's verdict is in the log (MTLS-OK; or MTLS-FAILED or FILES-MISSING, and the
# container exits).
for _ in $(seq 90); do
  output_has 'MTLS-' "${K[@]}" -n "$NS" logs e2e-eval || output_has 'FILES-MISSING' "${K[@]}" -n "$NS" logs e2e-eval || { sleep 2; continue; }
  break
done
expect_contains "driver files" "$("${K[@]}" -n "$NS" logs e2e-eval)" FILES-PRESENT
expect_contains "driver mTLS request answered" "$("${K[@]}" -n "$NS" logs e2e-eval)" MTLS-OK
expect "client certificate owner" "$("${K[@]}" -n "$NS" get secret e2e-eval-lmeval-client -o jsonpath='{.metadata.ownerReferences[0].uid}')" "$job_uid"
expect_contains "client certificate identity" \
  "$("${K[@]}" -n "$NS" get secret e2e-eval-lmeval-client -o jsonpath='{.data.tls\.crt}' | base64 -d | openssl x509 -noout -ext subjectAltName)" \
  "URI:spiffe://cluster.local/ns/$NS/lmevaljob/e2e-eval"
expect "injected pods listed by their profile label" \
  "$("${K[@]}" -n "$NS" get pods -l keyward.io/profile=lmeval -o jsonpath='{.items[*].metadata.name}')" "e2e-eval"

say "pod certificates: the driver's key made by the kubelet, signed by keyward's controller"
# The same driver under deploy/profiles/lmeval-pod-certificate.yaml (delivery: podCertificate),
# mounted in both Deployments by deploy/overlays/local-pod-certificates.
"${K[@]}" apply -k "$ROOT/deploy/overlays/local-pod-certificates"
rolled_out
# Each new replica found the API and signs for the mounted profile's signer (a replica without
# the profile prints the line with no signer).
for pod in $("${K[@]}" -n keyward-system get pods -l "$CONTROLLER_PODS" -o name); do
  expect_contains "$pod signs for keyward.io/lmeval" \
    "$(line_with 'signing PodCertificateRequests' "${K[@]}" -n keyward-system logs "$pod")" 'keyward.io/lmeval'
done
# What it told the webhook for profiles with delivery: auto (webhooks/src/cluster.rs).
expect "cluster facts" "$("${K[@]}" -n keyward-system get configmap keyward-cluster-facts -o jsonpath='{.data.facts\.json}')" \
  '{"podCertificates":"v1beta1"}'
pc_uid="$(new_job e2e-pc)"
sed -e "s/e2e-eval/e2e-pc/g" -e "s/$job_uid/$pc_uid/" "$WORK/driver.yaml" > "$WORK/driver-pc.yaml"
"${K[@]}" --as="$LMEVAL_USER" --as-group=system:serviceaccounts -n "$NS" create -f "$WORK/driver-pc.yaml"
# The kubelet asks keyward.io/lmeval through a PodCertificateRequest; the pod starts once issued.
for _ in $(seq 90); do
  output_has 'MTLS-' "${K[@]}" -n "$NS" logs e2e-pc || output_has 'FILES-MISSING' "${K[@]}" -n "$NS" logs e2e-pc || { sleep 2; continue; }
  break
done
expect_contains "pod certificate driver files" "$("${K[@]}" -n "$NS" logs e2e-pc)" FILES-PRESENT
expect_contains "pod certificate mTLS request answered" "$("${K[@]}" -n "$NS" logs e2e-pc)" MTLS-OK
expect "pod certificate volume" \
  "$("${K[@]}" -n "$NS" get pod e2e-pc -o jsonpath="$(volume_jsonpath keyward-client-cert 'projected.sources[0].podCertificate.signerName')")" keyward.io/lmeval
# The server CA from the one ClusterTrustBundle keyward's controller publishes from the source
# (no ConfigMap in the namespace): the driver's mTLS check above verified the server with it.
expect "server CA volume" \
  "$("${K[@]}" -n "$NS" get pod e2e-pc -o jsonpath="$(volume_jsonpath keyward-server-ca 'projected.sources[0].clusterTrustBundle.name')")" keyward-lmeval-server-ca
fingerprint() { openssl x509 -noout -fingerprint -sha256; }
expect "server CA trust bundle" \
  "$("${K[@]}" get clustertrustbundles keyward-lmeval-server-ca -o jsonpath='{.spec.trustBundle}' | fingerprint)" \
  "$("${K[@]}" -n lm-eval get secret grpc-server-cert -o jsonpath='{.data.ca\.crt}' | base64 -d | fingerprint)"
pcr() { "${K[@]}" -n "$NS" get podcertificaterequests -o jsonpath="{.items[?(@.spec.podName==\"e2e-pc\")]$1}"; }
expect "pod certificate request" "$(pcr '.status.conditions[0].type')" Issued
expect_contains "pod certificate identity" "$(pcr '.status.certificateChain' | openssl x509 -noout -ext subjectAltName)" \
  "URI:spiffe://cluster.local/ns/$NS/lmevaljob/e2e-pc"
if "${K[@]}" -n "$NS" get secret e2e-pc-lmeval-client >/dev/null 2>&1; then
  fail "a client certificate Secret was made for a pod certificate delivery"
fi
echo "ok: no Secret holds the pod certificate's key"
# Back to the Secret delivery for the rest.
"${K[@]}" apply -k "$ROOT/deploy/overlays/local"
"${K[@]}" -n keyward-system delete configmap keyward-profiles
rolled_out

say "renew the serving certificate; keyward reloads it without a restart"
restarts_before="$("${K[@]}" -n keyward-system get pods -l "$WEBHOOK_PODS" -o jsonpath='{.items[*].status.containerStatuses[0].restartCount}')"
old_crt="$("${K[@]}" -n keyward-system get secret keyward-serving-tls -o jsonpath='{.data.tls\.crt}')"
# Deleting the Secret makes cert-manager issue a new one (rotationPolicy: Always: a new key).
"${K[@]}" -n keyward-system delete secret keyward-serving-tls
for _ in $(seq 60); do
  new_crt="$("${K[@]}" -n keyward-system get secret keyward-serving-tls -o jsonpath='{.data.tls\.crt}' 2>/dev/null || true)"
  [[ -n "$new_crt" && "$new_crt" != "$old_crt" ]] && break
  sleep 2
done
[[ -n "$new_crt" && "$new_crt" != "$old_crt" ]] || fail "cert-manager did not re-issue the serving certificate"
new_sha="$(echo "$new_crt" | base64 -d | openssl x509 -noout -fingerprint -sha256 | cut -d= -f2 | tr -d : | tr 'A-F' 'a-f')"
echo "new certificate sha256: $new_sha"
# The kubelet syncs Secret volumes within about a minute; each replica logs the reload.
for pod in $("${K[@]}" -n keyward-system get pods -l "$WEBHOOK_PODS" -o name); do
  for _ in $(seq 90); do
    output_has "\"sha256\":\"$new_sha\"" "${K[@]}" -n keyward-system logs "$pod" && break
    sleep 2
  done
  output_has "\"sha256\":\"$new_sha\"" "${K[@]}" -n keyward-system logs "$pod" || fail "$pod did not load the new certificate"
  echo "ok: $pod serves the new certificate"
done
expect "restarts after rotation" "$("${K[@]}" -n keyward-system get pods -l "$WEBHOOK_PODS" -o jsonpath='{.items[*].status.containerStatuses[0].restartCount}')" "$restarts_before"
expect "lmeval after rotation" \
  "$(dry_create "$LMEVAL_USER" "$WORK/lmeval.yaml" "$(volume_jsonpath keyward-client-cert secret.secretName)")" evaljob-sample-lmeval-client

say "opting the namespace out removes what keyward provisioned there"
"${K[@]}" label namespace "$NS" keyward.io/inject-
for _ in $(seq 60); do "${K[@]}" -n "$NS" get configmap keyward-lmeval-server-ca >/dev/null 2>&1 || break; sleep 1; done
if "${K[@]}" -n "$NS" get configmap keyward-lmeval-server-ca >/dev/null 2>&1; then
  fail "the server CA ConfigMap is still there after the namespace opted out"
fi
echo "ok: the server CA ConfigMap is gone"

say "self-managed certificates: the same cluster, keyward installed without cert-manager"
# keyward's own certificates replace cert-manager's (which stays installed for the lm-eval side
# above, and is not used by keyward from here on).
"${K[@]}" delete -k "$ROOT/deploy/overlays/local" --ignore-not-found --wait=true
"${K[@]}" apply -k "$ROOT/deploy/overlays/local-self-managed"
"${K[@]}" -n keyward-system rollout status deploy/keyward-controller --timeout=180s
for _ in $(seq 60); do "${K[@]}" -n keyward-system get secret keyward-serving >/dev/null 2>&1 && break; sleep 2; done
rolled_out
# The step above opted the namespace out: opt it in again, or no pod of it reaches keyward.
"${K[@]}" label namespace "$NS" keyward.io/inject=enabled
# No restart while the webhook waited for its Secret (liveness on the metrics port).
expect "webhook restarts while waiting for its certificate" \
  "$("${K[@]}" -n keyward-system get pods -l "$WEBHOOK_PODS" -o jsonpath='{.items[*].status.containerStatuses[0].restartCount}')" "0 0"
serving_ca() { "${K[@]}" -n keyward-system get secret keyward-serving -o jsonpath='{.data.ca\.crt}'; }
bundle() { "${K[@]}" get mutatingwebhookconfiguration keyward -o jsonpath='{.webhooks[0].clientConfig.caBundle}'; }
expect "caBundle is the self-managed CA" "$(bundle)" "$(serving_ca)"
expect "client CA made by the controller" \
  "$("${K[@]}" -n keyward-system get secret keyward-client-ca -o jsonpath='{.metadata.labels.app\.kubernetes\.io/managed-by}')" keyward
expect "lmeval with self-managed certificates" \
  "$(dry_create "$LMEVAL_USER" "$WORK/lmeval.yaml" "$(volume_jsonpath keyward-client-cert secret.secretName)")" evaljob-sample-lmeval-client

say "a wiped caBundle is restored"
"${K[@]}" patch mutatingwebhookconfiguration keyward --type=json -p '[{"op":"remove","path":"/webhooks/0/clientConfig/caBundle"}]'
for _ in $(seq 30); do [[ "$(bundle)" == "$(serving_ca)" ]] && break; sleep 1; done
expect "caBundle restored" "$(bundle)" "$(serving_ca)"

say "a CA rotation, while pods keep being admitted"
old_ca="$(serving_ca)"
failures=0
"${K[@]}" -n keyward-system annotate secret keyward-serving keyward.io/rotate-ca=now
# Introduce, switch (a minute after caBundle holds both), then retire once both replicas
# serve the new leaf (the kubelet's sync, up to a minute or two more).
injected_secret="$(volume_jsonpath keyward-client-cert secret.secretName)"
for _ in $(seq 120); do
  # Admitted, and injected: a pod keyward never saw would be admitted too, uninjected.
  prints evaljob-sample-lmeval-client dry_create "$LMEVAL_USER" "$WORK/lmeval.yaml" "$injected_secret" || failures=$((failures + 1))
  current="$(serving_ca)"
  previous="$("${K[@]}" -n keyward-system get secret keyward-serving -o jsonpath='{.data.ca-previous\.crt}')"
  [[ "$current" != "$old_ca" && -z "$previous" && "$(bundle)" == "$current" ]] && break
  sleep 3
done
[[ "$(serving_ca)" != "$old_ca" ]] || fail "the CA was not rotated"
expect "caBundle holds only the new CA" "$(bundle)" "$(serving_ca)"
expect "pods refused during the rotation" "$failures" 0

say "keyward gate as the lm-eval operator's native sidecar, with the lmeval recipe"
# deploy/e2e/gate: deploy/gate/example with nginx standing in for the operator (UpdateStatus
# answered OK over h2c), serving grpc-server-cert above, whose CA the lmeval profile injects.
# Its client CA is the ConfigMap the controller publishes to lm-eval; it watches LMEvalJobs.
"${K[@]}" apply -k "$ROOT/deploy/e2e/gate"
"${K[@]}" -n lm-eval rollout status deploy/lm-eval-controller-manager --timeout=180s
expect_output "the gate is a native sidecar" "keyward-gate Always" "${K[@]}" -n lm-eval get deploy/lm-eval-controller-manager \
  -o jsonpath='{.spec.template.spec.initContainers[0].name} {.spec.template.spec.initContainers[0].restartPolicy}'
gate_uid="$(new_job e2e-gate)"
grpc_job_status e2e-gate "$NS" > "$WORK/own.bin"
grpc_job_status e2e-eval "$NS" > "$WORK/other.bin"
"${K[@]}" -n "$NS" create configmap e2e-grpc --from-file=own.bin="$WORK/own.bin" --from-file=other.bin="$WORK/other.bin"
"${K[@]}" -n "$NS" create configmap e2e-gate-check --from-file=gate-check.sh="$ROOT/deploy/e2e/gate-check.sh"
cat > "$WORK/gate-driver.yaml" <<YAML
apiVersion: v1
kind: Pod
metadata:
  name: e2e-gate
  labels: {app.kubernetes.io/name: fms-lm-eval-service}
  ownerReferences:
    - {apiVersion: foundation-model-stack.github.com.github.com/v1beta1, kind: LMEvalJob, name: e2e-gate, uid: $gate_uid, controller: true}
spec:
  restartPolicy: Never
  containers:
    - name: main
      image: docker.io/curlimages/curl:8.11.1
      command: [sh, -c]
      args:
        - |
          sh /e2e/gate-check.sh https://lm-eval-grpc.lm-eval.svc:8082/LMEvalJobUpdateService/UpdateStatus /grpc
          sleep 3600
      volumeMounts:
        - {name: e2e, mountPath: /e2e, readOnly: true}
        - {name: grpc, mountPath: /grpc, readOnly: true}
  volumes:
    - {name: e2e, configMap: {name: e2e-gate-check}}
    - {name: grpc, configMap: {name: e2e-grpc}}
YAML
"${K[@]}" --as="$LMEVAL_USER" --as-group=system:serviceaccounts -n "$NS" create -f "$WORK/gate-driver.yaml"
for _ in $(seq 90); do
  output_has CALLS-DONE "${K[@]}" -n "$NS" logs e2e-gate && break
  sleep 2
done
gate_check_verdict "$("${K[@]}" -n "$NS" logs e2e-gate)"
# What reached the operator: the one update the gate allowed.
operator_updates() {
  "${K[@]}" -n lm-eval logs deploy/lm-eval-controller-manager -c operator | grep -c 'POST /LMEvalJobUpdateService/UpdateStatus'
}
expect_output "updates that reached the operator" 1 operator_updates
# The gate's metrics, from inside its pod (its port admits only scrapers' namespaces).
gate_metrics() {
  "${K[@]}" -n lm-eval exec deploy/lm-eval-controller-manager -c operator -- wget -qO- http://127.0.0.1:9091/metrics
}
expect_output_contains "the gate counted the update it allowed" \
  'keyward_gate_requests_total{rule="a driver updates only its own job",decision="allowed"} 1' gate_metrics
expect_output_contains "and the one it refused" 'keyward_gate_requests_total{rule="",decision="refused"} 1' gate_metrics

say "the monitoring component and the audit CronJob, added to the install"
"${K[@]}" apply --server-side -f \
  "https://github.com/prometheus-operator/prometheus-operator/releases/download/${PROMETHEUS_OPERATOR_VERSION}/stripped-down-crds.yaml"
"${K[@]}" wait --for=condition=Established --timeout=60s \
  crd/prometheusrules.monitoring.coreos.com crd/podmonitors.monitoring.coreos.com crd/servicemonitors.monitoring.coreos.com
"${K[@]}" apply -k "$ROOT/deploy/e2e/install"
rolled_out
# The API server checked them against the CRDs' schemas; the gate's PodMonitor selects the sidecar.
expect_output "the alerts and the monitors" "keyward keyward keyward-controller keyward-gate" \
  "${K[@]}" -n keyward-system get prometheusrules,servicemonitors,podmonitors -o jsonpath='{.items[*].metadata.name}'
expect_output "the pods the gate's PodMonitor selects" "lm-eval" \
  "${K[@]}" get pods -A -l keyward.io/gate -o jsonpath='{.items[*].metadata.namespace}'
# And it would scrape them: its scope reaches their namespace, and its port is one their gate
# container declares (a label match alone passes with a wrong port or scope).
expect_output "the gate's PodMonitor reaches every namespace" "true" \
  "${K[@]}" -n keyward-system get podmonitor keyward-gate -o jsonpath='{.spec.namespaceSelector.any}'
gate_port="$("${K[@]}" -n keyward-system get podmonitor keyward-gate -o jsonpath='{.spec.podMetricsEndpoints[0].port}')"
expect_output "the gate's PodMonitor scrapes the sidecar's metrics port" "9091" \
  "${K[@]}" -n lm-eval get pods -l keyward.io/gate \
  -o jsonpath="{.items[0].spec.initContainers[?(@.name==\"keyward-gate\")].ports[?(@.name==\"$gate_port\")].containerPort}"
"${K[@]}" -n keyward-system create job e2e-audit --from=cronjob/keyward-audit
audit_done() {
  [[ -n "$("${K[@]}" -n keyward-system get job e2e-audit -o jsonpath='{.status.succeeded}{.status.failed}')" ]]
}
for _ in $(seq 90); do audit_done && break; sleep 2; done
audit_done || fail "the audit Job did not finish"
expect_output "the audit runs the install's image" "$IMAGE" \
  "${K[@]}" -n keyward-system get pods -l job-name=e2e-audit -o jsonpath='{.items[0].spec.containers[0].image}'
# 0 nothing found, 1 findings (the e2e leaves some); 2 would be a cluster it could not read.
audit_exit="$("${K[@]}" -n keyward-system get pods -l job-name=e2e-audit \
  -o jsonpath='{.items[0].status.containerStatuses[0].state.terminated.exitCode}')"
[[ "$audit_exit" == 0 || "$audit_exit" == 1 ]] \
  || fail "the audit Job exited '$audit_exit': $("${K[@]}" -n keyward-system logs job/e2e-audit 2>&1 | tail -5)"
echo "ok: the audit read the cluster (exit $audit_exit)"
expect_output_contains "the audit's report" '"AuditReport"' "${K[@]}" -n keyward-system logs job/e2e-audit

say "all checks passed"
