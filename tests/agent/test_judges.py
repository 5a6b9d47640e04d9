"""Judges: strict verdict parsing, the scripted rule, the persistent cache, a model judge on a real
tiny transformer, and the runtime wiring (judged children, the root proxy without a judge, judge
errors and latency never holding a tree), down to the stored rows read back with SQL."""

from __future__ import annotations

import asyncio
import json
import time

import pyarrow as pa
import pytest

from rao_core.agent.runner import run_trees
from rao_core.agent.tree import TreeSpec
from rao_core.config import AgentConfig, ConfigError, JudgeConfig, SandboxConfig
from rao_core.engines.hf import HFEngine
from rao_core.engines.hf_process import ProcessEngine, ReplicatedEngine
from rao_core.engines.open import open_judge_engine
from rao_core.engines.server import start_background
from rao_core.errors import JudgeError
from rao_core.judges import ModelJudge, build_judge, judge_prompt
from rao_core.models.tiny import save_checkpoint
from rao_core.query import run_query
from rao_core.run import load_config
from rao_core.sampler import tree_rows
from rao_core.store.parquet import write_partition
from rao_core.store.schema import NODE_SCHEMA
from rao_core.verdicts import (
    RUBRIC,
    RUBRIC_VERSION,
    Judge,
    JudgeCache,
    ScriptedJudge,
    VerdictError,
    make_verdict,
    parse_verdict,
)
from tests.agent.test_runtime import CHAT, NoteEnv
from tests.conftest import CellScript, row_labels
from tests.engines import req, small_model

TOK = CHAT.tokenizer


# --- verdict parsing ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, success",
    [
        ('{"success": true, "score": 0.75, "reason": "mostly right"}', 0.75),
        ('{"success": true, "score": 1}', 1.0),  # integer score, reason optional
        ('{"success": false, "score": 0.9, "reason": "not acceptable"}', 0.0),  # false wins
        ('<think>\nhmm {"success": false}\n</think>\n{"success": true, "score": 1, "reason": "ok"}', 1.0),
        ('```json\n{"success": true, "score": 0.5, "reason": "half"}\n```', 0.5),
    ],
)
def test_valid_verdicts(text, success):
    v = make_verdict(text, "m")
    assert v.success == success and not v.cached
    data = json.loads(v.verdict)
    assert data["judge"] == "m" and data["rubric"] == RUBRIC_VERSION and "raw" not in data


@pytest.mark.parametrize(
    "text",
    [
        "",
        "the answer looks right",
        "{'success': True, 'score': 1}",  # Python, not JSON
        "[true, 1]",
        '{"success": "yes", "score": 1}',
        '{"success": 1, "score": 1}',
        '{"score": 1, "reason": "no success field"}',
        '{"success": true, "score": 1, "reason": 3}',
        'Verdict: {"success": true, "score": 1, "reason": "ok"}',  # extra text before
        '{"success": true, "score": 1, "reason": "ok"} I am confident.',  # extra text after
        '{"success": true, "score": 1}\n{"success": false, "score": 0}',  # two objects
        '{"success": true, "score": 1.5}',  # out of range
        '{"success": true, "score": -0.1}',
        '{"success": true, "score": NaN}',
        '{"success": true, "score": true}',
        '{"success": true, "score": "1"}',
        '<think>unclosed {"success": true, "score": 1}',
    ],
)
def test_malformed_verdicts_fail_and_keep_the_raw_text(text):
    with pytest.raises(VerdictError):
        parse_verdict(text)
    v = make_verdict(text, "m")
    data = json.loads(v.verdict)
    assert v.success == 0.0 and data["success"] is False and data["score"] == 0.0
    assert data["raw"] == text and data["reason"].startswith("malformed verdict")


# --- the scripted rule ---------------------------------------------------------------------------


def judge_now(judge: Judge, goal: str, answer: str, reference: str | None = None):
    return asyncio.run(judge.judge(goal, answer, reference))


