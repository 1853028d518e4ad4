"""Carrying out a plan: the writes of one pass, and nothing decided here.

One branch per verb, not per kind of object (`kube` is generic over kinds). Up to
WRITES_PER_PASS writes are in flight at once; each write finishes before the pass goes on or
fails, so no write outlives its pass. A 409 re-reads the object and writes the same fields
again onto what it finds (or finds them already there, or finds somebody else's object, which
is never written); after CONFLICT_ATTEMPTS the pass fails and is retried after a back-off. A
404 on a create (the namespace does not exist) and a 422 on an admission object (the server's
CEL lacks something the rule uses) are outcomes the status reports, and the other objects are
still written. Any other failure of a write (a 5xx, a timeout) is kept as its outcome while the
other writes go on; the caller raises it once the pass is concluded. Every write that lands is
appended to `landed` at once, so a pass that fails still reports the writes it made.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from .api_errors import Conflict, Invalid, NotFound, PermanentApiError
from .compare import as_installed, corrected, differences, is_ours, is_shared
from .kinds import ObjKey, describe, is_admission_kind
from .plan import Action, Verb, conflict_text
from .retry import CONFLICT_ATTEMPTS

# Writes one pass has in flight at once. More would shorten a single policy's creation a little
# further, but at a cold start every policy's pass runs at once, and each waiting write holds its
# request: with all of a pass's writes at once, 200 policies peaked 30 MiB higher against the
# real API server; one at a time missed the 300 ms creation target (docs/performance.md).
WRITES_PER_PASS = 4

DONE, UNCHANGED, CONFLICTED, REFUSED, FAILED, GONE, ERROR = (
    "done", "unchanged", "conflict", "refused", "failed", "gone", "error")
RESULTS = (DONE, UNCHANGED, CONFLICTED, REFUSED, FAILED, GONE, ERROR)  # every one has its row in status.ACTION_OUTCOMES


class ChildCache(Protocol):
    """Where written objects go at once (informer.ChildCache), so the next pass sees them."""

    def record(self, obj: dict) -> None: ...
    def forget(self, key: ObjKey) -> None: ...
    def held(self, key: ObjKey, by_another: bool) -> None: ...


@dataclass(frozen=True)
class Result:
    # DONE, UNCHANGED, CONFLICTED, REFUSED, FAILED (404 on a create), GONE (a chart object vanished),
    # ERROR (anything else: the pass is retried after a back-off)
    status: str
    text: str = ""
    error: Exception | None = None


@dataclass
class Outcome:
    landed: list[str] = field(default_factory=list)  # "created RuntimeClass x", in the order they landed
    results: dict[ObjKey, Result] = field(default_factory=dict)

    def with_status(self, *statuses: str) -> dict[ObjKey, Result]:
        return {key: r for key, r in self.results.items() if r.status in statuses}

    @property
    def error(self) -> BaseException | None:
        """The first failure the pass must be retried for, if any."""
        return next((r.error for r in self.results.values() if r.status == ERROR), None)


async def execute(
    api, actions: Sequence[Action], owner: tuple[str, str | None], children: ChildCache | None = None,
    landed: list[str] | None = None,
) -> Outcome:
    """Carry out `actions` (those that write; the others are only reported). `owner` is (policy
    name, uid): an object found on a re-read that is not that policy's is never written."""
    outcome = Outcome(landed if landed is not None else [])
    slots = asyncio.Semaphore(WRITES_PER_PASS)
    finished = {a.key: asyncio.Event() for a in actions if a.writes}

    async def bounded(action: Action) -> None:
        try:
            # A write waits for those of this pass it comes after (Action.after); when one it needs
            # did not land, it is not made (a failed write is retried, and it with it).
            for key in action.after:
                if key in finished and key != action.key:
                    await finished[key].wait()
            unmet = [k for k in action.needs if outcome.results.get(k, Result(DONE)).status not in (DONE, UNCHANGED)]
            if unmet:
                # Refused with it (not allowed there, 403), or failed with it (retried with it).
                refused = all(outcome.results[k].status == REFUSED for k in unmet)
                outcome.results[action.key] = Result(
                    REFUSED if refused else FAILED,
                    f"{describe(action.key)}: not written, since {describe(unmet[0])} it names was not")
                return
            async with slots:
                await _carry_out(api, action, owner, children, outcome)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - kept as this write's outcome; the caller raises it
            outcome.results[action.key] = Result(ERROR, f"{describe(action.key)}: {exc}", exc)
        finally:
            finished[action.key].set()

    # Deletions last: a renamed class's new RuntimeClass exists before the old one goes. What
    # others need is started first (the slots are taken in the order asked for).
    needed = {key for a in actions if a.writes for key in a.after}
    for verbs in ((Verb.CREATE, Verb.REPLACE, Verb.RECREATE), (Verb.DELETE,)):
        if outcome.error is not None:
            break
        batch = sorted((a for a in actions if a.verb in verbs), key=lambda a: a.key not in needed)
        await asyncio.gather(*(bounded(a) for a in batch))
    return outcome


def _remember(children: ChildCache | None, written: dict | None) -> None:
    if children is not None and written:
        children.record(written)


