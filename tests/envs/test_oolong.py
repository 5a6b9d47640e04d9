"""The Oolong suite: transcripts, exact answers, buckets, the official scorer, the environment's
launch and judge contract, the oolong-real loader, and scripted trees through rollout, scoring
and evaluation."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rao_core.agent.parsing import get_format
from rao_core.agent.prompts import system_prompt, user_prompt
from rao_core.config import AgentConfig, ConfigError
from rao_core.envs.args import OolongArgs
from rao_core.envs.base import LaunchError
from rao_core.envs.oolong import (
    KINDS,
    OolongEnv,
    env_from_task,
    generate,
    load_real,
    load_tasks,
    make_tasks,
    match_subgoal,
    score_answer,
    score_partial,
    synthesize,
)
from rao_core.envs.oolong.extract import (
    SUBGOALS,
    boxed,
    chunk_size,
    parse_events,
    split_chunks,
    state_at,
    subgoal,
)
from rao_core.envs.oolong.questions import answer_from_log, candidate_args
from rao_core.envs.oolong.tasks import bucket_chars
from rao_core.envs.suites import open_suite
from rao_core.eval.metrics import load_round
from rao_core.run import Run, load_config
from rao_core.scoring import score_round
from rao_core.stages.evaluate import evaluate
from rao_core.stages.rollout import roll_out
from rao_core.store.parquet import read_partition

ROOT = Path(__file__).resolve().parents[2]
SMALL = OolongArgs(tasks_per_difficulty=9, difficulty_tokens={"easy": [2048], "medium": [8192]})


# --- generator ------------------------------------------------------------------------------
def test_generator_is_deterministic_and_splits_are_disjoint():
    a, b = generate("s1", 20000), generate("s1", 20000)
    assert a.text == b.text and a.events == b.events
    assert generate("s2", 20000).text != a.text
    train, val = make_tasks(SMALL, "train"), make_tasks(SMALL, "val")
    assert [t.context for t in train] == [t.context for t in make_tasks(SMALL, "train")]
    assert not {t.context for t in train} & {t.context for t in val}
    assert {t.split for t in train} == {"train"} and {t.split for t in val} == {"val"}


@pytest.mark.parametrize("seed, chars", [(0, 3000), (1, 8192), (2, 65536)])
def test_text_parses_back_to_the_log_whole_and_in_chunks(seed, chars):
    tr = generate(seed, chars)
    log = [e.as_list() for e in tr.events]
    assert parse_events(tr.text) == log and len(log) > 10
    for size in (500, 1777, 9000):
        chunks = split_chunks(tr.text, size)
        assert "".join(c for _, c in chunks) == tr.text and all(c.endswith("\n") for _, c in chunks)
        assert len(chunks) <= -(-len(tr.text) // size)
        parts = [e for a, c in chunks for e in parse_events(c, *state_at(tr.text[:a]))]
        assert parts == log


@pytest.mark.parametrize(
    "length, target, most, pieces", [(32753, 32000, 8, 2), (262103, 32000, 8, 8), (900, 2500, 8, 1)]
)
def test_chunks_are_balanced_and_capped(length, target, most, pieces):
    text = generate(5, length).text
    chunks = split_chunks(text, chunk_size(len(text), target, most))
    sizes = [len(c) for _, c in chunks]
    assert len(chunks) == pieces and max(sizes) - min(sizes) < 100 * pieces  # each overshoots < a line


def test_chatter_mentions_are_not_events():
    tr = generate(3, 40000)
    mentions = sum(tr.text.count(s) for s in ("Fireball", "Hex", "Bless", "Shield"))
    casts = sum(e.kind == "spell" and e.what in ("Fireball", "Hex", "Bless", "Shield") for e in tr.events)
    assert mentions > casts  # the text names spells more often than they are cast


def _independent_answer(kind: str, arg: str, events) -> object:
    """Each question recomputed straight from the log, without the suite's tally code."""
    rolls = [e for e in events if e.kind == "roll"]
    spells = [e for e in events if e.kind == "spell"]
    arrivals = [e for e in events if e.kind == "travel"]
    if kind == "nat20":
        return sum(1 for e in rolls if e.actor == arg and e.value == 20)
    if kind == "rolls":
        return sum(1 for e in rolls if e.actor == arg)
    if kind == "casts":
        return sum(1 for e in spells if e.what == arg)
    if kind in ("top_spell", "top_nat20"):
        c = (
            Counter(e.what for e in spells)
            if kind == "top_spell"
            else Counter(e.actor for e in rolls if e.value == 20)
        )
        top = c.most_common(2)
        return top[0][0] if top and (len(top) == 1 or top[0][1] > top[1][1]) else None
    if kind == "places":
        return list(dict.fromkeys(e.what for e in arrivals)) or None
    if kind == "spells_by":
        return list(dict.fromkeys(e.what for e in spells if e.actor == arg)) or None
    if kind == "first_spell":
        return next((e.what for e in spells if e.session == int(arg)), None)
    return next((e.day for e in arrivals if e.what == arg), None)


