"""The Kata RuntimeClass names the operator knows (DesiredCache.runtime_class_names), kept by how
many policies render each name, are the names the index of every policy's objects holds."""

from __future__ import annotations

import random

from kata_sizing.controller.kinds import ObjKey
from kata_sizing.controller.plan import Desired
from kata_sizing.controller.state import DesiredCache


def _desired(policy: str, classes: list[str], guarded: bool) -> Desired:
    objects: dict[ObjKey, dict] = {("RuntimeClass", None, name): {"kind": "RuntimeClass", "metadata": {"name": name}}
                                   for name in classes}
    owned: dict[ObjKey, dict] = {("ConfigMap", "kata-sizing", f"{policy}-dropins"): {"kind": "ConfigMap"}}
    return Desired(policy_name=policy, policy_uid=f"uid-{policy}", drift_policy="Correct", ref={},
                   namespace="kata-sizing", owned=owned if guarded else {**owned, **objects},
                   guarded=objects if guarded else {})


def test_the_names_kept_by_count_are_the_names_the_index_holds():
    rng = random.Random(7)
    cache = DesiredCache()
    names = [f"kata-{n}" for n in "abcdefgh"]  # few names: policies often share one (a conflict)
    for step in range(400):
        policy = f"p{rng.randrange(6)}"
        if rng.random() < 0.2:
            cache.drop(policy)
        else:
            cache.put(_desired(policy, rng.sample(names, rng.randrange(0, 4)), rng.random() < 0.3))
        indexed = frozenset(key[2] for key in cache.by_child if key[0] == "RuntimeClass")
        assert cache.runtime_class_names() == indexed, f"step {step}"
