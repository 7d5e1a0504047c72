"""Reference data the tokenizer and worker tests share, written out apart from the package's own tables."""

from __future__ import annotations

from typing import Any

# (content, id, special) as tokenizer_config.json `added_tokens_decoder` of moonshotai/Kimi-K2.5 lists them
# (https://huggingface.co/moonshotai/Kimi-K2.5), written out apart from tokenizer/kimi_tokens.py.
REFERENCE_TABLE: list[tuple[str, int, bool]] = [
    ("[BOS]", 163584, True), ("[EOS]", 163585, True), ("<|im_end|>", 163586, True),
    ("<|im_user|>", 163587, True), ("<|im_assistant|>", 163588, True), ("[EOT]", 163593, True),
    ("<|im_system|>", 163594, True), ("<|tool_calls_section_begin|>", 163595, False),
    ("<|tool_calls_section_end|>", 163596, False), ("<|tool_call_begin|>", 163597, False),
    ("<|tool_call_argument_begin|>", 163598, False), ("<|tool_call_end|>", 163599, False),
    ("<|im_middle|>", 163601, True), ("<think>", 163606, False), ("</think>", 163607, False),
    ("[UNK]", 163838, True), ("[PAD]", 163839, True),
]  # fmt: skip

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]
