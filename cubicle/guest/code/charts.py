"""What a matplotlib figure shows, as data: its kind, title, axes and series.

A Python context (`shell.py`) loads this file by path and registers `figure_chart` as the
formatter of matplotlib figures, so every figure a run shows (`plt.show()`, a figure left
open) comes back with a `chart` beside its PNG, in the shape E2B's code interpreter gives
(`e2b_code_interpreter.charts`): `line`, `scatter`, `bar` and `pie` for one axes, a
`superchart` of those for several, `unknown` for an axes drawn some other way. It reads
the artists matplotlib made (lines, bar containers, scatter collections, wedges), never
the picture; matplotlib is imported only when a figure is formatted. Standard library only
at import: the desktop's Python runs it, not the guest's.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any

MIME = "application/vnd.cubicle.chart+json"
"""The display format a chart travels under inside the context's result."""
DATA_MIME = "application/vnd.cubicle.data+json"
"""A DataFrame's columns as lists (E2B's `data`)."""
MAX_POINTS = 10_000
"""Points kept per series (a line of a million points is a picture, not data)."""
MAX_DATA_CELLS = 20_000
"""A DataFrame larger than this gives no `data` (its HTML and text still come back)."""


def figure_chart(figure: Any) -> dict[str, Any] | None:
    """The chart of a matplotlib `Figure`, or None when it has no axes with data."""
    charts = [chart for chart in map(_axes_chart, _plotted_axes(figure)) if chart is not None]
    if not charts:
        return None
    if len(charts) == 1:
        return charts[0]
    suptitle = getattr(figure, "_suptitle", None)
    return {
        "type": "superchart",
        "title": (suptitle.get_text() if suptitle is not None else None) or None,
        "elements": charts,
    }


def dataframe_data(frame: Any) -> dict[str, list[Any]] | None:
    """A DataFrame's columns as lists of plain values; None past `MAX_DATA_CELLS`."""
    if frame.size > MAX_DATA_CELLS:
        return None
    columns = frame.to_dict(orient="list")
    return {str(name): [_plain(value) for value in values] for name, values in columns.items()}


def _plotted_axes(figure: Any) -> list[Any]:
    """The figure's axes that hold data (not colorbars, not hidden twins)."""
    found = []
    for axes in figure.axes:
        if not axes.get_visible() or getattr(axes, "_colorbar", None) is not None:
            continue
        if axes.get_label() == "<colorbar>":
            continue
        found.append(axes)
    return found


def _axes_chart(axes: Any) -> dict[str, Any] | None:
    from matplotlib.collections import PathCollection
    from matplotlib.container import BarContainer
    from matplotlib.patches import Wedge

    wedges = [p for p in axes.patches if isinstance(p, Wedge)]
    if wedges:
        return _pie(axes, wedges)
    bars = [c for c in axes.containers if isinstance(c, BarContainer)]
    if bars:
        return _bars(axes, bars)
    points = [c for c in axes.collections if isinstance(c, PathCollection)]
    lines = [line for line in axes.get_lines() if line.get_visible()]
    if points and not lines:
        return _points(axes, "scatter", [_scatter_series(axes, c) for c in points])
    if lines:
        return _points(axes, "line", [_line_series(axes, line) for line in lines])
    if axes.has_data():
        return {**_titles(axes), "type": "unknown", "elements": []}
    return None


def _titles(axes: Any) -> dict[str, Any]:
    return {
        "title": axes.get_title() or None,
        "x_label": axes.get_xlabel() or None,
        "y_label": axes.get_ylabel() or None,
        "x_unit": None,
        "y_unit": None,
    }


def _label(artist: Any) -> str:
    """The legend label it was given ('' for matplotlib's own `_child0`-style names)."""
    label = str(artist.get_label() or "")
    return "" if label.startswith("_") else label


def _plain(value: Any) -> Any:
    """A JSON-ready value: numpy scalars as Python ones, NaN as None, dates as ISO text."""
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        with contextlib.suppress(ValueError, TypeError):
            value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if hasattr(value, "isoformat"):
        return value.isoformat()
    return str(value)


