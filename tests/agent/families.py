"""Tokenizers and tiny bf16 checkpoints with real model families' chat templates, built offline.

Each family is a BPE tokenizer trained here with the family's special tokens and a chat template
written after the family's own (Qwen3 with its thinking switch, Llama 3, and Gemma, whose template
refuses a system message), plus a random Qwen3-architecture model saved in bf16, as checkpoints ship.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from rao_core.models.tokenizer import default_corpus, train_tokenizer

QWEN3 = (
    "{%- if messages[0].role == 'system' %}{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}{%- endif %}"
    "{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}"
    "{%- for message in messages[::-1] %}{%- set index = (messages|length - 1) - loop.index0 %}"
    "{%- if ns.multi_step_tool and message.role == 'user' %}{%- set ns.multi_step_tool = false %}"
    "{%- set ns.last_query_index = index %}{%- endif %}{%- endfor %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}"
    "{%- elif message.role == 'assistant' %}{%- set content = message.content %}{%- set reasoning_content = '' %}"
    "{%- if '</think>' in content %}"
    "{%- set reasoning_content = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') %}{%- endif %}"
    "{%- if loop.index0 > ns.last_query_index %}"
    "{{- '<|im_start|>' + message.role + '\\n<think>\\n' + reasoning_content.strip('\\n') + '\\n</think>\\n\\n' + content.lstrip('\\n') }}"
    "{%- else %}{{- '<|im_start|>' + message.role + '\\n' + content }}{%- endif %}"
    "{{- '<|im_end|>\\n' }}{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}"
)
LLAMA3 = (
    "{{- bos_token }}"
    "{%- if messages[0]['role'] == 'system' %}{%- set system_message = messages[0]['content']|trim %}"
    "{%- set messages = messages[1:] %}{%- else %}{%- set system_message = '' %}{%- endif %}"
    "{{- '<|start_header_id|>system<|end_header_id|>\\n\\n' }}"
    "{{- 'Cutting Knowledge Date: December 2023\\nToday Date: 26 Jul 2024\\n\\n' }}"
    "{{- system_message }}{{- '<|eot_id|>' }}"
    "{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)
GEMMA = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}"
    "{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}{% endif %}"
    "{{ '<start_of_turn>' + role + '\\n' + message['content'] | trim + '<end_of_turn>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{'<start_of_turn>model\\n'}}{% endif %}"
)


@dataclass(frozen=True)
class Family:
    name: str
    template: str
    special: tuple[str, ...]
    eos: str
    pad: str
    bos: str | None = None
    stop: tuple[str, ...] = ()  # more end-of-turn tokens the model's generation config stops at
    kwargs: tuple[tuple[str, object], ...] = ()  # policy.chat_template_kwargs

    def tokenizer(self):
        return train_tokenizer(
            default_corpus(2000), 512, list(self.special), self.eos, self.pad, self.bos, self.template
        )


FAMILIES = {
    "qwen3": Family(
        "qwen3", QWEN3, ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"),
        "<|im_end|>", "<|endoftext|>", kwargs=(("enable_thinking", False),),
    ),
    "llama3": Family(
        "llama3", LLAMA3,
        ("<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"),
        "<|eot_id|>", "<|end_of_text|>", bos="<|begin_of_text|>",
    ),
    "gemma": Family(
        "gemma", GEMMA, ("<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>"),
        "<eos>", "<pad>", bos="<bos>", stop=("<end_of_turn>",),
    ),
}  # fmt: skip


def checkpoint(family: Family, path: Path, seed: int = 0) -> Path:
    """A random 2-layer Qwen3 on the family's tokenizer, saved in bf16 with its generation config."""
    tok = family.tokenizer()
    torch.manual_seed(seed)
    config = Qwen3Config(
        vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=32, max_position_embeddings=4096,
        tie_word_embeddings=True, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
    )  # fmt: skip
    model = Qwen3ForCausalLM(config)
    stops = [tok.eos_token_id, *tok.convert_tokens_to_ids(list(family.stop))]
    model.generation_config.eos_token_id = stops
    model.to(torch.bfloat16).save_pretrained(path)
    tok.save_pretrained(path)
    return path