async def _carry_out(api, action: Action, owner: tuple[str, str | None], children: ChildCache | None,
                     outcome: Outcome) -> None:
    key = action.key
    if action.verb is Verb.DELETE:
        await api.delete(key, ((action.have or {}).get("metadata") or {}).get("uid"))
        if children is not None:
            children.forget(key)
        _landed(outcome, key, f"deleted {describe(key)} (no longer in the policy)")
        return
    live = action.have
    label = "updated"
    if action.verb is Verb.RECREATE:
        await api.delete(key, ((live or {}).get("metadata") or {}).get("uid"))
        if children is not None:
            children.forget(key)
        live, label = None, "re-created"
    await _write(api, action, live, label, owner, children, outcome)


def _landed(outcome: Outcome, key: ObjKey, text: str) -> None:
    outcome.landed.append(text)
    outcome.results[key] = Result(DONE, text)


# The creates of shared objects in flight (compare.is_shared: the admission policies every
# policy's pass wants), by client and key: at a cold start every policy's pass finds them missing,
# and one create serves them all instead of one create and a 409 and a read per policy.
_SHARED_CREATES: dict[tuple[int, ObjKey], asyncio.Future] = {}


async def _write(api, action: Action, live: dict | None, label: str, owner: tuple[str, str | None],
                 children: ChildCache | None, outcome: Outcome) -> None:
    """Make the object's decided fields `action.want`'s: create it, or put them onto `live`."""
    key, want = action.key, action.want
    assert want is not None  # a write that is no deletion has what it writes
    if live is None and is_shared(want) and not action.guarded:
        flight = (id(api), key)
        pending = _SHARED_CREATES.get(flight)
        if pending is not None:
            created = await asyncio.shield(pending)
            if created is not None and not differences(want, created, False):
                _remember(children, created)
                outcome.results[key] = Result(UNCHANGED)
                return
        else:
            _SHARED_CREATES[flight] = asyncio.get_running_loop().create_future()
            written = None
            try:
                written = await _write_once(api, action, live, label, owner, children, outcome)
            finally:
                _SHARED_CREATES.pop(flight).set_result(written)
            return
    await _write_once(api, action, live, label, owner, children, outcome)


async def _write_once(api, action: Action, live: dict | None, label: str, owner: tuple[str, str | None],
                      children: ChildCache | None, outcome: Outcome) -> dict | None:
    """One object written (what the server returned), or its outcome recorded (None)."""
    key, want = action.key, action.want
    assert want is not None
    body = action.body
    installer = action.installer
    # A shared object is written in its installer's name (compare.Installer): the API server then
    # records its fields as the installer's, and the installer's next apply or upgrade finds them
    # its own (never a conflict with the operator).
    manager = {"field_manager": installer.manager} if installer is not None and installer.manager else {}
    for _ in range(CONFLICT_ATTEMPTS):
        try:
            if live is None and action.guarded:
                outcome.results[key] = Result(GONE, f"{describe(key)} is gone")
                return None
            if installer is not None and installer.manager and installer.server_side:
                written = await api.apply(body if body is not None else as_installed(want, installer),
                                          installer.manager)
                if differences(want, written, False):
                    # Fields the policy leaves out that somebody else set (an item added to a keyed
                    # list): an apply leaves them; a replace removes them and claims no field.
                    written = await api.replace(corrected(want, written, False))
            elif live is None:
                fresh = as_installed(want, installer) if installer is not None else want
                written = await api.create(body if body is not None else fresh, **manager)
            else:
                written = await api.replace(body if body is not None else corrected(want, live, action.guarded),
                                            **manager)
            if live is None:
                text = f"{'re-created' if label == 're-created' else 'created'} {describe(key)}"
            else:
                text = f"{label} {describe(key)}"
            _remember(children, written)
            _landed(outcome, key, text + (" (handler changed)" if label == "re-created" else ""))
            return written
        except Conflict:
            live, body = await api.read(key), None
            foreign = live is not None and not is_ours(live, *owner)
            if children is not None:
                children.held(key, foreign)
            if foreign:
                outcome.results[key] = Result(CONFLICTED, conflict_text(action))
                return None
            _remember(children, live)
            if live is not None and not differences(want, live, action.guarded):
                # Somebody (an earlier pass of ours, often) already wrote what the policy wants.
                outcome.results[key] = Result(UNCHANGED)
                return None
            if live is not None and key[0] == "RuntimeClass" and live.get("handler") != want.get("handler"):
                raise Conflict(409, f"{describe(key)}: its handler changed during the pass") from None
        except NotFound as exc:
            if live is None:
                # A create: what it would live in does not exist (spec.output.namespace).
                outcome.results[key] = Result(FAILED, f"{describe(key)}: {exc}", exc)
                return None
            live, body = None, None  # deleted since it was read: create it
        except Invalid as exc:
            if not is_admission_kind(key[0]):
                raise
            outcome.results[key] = Result(REFUSED, f"{describe(key)}: {exc}", exc)
            return None
        except PermanentApiError as exc:
            if exc.status != 403:
                raise
            # Not allowed here (the chart's rbac.outputNamespaces leaves out the namespace a
            # policy names): the status says so; retrying soon would not change it.
            outcome.results[key] = Result(REFUSED, f"{describe(key)}: {exc}", exc)
            return None
    raise Conflict(409, f"{describe(key)}: still conflicting after {CONFLICT_ATTEMPTS} attempts")
