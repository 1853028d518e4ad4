"""`kata-sizing operator`: run kopf with the operator's registry."""

from __future__ import annotations

import asyncio
import logging


def run_operator(liveness: str | None, standalone: bool, namespace: str | None = None) -> int:
    import kopf

    from .handlers import build_registry

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    asyncio.run(kopf.operator(
        registry=build_registry(),
        standalone=standalone,
        clusterwide=namespace is None,
        namespaces=[namespace] if namespace else (),
        liveness_endpoint=liveness,
    ))
    return 0