@pytest.mark.parametrize("seed", range(4))
def test_answers_match_the_log(seed):
    tr = generate(seed, 30000)
    for kind in KINDS:
        for arg in candidate_args(kind, tr):
            expect = _independent_answer(kind, arg, tr.events)
            got = answer_from_log(kind, arg, tr)
            assert (got or None) == expect, (kind, arg)


def test_stored_tasks_carry_exact_answers_and_every_kind():
    tasks = make_tasks(SMALL, "train")
    assert {t.kind for t in tasks} == set(KINDS)
    for t in tasks:
        i, tokens = int(t.task_id.rsplit("-", 1)[1]), SMALL.difficulty_tokens[t.difficulty][0]
        tr = generate(f"{SMALL.seed}:train:{t.difficulty}:{i}", bucket_chars(tokens, SMALL))
        expect = _independent_answer(t.kind, t.arg, tr.events)
        assert tr.text == t.context and expect is not None and t.answer == expect


def test_buckets_hit_their_target_sizes():
    cfg = OolongArgs()
    for difficulty, sizes in cfg.difficulty_tokens.items():
        for tokens in sizes:
            target = bucket_chars(tokens, cfg)
            n = len(generate(f"b{tokens}", target).text)
            assert target - 200 < n <= target, (difficulty, tokens, n)
    assert bucket_chars(65536, cfg) == 262144  # 64K tokens at 4 characters per token


# --- scorer ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "message, gold, expect",
    [
        ("\\boxed{5}", 5, 1.0),
        ("So the answer is \\boxed{3}.", 5, 0.5625),  # 0.75 ** 2
        ("\\boxed{-2}", 2, 0.31640625),  # 0.75 ** 4
        ("\\boxed{1,000}", 1000, 1.0),
        ("\\boxed{4} no wait \\boxed{5}", 5, 1.0),  # the last box counts
        ("\\boxed{five}", 5, 0.0),
        ("5", 5, 0.0),  # no box
        ("\\boxed{ fireBALL }", "Fireball", 1.0),
        ("\\boxed{Fireball.}", "Fireball", 1.0),
        ("\\boxed{Fire ball}", "Fireball", 0.0),
        ("\\boxed{Ravenhollow, Emberfall}", ["Ravenhollow", "Emberfall", "Saltmarsh"], 2 / 3),
        (
            "\\boxed{[emberfall,RAVENHOLLOW, Saltmarsh, Oakshade]}",
            ["Ravenhollow", "Emberfall", "Saltmarsh"],
            1.0,
        ),
        ("\\boxed{Oakshade}", ["Ravenhollow", "Emberfall"], 0.0),
        ("\\boxed{Port Kessel, Port Kessel}", ["Port Kessel", "Duskmere"], 0.5),
    ],
)
def test_official_scoring_rule(message, gold, expect):
    assert score_answer(message, gold) == pytest.approx(expect)


