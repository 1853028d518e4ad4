"""The operator's admission webhook as the API server calls it: a serving certificate, a client
that posts AdmissionReviews over HTTPS, and the `webhook` fixture (the real operator serving it,
with the emulator as its API server). Also the invalid policy the webhook tests send."""

from __future__ import annotations

import base64
import http.client
import ipaddress
import json
import socket
import ssl
import time
import urllib.request
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from kata_sizing.controller.handlers import build_registry
from kata_sizing.controller.operator_main import WebhookOptions, configure_webhook
from kata_sizing.controller.policy_webhook import VALIDATE_HANDLER_ID
from kata_sizing.core.model import GROUP, PLURAL, VERSION
from tests.support.harness import KopfThread, KubernetesApiEmulator, running_emulator
from tests.support.paths import ROOT
from tests.support.policies import example
from tests.support.realcluster import free_port


def invalid_body() -> dict:
    """measured-classes with class s's podFixed below both of its overheads: two errors."""
    body = example("measured-classes")
    body["spec"]["classes"][0]["podFixed"] = {"cpu": "100m", "memory": "64Mi"}
    return body


def write_kubeconfig(directory: Path) -> Path:
    """A kubeconfig naming a server: `kata-sizing operator` checks for one before kopf starts."""
    path = directory / "kubeconfig"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": "http://127.0.0.1:1"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c"}}]}))
    return path


def write_self_signed_cert(directory: Path) -> tuple[Path, Path]:
    """A serving certificate for 127.0.0.1, made with `cryptography`: kopf's own generator
    (certbuilder/oscrypto) fails on OpenSSL 3.0."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kata-sizing-webhook-test")])
    now = datetime.now(UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5)).not_valid_after(now + timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                       critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "tls.crt", directory / "tls.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    return cert_path, key_path


class Webhook:
    """Posts AdmissionReviews the way the API server does, trusting only the test's certificate."""

    def __init__(self, emu: KubernetesApiEmulator | None, port: int, cafile: Path) -> None:
        self._emu = emu  # the operator's API server where it is the emulator
        self.port = port
        self.url = f"https://127.0.0.1:{port}/{VALIDATE_HANDLER_ID}"
        self.context = ssl.create_default_context(cafile=str(cafile))

    @property
    def emu(self) -> KubernetesApiEmulator:
        assert self._emu is not None, "the operator's API server is not the emulator"
        return self._emu

    def review(self, operation: str, obj: dict, old: dict | None = None) -> dict:
        uid, data = self._review(operation, obj, old)
        http_request = urllib.request.Request(self.url, data=data, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(http_request, context=self.context, timeout=5) as reply:
            review = json.load(reply)
        assert review["apiVersion"] == "admission.k8s.io/v1" and review["kind"] == "AdmissionReview"
        assert review["response"]["uid"] == uid
        return review["response"]

    @staticmethod
    def _review(operation: str, obj: dict, old: dict | None) -> tuple[str, bytes]:
        """(its uid, the AdmissionReview the API server would send)."""
        uid = str(uuid.uuid4())
        request = {
            "uid": uid,
            "kind": {"group": GROUP, "version": VERSION, "kind": "KataSizingPolicy"},
            "resource": {"group": GROUP, "version": VERSION, "resource": PLURAL},
            "requestKind": {"group": GROUP, "version": VERSION, "kind": "KataSizingPolicy"},
            "requestResource": {"group": GROUP, "version": VERSION, "resource": PLURAL},
            "name": obj["metadata"]["name"],
            "operation": operation,
            "userInfo": {"username": "kubernetes-admin", "groups": ["system:masters"]},
            "object": obj,
            "oldObject": old,
            "dryRun": False,
        }
        return uid, json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                                "request": request}).encode()

    def connection_header(self, obj: dict) -> str:
        """The Connection header of the answer to a review of creating `obj` (over HTTP/1.1,
        keep-alive unless it says close)."""
        _, data = self._review("CREATE", obj, None)
        connection = http.client.HTTPSConnection("127.0.0.1", self.port, context=self.context, timeout=5)
        try:
            connection.request("POST", f"/{VALIDATE_HANDLER_ID}", body=data, headers={"Content-Type": "application/json"})
            reply = connection.getresponse()
            reply.read()
            return (reply.getheader("Connection") or "keep-alive").lower()
        finally:
            connection.close()

    def wait_until_serving(self, timeout: float = 10) -> None:
        # kopf opens the server only after its first API scan, which is after ready_flag.
        deadline = time.monotonic() + timeout
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), 0.5):
                    return
            except OSError:
                if time.monotonic() > deadline:
                    raise AssertionError(f"the webhook did not listen within {timeout}s") from None
                time.sleep(0.05)


@pytest.fixture
def webhook(tmp_path) -> Iterator[Webhook]:
    """The real operator (with the emulator as its API server) serving the webhook on HTTPS."""
    cert, key = write_self_signed_cert(tmp_path)
    port = free_port()
    options = WebhookOptions(port=port, certfile=str(cert), pkeyfile=str(key), addr="127.0.0.1")
    with running_emulator(tmp_path) as emu:
        assert emu.kubeconfig is not None
        operator = KopfThread(emu.kubeconfig, registry=build_registry(admission=True),
                              settings_hook=lambda settings: configure_webhook(settings, options))
        with operator:
            client = Webhook(emu, port, cert)
            client.wait_until_serving()
            yield client
        assert not emu.server_errors, f"the emulator itself failed: {emu.server_errors!r}"


def registered_as_the_overlay(file: str, name: str, port: int, cert: Path) -> dict:
    """overlays/webhook/`file` (a Validating- or MutatingWebhookConfiguration) as it registers the
    operator's webhook, named `name`, with a URL on 127.0.0.1:`port` instead of the Service (no pod
    network for a test's API server) and the caBundle of the test's certificate (cert-manager's
    job in production)."""
    config = yaml.safe_load((ROOT / "overlays" / "webhook" / file).read_text())
    config["metadata"] = {"name": name}
    for hook in config["webhooks"]:
        hook["clientConfig"] = {"url": f"https://127.0.0.1:{port}{hook['clientConfig']['service']['path']}",
                                "caBundle": base64.b64encode(cert.read_bytes()).decode()}
    return config
