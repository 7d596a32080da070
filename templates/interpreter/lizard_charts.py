"""What a matplotlib figure shows, as data: a second representation of every figure the
kernel displays, under the MIME type ``application/vnd.lizard.chart+json``, beside its PNG.
Clients that build their own interactive charts read the points, bars or wedges instead of
the picture; E2B's code-interpreter add-on receives it as its result's ``chart``.

The shape (field names as E2B's add-on reads them)::

    {"type": "line" | "scatter" | "bar" | "pie" | "superchart" | "unknown",
     "title": str | None, "elements": [...],
     # line, scatter and bar (2-D charts):
     "x_label", "y_label", "x_unit", "y_unit": str | None,
     # line and scatter:
     "x_ticks", "y_ticks": [number | str], "x_tick_labels", "y_tick_labels": [str],
     "x_scale", "y_scale": "linear" | "log" | "datetime" | …}

    line/scatter element: {"label": str, "points": [[x, y], …]}
    bar element:          {"label": str, "group": str, "value": number}
    pie element:          {"label": str, "angle": degrees, "radius": number}
    superchart element:   one chart per axes of a figure with several

Reading a figure never changes it, and a figure this cannot read is ``unknown`` with its
title: the PNG is the result either way. Loaded into the kernel by code_server.py.
"""

from __future__ import annotations

import math
import re
from typing import Any, Dict, List, Optional

MIME = "application/vnd.lizard.chart+json"
#: A unit written at the end of an axis label: "Temperature (°C)", "Time [s]".
UNIT = re.compile(r"[\(\[]([^\(\)\[\]]+)[\)\]]\s*$")


def register(ip: Any) -> None:
    """Add the chart representation to `ip`'s display formatters for matplotlib figures."""
    from IPython.core.formatters import BaseFormatter
    from matplotlib.figure import Figure
    from traitlets import ObjectName, Unicode

    class ChartFormatter(BaseFormatter):  # type: ignore[misc]
        format_type = Unicode(MIME)
        print_method = ObjectName("_repr_lizard_chart_")
        _return_type = dict

    formatter = ChartFormatter(parent=ip.display_formatter)
    ip.display_formatter.formatters[MIME] = formatter
    formatter.for_type(Figure, chart_of_figure)


def number(value: Any) -> Any:
    """A JSON value for an axis value: a float (finite), a date as ISO text, else text."""
    if hasattr(value, "isoformat"):
        return value.isoformat()
    try:
        f = float(value)
    except (TypeError, ValueError):
        return str(value)
    return f if math.isfinite(f) else None


def label_of(artist: Any) -> str:
    """An artist's legend label; matplotlib's own placeholders (`_child0`) are none."""
    label = str(artist.get_label() or "")
    return "" if label.startswith("_") else label


def axis(ax: Any, which: str) -> Dict[str, Any]:
    get = lambda name: getattr(ax, f"get_{which}{name}")()  # noqa: E731
    label = get("label") or None
    unit = UNIT.search(label) if label else None
    scale = get("scale")
    if scale == "linear" and type(getattr(ax, f"{which}axis").get_major_formatter()).__name__.startswith(
        ("AutoDateFormatter", "ConciseDateFormatter", "DateFormatter")
    ):
        scale = "datetime"
    return {
        f"{which}_label": label,
        f"{which}_unit": unit.group(1) if unit else None,
        f"{which}_ticks": [number(t) for t in get("ticks")],
        f"{which}_tick_labels": [t.get_text() for t in get("ticklabels")],
        f"{which}_scale": scale,
    }


def chart_of_axes(ax: Any) -> Dict[str, Any]:
    from matplotlib.collections import PathCollection
    from matplotlib.container import BarContainer
    from matplotlib.patches import Wedge

    title = ax.get_title() or None
    wedges = [p for p in ax.patches if isinstance(p, Wedge)]
    if wedges:
        elements = [
            {"label": label_of(w), "angle": abs(float(w.theta2) - float(w.theta1)), "radius": float(w.r)}
            for w in wedges
        ]
        return {"type": "pie", "title": title, "elements": elements}
    two_d = {**axis(ax, "x"), **axis(ax, "y")}
    bars = [c for c in ax.containers if isinstance(c, BarContainer)]
    if bars:
        ticks = categories(ax)
        elements: List[Dict[str, Any]] = []
        for container in bars:
            group = label_of(container)
            for bar in container.patches:
                x = round(float(bar.get_x() + bar.get_width() / 2), 6)
                elements.append({"label": ticks.get(x, str(number(x))), "group": group, "value": number(bar.get_height())})
        return {"type": "bar", "title": title, "elements": elements, **bare_2d(two_d)}
    lines = [line for line in ax.lines if len(line.get_xydata())]
    scatters = [c for c in ax.collections if isinstance(c, PathCollection)]
    if lines and not scatters:
        points = [{"label": label_of(line), "points": xy(line.get_xdata(), line.get_ydata())} for line in lines]
        return {"type": "line", "title": title, "elements": points, **two_d}
    if scatters and not lines:
        points = [{"label": label_of(c), "points": [[number(x), number(y)] for x, y in c.get_offsets()]} for c in scatters]
        return {"type": "scatter", "title": title, "elements": points, **two_d}
    return {"type": "unknown", "title": title, "elements": []}


def categories(ax: Any) -> Dict[float, str]:
    """The x axis' names by position: its categories (`ax.bar(["a", "b"], …)`), else its
    tick labels as drawn."""
    mapping = getattr(ax.xaxis.get_units(), "_mapping", None)
    if mapping:
        return {round(float(i), 6): str(name) for name, i in mapping.items()}
    return dict(zip((round(float(t), 6) for t in ax.get_xticks()), (t.get_text() for t in ax.get_xticklabels())))


def xy(xs: Any, ys: Any) -> List[List[Any]]:
    return [[number(x), number(y)] for x, y in zip(xs, ys)]


def bare_2d(two_d: Dict[str, Any]) -> Dict[str, Any]:
    """A bar chart's axes: labels and units (its categories are its elements' labels)."""
    return {k: v for k, v in two_d.items() if k.endswith(("_label", "_unit"))}


def chart_of_figure(fig: Any) -> Optional[Dict[str, Any]]:
    axes = [ax for ax in fig.get_axes() if ax.get_visible()]
    if not axes:
        return None
    if len(axes) == 1:
        return chart_of_axes(axes[0])
    title = fig._suptitle.get_text() if getattr(fig, "_suptitle", None) else None
    return {"type": "superchart", "title": title, "elements": [chart_of_axes(ax) for ax in axes]}