def test_partial_results_score_against_the_reference():
    assert score_partial('{"count": 3}', {"count": 4}) == 0.75
    assert score_partial('Result: {"count": 4} done', {"count": 4}) == 1.0
    assert score_partial('{"count": "4"}', {"count": 4}) == 0.0
    assert score_partial('{"hex": 2, "Bless": 0, "FIREBALL": 1}', {"Fireball": 1, "Hex": 2}) == 1.0
    assert score_partial('["Oakshade"]', ["Oakshade", "Duskmere"]) == 0.0
    assert score_partial("not json", ["Oakshade"]) == 0.0


# --- environment ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def task():
    return next(t for t in make_tasks(SMALL, "val") if t.difficulty == "medium")


def test_context_lives_in_the_repl_never_in_the_prompt(task):
    env = env_from_task(task)
    cfg = AgentConfig()
    for recursive in (True, False):
        prompt = system_prompt(env, get_format("thought_python"), cfg, recursive) + user_prompt(env, 0, cfg)
        assert task.question in prompt and f"{len(task.context):,} characters" in prompt
        lines = [ln for ln in task.context.splitlines() if len(ln) > 20]
        assert not any(ln in prompt for ln in lines) and len(prompt) < len(task.context) / 4
    assert env.repl_variables() == {"context": task.context} and env.context_chars() == len(task.context)
    child = env.fork("Count how many times each spell was cast.", context=task.context[:1000])
    assert (
        task.context[:1000] not in child.goal_text()
        and child.repl_variables()["context"] == task.context[:1000]
    )


@pytest.mark.parametrize(
    "args, kwargs, message",
    [
        ((), {"context": "x"}, "goal must be a non-empty string"),
        (("  ",), {"context": "x"}, "goal must be a non-empty string"),
        ((3,), {"context": "x"}, "goal must be a non-empty string"),
        (("g" * 5000,), {"context": "x"}, "pass data as context="),
        (("count rolls",), {}, "context must be a non-empty string"),
        (("count rolls",), {"context": ""}, "context must be a non-empty string"),
        (("count rolls",), {"context": ["a", "b"]}, "context must be a non-empty string"),
    ],
)
def test_launch_arguments_are_validated(task, args, kwargs, message):
    with pytest.raises(LaunchError, match=message):
        env_from_task(task).fork(*args, **kwargs)


def test_subgoal_templates_round_trip():
    for sub in SUBGOALS:
        goal = subgoal(sub, "Magic Missile", 3, 17)
        sub2, arg, session, day = match_subgoal("  " + goal.replace(" ", "\n ", 2))
        assert sub2 == sub
        if "{arg}" in SUBGOALS[sub][0]:
            assert arg == "Magic Missile"
        if "{session}" in SUBGOALS[sub][0]:
            assert (session, day) == (3, 17)
    assert match_subgoal("Summarise your chunk.") is None


def test_child_success_fallback_and_judge_inputs(task):
    root = env_from_task(task)
    a, chunk = split_chunks(task.context, 3000)[1]
    session, day = state_at(task.context[:a])
    child = root.fork(subgoal("spell_timeline", "", session, day), context=chunk)
    truth = [[e[1], e[4]] for e in parse_events(task.context) if e[0] == "spell"]
    mine = [[e[1], e[4]] for e in parse_events(chunk, session, day) if e[0] == "spell"]
    assert mine and all(x in truth for x in mine) and child.reference == mine
    assert child.success(True, json.dumps(mine)) == 1.0 and child.success(True, json.dumps(mine[1:])) == 0.0
    assert child.success(False, json.dumps(mine)) == 0.0
    inputs = child.judge_inputs(True, json.dumps(mine))
    assert json.loads(inputs["reference"]) == mine and inputs["goal"] == child.goal
    count = root.fork(
        subgoal("rolls", "Vex"), context="Vex: (rolls d20 for Stealth) 4\nVex: Natural 20 on Attack!\n"
    )
    assert count.success(True, '{"count": 1}') == 0.75 and count.success(True, '{"count": 2}') == 1.0
    free = root.fork("Tell me who talks most.", context=chunk)
    assert free.judge_inputs(True, "Vex") == {"goal": "Tell me who talks most.", "answer": "Vex"}
    assert free.success(True, "Vex") == 1.0 and free.success(True, " ") == 0.0
    assert free.judge_inputs(False, "") is None and root.judge_inputs(True, "\\boxed{1}") is None
    assert root.success(True, boxed(task.answer)) == 1.0 and root.success(True, "\\boxed{}") == 0.0
    assert root.success(False, "") == 0.0 and isinstance(root, OolongEnv)


