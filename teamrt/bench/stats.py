"""Rounds, medians and ranges for `teamrt bench`; the machine it ran on; the table it prints; a run
saved as JSON (`--save FILE`) and a run compared with a saved one (`--compare FILE`).

Each figure is measured in several rounds, interleaved with its baseline (figure, baseline,
figure, baseline, ...), so that both see the same machine; what is shown is the median of the
rounds, and the range (min-max) over them says how much the machine moved the figure. A figure
that costs CPU in this process also carries the CPU time per operation (`time.process_time`: user
and system time of every thread of the process), which other tenants of a shared machine inflate
far less than the wall clock: the targets of those figures are judged on it.

Two runs are compared figure by figure; a change is called real (outside the noise) only when the
two runs' ranges do not overlap: every round of one run beat every round of the other. When nothing
changed, that happens by chance with probability 2 / C(n + m, n) for n and m rounds (1 in 10 with
3 and 3, 1 in 126 with 5 and 5), which the comparison prints.

On a shared machine a whole run can be slower than another minutes apart, CPU time included (the
tenants share caches and memory bandwidth), and that the rounds of one run do not show. So a
comparison also shows, where a figure has a baseline, the ratio of the two round by round (they
alternate, so each pair saw the same machine), with its own verdict; and every group starts with a
probe, the CPU time of a fixed pure-Python loop, so that a CPU time is also shown net of the
machine's change. The probe follows the machine only roughly (different work suffers differently),
so a CPU time is called changed only when it is outside the noise both as measured and net.
"""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from teamrt.errors import UsageError
from teamrt.private_files import write_private

SAVED_FORMAT = 1  # the "format" of a saved run: bumped when a saved run can no longer be read


@dataclass
class Figure:
    """One figure: its median over the rounds (`value`), beside its baseline's, with the samples of
    each round, and the CPU time per operation in each round where it is CPU-bound (in us)."""

    name: str
    value: float
    unit: str
    baseline: str = ""
    baseline_value: float | None = None
    target: str = ""
    ok: bool | None = None
    samples: list[float] = field(default_factory=list)
    baseline_samples: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    baseline_cpu: list[float] = field(default_factory=list)
    group: str = ""

    @classmethod
    def of(
        cls,
        name: str,
        samples: Sequence[float],
        unit: str,
        baseline: str = "",
        baseline_samples: Sequence[float] = (),
        *,
        cpu: Sequence[float] = (),
        baseline_cpu: Sequence[float] = (),
        target: str = "",
        check: Callable[[Figure], bool] | None = None,
    ) -> Figure:
        """The figure of these rounds; `check(figure)` says whether it meets its target."""
        figure = cls(
            name,
            statistics.median(samples),
            unit,
            baseline,
            statistics.median(baseline_samples) if baseline_samples else None,
            target,
            None,
            list(samples),
            list(baseline_samples),
            list(cpu),
            list(baseline_cpu),
        )
        if check is not None:
            figure.ok = check(figure)
        return figure

    @property
    def ratio(self) -> float | None:
        if not self.baseline_value:
            return None
        return self.value / self.baseline_value

    @property
    def rounds(self) -> int:
        return len(self.samples) or 1

    @property
    def span(self) -> tuple[float, float] | None:
        """(min, max) over the rounds, or None for a figure measured once."""
        return _span(self.samples)

    @property
    def baseline_span(self) -> tuple[float, float] | None:
        return _span(self.baseline_samples)

    @property
    def ratios(self) -> list[float]:
        """The figure over its baseline in each round (they alternate, so each pair saw the
        same machine): steadier between runs than either figure when the machine drifts."""
        if len(self.samples) != len(self.baseline_samples):
            return []
        return [s / b for s, b in zip(self.samples, self.baseline_samples, strict=True) if b]

    @property
    def cpu_us(self) -> float | None:
        """The median CPU time per operation, in us."""
        return statistics.median(self.cpu) if self.cpu else None

    @property
    def baseline_cpu_us(self) -> float | None:
        return statistics.median(self.baseline_cpu) if self.baseline_cpu else None

    @property
    def cpu_rate(self) -> float:
        """Operations per second of CPU time (the rate on a machine of its own)."""
        cpu = self.cpu_us
        return 1e6 / cpu if cpu else 0.0

    def as_json(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "ratio": self.ratio,
            "rounds": self.rounds,
            "range": self.span,
            "baseline_range": self.baseline_span,
            "cpu_us": self.cpu_us,
            "cpu_range": _span(self.cpu),
            "baseline_cpu_us": self.baseline_cpu_us,
            "baseline_cpu_range": _span(self.baseline_cpu),
        }


