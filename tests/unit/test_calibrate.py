"""Tests for fitting Kata's guest overhead from survey rows (kata_sizing.core.calibrate)."""

from __future__ import annotations

import math
from decimal import Decimal
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kata_sizing.core.calibrate import (
    CalibrationError,
    Fit,
    Sample,
    fit_overhead,
    parse_samples_csv,
)
from kata_sizing.core.sizing import guest_budget_mib
from tests.support.paths import FIXTURES

SURVEY = FIXTURES / "survey-aks-clh-snp.csv"
HEADER = "container_limit_mib,vm_nominal_mib,free_total_mib,free_used_mib,pod_cgroup_memory_current_bytes"


def _survey() -> list[Sample]:
    return parse_samples_csv(SURVEY.read_text())


def _points(samples) -> list[tuple[Fraction, Fraction]]:
    """(the VM's nominal MiB, what it kept from the workload) of samples that each say both."""
    points = [(Fraction(s.vm_nominal_mib), s.unusable_mib) for s in samples]
    assert all(y is not None for _, y in points), points
    return [(x, y) for x, y in points if y is not None]


def _least_squares_band(points: list[tuple[Fraction, Fraction]]) -> Fraction:
    n = len(points)
    mean_x = sum((x for x, _ in points), Fraction(0)) / n
    mean_y = sum((y for _, y in points), Fraction(0)) / n
    slope = sum(((x - mean_x) * (y - mean_y) for x, y in points), Fraction(0)) / sum(
        ((x - mean_x) ** 2 for x, _ in points), Fraction(0)
    )
    residuals = [y - (mean_y + slope * (x - mean_x)) for x, y in points]
    return max(residuals) - min(residuals)


def _lp_optimum(points: list[tuple[Fraction, Fraction]]) -> Fraction:
    """Least total over-coverage of any line with ratio >= 0 and base >= 0, by brute force.

    The LP's optimum is at a vertex of its feasible region, where two constraints are
    tight: two points (the origin stands for base >= 0), or one point and ratio = 0.
    """
    constraints = [*points, (Fraction(0), Fraction(0))]
    candidates = [(Fraction(0), y) for _, y in constraints]
    for i, (x1, y1) in enumerate(constraints):
        for x2, y2 in constraints[i + 1 :]:
            if x1 != x2:
                ratio = (y2 - y1) / (x2 - x1)
                candidates.append((ratio, y1 - ratio * x1))
    feasible = [
        sum((base + ratio * x - y for x, y in points), Fraction(0))
        for ratio, base in candidates
        if ratio >= 0 and all(base + ratio * x >= y for x, y in constraints)
    ]
    return min(feasible)


