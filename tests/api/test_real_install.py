"""The install and uninstall a user runs, on the real API server.

`kubectl apply -k manifests/` is what the session's control plane was installed with (see
tests/support/realcluster.py); here: the operator's pod passes the namespace's enforced Pod Security
"restricted" level as the API server's admission decides it. The uninstall, in every order the
docs allow, is tests/api/test_real_teardown.py's.
"""

from __future__ import annotations

import pytest
import yaml

from tests.support.realcluster import ROOT

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
