"""An eval report as text (for the terminal and CI logs) and as one self-contained HTML page.

The page loads nothing from the network and runs no script: a summary, then one row per case
(failed ones first, open), each with its input, answer, checks and figures. Every text from a
case goes through `html.escape`.
"""

from __future__ import annotations

import html
from typing import TextIO

from teamrt.evals.runner import CaseResult, EvalReport

#: How much of an answer the text report quotes under a failed case.
ANSWER_CHARS = 200


def one_line(text: str) -> str:
    """`text` with its runs of white space (new lines too) as single spaces: a text report
    gives each case's error one line."""
    return " ".join(text.split())


def _cost(cost: float | None) -> str:
    return "cost unknown" if cost is None else f"${cost:.4f}"


def _figures(case: CaseResult) -> str:
    stop = "" if case.stop_reason in (None, "answer") else f"stopped ({case.stop_reason}), "
    return (
        f"{stop}{case.steps} steps, {case.tool_calls} tool calls, {case.tokens} tokens, "
        f"{_cost(case.cost)}, {case.duration:.2f}s"
    )


def headline(report: EvalReport) -> str:
    """One line: how many cases passed, the score, the spend."""
    errors = f" ({report.errors} errors)" if report.errors else ""
    judged = f" (the judge: {report.judge_tokens} tokens)" if report.judge_tokens else ""
    return (
        f"{report.passed}/{len(report.cases)} cases passed, {report.failed} failed{errors}; "
        f"score {report.score:.2f}; {report.tokens} tokens, {_cost(report.cost)}, "
        f"{report.duration:.2f}s{judged}"
    )


def format_text(report: EvalReport) -> str:
    """A line per case (PASS, FAIL or ERROR, its score and figures); under each case that did
    not pass, its failed checks (or its error) and the start of its answer."""
    source = f" of {report.cases_from}" if report.cases_from else ""
    lines = [f"eval{source} on {report.target}"]
    width = max((len(c.id) for c in report.cases), default=4)
    derived = 0
    for case in report.cases:
        lines.append(
            f"  {case.status.upper():5}  {case.id:{width}}  {case.score:4.2f}  {_figures(case)}"
        )
        derived += sum(1 for c in case.checks if c.note and c.note.startswith("derived"))
        if case.passed:
            continue
        if case.error is not None:
            lines.append(f"         error: {one_line(case.error)}")
            continue
        if case.stop_reason not in (None, "answer"):
            lines.append(f"         the run stopped ({case.stop_reason}): {one_line(case.detail)}")
        for check in case.checks:
            if not check.passed:
                lines.append(
                    f"         x {check.check}"
                    + (f": {one_line(check.detail)}" if check.detail else "")
                )
        answer = " ".join((case.answer or "").split())
        if len(answer) > ANSWER_CHARS:
            answer = answer[: ANSWER_CHARS - 3] + "..."
        lines.append(f"         answer: {answer!r}")
    lines.append(headline(report))
    if derived:
        lines.append(
            f"({derived} checks are still as derived from a recorded run: edit them to say what "
            "a right answer must have)"
        )
    return "\n".join(lines)


STYLE = """
body{font:14px system-ui,sans-serif;margin:1em 2em;color:#222;max-width:70em}
h1{font-size:1.4em;margin:.2em 0 .5em}
#cards{display:flex;flex-wrap:wrap;gap:6px;margin-bottom:1em}
.card{border:1px solid #ccd;border-radius:4px;padding:4px 10px;min-width:5.5em;background:#fafaff}
.card b{display:block;font-size:1.3em}
.card.bad{border-color:#c33;background:#fff0f0;color:#900}
details{border:1px solid #dde;border-radius:4px;margin:4px 0;padding:4px 8px}
details.fail,details.error{border-left:5px solid #c0392b;background:#fffafa}
details.pass{border-left:5px solid #27ae60}
summary{cursor:pointer} summary .id{font-weight:bold;margin:0 .5em}
.status{display:inline-block;min-width:3.5em;font-weight:bold}
.pass .status{color:#1e8449} .fail .status,.error .status{color:#b03a2e}
.figures{color:#666;margin-left:.5em}
pre{background:#f7f7f7;padding:.6em;white-space:pre-wrap;max-height:24em;overflow:auto}
ul.checks{list-style:none;padding-left:.5em} ul.checks li{margin:2px 0}
.ok{color:#1e8449} .no{color:#b03a2e} .note{color:#8a6d00;font-style:italic}
"""


def _card(label: str, value: str, bad: bool = False) -> str:
    return f'<div class="card{" bad" if bad else ""}"><b>{html.escape(value)}</b>{label}</div>'


def _case_html(case: CaseResult) -> str:
    e = html.escape
    opened = "" if case.passed else " open"
    checks = []
    for check in case.checks:
        mark = (
            '<span class="ok">&#10003;</span>'
            if check.passed
            else '<span class="no">&#10007;</span>'
        )
        detail = f": {e(check.detail)}" if check.detail else ""
        note = f' <span class="note">({e(check.note)})</span>' if check.note else ""
        checks.append(f"<li>{mark} {e(check.check)}{detail}{note}</li>")
    parts = [
        f'<details class="{case.status}"{opened}><summary>'
        f'<span class="status">{case.status.upper()}</span>'
        f'<span class="id">{e(case.id)}</span>{case.score:.2f}'
        f'<span class="figures">{e(_figures(case))}</span></summary>',
    ]
    if case.member:
        parts.append(f"<p>asked: {e(case.member)}</p>")
    parts.append(f"<h3>Input</h3><pre>{e(case.input)}</pre>")
    if case.error is not None:
        parts.append(f'<p class="no">error: {e(case.error)}</p>')
    else:
        if case.stop_reason not in (None, "answer"):
            parts.append(
                f'<p class="no">the run stopped ({e(case.stop_reason or "")}): {e(case.detail)}</p>'
            )
        parts.append(f"<h3>Answer</h3><pre>{e(case.answer or '')}</pre>")
        parts.append(f'<h3>Checks</h3><ul class="checks">{"".join(checks)}</ul>')
    parts.append("</details>")
    return "\n".join(parts)


def write_html(report: EvalReport, out: TextIO) -> None:
    """The report as one self-contained page (no script, nothing loaded from the network)."""
    e = html.escape
    title = f"teamrt eval: {report.target}"
    out.write(
        '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{e(title)}</title>\n"
        '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; '
        "style-src 'unsafe-inline'\">\n"
        f"<style>{STYLE}</style></head><body>\n<h1>{e(title)}</h1>\n"
    )
    source = f"cases: {e(report.cases_from)}; " if report.cases_from else ""
    out.write(f"<p>{source}started {e(report.started)}, took {report.duration:.2f}s</p>\n")
    out.write(
        '<div id="cards">'
        + _card("cases", str(len(report.cases)))
        + _card("passed", str(report.passed))
        + _card("failed", str(report.failed), bad=report.failed > 0)
        + _card("errors", str(report.errors), bad=report.errors > 0)
        + _card("score", f"{report.score:.2f}")
        + _card("tokens", str(report.tokens))
        + _card("cost", _cost(report.cost))
        + "</div>\n"
    )
    failing = [c for c in report.cases if not c.passed]
    passing = [c for c in report.cases if c.passed]
    for case in [*failing, *passing]:
        out.write(_case_html(case) + "\n")
    out.write("</body></html>\n")
