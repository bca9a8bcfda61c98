"""One part of the bench: a table (rows of named values), notes, and what to plot.

Example::

    >>> s = Section("demo", "Demo", ["n", "ms"], [{"n": 1, "ms": 0.5}])
    >>> print(s.markdown())
    ### Demo
    <BLANKLINE>
    | n | ms |
    |---:|---:|
    | 1 | 0.500 |
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class Plot:
    """A line (or bar) chart: ``x`` column against ``ys`` columns, one series per ``group`` value."""

    x: str
    ys: list[str]
    ylabel: str
    group: str | None = None
    kind: str = "line"
    logx: bool = False


@dataclass
class Section:
    name: str
    title: str
    columns: list[str]
    rows: list[dict[str, Any]]
    notes: list[str] = field(default_factory=list)
    plot: Plot | None = None

    def markdown(self) -> str:
        align = "|" + "|".join("---" if isinstance(self.rows[0].get(c) if self.rows else 0, str) else "---:"
                               for c in self.columns) + "|"
        lines = [f"### {self.title}", "", "| " + " | ".join(self.columns) + " |", align]
        lines += ["| " + " | ".join(_cell(row.get(c)) for c in self.columns) + " |" for row in self.rows]
        if self.notes:
            lines += [""] + self.notes
        return "\n".join(lines)

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.pop("plot")
        return out


def _cell(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) < 1000 else f"{value:.0f}"
    return "" if value is None else str(value)
