"""The headroom threshold of the measurement (docs/measurement.md): under how much headroom a
pod's VMM is close to an OOM kill. Its own module so the model can check spec.measurement's
field without importing the measurement; the one home of the warning line, which the measurement
(HeadroomLow), calibrate's proposals and status all draw.

A pod cgroup's limit is the pod's limits plus podFixed.memory. Its VM holds at most the limits plus
the class's guest budget, even fully resident (confidential guests, pre-allocated memory): what
podFixed holds beyond the guest budget is the host side's share, the part no VM fills by design. A
fully resident VM's headroom is that share less what its shim, VMM and virtiofsd use, whatever its
workload does; a VM that is not fully resident has its untouched pages on top. So the line is a share
of the host side's share, not of the whole podFixed: a line of 10% of a podFixed of 852 MiB (85 MiB)
would sit above every fully resident VM whose host side has 26 MiB, and hold back the difference in
every pod only to stay above it."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from decimal import Decimal

from .quantity import MIB, QuantityError, memory_bytes


def mib_text(size_bytes: int) -> str:
    """Bytes as MiB with one decimal, as events and messages print them."""
    return f"{Decimal(size_bytes) / MIB:.1f}Mi"


_PERCENT = re.compile(r"[0-9]+(\.[0-9]+)?%", re.ASCII)


def host_share_bytes(pod_fixed_bytes: int, guest_budget_bytes: int) -> int:
    """What podFixed.memory holds beyond the guest budget: the host side's share, which no VM of the
    class fills even when fully resident (0 when podFixed is below the budget, which validate refuses)."""
    return max(0, pod_fixed_bytes - guest_budget_bytes)


@dataclass(frozen=True)
class HeadroomThreshold:
    """Under how much headroom a pod is close to an OOM kill: a fraction of the host side's share of
    its class's podFixed.memory (podFixed less the class's guest budget; the default, 10%) or a fixed
    number of bytes."""

    fraction: Decimal | None = Decimal("0.10")
    fixed_bytes: int | None = None

    @classmethod
    def parse(cls, text: str) -> HeadroomThreshold:
        """`10%` (of podFixed.memory) or a memory quantity (`64Mi`); ValueError says why not."""
        text = text.strip()
        if text.endswith("%"):
            # ASCII digits only, as the API server's quantities: Decimal() alone would read "１０%" and "1_0%" as 10%.
            if not _PERCENT.fullmatch(text):
                raise ValueError(f"{text!r} is not a percentage such as 10% (ASCII digits, an optional fraction)")
            percent = Decimal(text[:-1])
            if not 0 <= percent <= 100:
                raise ValueError(f"{text!r} must be between 0% and 100% of podFixed.memory")
            return cls(fraction=percent / 100)
        try:
            return cls(fraction=None, fixed_bytes=memory_bytes(text))
        except QuantityError as exc:
            raise ValueError(f"{text!r} is neither a percentage (10%) nor a memory quantity (64Mi): {exc}") from None

    def line_bytes(self, pod_fixed_bytes: int, guest_budget_bytes: int) -> int:
        """The warning line of a pod admitted with `pod_fixed_bytes` in a class whose guest budget is
        `guest_budget_bytes`."""
        if self.fixed_bytes is not None:
            return self.fixed_bytes
        share = host_share_bytes(pod_fixed_bytes, guest_budget_bytes)
        return int(math.ceil(Decimal(share) * (self.fraction or 0)))

    def describe(self) -> str:
        if self.fixed_bytes is not None:
            return mib_text(self.fixed_bytes)
        percent = format(((self.fraction or Decimal(0)) * 100).normalize(), "f")
        return f"{percent}% of podFixed.memory beyond the guest budget"