@pytest.mark.parametrize(
    "answer, reference, success",
    [
        ("Count: 42", "count:   42.", 1.0),  # case, spacing and a final period do not matter
        ('"Alice, Bob"', "alice, bob", 1.0),
        ("42", "43", 0.0),
        ("Bob, Alice", "Alice, Bob", 0.0),  # order matters to the rule
        ("anything", None, 1.0),  # no reference: a non-empty answer passes
        ("  . ", None, 0.0),
        ("", "", 1.0),
    ],
)
def test_scripted_rule(answer, reference, success):
    v = judge_now(ScriptedJudge(), "the goal", answer, reference)
    assert v.success == success
    assert json.loads(v.verdict)["judge"] == "scripted"


# --- the cache -----------------------------------------------------------------------------------


class CountingJudge(ScriptedJudge):
    def __init__(self, cache: JudgeCache | None) -> None:
        super().__init__(cache)
        self.calls = 0

    async def reply(self, goal: str, answer: str, reference: str | None) -> str:
        self.calls += 1
        return await super().reply(goal, answer, reference)


class FailingJudge(Judge):
    calls = 0

    async def reply(self, goal: str, answer: str, reference: str | None) -> str:
        self.calls += 1
        raise RuntimeError("engine down")


def test_cache_hits_and_keys(tmp_path):
    judge = CountingJudge(JudgeCache(tmp_path / "judge_cache"))
    first, second = judge_now(judge, "g", "a", "a"), judge_now(judge, "g", "a", "a")
    assert (first.cached, second.cached, judge.calls) == (False, True, 1)
    assert second.success == first.success == 1.0 and second.verdict == first.verdict
    judge_now(judge, "g", "a", None)  # the reference is part of the key
    judge_now(judge, "g", "b", "a")  # so is the answer
    assert judge.calls == 3
    other = CountingJudge(judge.cache)
    other.name = "another-model"  # and the judge model
    assert not judge_now(other, "g", "a", "a").cached


def test_cache_survives_reopening_a_torn_line_and_parallel_writers(tmp_path):
    folder = tmp_path / "judge_cache"
    judge = CountingJudge(JudgeCache(folder))
    judge_now(judge, "g", "yes", "yes")
    judge_now(judge, "g", "no", "yes")
    assert judge.cache is not None and judge.cache.path is not None
    with open(judge.cache.path, "ab") as f:  # the process crashed in the middle of a third append
        f.write(b'{"key": "0123", "success": 1.0, "verd')
    reopened = CountingJudge(JudgeCache(folder))
    assert len(reopened.cache.memory) == 2  # the torn line is skipped, nothing else lost
    hit = judge_now(reopened, "g", "no", "yes")
    assert hit.cached and hit.success == 0.0 and reopened.calls == 0
    shard = CountingJudge(JudgeCache(folder))  # a second process writing at the same time
    judge_now(reopened, "g", "maybe", "yes")
    judge_now(shard, "g", "other", "yes")
    files = sorted(folder.glob("*.jsonl"))
    assert len(files) == 3  # one file per writer: the crashed one is never appended to again
    assert len(JudgeCache(folder).memory) == 4


def test_judge_errors_are_retried_then_raised_and_not_cached():
    judge = FailingJudge("flaky", JudgeCache(), attempts=2)
    with pytest.raises(JudgeError, match="flaky: RuntimeError: engine down"):
        judge_now(judge, "g", "a")
    assert judge.calls == 2  # retried once with backoff, then given up: the machine failed, not the node
    assert judge.cache is not None and judge.cache.memory == {}


# --- building from config ----------------------------------------------------------------------


def test_build_judge_from_config(tmp_path):
    assert build_judge(load_config(overrides=["judge.kind=none"]).judge, tmp_path) is None
    cfg = load_config(overrides=[f"runs_dir={tmp_path}", "judge.kind=scripted"])
    judge = build_judge(cfg.judge, cfg.run_dir)
    assert isinstance(judge, ScriptedJudge) and judge.cache is not None
    assert judge.cache.folder == cfg.run_dir / "judge_cache"
    assert build_judge(JudgeConfig(kind="scripted", cache=False), tmp_path).cache is None
    with pytest.raises(ConfigError, match="judge.kind"):
        load_config(overrides=["judge.kind=oracle"])
    with pytest.raises(ConfigError, match="judge.model"):
        open_judge_engine(JudgeConfig(kind="hf"))
    with pytest.raises(ConfigError, match="judge.base_url"):
        open_judge_engine(JudgeConfig(kind="openai", model="tiny"))
    with pytest.raises(ValueError, match="handed its engine"):  # a judge never builds its own
        build_judge(JudgeConfig(kind="hf", model="tiny"), tmp_path)