def _row(vm: int, unusable: Decimal | int, used: Decimal | int = 0) -> Sample:
    """A sample of a VM of `vm` MiB that loses `unusable` MiB, `used` of it to daemons."""
    return Sample(
        container_limit_mib=Decimal(vm // 2),
        vm_nominal_mib=Decimal(vm),
        free_total_mib=Decimal(vm) - Decimal(unusable) + Decimal(used),
        free_used_mib=Decimal(used),
    )


def _csv(samples: list[Sample]) -> str:
    lines = [HEADER]
    for s in samples:
        current = "" if s.pod_cgroup_memory_current_bytes is None else s.pod_cgroup_memory_current_bytes
        lines.append(
            f"{s.container_limit_mib},{s.vm_nominal_mib},{s.free_total_mib},{s.free_used_mib},{current}"
        )
    return "\n".join(lines) + "\n"


# --- the survey of docs/sizing-model.md ------------------------------------------------


def test_survey_parses_as_the_table_says() -> None:
    samples = _survey()
    assert [int(s.vm_nominal_mib) for s in samples] == [306, 406, 756, 1280, 2304, 4352]
    assert [s.unusable_mib for s in samples] == [136, 137, 146, 222, 370, 683]
    # Line numbers count the comment and header lines above the rows.
    assert [s.line for s in samples] == [5, 6, 7, 8, 9, 10]


def test_survey_fit_covers_every_sample_and_is_not_loose() -> None:
    """Every sample is covered; none is over-covered by more than margin * value + spread.

    Spread is the width of the band the samples occupy around their least-squares line
    (largest minus smallest least-squares residual, 52.4 MiB here). It is the scatter a
    straight line cannot explain: any line covering all samples sits at least that far
    above some sample. The least-squares line's largest residual alone (28.6 MiB) would
    not do: the survey is convex (nearly flat to 756 MiB, then about 0.145 MiB/MiB), so
    the only covering chord runs from 306 to 4352 MiB and over-covers 756 MiB by 51.2.
    """
    samples = _survey()
    fit = fit_overhead(samples)
    points = _points(samples)
    spread = _least_squares_band(points)
    for (x, y), residual in zip(points, fit.residuals_mib, strict=True):
        assert fit.base_mib + Fraction(fit.ratio) * x - y == Fraction(residual)
        assert residual >= 0
        assert Fraction(residual) <= Fraction(fit.margin) * y + spread


def test_survey_fitted_parameters() -> None:
    fit = fit_overhead(_survey())
    # The hull is one chord, (306, 136) to (4352, 683): slope 547/4046 = 0.13519..., up to
    # 0.1352; base = ceil(max(unusable - 0.1352 * V)) = ceil(136 - 41.3712) = 95.
    assert fit.ratio == Decimal("0.1352")
    assert fit.base_mib == 95
    assert fit.residuals_mib == tuple(
        Decimal(r) for r in ("0.3712", "12.8912", "51.2112", "46.056", "36.5008", "0.3904")
    )
    assert fit.max_guest_daemons_mib == 47
    assert fit.margin == Decimal("0.10")


def test_survey_host_side() -> None:
    """memory.current / MiB - nominal is 6.2 to 23.4 MiB, so 24 MiB rounded up.

    The survey's "about 50 MiB worst case" is the published bound (host < 50 MiB), not
    what these rows measure; the largest measured host side is 4587950080 B = 4375.41 MiB
    against a 4352 MiB VM.
    """
    samples = _survey()
    hosts = [s.host_mib for s in samples]
    assert hosts[-1] == Fraction(4587950080, 2**20) - 4352
    assert all(h is not None and 6 < h < 24 for h in hosts)
    fit = fit_overhead(samples)
    assert fit.host_mib == 24
    assert fit.host_mib <= 50
    # Printed with a margin of its own: 23.4 MiB x 1.10, rounded up (a pod holding exactly the
    # largest host side measured would otherwise have no headroom at all).
    assert fit.host_with_margin_mib == 26
    assert fit.overhead_block() == {
        "guestMemoryBase": "95Mi",
        "guestMemoryRatio": "0.1352",
        "hostMemory": "26Mi",
        "margin": "0.10",
    }


def test_survey_budget_leaves_the_limit_usable() -> None:
    fit = fit_overhead(_survey())
    for limit in (50, 150, 500, 1024, 2048, 4096):
        budget = guest_budget_mib(fit.base_mib, fit.ratio, limit, fit.margin)
        assert fit.unusable_mib(limit + budget) <= budget


def test_domain_table_wording_is_accepted() -> None:
    text = SURVEY.read_text().replace(
        HEADER, "Container limit, VM nominal, Free total, Free used, Pod cgroup memory.current"
    )
    assert parse_samples_csv(text) == _survey()


# --- parsing ---------------------------------------------------------------------------


def test_columns_in_any_order_any_case_blank_lines_and_comments() -> None:
    text = (
        "\n# a comment\n"
        "VM_NOMINAL_MIB, Free_Used_MiB, free_total_mib, container_limit_mib\n"
        "\n"
        "306, 27, 197, 50\n"
        "  # another comment\n"
        "406.5, 26, 295.25, 150\n"
    )
    samples = parse_samples_csv(text)
    assert samples == [
        Sample(Decimal(50), Decimal(306), Decimal(197), Decimal(27)),
        Sample(Decimal(150), Decimal("406.5"), Decimal("295.25"), Decimal(26)),
    ]
    assert [s.line for s in samples] == [5, 7]
    assert all(s.host_mib is None for s in samples)


def test_empty_memory_current_means_unknown_host() -> None:
    text = f"{HEADER}\n306,306,197,27,\n406,406,295,26,\n"
    fit = fit_overhead(parse_samples_csv(text))
    assert fit.host_mib is None
    assert "hostMemory" not in fit.overhead_block()


def test_host_is_the_largest_known() -> None:
    text = f"{HEADER}\n50,306,197,27,\n150,406,295,26,{406 * 2**20 + 1}\n"
    assert fit_overhead(parse_samples_csv(text)).host_mib == 1


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ("50,306,abc,27,", "line 2: free_total_mib: 'abc' is not a number"),
        ("50,650,700,27,", "line 2: free_total_mib 700 is larger than vm_nominal_mib 650"),
        ("50,306,197,198,", "line 2: free_used_mib 198 is larger than free_total_mib 197"),
        ("500,306,197,27,", "line 2: container_limit_mib 500 is larger than vm_nominal_mib 306"),
        ("50,306,197,-1,", "line 2: free_used_mib -1 is negative"),
        ("50,0,0,0,", "line 2: vm_nominal_mib is 0"),
        ("50,,197,27,", "line 2: vm_nominal_mib: is empty; it is required"),
        ("50,306,197,27,-5", "line 2: pod_cgroup_memory_current_bytes -5 is negative"),
        ("50,306,197,27,1e9", "line 2: pod_cgroup_memory_current_bytes: '1e9' is not a whole number"),
        ("50,306,197,27,12.5", "line 2: pod_cgroup_memory_current_bytes: '12.5' is not a whole number"),
        ("50,306,197,27,1000", "line 2: pod_cgroup_memory_current_bytes 1000 is less than vm_nominal_mib 306"),
        ("50,306,nan,27,", "line 2: free_total_mib: 'nan' is not a number"),
        ("50,306,197", "line 2: has 3 fields, the header (line 1) has 5"),
    ],
)
def test_malformed_row(row: str, message: str) -> None:
    with pytest.raises(CalibrationError) as caught:
        parse_samples_csv(f"{HEADER}\n{row}\n")
    assert caught.value.problems[0].startswith(message)
    assert message in str(caught.value)


