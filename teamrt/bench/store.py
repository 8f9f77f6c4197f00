"""`teamrt bench --store redis://...`: the Redis store beside a raw redis-py floor on one server.

    teamrt bench --store redis://HOST:PORT/DB [--quick] [--json]
    teamrt bench --store redis [--quick]     # a private redis-server the bench starts

With `--store redis` it starts its own redis-server (127.0.0.1, a free port, a temporary
directory, the append-only file on, appendfsync everysec) and stops it at the end; with a URL
it uses that server (a team of its own, deleted afterwards). It measures, in interleaved rounds
(store, then raw, each round), reporting medians over the rounds:

- round trip: a message to an echo process and its answer back, p50 and p99. The store: two
  `Mailboxes` (send, receive, ack); the floor: XADD, and the echo's XREAD BLOCK + XADD back,
  read with XREAD BLOCK. Also shown: the store's own API without the mailboxes above it
  (append, and the readers the watcher fills), to tell the store's share from theirs;
- awaited sends/s: one append awaited at a time (the floor: one XADD at a time);
- batched sends/s: `append_many` of 100 (the floor: a pipeline of 100 XADDs);
- drain/s: a reader over a full inbox from its start (the floor: XRANGE in pages of 1000).
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import redis.asyncio

from teamrt.demos.local_redis import private_redis_server
from teamrt.envelopes import Envelope
from teamrt.errors import MemberBusy, UsageError
from teamrt.mail.locator import redacted
from teamrt.mail.log import encode
from teamrt.mail.mailboxes import Mailboxes
from teamrt.mail.redisstore import RedisStore

PAYLOAD = {"text": "x" * 150, "step": 1}  # about 250 bytes encoded, like a small message


# -- the echo processes --------------------------------------------------------------------------


async def echo_store(url: str) -> None:
    async with Mailboxes(RedisStore(url)) as mail:
        inbox = await mail.open_inbox("pong")
        print("ready", flush=True)
        while True:
            envelope = await inbox.receive()
            inbox.ack_nowait(envelope)
            await mail.send(Envelope.message("pong", "ping", envelope.body))


class _Woken:
    def __init__(self) -> None:
        self.event = anyio.Event()

    def notify(self, name: str) -> None:
        self.event.set()

    async def wait(self) -> None:
        await self.event.wait()
        self.event = anyio.Event()


async def echo_store_api(url: str) -> None:
    """The echo on the store's API: each record of `mirror`'s inbox back to `api`'s."""
    store = RedisStore(url)
    await store.open([])
    woken = _Woken()
    async with anyio.create_task_group() as tg:
        await tg.start(store.watch, woken.notify)
        reader = store.reader("mirror")
        await reader.start()
        reader.read_nowait()
        print("ready", flush=True)
        while True:
            entries = reader.read_nowait()
            if not entries:
                await woken.wait()
            for entry in entries:
                await store.append("api", entry.raw[entry.raw.index(b'"v":') :])


async def rtt_store_api(store: RedisStore, reader: Any, woken: _Woken, n: int) -> list[float]:
    line = encode(Envelope.message("api", "mirror", PAYLOAD))
    times = []
    for _ in range(n):
        start = time.perf_counter()
        await store.append("mirror", line)
        while not reader.read_nowait():
            await woken.wait()
        times.append(time.perf_counter() - start)
    return times


def raw_client(base: str, flavour: str) -> Any:
    """redis-py's asyncio client: with its defaults (a 5 s socket timeout, as any network
    client needs, and as the store has), or without a socket timeout (the bare floor)."""
    if flavour == "default":
        return redis.asyncio.Redis.from_url(base, protocol=2)
    return redis.asyncio.Redis.from_url(base, protocol=2, socket_timeout=None)


async def echo_raw(url: str, stream: str, flavour: str) -> None:
    r = raw_client(url.split("?")[0], flavour)
    last = b"0-0"
    print("ready", flush=True)
    while True:
        reply = await r.xread({f"{stream}:a": last}, block=1000)  # within the socket timeout
        for _, entries in reply or ():
            for entry_id, fields in entries:
                last = entry_id
                await r.xadd(f"{stream}:b", fields)


def start_echo(mode: str, *args: str) -> subprocess.Popen[bytes]:
    child = subprocess.Popen(
        [sys.executable, "-m", "teamrt.bench.store", mode, *args], stdout=subprocess.PIPE
    )
    assert child.stdout is not None
    if child.stdout.readline() != b"ready\n":
        raise UsageError(f"the bench's {mode} echo process did not start")
    return child


# -- the measurements ------------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def rtt_store(mail: Mailboxes, n: int) -> list[float]:
    inbox = await mail.open_inbox("ping")
    times = []
    for i in range(n):
        start = time.perf_counter()
        await mail.send(Envelope.message("ping", "pong", {**PAYLOAD, "step": i}))
        answer = await inbox.receive(timeout=10)
        inbox.ack_nowait(answer)
        times.append(time.perf_counter() - start)
    return times


