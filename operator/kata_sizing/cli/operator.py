"""`kata-sizing operator`: the operator's pre-flight checks, then the operator (kopf and the
kubernetes client are imported here only, inside `run`)."""

from __future__ import annotations

import argparse
import os
import socket
import ssl
from pathlib import Path
from typing import TYPE_CHECKING

from ..core import bounded
from ..core.bounded import InputError
from .common import read_text

if TYPE_CHECKING:
    from ..controller.operator_main import WebhookOptions

HELP = "run the operator (kopf)"
# The longest drain a replica may be asked for: the pod's terminationGracePeriodSeconds must cover
# it and kopf's own stop (the chart's webhook.drainSeconds has the same bound).
MAX_DRAIN_S = 60


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--liveness", metavar="URL", help="serve kopf's health endpoint here")
    parser.add_argument("--standalone", action="store_true", help="no peering (one replica)")
    parser.add_argument("--namespace", help=argparse.SUPPRESS)
    parser.add_argument("--webhook-port", type=int, metavar="PORT",
                        help="serve the validating admission webhook on this port (overlays/webhook/)")
    parser.add_argument("--webhook-cert", metavar="FILE", help="the webhook's TLS certificate (PEM)")
    parser.add_argument("--webhook-key", metavar="FILE", help="the webhook's TLS private key (PEM)")
    parser.add_argument("--webhook-addr", metavar="ADDRESS",
                        help="listen on this address only (default: every interface)")
    parser.add_argument("--webhook-insecure", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--webhook-drain-seconds", type=float, default=0, metavar="S",
                        help="on SIGTERM, hand the Lease over at once and keep answering admission reviews "
                             "for S seconds before stopping (while kube-proxy and the API server stop "
                             "sending any); default 0: stop at once")
    parser.add_argument("--metrics-port", type=int, metavar="PORT",
                        help="serve Prometheus /metrics and the readiness check /readyz on this port")
    parser.add_argument("--metrics-addr", default="0.0.0.0", metavar="ADDRESS",
                        help="listen on this address (default: every interface)")
    parser.add_argument("--log-format", choices=("text", "json"), default="text",
                        help="json: one JSON object per line, one line per reconcile with "
                        "policy, trigger, result, writes and duration")
    parser.add_argument("--leader-elect", action="store_true",
                        help="run as one of several replicas: only the holder of a Lease reconciles")
    parser.add_argument("--leader-elect-namespace", metavar="NS",
                        default=os.environ.get("POD_NAMESPACE") or "kata-sizing",
                        help="where the Lease lives (default: $POD_NAMESPACE, else kata-sizing)")
    parser.add_argument("--kubelet-access", choices=("direct", "apiserver"), default="direct",
                        help="how the measurement reads kubelet Summaries: direct (each kubelet's port, needs "
                             "nodes/stats) or apiserver (the API server's node proxy, needs nodes/proxy); "
                             "see docs/measurement.md")
    parser.add_argument("--kubelet-ca", metavar="FILE",
                        help="direct: the CA of the kubelets' serving certificates (default: the API server's CA)")
    parser.add_argument("--kubelet-insecure-skip-tls-verify", action="store_true",
                        help="direct: do not verify the kubelets' serving certificates (self-signed ones)")
    # Shorter lease timings for tests; unset, LeaseOptions takes controller/retry.py's.
    parser.add_argument("--lease-duration", type=float, metavar="S", help=argparse.SUPPRESS)
    parser.add_argument("--renew-deadline", type=float, metavar="S", help=argparse.SUPPRESS)
    parser.add_argument("--retry-period", type=float, metavar="S", help=argparse.SUPPRESS)


def _webhook_options(args: argparse.Namespace) -> WebhookOptions | None:
    """The webhook flags, or None when --webhook-port is not given."""
    from ..controller.operator_main import WebhookOptions

    if args.webhook_port is None:
        given = [flag for flag, value in (
            ("--webhook-cert", args.webhook_cert), ("--webhook-key", args.webhook_key),
            ("--webhook-addr", args.webhook_addr), ("--webhook-insecure", args.webhook_insecure),
            ("--webhook-drain-seconds", args.webhook_drain_seconds),
        ) if value]
        if given:
            raise InputError(f"{', '.join(given)} need --webhook-port")
        return None
    if args.webhook_insecure:
        if args.webhook_cert or args.webhook_key:
            raise InputError("--webhook-insecure serves plain HTTP; drop --webhook-cert and --webhook-key")
    elif not (args.webhook_cert and args.webhook_key):
        # The API server calls admission webhooks over HTTPS only.
        raise InputError("--webhook-port needs --webhook-cert and --webhook-key")
    if not 0 <= args.webhook_drain_seconds <= MAX_DRAIN_S:
        raise InputError(f"--webhook-drain-seconds: {args.webhook_drain_seconds:g} is not between 0 and "
                         f"{MAX_DRAIN_S} (the seconds a stopping replica keeps answering reviews)")
    for path in filter(None, (args.webhook_cert, args.webhook_key)):
        read_text(path)  # a missing Secret mount is one line here, not a crash inside kopf
    _tls_pair(args.webhook_cert, args.webhook_key)
    return WebhookOptions(
        port=args.webhook_port, certfile=args.webhook_cert, pkeyfile=args.webhook_key,
        addr=args.webhook_addr, insecure=args.webhook_insecure, drain_s=args.webhook_drain_seconds,
    )


# Where a pod's service account token is mounted (what KubeApi.connect and kopf look for).
SERVICE_ACCOUNT_TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount/token"