def test_all_row_problems_are_reported_at_once() -> None:
    text = f"{HEADER}\n# rows\n50,306,197,27,\n50,306,abc,x,\n50,650,700,27,\n"
    with pytest.raises(CalibrationError) as caught:
        parse_samples_csv(text)
    assert caught.value.problems == (
        "line 4: free_total_mib: 'abc' is not a number",
        "line 4: free_used_mib: 'x' is not a number",
        "line 5: free_total_mib 700 is larger than vm_nominal_mib 650",
    )
    assert str(caught.value).startswith("3 problems in the survey:\n  line 4: free_total_mib")
    assert isinstance(caught.value, ValueError)


@pytest.mark.parametrize(
    ("header", "message"),
    [
        ("container_limit_mib,vm_nominal_mib,free_total_mib", "line 1: missing column(s) free_used_mib"),
        (
            "container_limit_mib,vm_nominal_mib,free_totl_mib,free_used_mib",
            "line 1: unknown column 'free_totl_mib'",
        ),
        (
            "container_limit_mib,vm_nominal_mib,free_total_mib,free_used_mib,VM nominal",
            "line 1: column vm_nominal_mib appears twice",
        ),
    ],
)
def test_bad_header(header: str, message: str) -> None:
    with pytest.raises(CalibrationError) as caught:
        parse_samples_csv(f"{header}\n50,306,197,27,1\n")
    assert any(p.startswith(message) for p in caught.value.problems)


def test_no_header() -> None:
    with pytest.raises(CalibrationError, match="no header"):
        parse_samples_csv("\n# only a comment\n\n")


def test_sample_checks_its_own_rules() -> None:
    with pytest.raises(CalibrationError, match="free_total_mib 700 is larger"):
        Sample(Decimal(50), Decimal(650), Decimal(700), Decimal(27))
    with pytest.raises(TypeError, match="free_total_mib"):
        Sample(Decimal(50), Decimal(650), 600.0, Decimal(27))  # type: ignore[arg-type]


