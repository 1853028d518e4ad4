"""Every label and annotation key kata-sizing writes or reads, in one place.

`katasizing.dev/policy` has two readers: on an object the operator writes it names the policy
that made it (with `app.kubernetes.io/managed-by: kata-sizing`: the operator's own); on a pod it
is the pod's opt-in to routing by that policy's admission (docs/admission.md). One key, one
value: a policy's name.
"""

from __future__ import annotations

MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "kata-sizing"
POLICY_LABEL = "katasizing.dev/policy"
CLASS_LABEL = "katasizing.dev/class"
# On the admission policies every KataSizingPolicy shares (podfit.shared_admission_specs).
SHARED_LABEL = "katasizing.dev/shared"
SHARED_ADMISSION = "admission"
# ...and the marks that keep a GitOps tool from pruning them with one application (docs/gitops.md):
# Flux's kustomize-controller and Argo CD leave an object so marked when it leaves an application.
# Each is a mark, not an owner: the install (or the one application that applies
# `render --shared`) owns them.
SHARED_ANNOTATIONS = {
    "kustomize.toolkit.fluxcd.io/prune": "disabled",
    "argocd.argoproj.io/sync-options": "Prune=false",
}
# Flux's helm-controller re-runs a HelmRelease as soon as a ConfigMap it reads with valuesFrom
# changes, if that ConfigMap carries this label (otherwise only at the release's interval).
FLUX_WATCH_LABEL = "reconcile.fluxcd.io/watch"
# The label the API server sets on every namespace to its own name (namespace selectors).
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"
# The finalizer and kopf's annotations an operator before this one kept on each policy
# (kopf's progress and diff-base storage, under the same prefix): removed by the first pass.
OLD_FINALIZER = "katasizing.dev/cleanup"
OLD_ANNOTATIONS = ("katasizing.dev/last-handled-configuration", "katasizing.dev/apply", "katasizing.dev/resume",
                   "katasizing.dev/cleanup")
