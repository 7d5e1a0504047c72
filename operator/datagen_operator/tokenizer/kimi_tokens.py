"""The Kimi-K2 family's special and structural tokens, as data (tokenizer_config.json `added_tokens_decoder` of
https://huggingface.co/moonshotai/Kimi-K2.5).

`special` is the tokenizer's flag: True means `skip_special_tokens` drops the token from decoded text.
The think and tool-call tokens are NOT special, so they survive decoding; `<|im_end|>` is.
"""

from __future__ import annotations

from typing import Final, NamedTuple


class KimiToken(NamedTuple):
    content: str
    id: int
    special: bool


VOCAB_SIZE: Final = 163_840
FIRST_SPECIAL_ID: Final = 163_584  # ids below are regular (byte-level BPE); 163584..163839 are added tokens

BOS: Final = KimiToken("[BOS]", 163_584, True)
EOS: Final = KimiToken("[EOS]", 163_585, True)  # the tokenizer's eos_token; generation stops at IM_END
IM_END: Final = KimiToken("<|im_end|>", 163_586, True)
IM_USER: Final = KimiToken("<|im_user|>", 163_587, True)
IM_ASSISTANT: Final = KimiToken("<|im_assistant|>", 163_588, True)
EOT: Final = KimiToken("[EOT]", 163_593, True)
IM_SYSTEM: Final = KimiToken("<|im_system|>", 163_594, True)
TOOL_CALLS_SECTION_BEGIN: Final = KimiToken("<|tool_calls_section_begin|>", 163_595, False)
TOOL_CALLS_SECTION_END: Final = KimiToken("<|tool_calls_section_end|>", 163_596, False)
TOOL_CALL_BEGIN: Final = KimiToken("<|tool_call_begin|>", 163_597, False)
TOOL_CALL_ARGUMENT_BEGIN: Final = KimiToken("<|tool_call_argument_begin|>", 163_598, False)
TOOL_CALL_END: Final = KimiToken("<|tool_call_end|>", 163_599, False)
IM_MIDDLE: Final = KimiToken("<|im_middle|>", 163_601, True)
THINK: Final = KimiToken("<think>", 163_606, False)
THINK_END: Final = KimiToken("</think>", 163_607, False)
UNK: Final = KimiToken("[UNK]", 163_838, True)
PAD: Final = KimiToken("[PAD]", 163_839, True)

NAMED_TOKENS: Final[tuple[KimiToken, ...]] = (
    BOS, EOS, IM_END, IM_USER, IM_ASSISTANT, EOT, IM_SYSTEM, TOOL_CALLS_SECTION_BEGIN, TOOL_CALLS_SECTION_END,
    TOOL_CALL_BEGIN, TOOL_CALL_ARGUMENT_BEGIN, TOOL_CALL_END, IM_MIDDLE, THINK, THINK_END, UNK, PAD,
)  # fmt: skip


def reserved_token_content(token_id: int) -> str:
    """The name Kimi's tokenizer gives an unnamed id of the special range."""
    return f"<|reserved_token_{token_id}|>"


def added_tokens() -> list[KimiToken]:
    """All 256 ids of the special range, named ones at their real id, the rest reserved (special)."""
    named = {token.id: token for token in NAMED_TOKENS}
    return [
        named.get(token_id, KimiToken(reserved_token_content(token_id), token_id, True))
        for token_id in range(FIRST_SPECIAL_ID, VOCAB_SIZE)
    ]