# --- fitting: edge cases ---------------------------------------------------------------


@pytest.mark.parametrize(
    "rows",
    ["", "50,306,197,27,335077376\n", "50,306,197,27,\n60,306,190,27,\n"],
    ids=["none", "one", "one-size"],
)
def test_fewer_than_two_sizes(rows: str) -> None:
    with pytest.raises(CalibrationError, match="two or more distinct VM sizes"):
        fit_overhead(parse_samples_csv(f"{HEADER}\n{rows}"))


def test_ratio_of_point_nine_or_more_is_refused() -> None:
    # Unusable goes from 950 MiB at 1000 MiB to 1045 MiB at 1100 MiB: 0.95 MiB per MiB.
    # (A steep edge with a small first sample is not enough: base >= 0 lets the line
    # through the origin instead, as test_base_is_never_negative shows.)
    text = f"{HEADER}\n500,1000,50,0,\n500,1100,55,0,\n"
    with pytest.raises(CalibrationError) as caught:
        fit_overhead(parse_samples_csv(text))
    message = str(caught.value)
    assert "guestMemoryRatio 0.9500 is not below 0.9" in message
    assert "line 3 (vm_nominal_mib 1100, unusable 1045)" in message


def test_unusable_falling_with_size_gives_a_flat_line_on_the_highest_sample() -> None:
    fit = fit_overhead([_row(1000, 300), _row(2000, 200)])
    assert (fit.base_mib, fit.ratio) == (300, Decimal("0.0000"))
    assert fit.residuals_mib == (0, 100)


def test_base_is_never_negative() -> None:
    # The unconstrained chord is 0.1 * V - 50; an empty VM cannot lose -50 MiB, so the
    # line goes through the origin and the 2000 MiB sample instead.
    fit = fit_overhead([_row(1000, 50), _row(2000, 150)])
    assert (fit.base_mib, fit.ratio) == (0, Decimal("0.0750"))
    assert fit.residuals_mib == (25, 0)


def test_several_samples_at_one_size_are_all_covered() -> None:
    fit = fit_overhead([_row(1000, 100), _row(1000, 130), _row(2000, 230), _row(2000, 200)])
    assert (fit.base_mib, fit.ratio) == (30, Decimal("0.1000"))
    assert fit.residuals_mib == (30, 0, 0, 30)


def test_negative_margin_is_refused() -> None:
    with pytest.raises(CalibrationError, match="margin"):
        fit_overhead(_survey(), margin=Decimal("-0.1"))


def test_overhead_block_without_host_keeps_margin() -> None:
    fit = Fit(64, Decimal("0.1400"), None, (), Decimal(30), Decimal("0.2"))
    assert fit.overhead_block() == {
        "guestMemoryBase": "64Mi",
        "guestMemoryRatio": "0.1400",
        "margin": "0.2",
    }


# --- fitting: synthetic data -----------------------------------------------------------


@st.composite
def _exact_survey(draw: st.DrawFn) -> tuple[int, Decimal, list[Sample]]:
    base = draw(st.integers(0, 1024))
    ratio = Decimal(draw(st.integers(0, 8999))).scaleb(-4)
    # A VM must be able to hold its own unusable memory: V * (1 - ratio) >= base.
    smallest = max(1, math.ceil(Fraction(base) / (1 - Fraction(ratio))))
    sizes = draw(st.lists(st.integers(smallest, smallest + 65536), min_size=2, max_size=8))
    sizes = draw(st.permutations(sorted(set(sizes))))
    if len(sizes) < 2:
        sizes = [smallest, smallest + 1]
    samples = []
    for vm in sizes:
        unusable = base + ratio * vm
        daemons = min(Decimal(draw(st.integers(0, 64))), unusable)
        samples.append(_row(vm, unusable, daemons))
    return base, ratio, samples


@given(_exact_survey())
def test_exact_data_is_recovered_exactly(case: tuple[int, Decimal, list[Sample]]) -> None:
    base, ratio, samples = case
    fit = fit_overhead(parse_samples_csv(_csv(samples)))
    assert (fit.base_mib, fit.ratio) == (base, ratio)
    assert all(r == 0 for r in fit.residuals_mib)


