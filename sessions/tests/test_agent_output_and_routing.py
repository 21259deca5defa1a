"""An agent's structured output (``output_schema``, ``output_repairs``) and routing rules, over the
run loop's in-memory ports (sessions/tests/fakes.py): no database, no Redis, no model server.
The database side (the rules' routes loaded in the agent's tenant only, the admin API, the
trace) is tested in agents/tests/test_output_and_routing_db.py."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from agents.routing import rules_compile
from sessions.models import RunFailureReason, RunStatus
from sessions.runner.database import History
from sessions.runner.loop import execute_run
from sessions.runner.ports import RunPorts
from sessions.tests.fakes import FakePorts, MemoryRunStore, ScriptedModel, reply, run_spec

CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


class _StoreWithRows(MemoryRunStore):
    """A store whose history has rows (as the database's has), and whose worker "dies" (raises
    :class:`_WorkerDied`, no ``Exception``: nothing of the run's code catches it) right after
    saving answer number ``die_after_answer``."""

    def __init__(self, *args: Any, die_after_answer: int = 0, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.die_after_answer = die_after_answer
        self.answers = 0

    async def history(self, run_id: int, **kwargs: Any) -> History:
        history = await super().history(run_id, **kwargs)
        rows = [SimpleNamespace(run_id=run_id, role=m["role"], tool_calls=m.get("tool_calls") or [])
                for m in self.messages]
        return History(messages=history.messages, tail=history.tail, summary="", rows=rows, compaction=None)

    async def assistant_message_save(self, **kwargs: Any) -> list:
        saved = await super().assistant_message_save(**kwargs)
        self.answers += 1
        if self.answers == self.die_after_answer:
            raise _WorkerDied
        return saved


class _WorkerDied(BaseException):
    """The worker process died (the run stays ``running`` until another worker resumes it)."""


async def test_an_agent_schema_answer_is_checked_parsed_and_sent_as_the_native_format():
    fake = FakePorts(MemoryRunStore(run_spec(output_schema=CITY)),
                     ScriptedModel(reply("Paris, I think."), reply('```json\n{"city": "Paris"}\n```')))
    await execute_run(1, ports=fake.ports)
    store = fake.store
    assert store.status == RunStatus.COMPLETED and store.outcome.reply == '{"city": "Paris"}'
    assert store.structured == {"city": "Paris"}  # Run.structured: the REST API's `structured`
    system = fake.model_.prompts[0][0].content
    assert "valid against this JSON Schema" in system and '"required":["city"]' in system
    assert "not valid JSON" in fake.model_.prompts[1][-1].content  # the repair turn's note
    native = fake.model_.settings[0]["response_format"]
    assert native == {"type": "json_schema", "json_schema": {"name": "answer", "schema": CITY, "strict": False}}


async def test_past_the_agents_repairs_the_run_fails_output_invalid():
    fake = FakePorts(MemoryRunStore(run_spec(output_schema=CITY, output_repairs=1)),
                     ScriptedModel(reply("no"), reply('{"town": "Paris"}')))
    await execute_run(1, ports=fake.ports)
    outcome = fake.store.outcome
    assert (fake.store.status, outcome.reason) == (RunStatus.FAILED, RunFailureReason.OUTPUT_INVALID)
    assert "after 1 repair turn(s)" in outcome.error and "'city' is a required property" in outcome.error
    assert len(fake.model_.prompts) == 2 and fake.store.structured is None


async def test_no_output_format_sends_no_format_and_stores_nothing():
    fake = FakePorts(MemoryRunStore(run_spec()), ScriptedModel(reply('{"city": "Paris"}')))
    await execute_run(1, ports=fake.ports)
    assert fake.store.outcome.reply == '{"city": "Paris"}' and fake.store.structured is None
    assert fake.model_.settings == [{}]
    assert "JSON Schema" not in fake.model_.prompts[0][0].content


async def test_the_repair_turns_spent_survive_a_worker_that_dies():
    """Answer 1 is refused (repair turn 1 of 1); the worker dies right after saving answer 2.
    The next worker finds answer 2 refused too, and with the one repair spent by the dead
    worker counted from the stored answers, fails the run at once: no third model call."""
    store = _StoreWithRows(run_spec(output_schema=CITY, output_repairs=1), die_after_answer=2)
    first = FakePorts(store, ScriptedModel(reply("no"), reply('{"town": "Paris"}')))
    try:
        await execute_run(1, ports=first.ports)
    except _WorkerDied:
        pass
    assert store.status == RunStatus.RUNNING and store.answers == 2
    second_model = ScriptedModel(reply('{"city": "Paris"}'))  # a repair turn would get this valid answer
    await execute_run(1, ports=FakePorts(store, second_model).ports)
    assert (store.status, store.outcome.reason) == (RunStatus.FAILED, RunFailureReason.OUTPUT_INVALID)
    assert second_model.prompts == [], "a resumed run must not get repair turns the dead worker spent"


# --- routing rules --------------------------------------------------------------------------

def _entry(**fields: Any) -> Any:
    return SimpleNamespace(**{"max_input_tokens": 100_000, "input_price_per_mtok": 0, "supports_images": False,
                              **fields})


RULES = [
    {"name": "pictures", "route": "vision", "images": True},
    {"name": "money", "route": "cheap", "keywords": ["Refund", "invoice"]},
    {"name": "code", "route": "coder", "regex": r"(?i)\bpython\b"},
    {"name": "saver", "route": "cheap", "min_budget_share": 0.5},
]
ROUTES = {"vision": ((_entry(supports_images=True),), (71,)), "cheap": ((_entry(),), (72,)),
          "coder": ((_entry(),), (73,))}


def _routed(*, user_message: str, rules: list[dict] = RULES, store_cls: type = MemoryRunStore, **spec: Any):
    """A run of an agent with ``rules`` over the routes above: each route's own scripted model
    (``models[name]``; "main": the agent's own route) answers "from <name>"."""
    store = store_cls(run_spec(routing_rules=rules_compile(rules), routes=ROUTES, route_name="main", **spec),
                      user_message=user_message)
    models = {name: ScriptedModel(reply(f"from {name}")) for name in ("main", *ROUTES)}
    made: list[str] = []

    def model(spec: Any, record: Any, publish: Any) -> ScriptedModel:
        made.append(spec.route_name)
        return models[spec.route_name]

    fake = FakePorts(store, models["main"])
    fake.ports = RunPorts(store=store, publisher=fake._publisher, model=model, toolsets=fake._open,
                          cancel_watch=fake._watch, tool_store=fake.tool_store)
    return fake, made


async def test_keywords_choose_the_route_and_the_choice_is_recorded():
    fake, made = _routed(user_message="Where is my REFUND?")
    await execute_run(1, ports=fake.ports)
    assert fake.store.outcome.reply == "from cheap"
    assert made == ["main", "cheap"]
    assert fake.store.route_choices == [{"turn": 0, "rule": "money", "route": "cheap"}]


async def test_an_image_reference_chooses_the_vision_route():
    fake, _ = _routed(user_message='What is this?\n[image: artifact:12 "cat.png", image/png, 81.0 kB]')
    await execute_run(1, ports=fake.ports)
    assert fake.store.outcome.reply == "from vision"
    assert fake.store.route_choices == [{"turn": 0, "rule": "pictures", "route": "vision"}]


async def test_a_regex_rule_and_no_match_keeps_the_agents_route():
    fake, _ = _routed(user_message="Write some Python please")
    await execute_run(1, ports=fake.ports)
    assert fake.store.outcome.reply == "from coder"
    fake, made = _routed(user_message="hello")
    await execute_run(1, ports=fake.ports)
    assert fake.store.outcome.reply == "from main" and made == ["main"]
    assert fake.store.route_choices == [{"turn": 0, "rule": "", "route": "main"}]


async def test_the_budget_share_rule_reads_the_cost_spent():
    class Spent(MemoryRunStore):
        async def usage(self, run_id: int) -> Any:
            return SimpleNamespace(tokens=10, cost_usd_micros=600)

    fake, _ = _routed(user_message="hello", store_cls=Spent, max_cost_per_run_usd_micros=1000)
    await execute_run(1, ports=fake.ports)
    assert fake.store.outcome.reply == "from cheap"
    assert fake.store.route_choices == [{"turn": 0, "rule": "saver", "route": "cheap"}]
    fake, _ = _routed(user_message="hello", store_cls=Spent, max_cost_per_run_usd_micros=10_000)  # 6 %: under half
    await execute_run(1, ports=fake.ports)
    assert fake.store.outcome.reply == "from main"


async def test_an_agent_without_rules_makes_one_model_and_records_nothing():
    fake, made = _routed(user_message="refund", rules=[])
    await execute_run(1, ports=fake.ports)
    assert fake.store.outcome.reply == "from main" and made == ["main"] and fake.store.route_choices == []
