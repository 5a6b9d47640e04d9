"""The built-in suites' own settings (`suite_args.*`), each suite's `Args` as a plugin suite has
its own (rao_core/envs/suites.py names them). Kept apart from the suites' packages so that
loading a configuration does not import a suite's machinery.

TextCraft's tasks are seeded by the run's `tasks.seed` (which also draws each round's tasks); its
world, Oolong's transcripts and DeepDive's graph have seeds of their own. Old configuration files
that held these under `world.*`, `tasks.*`, `oolong.*` and `deepdive.*` are migrated at load
(migrate_suite_settings, below).
"""

from __future__ import annotations

import warnings
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from rao_core.config import ConfigError, ConfigWarning
from rao_core.config.types import Float, Fraction, Int, NumberList, opt


class TextCraftArgs(BaseModel):
    """TextCraft-Synth, reference profile: the world generator (reference: seed 42, 5 domains,
    tiers 0..12, 25 items) and the tasks synthesized over it."""

    model_config = ConfigDict(extra="forbid")

    world_seed: Int = opt(42, "seed of the world generator")
    domains: Int = opt(5, "number of material domains", ge=1, le=5)
    max_tier: Int = opt(12, "highest tier; tier 0 holds base materials", ge=2, le=12)
    items_per_tier: Int = opt(25, "items per domain at tier 0; higher tiers hold fewer", ge=2)
    cross_domain_items: Int = opt(6, "items at tiers >= 10 that combine several domains", ge=0)
    tasks_per_item: Int = opt(2, "tasks generated per target item", ge=1)
    max_count: Int = opt(2, "copies of the target to craft: 1..max_count", ge=1)
    val_fraction: Fraction = opt(0.2, "fraction of items per tier held out for validation")
    buffer_max: Float = opt(0.5, "base materials get a random 0..buffer_max extra", ge=0)
    distractors: Annotated[list[Annotated[Int, Field(ge=0)]], NumberList] = opt(
        [1, 3], "min and max distractor base items in the inventory", min_length=2, max_length=2
    )

    @field_validator("distractors")
    @classmethod
    def _ordered(cls, value: list[int]) -> list[int]:
        if value[0] > value[1]:
            raise ValueError("must be [min, max] with min <= max")
        return value


class SmallArgs(BaseModel):
    """TextCraft-Synth, small-model profile: tasks of a fresh tiny world each."""

    model_config = ConfigDict(extra="forbid")

    tasks_per_difficulty: Int = opt(300, "tasks per difficulty and split, one world each", ge=1)


class OolongArgs(BaseModel):
    """Oolong-style long-context aggregation: seeded tabletop-RPG session transcripts with exact
    answers (or the real oolong-real rows), held in the REPL variable `context`, never in the prompt."""

    model_config = ConfigDict(extra="forbid")

    seed: Int = opt(0, "seed of transcripts and questions")
    tasks_per_difficulty: Int = opt(
        16, "synthetic tasks per difficulty and split, spread over its buckets", ge=1
    )
    difficulty_tokens: dict[
        Literal["easy", "medium", "hard", "extreme"], list[Annotated[Int, Field(ge=256)]]
    ] = opt(
        {"easy": [2048, 4096], "medium": [8192, 16384], "hard": [32768], "extreme": [65536]},
        "transcript length buckets (approximate tokens) of each difficulty",
    )
    chars_per_token: Float = opt(4.0, "characters per token that size the buckets (English BPE: ~4)", gt=0)
    speakers: Int = opt(4, "player characters per transcript (the DM speaks too)", ge=2, le=12)
    chunk_chars: Int = opt(32000, "scripted expert: characters per chunk it reads or delegates", ge=500)
    real_path: str = opt(
        "", "local oolong-real (dnd) .jsonl/.json/.parquet file or folder: its rows become the val split"
    )

    @field_validator("difficulty_tokens")
    @classmethod
    def _buckets(cls, value: dict[str, list[int]]) -> dict[str, list[int]]:
        empty = [d for d, sizes in value.items() if not sizes]
        if empty:
            raise ValueError(f"{empty[0]}: []: must be a non-empty list of ints >= 256")
        return value


