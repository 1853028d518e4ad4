"""`kata-sizing survey`: one measurement of a policy's Kata pods (kubelet Summaries) as calibrate's CSV."""

from __future__ import annotations

import argparse
import sys

from ..core import bounded
from ..core.bounded import InputError
from .common import EXIT_INVALID, EXIT_OK, print_problems, read_text, sized_policy, unreadable

HELP = "measure a policy's Kata pods once (kubelet Summaries) as calibrate's CSV"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("policy", metavar="POLICY.yaml")
    parser.add_argument("--summary", metavar="SUMMARY.json", action="append", default=[],
                        help="a saved Summary (kubectl get --raw /api/v1/nodes/NODE/proxy/stats/summary), "
                             "repeatable; without it the cluster of KUBECONFIG is read")
    parser.add_argument("--pods", metavar="PODS.yaml", action="append", default=[],
                        help="with --summary: kubectl get pods -A -o yaml (repeatable: a list split by namespace "
                             "or node)")
    parser.add_argument("--policy-name", help="which policy, when the file holds several")
    parser.add_argument("--timeout", type=float, default=10.0, metavar="S", help="per Summary read (default 10)")


def run(args: argparse.Namespace) -> int:
    """One measurement of every Kata pod of a policy (docs/measurement.md), as calibrate's CSV."""
    from ..core.survey import PodIndex, SurveyInputError, readings_from, survey_rows, to_csv

    policy, sizing = sized_policy(args, most_timeout_s=600)
    index = PodIndex({c.runtime_class for c in sizing.classes})
    try:
        if args.summary:
            if not args.pods:
                raise InputError("--summary needs --pods PODS.yaml (kubectl get pods -A -o yaml): the pods' limits "
                                 "and classes are in their specs, not in the Summary")
            for path in dict.fromkeys(args.pods):
                _saved_pods(path, index)
            summaries, source = _saved_summaries(args), "saved Summaries"
        else:
            if args.pods:
                raise InputError("--pods goes with --summary; without them the cluster is read")
            summaries, fetch_notes = _cluster_summaries(index, args.timeout)
            print_problems(fetch_notes, "note")
            source = "the cluster (kubelet Summaries through the API server)"
        readings, notes = readings_from(summaries, index)
    except SurveyInputError as exc:
        raise InputError(str(exc)) from None
    rows, row_notes = survey_rows(readings, sizing)
    print_problems(notes + index.notes() + row_notes, "note")
    if not rows:
        print(f"error: no pod of policy {policy.name}'s classes ({', '.join(sorted(index.runtime_classes))}) was "
              f"measured in {source}", file=sys.stderr)
        return EXIT_INVALID
    nodes = len({row.node for row in rows})
    sys.stdout.write(to_csv(rows, [
        f"kata-sizing survey of policy {policy.name}: {len(rows)} pod(s) on {nodes} node(s), from {source}.",
        "Host side only (the kubelet's Summary); free_total_mib/free_used_mib need `free -m` in the guest.",
        f"Refit with: kata-sizing calibrate THIS.csv --policy {args.policy}",
    ]))
    return EXIT_OK


def _saved_summaries(args: argparse.Namespace) -> list[tuple[str, object]]:
    """The Summaries, one per node: a file given twice is read once (said), two files of one node
    are refused (which one is the node's?)."""
    found: list[tuple[str, object]] = []
    paths_of: dict[str, str] = {}
    for path in args.summary:
        if path in paths_of.values():
            print(f"note: {bounded.printable(path)} is given twice; it is read once", file=sys.stderr)
            continue
        document = bounded.load_json(read_text(path), path)
        node = ((document.get("node") or {}) if isinstance(document, dict) else {}).get("nodeName")
        if not isinstance(node, str) or not node:
            raise InputError(f"{path}: not a kubelet Summary (no node.nodeName); save one with "
                             "kubectl get --raw /api/v1/nodes/NODE/proxy/stats/summary")
        from ..core.kubegrammar import dns_subdomain_problem

        problem = dns_subdomain_problem(node)
        if problem:
            raise InputError(f"{path}: node.nodeName: {problem}")
        if node in paths_of:
            raise InputError(f"{paths_of[node]} and {path} are both Summaries of node {node}: give one per node")
        paths_of[node] = path
        found.append((node, document))
    return found