@st.composite
def _noisy_survey(draw: st.DrawFn) -> list[Sample]:
    base = draw(st.integers(0, 512))
    ratio = Fraction(draw(st.integers(0, 7000)), 10**4)
    # Sizes at least 1 GiB apart keep noise of +-64 MiB from tilting the slope past 0.9.
    steps = draw(st.lists(st.integers(0, 60), min_size=2, max_size=10, unique=True))
    samples = []
    for step in steps:
        vm = 4096 + 1024 * step
        noise = Fraction(draw(st.integers(-6400, 6400)), 100)
        unusable = max(Fraction(0), base + ratio * vm + noise)
        samples.append(_row(vm, Decimal(unusable.numerator) / unusable.denominator))
    return samples


@given(_noisy_survey())
def test_noisy_data_stays_covered_and_tight(samples: list[Sample]) -> None:
    """Covered, and looser than the exact LP optimum only by the rounding of base and ratio.

    Rounding base up costs under 1 MiB per sample and rounding ratio up under 1e-4 * V.
    """
    fit = fit_overhead(samples)
    points = _points(samples)
    residuals = [fit.base_mib + Fraction(fit.ratio) * x - y for x, y in points]
    assert residuals == [Fraction(r) for r in fit.residuals_mib]
    assert all(r >= 0 for r in residuals)
    optimum = _lp_optimum(points)
    slack = len(points) + Fraction(1, 10**4) * sum(x for x, _ in points)
    assert optimum <= sum(residuals) <= optimum + slack


# --- the guest budget ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("base", "ratio", "limit", "margin", "budget"),
    [
        # 0.14 * 512 = 71.68; (64 + 71.68) / 0.86 = 157.767...; * 1.1 = 173.544... -> 174.
        (64, "0.14", 512, "0.10", 174),
        # (95 + 0.1352 * 2048) / 0.8648 = 371.8896 / 0.8648 = 430.029...; * 1.1 = 473.03 -> 474.
        (95, "0.1352", 2048, "0.10", 474),
        # No ratio: the base alone, times the margin: 100 * 1.1 = 110, already even.
        (100, "0", 4096, "0.10", 110),
        # An odd whole number goes up to the next even one.
        (63, "0", 0, "0", 64),
        # (0 + 0.5 * 100) / 0.5 = 100 exactly: no bump when already even.
        (0, "0.5", 100, "0", 100),
        (0, "0", 0, "0", 0),
    ],
)
def test_guest_budget_examples(base: int, ratio: str, limit: int, margin: str, budget: int) -> None:
    assert guest_budget_mib(base, Decimal(ratio), limit, Decimal(margin)) == budget


def test_guest_budget_refuses_floats_and_bad_ratios() -> None:
    with pytest.raises(TypeError, match="ratio"):
        guest_budget_mib(64, 0.14, 512, Decimal("0.1"))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="ratio 0.9 is not below 0.9"):
        guest_budget_mib(64, Decimal("0.9"), 512, Decimal("0.1"))
    with pytest.raises(ValueError, match="largest_limit_mib -1 is negative"):
        guest_budget_mib(64, Decimal("0.1"), -1, Decimal("0.1"))


@given(
    base=st.integers(0, 4096),
    ratio=st.integers(0, 8999).map(lambda k: Decimal(k).scaleb(-4)),
    limit=st.integers(0, 1 << 20),
    margin=st.integers(0, 100).map(lambda k: Decimal(k).scaleb(-2)),
)
def test_the_largest_pod_fits(base: int, ratio: Decimal, limit: int, margin: Decimal) -> None:
    """In a VM of L + G the guest loses at most G, so all of L stays usable."""
    budget = guest_budget_mib(base, ratio, limit, margin)
    assert budget % 2 == 0
    assert base + ratio * (limit + budget) <= budget
    # And no bigger than needed: the next even size down would miss margin or fit.
    needed = (base + Fraction(ratio) * limit) / (1 - Fraction(ratio)) * (1 + Fraction(margin))
    assert budget - 2 < needed
