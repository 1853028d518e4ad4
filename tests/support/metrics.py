"""The operator's /metrics and /readyz as Prometheus sees them: fetched over HTTP and parsed with
Prometheus' own text parser."""

from __future__ import annotations

import urllib.error
import urllib.request

from prometheus_client.parser import text_string_to_metric_families


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """{(sample name, sorted labels): value} from the exposition format."""
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[sample.name, tuple(sorted(sample.labels.items()))] = sample.value
    return found


def value(text: str, name: str, **labels: str) -> float:
    return samples(text).get((name, tuple(sorted(labels.items()))), 0.0)


def get(url: str) -> tuple[int, str]:
    """(status, body); (0, "") while nothing listens yet."""
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()
    except OSError:
        return 0, ""
