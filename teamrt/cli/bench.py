"""`teamrt bench`: the command's side of the benchmarks in `teamrt.bench`, which measures; this
module gives it the progress line and prints what it measured (a table, or one JSON object)."""

from __future__ import annotations

import json

from teamrt.cli.progress import Progress

__all__ = ["run_bench", "run_store_bench"]


def run_bench(
    *,
    quick: bool,
    as_json: bool,
    directory: str | None,
    smoke: bool = False,
    only: str | None = None,
    quiet: bool = False,
    rounds: int | None = None,
    save: str | None = None,
    compare: str | None = None,
) -> int:
    """`teamrt bench` without `--store`: measure, then print the table or the JSON."""
    # imported here: `teamrt --help` does not load the benchmarks
    from teamrt.bench import measure, stats

    # redrawn twice a second at most, so that drawing does not disturb what is measured
    progress = Progress("teamrt bench", unit="groups", plain=True, quiet=quiet, refresh=2)
    run, figures, meta, compared = measure(
        quick=quick,
        directory=directory,
        progress=progress,
        smoke=smoke,
        only=only,
        rounds=rounds,
        save=save,
        compare=compare,
    )
    if as_json:
        print(json.dumps(run | ({"compare": compared} if compared else {}), indent=2))
    else:
        print("\n".join([*stats.header(meta), *stats.table(figures)]))
        if compared is not None:
            print()
            print("\n".join(stats.comparison_lines(compared, meta)))
    return 0


def run_store_bench(store: str, *, quick: bool = False, as_json: bool = False) -> int:
    """`teamrt bench --store STORE`: measure the Redis store, then print the table or the JSON."""
    # imported here: it needs the redis extra, which only --store does
    from teamrt.bench.store import as_json as store_json
    from teamrt.bench.store import measure_store, report

    results, settings = measure_store(store, quick=quick)
    if as_json:
        print(json.dumps(store_json(results, settings), indent=2))
    else:
        print("\n".join(report(results, settings)))
    return 0
