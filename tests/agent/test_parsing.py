from rao_core.agent.parsing import get_format, parse_reply
from rao_core.agent.prompts import ChatFraming, truncate
from rao_core.models.tokenizer import tiny_tokenizer


def test_thought_python_roundtrip():
    fmt = get_format("thought_python")
    reply = fmt.wrap("plan", "x = 1\nprint(x)")
    parsed = parse_reply(reply, fmt)
    assert (parsed.thought, parsed.code, parsed.error) == ("plan", "x = 1\nprint(x)", None)


def test_missing_and_empty_cells():
    fmt = get_format("thought_python")
    assert parse_reply("<thought>hm</thought> no code", fmt).error.startswith("Error: no Python cell")
    assert parse_reply("<python>\n\n</python>", fmt).error == "Error: the Python cell is empty."


def test_markdown_format():
    fmt = get_format("markdown")
    parsed = parse_reply("I will look.\n```python\nprint(1)\n```", fmt)
    assert parsed.code == "print(1)"


def test_framing_is_append_only():
    """Initial prompt + reply + observation tokens decode to the chat template's full rendering."""
    tok = tiny_tokenizer()
    chat = ChatFraming(tok)
    reply = "<thought>t</thought>\n<python>\nprint(2)\n</python>"
    ids = chat.initial_ids("SYS", "GOAL") + chat.encode(reply) + chat.observation_ids("2")
    full = tok.apply_chat_template(
        [
            {"role": "system", "content": "SYS"},
            {"role": "user", "content": "GOAL"},
            {"role": "assistant", "content": reply},
            {"role": "user", "content": "2"},
        ],
        tokenize=False,
        add_generation_prompt=True,
    )
    assert tok.decode(ids) == full


def test_truncate_keeps_head_and_tail():
    text = "a" * 100 + "b" * 100
    out = truncate(text, 60)
    assert out.startswith("a" * 40) and out.endswith("b" * 20) and "cut" in out
    assert truncate("short", 60) == "short"


def test_python_format():
    fmt = get_format("python")
    parsed = parse_reply(fmt.wrap("ignored", "info('a1')"), fmt)
    assert (parsed.code, parsed.thought) == ("info('a1')", "")
