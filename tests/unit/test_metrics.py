"""The operator's /metrics, /readyz and its reconcile log line, as Prometheus and a log
pipeline see them, in process: each counter and gauge, the reconcile line's fields, parsed with
Prometheus' own text parser. The running operator scraped over HTTP on both API tiers is
tests/api/test_observability.py's."""

from __future__ import annotations

import asyncio
import io
import json
import logging

import pytest

from kata_sizing.cli import build_parser
from kata_sizing.controller import handlers, metrics
from kata_sizing.controller.kube import ApiException, _translate
from kata_sizing.controller.operator_main import configure_logging
from tests.support.metrics import get, value
from tests.support.realcluster import free_port


def registry_text() -> str:
    from prometheus_client import generate_latest

    return generate_latest(metrics.REGISTRY).decode()


# --- hooks, in-process ------------------------------------------------------------------------


class _Outcome:
    """A pass's conclusion as metrics sees it; the writes are appended as they land."""

    def __init__(self, writes=(), result="ok"):
        self.writes, self.result = list(writes), result


@pytest.mark.parametrize("outcome, result", [
    (_Outcome(writes=["created RuntimeClass a", "created ConfigMap b"]), "ok"),
    (_Outcome(result="invalid"), "invalid"),
    (_Outcome(result="conflict"), "conflict"),
])
def test_a_pass_is_counted_by_result_timed_and_logged_once(outcome, result, caplog):
    before = registry_text()
    with caplog.at_level(logging.DEBUG, logger="kata_sizing.reconcile"):
        with metrics.reconcile_pass("p1", "apply") as current:
            current.writes.extend(outcome.writes)
            current.done(outcome)
    after = registry_text()
    assert value(after, "kata_sizing_reconciles_total", trigger="apply", result=result) == \
        value(before, "kata_sizing_reconciles_total", trigger="apply", result=result) + 1
    assert value(after, "kata_sizing_reconcile_duration_seconds_count", trigger="apply") == \
        value(before, "kata_sizing_reconcile_duration_seconds_count", trigger="apply") + 1
    assert value(after, "kata_sizing_reconcile_writes_total", trigger="apply") == \
        value(before, "kata_sizing_reconcile_writes_total", trigger="apply") + len(outcome.writes)
    [record] = [r for r in caplog.records if r.name == "kata_sizing.reconcile"]
    assert (record.policy, record.trigger, record.result, record.writes) == ("p1", "apply", result, len(outcome.writes))
    assert record.duration_s >= 0
    # At INFO what a pass changed; a pass that changed nothing is a DEBUG line.
    assert record.levelno == (logging.INFO if outcome.writes else logging.DEBUG)
    if outcome.writes:
        assert record.getMessage().endswith("(created RuntimeClass a; created ConfigMap b)")


def test_the_reconcile_line_names_a_few_writes_and_the_status_write(caplog):
    with caplog.at_level(logging.DEBUG, logger="kata_sizing.reconcile"):
        with metrics.reconcile_pass("p4", "guidance") as current:
            current.writes.extend(f"updated RuntimeClass c{i}" for i in range(6))
            current.status_written = True
            current.done(_Outcome(current.writes))
    [record] = [r for r in caplog.records if getattr(r, "policy", None) == "p4"]
    assert record.levelno == logging.INFO
    assert record.getMessage().endswith(
        "(updated RuntimeClass c0; updated RuntimeClass c1; updated RuntimeClass c2; updated RuntimeClass c3; "
        "2 more; status written)")
    assert record.written == [f"updated RuntimeClass c{i}" for i in range(6)] and record.status_written


def test_a_pass_that_raises_counts_as_error_with_the_writes_that_landed_before(caplog):
    before = registry_text()
    with caplog.at_level(logging.INFO, logger="kata_sizing.reconcile"), pytest.raises(RuntimeError):
        with metrics.reconcile_pass("p2", "resync") as current:
            current.writes.append("created RuntimeClass a")  # as the executor appends it
            raise RuntimeError("API down")
    after = registry_text()
    assert value(after, "kata_sizing_reconciles_total", trigger="resync", result="error") == \
        value(before, "kata_sizing_reconciles_total", trigger="resync", result="error") + 1
    assert value(after, "kata_sizing_reconcile_writes_total", trigger="resync") == \
        value(before, "kata_sizing_reconcile_writes_total", trigger="resync") + 1
    [record] = [r for r in caplog.records if r.name == "kata_sizing.reconcile" and r.policy == "p2"]
    assert (record.result, record.writes) == ("error", 1)