class _Axis:
    """How one axis shows its values: scale, ticks and their labels, and what a value
    on it means (a category's name, a date)."""

    def __init__(self, axis: Any, scale: str) -> None:
        from matplotlib import dates
        from matplotlib.category import StrCategoryConverter

        converter = axis.get_converter() if hasattr(axis, "get_converter") else axis.converter
        date_converters = tuple(
            kind
            for kind in (
                getattr(dates, n, None) for n in ("DateConverter", "_SwitchableDateConverter")
            )
            if isinstance(kind, type)
        )
        self.categories: dict[float, str] = {}
        self.dates = isinstance(converter, date_converters)
        if isinstance(converter, StrCategoryConverter) and axis.units is not None:
            self.categories = {float(v): str(k) for k, v in axis.units._mapping.items()}
            self.scale = "categorical"
        else:
            self.scale = "datetime" if self.dates else scale
        ticks = list(axis.get_majorticklocs())
        labels = axis.get_major_formatter().format_ticks(ticks) if ticks else []
        self.ticks = [self.value(t) for t in ticks]
        self.tick_labels = [str(label) for label in labels]

    def value(self, raw: Any) -> Any:
        plain = _plain(raw)
        if isinstance(plain, (int, float)) and not isinstance(plain, bool):
            if self.categories:
                return self.categories.get(float(plain), plain)
            if self.dates:
                from matplotlib.dates import num2date

                return num2date(plain).isoformat()
        return plain


def _points(axes: Any, kind: str, series: list[tuple[str, list[tuple[Any, Any]]]]) -> dict:
    x = _Axis(axes.xaxis, axes.get_xscale())
    y = _Axis(axes.yaxis, axes.get_yscale())
    elements = [
        {"label": label, "points": [[x.value(a), y.value(b)] for a, b in points]}
        for label, points in series
    ]
    return {
        **_titles(axes),
        "type": kind,
        "x_ticks": x.ticks,
        "x_tick_labels": x.tick_labels,
        "x_scale": x.scale,
        "y_ticks": y.ticks,
        "y_tick_labels": y.tick_labels,
        "y_scale": y.scale,
        "elements": elements,
    }


def _line_series(axes: Any, line: Any) -> tuple[str, list[tuple[Any, Any]]]:
    xs, ys = line.get_xdata(orig=True), line.get_ydata(orig=True)
    return _label(line), list(zip(list(xs)[:MAX_POINTS], list(ys)[:MAX_POINTS], strict=False))


def _scatter_series(axes: Any, collection: Any) -> tuple[str, list[tuple[Any, Any]]]:
    offsets = collection.get_offsets()[:MAX_POINTS]
    return _label(collection), [(row[0], row[1]) for row in offsets]


def _bars(axes: Any, containers: list[Any]) -> dict[str, Any]:
    """One element per bar: its category (the tick under it), its group (its series'
    label) and its value (height, or width for horizontal bars)."""
    horizontal = getattr(containers[0], "orientation", "vertical") == "horizontal"
    axis = _Axis(axes.yaxis if horizontal else axes.xaxis, "linear")
    ticks = dict(zip(axis.ticks, axis.tick_labels, strict=False))
    elements = []
    for index, container in enumerate(containers):
        group = _label(container) or str(index)
        for bar in list(container)[:MAX_POINTS]:
            if horizontal:
                where, value = bar.get_y() + bar.get_height() / 2, bar.get_width()
            else:
                where, value = bar.get_x() + bar.get_width() / 2, bar.get_height()
            label = _nearest_tick(where, axis, ticks)
            elements.append({"label": label, "group": group, "value": _plain(value)})
    titles = _titles(axes)
    if horizontal:  # the categories run up the y axis: the labels follow them
        titles["x_label"], titles["y_label"] = titles["y_label"], titles["x_label"]
    return {**titles, "type": "bar", "elements": elements}


def _nearest_tick(where: float, axis: _Axis, ticks: dict[Any, str]) -> str:
    """The name of the category at `where` (a bar's centre), else its tick label."""
    if axis.categories:
        nearest = min(axis.categories, key=lambda v: abs(v - where))
        return axis.categories[nearest]
    numeric = [t for t in ticks if isinstance(t, (int, float))]
    if numeric:
        nearest = min(numeric, key=lambda v: abs(v - where))
        if abs(nearest - where) < 1e-6 * max(1.0, abs(where)) and ticks[nearest]:
            return ticks[nearest]
    return f"{where:g}"


def _pie(axes: Any, wedges: list[Any]) -> dict[str, Any]:
    labels = {id(w): _label(w) for w in wedges}
    texts = [t.get_text() for t in axes.texts]
    elements = []
    for index, wedge in enumerate(wedges):
        label = labels[id(wedge)] or (texts[index] if index < len(texts) else str(index))
        elements.append(
            {
                "label": label,
                "angle": round(float(wedge.theta2 - wedge.theta1), 4),  # float32 inside
                "radius": _plain(wedge.r),
            }
        )
    return {"title": axes.get_title() or None, "type": "pie", "elements": elements}