def times_baseline(factor: float) -> Callable[[Figure], bool]:
    """A check: the figure is at least `factor` times its baseline."""
    return lambda figure: figure.value >= factor * (figure.baseline_value or 0)


def cpu_at_most(us: float) -> Callable[[Figure], bool]:
    """A check: the figure's CPU time per operation is at most `us`."""
    return lambda figure: figure.cpu_us is not None and figure.cpu_us <= us


def _span(values: Sequence[float]) -> tuple[float, float] | None:
    return (min(values), max(values)) if len(values) > 1 else None


def pct(values: Sequence[float], p: float) -> float:
    """The `p`th percentile of `values` (the nearest rank, no interpolation)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * p / 100))]


@dataclass
class Clock:
    """Wall and CPU time of a `with` block (set when it ends), in seconds."""

    wall: float = 0.0
    cpu: float = 0.0


@contextmanager
def clock() -> Iterator[Clock]:
    """Time the block: its wall clock and this process's CPU time, in seconds."""
    timed = Clock()
    wall, cpu = time.perf_counter(), time.process_time()
    try:
        yield timed
    finally:
        timed.wall = time.perf_counter() - wall
        timed.cpu = time.process_time() - cpu


class Tally:
    """Per-round samples of a group's figures, by key: `rate(...)` records operations per second
    and CPU us per operation, `add(...)` any other value."""

    def __init__(self) -> None:
        self.wall: defaultdict[str, list[float]] = defaultdict(list)
        self.cpu: defaultdict[str, list[float]] = defaultdict(list)

    def rate(self, key: str, count: int, timed: Clock) -> None:
        self.wall[key].append(count / timed.wall)
        self.cpu[key].append(timed.cpu / count * 1e6)

    def add(self, key: str, value: float, cpu_us: float | None = None) -> None:
        self.wall[key].append(value)
        if cpu_us is not None:
            self.cpu[key].append(cpu_us)

    def figure(
        self,
        name: str,
        key: str,
        unit: str,
        baseline: str = "",
        baseline_key: str | None = None,
        *,
        target: str = "",
        check: Callable[[Figure], bool] | None = None,
    ) -> Figure:
        """The figure of `key`'s rounds beside `baseline_key`'s (CPU times where recorded)."""
        return Figure.of(
            name,
            self.wall[key],
            unit,
            baseline,
            self.wall[baseline_key] if baseline_key else (),
            cpu=self.cpu.get(key, []),
            baseline_cpu=self.cpu.get(baseline_key, []) if baseline_key else [],
            target=target,
            check=check,
        )


# --- the machine ---------------------------------------------------------------------------


_PROBE = {"id": "0196c0de", "items": list(range(20)), "text": "hello world", "n": {"a": 1.5}}


def probe(loops: int = 2000) -> float:
    """CPU microseconds per loop of a fixed pure-Python workload (JSON, sorting, joining): how
    fast this machine runs Python right now."""
    start = time.process_time()
    for _ in range(loops):
        data = json.loads(json.dumps(_PROBE))
        "-".join(str(x) for x in sorted(data["items"], reverse=True))
    return (time.process_time() - start) / loops * 1e6


