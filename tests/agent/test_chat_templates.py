"""Real families' chat templates: what the sampler saw is exactly what the trainer trains on.

For a Qwen3-style template (thinking switched off through policy.chat_template_kwargs), a Llama 3
one and a Gemma one (no system role), a bf16 checkpoint is rolled out by the transformers engine,
scored, and read back as the trainer's rows: token for token the sampled conversation, with the
action mask on exactly the tokens the engine generated.
"""

from __future__ import annotations

from collections import defaultdict

import pyarrow.parquet as pq
import pytest

from rao_core.agent.prompts import ChatFraming
from rao_core.envs.suites import open_suite
from rao_core.policy import Generation, GenerationRequest, Policy
from rao_core.run import Run, load_config
from rao_core.stages import common
from rao_core.stages.rollout import roll_out
from rao_core.stages.score import score
from rao_core.train.samples import read_rows
from tests.agent.families import FAMILIES, checkpoint

# the framing each family gives a node: its start, and the tokens between two replies
OPENING = {
    "qwen3": ("<|im_start|>system\nYou are an agent", "<|im_start|>assistant\n<think>\n\n</think>\n\n"),
    "llama3": (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date",
        "<|start_header_id|>assistant<|end_header_id|>\n\n",
    ),
    "gemma": ("<bos><start_of_turn>user\nYou are an agent", "<start_of_turn>model\n"),
}
BETWEEN = {
    "qwen3": ("<|im_end|>\n<|im_start|>user\n", "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"),
    "llama3": ("<|eot_id|><|start_header_id|>user<|end_header_id|>\n\n", "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"),
    "gemma": ("<end_of_turn>\n<start_of_turn>user\n", "<end_of_turn>\n<start_of_turn>model\n"),
}  # fmt: skip


class Recorder(Policy):
    """The real engine, with every reply it gave kept by node."""

    def __init__(self, engine: Policy) -> None:
        self.engine, self.replies = engine, defaultdict(list)

    async def generate(self, request: GenerationRequest) -> Generation:
        g = await self.engine.generate(request)
        self.replies[request.node.node_id].append(g)
        return g

    async def close(self) -> None:
        await self.engine.close()


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_sampled_tokens_are_the_trained_tokens(name, tmp_path, monkeypatch):
    family = FAMILIES[name]
    model = checkpoint(family, tmp_path / name)
    kwargs = "{" + ", ".join(f"{k}: {str(v).lower()}" for k, v in family.kwargs) + "}"
    cfg = load_config(
        overrides=[
            f"runs_dir={tmp_path}", "run_name=r", f"policy.model={model}", f"policy.chat_template_kwargs={kwargs}",
            "agent.max_steps=3", "agent.max_new_tokens=12", "rollout.difficulty=medium",
            "rollout.num_tasks=1", "rollout.group_size=2", "scoring.zero_advantage_groups=keep",
            "policy.engine_processes=0",  # the engine here: its child processes sample the same (test_hf_process)
        ]
    )  # fmt: skip
    made = common.open_policy
    recorders = []

    def recording(*args, **kw):
        policy, tok = made(*args, **kw)
        recorders.append(Recorder(policy))
        return recorders[-1], tok

    monkeypatch.setattr(common, "open_policy", recording)
    open_suite(cfg)
    roll_out(Run(cfg), 0)
    score(Run(cfg), 0)

    tok = family.tokenizer()
    nodes = pq.read_table(cfg.run_dir / "rollouts/round=0/nodes.parquet").to_pylist()
    rows = {r.node_id: r for r in read_rows(cfg.run_dir, 0)}
    assert nodes and set(rows) == {n["node_id"] for n in nodes}
    start, header = OPENING[name]
    end, next_header = BETWEEN[name]
    for node in nodes:
        ids, mask = node["token_ids"], node["action_mask"]
        replies = recorders[0].replies[node["node_id"]]
        # the action mask is on exactly the generated tokens, in the order they were generated
        spans, i = [], 0
        while i < len(ids):
            j = i
            while j < len(ids) and mask[j] == mask[i]:
                j += 1
            spans.append((mask[i], ids[i:j]))
            i = j
        assert [s for m, s in spans if m] == [g.token_ids for g in replies]
        assert [lp for g in replies for lp in g.logprobs] == pytest.approx(
            [lp for lp, m in zip(node["logprobs"], mask, strict=True) if m]
        )
        # the family's framing around them, from its own template (with the template's arguments)
        opening = tok.decode(spans[0][1])
        assert opening.startswith(start) and opening.endswith(header), opening
        assert ("<start_of_turn>system" not in opening) if name == "gemma" else True
        turn_end = ChatFraming(tok, dict(family.kwargs)).turn_end
        for (_, reply), (m, between) in zip(spans[1::2], spans[2::2], strict=False):
            assert not m and tok.decode(between).endswith(next_header)
            ended = reply[-1] == turn_end  # the model closed its own turn: not closed twice
            assert tok.decode(reply[-1:] + between if ended else between).startswith(end)
        # the trainer reads the same sequence, mask and log-probs
        row = rows[node["node_id"]]
        assert list(row.token_ids) == ids and list(row.action_mask[1:]) == mask[1:]


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_framing_is_append_only_under_each_template(name):
    """Opening + reply + observation framing decode to the template's own rendering of the whole
    conversation (the system prompt folded into the first user turn where the template has no
    system role)."""
    family = FAMILIES[name]
    tok = family.tokenizer()
    kwargs = dict(family.kwargs)
    chat = ChatFraming(tok, kwargs)
    assert chat.system_role == (name != "gemma")
    reply = "<python>\nprint(2)\n</python>"
    ids = chat.initial_ids("SYS", "GOAL") + chat.encode(reply) + chat.observation_ids("2")
    messages = [
        *chat.opening("SYS", "GOAL"),
        {"role": "assistant", "content": reply},
        {"role": "user", "content": "2"},
    ]
    full = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **kwargs)
    if name == "qwen3":  # Qwen3's template drops the (empty) think block of earlier turns when it
        # renders a history; the model generated after it, so the conversation keeps it
        full = full.replace("assistant\n<python>", "assistant\n<think>\n\n</think>\n\n<python>", 1)
    assert tok.decode(ids) == full


def test_a_reply_that_ends_its_own_turn_is_not_ended_twice():
    family = FAMILIES["qwen3"]
    tok = family.tokenizer()
    chat = ChatFraming(tok, dict(family.kwargs))
    end = tok.convert_tokens_to_ids("<|im_end|>")
    reply = chat.encode("<python>\nprint(2)\n</python>")
    plain, after_eos = chat.observation_ids("2", reply), chat.observation_ids("2", [*reply, end])
    assert plain[0] == end and after_eos == plain[1:]
    assert tok.decode([*reply, end, *after_eos]) == tok.decode([*reply, *plain])


def test_template_kwargs_change_the_framing():
    family = FAMILIES["qwen3"]
    tok = family.tokenizer()
    thinking, plain = ChatFraming(tok), ChatFraming(tok, {"enable_thinking": False})
    assert not tok.decode(thinking.initial_ids("S", "U")).endswith("</think>\n\n")
    assert tok.decode(plain.initial_ids("S", "U")).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert plain.obs_suffix.endswith("</think>\n\n") and not thinking.obs_suffix.endswith("</think>\n\n")
