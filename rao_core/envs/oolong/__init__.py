"""Oolong-style long-context aggregation: seeded game-session transcripts with exact answers, the
environment that keeps them in the REPL variable `context`, the official scorer, a loader for the
real oolong-real rows, and a scripted chunk-and-delegate expert. See docs/suites.md."""

from rao_core.envs.oolong.data import synthesize
from rao_core.envs.oolong.env import OolongEnv, env_from_task
from rao_core.envs.oolong.questions import FAMILY, KINDS, QUESTIONS, Question, make_question, match_subgoal
from rao_core.envs.oolong.real import load_real
from rao_core.envs.oolong.scoring import extract_boxed, score_answer, score_partial
from rao_core.envs.oolong.tasks import Task, load_tasks, make_tasks, write_tasks
from rao_core.envs.oolong.transcript import Event, Transcript, generate

__all__ = [
    "FAMILY",
    "KINDS",
    "QUESTIONS",
    "Event",
    "OolongEnv",
    "Question",
    "Task",
    "Transcript",
    "env_from_task",
    "extract_boxed",
    "generate",
    "load_real",
    "load_tasks",
    "make_question",
    "make_tasks",
    "match_subgoal",
    "score_answer",
    "score_partial",
    "synthesize",
    "write_tasks",
]
