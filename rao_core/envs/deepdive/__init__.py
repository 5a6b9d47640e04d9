"""DeepDive-style deep search offline: a seeded knowledge graph rendered as a local web, BM25
search over it, multi-hop questions from random walks, a loader for the real data, and a scripted
hop-by-hop expert."""

from rao_core.envs.deepdive.answers import exact_match, normalize
from rao_core.envs.deepdive.corpus import Page, render_corpus
from rao_core.envs.deepdive.data import FILES, open_world, synthesize
from rao_core.envs.deepdive.env import DeepDiveEnv, DeepDiveWorld, env_from_task
from rao_core.envs.deepdive.graph import RELATIONS, Entity, Graph, generate_graph
from rao_core.envs.deepdive.questions import HOPS, Chain, Resolver, Task, load_tasks, make_tasks
from rao_core.envs.deepdive.real import load_real
from rao_core.envs.deepdive.search import BM25Backend, SearchBackend, load_backend
from rao_core.envs.deepdive.tools import WebTools

__all__ = [
    "FILES",
    "HOPS",
    "RELATIONS",
    "BM25Backend",
    "Chain",
    "DeepDiveEnv",
    "DeepDiveWorld",
    "Entity",
    "Graph",
    "Page",
    "Resolver",
    "SearchBackend",
    "Task",
    "WebTools",
    "env_from_task",
    "exact_match",
    "generate_graph",
    "load_backend",
    "load_real",
    "load_tasks",
    "make_tasks",
    "normalize",
    "open_world",
    "render_corpus",
    "synthesize",
]