def test_model_judge_on_a_random_transformer(tmp_path):
    """An untrained model writes garbage: the verdict is well formed, fails, and keeps the raw
    text, which is exactly what an engine with the same weights and seed samples for the rubric
    prompt (temperature 1: greedy decoding of a random model is only newlines)."""
    path = save_checkpoint(small_model(TOK), TOK, tmp_path / "judge-model")
    cfg = JudgeConfig(kind="hf", model=str(path), max_new_tokens=12, temperature=1.0)
    judge = build_judge(cfg, tmp_path, open_judge_engine(cfg))
    assert isinstance(judge, ModelJudge)
    assert isinstance(judge.engine, (HFEngine, ProcessEngine, ReplicatedEngine))  # engine_processes: auto
    fresh = HFEngine(small_model(TOK), TOK)
    goal, answer, reference = "count the dragons", "3 dragons", "3"

    async def main():
        try:
            first = await judge.judge(goal, answer, reference)
            second = await judge.judge(goal, answer, reference)
            prompt = judge.chat.initial_ids(RUBRIC, judge_prompt(goal, answer, reference))
            return first, second, await fresh.generate(req(prompt, 12, temperature=1.0))
        finally:
            await judge.close()
            await fresh.close()

    first, second, direct = asyncio.run(main())
    data = json.loads(first.verdict)
    assert first.success == 0.0 and data["reason"].startswith("malformed verdict")
    assert data["raw"] == direct.text and data["raw"].strip() and data["judge"] == str(path)
    assert second.cached and second.verdict == first.verdict
    [file] = (tmp_path / "judge_cache").glob("*.jsonl")
    assert file.read_text().count("\n") == 1


def test_openai_judge_through_the_project_server(tmp_path):
    """kind openai: the rubric prompt goes over HTTP as token ids; the verdict text comes back
    as text (no token ids needed: a judge is never trained on)."""
    url, stop = start_background(HFEngine(small_model(TOK), TOK))
    try:
        cfg = JudgeConfig(kind="openai", model="tiny", base_url=url, served_model="srv", max_new_tokens=8)
        judge = build_judge(cfg, tmp_path, open_judge_engine(cfg))
        assert isinstance(judge, ModelJudge) and judge.name == "srv"

        async def main():
            try:
                return await judge.judge("count the dragons", "3")
            finally:
                await judge.close()

        v = asyncio.run(main())
    finally:
        stop()
    data = json.loads(v.verdict)
    assert v.success == 0.0 and data["raw"] == "\n" * 8 and data["judge"] == "srv"  # greedy garbage


# --- the runtime -------------------------------------------------------------------------------


class JudgedNoteEnv(NoteEnv):
    """A suite whose children have no exact verifier: a finished child hands the judge its answer
    and the reference `done <goal>`; an unfinished child is exactly a failure (no judge needed)."""

    def __init__(self, goal: str, notes=None, context=None, child: bool = False) -> None:
        super().__init__(goal, notes, context)
        self.child = child

    def fork(self, goal=None, context=None) -> JudgedNoteEnv:
        base = super().fork(goal, context)
        return JudgedNoteEnv(base.goal, self.notes, context, child=True)

    def judge_inputs(self, finished: bool, finish_message: str) -> dict[str, str] | None:
        if not self.child or not finished:
            return None
        return {"goal": self.goal, "answer": finish_message, "reference": f"done {self.goal}"}

    def success(self, finished: bool, finish_message: str) -> float:
        if self.child:  # exact against the reference: what a suite does without a judge
            return float(finished and finish_message == f"done {self.goal}")
        return super().success(finished, finish_message)


