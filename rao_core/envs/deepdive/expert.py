"""A scripted expert for DeepDive that writes real cells, hop by hop, recursive or flat.

It knows the graph (an oracle, like the TextCraft expert knows recipes): it reads its node's goal
back into a chain (start entity + relations) and knows which page holds each fact. Every action
still goes through the REPL and the real tools, and it only moves on when the fact is on the page
it was shown, so its trees exercise search, pages, launches and scoring as a model's would.

  recursive root: one `await launch_subagent("Find <hop phrase>.")` per turn, hop k+1 naming the
                  entity hop k returned (chained: nothing runs in parallel), then finish(answer)
  sub-agent / flat: per hop, search_web -> view_webpage_content of the subject's page -> next hop;
                  finish(name) after the last

With `error_rate` > 0 it makes plausible mistakes: a misspelt query (costs turns) or, a quarter as
often, answering with another name from the page (a failed node).
"""

from __future__ import annotations

import re

from rao_core.envs.deepdive.corpus import url_of
from rao_core.envs.deepdive.env import DeepDiveEnv
from rao_core.envs.deepdive.graph import RELATIONS, Entity, Graph
from rao_core.envs.expert import ScriptedExpert
from rao_core.policy import NodeState

_READ_ON = re.compile(r"view_webpage_content\('([^']+)', start=(\d+)\)\]$")
GIVE_UP = "I could not find the answer."


def attribute_query(e: Entity) -> str:
    """Search terms for an entity known only by its description: its attribute values."""
    a = e.attrs
    if e.kind == "person":
        return f"{a['occupation']} born {a['birth_year']} {a['award'] or ''}".strip()
    if e.kind == "organisation":
        return f"{a['industry']} company founded {a['founded_year']}"
    if e.kind == "place":
        return f"{a['place_kind']} founded {a['founded_year']}"
    return f"{a['year']} {a['genre']} {a['work_kind']}"


class DeepDiveExpert(ScriptedExpert):
    def __init__(
        self,
        graph: Graph,
        error_rate: float = 0.0,
        latency_s: float = 0.0,
        reply_format: str = "thought_python",
    ) -> None:
        super().__init__(error_rate, latency_s, reply_format)
        self.g = graph

    # -- decisions -------------------------------------------------------------------------
    def next_cell(self, node: NodeState) -> tuple[str, str]:
        env: DeepDiveEnv = node.env  # type: ignore[assignment]
        chain, mem = env.chain, node.memory
        if chain is None:
            return "I cannot read this goal as a chain of facts.", f"finish({GIVE_UP!r})"
        if not mem:
            steps = chain.relations or [None]  # no relation: identify the described entity itself
            can_delegate = node.recursive and node.depth < node.max_depth
            mem.update(steps=steps, hop=0, cur=chain.start, stage="search", tries=0)
            mem["direct"] = not (can_delegate and (node.depth == 0 or len(chain.relations) > 1))
        if mem["direct"]:
            return self._direct(node, env)
        return self._delegate(node, env)

    def _subject_text(self, env: DeepDiveEnv, mem: dict) -> str:
        chain = env.chain
        first = mem["hop"] == 0 and chain is not None and chain.description
        return chain.description if first else self.g[mem["cur"]].name

    def _delegate(self, node: NodeState, env: DeepDiveEnv) -> tuple[str, str]:
        mem = node.memory
        if mem.get("launched"):  # the observation is the last sub-agent's finish message
            mem["launched"] = False
            eid = self.g.by_name.get(node.last_observation.strip().lower())
            if eid is None:  # it failed or was refused: do this hop myself
                mem["direct"] = True
                return self._direct(node, env)
            mem["cur"], mem["hop"] = eid, mem["hop"] + 1
        if mem["hop"] == len(mem["steps"]):
            return "Every hop is answered.", f"finish({self.g[mem['cur']].name!r})"
        rel = mem["steps"][mem["hop"]]
        subject = self._subject_text(env, mem)
        goal = (
            f"Find {RELATIONS[rel].phrase.format(x=subject) if rel else subject}. Answer with the name only."
        )
        mem["launched"] = True
        var = f"answer_{mem['hop'] + 1}"
        why = "starts from the description" if mem["hop"] == 0 else "needs the previous answer"
        return (
            f"Hop {mem['hop'] + 1} of {len(mem['steps'])} {why}: delegate it.",
            f"{var} = await launch_subagent({goal!r})\nprint({var})",
        )

    def _direct(self, node: NodeState, env: DeepDiveEnv) -> tuple[str, str]:
        mem, obs = node.memory, node.last_observation
        if mem["hop"] == len(mem["steps"]):
            return "Every hop is answered.", f"finish({self.g[mem['cur']].name!r})"
        subject, rel = self.g[mem["cur"]], mem["steps"][mem["hop"]]
        if rel and self.g.follow(subject.id, rel) is None:  # a wrong earlier answer led here
            return f"{subject.name} has no such fact.", f"finish({GIVE_UP!r})"
        page = url_of(subject.name)
        if mem["stage"] == "view":
            if page in obs:
                mem["stage"] = "read"
                return (
                    f"The page of {subject.name} is in the results.",
                    f"print(view_webpage_content({page!r}))",
                )
            mem["stage"] = "search"
            if mem["tries"] >= 3:
                return "The page is not in any results.", f"finish({GIVE_UP!r})"
        if mem["stage"] == "read":
            target = self.g[self.g.follow(subject.id, rel)] if rel else subject
            if target.name in obs:
                mem["cur"], mem["hop"], mem["stage"], mem["tries"] = target.id, mem["hop"] + 1, "search", 0
                if mem["hop"] == len(mem["steps"]):
                    answer = target.name
                    if self._mistake(node, 0.25):  # another name from the page: a wrong answer
                        others = [self.g[d].name for d in target.links.values()] or [subject.name]
                        answer = others[0]
                    return f"The page says {target.name}.", f"finish({answer!r})"
            elif m := _READ_ON.search(obs):
                return (
                    "The fact may be further down the page.",
                    f"print(view_webpage_content({m[1]!r}, start={m[2]}))",
                )
            else:
                return "The page does not state it.", f"finish({GIVE_UP!r})"
            subject, rel = self.g[mem["cur"]], mem["steps"][mem["hop"]]
        first = mem["hop"] == 0 and env.chain is not None and env.chain.description
        query = (
            attribute_query(subject) if first else f"{subject.name} {RELATIONS[rel].keyword if rel else ''}"
        )
        if mem["tries"] > 0 and subject.name in obs:  # a snippet named it (a list page): search the name
            query = subject.name
        elif mem["tries"] > 0:  # else search the bare name or the description's own words
            query = subject.name if not first else self._subject_text(env, mem)
        if self._mistake(node):
            query = query[:-3]  # a cut-off query: often misses, costs a turn
        mem["stage"], mem["tries"] = "view", mem["tries"] + 1
        code = f"results = search_web({query.strip()!r})\nfor r in results:\n    print(r['title'], '|', r['url'], '|', r['snippet'])"
        return f"Search for {'the described entity' if first else subject.name}.", code
