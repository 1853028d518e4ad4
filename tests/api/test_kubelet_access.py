"""Reading Summaries on the kubelet's own port (controller/kubelet.py, `--kubelet-access direct`)
against a stand-in kubelet over HTTPS: the URL from the Node's status, the operator's bearer
token, the serving certificate verified (or refused with what to do), the kubelet's 403, a
kubelet that does not answer; and the operator measuring through it end to end.

Whether a real kubelet asks the API server for `get nodes/stats` is a real node's to show
(tests/node/test_node_measurement.py)."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path

import aiohttp.web
import pytest

from kata_sizing.controller.cluster import kubelet_endpoint
from kata_sizing.controller.kubelet import DirectKubelets, KubeletError, KubeletOptions
from kata_sizing.controller.measurement import Clock
from tests.support.operator_helpers import status, wait_for, wait_observed
from tests.support.policies import explicit_classes_policy
from tests.support.summaries import MIB, Figures, kata_pod, node, summary
from tests.support.webhook import write_self_signed_cert

TOKEN = "operator-token"


class FakeKubelet:
    """/stats/summary over HTTPS on 127.0.0.1, answering 200 to TOKEN and 403 to anyone else
    (as a kubelet whose SubjectAccessReview said no)."""

    def __init__(self, directory: Path, document: dict, delay_s: float = 0.0):
        self.cert, self.key = write_self_signed_cert(directory)
        self.document = document
        self.delay_s = delay_s
        self.seen: list[str | None] = []
        self.port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=asyncio.run, args=(self._serve(),), daemon=True, name="fake-kubelet")

    async def _summary(self, request: aiohttp.web.Request) -> aiohttp.web.Response:
        self.seen.append(request.headers.get("Authorization"))
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if request.headers.get("Authorization") != f"Bearer {TOKEN}":
            return aiohttp.web.Response(status=403, text="Forbidden (user=system:serviceaccount:x:y, verb=get, "
                                                         "resource=nodes, subresource(s)=[stats])")
        return aiohttp.web.Response(body=json.dumps(self.document).encode(), content_type="application/json")

    async def _serve(self) -> None:
        import ssl

        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(self.cert, self.key)
        app = aiohttp.web.Application()
        app.router.add_get("/stats/summary", self._summary)
        # A client that gives up cancels its handler, so no connection outlives the test.
        runner = aiohttp.web.AppRunner(app, access_log=None, handler_cancellation=True, shutdown_timeout=1)
        await runner.setup()
        site = aiohttp.web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
        await site.start()
        self.port = runner.addresses[0][1]
        self._ready.set()
        await self._stop.wait()
        # Aborted, not closed: closing a TLS connection waits for the client's close_notify,
        # which a client still running (the operator's) need not send before this loop ends,
        # and the socket is then left open (a ResourceWarning in whichever test runs next).
        assert runner.server is not None
        for handler in runner.server.connections:
            if handler.transport is not None:
                handler.transport.abort()
        await runner.cleanup()

    def __enter__(self) -> FakeKubelet:
        self._thread.start()
        assert self._ready.wait(10)
        return self

    def __exit__(self, *_) -> None:
        assert self._loop is not None and self._stop is not None, "the kubelet never started"
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)


class Credentials:
    """The parts of a kubernetes client Configuration the kubelet client reads."""

    def __init__(self, ca: Path | None, token: str | None = TOKEN):
        self.ssl_ca_cert = str(ca) if ca else None
        self.ca_cert_data = None
        self.cert_file = self.key_file = None
        self.token = token

    async def get_api_key_with_prefix(self, identifier: str) -> str | None:
        return f"Bearer {self.token}" if self.token else None


POD = kata_pod("p0", "kata-1", "kata-qemu-rs-s", "512Mi", "358Mi", uid="u0")
DOCUMENT = summary("kata-1", [POD], lambda pod: Figures(200 * MIB, 90 * MIB))


def read(credentials, options: KubeletOptions, port: int, address: str | None = "127.0.0.1") -> object:
    async def run():
        kubelets = DirectKubelets(credentials, options)
        try:
            return await kubelets.read("kata-1", address, port)
        finally:
            await kubelets.close()
    return asyncio.run(run())


def test_the_summary_is_read_with_the_operators_token_and_a_verified_certificate(tmp_path):
    with FakeKubelet(tmp_path, DOCUMENT) as kubelet:
        # The API server's CA signs the kubelet's certificate (serverTLSBootstrap): verified by default.
        assert read(Credentials(kubelet.cert), KubeletOptions(), kubelet.port) == DOCUMENT
        assert kubelet.seen == [f"Bearer {TOKEN}"]


def test_a_certificate_the_operator_cannot_verify_is_refused_with_what_to_do(tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    other_ca, _ = write_self_signed_cert(other)
    with FakeKubelet(tmp_path, DOCUMENT) as kubelet:
        with pytest.raises(KubeletError, match=r"not trusted .*--kubelet-ca.*serverTLSBootstrap.*--kubelet-access apiserver"):
            read(Credentials(other_ca), KubeletOptions(), kubelet.port)
        assert kubelet.seen == [], "the token must not reach a kubelet that was not verified"
        # --kubelet-ca names the CA that signed it; --kubelet-insecure-skip-tls-verify trusts anything.
        assert read(Credentials(other_ca), KubeletOptions(ca_file=str(kubelet.cert)), kubelet.port) == DOCUMENT
        assert read(Credentials(other_ca), KubeletOptions(insecure_skip_tls_verify=True), kubelet.port) == DOCUMENT


def test_a_kubelet_that_refuses_says_which_permission_is_missing(tmp_path):
    with FakeKubelet(tmp_path, DOCUMENT) as kubelet:
        with pytest.raises(KubeletError, match=r"HTTP 403 \(the operator needs get nodes/stats\): Forbidden"):
            read(Credentials(kubelet.cert, token="someone-else"), KubeletOptions(), kubelet.port)


def test_a_kubelet_that_does_not_answer_in_time_and_a_node_without_address(tmp_path):
    with FakeKubelet(tmp_path, DOCUMENT, delay_s=5) as kubelet:
        with pytest.raises(KubeletError, match=r"no answer within 0.5s"):
            read(Credentials(kubelet.cert), KubeletOptions(timeout_s=0.5), kubelet.port)
    with pytest.raises(KubeletError, match="node kata-1 has no address"):
        read(Credentials(None), KubeletOptions(), 10250, address=None)


@pytest.mark.parametrize("status_block, expected", [
    ({"addresses": [{"type": "Hostname", "address": "kata-1"}, {"type": "InternalIP", "address": "10.0.0.7"}],
      "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}}}, ("10.0.0.7", 10250)),
    ({"addresses": [{"type": "ExternalIP", "address": "203.0.113.9"}, {"type": "Hostname", "address": "kata-1"}]},
     ("203.0.113.9", 10250)),
    ({"addresses": [{"type": "InternalIP", "address": "fd00::7"}], "daemonEndpoints": {"kubeletEndpoint": {"Port": 11250}}},
     ("fd00::7", 11250)),
    ({"daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}}}, (None, None)),
    ({"addresses": [{"type": "InternalIP", "address": "10.0.0.7"}],
      "daemonEndpoints": {"kubeletEndpoint": {"Port": "10250"}}}, ("10.0.0.7", 10250)),
])
def test_the_kubelet_is_found_from_the_nodes_status(status_block, expected):
    assert kubelet_endpoint(status_block) == expected


@pytest.mark.emulator
def test_the_operator_measures_through_the_kubelets_own_port(cluster, tmp_path, monkeypatch):
    from kata_sizing.controller import worker

    monkeypatch.setattr(worker, "GUIDANCE_INTERVAL_S", 0.5)
    emu = cluster.emu
    emu.write_kubeconfig(emu.kubeconfig)  # no token in the emulator's kubeconfig: give the operator one
    config = json.loads(Path(emu.kubeconfig).read_text())
    config["users"][0]["user"] = {"token": TOKEN}
    Path(emu.kubeconfig).write_text(json.dumps(config))
    pod = dict(POD, metadata={"name": "p0", "namespace": "fleet"})
    with FakeKubelet(tmp_path, {}) as kubelet:
        emu.objects("v1/nodes").create(node("kata-1", address="127.0.0.1", port=kubelet.port))
        stored = emu.objects("v1/pods").create(pod, "fleet")
        kubelet.document = summary("kata-1", [stored], lambda _: Figures(200 * MIB, 90 * MIB))
        cluster.start(kubelet=KubeletOptions(ca_file=str(kubelet.cert)), measurement_clock=Clock.faster(10))
        body = explicit_classes_policy(classes=[{"name": "s", "cpu": "1", "memory": "1Gi"}])
        body["spec"]["measurement"] = {"intervalSeconds": 15}
        cluster.create(body)
        wait_observed(emu, "qemu-rs", timeout=20, Ready="True")
        measured = wait_for(lambda: [c for c in (status(emu, "qemu-rs").get("measurement") or {}).get("classes", [])
                                     if c.get("samples")], 20, lambda: repr(status(emu, "qemu-rs").get("measurement")))
        assert measured[0]["overheadMaxBytes"] == 90 * MIB
        assert kubelet.seen and set(kubelet.seen) == {f"Bearer {TOKEN}"}
        # None of it went through the API server.
        assert not emu.requests("GET", "/proxy/")