def test_json_log_format_gives_one_object_per_reconcile_with_its_fields():
    configure_logging("json")
    root = logging.getLogger()
    try:
        handler = next(h for h in root.handlers if type(h).__name__ == "_KopfStreamHandler")
        stream = io.StringIO()
        handler.setStream(stream)
        with metrics.reconcile_pass("qemu-rs", "apply") as current:
            current.writes.append("created RuntimeClass kata-qemu-rs-s")
            current.done(_Outcome())
        lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    finally:
        root.handlers[:] = [h for h in root.handlers if type(h).__name__ != "_KopfStreamHandler"]
    [line] = [entry for entry in lines if entry.get("policy") == "qemu-rs"]
    assert line["trigger"] == "apply" and line["result"] == "ok" and line["writes"] == 1
    assert line["written"] == ["created RuntimeClass kata-qemu-rs-s"]
    assert isinstance(line["duration_s"], float)
    assert line["message"].startswith("reconciled qemu-rs")


@pytest.mark.parametrize("status_code", [404, 409, 500])
def test_api_errors_are_counted_by_status(status_code):
    before = value(registry_text(), "kata_sizing_api_errors_total", status=str(status_code))
    _translate(ApiException(status=status_code, reason="x"), "read RuntimeClass a")
    assert value(registry_text(), "kata_sizing_api_errors_total", status=str(status_code)) == before + 1


def test_an_unanswered_call_counts_as_status_none():
    before = value(registry_text(), "kata_sizing_api_errors_total", status="none")
    _translate(TimeoutError(), "list pods")
    assert value(registry_text(), "kata_sizing_api_errors_total", status="none") == before + 1


@pytest.mark.parametrize("spec, result", [
    ({"shim": "qemu-runtime-rs"}, "allowed"),
    ({"shim": "no-such-shim"}, "denied"),
])
def test_webhook_admissions_are_counted_by_result(spec, result):
    import kopf

    body = {"apiVersion": "katasizing.dev/v1alpha1", "kind": "KataSizingPolicy",
            "metadata": {"name": "w"}, "spec": spec}
    before = value(registry_text(), "kata_sizing_webhook_admissions_total", result=result)
    try:
        asyncio.run(handlers.validate_policy(body=body, operation="CREATE", old=None, new=body, warnings=[]))
    except kopf.AdmissionError:
        assert result == "denied"
    assert value(registry_text(), "kata_sizing_webhook_admissions_total", result=result) == before + 1


def test_the_operator_command_takes_metrics_and_log_format_options():
    args = build_parser().parse_args(
        ["operator", "--standalone", "--metrics-port", "8081", "--log-format", "json"])
    assert (args.metrics_port, args.metrics_addr, args.log_format) == (8081, "0.0.0.0", "json")
    with pytest.raises(SystemExit):
        build_parser().parse_args(["operator", "--log-format", "xml"])


def test_readyz_is_503_until_ready_then_200():
    async def scenario() -> tuple[int, int]:
        state = {"ready": False}
        runner, port = await metrics.serve("127.0.0.1", 0, ready=lambda: state["ready"])
        try:
            loop = asyncio.get_running_loop()
            first = await loop.run_in_executor(None, get, f"http://127.0.0.1:{port}/readyz")
            state["ready"] = True
            second = await loop.run_in_executor(None, get, f"http://127.0.0.1:{port}/readyz")
        finally:
            await runner.cleanup()
        return first[0], second[0]

    assert asyncio.run(scenario()) == (503, 200)


def test_the_webhook_server_says_whether_it_listens_for_readyz():
    """/readyz waits for the webhook server too (install_metrics' webhook_listening): kopf opens
    it only after its first API scan, and the webhook Service must not send reviews before."""
    from kata_sizing.controller.operator_main import BoundedWebhookServer

    async def scenario() -> tuple[bool, bool]:
        server = BoundedWebhookServer(addr="127.0.0.1", port=free_port(), insecure=True)
        before = server.listening
        serving = server(lambda *_, **__: None)
        await serving.__anext__()  # kopf's server has started its site and hands out its config
        try:
            return before, server.listening
        finally:
            await serving.aclose()

    assert asyncio.run(scenario()) == (False, True)
