"""`kata-sizing operator`: run kopf with the operator's registry."""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import aiohttp.web
import kopf

from ..core import bounded
from ..core.model import GROUP
from . import policy_webhook
from .leader import default_identity

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WebhookOptions:
    """Where the optional validating admission webhook listens, and its TLS files."""

    port: int
    certfile: str | None = None
    pkeyfile: str | None = None
    addr: str | None = None  # None: every interface (the Service reaches the pod IP)
    insecure: bool = False  # plain HTTP: tests only; the API server calls webhooks over HTTPS
    # Seconds the webhook keeps answering after SIGTERM (install_drain); 0: it stops at once.
    drain_s: float = 0


class BoundedWebhookServer(kopf.WebhookServer):
    """kopf's webhook server, with its request handling made total: a body that is not an
    AdmissionReview gets HTTP 400 with the reason (kopf answers some of those with 500 and
    a traceback in the log), and a well-formed review always gets an AdmissionReview back.

    `routes` maps a path id to a review handler of the operator's own, served before kopf's
    handlers: the routing of opted-in pods (policy_webhook.ROUTE_POD_PATH_ID), which is no kopf
    handler because kopf would then resolve and follow Pods as a resource of its own."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.routes: dict[str, Callable[[dict], Awaitable[dict]]] = {}
        # kopf opens the server only after its first API scan, which can come after the caches
        # have synced: /readyz waits for this too, so the Service sends no review to a replica
        # that cannot answer it yet.
        self.listening = False
        self.draining = False  # SIGTERM came: still answering, no longer ready (install_drain)

    async def __call__(self, fn):  # noqa: ANN001 - kopf's
        try:
            async for client_config in super().__call__(fn):
                self.listening = True
                yield client_config
        finally:
            self.listening = False

    # kopf's _serve is a staticmethod; this one needs the server's own routes.
    async def _serve(self, fn, request: aiohttp.web.Request) -> aiohttp.web.Response:  # type: ignore[override]
        response = await self._answer(fn, request)
        if self.draining:
            # The API server keeps its connections to a webhook open and sends the next review
            # down the same one, past the Service's endpoints and kube-proxy: while draining, each
            # connection is closed after its answer, so the next review opens one to a replica
            # that stays.
            response.force_close()
        return response

    async def _answer(self, fn, request: aiohttp.web.Request) -> aiohttp.web.Response:
        try:
            # aiohttp reads at most 1 MiB by default (then 413); a review is bounded like every
            # other input (docs/inputs.md), and a legal pod may be larger than 1 MiB.
            text = await request.clone(client_max_size=bounded.MAX_INPUT_BYTES + 1).read()
            review = bounded.load_json(text, "the request body")
        except aiohttp.web.HTTPRequestEntityTooLarge:
            raise aiohttp.web.HTTPRequestEntityTooLarge(
                max_size=bounded.MAX_INPUT_BYTES, actual_size=request.content_length or 0,
                text=f"the request body is larger than the {bounded.MAX_INPUT_BYTES // (1024 * 1024)} MiB "
                     "kata-sizing reads") from None
        except bounded.InputError as exc:
            raise aiohttp.web.HTTPBadRequest(text=str(exc)) from None
        problem = policy_webhook.review_problem(review)
        if problem or not isinstance(review, dict):
            raise aiohttp.web.HTTPBadRequest(text=f"not an AdmissionReview request: {problem}")
        headers = dict(request.headers)
        sslpeer = request.transport.get_extra_info("peercert") if request.transport else None
        route = self.routes.get(request.match_info.get("id") or "")
        if route is not None:
            return aiohttp.web.json_response(await self._never_refusing(route, review))
        other = policy_webhook.not_a_policy(review)
        if other:
            # A review of a resource this operator has no rule for: nothing to refuse.
            return aiohttp.web.json_response(policy_webhook.review_response(
                review, allowed=True, warnings=[f"kata-sizing: {other}"]))
        try:
            answer = await fn(review, webhook=request.match_info.get("id"), sslpeer=sslpeer, headers=headers)
        except Exception:  # noqa: BLE001 - the API server must get an answer, not a 500
            log.exception("admission review %s failed", review["request"]["uid"])
            answer = policy_webhook.review_response(
                review, allowed=False, code=500,
                message="kata-sizing could not review this object (internal error; see the operator log)")
        return aiohttp.web.json_response(answer)


    @staticmethod
    async def _never_refusing(route: Callable[[dict], Awaitable[dict]], review: dict) -> dict:
        """The operator's own routes (the routing of pods) let a pod through whatever happens:
        the MutatingWebhookConfiguration is failurePolicy Ignore and the README promises the
        same inside; a pod it cannot route meets the envelope policy's pod-not-routed rule."""
        try:
            return await route(review)
        except Exception as exc:  # noqa: BLE001 - a refusal here would be a wrong answer
            log.exception("admission review %s: the pod is let through unrouted", review["request"]["uid"])
            return policy_webhook.review_response(
                review, allowed=True, warnings=[f"kata-sizing could not route this pod ({type(exc).__name__}; "
                                                "see the operator log); it is created unrouted"])