async def rtt_raw(r: Any, stream: str, n: int, last: list[bytes]) -> list[float]:
    line = encode(Envelope.message("ping", "pong", PAYLOAD))
    times = []
    for _ in range(n):
        start = time.perf_counter()
        await r.xadd(f"{stream}:a", {"d": line})
        reply = None
        while not reply:
            reply = await r.xread({f"{stream}:b": last[0]}, block=1000)
        last[0] = reply[0][1][-1][0]
        times.append(time.perf_counter() - start)
    return times


async def timed(action: Callable[[], Awaitable[object]], count: int) -> float:
    start = time.perf_counter()
    await action()
    return count / (time.perf_counter() - start)


async def measure(args: argparse.Namespace) -> dict[str, list[float]]:
    if args.url:
        return await _measure(args, args.url.split("?")[0])
    with private_redis_server(appendfsync=args.appendfsync, user="--store redis") as base:
        return await _measure(args, base)


async def _measure(args: argparse.Namespace, base: str) -> dict[str, list[float]]:
    team = f"bench{uuid.uuid4().hex[:8]}"
    url = f"{base}?team={team}"
    children = []
    try:
        store = RedisStore(url)
        await store.open(["ping", "pong", "sink", "api", "mirror"])
        children.append(start_echo("store", url))
        children.append(start_echo("api", url))
        flavours = {"raw": "default", "raw, no socket timeout": "none"}
        streams = {name: f"raw:{team}:{flavour}" for name, flavour in flavours.items()}
        for name, flavour in flavours.items():
            children.append(start_echo("raw", url, streams[name], flavour))
        clients: dict[str, Any] = {name: raw_client(base, f) for name, f in flavours.items()}
        raw = clients["raw"]
        lasts = {name: [b"0-0"] for name in flavours}
        line = encode(Envelope.message("ping", "sink", PAYLOAD))
        results: dict[str, list[float]] = {}

        def note(name: str, value: float) -> None:
            results.setdefault(name, []).append(value)

        api = RedisStore(url)
        await api.open([])
        woken = _Woken()
        async with Mailboxes(RedisStore(url)) as mail, anyio.create_task_group() as tg:
            await tg.start(api.watch, woken.notify)
            api_reader = api.reader("api")
            await api_reader.start()
            api_reader.read_nowait()
            await rtt_store(mail, 50)  # warm up every path
            await rtt_store_api(api, api_reader, woken, 50)
            for name in flavours:
                await rtt_raw(clients[name], streams[name], 50, lasts[name])
            for round_ in range(args.rounds):
                times = await rtt_store(mail, args.pings)
                note("rtt p50 store", percentile(times, 0.5) * 1000)
                note("rtt p99 store", percentile(times, 0.99) * 1000)
                times = await rtt_store_api(api, api_reader, woken, args.pings)
                note("rtt p50 (store API) store", percentile(times, 0.5) * 1000)
                note("rtt p99 (store API) store", percentile(times, 0.99) * 1000)
                for name in flavours:
                    times = await rtt_raw(clients[name], streams[name], args.pings, lasts[name])
                    note(f"rtt p50 {name}", percentile(times, 0.5) * 1000)
                    note(f"rtt p99 {name}", percentile(times, 0.99) * 1000)

                n = args.sends

                async def sends_store(n: int = n) -> None:
                    for _ in range(n):
                        await store.append("sink", line)

                async def sends_raw(n: int = n) -> None:
                    for _ in range(n):
                        await raw.xadd(f"raw:{team}:sink", {"d": line})

                note("awaited sends/s store", await timed(sends_store, n))
                note("awaited sends/s raw", await timed(sends_raw, n))

                total, batch = args.batched, 100

                async def batched_store(total: int = total, batch: int = batch) -> None:
                    for _ in range(total // batch):
                        await store.append_many("sink", [line] * batch)

                async def batched_raw(total: int = total, batch: int = batch) -> None:
                    for _ in range(total // batch):
                        pipe = raw.pipeline(transaction=False)
                        for _ in range(batch):
                            pipe.xadd(f"raw:{team}:sink", {"d": line})
                        await pipe.execute()

                note("batched sends/s store", await timed(batched_store, total))
                note("batched sends/s raw", await timed(batched_raw, total))

                drain_name = f"drain{round_}"
                await store.add_member(drain_name)
                for _ in range(total // 1000):
                    await store.append_many(drain_name, [line] * 1000)
                    pipe = raw.pipeline(transaction=False)
                    for _ in range(1000):
                        pipe.xadd(f"raw:{team}:{drain_name}", {"d": line})
                    await pipe.execute()

                async def drain_store(name: str = drain_name, total: int = total) -> None:
                    reader = store.reader(name)
                    await reader.start()
                    got = 0
                    while got < total:
                        got += len(await reader.fetch())
                    reader.close()

                async def drain_raw(name: str = drain_name, total: int = total) -> None:
                    start, got = "-", 0
                    while got < total:
                        page = await raw.xrange(f"raw:{team}:{name}", start, "+", count=1000)
                        got += len(page)
                        start = b"(" + page[-1][0]
                    assert got == total

                note("drain/s store", await timed(drain_store, total))
                note("drain/s raw", await timed(drain_raw, total))
                print(f"teamrt bench --store: round {round_ + 1} of {args.rounds} done",
                      file=sys.stderr, flush=True)  # fmt: skip
            tg.cancel_scope.cancel()
        api_reader.close()
        await api.close()
        await store.close()
        for client in clients.values():
            await client.aclose()
    finally:
        for child in children:
            child.send_signal(signal.SIGTERM)
            child.wait(10)
        if args.url:  # a server of the user's: the bench's own team goes
            await _destroy_when_free(url)
    return results


def report(results: dict[str, list[float]], args: argparse.Namespace) -> list[str]:
    """The table of a run: each figure's median beside the raw floor's, the ratio, the target."""
    fsync = args.appendfsync if not args.url else "as the server has it"
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    lines = [
        f"teamrt bench --store: RedisStore vs raw redis-py (hiredis, RESP2), appendfsync {fsync}",
        f"medians of {args.rounds} interleaved rounds; the floor is redis-py with its defaults;",
        f"{os.cpu_count()} cpus, load average {load}",
        f"{'measure':<32} {'store':>10} {'raw floor':>10} {'ratio':>8}  target",
    ]

    def row(name: str, s: float, r: float, target: str = "", ok: bool | None = None) -> None:
        unit = "ms" if name.startswith("rtt") else "/s"
        shown = f"{s:.3f} {r:>10.3f}" if unit == "ms" else f"{s:,.0f} {r:>10,.0f}"
        verdict = "" if ok is None else ("met" if ok else "MISSED")
        label = f"{name} ({unit})"
        lines.append(f"{label:<32} {shown:>21} {s / r:>7.2f}x  {target} {verdict}")

    def median(key: str) -> float:
        return statistics.median(results[key])

    for q in ("p50", "p99"):
        s, r = median(f"rtt {q} store"), median(f"rtt {q} raw")
        row(f"rtt {q}", s, r, "<= 1.5x" if q == "p50" else "", s <= 1.5 * r if q == "p50" else None)
    for q in ("p50", "p99"):
        row(f"rtt {q}, store API", median(f"rtt {q} (store API) store"), median(f"rtt {q} raw"))
    for q in ("p50", "p99"):
        floor = median(f"rtt {q} raw, no socket timeout")
        row(f"rtt {q}, no-timeout floor", median(f"rtt {q} store"), floor)
    row("awaited sends/s", median("awaited sends/s store"), median("awaited sends/s raw"))
    for name in ("batched sends/s", "drain/s"):
        s, r = median(f"{name} store"), median(f"{name} raw")
        row(name, s, r, ">= 0.8x", s >= 0.8 * r)
    return lines


def as_json(results: dict[str, list[float]], args: argparse.Namespace) -> dict[str, Any]:
    """A run as `--json` prints it: the median of each figure."""
    medians = {name: statistics.median(values) for name, values in results.items()}
    return {"store": "redis", "rounds": args.rounds, "medians": medians}


async def _destroy_when_free(url: str) -> None:
    """Delete the bench's team once the echo processes' leases have expired."""
    with anyio.move_on_after(15):
        while True:
            try:
                await RedisStore(url).destroy()
                return
            except MemberBusy:
                await anyio.sleep(0.5)
    print(f"teamrt bench: the team in {redacted(url)} was left behind (its leases did not expire)")


def measure_store(
    store: str, *, quick: bool = False
) -> tuple[dict[str, list[float]], argparse.Namespace]:
    """`teamrt bench --store STORE`: STORE is `redis` (a private server) or a Redis URL. The
    samples of each figure, and the run's settings (for `report` and `as_json`)."""
    if store != "redis" and not store.startswith(("redis://", "rediss://", "unix://")):
        raise UsageError(
            f"--store {store!r}: give a Redis URL (redis://HOST:PORT/DB), or `redis` for a "
            "private redis-server (the file store is what `teamrt bench` measures by default)"
        )
    args = argparse.Namespace(
        url=None if store == "redis" else store,
        rounds=3 if quick else 5,
        pings=150 if quick else 300,
        sends=1000 if quick else 2000,
        batched=10000 if quick else 20000,
        appendfsync="everysec",
    )
    return anyio.run(measure, args), args


def _echo_main() -> None:
    """A child of the bench: `python -m teamrt.bench.store MODE ARGS...`."""
    mode, *rest = sys.argv[1:]
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    echoes: dict[str, Callable[..., Awaitable[None]]] = {
        "store": echo_store,
        "api": echo_store_api,
        "raw": echo_raw,
    }
    anyio.run(echoes[mode], *rest)


if __name__ == "__main__":
    _echo_main()
