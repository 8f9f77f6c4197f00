"""CPU time per envelope of the line codec: pydantic against teamrt.codec.

    .venv/bin/python benchmarks/codec.py [--rounds 9] [--n 20000]

Encodes and decodes the benchmark's envelopes (`teamrt bench`: a message with a small dict body),
envelopes with a 2 KiB text body, and `idle` messages (a nested body holding nulls). Each round
times every case once, in turn, with `time.process_time`; the figure is the median over rounds,
with the range.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Sequence

from teamrt.bench.harness import sample_envelopes as _envelopes
from teamrt.codec import decode_fields, encode, encode_with_pydantic
from teamrt.envelopes import Envelope
from teamrt.mail.log import decode_line, stamp

_IDLE = {
    "incarnation": "06617a947724d2afb2358096000002",
    "last": {
        "answer": "Done: wrote agent-loop.md (105 words)",
        "stop_reason": "answer",
        "detail": "the model gave its answer",
        "steps": 2,
        "tool_calls": 1,
        "tokens": 0,
        "cost": None,
    },
}


def _per_op(run: Callable[[], None], n: int) -> float:
    start = time.process_time()
    run()
    return (time.process_time() - start) / n * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--n", type=int, default=20_000)
    args = parser.parse_args()
    n: int = args.n

    sets = {
        "bench body": _envelopes(n),
        "2 KiB body": [Envelope.message("lead", "sink", "x" * 2048) for _ in range(n)],
        # a body with nulls in it: the encoder must look for NaN there (see teamrt.codec)
        "idle body": [Envelope.message("worker", "lead", _IDLE, type="idle") for _ in range(n)],
    }
    cases: dict[str, Callable[[], None]] = {}
    for label, envelopes in sets.items():
        lines = [stamp(encode(e), i, b"bench")[:-1] for i, e in enumerate(envelopes)]
        assert all(encode(e) == encode_with_pydantic(e) for e in envelopes)

        # results are dropped as they come, so that the collector's work on a growing list of
        # results is not part of the figure
        def pydantic_encode(envelopes: Sequence[Envelope] = envelopes) -> None:
            for envelope in envelopes:
                encode_with_pydantic(envelope)

        def codec_encode(envelopes: Sequence[Envelope] = envelopes) -> None:
            for envelope in envelopes:
                encode(envelope)

        def line_decode(lines: list[bytes] = lines) -> None:
            for line in lines:
                decode_line(line)

        def fields_decode(lines: list[bytes] = lines) -> None:
            for line in lines:
                decode_fields(line)

        def fields_then_model(lines: list[bytes] = lines) -> None:
            for line in lines:
                fields = decode_fields(line)
                assert not isinstance(fields, str)
                fields.to_envelope()

        cases[f"encode, {label}: pydantic to_json"] = pydantic_encode
        cases[f"encode, {label}: codec (orjson)"] = codec_encode
        cases[f"decode, {label}: decode_line"] = line_decode
        cases[f"decode, {label}: decode_fields"] = fields_decode
        cases[f"decode, {label}: decode_fields + to_envelope"] = fields_then_model

    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(args.rounds):
        for name, run in cases.items():
            times[name].append(_per_op(run, n))
    print(f"CPU time per envelope (us), median of {args.rounds} rounds of {n:,} [min-max]")
    for name, values in times.items():
        median = statistics.median(values)
        print(f"  {name:<52} {median:7.3f}  [{min(values):.3f}-{max(values):.3f}]")


if __name__ == "__main__":
    main()
