"""The operator's kopf login in a pod addresses the API server as client-go's in-cluster
configuration does: the kubernetes Service's IP and port from the environment the kubelet sets,
never the DNS name `kubernetes.default.svc` (a cluster without DNS, such as the real node of
tests/node/test_node_operator.py, cannot resolve it)."""

from __future__ import annotations

import kopf
import pytest

from kata_sizing.controller import handlers


@pytest.fixture
def service_account(monkeypatch: pytest.MonkeyPatch) -> None:
    # What kopf reads from the pod's projected ServiceAccount volume.
    monkeypatch.setattr(kopf, "login_with_service_account", lambda **_: kopf.ConnectionInfo(
        server="https://kubernetes.default.svc", token="token-of-the-pod", ca_path="/ca.crt",
        default_namespace="kata-sizing"))


@pytest.mark.parametrize(("host", "port", "server"), [
    ("10.96.0.1", "443", "https://10.96.0.1:443"),
    ("fd00:10:96::1", "6443", "https://[fd00:10:96::1]:6443"),
])
def test_the_login_uses_the_kubernetes_service_address_from_the_environment(
        service_account: None, monkeypatch: pytest.MonkeyPatch, host: str, port: str, server: str) -> None:
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", host)
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", port)
    info = handlers.login_in_cluster(settings=kopf.OperatorSettings())
    assert info is not None and info.server == server
    # Everything else is kopf's: the token, the CA and the namespace of the ServiceAccount.
    assert (info.token, info.ca_path, info.default_namespace) == ("token-of-the-pod", "/ca.crt", "kata-sizing")


def test_without_the_service_environment_kopfs_own_address_stays(
        service_account: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_PORT", raising=False)
    info = handlers.login_in_cluster(settings=kopf.OperatorSettings())
    assert info is not None and info.server == "https://kubernetes.default.svc"


def test_outside_a_pod_there_is_no_service_account_login(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kopf, "login_with_service_account", lambda **_: None)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    assert handlers.login_in_cluster(settings=kopf.OperatorSettings()) is None


# --- the client's proxy, looked up once -------------------------------------------------------


def _connected_session(monkeypatch: pytest.MonkeyPatch, tmp_path, **env: str):
    """The aiohttp session KubeApi.connect builds for a kubeconfig naming https://10.0.0.1:6443."""
    import asyncio

    from kata_sizing.controller import kube

    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: c, cluster: {server: 'https://10.0.0.1:6443', insecure-skip-tls-verify: true}}]\n"
        "users: [{name: u, user: {token: t}}]\ncontexts: [{name: c, context: {cluster: c, user: u}}]\n")
    for name in ("HTTPS_PROXY", "https_proxy", "NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)

    async def connect():
        api = await kube.KubeApi.connect()
        session = api.api_client.rest_client._create_pool_manager()  # as its first request makes it
        try:
            return session.trust_env, api.configuration.proxy
        finally:
            await session.close()
            await api.close()

    return asyncio.run(connect())


def test_the_api_servers_proxy_comes_from_the_environment_once_not_on_every_request(monkeypatch, tmp_path):
    # trust_env makes aiohttp read ~/.netrc and the proxy variables in a thread on every request.
    assert _connected_session(monkeypatch, tmp_path) == (False, None)
    assert _connected_session(monkeypatch, tmp_path, HTTPS_PROXY="http://proxy.example:3128") == (
        False, "http://proxy.example:3128")
    # NO_PROXY naming the API server: direct, as kubectl goes.
    assert _connected_session(monkeypatch, tmp_path, HTTPS_PROXY="http://proxy.example:3128",
                              NO_PROXY="10.0.0.1") == (False, None)
