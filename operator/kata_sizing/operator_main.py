"""`kata-sizing operator`: run kopf with the operator's registry."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

import kopf


@dataclass(frozen=True)
class WebhookOptions:
    """Where the optional validating admission webhook listens, and its TLS files."""

    port: int
    certfile: str | None = None
    pkeyfile: str | None = None
    addr: str | None = None  # None: every interface (the Service reaches the pod IP)
    insecure: bool = False  # plain HTTP: tests only; the API server calls webhooks over HTTPS


def configure_webhook(settings: kopf.OperatorSettings, options: WebhookOptions) -> None:
    # kopf re-reads the cert/key files when they change (file_check_interval), so a
    # cert-manager renewal needs no restart.
    settings.admission.server = kopf.WebhookServer(
        addr=options.addr, port=options.port, certfile=options.certfile, pkeyfile=options.pkeyfile,
        insecure=options.insecure,
    )
    # kopf does not create or patch the ValidatingWebhookConfiguration (that would need RBAC
    # on admissionregistration.k8s.io); manifests/webhook/ ships it.
    settings.admission.managed = None


def run_operator(
    liveness: str | None, standalone: bool, namespace: str | None = None,
    webhook: WebhookOptions | None = None,
) -> int:
    from .handlers import build_registry

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = kopf.OperatorSettings()
    if webhook is not None:
        configure_webhook(settings, webhook)
    asyncio.run(kopf.operator(
        registry=build_registry(admission=webhook is not None),
        settings=settings,
        standalone=standalone,
        clusterwide=namespace is None,
        namespaces=[namespace] if namespace else (),
        liveness_endpoint=liveness,
    ))
    return 0
