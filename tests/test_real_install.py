"""The install and uninstall a user runs, on the real API server.

`kubectl apply -k manifests/` is what the session's control plane was installed with (see
tests/realcluster.py); here: the operator's pod passes the namespace's enforced Pod Security
"restricted" level as the API server's admission decides it, and the documented uninstall
order leaves nothing behind and nothing stuck (a control plane of its own, since it removes
the CRD).
"""

from __future__ import annotations

import pytest
import yaml

from tests.realcluster import (
    CRD_NAME, POLICIES, ROOT, RUNTIME_CLASSES, RealOperator, configmaps, installed_control_plane, poll,
)
from tests.test_real_operator import create_ready, qemu_rs

pytestmark = pytest.mark.realserver


def test_the_operator_pod_is_admitted_under_the_enforced_restricted_pod_security(control_plane):
    deployment = next(d for d in yaml.safe_load_all((ROOT / "manifests/deployment.yaml").read_text())
                      if d and d.get("kind") == "Deployment")
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "kata-sizing-psa-check", "namespace": deployment["metadata"]["namespace"]},
           "spec": deployment["spec"]["template"]["spec"]}
    admitted = control_plane.kubectl("create", "--dry-run=server", "-f", "-", input=yaml.safe_dump(pod),
                                     check=False)
    assert admitted.returncode == 0, admitted.stderr
    assert "Warning" not in admitted.stderr, admitted.stderr

    # The same namespace refuses a pod that is not restricted: the check above can fail.
    loose = {**pod, "spec": {"containers": [{"name": "x", "image": "busybox",
                                             "securityContext": {"privileged": True}}]}}
    refused = control_plane.kubectl("create", "--dry-run=server", "-f", "-", input=yaml.safe_dump(loose),
                                    check=False)
    assert refused.returncode != 0 and 'violates PodSecurity "restricted' in refused.stderr, refused.stderr


def test_the_documented_uninstall_order_leaves_nothing_stuck(tmp_path_factory, tmp_path):
    with installed_control_plane(tmp_path_factory.mktemp("uninstall")) as cp:
        operator = RealOperator(cp, tmp_path).start()
        try:
            create_ready(cp, qemu_rs("uninstalled"))
            assert cp.items(RUNTIME_CLASSES) and cp.items(configmaps(), "katasizing.dev/policy")
            # 1. Delete the policies, in the foreground: they go once the garbage collector has
            # removed what the operator made (with the CRD gone first it could no longer look
            # the owner up, and left the RuntimeClasses behind).
            cp.kubectl("delete", "ksp", "--all", "--cascade=foreground", "--timeout=90s")
            assert cp.items(RUNTIME_CLASSES) == {}
        finally:
            # 2. The operator goes with its Deployment.
            operator.stop()
        # 3. Then the install itself.
        cp.kubectl("delete", "-k", str(ROOT / "manifests"), "--timeout=90s")
        assert cp.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{CRD_NAME}") is None
        poll(lambda: cp.get("/api/v1/namespaces/kata-sizing") is None, 60,
             lambda: f"namespace kata-sizing: {(cp.get('/api/v1/namespaces/kata-sizing') or {}).get('status')}")
        assert cp.items(RUNTIME_CLASSES) == {}
        assert cp.get("/apis/rbac.authorization.k8s.io/v1/clusterroles/kata-sizing") is None
        assert cp.get(POLICIES.rsplit("/", 1)[0]) is None  # the API group is gone with the CRD
