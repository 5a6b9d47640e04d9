"""A run's DeepDive data folder: written once by `synthesize`, then opened by every stage.

settings.json   the deepdive settings (suite_args) the folder was made with; the tools (backend, page_chars,
                max_results) are opened with it, so a run's trees all see the same web
graph.json      the knowledge graph (entities, attributes, relations, ghosts)
pages.parquet   the local web: url, title, text, entity_id
train.parquet   questions (synthetic walks, or the real DeepDive rows when suite_args.real_path is set)
val.parquet
"""

from __future__ import annotations

import json
from pathlib import Path

from rao_core.envs.args import DeepDiveArgs
from rao_core.envs.deepdive.corpus import load_pages, render_corpus, write_pages
from rao_core.envs.deepdive.env import DeepDiveWorld
from rao_core.envs.deepdive.graph import Graph, generate_graph
from rao_core.envs.deepdive.questions import make_tasks, write_tasks
from rao_core.envs.deepdive.real import load_real
from rao_core.envs.deepdive.search import load_backend
from rao_core.envs.deepdive.tools import WebTools
from rao_core.store.files import atomic_write

FILES = ("settings.json", "graph.json", "pages.parquet", "train.parquet", "val.parquet")


def synthesize(cfg: DeepDiveArgs, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    graph = generate_graph(cfg)
    tasks = load_real(cfg) if cfg.real_path else make_tasks(graph, cfg)
    atomic_write(out / "graph.json", lambda p: p.write_text(graph.to_json()))
    atomic_write(out / "pages.parquet", lambda p: write_pages(render_corpus(graph, cfg.seed), p))
    for split in ("train", "val"):
        atomic_write(
            out / f"{split}.parquet", lambda p, s=split: write_tasks([t for t in tasks if t.split == s], p)
        )
    made_with = json.dumps(cfg.model_dump(), indent=1)
    atomic_write(out / "settings.json", lambda p: p.write_text(made_with))  # last: marks the folder complete


def settings(data_dir: Path) -> DeepDiveArgs:
    return DeepDiveArgs.model_validate(json.loads((data_dir / "settings.json").read_text()))


def open_world(data_dir: Path, cfg: DeepDiveArgs | None = None) -> DeepDiveWorld:
    """The graph and the tools over the folder's backend (BM25 over pages.parquet by default)."""
    cfg = cfg or settings(data_dir)
    graph = Graph.from_json((data_dir / "graph.json").read_text())
    backend = load_backend(cfg.backend, load_pages(data_dir / "pages.parquet"), cfg)
    return DeepDiveWorld(graph, WebTools(backend, cfg.max_results, cfg.page_chars))