class UnreferencedNoteEnv(JudgedNoteEnv):
    """Children whose goals the suite cannot read back into a reference: only a judge can tell."""

    def fork(self, goal=None, context=None) -> UnreferencedNoteEnv:
        base = super().fork(goal, context)
        return UnreferencedNoteEnv(base.goal, self.notes, context, child=True)

    def judge_inputs(self, finished: bool, finish_message: str) -> dict[str, str] | None:
        inputs = super().judge_inputs(finished, finish_message)
        return inputs and {"goal": inputs["goal"], "answer": inputs["answer"]}


def script(node) -> str:
    """Root: three children, then finish('root ok'). 'part 0' answers right, 'part 1' wrong,
    'part 2' never finishes."""
    if node.depth == 1:
        goal = node.env.goal
        return {"part 0": "finish('done part 0')", "part 1": "finish('nope')"}.get(goal, "print(1)")
    if node.turn == 0:
        return "print(await asyncio.gather(*[launch_subagent(f'part {i}') for i in range(3)]))"
    return "finish('root ok')"


def judged_tree(judge: Judge | None, policy=None, env=JudgedNoteEnv, **agent) -> dict[str, object]:
    base = {"cell_timeout_s": 5.0, "tree_timeout_s": 60.0, "reply_format": "thought_python", "max_steps": 3}
    cfg = AgentConfig(**{**base, **agent})
    spec = TreeSpec("t", 0, env("say ok"))
    (tree,) = asyncio.run(
        run_trees([spec], policy or CellScript(script), CHAT, cfg, SandboxConfig(), 1.0, judge=judge)
    )
    return {r.goal: r for r in tree.records} | {"tree": tree}


def test_judged_children_are_stored_and_queryable(toy):
    """Through the rollout stage's own functions: rows written as a partition, read with `rao sql`."""
    cfg = toy("agent.max_steps=3")
    judge = ScriptedJudge(JudgeCache(cfg.run_dir / "judge_cache"))
    spec = TreeSpec("t", 0, JudgedNoteEnv("say ok"))
    runs = asyncio.run(run_trees([spec], CellScript(script), CHAT, cfg.agent, cfg.sandbox, 1.0, judge=judge))
    table = pa.Table.from_pylist(tree_rows(runs[0], row_labels(cfg)), schema=NODE_SCHEMA)
    write_partition({"nodes": table}, cfg.layout.rollouts(0))
    _, rows = run_query(
        cfg.run_dir,
        "SELECT goal, success, success_source, judge_verdict, "
        "json_extract_string(judge_verdict, '$.reason') AS reason FROM nodes ORDER BY node_id",
    )
    by_goal = {r[0]: r[1:] for r in rows}
    assert by_goal["say ok"][:3] == (1.0, "verifier", None)  # the root has an exact verifier
    assert by_goal["part 0"][:2] == (1.0, "judge") and by_goal["part 0"][3] == "answer matches the reference"
    assert by_goal["part 1"][:2] == (0.0, "judge") and json.loads(by_goal["part 1"][2])["success"] is False
    assert by_goal["part 2"][:3] == (0.0, "verifier", None)  # unfinished: judge_inputs said exact


def test_without_a_judge_children_copy_the_root_success():
    nodes = judged_tree(None, env=UnreferencedNoteEnv)
    assert nodes["say ok"].success == 1.0 and nodes["say ok"].success_source == "verifier"
    for goal in ("part 0", "part 1"):  # 'part 1' answered wrong, yet gets the root's 1.0
        assert (nodes[goal].success, nodes[goal].success_source) == (1.0, "root_proxy")
        assert nodes[goal].judge_verdict is None
    assert (nodes["part 2"].success, nodes["part 2"].success_source) == (0.0, "verifier")


def test_without_a_judge_a_reference_makes_the_suite_the_verifier():
    nodes = judged_tree(None)  # the suite read each child's goal back into `done <goal>`
    assert (nodes["part 0"].success, nodes["part 0"].success_source) == (1.0, "verifier")
    assert (nodes["part 1"].success, nodes["part 1"].success_source) == (0.0, "verifier")
    assert nodes["part 1"].judge_verdict is None


