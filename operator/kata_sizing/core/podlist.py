"""`kubectl get pods -A -o yaml`, read a pod at a time (docs/inputs.md): a real cluster's list is far
larger than the 4 MiB any other input may be (20,000 pods of 4 KiB are 80 MB), so it is not read
whole. Pure: lines in, pods out; the caller opens the file.

kubectl (go-yaml) writes a List as block YAML: `items:` at column 0 and each pod an entry `- ` at one
column, its lines indented further. Each entry is cut out by its lines and read alone with the
bounded reader (bounded.load_yaml_documents: YAML as kubectl reads it, every bound of any input),
so memory holds one pod, never the list. An entry the caller does not want (a pod of no measured
RuntimeClass: its text names none of them) is skipped unread.

Bounds, sized from the API server's own limits: a pod's text at most MAX_POD_BYTES (the API server
takes request bodies of 3 MiB at most, and etcd stores objects of 1.5 MiB at most), at most
MAX_PODS pods (Kubernetes' scalability thresholds: 150,000 pods per cluster), a list of at most
MAX_LIST_BYTES. Text not laid out this way is `NotStreamable`: the caller reads it whole, within
the bound every input has.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator

from . import bounded
from .bounded import InputError

MAX_PODS = 150_000
MAX_POD_BYTES = 3 * 1024 * 1024
MAX_LIST_BYTES = 1024 * 1024 * 1024
MAX_WRAPPER_BYTES = 64 * 1024  # the List's own fields around `items:`
SPLIT = ("split it: one file per namespace (kubectl get pods -n NAMESPACE -o yaml) or per node (kubectl get pods "
         "-A -o yaml --field-selector spec.nodeName=NODE), each given with its own --pods")

_ENTRY = re.compile(r"( *)-( |$)")


class NotStreamable(Exception):
    """The text is not a List laid out as kubectl writes it (JSON, flow style, several documents)."""


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _blank_or_comment(line: str) -> bool:
    stripped = line.strip()
    return not stripped or stripped.startswith("#")


def read_pod_list(lines: Iterable[str], source: str, wanted: Callable[[str], bool] = lambda text: True,
                  ) -> Iterator[tuple[str, dict]]:
    """(where, pod) for each entry of the List whose text `wanted` accepts, in order; InputError past
    a bound or for an entry that is not a Pod; NotStreamable (before any pod) when the text is not
    laid out as kubectl writes a List."""
    wrapper: list[str] = []
    state = "header"
    column = -1
    entry: list[str] = []
    entry_bytes = total = count = 0

    def finish() -> Iterator[tuple[str, dict]]:
        nonlocal entry, entry_bytes
        if not entry:
            return
        where = f"{source}: items[{count - 1}]"
        text, entry, entry_bytes = "".join(entry), [], 0
        if not wanted(text):
            return
        documents = bounded.load_yaml_documents(text, where)
        if len(documents) != 1 or not isinstance(documents[0], dict):
            raise InputError(f"{where}: not a Pod (a mapping)")
        pod = documents[0]
        if pod.get("kind") not in (None, "Pod"):
            raise InputError(f"{where}: kind {str(pod.get('kind'))[:40]!r} is not a Pod; save the pods with "
                             "kubectl get pods -A -o yaml")
        yield where, pod

    for number, line in enumerate(lines, start=1):
        total += len(line)
        if total > MAX_LIST_BYTES:
            raise InputError(f"{source}: more than {MAX_LIST_BYTES // 2**20} MiB of pods; {SPLIT}")
        if state == "header":
            if _blank_or_comment(line):
                continue
            if line[0] in "{[" or line.startswith("---") or line.startswith("%"):
                raise NotStreamable
            if re.fullmatch(r"items:\s*(#.*)?", line.rstrip("\r\n")):
                state = "items"
            elif not wrapper and not re.match(r"[A-Za-z][A-Za-z0-9_]*:", line):
                raise NotStreamable  # not a block mapping's key first: not the kubectl layout
            else:
                wrapper.append(line)
                if sum(len(part) for part in wrapper) > MAX_WRAPPER_BYTES:
                    raise NotStreamable
            continue
        if state == "items":
            if column < 0:
                if _blank_or_comment(line):
                    continue
                found = _ENTRY.match(line.rstrip("\r\n"))
                if found is None:
                    raise NotStreamable
                column = len(found.group(1))
            found = _ENTRY.match(line.rstrip("\r\n"))
            if found is not None and len(found.group(1)) == column:
                yield from finish()
                count += 1
                if count > MAX_PODS:
                    raise InputError(f"{source}: more than {MAX_PODS} pods (Kubernetes' scalability limit for a "
                                     f"cluster); {SPLIT}")
                # The entry read alone: "- " becomes two spaces, so its mapping keeps its columns.
                entry.append(" " * (column + 2) + line[column + 2:] if line[column + 1:column + 2] == " "
                             else line[:column] + " \n")
                entry_bytes = len(line)
                continue
            if _blank_or_comment(line) or _indent(line) > column:
                entry.append(line)
                entry_bytes += len(line)
                if entry_bytes > MAX_POD_BYTES:
                    raise InputError(f"{source}: items[{count - 1}] (line {number}): a pod of more than "
                                     f"{MAX_POD_BYTES // 2**20} MiB; the API server stores none that large")
                continue
            yield from finish()
            state = "trailer"
        # Past the items (pods may have been read already): the rest is the List's own fields.
        if line.startswith("---"):
            raise InputError(f"{source}: line {number}: not a List as kubectl writes it (the List's fields after "
                             "its items, one document); save the pods with kubectl get pods -A -o yaml")
        wrapper.append(line)
        if sum(len(part) for part in wrapper) > MAX_WRAPPER_BYTES:
            raise InputError(f"{source}: more than {MAX_WRAPPER_BYTES // 1024} KiB around the List's items")
    if state == "header":
        raise NotStreamable
    yield from finish()
    _check_wrapper("".join(wrapper), source)


def _check_wrapper(text: str, source: str) -> None:
    """The List around the items: kind List (or PodList), nothing that says it holds other things."""
    documents = bounded.load_yaml_documents(text, source) if text.strip() else [{}]
    wrapper = documents[0] if len(documents) == 1 else None
    if not isinstance(wrapper, dict) or wrapper.get("kind") not in (None, "List", "PodList"):
        kind = wrapper.get("kind") if isinstance(wrapper, dict) else None
        raise InputError(f"{source}: kind {str(kind)[:40]!r} is not a List of Pods; save the pods with "
                         "kubectl get pods -A -o yaml")
