"""The list+watch cache as the API server sees it: a collection is read a page at a time
(`limit`/`continue`, never one unbounded list), only summaries are kept (no managedFields, but
on the install's shared admission objects), and a watch that expires (410 Gone) is followed by a
fresh list whose differences are reported, so nothing changed while the watch was down is missed.
The policies' own CRD is followed by name, to stop the operator when it goes."""

from __future__ import annotations

import asyncio

from kata_sizing.controller.informer import PAGE_SIZE, Informer, policy_crd, slim_child


def _obj(i: int, rv: str = "1") -> dict:
    return {
        "metadata": {
            "name": f"p{i}", "namespace": "ns", "uid": f"u{i}", "resourceVersion": rv,
            "managedFields": [{"manager": "kubectl", "fieldsV1": {"f:spec": {}}}],
        },
        "spec": {"n": i},
    }


class PagedApi:
    """Serves a collection as the API server does with `limit`: pages of at most `limit`
    objects and a continue token until the last one. Watches replay queued events; a watch
    with nothing queued ends the test's run."""

    def __init__(self, objects: list[dict]):
        self.objects = objects
        self.list_calls: list[tuple[int, str | None]] = []
        self.watches: list[list[dict]] = []
        self.watch_versions: list[str] = []

    async def list_page(self, kind, limit, continue_token=None, label_selector=None, field_selector=None):
        self.list_calls.append((limit, continue_token))
        start = int(continue_token or 0)
        page = [dict(o) for o in self.objects[start:start + limit]]
        nxt = start + limit
        return page, "100", (str(nxt) if nxt < len(self.objects) else None)

    async def watch_raw(self, kind, resource_version, timeout_s, label_selector=None, field_selector=None):
        self.watch_versions.append(resource_version)
        if not self.watches:
            raise asyncio.CancelledError
        for event in self.watches.pop(0):
            yield event


def _run(informer: Informer) -> None:
    async def go():
        try:
            await informer.run()
        except asyncio.CancelledError:
            pass

    asyncio.run(go())


def test_a_large_collection_is_listed_in_pages_and_only_summaries_are_kept():
    api = PagedApi([_obj(i) for i in range(1234)])
    informer = Informer(api, "Pod", slim_child("Pod"))
    _run(informer)

    assert api.list_calls == [(PAGE_SIZE, None), (PAGE_SIZE, "500"), (PAGE_SIZE, "1000")]
    assert len(informer.items) == 1234
    assert all("managedFields" not in o["metadata"] for o in informer.items.values())
    assert informer.items["u7"]["spec"] == {"n": 7}
    assert api.watch_versions == ["100"]  # the watch starts where the list ended


def test_an_expired_watch_lists_again_and_reports_what_changed_meanwhile():
    api = PagedApi([_obj(i) for i in range(3)])
    changes = []
    informer = Informer(api, "Pod", slim_child("Pod"), on_change=lambda k, b, a: changes.append((k, b, a)))
    # First watch: one edit arrives, then the server says 410 Gone.
    edited = _obj(1, rv="101")
    edited["spec"] = {"n": 10}
    api.watches.append([
        {"type": "MODIFIED", "object": edited},
        {"type": "ERROR", "object": {"kind": "Status", "code": 410}},
    ])
    # While the watch was down, p0 was deleted and p3 created: only the new list shows it.
    api.watches.append([])
    original_list = api.list_page
    calls = {"n": 0}

    async def list_page(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:
            api.objects = [edited, _obj(2), _obj(3)]
        return await original_list(*args, **kwargs)

    api.list_page = list_page
    _run(informer)

    assert sorted(informer.items) == ["u1", "u2", "u3"]
    seen = {(key, before is None, after is None) for key, before, after in changes}
    assert ("u1", False, False) in seen  # the edit from the watch
    assert ("u0", False, True) in seen  # deleted while no watch ran
    assert ("u3", True, False) in seen  # created while no watch ran
    assert len(api.list_calls) == 2


def _crd(deleting: bool = False) -> dict:
    meta = {"name": "katasizingpolicies.katasizing.dev", "resourceVersion": "5"}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-05T09:00:00Z"
    return {"metadata": meta}


def test_the_policies_crd_is_followed_by_name_and_its_deletion_said_once():
    api = PagedApi([_crd()])
    gone: list[bool] = []
    selectors: list[str | None] = []
    original = api.list_page

    async def list_page(*args, field_selector=None, **kwargs):
        selectors.append(field_selector)
        return await original(*args, **kwargs)

    api.list_page = list_page
    # The API server first marks the CRD (it deletes every policy), then removes it.
    api.watches.append([{"type": "MODIFIED", "object": _crd(deleting=True)}, {"type": "DELETED", "object": _crd(True)}])
    _run(policy_crd(api, lambda: gone.append(True)))
    assert gone == [True] and selectors == ["metadata.name=katasizingpolicies.katasizing.dev"]


def test_an_operator_started_without_the_crd_waits_for_it_and_stops_only_when_it_goes_again():
    api = PagedApi([])
    gone: list[bool] = []
    api.watches.append([{"type": "ADDED", "object": _crd()}])
    _run(policy_crd(api, lambda: gone.append(True)))
    assert gone == []


def test_kopfs_tracebacks_of_the_policies_watch_meeting_404_are_dropped_and_others_kept():
    import logging
    from types import SimpleNamespace

    from kata_sizing.controller.operator_main import PoliciesGoneFilter, policies_gone

    class KopfApiError(RuntimeError):
        status: int  # as kopf's API errors carry it

    class ResponseError(RuntimeError):
        request_info: SimpleNamespace  # as aiohttp's response error carries it

    def error(status: int, url: str) -> Exception:
        exc = KopfApiError(f"{status} page not found")
        exc.status = status
        cause = ResponseError("Not Found")
        cause.request_info = SimpleNamespace(url=url)
        exc.__cause__ = cause
        return exc

    gone = error(404, "https://10.96.0.1/apis/katasizing.dev/v1alpha1/katasizingpolicies?watch=true")
    assert policies_gone(gone)
    assert not policies_gone(error(404, "https://10.96.0.1/api/v1/namespaces/x/configmaps/y"))
    assert not policies_gone(error(500, "https://10.96.0.1/apis/katasizing.dev/v1alpha1/katasizingpolicies"))
    assert not policies_gone(RuntimeError("no status"))

    def record(exc: Exception | None) -> logging.LogRecord:
        info = (type(exc), exc, None) if exc is not None else None
        return logging.LogRecord("kopf", logging.ERROR, __file__, 1, "Watcher has failed", None, info)

    kept = PoliciesGoneFilter()
    assert not kept.filter(record(gone))
    assert kept.filter(record(error(404, "https://10.96.0.1/api/v1/pods"))) and kept.filter(record(None))


def test_the_installs_shared_objects_keep_their_record_of_who_wrote_them():
    shared = _obj(1)
    shared["metadata"]["labels"] = {"katasizing.dev/shared": "admission"}
    summarize = slim_child("ValidatingAdmissionPolicy")
    assert summarize(shared)["metadata"]["managedFields"] == shared["metadata"]["managedFields"]
    assert "managedFields" not in summarize(_obj(2))["metadata"]
