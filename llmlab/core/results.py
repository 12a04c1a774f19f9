"""LabResult and Claim: what a lab returns, its JSON form, and atomic saving under results/.

A result file is `results/<lab>/<UTC stamp>-<device slug>.json`, with one CSV per table beside
it (`<stem>.<table>.csv`). Every file is written to a temporary name in the same folder and
renamed into place (os.replace is atomic on POSIX), so a crash never leaves half a file.
"""

from __future__ import annotations

import io
import json
import math
import os
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, is_dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pandas as pd

from llmlab.core.errors import UsageError

SCHEMA_VERSION = 2  # bump when the JSON layout changes (2: claim ids, judge_version, skipped; charts live in views)


@dataclass
class Claim:
    """One statement the measurement supports or refutes, computed by a lab's pure `judge()`.

    `id` is stable ("roofline.decode_b1_compute_share"): the README, the lab sheets and the tests
    cite it. `holds` is True (holds), False (does not hold) or None (not measured: `note` says why).
    """

    id: str
    text: str
    expected: str
    measured: str
    holds: bool | None
    note: str = ""

    def __post_init__(self):
        if self.holds is not None:
            self.holds = bool(self.holds)  # numpy bools become plain ones (JSON, `is True` in tests)

    @property
    def verdict(self) -> str:
        return {True: "holds", False: "does not hold", None: "not measured"}[self.holds]


def find(claims: list[Claim], claim_id: str) -> Claim:
    """The claim with this id (KeyError naming the ids there are)."""
    for c in claims:
        if c.id == claim_id:
            return c
    raise KeyError(f"no claim {claim_id!r}; there are: {', '.join(c.id for c in claims)}")


def empty_table(df: pd.DataFrame | None) -> bool:
    """A table that was not measured (None) or has no rows: judges give no verdict from it."""
    return df is None or len(df) == 0


@dataclass(frozen=True)
class Col:
    """One column of a view: the table's column `key` under a human `header` with its unit.

    fmt: "" 4 significant digits | "x" a ratio ("1.23x") | "%" a fraction as percent ("93.1%")
    | "int" thousands separators | "text" | any Python format spec (".2f", ".1e").
    `width` cuts a long text cell to that many characters (0: no limit).
    """

    key: str
    header: str
    fmt: str = ""
    width: int = 0


@dataclass(frozen=True)
class Chart:
    """A chart, declared as data: the renderer draws it from `table` with plotext.

    kind: "line" | "scatter" | "bar" | "stacked". `y` is one column or several (one series
    each; for "stacked" the stacked parts). `series` splits rows into one line per value.
    """

    title: str
    table: str
    x: str
    y: str | list[str]
    kind: str = "line"
    series: str | None = None
    logx: bool = False
    logy: bool = False
    xlabel: str = ""
    ylabel: str = ""


@dataclass(frozen=True)
class View:
    """One part of a lab's report: what it asks, a compact table a person reads, maybe a chart.

    `rows` picks, filters or sorts the rows shown (the CSV keeps them all); at most `max_rows`.
    """

    title: str
    question: str
    table: str
    cols: tuple[Col, ...]
    rows: Callable[[pd.DataFrame], pd.DataFrame] | None = None
    chart: Chart | None = None
    max_rows: int = 12


