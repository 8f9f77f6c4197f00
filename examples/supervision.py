"""Supervision and budgets: a tool that takes its process down is a crash of one teammate,
which is restarted and resumes its task; a team budget stops every member's next model call.

Run it: python examples/supervision.py
"""

import anyio

from teamrt import (
    Limits,
    MemoryMailboxes,
    RestartPolicy,
    ScriptedModel,
    Team,
    TeamBudget,
    Teammate,
    call,
    tool,
)

crashes_left = 1


@tool
def flaky_export(rows: int) -> str:
    """Export some rows (the first call takes its process down)."""
    global crashes_left
    if crashes_left:
        crashes_left -= 1
        raise SystemExit("the exporter died")
    return f"exported {rows} rows"


async def restarted() -> None:
    worker = Teammate(
        "worker",
        # one script for every incarnation: the second picks up where the first crashed
        ScriptedModel([call("flaky_export", rows=3), call("flaky_export", rows=3), "Done."]),
        tools=[flaky_export],
        restart=RestartPolicy(on_failure=True, backoff=0.05),
    )
    async with MemoryMailboxes() as mail, Team(mail, [worker]) as team:
        result = await team.ask("worker", "Export three rows.", timeout=30)
        print(result.stop_reason, "-", result.answer)  # answer - Done.
        print("restarts:", team.status["worker"].restarts)  # restarts: 1
        print("crash notices:", [n.type for n in team.notices if n.type == "teammate_crashed"])


@tool
def look(where: str) -> str:
    """Look somewhere."""
    return f"nothing at {where}"


async def on_a_budget() -> None:
    # a model that would go on looking for ever; the team's token budget ends it
    searcher = Teammate(
        "searcher",
        ScriptedModel([call("look", where=f"room {i}") for i in range(50)]),
        tools=[look],
        limits=Limits(max_steps=100),
    )
    async with (
        MemoryMailboxes() as mail,
        Team(mail, [searcher], budget=TeamBudget(max_tokens=400)) as team,
    ):
        result = await team.ask("searcher", "Find the keys.", timeout=30)
        print(result.stop_reason, "-", result.detail)  # limit - ... max_tokens=400 ...


async def main() -> None:
    await restarted()
    await on_a_budget()


if __name__ == "__main__":
    anyio.run(main)
