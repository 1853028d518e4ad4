"""`calibrate --plot` and `render --proposal --plot`: the fit drawn, for a person deciding whether to
apply a proposal (docs/measurement.md). matplotlib is an optional extra (`pip install
'kata-sizing[plot]'`), imported here only, and only when --plot is given: `render` never loads it.

What is drawn, each artist with a gid so a reader (and the tests) can find it in the SVG:

- `guest-samples`: each row's unusable memory (measured in the guest, or a kubelet row's overhead
  used less the host side) against its VM's nominal size; `host-samples`: each fully resident VM's
  host side;
- `fit-line`: the fitted line base + ratio x V (the samples' upper envelope) over the surveyed VMs,
  `fit-line-extrapolated` past the largest surveyed VM, `fit-line-margin`: the line with the margin;
- `host-line`: the hostMemory proposed (or printed);
- `data-range` and `extrapolated-range`: the VMs the survey covers and those past it;
- per class `class-<name>` (or `class-<name>-extrapolated`): its VMs (from its smallest pod's to its
  largest) at the height of its guest budget, labelled with the budget and podFixed.
"""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

FORMATS = (".svg", ".png")


class PlotUnavailable(Exception):
    """The plot cannot be drawn here (no matplotlib, or a file type it does not write)."""


def _matplotlib():
    try:
        import matplotlib
    except ImportError:
        raise PlotUnavailable("--plot needs matplotlib, the optional extra `plot`: pip install 'kata-sizing[plot]' "
                              "(or pip install matplotlib)") from None
    matplotlib.use("Agg")  # no display: files only
    from matplotlib.figure import Figure

    return matplotlib, Figure


def plot_fit(fit, proposal, path: str) -> None:
    """Draw `fit` (calibrate.Fit) and, when given, `proposal`'s classes to `path` (.svg or .png)."""
    suffix = Path(path).suffix.lower()
    if suffix not in FORMATS:
        raise PlotUnavailable(f"--plot: {path}: write an .svg or a .png file")
    matplotlib, Figure = _matplotlib()
    surveyed = float(fit.largest_vm_mib)
    classes = proposal.classes if proposal is not None else ()
    right = max([surveyed, *(c.largest_vm_mib for c in classes)]) * 1.05

    figure = Figure(figsize=(10, 6.5))
    axes = figure.add_subplot()
    axes.set_xlim(0, right)
    axes.set_xlabel("VM nominal memory (MiB)")
    axes.set_ylabel("MiB")
    axes.set_title("kata-sizing: overhead fit" + (f" of policy {proposal.refitted.name}" if proposal else ""))
    axes.axvspan(0, surveyed, color="#e8f0fe", gid="data-range", label=f"surveyed VMs (up to {surveyed:g} MiB)")
    if right > surveyed:
        axes.axvspan(surveyed, right, facecolor="none", edgecolor="#c0c0c0", hatch="//", gid="extrapolated-range",
                     label="extrapolated")

    xs = [float(x) for x, _ in fit.guest_points]
    axes.scatter(xs, [float(y) for _, y in fit.guest_points], color="#1a73e8", zorder=3, gid="guest-samples",
                 label="guest side per sample (unusable MiB)")
    if fit.host_points:
        axes.scatter([float(x) for x, _ in fit.host_points], [float(y) for _, y in fit.host_points], marker="s",
                     color="#e37400", zorder=3, gid="host-samples", label="host side per fully resident VM")

    def line(x: float, margin: Decimal = Decimal(0)) -> float:
        return float(fit.unusable_mib(Decimal(repr(x))) * (1 + margin))

    axes.plot([0, surveyed], [line(0), line(surveyed)], color="#174ea6", gid="fit-line",
              label=f"upper envelope: {fit.base_mib} + {fit.ratio} x V")
    if right > surveyed:
        axes.plot([surveyed, right], [line(surveyed), line(right)], color="#174ea6", linestyle="--",
                  gid="fit-line-extrapolated", label="upper envelope, extrapolated")
    axes.plot([0, right], [line(0, fit.margin), line(right, fit.margin)], color="#174ea6", linestyle=":",
              gid="fit-line-margin", label=f"with the margin {fit.margin}")
    host = _host_mib(fit, proposal)
    if host is not None:
        axes.plot([0, right], [host, host], color="#e37400", linestyle="--", gid="host-line",
                  label=f"hostMemory {host:g} MiB")

    previous_limit = 0
    for c in classes:
        smallest_vm = c.largest_vm_mib - (c.envelope_memory_mib - previous_limit)
        previous_limit = c.envelope_memory_mib
        gid = f"class-{c.name}" + ("-extrapolated" if c.extrapolated else "")
        axes.plot([smallest_vm, c.largest_vm_mib], [c.guest_budget_mib, c.guest_budget_mib], linewidth=4,
                  color="#b31412" if c.extrapolated else "#188038", solid_capstyle="butt", gid=gid)
        axes.annotate(f"{c.name}: guest {c.guest_budget_mib} MiB, podFixed {c.pod_fixed['memory']}"
                      + (" (extrapolated)" if c.extrapolated else ""),
                      (c.largest_vm_mib, c.guest_budget_mib), textcoords="offset points", xytext=(-4, 6),
                      ha="right", fontsize=8)
    axes.legend(loc="upper left", fontsize=8)
    with matplotlib.rc_context({"svg.hashsalt": "kata-sizing", "svg.fonttype": "none"}):
        figure.savefig(path, metadata={"Date": None} if suffix == ".svg" else None)


def _host_mib(fit, proposal) -> float | None:
    if proposal is not None:
        return float(proposal.host_memory_mib)
    return fit.host_with_margin_mib