def configure_webhook(settings: kopf.OperatorSettings, options: WebhookOptions) -> None:
    # kopf re-reads the cert/key files when they change (file_check_interval), so a
    # cert-manager renewal needs no restart.
    settings.admission.server = BoundedWebhookServer(
        addr=options.addr, port=options.port, certfile=options.certfile, pkeyfile=options.pkeyfile,
        insecure=options.insecure,
    )
    # kopf does not create or patch the ValidatingWebhookConfiguration (that would need RBAC
    # on admissionregistration.k8s.io); manifests/webhook/ ships it.
    settings.admission.managed = None


def install_drain(registry: kopf.OperatorRegistry, server: BoundedWebhookServer, seconds: float,
                  stop: asyncio.Event) -> None:
    """On SIGTERM, hand the Lease over at once but keep answering admission reviews for `seconds`
    before kopf stops (setting `stop`, its stop flag). A stopping pod leaves its Service's
    endpoints at once, but kube-proxy and the API server learn it a moment later, and a review
    sent meanwhile to a replica that no longer listens fails: the routing webhook then fails open
    and the pod is refused as not routed (1 pod of 760 in two rolling updates on the real node,
    docs/performance.md). A second SIGTERM, or SIGINT, stops at once.

    kopf adds its own SIGTERM handler (stop now) right after it spawns its tasks, in the loop's
    iteration after its startup activity began; this startup handler replaces it one iteration
    later (call_soon), so the order never depends on timing."""
    from .handlers import step_down

    async def start(memo: kopf.Memo, **_) -> None:
        loop = asyncio.get_running_loop()

        def sigterm() -> None:
            if server.draining:
                log.info("SIGTERM again: stopping now")
                stop.set()
                return
            server.draining = True
            memo.drain = asyncio.create_task(drain(memo), name="drain")

        loop.call_soon(loop.add_signal_handler, signal.SIGTERM, sigterm)

    async def drain(memo: kopf.Memo) -> None:
        log.info("SIGTERM: handing the Lease over; answering admission reviews for %gs more, then stopping", seconds)
        state = getattr(memo, "state", None)
        try:
            if state is not None:
                await step_down(state)
            await asyncio.sleep(seconds)
        finally:
            stop.set()

    kopf.on.startup(registry=registry, id="drain")(start)


@dataclass(frozen=True)
class MetricsOptions:
    """Where /metrics and /readyz listen."""

    port: int
    addr: str = "0.0.0.0"  # the kubelet and Prometheus reach the pod IP, not loopback


