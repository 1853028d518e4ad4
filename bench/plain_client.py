"""The API server's own limit for the operator's writes: a plain client that writes exactly the
objects (and status) the operator would, and nothing else.

No kopf, no informers, no rendering, no decisions: the requests come ready-made (the objects
from the operator's own builders and their paths: `bench/limit_bench.py`), and every one is
sent at once, as far as the connection pool allows; it imports nothing of kata-sizing. The pool is
the one the operator's writes go through
(`controller.kube.CONNECTIONS`), so the two are compared at the same bound. It runs in-process
(one policy created, one spec changed) or as a process of its own
(`python -m bench.plain_client BATCHES.json`), which is what a cold start is compared with: an
interpreter starting, connecting and writing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import ssl
import sys
from pathlib import Path

import aiohttp
import yaml

USER_AGENT = "kata-sizing-bench-plain"
CONFLICT_ATTEMPTS = 5  # as controller/retry.py


class PlainClient:
    """One aiohttp session with the operator's identity (a kubeconfig with a token and a CA)."""

    def __init__(self, kubeconfig: Path, connections: int):
        config = yaml.safe_load(Path(kubeconfig).read_text())
        cluster = config["clusters"][0]["cluster"]
        self.server = cluster["server"]
        self.headers = {"Authorization": f"Bearer {config['users'][0]['user']['token']}",
                        "User-Agent": USER_AGENT, "Accept": "application/json"}
        self.ssl = ssl.create_default_context(cafile=cluster["certificate-authority"])
        self.connections = connections
        self.session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> PlainClient:
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=self.connections, ssl=self.ssl), headers=self.headers)
        return self

    async def __aexit__(self, *_) -> None:
        await self.session.close()

    async def _send(self, method: str, path: str, body: object, content_type: str = "application/json") -> None:
        for _ in range(CONFLICT_ATTEMPTS):
            async with self.session.request(method, self.server + path, data=json.dumps(body),
                                            headers={"Content-Type": content_type}) as response:
                text = await response.read()
                if response.status == 409 and method == "PUT":
                    # The object moved since its resourceVersion was read (kube-controller-manager
                    # writes an admission policy's status after each change): re-read and update
                    # again, as the operator's executor does on a 409.
                    body = {**body, "metadata": {**body["metadata"], "resourceVersion": await self._version(path)}}
                    continue
                if response.status >= 400:
                    raise RuntimeError(f"{method} {path}: {response.status} {text[:300]!r}")
                return
        raise RuntimeError(f"{method} {path}: still 409 after {CONFLICT_ATTEMPTS} attempts")

    async def _version(self, path: str) -> str:
        async with self.session.get(self.server + path) as response:
            return json.loads(await response.read())["metadata"]["resourceVersion"]

    async def write_policy(self, batch: dict, written: dict[str, asyncio.Event]) -> None:
        """One policy: its object writes all at once ([method, path, body, the object's path, the
        paths of the objects of this run it must follow]: POST a new object, PUT a changed one),
        then its status, as the operator writes status only after the objects. A binding follows
        its admission policy and parameters: the API server refuses it before its policy exists."""
        async def send(method: str, path: str, body: object, own: str, after: list[str]) -> None:
            try:
                for other in after:
                    if other in written:
                        await written[other].wait()
                await self._send(method, path, body)
            finally:
                written[own].set()

        await asyncio.gather(*(send(*write) for write in batch["writes"]))
        await self._send("PATCH", batch["status_path"], {"status": batch["status"]}, "application/merge-patch+json")

    async def write(self, batches: list[dict]) -> None:
        written = {write[3]: asyncio.Event() for b in batches for write in b["writes"]}
        await asyncio.gather(*(self.write_policy(b, written) for b in batches))


async def _main(kubeconfig: Path, batches: list[dict], connections: int) -> None:
    async with PlainClient(kubeconfig, connections) as client:
        await client.write(batches)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("batches", type=Path,
                        help="JSON: [{writes: [[method, path, body, own path, [paths after]]], status_path, status}]")
    parser.add_argument("--kubeconfig", type=Path, required=True)
    parser.add_argument("--connections", type=int, required=True)
    args = parser.parse_args(argv)
    asyncio.run(_main(args.kubeconfig, json.loads(args.batches.read_text()), args.connections))
    return 0


if __name__ == "__main__":
    sys.exit(main())
