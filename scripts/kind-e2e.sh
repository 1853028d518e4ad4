#!/usr/bin/env bash
# End-to-end check on a throwaway kind cluster, for machines with Docker and kind:
# build the image, install with `kubectl apply -k manifests/`, apply the example policy,
# then check sizing, drift correction and clean-up as a user would see them.
# It complements, never replaces, the offline tests (manifests, emulator).
#
# Environment: KIND_CLUSTER (default kata-sizing-e2e), KUBECTL (default kubectl, else
# .tools/kubectl), KEEP_CLUSTER=1 to leave the cluster for debugging.
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"

cluster="${KIND_CLUSTER:-kata-sizing-e2e}"
# Must match manifests/deployment.yaml; kind load makes it present so nothing is pulled.
image="ghcr.io/kata-sizing/kata-sizing:0.1.0"
policy="qemu-rs"
prefix="kata-qemu-rs"
classes=(s m l xl)
timeout_s=180

if [[ -n "${KUBECTL:-}" ]]; then
  kubectl_bin="$KUBECTL"
elif command -v kubectl >/dev/null 2>&1; then
  kubectl_bin="kubectl"
else
  kubectl_bin="$root/.tools/kubectl"
fi
k() { "$kubectl_bin" --context "kind-$cluster" "$@"; }

log() { printf '[kind-e2e] %s\n' "$*" >&2; }
fail() { log "FAIL: $*"; exit 1; }

# Poll a command until it succeeds; kubectl wait cannot wait for an object to appear
# (or for a field to change back) on every kubectl version.
until_ok() {
  local what="$1"; shift
  local deadline=$((SECONDS + timeout_s))
  until "$@" >/dev/null 2>&1; do
    ((SECONDS < deadline)) || fail "timed out after ${timeout_s}s waiting for: $what"
    sleep 1
  done
}

# Succeeds only when the API server answers that the object does not exist, so a
# failing API call is not mistaken for a deletion.
absent() {
  local found
  found="$(k get "$@" --ignore-not-found -o name)" || return 1
  [[ -z "$found" ]]
}

created_cluster=0
cleanup() {
  local rc=$?
  if ((rc != 0)) && ((created_cluster)); then
    log "operator logs (exit $rc):"
    k -n kata-sizing logs deployment/kata-sizing --tail=200 >&2 || true
    k get katasizingpolicies -o yaml >&2 || true
  fi
  if ((created_cluster)) && [[ "${KEEP_CLUSTER:-0}" != 1 ]]; then
    kind delete cluster --name "$cluster" >/dev/null 2>&1 || true
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

for tool in docker kind "$kubectl_bin"; do
  command -v "$tool" >/dev/null 2>&1 || fail "$tool not found"
done
[[ -f examples/qemu-runtime-rs.yaml ]] || fail "examples/qemu-runtime-rs.yaml is missing"
[[ -f crds/katasizingpolicies.katasizing.dev.yaml ]] || fail "CRD missing: run make crds"

log "building $image"
docker build -t "$image" .

kind get clusters 2>/dev/null | grep -qx "$cluster" && fail "kind cluster $cluster already exists"
log "creating kind cluster $cluster"
created_cluster=1
kind create cluster --name "$cluster" --wait 120s
kind load docker-image "$image" --name "$cluster"
# kata-deploy labels the nodes it installs on; the example's node selector expects it.
k label nodes --all katacontainers.io/kata-runtime=true --overwrite

log "installing with kubectl apply -k manifests/"
k apply -k manifests/
k wait --for condition=Established --timeout "${timeout_s}s" \
  crd/katasizingpolicies.katasizing.dev
k -n kata-sizing rollout status deployment/kata-sizing --timeout "${timeout_s}s"

log "applying the example policy"
k apply -f examples/qemu-runtime-rs.yaml
k wait --for condition=Ready --timeout "${timeout_s}s" "katasizingpolicy/$policy"

for class in "${classes[@]}"; do
  until_ok "RuntimeClass $prefix-$class" k get runtimeclass "$prefix-$class"
  handler="$(k get runtimeclass "$prefix-$class" -o jsonpath='{.handler}')"
  [[ "$handler" == "$prefix-$class" ]] || fail "$prefix-$class has handler '$handler'"
  memory="$(k get runtimeclass "$prefix-$class" -o jsonpath='{.overhead.podFixed.memory}')"
  [[ -n "$memory" ]] || fail "$prefix-$class has no overhead.podFixed.memory"
done

output_ns="$(k get katasizingpolicy "$policy" -o jsonpath='{.spec.output.namespace}')"
output_ns="${output_ns:-kata-sizing}"
configmaps=("$policy-kata-deploy-values" "$policy-dropins" "$policy-node-guidance")
for cm in "${configmaps[@]}"; do
  until_ok "ConfigMap $output_ns/$cm" k -n "$output_ns" get configmap "$cm"
done

target="$prefix-m"
pod_fixed() { k get runtimeclass "$target" -o jsonpath='{.overhead.podFixed.memory}'; }
pod_fixed_is() { [[ "$(pod_fixed)" == "$1" ]]; }

log "editing $target by hand; the operator must put podFixed back"
sized_memory="$(pod_fixed)"
k patch runtimeclass "$target" --type merge -p '{"overhead":{"podFixed":{"memory":"1Mi"}}}'
until_ok "$target podFixed.memory back to $sized_memory" pod_fixed_is "$sized_memory"

log "deleting $target by hand; the operator must re-create it"
k delete runtimeclass "$target" --wait=true
until_ok "$target re-created" pod_fixed_is "$sized_memory"

log "deleting the policy; what the operator created must go with it"
k delete katasizingpolicy "$policy" --wait=true --timeout "${timeout_s}s"
for class in "${classes[@]}"; do
  until_ok "RuntimeClass $prefix-$class deleted" absent runtimeclass "$prefix-$class"
done
for cm in "${configmaps[@]}"; do
  until_ok "ConfigMap $output_ns/$cm deleted" absent -n "$output_ns" configmap "$cm"
done

log "PASS"