def load_average() -> list[float]:
    """The machine's load average over 1, 5 and 15 minutes (empty where there is none)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:  # pragma: no cover -- not on Linux or macOS
        return []


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:  # pragma: no cover -- not Linux
        pass
    return platform.processor()


def machine() -> dict[str, Any]:
    """What a reader of a saved run needs to know about the machine that made it."""
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover -- macOS
        usable = os.cpu_count() or 0
    return {
        "python": sys.version.split()[0],
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "cpu_model": _cpu_model(),
        "cpus": os.cpu_count(),
        "cpus_usable": usable,
    }


# --- printing --------------------------------------------------------------------------------


def fmt(value: float | None, unit: str) -> str:
    """A value as the table shows it, with its unit."""
    if value is None:
        return ""
    if unit == "/s":
        return f"{value:,.0f}/s"
    if unit == "ms":
        return f"{value:,.2f} ms"
    return f"{value:,.1f} {unit}"


def _short(value: float, unit: str) -> str:
    """A range's end, short: 118k, 1.2M, 34.5, 0.41."""
    if unit == "/s":
        for size, suffix in ((1e6, "M"), (1e3, "k")):
            if value >= size:
                return f"{value / size:.3g}{suffix}"
        return f"{value:.0f}"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def fmt_span(span: tuple[float, float] | None, unit: str) -> str:
    """A range (min-max) as the table shows it."""
    if span is None:
        return ""
    return f"{_short(span[0], unit)}-{_short(span[1], unit)}"


def fmt_cpu(figure: Figure, baseline: bool = False) -> str:
    """The CPU time per operation of a figure (or its baseline), with its range."""
    cpu = figure.baseline_cpu if baseline else figure.cpu
    if not cpu:
        return ""
    span = _span(cpu)
    median = statistics.median(cpu)
    text = f"{median:.2f}" if median < 10 else f"{median:,.1f}"
    return f"{text} us" + (f" ({fmt_span(span, 'us')})" if span else "")


