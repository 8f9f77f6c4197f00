"""Typed answers: `Agent(output_type=...)` and `Teammate(output_type=...)`, through the final-answer
tool and through structured output (offline models and the real `openai` client over HTTP), one
correction, a clean stop, `team.ask(..., output_type=...)`, resume from the journal, rerun."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, assert_type

import anyio
import pytest
from pydantic import BaseModel, Field
from typing_extensions import TypedDict  # typing.TypedDict needs Python 3.12 for pydantic

from teamrt import Envelope, FileMailboxes, MemoryMailboxes
from teamrt.agents import Agent, Limits, RunReport, tool
from teamrt.agents.loop import REJECTED
from teamrt.agents.output import FINAL_TOOL, OutputType
from teamrt.cli.main import main
from teamrt.errors import InvalidOutput, OutputError, ToolCrashed, UsageError
from teamrt.models import (
    ChatMessage,
    FunctionModel,
    ModelReply,
    OpenAIModel,
    ScriptedModel,
    TextDelta,
    ToolSpec,
    allow_model_requests,
    call,
    calls,
)
from teamrt.rerun import rerun
from teamrt.team import RESULT, RestartPolicy, TaskResult, Team, Teammate
from teamrt.team.team import typed_answer
from tests.support.fake_openai import FakeOpenAI, chat_chunks, chat_reply, responses_reply
from tests.support.paths import ROOT
from tests.support.remote import exit_code, run_agent, until_running
from tests.support.typed_specs import Invoice, lookup, typed_clerk, typed_clerk_structured

EXAMPLE = ROOT / "examples" / "typed_answers.py"


@dataclass
class Point:
    x: int
    y: int


class Person(TypedDict):
    name: str
    age: int


class Large(BaseModel):
    customer: str
    total: int = Field(gt=100)


def final(**arguments: Any) -> ModelReply:
    return call(FINAL_TOOL, arguments)


def structured(script: Sequence[ModelReply | str]) -> ScriptedModel:
    return ScriptedModel(script, structured_output=True)


def tool_model(script: Sequence[ModelReply | str]) -> ScriptedModel:
    return ScriptedModel(script)


# the same conversation through either mechanism: a good answer, then a wrong one
MECHANISMS: dict[str, tuple[Callable[[Sequence[ModelReply | str]], ScriptedModel], Any, Any]] = {
    "tool": (
        tool_model,
        final(customer="ACME", total=12),
        final(customer="ACME", total=-3),
    ),
    "structured": (
        structured,
        '{"customer": "ACME", "total": 12}',
        '{"customer": "ACME", "total": -3}',
    ),
}


# --- one agent ----------------------------------------------------------------------------------


async def test_a_typed_answer_through_the_final_answer_tool() -> None:
    offered: list[list[ToolSpec]] = []

    def brain(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ModelReply:
        offered.append(list(tools))
        if messages[-1].role == "user":
            return call("lookup", customer="ACME")
        return final(customer="ACME", total=12)

    agent = Agent("clerk", FunctionModel(brain), tools=[lookup], output_type=Invoice)
    report = await agent.run("Bill ACME.")
    assert report.ok and report.output == Invoice(customer="ACME", total=12)
    assert_type(report.output, Any)
    assert report.output_name == "Invoice"
    assert json.loads(report.answer or "") == {"customer": "ACME", "total": 12, "note": None}
    assert (report.steps, report.tool_calls) == (2, 1)  # the final answer is not a tool call
    names = [[t.name for t in tools] for tools in offered]
    assert names == [["lookup", FINAL_TOOL]] * 2
    spec = offered[0][1]
    assert spec.parameters == Invoice.model_json_schema()
    assert "An invoice for one customer." in spec.description
    # the conversation stays well formed for the next task: the final call has its result
    assert agent.state is not None
    last = agent.state.messages[-1]
    assert last.role == "tool" and json.loads(last.content or "") == {"ok": "answer accepted"}


async def test_a_typed_answer_through_structured_output() -> None:
    model = structured([call("lookup", customer="ACME"), '{"customer": "ACME", "total": 12}'])
    report = await Agent("clerk", model, tools=[lookup], output_type=Invoice).run("Bill ACME.")
    assert report.ok and report.output == Invoice(customer="ACME", total=12)
    model.assert_done()
    assert [o.name if o else None for o in model.outputs] == ["Invoice", "Invoice"]
    assert model.outputs[0] is not None
    assert model.outputs[0].json_schema == Invoice.model_json_schema()


@pytest.mark.parametrize("mechanism", MECHANISMS)
async def test_a_wrong_answer_is_corrected_after_one_retry(mechanism: str) -> None:
    make, good, wrong = MECHANISMS[mechanism]
    model = make([wrong, good])
    report = await Agent("clerk", model, output_type=Invoice).run("Bill ACME.")
    assert report.ok and report.output == Invoice(customer="ACME", total=12)
    assert report.steps == 2
    feedback = model.calls[1][-1]  # what the model read before its second answer
    if mechanism == "tool":
        assert feedback.role == "tool" and feedback.name == FINAL_TOOL
        error = json.loads(feedback.content or "")["error"]
        assert error.startswith("ValidationError: total: Input should be greater than or equal")
    else:
        assert feedback.role == "user"
        assert feedback.content == REJECTED.format(
            name="Invoice", errors="total: Input should be greater than or equal to 0"
        )


@pytest.mark.parametrize("mechanism", MECHANISMS)
async def test_a_second_wrong_answer_stops_cleanly(mechanism: str) -> None:
    make, _, wrong = MECHANISMS[mechanism]
    model = make([wrong, wrong])
    agent = Agent("clerk", model, output_type=Invoice)
    report = await agent.run("Bill ACME.")  # no exception: a stop with a report
    model.assert_done()
    assert report.stop.reason == "invalid_output" and not report.ok
    assert report.stop.detail == (
        "the answer did not match Invoice again after one correction: total: Input should be "
        "greater than or equal to 0"
    )
    assert report.output is None and report.answer is None
    assert json.loads(report.partial or "") == {"customer": "ACME", "total": -3}
    assert "invalid_output" in report.summary()


async def test_any_type_a_type_adapter_takes() -> None:
    numbers = await Agent("a", structured(["[1, 2, 3]"]), output_type=list[int]).run("count")
    assert numbers.output == [1, 2, 3] and numbers.output_name == "list_int"
    # providers want an object at the root: a list is wrapped, and the wrapper taken off again
    wrapped = tool_model([final(value=[4, 5])])
    assert (await Agent("a", wrapped, output_type=list[int]).run("count")).output == [4, 5]
    spec = OutputType(list[int]).spec
    assert spec.json_schema["properties"]["value"] == {
        "items": {"type": "integer"},
        "type": "array",
    }
    point = await Agent("a", tool_model([final(x=1, y=2)]), output_type=Point).run("where")
    assert point.output == Point(1, 2)
    person = await Agent("a", structured(['{"name": "Ada", "age": 36}']), output_type=Person).run(
        "who"
    )
    assert person.output == {"name": "Ada", "age": 36} and person.output_name == "Person"
    # shared definitions stay at the root of a wrapped schema, where the $refs point
    invoices = OutputType(list[Invoice]).schema
    assert invoices["properties"]["value"]["items"] == {"$ref": "#/$defs/Invoice"}
    assert "Invoice" in invoices["$defs"]


async def test_a_json_answer_in_a_code_fence_is_taken_out_of_it() -> None:
    model = structured(
        [
            'Here:\n```json\n{"customer": "ACME", "total": 1}\n```',
            '```json\n{"customer": "ACME", "total": 1}\n```',
        ]
    )
    report = await Agent("a", model, output_type=Invoice).run("bill")
    assert report.output == Invoice(customer="ACME", total=1) and report.steps == 2


async def test_calls_beside_a_final_answer_are_not_run() -> None:
    ran: list[str] = []

    @tool
    def side_effect(what: str) -> str:
        """Do something."""
        ran.append(what)
        return "done"

    model = tool_model(
        [
            calls(call("side_effect", what="a"), final(customer="ACME", total=-1)),
            calls(final(customer="ACME", total=1), call("side_effect", what="b")),
        ]
    )
    agent = Agent("a", model, tools=[side_effect], output_type=Invoice)
    report = await agent.run("bill")
    assert report.output == Invoice(customer="ACME", total=1) and ran == []
    results = [json.loads(m.content or "") for m in model.calls[1] if m.role == "tool"]
    assert results[0]["error"].startswith("NotRun: calls beside a final answer are not run")
    assert results[1]["error"].startswith("ValidationError: total")
    assert agent.state is not None
    closing = [json.loads(m.content or "") for m in agent.state.messages[-2:]]
    assert closing == [
        {"ok": "answer accepted"},
        {"error": "NotRun: the final answer ended the task"},
    ]


async def test_a_tool_mode_model_that_answers_in_text() -> None:
    # valid JSON of the type is taken as it is; prose is sent back, asking for the tool
    report = await Agent(
        "a", tool_model(['{"customer": "B", "total": 2}']), output_type=Invoice
    ).run("x")
    assert report.output == Invoice(customer="B", total=2)
    model = tool_model(["The total is 2.", final(customer="B", total=2)])
    report = await Agent("a", model, output_type=Invoice).run("x")
    assert report.output == Invoice(customer="B", total=2)
    asked = model.calls[1][-1]
    assert asked.role == "user" and asked.content is not None
    assert asked.content.startswith(f"Give your final answer by calling {FINAL_TOOL}")


async def test_a_malformed_final_call_is_a_rejected_answer_and_nudges_name_the_way() -> None:
    model = tool_model([call(FINAL_TOOL, "{not json"), final(customer="C", total=0)])
    report = await Agent("a", model, output_type=Invoice).run("x")
    assert report.output == Invoice(customer="C", total=0)
    assert "the answer is not JSON" in (model.calls[1][-1].content or "")
    empty = tool_model([ModelReply(text=""), final(customer="C", total=0)])
    await Agent("a", empty, output_type=Invoice).run("x")
    assert f"or with a call of {FINAL_TOOL}" in (empty.calls[1][-1].content or "")


async def test_an_untyped_agent_is_unchanged() -> None:
    model = ScriptedModel(['{"customer": "ACME", "total": 12}'], structured_output=True)
    report = await Agent("a", model).run("x")
    assert report.answer == '{"customer": "ACME", "total": 12}'
    assert (report.output, report.output_name, model.outputs) == (None, None, [None])


def test_types_and_tools_that_cannot_be_used_are_refused() -> None:
    with pytest.raises(UsageError, match="cannot be used for a typed answer"):
        Agent("a", ScriptedModel([]), output_type=object())
    answer_tool = tool(name=FINAL_TOOL)(lookup.fn)
    with pytest.raises(UsageError, match="has a tool named 'final_answer'"):
        Agent("a", ScriptedModel([]), tools=[answer_tool], output_type=Invoice)
    with pytest.raises(UsageError, match="cannot be used for a typed answer"):
        Teammate("w", ScriptedModel([]), output_type=object())
    with pytest.raises(UsageError, match="teammate 'w' has a tool named 'final_answer'"):
        Teammate("w", ScriptedModel([]), tools=[answer_tool], output_type=Invoice)


async def test_a_typed_run_streams_its_json() -> None:
    model = structured(['{"customer": "ACME", "total": 12, "note": "paid in full, thank you"}'])
    agent = Agent("a", model, output_type=Invoice)
    texts: list[str] = []
    report = None
    async with agent.stream("bill") as events:
        async for event in events:
            if isinstance(event, TextDelta):
                texts.append(event.text)
            else:
                report = event
    assert len(texts) > 1 and model.outputs[0] is not None
    assert isinstance(report, RunReport)
    assert report.output == Invoice(customer="ACME", total=12, note="paid in full, thank you")


# --- resume and rerun ---------------------------------------------------------------------------


class Crash(BaseException):
    """Stands for the process dying in the middle of a step."""


@pytest.mark.parametrize("mechanism", MECHANISMS)
async def test_a_typed_task_resumes_from_its_journal_with_its_one_correction_spent(
    tmp_path: Path, mechanism: str
) -> None:
    make, good, wrong = MECHANISMS[mechanism]
    died = {"once": False}

    @tool
    def lookup(customer: str) -> dict[str, int]:
        """What a customer owes; the process dies the first time."""
        if not died["once"]:
            died["once"] = True
            raise Crash
        return {"owed": 12}

    first = Agent(
        "c",
        make([wrong, call("lookup", customer="ACME")]),
        tools=[lookup],
        output_type=Invoice,
        directory=tmp_path,
    )
    with pytest.raises(ToolCrashed):
        await first.run("Bill ACME.")
    # a new process: the interrupted call runs again, and the correction is already spent
    again = make([good])
    second = Agent("c", again, tools=[lookup], output_type=Invoice, directory=tmp_path)
    report = await second.resume()
    again.assert_done()
    assert report.ok and report.output == Invoice(customer="ACME", total=12)
    assert (report.steps, report.tool_calls) == (3, 1)
    # the answer is in the journal: loading it gives the same value, typed
    third = Agent("c", make([]), tools=[lookup], output_type=Invoice, directory=tmp_path)
    assert (await third.resume()).output == report.output
    # and a wrong answer after the restart stops: one correction per task, across restarts
    died["once"] = False
    fourth = Agent(
        "d",
        make([wrong, call("lookup", customer="ACME")]),
        tools=[lookup],
        output_type=Invoice,
        directory=tmp_path,
    )
    with pytest.raises(ToolCrashed):
        await fourth.run("Bill ACME.")
    fifth = Agent("d", make([wrong]), tools=[lookup], output_type=Invoice, directory=tmp_path)
    assert (await fifth.resume()).stop.reason == "invalid_output"


@pytest.mark.parametrize("mechanism", MECHANISMS)
async def test_a_typed_run_reruns_the_same_from_its_transcript(
    tmp_path: Path, mechanism: str
) -> None:
    make, good, wrong = MECHANISMS[mechanism]
    model = make([call("lookup", customer="ACME"), wrong, good])
    agent = Agent("c", model, tools=[lookup], output_type=Invoice, directory=tmp_path)
    assert (await agent.run("Bill ACME.")).ok
    report, divergence, recorded = await rerun(tmp_path, "c", [lookup], "", output_type=Invoice)
    assert divergence is None and recorded == 3
    assert report is not None and report.output == Invoice(customer="ACME", total=12)
    lines = [
        json.loads(line) for line in (tmp_path / "c.transcript.jsonl").read_text().splitlines()
    ]
    by = "structured_output" if mechanism == "structured" else "tool"
    assert {(line["output"]["name"], line["answer_by"]) for line in lines} == {("Invoice", by)}


@pytest.mark.parametrize("spec", ["typed_clerk", "typed_clerk_structured"])
def test_teamrt_rerun_of_a_typed_teammate_with_a_round_of_mail_is_the_same(
    tmp_path: Path, spec: str
) -> None:
    make = {"typed_clerk": typed_clerk, "typed_clerk_structured": typed_clerk_structured}[spec]

    async def record() -> None:
        async with (
            FileMailboxes(tmp_path / "t") as mail,
            Team(mail, [make()], agent_dir=tmp_path / "t" / "agents") as team,
        ):
            first = await team.ask("clerk", "Bill ACME.", output_type=Invoice, timeout=5)
            await mail.send(Envelope.message("lead", "clerk", "FYI: ACME moved"))
            with anyio.fail_after(5):
                while team.status["clerk"].rounds < 1:  # noqa: ASYNC110 -- the teammate's task
                    await anyio.sleep(0.005)
            second = await team.ask("clerk", "Bill ACME again.", output_type=Invoice, timeout=5)
            assert first == second == Invoice(customer="ACME", total=12)

    anyio.run(record)
    argv = ["rerun", str(tmp_path / "t"), "--agent", "clerk", "--spec"]
    assert main([*argv, f"tests.support.typed_specs:{spec}"]) == 0
    if spec == "typed_clerk":  # without the type, final_answer is an unknown tool: it differs
        untyped = anyio.run(rerun, tmp_path / "t" / "agents", "clerk", [lookup], "")
        assert untyped[1] is not None and "UnknownTool" in str(untyped[1])


# --- teams --------------------------------------------------------------------------------------


async def test_team_ask_returns_the_typed_answer(tmp_path: Path) -> None:
    async with FileMailboxes(tmp_path / "t") as mail:
        clerk = Teammate(
            "clerk", lambda: tool_model([final(customer="ACME", total=12)]), output_type=Invoice
        )
        async with Team(mail, [clerk]) as team:
            invoice = await team.ask("clerk", "Bill ACME.", output_type=Invoice, timeout=5)
            assert_type(invoice, Invoice)
            assert invoice == Invoice(customer="ACME", total=12)
    # on the wire: the value as JSON, and the name of its type
    lines = (tmp_path / "t" / "inboxes" / "lead.jsonl").read_text().splitlines()
    result = next(e for line in lines if (e := json.loads(line))["type"] == RESULT)
    assert result["body"]["output"] == {"customer": "ACME", "total": 12, "note": None}
    assert result["body"]["output_name"] == "Invoice"
    assert json.loads(result["body"]["answer"]) == result["body"]["output"]


async def test_ask_without_output_type_still_returns_the_task_result() -> None:
    async with MemoryMailboxes() as mail:
        clerk = Teammate(
            "clerk", structured(['{"customer": "ACME", "total": 12}']), output_type=Invoice
        )
        plain = Teammate("plain", ScriptedModel(["words"]))
        async with Team(mail, [clerk, plain]) as team:
            result = await team.ask("clerk", "Bill ACME.", timeout=5)
            assert_type(result, TaskResult)
            assert (result.stop_reason, result.output_name) == ("answer", "Invoice")
            assert result.output == {"customer": "ACME", "total": 12, "note": None}
            untyped = await team.ask("plain", "say words", timeout=5)
            assert (untyped.answer, untyped.output, untyped.output_name) == ("words", None, None)
            with pytest.raises(UsageError, match="'plain' declares no output_type"):
                await team.ask("plain", "say words", output_type=Invoice, timeout=5)


@pytest.mark.parametrize("mechanism", MECHANISMS)
async def test_team_ask_corrects_once_then_raises_invalid_output(mechanism: str) -> None:
    make, good, wrong = MECHANISMS[mechanism]
    async with MemoryMailboxes() as mail:
        clerk = Teammate("clerk", make([wrong, good, wrong, wrong]), output_type=Invoice)
        async with Team(mail, [clerk]) as team:
            fixed = await team.ask("clerk", "Bill ACME.", output_type=Invoice, timeout=5)
            assert fixed == Invoice(customer="ACME", total=12)
            with pytest.raises(InvalidOutput) as raised:
                await team.ask("clerk", "Bill ACME again.", output_type=Invoice, timeout=5)
            assert team.status["clerk"].state == "idle"  # a clean stop: the teammate goes on
    error = raised.value
    assert str(error) == (
        "clerk gave no valid Invoice: the answer did not match Invoice again after one "
        "correction: total: Input should be greater than or equal to 0"
    )
    assert error.stop_reason == "invalid_output" and isinstance(error.result, TaskResult)
    assert error.result.output is None
    assert json.loads(error.result.answer or "") == {"customer": "ACME", "total": -3}


async def test_a_typed_ask_that_stops_otherwise_raises_output_error() -> None:
    async with MemoryMailboxes() as mail:
        looping = Teammate(
            "clerk",
            ScriptedModel([call("lookup", customer="ACME")] * 3),
            tools=[lookup],
            limits=Limits(max_steps=2),
            output_type=Invoice,
        )
        async with Team(mail, [looping]) as team:
            with pytest.raises(
                OutputError, match=r"clerk stopped \(limit\) without a typed answer \(Invoice\)"
            ) as raised:
                await team.ask("clerk", "Bill ACME.", output_type=Invoice, timeout=5)
    assert not isinstance(raised.value, InvalidOutput)
    assert raised.value.stop_reason == "limit"


def test_what_the_lead_gets_for_each_way_a_typed_task_can_end() -> None:
    typed = OutputType(Invoice)

    def result(stop: str, **extra: Any) -> TaskResult:
        fields: dict[str, Any] = {"answer": None, "stop_reason": stop, "detail": "why"}
        fields.update(steps=1, tool_calls=0, tokens=10, cost=None)
        return TaskResult(**{**fields, **extra})

    value = {"customer": "A", "total": 1, "note": None}
    good = result("answer", output=value, output_name="Invoice")
    assert typed_answer("w", good, typed) == Invoice(customer="A", total=1)
    cases: list[tuple[TaskResult, type[OutputError], str]] = [
        (result("invalid_output"), InvalidOutput, "w gave no valid Invoice: why"),
        (result("answer", answer="text"), OutputError, "w answered with text, not a typed answer"),
        (result("model_error"), OutputError, r"w stopped \(model_error\) without a typed answer"),
        (result("shutdown"), OutputError, r"w stopped \(shutdown\)"),
    ]
    for ended, kind, message in cases:
        with pytest.raises(kind, match=message) as raised:
            typed_answer("w", ended, typed)
        assert type(raised.value) is kind and raised.value.result is ended


async def test_the_lead_validates_against_the_type_it_asked_for() -> None:
    async with MemoryMailboxes() as mail:
        clerk = Teammate("clerk", tool_model([final(customer="A", total=12)]), output_type=Invoice)
        async with Team(mail, [clerk]) as team:
            with pytest.raises(
                InvalidOutput, match=r"clerk's answer \(Invoice\) does not match Large: total"
            ):
                await team.ask("clerk", "bill", output_type=Large, timeout=5)


async def test_rounds_of_mail_stay_untyped() -> None:
    async with MemoryMailboxes() as mail:
        model = tool_model(["noted, thanks", final(customer="ACME", total=12)])
        clerk = Teammate("clerk", model, output_type=Invoice)
        async with Team(mail, [clerk]) as team:
            await mail.send(Envelope.message("lead", "clerk", "FYI: ACME paid"))
            with anyio.fail_after(5):
                while team.status["clerk"].rounds < 1:  # noqa: ASYNC110 -- the teammate's task
                    await anyio.sleep(0.005)
            invoice = await team.ask("clerk", "Bill ACME.", output_type=Invoice, timeout=5)
    assert invoice == Invoice(customer="ACME", total=12)
    model.assert_done()


async def test_a_restarted_typed_teammate_resumes_its_task_from_the_journal(
    tmp_path: Path,
) -> None:
    died = {"once": False}

    @tool
    def lookup(customer: str) -> dict[str, int]:
        """What a customer owes; the first call crashes the teammate."""
        if not died["once"]:
            died["once"] = True
            raise Crash
        return {"owed": 12}

    asked: list[int] = []

    def brain(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ModelReply:
        asked.append(len(messages))
        owed = [m for m in messages if m.role == "tool" and "owed" in (m.content or "")]
        if not owed:
            return call("lookup", customer="ACME")
        return final(customer="ACME", total=json.loads(owed[-1].content or "")["owed"])

    clerk = Teammate(
        "clerk",
        lambda: FunctionModel(brain),
        tools=[lookup],
        output_type=Invoice,
        restart=RestartPolicy(on_failure=True, backoff=0.01),
    )
    async with (
        FileMailboxes(tmp_path / "t") as mail,
        Team(mail, [clerk], agent_dir=tmp_path / "t" / "agents") as team,
    ):
        invoice = await team.ask("clerk", "Bill ACME.", output_type=Invoice, timeout=10)
        assert team.status["clerk"].restarts == 1
    assert invoice == Invoice(customer="ACME", total=12)
    assert len(asked) == 2  # the model was not asked the interrupted step again


async def test_a_typed_teammate_in_another_process(tmp_path: Path) -> None:
    team = tmp_path / "t"
    async with FileMailboxes(team, members=["lead", "w"]) as mail:
        proc = run_agent(team, "remote_clerk", module="typed_specs")
        await until_running(mail, proc)
        async with Team(mail, [], remote=["w"]) as lead:
            with anyio.fail_after(20):
                invoice = await lead.ask("w", "Bill ACME.", output_type=Invoice, timeout=30)
                # the lead checks against the type it asked for, whatever the teammate declared
                with pytest.raises(InvalidOutput, match="does not match Large: total: Input"):
                    await lead.ask("w", "Bill ACME.", output_type=Large, timeout=30)
        code, err = await exit_code(proc)
    assert invoice == Invoice(customer="ACME", total=12) and code == 0, err


# --- the real openai client against a local server ----------------------------------------------


@pytest.fixture
def server() -> Iterator[FakeOpenAI]:
    with FakeOpenAI() as fake, allow_model_requests():
        yield fake


@pytest.fixture
async def openai_model(server: FakeOpenAI) -> AsyncIterator[Callable[..., OpenAIModel]]:
    made: list[OpenAIModel] = []

    def make(**kwargs: Any) -> OpenAIModel:
        made.append(
            OpenAIModel("fake-model", base_url=server.url, api_key="k", backoff=0.01, **kwargs)
        )
        return made[-1]

    yield make
    for m in made:
        await m.aclose()


async def test_openai_chat_structured_output_with_one_correction(
    server: FakeOpenAI, openai_model: Callable[..., OpenAIModel]
) -> None:
    # strict mode makes the model write null for the optional note: dropped, so its default holds
    server.then(chat_reply('{"customer": "ACME", "total": -3, "note": null}'))
    server.then(chat_reply('{"customer": "ACME", "total": 12, "note": null}'))
    report = await Agent("c", openai_model(), output_type=Invoice).run("Bill ACME.")
    assert report.ok and report.output == Invoice(customer="ACME", total=12)
    first, second = server.seen
    assert first.path == "/v1/chat/completions" and "tools" not in first.body
    response_format = first.body["response_format"]
    assert response_format["type"] == "json_schema"
    sent = response_format["json_schema"]
    assert (sent["name"], sent["strict"]) == ("Invoice", True)
    assert sent["description"] == "An invoice for one customer."
    assert sent["schema"]["required"] == ["customer", "total", "note"]
    assert sent["schema"]["additionalProperties"] is False
    assert second.body["response_format"] == response_format
    feedback = second.body["messages"][-1]
    assert (
        feedback["role"] == "user"
        and "total: Input should be greater than or equal to 0" in (feedback["content"])
    )


async def test_openai_responses_structured_output(
    server: FakeOpenAI, openai_model: Callable[..., OpenAIModel]
) -> None:
    server.then(responses_reply('{"value": [3, 1, 2]}'))
    report = await Agent("c", openai_model(api="responses"), output_type=list[int]).run("n")
    assert report.output == [3, 1, 2]
    fmt = server.seen[0].body["text"]["format"]
    assert (fmt["type"], fmt["name"], fmt["strict"]) == ("json_schema", "list_int", True)
    assert fmt["schema"]["properties"]["value"] == {"items": {"type": "integer"}, "type": "array"}


async def test_openai_streams_a_structured_answer(
    server: FakeOpenAI, openai_model: Callable[..., OpenAIModel]
) -> None:
    server.then_stream(chat_chunks(['{"customer": "AC', 'ME", "total": 12, "note": null}']))
    texts: list[str] = []
    report = None
    async with Agent("c", openai_model(), output_type=Invoice).stream("Bill ACME.") as events:
        async for event in events:
            if isinstance(event, TextDelta):
                texts.append(event.text)
            else:
                report = event
    assert isinstance(report, RunReport) and report.output == Invoice(customer="ACME", total=12)
    assert "".join(texts).startswith('{"customer": "ACME"')
    body = server.seen[0].body
    assert body["stream"] is True and body["response_format"]["json_schema"]["name"] == "Invoice"


async def test_openai_without_structured_output_answers_through_the_tool(
    server: FakeOpenAI, openai_model: Callable[..., OpenAIModel]
) -> None:
    server.then(chat_reply(tool_calls=[("call_1", FINAL_TOOL, '{"customer": "ACME"}')]))
    server.then(
        chat_reply(tool_calls=[("call_2", FINAL_TOOL, '{"customer": "ACME", "total": 12}')])
    )
    server.then(chat_reply(tool_calls=[("call_3", FINAL_TOOL, '{"customer": "ACME", "total": 5}')]))
    server.then(chat_reply(tool_calls=[("call_4", FINAL_TOOL, '{"total": 5}')]))
    server.then(chat_reply(tool_calls=[("call_5", FINAL_TOOL, '{"total": 6}')]))
    model = openai_model(structured_output=False)
    async with MemoryMailboxes() as mail:
        clerk = Teammate("clerk", model, output_type=Invoice)
        async with Team(mail, [clerk]) as team:
            assert await team.ask("clerk", "bill", output_type=Invoice, timeout=10) == Invoice(
                customer="ACME", total=12
            )
            assert await team.ask("clerk", "again", output_type=Invoice, timeout=10) == Invoice(
                customer="ACME", total=5
            )
            with pytest.raises(InvalidOutput, match="customer: Field required"):
                await team.ask("clerk", "once more", output_type=Invoice, timeout=10)
    first, second = server.seen[:2]
    assert "response_format" not in first.body
    tools = first.body["tools"]
    assert [t["function"]["name"] for t in tools if t["function"]["name"] == FINAL_TOOL]
    answer_tool = next(t["function"] for t in tools if t["function"]["name"] == FINAL_TOOL)
    assert answer_tool["parameters"] == Invoice.model_json_schema()
    error = second.body["messages"][-1]
    assert error["role"] == "tool" and error["tool_call_id"] == "call_1"
    assert json.loads(error["content"]) == {"error": "ValidationError: total: Field required"}


# --- the docs' example ----------------------------------------------------------------------------


async def test_the_docs_example_runs() -> None:
    code = EXAMPLE.read_text()
    namespace: dict[str, Any] = {"__name__": "typed_answers"}
    exec(compile(code, str(EXAMPLE), "exec"), namespace)
    await namespace["main"]()


# --- what users and models may well give ---


class Reading(BaseModel):
    """A measurement."""

    value: float


async def test_a_typed_answer_with_a_number_too_big_for_a_float_is_corrected() -> None:
    """`1e999` is JSON, but no float: taken as infinity it was accepted, then written out as
    `null`, which a lead's `ask` refused as not matching the very type the teammate declared.
    It is a rejected answer, and the model gets its one correction."""
    model = ScriptedModel(['{"value": 1e999}', '{"value": 2.5}'], structured_output=True)
    report = await Agent("meter", model, output_type=Reading).run("Measure.")
    assert (report.stop.reason, report.output, report.answer) == (
        "answer",
        Reading(value=2.5),
        '{"value":2.5}',
    )
    correction = [m.content or "" for m in model.calls[1] if m.role == "user"][-1]
    assert "1e999" in correction and "finite" in correction

    teammate = Teammate(
        "meter",
        lambda: ScriptedModel([call("final_answer", '{"value": 1e999}')] * 2),
        output_type=Reading,
    )
    async with MemoryMailboxes() as mail, Team(mail, [teammate]) as team:
        with pytest.raises(InvalidOutput, match="meter gave no valid Reading"):
            await team.ask("meter", "Measure.", output_type=Reading, timeout=10)