class DeepDiveArgs(BaseModel):
    """DeepDive-style deep search: a seeded knowledge graph rendered as a local web corpus, BM25
    search over it, and multi-hop questions (hops 1..4 = easy..extreme) with exact answers."""

    model_config = ConfigDict(extra="forbid")

    seed: Int = opt(0, "seed of the graph, the corpus and the questions")
    people: Int = opt(240, "person entities", ge=8)
    organisations: Int = opt(90, "organisation entities", ge=8)
    places: Int = opt(70, "place entities", ge=8)
    works: Int = opt(160, "work entities (novels, films, albums, plays)", ge=8)
    near_duplicates: Float = opt(
        0.15, "share of entities that get a near-namesake distractor page", ge=0, le=1
    )
    questions_per_difficulty: Int = opt(120, "questions generated per hop count (difficulty)", ge=1)
    val_fraction: Fraction = opt(0.2, "share of start entities held out for validation")
    max_results: Int = opt(5, "search_web: default number of results", ge=1)
    page_chars: Int = opt(3000, "view_webpage_content: characters returned per call", ge=200)
    backend: str = opt("bm25", "search backend: bm25 (local corpus) or 'module:factory' (real backend)")
    real_path: str = opt("", "real DeepDive data (parquet/jsonl/json file or folder); empty: synthetic")
    real_split: str = opt("qa_rl", "split of the real dataset folder to read (qa_rl or qa_sft)")


# -- old configuration files ------------------------------------------------------------------------
# The settings above were sections of the run configuration once (world.*, tasks.*, oolong.*,
# deepdive.*). Old key -> (the suite that reads it, its name in suite_args); tasks.seed stayed.
_OOLONG = ("seed", "tasks_per_difficulty", "difficulty_tokens", "chars_per_token", "speakers", "chunk_chars",
           "real_path")  # fmt: skip
_DEEPDIVE = ("seed", "people", "organisations", "places", "works", "near_duplicates", "questions_per_difficulty",
             "val_fraction", "max_results", "page_chars", "backend", "real_path", "real_split")  # fmt: skip
MOVED_TO_SUITE_ARGS = {
    "world.seed": ("textcraft", "world_seed"),
    **{f"world.{k}": ("textcraft", k) for k in ("domains", "max_tier", "items_per_tier", "cross_domain_items")},
    **{f"tasks.{k}": ("textcraft", k) for k in ("tasks_per_item", "max_count", "val_fraction", "buffer_max", "distractors")},
    "tasks.small_tasks_per_difficulty": ("textcraft-small", "tasks_per_difficulty"),
    **{f"oolong.{k}": ("oolong", k) for k in _OOLONG},
    **{f"deepdive.{k}": ("deepdive", k) for k in _DEEPDIVE},
}  # fmt: skip
RETIRED_SECTIONS = {"world": "textcraft", "oolong": "oolong", "deepdive": "deepdive"}


def migrate_suite_settings(data: dict, suite: object, strict: bool = False) -> dict:
    """A configuration layer of an older version, as today's (as layout.py migrates an old run
    folder): a built-in suite's settings moved into `suite_args` when `suite` is the run's suite,
    dropped otherwise (a saved config.yaml lists every section). `strict` (a --set the user
    typed): the move warns, and a moved key the run's suite does not read, or an unknown one in a
    retired section, is a ConfigError naming its new home."""
    data = dict(data)
    moved: dict = {}
    for section in ("tasks", *RETIRED_SECTIONS):
        if not isinstance(data.get(section), dict):
            continue
        kept = {}
        for key, value in data[section].items():
            owner, new = MOVED_TO_SUITE_ARGS.get(f"{section}.{key}", (RETIRED_SECTIONS.get(section), None))
            if owner is None:  # tasks.seed, or a key the schema will judge
                kept[key] = value
            elif owner == suite and new is not None:
                moved[new] = value
                if strict:
                    warnings.warn(f"{section}.{key} is now suite_args.{new}", ConfigWarning, stacklevel=2)
            elif strict and new is None:
                raise ConfigError(
                    f"{section}.{key}: unknown field (suite {owner}'s settings are suite_args.*: "
                    f"rao config --explain suite_args --set suite={owner})"
                )
            elif strict:
                raise ConfigError(
                    f"{section}.{key}: moved to suite_args.{new} of suite {owner} (this run's suite is "
                    f"{suite}: rao config --explain suite_args lists its settings)"
                )
        if section == "tasks" and kept:
            data[section] = kept
        else:
            del data[section]
    if moved:  # (a suite_args that is no mapping was refused before: load_config)
        data["suite_args"] = {**moved, **data.get("suite_args", {})}  # the new key wins
    return data


def moved_hint(key: str) -> str | None:
    """Where an old section or key went (`rao config --explain world`), or None."""
    owner = RETIRED_SECTIONS.get(key) or MOVED_TO_SUITE_ARGS.get(key, (None,))[0]
    if owner is None:
        return None
    return (
        f"{key!r}: moved into suite {owner}'s settings: rao config --explain suite_args --set suite={owner}"
    )
