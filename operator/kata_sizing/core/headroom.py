"""The headroom threshold of the measurement (docs/measurement.md): under how much headroom a
pod's VMM is close to an OOM kill. Its own module so the model can check spec.measurement's
field without importing the measurement."""

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


@dataclass(frozen=True)
class HeadroomThreshold:
    """Under how much headroom a pod is close to an OOM kill: a fraction of its podFixed.memory
    (the default, 10%) or a fixed number of bytes. A pod admitted without spec.overhead is held
    to its class's podFixed."""

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

    def bytes_for(self, pod_fixed_bytes: int) -> int:
        if self.fixed_bytes is not None:
            return self.fixed_bytes
        return int(math.ceil(Decimal(pod_fixed_bytes) * (self.fraction or 0)))

    def describe(self) -> str:
        if self.fixed_bytes is not None:
            return mib_text(self.fixed_bytes)
        return f"{format(((self.fraction or Decimal(0)) * 100).normalize(), 'f')}% of podFixed.memory"