class SlowJudge(ScriptedJudge):
    """Takes `seconds` per verdict and fails on the answer 'nope', as a judge server might; notes
    when each verdict came back."""

    def __init__(self, seconds: float = 1.0) -> None:
        super().__init__()
        self.seconds = seconds
        self.returned_at: list[float] = []

    async def reply(self, goal: str, answer: str, reference: str | None) -> str:
        await asyncio.sleep(self.seconds)
        self.returned_at.append(time.time())
        if answer == "nope":
            raise RuntimeError("judge server went away")
        return await super().reply(goal, answer, reference)


def test_judge_errors_and_latency_never_hold_the_tree():
    judge = SlowJudge()
    nodes = judged_tree(judge)
    root, good, bad = nodes["say ok"], nodes["part 0"], nodes["part 1"]
    assert root.status == "finished" and root.success == 1.0
    assert (good.success, good.success_source) == (1.0, "judge")
    assert (bad.success, bad.success_source) == (0.0, "judge")
    assert (
        json.loads(bad.judge_verdict)["error"] == "JudgeError: scripted: RuntimeError: judge server went away"
    )
    # a failed judge is the machine's fault: the tree leaves training, counted as a judge failure
    assert nodes["tree"].status == "infra_error" and [k for k, _ in nodes["tree"].infra_failures] == ["judge"]
    # the root got its children's answers and finished before any verdict came back
    assert len(judge.returned_at) == 2 and root.ended_at < min(judge.returned_at)


def test_verdicts_survive_a_tree_timeout():
    def stalling(node) -> str:
        if node.depth == 1:
            return "finish('done part 0')"
        return "print(await launch_subagent('part 0'))" if node.turn == 0 else f"print({node.turn})"

    # The child has 4 s to finish (its REPL worker starts slowly on a loaded machine); its verdict
    # takes 6 s, so it comes back after the tree has timed out, whatever the load.
    judge = SlowJudge(seconds=6.0)
    nodes = judged_tree(judge, CellScript(stalling, latency_s=0.3), tree_timeout_s=4.0, max_steps=100)
    assert nodes["tree"].status == "timeout" and nodes["say ok"].status == "timeout"
    assert nodes["say ok"].ended_at < min(judge.returned_at)
    assert (nodes["part 0"].success, nodes["part 0"].success_source) == (1.0, "judge")


def test_a_rubric_of_your_own_is_the_system_prompt_and_keys_the_cache(tmp_path):
    """judge.rubric: the file's text is what the judge model reads, and its digest names the rubric
    in every verdict and in the cache key, so verdicts under another rubric are never reused."""
    from rao_core.policy import Generation, Policy
    from rao_core.verdicts import rubric_version

    class Grader(Policy):
        prompts: list[str] = []

        async def generate(self, request):
            self.prompts.append(CHAT.tokenizer.decode(request.prompt_ids))
            return Generation(text='{"success": true, "score": 1.0, "reason": "kind"}')

    rubric = "Grade kindly. Reply with one JSON object: success, score, reason."
    (tmp_path / "rubric.txt").write_text(rubric)
    assert load_config(
        overrides=[f"judge.rubric={tmp_path / 'rubric.txt'}", "judge.kind=scripted"]
    ).judge.rubric
    with pytest.raises(ConfigError, match="judge.rubric: .*file not found"):
        load_config(overrides=[f"judge.rubric={tmp_path / 'nope.txt'}"])
    cache = JudgeCache(tmp_path / "cache")
    mine = ModelJudge(Grader(), CHAT.tokenizer, "m", cache=cache, rubric=rubric)
    verdict = asyncio.run(mine.judge("g", "a"))
    assert "Grade kindly" in Grader.prompts[-1] and RUBRIC[:40] not in Grader.prompts[-1]
    assert json.loads(verdict.verdict)["rubric"] == rubric_version(rubric) != RUBRIC_VERSION
    builtin = ModelJudge(Grader(), CHAT.tokenizer, "m", cache=cache)
    assert not asyncio.run(builtin.judge("g", "a")).cached  # another rubric: asked again
    assert asyncio.run(mine.judge("g", "a")).cached
    assert build_judge(JudgeConfig(kind="scripted", rubric=str(tmp_path / "rubric.txt")), None) is not None