def install_metrics(registry: kopf.OperatorRegistry, options: MetricsOptions,
                    webhook_listening: Callable[[], bool] = lambda: True) -> None:
    """Serve /metrics and /readyz from a startup handler that runs after the operator's own
    (registered later), so the informers it reports on exist; ready once they have synced and
    the webhook server (when there is one) listens."""
    from . import metrics

    async def start(memo: kopf.Memo, **_) -> None:
        informers = memo.state.informers()
        metrics.track_informers(informers)
        memo.metrics_runner, memo.metrics_port = await metrics.serve(
            options.addr, options.port,
            ready=lambda: all(informer.synced.is_set() for informer in informers) and webhook_listening(),
        )

    async def stop(memo: kopf.Memo, **_) -> None:
        runner = memo.get("metrics_runner")
        if runner is not None:
            await runner.cleanup()

    kopf.on.startup(registry=registry, id="metrics")(start)
    kopf.on.cleanup(registry=registry, id="metrics")(stop)


def policies_gone(exc: BaseException | None) -> bool:
    """A 404 from the policies' API (katasizing.dev): what kopf's watch of the policies meets once
    their CRD is deleted. kopf's client error carries the status, and its cause (aiohttp's) the URL."""
    if exc is None or getattr(exc, "status", None) != 404:
        return False
    url = getattr(getattr(exc.__cause__, "request_info", None), "url", "")
    return f"/apis/{GROUP}/" in str(url)


class PoliciesGoneFilter(logging.Filter):
    """Drops the tracebacks of kopf's watch of the policies meeting 404 (their CRD deleted under
    it): the operator says that in one line of its own (handlers.CRD_GONE)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and policies_gone(record.exc_info[1]))


def configure_logging(log_format: str) -> None:
    """text: one readable line per record. json: one JSON object per record (kopf's own
    formatter, python-json-logger), with the reconcile line's fields as keys."""
    if log_format == "json":
        kopf.configure(log_format=kopf.LogFormat.JSON)
    else:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for handler in logging.getLogger().handlers:
        handler.addFilter(PoliciesGoneFilter())


def run_operator(
    liveness: str | None, standalone: bool, namespace: str | None = None,
    webhook: WebhookOptions | None = None, metrics: MetricsOptions | None = None,
    log_format: str = "text", lease=None, kubelet=None,
) -> int:
    from .handlers import build_registry, stop_when_the_crd_goes

    configure_logging(log_format)
    settings = kopf.OperatorSettings()
    if webhook is not None:
        configure_webhook(settings, webhook)
    registry = build_registry(admission=webhook is not None)
    if metrics is not None:
        server = settings.admission.server
        install_metrics(registry, metrics, **(
            {"webhook_listening": lambda: server.listening and not server.draining}
            if isinstance(server, BoundedWebhookServer) else {}))
    # kopf's stop flag: set when the policies' CRD is deleted (handlers.stop_when_the_crd_goes),
    # and at the end of a SIGTERM's drain.
    crd_stop = asyncio.Event()
    if webhook is not None and webhook.drain_s > 0 and isinstance(settings.admission.server, BoundedWebhookServer):
        install_drain(registry, settings.admission.server, webhook.drain_s, crd_stop)
    try:
        asyncio.run(kopf.operator(
            registry=registry,
            settings=settings,
            standalone=standalone,
            clusterwide=namespace is None,
            namespaces=[namespace] if namespace else (),
            liveness_endpoint=liveness,
            # Without one, kopf names itself after the user from /etc/passwd (getpass), and the
            # kubelet, unlike podman, adds no entry for the pod's runAsUser: the operator died at
            # start-up on a real node (docs/testing.md).
            identity=lease.identity if lease is not None else default_identity(),  # type: ignore[arg-type]  # kopf's NewType of str
            stop_flag=crd_stop,
            # With a Lease only the holder's work queue runs passes (see leader.py).
            memo=kopf.Memo(lease=lease, kubelet=kubelet, crd_stop=crd_stop),
        ))
    except Exception as exc:
        if not policies_gone(exc):
            raise
        # kopf's watch met the 404 before the CRD's deletion reached the operator's own watch.
        stop_when_the_crd_goes(crd_stop)
    return 0