def _cluster_problem() -> str | None:
    """Why the operator could not connect the way kubectl does (a pod's service account, else
    KUBECONFIG or ~/.kube/config with a current context that names a cluster), or None. Checked
    before kopf starts: kopf would log a traceback and retry forever."""
    if os.environ.get("KUBERNETES_SERVICE_HOST") and Path(SERVICE_ACCOUNT_TOKEN).exists():
        return None
    given = os.environ.get("KUBECONFIG")
    paths = [p for p in (given or "").split(os.pathsep) if p] or [str(Path.home() / ".kube" / "config")]
    where = "KUBECONFIG" if given else "~/.kube/config"
    found = [p for p in paths if Path(p).is_file()]
    if not found:
        return (f"no cluster to connect to: not in a pod (no service account token at {SERVICE_ACCOUNT_TOKEN}) "
                f"and no kubeconfig ({where}: {', '.join(paths)} does not exist)")
    configs = []
    for path in found:
        try:
            documents = bounded.load_yaml_documents(read_text(path), path)
        except InputError as exc:
            return f"the kubeconfig cannot be read: {exc}"
        if len(documents) != 1 or not isinstance(documents[0], dict):
            return f"the kubeconfig {path} is not a kubeconfig (one YAML mapping)"
        configs.append(documents[0])
    # As kubectl merges several files: the first current-context set wins, entries by name.
    current = next((c.get("current-context") for c in configs if c.get("current-context")), None)
    if not current:
        return f"the kubeconfig ({', '.join(found)}) sets no current-context"
    contexts = {e.get("name"): e.get("context") for c in configs for e in (c.get("contexts") or [])
                if isinstance(e, dict)}
    context = contexts.get(current)
    if not isinstance(context, dict):
        return f"the kubeconfig's current-context {current!r} names no context"
    clusters = {e.get("name"): e.get("cluster") for c in configs for e in (c.get("clusters") or [])
                if isinstance(e, dict)}
    cluster = clusters.get(context.get("cluster"))
    if not isinstance(cluster, dict) or not cluster.get("server"):
        return f"the kubeconfig's context {current!r} names no cluster with a server"
    return None


def _listening_port(option: str, port: int | None, addr: str | None) -> None:
    """A port the operator can listen on, or one line saying why not (before kopf starts)."""
    if port is None:
        return
    if not 1 <= port <= 65535:
        raise InputError(f"{option}: {port} is not a TCP port (1 to 65535)")
    try:
        family, kind, proto, _, address = socket.getaddrinfo(addr or None, port, type=socket.SOCK_STREAM,
                                                             flags=socket.AI_PASSIVE)[0]
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(address)
    except OSError as exc:
        raise InputError(f"{option}: cannot listen on {addr or '*'}:{port}: {exc.strerror or exc}") from None


def _tls_pair(cert: str | None, key: str | None) -> None:
    if cert is None or key is None:
        return
    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(cert, key)
    except (ssl.SSLError, OSError, ValueError) as exc:
        raise InputError(f"--webhook-cert/--webhook-key: {cert} and {key} are not a PEM certificate and its private "
                         f"key ({getattr(exc, 'reason', None) or exc})") from None


def run(args: argparse.Namespace) -> int:
    import gc

    _listening_port("--webhook-port", args.webhook_port, args.webhook_addr)
    _listening_port("--metrics-port", args.metrics_port, args.metrics_addr)
    webhook = _webhook_options(args)
    problem = _cluster_problem()
    if problem:
        raise InputError(problem)

    from ..controller.operator_main import MetricsOptions, run_operator  # kopf and kubernetes load only here

    gc.enable()  # the console script starts with it off (__main__); a long-lived process needs it

    metrics = None
    if args.metrics_port is not None:
        metrics = MetricsOptions(port=args.metrics_port, addr=args.metrics_addr)
    return run_operator(liveness=args.liveness, standalone=args.standalone, namespace=args.namespace,
                        webhook=webhook, metrics=metrics, log_format=args.log_format,
                        lease=_lease_options(args), kubelet=_kubelet_options(args))


def _kubelet_options(args: argparse.Namespace):
    """How the measurement reads kubelet Summaries (controller/kubelet.py)."""
    from ..controller.kubelet import KubeletOptions

    if args.kubelet_access == "apiserver" and (args.kubelet_ca or args.kubelet_insecure_skip_tls_verify):
        raise InputError("--kubelet-ca and --kubelet-insecure-skip-tls-verify are for --kubelet-access direct")
    if args.kubelet_ca and args.kubelet_insecure_skip_tls_verify:
        raise InputError("--kubelet-ca verifies kubelets; --kubelet-insecure-skip-tls-verify does not: give one")
    if args.kubelet_ca:
        read_text(args.kubelet_ca)  # a missing mount is one line here, not a failure per node later
    return KubeletOptions(access=args.kubelet_access, ca_file=args.kubelet_ca,
                          insecure_skip_tls_verify=args.kubelet_insecure_skip_tls_verify)


def _lease_options(args: argparse.Namespace):
    """The leader-election flags, or None without --leader-elect."""
    if not args.leader_elect:
        return None
    from ..controller.leader import LeaseOptions, default_identity

    given = {field: value for field, value in (
        ("lease_duration_s", args.lease_duration), ("renew_deadline_s", args.renew_deadline),
        ("retry_period_s", args.retry_period)) if value is not None}
    try:
        return LeaseOptions(namespace=args.leader_elect_namespace, identity=default_identity(), **given)
    except ValueError as exc:
        raise InputError(f"--lease-duration/--renew-deadline/--retry-period: {exc}") from None
