"""Watch expiry on the real API server: 410 Gone recovered without a lost edit.

A control plane of its own, started so that expiry really happens: no watch cache (watches go
to etcd, whose compaction expires old revisions) and a short request timeout (the server ends
each watch after a few seconds, so clients reconnect from the last resourceVersion they saw).
After etcd is compacted, the operator's next reconnect is refused with 410 Gone; it must list
again and still put back a hand edit made around that moment.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from tests.support.realcluster import (
    RUNTIME_CLASSES,
    ControlPlane,
    RealOperator,
    configmaps,
    create_ready,
    delete_policies,
    installed_control_plane,
    pod_fixed,
    poll,
    qemu_rs,
    rc_path,
    runtime_classes,
)

pytestmark = pytest.mark.realserver


@pytest.fixture(scope="module")
def expiring_control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    with installed_control_plane(tmp_path_factory.mktemp("expiring"),
                                 ("--watch-cache=false", "--min-request-timeout=3")) as cp:
        yield cp


def test_an_expired_watch_is_listed_again_and_no_edit_is_lost(expiring_control_plane, tmp_path):
    cp = expiring_control_plane
    operator = RealOperator(cp, tmp_path)
    # The operator's own caches ask for watches of 5 to 10 minutes (as client-go does); here a
    # few seconds, so they reconnect, meet the compaction and must list again.
    operator.start(KATA_SIZING_WATCH_TIMEOUT_SECONDS="3")
    try:
        create_ready(cp, qemu_rs("expiry"))
        name = sorted(runtime_classes(cp, "expiry"))[0]
        good = pod_fixed(cp, name)
        lists_before = rc_lists(cp, operator.started_at_offset)

        # Move etcd's revision past everything the operator has seen, then compact it away.
        for i in range(5):
            cp.create(configmaps("default"), {"metadata": {"name": f"filler-{i}"}, "data": {"i": str(i)}})
        mark = cp.audit_offset()
        cp.compact_etcd()
        cp.edit(rc_path(name), lambda o: o["overhead"]["podFixed"].update(memory="1Mi"))

        # The operator's watches reconnect within seconds, get 410, and list again. (The
        # RuntimeClass watch may instead have seen the edit first, which moves it past the
        # compaction; the ConfigMap watch sees nothing of the fillers, so it always meets 410.)
        poll(lambda: rc_lists(cp, mark), 30, lambda: f"no list after compaction; log:\n"
                                                    f"{operator.log()[-3000:]}")
        assert rc_lists(cp, operator.started_at_offset) > lists_before
        poll(lambda: pod_fixed(cp, name) == good, 30, lambda: f"{name}: {pod_fixed(cp, name)}")

        # And a hand edit after the recovery is still seen by the re-established watches.
        time.sleep(4)
        cp.edit(rc_path(name), lambda o: o["overhead"]["podFixed"].update(cpu="1m"))
        poll(lambda: pod_fixed(cp, name) == good, 15, lambda: f"{name}: {pod_fixed(cp, name)}")
        assert not operator.forbidden(operator.started_at_offset)
    finally:
        try:
            delete_policies(cp, operator.running)
        finally:
            operator.stop()
        for i in range(5):
            cp.delete(f"{configmaps('default')}/filler-{i}")
        for rc in cp.items(RUNTIME_CLASSES):
            cp.delete(f"{RUNTIME_CLASSES}/{rc}")


def rc_lists(cp: ControlPlane, since: int) -> int:
    """Lists of the operator's watched children (RuntimeClasses, its ConfigMaps) since `since`."""
    return sum(1 for r in cp.operator_requests(since)
               if r.resource in ("runtimeclasses", "configmaps") and r.verb == "list")