# --- the real data loader -------------------------------------------------------------------
REAL = [
    {"id": "q1", "context_window_text": "DM: Welcome.\n" * 20000, "question": "How many?", "answer": "7"},
    {"id": "q2", "context_window_text": "Vex: hi\n" * 500, "question": "Who?", "answer": ["Vex", "Orin"]},
    {"id": "q3", "context_window_text": "Orin: yo\n", "question": "Spell?", "answer": "['Hex', 'Bless']"},
    {"id": "q4", "context_window_text": "Orin: yo\n", "question": "Name?", "answer": "Sam Riegel"},
]


def test_real_loader_reads_jsonl_and_parquet(tmp_path):
    jsonl = tmp_path / "validation.jsonl"
    jsonl.write_text("\n".join(json.dumps(r) for r in REAL) + "\n")
    tasks = load_real(jsonl, OolongArgs())
    assert [t.answer for t in tasks] == [7, ["Vex", "Orin"], ["Hex", "Bless"], "Sam Riegel"]
    assert [t.question for t in tasks] == ["How many?", "Who?", "Spell?", "Name?"]
    assert tasks[0].context == REAL[0]["context_window_text"] and {t.split for t in tasks} == {"val"}
    assert tasks[0].difficulty == "extreme" and tasks[2].difficulty == "easy"  # 260K chars ~ 65K tokens
    folder = tmp_path / "shards"
    folder.mkdir()
    pq.write_table(pa.Table.from_pylist([REAL[0], REAL[2]]), folder / "test-00000.parquet")
    pq.write_table(pa.Table.from_pylist([REAL[3]]), folder / "test-00001.parquet")
    assert [t.answer for t in load_real(folder, OolongArgs())] == [7, ["Hex", "Bless"], "Sam Riegel"]
    cfg = OolongArgs(tasks_per_difficulty=1, difficulty_tokens={"easy": [1024]}, real_path=str(jsonl))
    synthesize(cfg, tmp_path / "data")  # the real rows become the val split, train stays synthetic
    val, train = (
        load_tasks(tmp_path / "data" / "val.parquet"),
        load_tasks(tmp_path / "data" / "train.parquet"),
    )
    assert [(t.task_id, t.answer) for t in val] == [(t.task_id, t.answer) for t in tasks]
    assert len(train) == 1 and train[0].kind in KINDS


def test_real_loader_fails_with_one_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"context": "x", "question": "q", "answer": "1"}) + "\n")
    (tmp_path / "notes.txt").write_text("hello")
    (tmp_path / "broken.json").write_text("{not json")
    cases = [
        (tmp_path / "missing.jsonl", "does not exist"),
        (tmp_path / "notes.txt", "expected a .jsonl, .json, .parquet file"),
        (bad, "lacks context_window_text"),
        (tmp_path / "broken.json", "cannot read"),
    ]
    for path, why in cases:
        with pytest.raises(ConfigError, match=why) as e:
            load_real(path, OolongArgs())
        assert str(e.value).startswith("suite_args.real_path: ") and "\n" not in str(e.value)


