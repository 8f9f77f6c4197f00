"""Redis and many machines: a lead here and a writer in another process share only a Redis
server. On two machines it is the same: the same URL, and `teamrt run-agent` on the other one.

Needs redis-py (pip install 'teamrt[redis]') and a Redis 7 server; the URL comes from
TEAMRT_STORE (default: redis://127.0.0.1:6379/0?team=example).
Run it: python examples/redis_team.py
"""

import os
import sys
from pathlib import Path

import anyio

from teamrt import ModelReply, ScriptedModel, Team, Teammate, call, open_mailboxes, tool

STORE = os.environ.get("TEAMRT_STORE", "redis://127.0.0.1:6379/0?team=example")


@tool
def write_file(name: str, content: str) -> str:
    """Write a file into out/ (on the writer's machine)."""
    path = Path("out") / Path(name).name
    path.parent.mkdir(exist_ok=True)
    path.write_text(content)
    return f"wrote {path}"


def writer() -> Teammate:
    """The writer, as `teamrt run-agent --spec redis_team:writer` builds it."""
    script: list[ModelReply | str] = [
        call("write_file", name="hello.md", content="# Hello\n"),
        "Wrote out/hello.md.",
    ]
    return Teammate("writer", ScriptedModel(script), tools=[write_file])


async def main() -> None:
    async with open_mailboxes(STORE, members=["lead", "writer"]) as mail:
        # the writer's process: on another machine, this same command with the same URL
        here = str(Path(__file__).parent)
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([here, os.environ.get("PYTHONPATH", "")]),
        }
        command = [sys.executable, "-m", "teamrt", "run-agent", STORE, "--name", "writer"]
        async with await anyio.open_process(
            [*command, "--spec", "redis_team:writer"], env=env, stdout=None, stderr=None
        ) as process:
            # remote: the writer is asked like any member and shut down with the team
            async with Team(mail, [], remote=["writer"]) as team:
                result = await team.ask("writer", "Write hello.md.", timeout=60)
                print(result.answer)  # Wrote out/hello.md.
            await process.wait()
    print("the writer's process exited with", process.returncode)


if __name__ == "__main__":
    anyio.run(main)
