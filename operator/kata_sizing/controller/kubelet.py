"""Reading kubelet Summaries (`/stats/summary`) for the measurement (docs/measurement.md).

Two ways, one chosen per operator (`--kubelet-access`):

- `direct` (the default): GET https://ADDRESS:PORT/stats/summary on each kubelet's own port,
  presenting the operator's own credentials. The kubelet authorizes every `/stats/*` path as
  `get nodes/stats` (pkg/kubelet/server/auth.go, with or without KubeletFineGrainedAuthz), so
  the operator holds nothing more than read access to statistics. It needs the kubelets to be
  reachable from the operator's pod and their serving certificates to be verifiable: by the
  cluster's CA when they are signed by it (serverTLSBootstrap), else by `--kubelet-ca`, or not
  at all with `--kubelet-insecure-skip-tls-verify` (metrics-server's --kubelet-insecure-tls).
- `apiserver`: through the API server's node proxy (controller/kube.py read_node_summary),
  which needs `get nodes/proxy`: the whole kubelet API, exec into any pod of any node included,
  outside the API server's audit and admission. For clusters whose kubelets the operator cannot
  reach; `kata-sizing survey` reads this way (it runs where kubectl runs).
"""

from __future__ import annotations

import asyncio
import ssl
from dataclasses import dataclass
from typing import Literal

import aiohttp

from ..core import bounded, defaults

Access = Literal["direct", "apiserver"]


@dataclass(frozen=True)
class KubeletOptions:
    access: Access = "direct"
    ca_file: str | None = None  # None: the API server's CA (in a pod: the service account's ca.crt)
    insecure_skip_tls_verify: bool = False
    timeout_s: float = defaults.KUBELET_REQUEST_TIMEOUT_S


class KubeletError(Exception):
    """A Summary that could not be read: the node is skipped until its next turn."""

    def __init__(self, status: int | None, message: str):
        super().__init__(message)
        self.status = status


# Connections to kubelets at once; each node is read once per interval, so a few suffice, and a
# kubelet that does not answer holds one only until the timeout.
CONNECTIONS = 8


def ssl_context(configuration, options: KubeletOptions) -> ssl.SSLContext:
    """Verify kubelets by `options.ca_file` or the API server's CA, and present the operator's
    client certificate when it logs in with one (a kubeconfig's client-certificate)."""
    if options.insecure_skip_tls_verify:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    else:
        cafile = options.ca_file or getattr(configuration, "ssl_ca_cert", None)
        cadata = None if cafile else getattr(configuration, "ca_cert_data", None)
        context = ssl.create_default_context(cafile=cafile, cadata=cadata)
    cert, key = getattr(configuration, "cert_file", None), getattr(configuration, "key_file", None)
    if cert and key:
        context.load_cert_chain(cert, key)
    return context


class DirectKubelets:
    """GET https://ADDRESS:PORT/stats/summary with the operator's bearer token (or client cert)."""

    def __init__(self, configuration, options: KubeletOptions):
        self.configuration = configuration
        self.options = options
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            context = ssl_context(self.configuration, self.options)
            self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=CONNECTIONS, ssl=context))
        return self._session

    async def read(self, node: str, address: str | None, port: int | None) -> object:
        if not address or not port:
            raise KubeletError(None, f"node {node} has no address in its status (InternalIP, ExternalIP or Hostname)")
        host = f"[{address}]" if ":" in address else address
        url = f"https://{host}:{port}/stats/summary"
        headers = {"Accept": "application/json"}
        token = await self.configuration.get_api_key_with_prefix("BearerToken")
        if token:
            headers["Authorization"] = token
        try:
            async with self._client().get(
                url, headers=headers, timeout=aiohttp.ClientTimeout(total=self.options.timeout_s),
            ) as response:
                body = await response.read()
                status = response.status
        except (ssl.SSLCertVerificationError, aiohttp.ClientConnectorCertificateError) as exc:
            # aiohttp's error is both; its reason is in certificate_error.
            reason = getattr(getattr(exc, "certificate_error", exc), "verify_message", None) or str(exc)
            raise KubeletError(None, f"{url}: the kubelet's certificate is not trusted ({reason}): give "
                                     "--kubelet-ca, sign kubelet certificates with the cluster CA (serverTLSBootstrap), "
                                     "or use --kubelet-access apiserver") from None
        except TimeoutError:
            raise KubeletError(None, f"{url}: no answer within {self.options.timeout_s:g}s") from None
        except (aiohttp.ClientError, OSError) as exc:
            raise KubeletError(None, f"{url}: {type(exc).__name__}: {exc}") from None
        if status >= 400:
            text = body.decode("utf-8", "replace").strip()[:300]
            hint = " (the operator needs get nodes/stats)" if status == 403 else ""
            raise KubeletError(status, f"{url}: HTTP {status}{hint}: {text}")
        try:
            return bounded.load_json(body, f"the Summary of node {node}", walk=False)
        except bounded.InputError as exc:
            raise KubeletError(None, str(exc)) from None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
            # TLS connections finish closing a moment after the session does (aiohttp's
            # "graceful shutdown" advice); a connection a timeout gave up on is one of them.
            await asyncio.sleep(0.25)
