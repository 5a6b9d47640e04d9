"""Verdicts: s(X) for nodes that have no exact verifier (Oolong and DeepDive sub-agents).

A judge reads a node's goal, its answer and, when the suite has one, a reference answer, and
returns a verdict: a strict JSON object {"success": true|false, "score": 0..1, "reason": "..."}.
s(X) is the score when success is true, else 0. Anything else the judge writes (free text, a
score out of range) becomes success 0 with the raw text kept in the verdict JSON. A judge whose
engine fails is retried (`judge.retries`, with backoff) and then raises JudgeError: the machine
failed, not the node, so its tree is left out of training (rao_core/errors.py).

The `Judge` interface the agent runtime scores nodes with, and `ScriptedJudge` (a deterministic
rule, for tests and scripted runs); `ModelJudge`, a language model handed an engine, is in
rao_core/judges.py, above the runtime.
Verdicts are cached by (rubric version, judge model, goal, answer, reference), in memory and in
append-only JSONL files under the run folder. See docs/judges.md.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import logging
import os
import re
import socket
import threading
import uuid
from abc import ABC, abstractmethod
from pathlib import Path

from rao_core.errors import JudgeError, retrying

# Bump when the rubric or the parsing rules change: old cached verdicts then stop matching.
RUBRIC_VERSION = "rubric-v1"
MAX_FIELD_CHARS = 6000  # goal, answer and reference are cut to this in the prompt (not in the key)
MAX_RAW_CHARS = 4000  # raw text of a malformed verdict kept in the verdict JSON
log = logging.getLogger(__name__)

RUBRIC = """You are a strict grader. An AI sub-agent was given a goal and returned an answer.
Decide whether the answer accomplishes the goal.

Rubric:
1. The answer must give exactly what the goal asks for (the right quantity, entity, list or format).
2. If a reference answer is given, the answer succeeds only if it agrees with the reference in
   substance; case, spacing and formatting may differ unless the goal asks for them.
3. Without a reference, judge whether the answer is correct, complete and supported by the work
   the goal describes. A guess, a refusal, or a report that the agent could not finish fails.
4. An answer that says it was obtained by keyword or regex matching instead of reading the
   material (or delegating the reading) fails.
5. score is the fraction of the goal achieved, from 0 to 1; success is true only if the answer
   is acceptable as a whole.

Reply with ONLY one JSON object and nothing else:
{"success": true or false, "score": a number from 0 to 1, "reason": "one short sentence"}"""


class VerdictError(ValueError):
    """The judge's text is not a well-formed verdict."""


@dataclasses.dataclass(frozen=True)
class Verdict:
    success: float  # s(X) in [0, 1]
    verdict: str  # the JSON text stored in nodes.judge_verdict
    cached: bool = False


_THINK = re.compile(r"\A\s*<think>.*?</think>", re.DOTALL)
_FENCE = re.compile(r"\A```(?:json)?\s*(.*?)\s*```\Z", re.DOTALL)


def parse_verdict(text: str) -> dict:
    """The verdict in `text`, which must be exactly one JSON object, optionally after a reasoning
    model's leading <think>...</think> block or inside one ```json fence. Strict, because a lenient
    parser (first {...} anywhere) would read a verdict out of a model's quoted examples or musings."""
    body = _THINK.sub("", text, count=1).strip()
    if m := _FENCE.match(body):
        body = m.group(1)
    try:
        data = json.loads(body)
    except json.JSONDecodeError as e:
        raise VerdictError(f"not one JSON object ({e.msg})") from None
    if not isinstance(data, dict):
        raise VerdictError("not a JSON object")
    success, score, reason = data.get("success"), data.get("score"), data.get("reason", "")
    if not isinstance(success, bool):
        raise VerdictError('"success" must be true or false')
    if isinstance(score, bool) or not isinstance(score, int | float) or not 0.0 <= score <= 1.0:
        raise VerdictError('"score" must be a number from 0 to 1')
    if not isinstance(reason, str):
        raise VerdictError('"reason" must be a string')
    return {"success": success, "score": float(score), "reason": reason}


def make_verdict(raw: str, judge: str, rubric: str = RUBRIC_VERSION) -> Verdict:
    """A Verdict from a judge's raw text; a malformed one is a failure that keeps the raw text."""
    try:
        v = parse_verdict(raw)
    except VerdictError as e:
        v = {"success": False, "score": 0.0, "reason": f"malformed verdict: {e}", "raw": raw[:MAX_RAW_CHARS]}
    v |= {"judge": judge, "rubric": rubric}
    return Verdict(v["score"] if v["success"] else 0.0, json.dumps(v))


def error_verdict(error: BaseException, judge: str = "") -> Verdict:
    """What a node's row keeps of a judge that failed (its tree is dropped): success 0, not cached."""
    v = {
        "success": False,
        "score": 0.0,
        "reason": "judge error",
        "error": f"{type(error).__name__}: {error}"[:500],
    }
    return Verdict(0.0, json.dumps(v | {"judge": judge, "rubric": RUBRIC_VERSION}))