@dataclass
class LabResult:
    lab: str
    version: int  # the lab's measurement-method version: bump it when the way of measuring changes
    config: dict[str, Any] = field(default_factory=dict)
    env: dict[str, Any] = field(default_factory=dict)
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    claims: list[Claim] = field(default_factory=list)  # filled by the lab's judge(), never by run()
    notes: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)  # table name -> why it was not measured ("no GPU")
    judge_version: int = 0  # the judge() that made `claims`
    interrupted: bool = False

    @classmethod
    def new(cls, lab: str, version: int, cfg: Any) -> LabResult:
        config = asdict(cfg) if is_dataclass(cfg) else dict(cfg)
        return cls(lab=lab, version=version, config=config)

    # -- building
    def add_table(self, name: str, rows: list[dict] | pd.DataFrame) -> pd.DataFrame:
        df = rows if isinstance(rows, pd.DataFrame) else pd.DataFrame(rows)
        self.tables[name] = df
        return df

    def note(self, text: str) -> None:
        self.notes.append(text)

    def skip(self, table: str, reason: str) -> None:
        """Record that a part was not measured, and why (the report says so where its view stands)."""
        self.skipped[table] = reason

    @contextmanager
    def guard(self) -> Iterator[LabResult]:
        """Wrap a lab's body: Ctrl-C marks the result interrupted and keeps what was measured."""
        try:
            yield self
        except KeyboardInterrupt:
            self.interrupted = True
            self.notes.append("interrupted (Ctrl-C): the tables hold what was measured before it")

    # -- JSON
    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "lab": self.lab,
            "version": self.version,
            "judge_version": self.judge_version,
            "interrupted": self.interrupted,
            "env": self.env,
            "config": self.config,
            "claims": [asdict(c) | {"verdict": c.verdict} for c in self.claims],
            "notes": self.notes,
            "skipped": self.skipped,
            "tables": {name: _table_to_json(df) for name, df in self.tables.items()},
        }

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(_clean(self.to_dict()), indent=indent, allow_nan=False)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LabResult:
        if d.get("schema_version") != SCHEMA_VERSION:
            raise ValueError(f"result schema {d.get('schema_version')} is not {SCHEMA_VERSION}")
        return cls(
            lab=d["lab"],
            version=d["version"],
            config=d.get("config", {}),
            env=d.get("env", {}),
            tables={name: _table_from_json(t) for name, t in d.get("tables", {}).items()},
            claims=[Claim(**{k: v for k, v in c.items() if k != "verdict"}) for c in d.get("claims", [])],
            notes=list(d.get("notes", [])),
            skipped=dict(d.get("skipped", {})),
            judge_version=int(d.get("judge_version", 0)),
            interrupted=bool(d.get("interrupted", False)),
        )

    @classmethod
    def from_json(cls, text: str) -> LabResult:
        return cls.from_dict(json.loads(text))

    # -- saving
    def save(self, out_dir: Path | str, device_slug: str) -> Path:
        """Write JSON + one CSV per table under out_dir/<lab>/, atomically. Returns the JSON path."""
        folder = Path(out_dir) / self.lab
        folder.mkdir(parents=True, exist_ok=True)
        stamp = self.env.get("utc_stamp") or utc_stamp()
        stem = f"{stamp}-{device_slug}"
        for name, df in self.tables.items():
            buf = io.StringIO()
            df.to_csv(buf, index=False)
            atomic_write(folder / f"{stem}.{name}.csv", buf.getvalue())
        path = folder / f"{stem}.json"
        atomic_write(path, self.to_json() + "\n")
        return path


def utc_stamp() -> str:
    return datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")


def atomic_write(path: Path, text: str) -> None:
    """Write to a temp file in the same folder, fsync, then rename over `path`."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def check_writable(out_dir: Path) -> None:
    """Raise UsageError before any measurement if results could not be saved in out_dir (creating it if its
    parent exists)."""
    if str(out_dir).strip() == "":
        raise UsageError("--out is empty: name a folder for the results (default results/)")
    out_dir = Path(out_dir)
    if not out_dir.exists():
        if not out_dir.parent.exists():
            raise UsageError(f"--out {out_dir}: the parent folder {out_dir.parent} does not exist")
        try:
            out_dir.mkdir()
        except OSError as exc:
            raise UsageError(f"--out {out_dir}: cannot create it ({exc.strerror})") from None
    if not out_dir.is_dir():
        raise UsageError(f"--out {out_dir}: not a folder")
    try:
        fd, tmp = tempfile.mkstemp(dir=out_dir, prefix=".llmlab-write-test.")
        os.close(fd)
        os.unlink(tmp)
    except OSError as exc:
        raise UsageError(f"--out {out_dir}: not writable ({exc.strerror})") from None


def command_line() -> str:
    import shlex

    argv = [Path(sys.argv[0]).name if sys.argv else "llmlab", *sys.argv[1:]]
    return " ".join(shlex.quote(a) for a in argv)


# -- JSON helpers: tables as column lists, NaN/inf as null (strict JSON)


def _table_to_json(df: pd.DataFrame) -> dict[str, Any]:
    return {"columns": [str(c) for c in df.columns], "rows": df.astype(object).values.tolist()}


def _table_from_json(t: dict[str, Any]) -> pd.DataFrame:
    return pd.DataFrame(t["rows"], columns=t["columns"])


def _clean(o: Any) -> Any:
    if isinstance(o, dict):
        return {str(k): _clean(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_clean(v) for v in o]
    if isinstance(o, float):
        return o if math.isfinite(o) else None
    if hasattr(o, "item") and callable(o.item):  # numpy / torch scalars
        try:
            return _clean(o.item())
        except (ValueError, TypeError):
            return str(o)
    if isinstance(o, Path):
        return str(o)
    if o is None or isinstance(o, (str, int, bool)):
        return o
    if o is pd.NA or o is pd.NaT:
        return None
    return str(o)