def _lines(path: str):
    """The lines of a file, read as they are needed (a pod list may be far larger than other inputs)."""
    try:
        handle = open(path, encoding="utf-8", newline="")
    except OSError as exc:
        raise unreadable(path, exc) from None
    with handle:
        try:
            yield from handle
        except (OSError, ValueError) as exc:
            raise unreadable(path, exc) from None


def _saved_pods(path: str, index) -> None:
    """`kubectl get pods -A -o yaml` into `index`, a pod at a time (core/podlist.py); text laid out
    otherwise (JSON, several documents) is read whole, within the 4 MiB of any input."""
    from ..core.audit import AuditError
    from ..core.podaudit import pods_from_documents
    from ..core.podlist import SPLIT, NotStreamable, read_pod_list

    def wanted(text: str) -> bool:
        # Only a pod with a runtimeClassName can be a Kata pod (an escape could hide the key's text).
        return "runtimeClassName" in text or "\\" in text

    if path != "-":
        try:
            for where, pod in read_pod_list(_lines(path), path, wanted):
                index.add(pod, where)
            return
        except NotStreamable:
            pass
    try:
        text = read_text(path)
    except InputError as exc:
        raise InputError(f"{exc}; a pod list larger than that must be a List as kubectl writes it (-o yaml), or "
                         f"{SPLIT}") from None
    try:
        pods = pods_from_documents(bounded.load_yaml_documents(text, path), path)
    except AuditError as exc:
        raise InputError(str(exc)) from None
    for where, pod in pods:
        if isinstance(pod, dict) and pod.get("kind") not in (None, "Pod"):
            raise InputError(f"{where}: kind {str(pod.get('kind'))[:40]!r} is not a Pod or a List of Pods; save the "
                             "pods with kubectl get pods -A -o yaml")
        index.add(pod, where)
    if not index.pods:
        raise InputError(f"{path}: holds no Pod; save the pods with kubectl get pods -A -o yaml")


def _cluster_summaries(index, timeout_s: float) -> tuple[list, list[str]]:
    """The pods from the API server (a page at a time, into `index`), and the Summary of each node
    running one of them (through the API server's node proxy, as `kubectl get --raw` reads it: the
    CLI runs where kubectl does, not necessarily where the kubelets are reachable)."""
    import asyncio

    from ..controller.kube import ApiError, KubeApi  # the kubernetes client loads only here

    async def read() -> tuple[list, list[str]]:
        try:
            api = await KubeApi.connect()
        except Exception as exc:  # noqa: BLE001 - the client's config errors have no common type
            raise InputError(f"cannot connect to the cluster: {exc}") from None
        try:
            continue_token, number = None, 0
            while True:
                page, _, continue_token = await api.list_page("Pod", 500, continue_token)
                for pod in page:
                    index.add(pod, f"pods[{number}]")
                    number += 1
                if not continue_token:
                    break
            limit = asyncio.Semaphore(8)
            notes: list[str] = []

            async def one(node: str):
                async with limit:
                    try:
                        return node, await api.read_node_summary(node, timeout_s)
                    except ApiError as exc:
                        notes.append(f"node {node} skipped: {exc}")
                        return None

            found = await asyncio.gather(*(one(node) for node in sorted(index.by_node)))
            return [f for f in found if f is not None], notes
        except ApiError as exc:
            raise InputError(f"cannot read the pods: {exc}") from None
        finally:
            await api.close()

    return asyncio.run(read())