def rubric_version(rubric: str) -> str:
    """The built-in rubric's name, or a digest of a rubric of your own (judge.rubric): a changed
    rubric never reuses the old one's cached verdicts."""
    return (
        RUBRIC_VERSION if rubric == RUBRIC else "sha256-" + hashlib.sha256(rubric.encode()).hexdigest()[:16]
    )


def cache_key(judge: str, goal: str, answer: str, reference: str | None, rubric: str = RUBRIC_VERSION) -> str:
    text = json.dumps([rubric, judge, goal, answer, reference])
    return hashlib.sha256(text.encode()).hexdigest()


class JudgeCache:
    """Verdicts by cache_key: a dict, plus JSONL files in `folder` when one is given.

    Why one file per writer: rollout shards run as parallel processes (Ray, maybe on several
    machines sharing the run folder), and appends of several writers to one file are atomic only
    on local disks. So each cache appends to a file of its own, made on its first verdict, one
    fsync'ed line per verdict; a crash can tear only that file's last line, which readers skip,
    and no file is ever rewritten. Opening a cache reads every file in the folder."""

    def __init__(self, folder: str | Path | None = None) -> None:
        self.memory: dict[str, Verdict] = {}
        self.folder = Path(folder) if folder is not None else None
        self.path: Path | None = None  # this writer's file
        self._lock = threading.Lock()
        if self.folder is not None:
            self.folder.mkdir(parents=True, exist_ok=True)
            for file in sorted(self.folder.glob("*.jsonl")):
                self._load(file)

    def _load(self, file: Path) -> None:
        for line in file.read_bytes().splitlines():
            try:
                entry = json.loads(line)
                self.memory[entry["key"]] = Verdict(float(entry["success"]), entry["verdict"])
            except (ValueError, KeyError, TypeError):  # a torn line: that verdict is asked again
                continue

    def get(self, key: str) -> Verdict | None:
        return self.memory.get(key)

    async def put(self, key: str, verdict: Verdict) -> None:
        self.memory[key] = verdict
        if self.folder is not None:
            line = json.dumps({"key": key, "success": verdict.success, "verdict": verdict.verdict}) + "\n"
            # In a thread (fsync blocks), shielded: a cancelled caller never leaves half a line.
            await asyncio.shield(asyncio.to_thread(self._append, line.encode()))

    def _append(self, data: bytes) -> None:
        assert self.folder is not None
        with self._lock:
            if self.path is None:
                self.path = self.folder / f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}.jsonl"
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
                try:
                    view = memoryview(data)
                    while view:
                        view = view[os.write(fd, view) :]
                    os.fsync(fd)
                finally:
                    os.close(fd)
            except OSError as e:  # disk full...: the verdict stays valid in memory; next line, new file
                self.path = None
                log.warning("judge cache: could not write %s: %s", self.folder, e)


class Judge(ABC):
    """judge(goal, answer, reference) -> Verdict; subclasses write only `reply` (the raw text)."""

    def __init__(
        self, name: str, cache: JudgeCache | None = None, attempts: int = 3, rubric: str = RUBRIC
    ) -> None:
        self.name = name  # the judge model's identity: part of the cache key and of every verdict
        self.cache = cache
        self.attempts = attempts
        self.rubric, self.rubric_version = rubric, rubric_version(rubric)

    @abstractmethod
    async def reply(self, goal: str, answer: str, reference: str | None) -> str:
        """The judge's raw verdict text."""

    async def judge(self, goal: str, answer: str, reference: str | None = None) -> Verdict:
        key = cache_key(self.name, goal, answer, reference, self.rubric_version)
        if self.cache is not None and (hit := self.cache.get(key)) is not None:
            return dataclasses.replace(hit, cached=True)
        try:
            raw = await retrying(self.attempts)(self.reply, goal, answer, reference)
        except Exception as e:  # not cached: the next call may succeed
            raise JudgeError(f"{self.name}: {type(e).__name__}: {e}") from e
        verdict = make_verdict(raw, self.name, self.rubric_version)
        if self.cache is not None:
            await self.cache.put(key, verdict)
        return verdict

    async def close(self) -> None:
        return None


def normalize(text: str) -> str:
    """Case-folded, whitespace collapsed, surrounding quotes and final period removed."""
    return " ".join(text.casefold().split()).strip("\"'").rstrip(".").strip()


class ScriptedJudge(Judge):
    """Deterministic rule. With a reference: success iff normalize(answer) == normalize(reference).
    Without one: success iff the answer is not empty after normalizing (a scripted run has nothing
    better to check; suites that can compute a reference should pass it)."""

    def __init__(self, cache: JudgeCache | None = None) -> None:
        super().__init__("scripted", cache, attempts=1)

    async def reply(self, goal: str, answer: str, reference: str | None) -> str:
        if reference is None:
            ok = bool(normalize(answer))
            reason = "non-empty answer (no reference given)" if ok else "empty answer"
        else:
            ok = normalize(answer) == normalize(reference)
            reason = "answer matches the reference" if ok else "answer differs from the reference"
        return json.dumps({"success": ok, "score": float(ok), "reason": reason})