# --- config ---------------------------------------------------------------------------------
def test_suite_defaults_and_shipped_config():
    cfg = load_config(overrides=["suite=oolong"])
    assert (cfg.scoring.lam, cfg.agent.max_depth) == (0.4, 2)
    cfg = load_config(overrides=["suite=oolong", "scoring.lam=0.1", "agent.max_depth=3"])
    assert (cfg.scoring.lam, cfg.agent.max_depth) == (0.1, 3)
    assert load_config().scoring.lam == 0.0  # other suites keep the global defaults
    shipped = load_config(ROOT / "configs" / "oolong-synth.yaml")
    assert shipped.suite == "oolong" and (shipped.scoring.lam, shipped.agent.max_depth) == (0.4, 2)
    with pytest.raises(
        ConfigError, match="suite_args.difficulty_tokens.tiny: 'tiny': input should be 'easy'"
    ):
        load_config(overrides=["suite=oolong", "suite_args.difficulty_tokens={tiny: [1000]}"])
    with pytest.raises(
        ConfigError,
        match=r"suite_args.difficulty_tokens.easy.0: 100: input should be greater than or equal to 256",
    ):
        load_config(overrides=["suite=oolong", "suite_args.difficulty_tokens={easy: [100]}"])


# --- end to end -----------------------------------------------------------------------------
E2E = [
    "suite=oolong",
    "policy.kind=scripted",
    "policy.model=tiny",
    "policy.error_rate=0",
    "agent.reply_format=thought_python",
    "agent.max_context_tokens=16384",
    "agent.cell_timeout_s=10",
    "suite_args.tasks_per_difficulty=3",
    "suite_args.difficulty_tokens={easy: [2048], medium: [4096]}",
    "suite_args.chunk_chars=2500",
    "rollout.difficulty=easy,medium",
    "rollout.num_tasks=3",
    "rollout.group_size=2",
    "eval.difficulty=easy,medium",
    "eval.num_tasks=2",
]


def test_scripted_trees_through_rollout_scoring_and_eval(tmp_path):
    cfg = load_config(overrides=[f"runs_dir={tmp_path}", *E2E])
    roll_out(Run(cfg), 0)
    rows = load_round(cfg.layout, 0).to_pylist()
    roots = [r for r in rows if r["depth"] == 0]
    children = [r for r in rows if r["depth"] == 1]
    assert len(roots) == 6 and all(r["success"] == 1.0 and r["children"] >= 2 for r in roots)
    assert children and all(r["success"] == 1.0 and r["status"] == "finished" for r in children)
    assert all(r["context_chars"] < 3500 for r in children) and all(
        "\\boxed{" in r["finish_message"] for r in roots
    )
    assert all(r["suite"] == "oolong" and r["depth"] <= 2 for r in rows)
    contexts = {t.task_id: t.context for t in open_suite(cfg).tasks("train")}
    assert all(
        contexts[r["task_id"]][-1000:] not in r["transcript"] for r in roots
    )  # only its head was printed
    scores = read_partition(score_round(cfg.run_dir, 0, cfg.scoring), "scores").to_pylist()
    kids = Counter(r["parent_id"] for r in rows if r["parent_id"])
    for s in scores:
        if s["depth"] == 0:  # Eq. 1 with the suite's lambda: 1 + 0.4 * mean of the children's 1.0
            assert s["reward"] == pytest.approx(1.0 + 0.4 * (kids[s["node_id"]] > 0))
    summary = evaluate(Run(cfg), 0)
    assert summary["easy"]["trees"] == 2 and summary["easy"]["success"] == 1.0
    assert summary["medium"]["success"] == 1.0 and summary["medium"]["root_delegation_rate"] == 1.0


def test_single_mode_expert_solves_alone_and_mistakes_cost_score(tmp_path):
    cfg = load_config(
        overrides=[f"runs_dir={tmp_path}", *E2E, "agent.mode=single", "agent.reply_format=python"]
    )
    roll_out(Run(cfg), 0)
    rows = load_round(cfg.layout, 0).to_pylist()
    assert {r["depth"] for r in rows} == {0} and all(r["success"] == 1.0 for r in rows)
    assert all(r["turns"] >= 3 for r in rows)  # inspect, at least one chunk, aggregate
    noisy = load_config(overrides=[f"runs_dir={tmp_path}", *E2E, "run_name=noisy", "policy.error_rate=0.6"])
    roll_out(Run(noisy), 0)
    scores = [r["success"] for r in load_round(noisy.layout, 0).to_pylist() if r["depth"] == 0]
    assert min(scores) < 1.0