def _table(rows: Sequence[Sequence[str]], right: set[int]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(
            cell.rjust(w) if i in right else cell.ljust(w)
            for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in rows
    ]


def header(meta: dict[str, Any]) -> list[str]:
    """The lines above the table: the machine, the mode and rounds, the load and the probe."""
    start, end = meta.get("load_start") or [], meta.get("load_end") or []
    load = " ".join(f"{x:.2f}" for x in start)
    if end:
        load += " at the start, " + " ".join(f"{x:.2f}" for x in end) + " at the end"
    probes = meta.get("probe_us") or []
    speed = ""
    if probes:
        speed = f"; a fixed Python loop (the probe): {statistics.median(probes):.2f} us of CPU"
        if len(probes) > 1:
            speed += f" ({fmt_span(_span(probes), 'us')})"
    rounds = f"{meta['rounds']} rounds"
    if meta.get("close_rounds", meta["rounds"]) != meta["rounds"]:
        rounds += f" (the round trip {meta['close_rounds']})"
    return [
        f"teamrt bench on {meta['disk']} ({meta['cpus']} cpus, {meta['cpus_usable']} usable, "
        f"Python {meta['python']}, {meta['mode']} sizes, {rounds}, "
        f"{meta['seconds']:.0f} s)",
        f"load average (1, 5, 15 min): {load}{speed}",
        "each figure: the median of its rounds, interleaved with its baseline's; range: min-max "
        "over the rounds;",
        "CPU/op: this process's CPU time (user + system) per operation, on which the targets of "
        "CPU-bound figures are judged",
    ]


def table(figures: Sequence[Figure]) -> list[str]:
    """The table of a run: each figure beside its baseline, the ratio and the target."""
    columns = ("measurement", "median", "range", "CPU/op", "baseline", "median", "range")
    rows = [(*columns, "ratio", "target", "")]
    for f in figures:
        ratio = f"{f.ratio:.2f}x" if f.ratio is not None else ""
        verdict = "" if f.ok is None else ("ok" if f.ok else "MISSED")
        rows.append(
            (
                f.name,
                fmt(f.value, f.unit),
                fmt_span(f.span, f.unit),
                fmt_cpu(f),
                f.baseline,
                fmt(f.baseline_value, f.unit),
                fmt_span(f.baseline_span, f.unit),
                ratio,
                f.target,
                verdict,
            )
        )
    return _table(rows, {1, 3, 5, 7})


# --- saved runs --------------------------------------------------------------------------------


def run_json(meta: dict[str, Any], figures: Sequence[Figure]) -> dict[str, Any]:
    """A run as `--json` prints it and `--save` writes it."""
    return {"format": SAVED_FORMAT, "meta": meta, "figures": [f.as_json() for f in figures]}


def save(path: Path, run: dict[str, Any]) -> None:
    """Write a run to `path` (`--save`), readable by its owner only."""
    write_private(path, json.dumps(run, indent=2) + "\n")


def check_writable(path: str) -> None:
    """Refuse, before a long run, a --save FILE that could not be written."""
    target = Path(path)
    if target.is_dir():
        raise UsageError(f"--save {path} is a directory; give a file for the saved run")
    if not target.parent.is_dir():
        raise UsageError(f"--save {path}: no directory {target.parent}")


def load(path: str) -> dict[str, Any]:
    """A saved run (`--save FILE`), checked enough to compare against."""
    try:
        run = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise UsageError(f"--compare {path}: no such file") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UsageError(f"--compare {path}: not a saved bench run ({exc})") from None
    if not isinstance(run, dict) or run.get("format") != SAVED_FORMAT:
        raise UsageError(
            f"--compare {path}: not a run saved by this teamrt bench (--save FILE writes one)"
        )
    return run


def _saved_figure(data: dict[str, Any]) -> Figure:
    return Figure(
        data["name"],
        data["value"],
        data["unit"],
        baseline_value=data.get("baseline_value"),
        samples=list(data.get("samples") or []),
        baseline_samples=list(data.get("baseline_samples") or []),
        cpu=list(data.get("cpu") or []),
    )


def chance(n: int, m: int) -> float:
    """The probability that n and m rounds of an unchanged figure give ranges that do not
    overlap (any order equally likely)."""
    return 2 / math.comb(n + m, n)


def verdict(now: Sequence[float], saved: Sequence[float], unit: str) -> str:
    """`better`, `WORSE`, or `noise` (the ranges overlap); `1 round` when either has no range."""
    if len(now) < 2 or len(saved) < 2:
        return "1 round"
    higher = min(now) > max(saved)
    lower = max(now) < min(saved)
    if not (higher or lower):
        return "noise"
    up_is_better = unit == "/s"
    return "better" if higher == up_is_better else "WORSE"


def _both(measured: str, net: str) -> str:
    """A change in CPU time is real only when it is, in the same direction, both as measured and
    net of the machine's change."""
    return measured if measured == net else "noise"


def _change(now: float, saved: float) -> str:
    if not saved:
        return ""
    return f"{(now - saved) / saved * 100:+.1f}%"


def comparison(
    figures: Sequence[Figure],
    saved_run: dict[str, Any],
    path: str,
    probes: Sequence[float] = (),
) -> dict[str, Any]:
    """Each figure beside the saved run's, with the change and whether it is outside the noise;
    CPU times also net of the machine's change (the probes of each run)."""
    saved = {d["name"]: _saved_figure(d) for d in saved_run.get("figures", [])}
    saved_probes = saved_run.get("meta", {}).get("probe_us") or []
    speed = 1.0  # how much slower the machine runs Python now (the probes' medians)
    if probes and saved_probes:
        speed = statistics.median(probes) / statistics.median(saved_probes)
    rows: list[dict[str, Any]] = []
    for f in figures:
        old = saved.get(f.name)
        if old is None:
            rows.append({"name": f.name, "unit": f.unit, "now": f.value, "saved": None})
            continue
        row: dict[str, Any] = {
            "name": f.name,
            "unit": f.unit,
            "now": f.value,
            "saved": old.value,
            "change": (f.value - old.value) / old.value if old.value else None,
            "verdict": verdict(f.samples or [f.value], old.samples or [old.value], f.unit),
        }
        if f.ratios and old.ratios:
            row |= {
                "ratio_now": statistics.median(f.ratios),
                "ratio_saved": statistics.median(old.ratios),
                "ratio_verdict": verdict(f.ratios, old.ratios, f.unit),
            }
        if f.cpu and old.cpu:
            now_cpu, old_cpu = f.cpu_us or 0.0, old.cpu_us or 1.0
            row |= {
                "cpu_now": now_cpu,
                "cpu_saved": old_cpu,
                "cpu_change": (now_cpu - old_cpu) / old_cpu,
                "cpu_net_change": now_cpu / old_cpu / speed - 1,
                "cpu_verdict": _both(
                    verdict(f.cpu, old.cpu, "us"),
                    verdict(f.cpu, [c * speed for c in old.cpu], "us"),
                ),
            }
        rows.append(row)
    names = {f.name for f in figures}
    groups = {f.group for f in figures}  # with --only, the others' figures are not missed
    missing = [
        d["name"]
        for d in saved_run.get("figures", [])
        if d["name"] not in names and d.get("group", "") in groups
    ]
    return {
        "file": path,
        "meta": saved_run.get("meta", {}),
        "machine_change": speed - 1 if probes and saved_probes else None,
        "figures": rows,
        "not_run": missing,
    }


def comparison_lines(compared: dict[str, Any], meta_now: dict[str, Any]) -> list[str]:
    """The text of a `comparison`: each figure now beside the saved run's, with its verdicts."""
    meta = compared["meta"]
    rounds = int(meta_now["rounds"])
    old_rounds = int(meta.get("rounds") or 1)
    load = " ".join(f"{x:.2f}" for x in meta.get("load_start") or [])
    lines = [
        f"compared with {compared['file']} (saved {meta.get('started', '?')}: "
        f"{meta.get('mode', '?')} sizes, {old_rounds} rounds, load average {load} at its start)",
        "a change is outside the noise when the two runs' ranges do not overlap (every round "
        "of one beat every round of the other)"
        + (
            f"; with {rounds} and {old_rounds} rounds an unchanged figure does that by "
            f"chance 1 time in {1 / chance(rounds, old_rounds):.0f}"
            if rounds > 1 and old_rounds > 1
            else ""
        ),
    ]
    if compared.get("machine_change") is not None:
        lines.append(
            f"the machine: a fixed Python loop took {compared['machine_change'] * 100:+.1f}% "
            "of the saved run's CPU time; CPU/op is also shown net of that (net), and called "
            "changed only when it is both as measured and net"
        )
    lines.append(
        "ratio: the figure over its baseline, round by round (both saw the same machine), "
        "steadier than either when the machine drifts between runs"
    )
    if meta.get("mode") != meta_now["mode"]:
        lines.append(
            f"the saved run used {meta.get('mode')} sizes, this one {meta_now['mode']}: figures "
            "named after their sizes do not meet"
        )
    heading = ("measurement", "now", "saved", "change", "verdict", "ratio now", "saved", "verdict")
    rows = [(*heading, "CPU/op now", "saved", "change", "net", "verdict")]
    for row in compared["figures"]:
        unit = row["unit"]
        if row["saved"] is None:
            rows.append((row["name"], fmt(row["now"], unit), "not in the saved run", *[""] * 10))
            continue
        ratio: tuple[str, ...] = ("", "", "")
        if "ratio_now" in row:
            ratio = (
                f"{row['ratio_now']:.2f}x",
                f"{row['ratio_saved']:.2f}x",
                row["ratio_verdict"],
            )
        cpu: tuple[str, ...] = ("", "", "", "", "")
        if "cpu_now" in row:
            cpu = (
                f"{row['cpu_now']:.2f} us",
                f"{row['cpu_saved']:.2f} us",
                f"{row['cpu_change'] * 100:+.1f}%",
                f"{row['cpu_net_change'] * 100:+.1f}%",
                row["cpu_verdict"],
            )
        rows.append(
            (
                row["name"],
                fmt(row["now"], unit),
                fmt(row["saved"], unit),
                _change(row["now"], row["saved"]),
                row["verdict"],
                *ratio,
                *cpu,
            )
        )
    lines += _table(rows, {1, 2, 3, 5, 6, 8, 9, 10, 11})
    if compared["not_run"]:
        lines.append(f"in the saved run, not measured now: {', '.join(compared['not_run'])}")
    return lines
