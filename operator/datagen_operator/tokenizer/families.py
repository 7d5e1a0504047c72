"""Model families as data: the tokenizer a stand-in must reproduce and the raw-token shape the model writes.

One `Family` per stand-in tokenizer. The stand-in builder (standin.py) reads the tokenizer half (ids, `special`
flags, bos/eos/pad, template, config.json and generation_config.json); the simulator (engine/sim) reads the
`ChatFormat` half (what the model writes around its reasoning, answer and tool calls, and how the rendered
prompt says whether it should think). Pure data, cheap to import.

Sources of the ids (a checked id names its source; the rest are marked unverified and the presets leave
them null, so a run resolves them from the model's own tokenizer):
 [kimi-format]  moonshotai/Kimi-K2.5's published files (https://huggingface.co/moonshotai/Kimi-K2.5):
                tokenizer_config.json added_tokens_decoder (ids 163584..163839, `special` flags),
                config.json eos_token_id 163586 (<|im_end|>), chat_template.jinja (the message format and
                the `thinking` switch); K2.6 and K2-Thinking share the vocabulary
 [qwen3-files]  Qwen3 tokenizer_config.json/config.json (added_tokens_decoder 151643..151668, eos 151645,
                vocab_size 151936), as reproduced in github.com/akougkas/warpio-cli
                warpio-docs/ai-docs/model_cards/qwen3:4b.md
 [sglang-budget] SGLang 0.5.23 sglang/srt/sampling/custom_logit_processor.py: GLM-4.5 <think>/</think>
                151350/151351, Qwen3 151667/151668, DeepSeek-R1 128798/128799
 [ds-tools]     FastDeploy tests/entrypoints/openai/tool_parsers (DeepSeek vocab: tool tokens 128806..128809,
                <｜tool▁sep｜> 128814); DeepSeek's <｜User｜> 128803 / <｜Assistant｜> 128804 / <|EOT|> 128805
                and 128810..128813 as listed for the DeepSeek-V3 vocabulary layout by later DeepSeek
                tokenizers; placeholders <｜place▁holder▁no▁N｜> = 128000+N (llama.cpp load log)
 [glm-stops]    GLM-4 family generation_config eos_token_id [151329, 151336, 151338]
                (<|endoftext|>, <|user|>, <|observation|>)
 [harmony]      gpt-oss tokenizer_config.json added_tokens_decoder (199998..200018, bos <|startoftext|>,
                eos <|return|>, pad <|endoftext|>) and openai/gpt-oss gpt_oss/tokenizer.py (o200k_harmony,
                reserved ids up to 201087)

Chat templates: each stand-in's renders what the model's published template renders through transformers
(tests/unit/tokenizer/test_real_templates.py compares them over a set of conversations, with the published copies in
llama-cpp-python's sdist), but for the tools DeepSeek-R1 and gpt-oss declare, which the simulator reads, and
conversations a published template refuses, which the stand-ins render. DeepSeek-R1's is held to the R1
release's template (0528's own is not there). Kimi-K2.5/K2.6 (kimi-k2) and Qwen3-2507 have no published copy
there: kimi-k2's follows [kimi-format]; 2507's is the Qwen3 one with its opener.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal, NamedTuple

from datagen_operator.tokenizer import kimi_tokens

ReasoningFormat = Literal["think-tags", "harmony", "none"]
ToolCallFormat = Literal["kimi_k2", "qwen", "deepseek_v3", "glm45", "harmony"]
ToolDeclaration = Literal["json", "typescript"]


class AddedToken(NamedTuple):
    content: str
    id: int
    special: bool
    """The tokenizer's flag: True means `skip_special_tokens` drops the token from decoded text."""


@dataclass(frozen=True)
class ChatFormat:
    """What the model writes, as text around the corpus slices, and how the prompt tail sets thinking.

    Think-tag families: `[think_open] reasoning think_close answer [tool call] stop`. Harmony: the same slots
    hold `<|channel|>analysis<|message|>`, `<|end|>`, and a final or commentary message.
    """

    reasoning: ReasoningFormat
    think_open: str = ""
    """What the model writes to open reasoning when the prompt did not."""
    think_close: str = ""
    answer_open: str = ""
    """Written before the answer when something precedes it in the output (harmony's next message header)."""
    answer_open_first: str = ""
    """Written before the answer when it is the first thing in the output."""
    answer_stop: str = ""
    tool_stop: str = ""
    """The stop token after a tool call (GLM: <|observation|>, harmony: <|call|>)."""
    prefill_tails: tuple[str, ...] = ()
    """Prompt endings meaning the template opened reasoning (the output starts inside it)."""
    off_tails: tuple[str, ...] = ()
    """Prompt endings meaning the template turned thinking off (an empty reasoning block)."""
    thinks_unprompted: bool = False
    """Whether the model reasons when the prompt tail neither opens reasoning nor turns it off."""
    tool_call_format: ToolCallFormat = "kimi_k2"
    tool_declaration: ToolDeclaration = "json"
    tool_declare_open: str = ""
    tool_declare_close: str = ""
    """Text around the tools the template declares (the simulator reads them to make tool calls)."""
    tool_declare_gate: str = ""
    """Tokens every prompt that declares tools holds, bounded by added tokens so they encode the same anywhere:
    the simulator decodes a prompt to look for tools only when their ids occur (cheap on the hot path)."""
    vocabulary_markers: tuple[str, ...] = ()
    """Token contents that identify this family's vocabulary (for a directory that names no family)."""


@dataclass(frozen=True)
class Family:
    name: str
    description: str
    tokenizer_size: int
    """Ids the tokenizer knows (regular and added)."""
    added_ranges: tuple[tuple[int, int], ...]
    """[start, stop) id ranges of added tokens; ids in them that `named` lacks are reserved tokens."""
    named: tuple[AddedToken, ...]
    reserved_name: Callable[[int], str]
    reserved_special: bool
    bos: str | None
    eos: str
    pad: str | None
    unk: str | None
    template: str
    """The chat template's package resource."""
    template_edits: tuple[tuple[str, str], ...] = ()
    """(old, new) text replacements turning a shared template into this family's (each must occur once)."""
    model_config: Mapping[str, Any] = field(default_factory=dict)
    generation_config: Mapping[str, Any] = field(default_factory=dict)
    model_max_length: int = 131_072
    chat: ChatFormat = field(default_factory=lambda: ChatFormat("none"))

    def added_tokens(self) -> list[AddedToken]:
        """Every added id in order: named tokens at their id, the rest reserved."""
        named = {token.id: token for token in self.named}
        return [
            named.get(token_id, AddedToken(self.reserved_name(token_id), token_id, self.reserved_special))
            for start, stop in self.added_ranges
            for token_id in range(start, stop)
        ]

    def token_id(self, content: str) -> int:
        return next(token.id for token in self.named if token.content == content)


# -- Kimi-K2 [kimi-format] -------------------------------------------------------------------------------------
KIMI_NAMED = tuple(AddedToken(*token) for token in kimi_tokens.NAMED_TOKENS)
_KIMI_FORMAT = ChatFormat(
    reasoning="think-tags",
    think_open="<think>",
    think_close="</think>",
    answer_stop="<|im_end|>",
    tool_stop="<|im_end|>",
    prefill_tails=("<think>",),
    off_tails=("<think></think>",),
    thinks_unprompted=True,
    tool_call_format="kimi_k2",
    tool_declare_open="<|im_system|>tool_declare<|im_middle|>",
    tool_declare_gate="<|im_system|>tool_declare<|im_middle|>",
    tool_declare_close="<|im_end|>",
    vocabulary_markers=("<|im_middle|>", "<|tool_calls_section_begin|>"),
)
_KIMI = Family(
    name="kimi-k2",
    description="Kimi-K2.5/K2.6: the template opens <think> (the `thinking` switch renders <think></think>)",
    tokenizer_size=kimi_tokens.VOCAB_SIZE,
    added_ranges=((kimi_tokens.FIRST_SPECIAL_ID, kimi_tokens.VOCAB_SIZE),),
    named=KIMI_NAMED,
    reserved_name=kimi_tokens.reserved_token_content,
    reserved_special=True,
    bos="[BOS]",
    eos="[EOS]",
    pad="[PAD]",
    unk="[UNK]",
    template="kimi_k2_chat_template.jinja",  # not compared with a published one: none at hand (module docstring)
    model_config={
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        "vocab_size": 163_840,
        "bos_token_id": 163_584,
        "eos_token_id": 163_586,
        "pad_token_id": 163_839,
        "max_position_embeddings": 262_144,
    },
    generation_config={"bos_token_id": 163_584, "eos_token_id": 163_586},
    model_max_length=262_144,
    chat=_KIMI_FORMAT,
)

# -- Qwen3 [qwen3-files] [sglang-budget] -------------------------------------------------------------------------
_QWEN_SPECIAL = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>",
    "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>",
    "<|image_pad|>", "<|video_pad|>",
)  # fmt: skip
_QWEN_REGULAR = (
    "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
    "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>", "<think>", "</think>",
)  # fmt: skip
QWEN_NAMED = tuple(
    AddedToken(content, 151_643 + index, index < len(_QWEN_SPECIAL))
    for index, content in enumerate(_QWEN_SPECIAL + _QWEN_REGULAR)
)
QWEN_HYBRID_TAIL = """\
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\\n\\n</think>\\n\\n' }}
    {%- endif %}"""
_QWEN_FORMAT = ChatFormat(
    reasoning="think-tags",
    think_open="<think>\n",
    think_close="\n</think>\n\n",
    answer_stop="<|im_end|>",
    tool_stop="<|im_end|>",
    off_tails=("<think>\n\n</think>\n\n",),
    thinks_unprompted=True,
    tool_call_format="qwen",
    tool_declare_open="\n<tools>\n",
    tool_declare_close="\n</tools>",
    vocabulary_markers=("<|im_start|>", "<tool_call>", "<think>"),
    tool_declare_gate="<tool_call>",
)
_QWEN_CONFIG = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "model_type": "qwen3_moe",
    "vocab_size": 151_936,
    "bos_token_id": 151_643,
    "eos_token_id": 151_645,
    "max_position_embeddings": 40_960,
}
_QWEN3 = Family(
    name="qwen3",
    description="Qwen3 hybrid: enable_thinking (off renders an empty <think> block); the model opens <think>",
    tokenizer_size=151_669,
    added_ranges=((151_643, 151_669),),
    named=QWEN_NAMED,
    reserved_name=lambda token_id: f"<|reserved_{token_id}|>",
    reserved_special=True,
    bos=None,
    eos="<|im_end|>",
    pad="<|endoftext|>",
    unk=None,
    template="qwen3_chat_template.jinja",
    model_config=_QWEN_CONFIG,
    generation_config={"bos_token_id": 151_643, "eos_token_id": [151_645, 151_643], "pad_token_id": 151_643},
    model_max_length=40_960,
    chat=_QWEN_FORMAT,
)
_QWEN3_THINKING_2507 = replace(
    _QWEN3,
    name="qwen3-thinking-2507",
    description="Qwen3-*-Thinking-2507: the template ends the prompt with <think> and a newline",
    template_edits=((QWEN_HYBRID_TAIL, "    {{- '<think>\\n' }}"),),
    model_config={**_QWEN_CONFIG, "max_position_embeddings": 262_144},
    model_max_length=262_144,
    chat=replace(_QWEN_FORMAT, prefill_tails=("<think>\n",), off_tails=()),
)

# -- DeepSeek-R1-0528 (DeepSeek-V3 vocabulary) [sglang-budget] [ds-tools] --------------------------------------
DEEPSEEK_NAMED = (
    AddedToken("<｜begin▁of▁sentence｜>", 0, True),
    AddedToken("<｜end▁of▁sentence｜>", 1, True),
    AddedToken("<｜▁pad▁｜>", 2, True),
    AddedToken("<think>", 128_798, False),
    AddedToken("</think>", 128_799, False),
    AddedToken("<｜fim▁hole｜>", 128_800, False),
    AddedToken("<｜fim▁begin｜>", 128_801, False),
    AddedToken("<｜fim▁end｜>", 128_802, False),
    AddedToken("<｜User｜>", 128_803, False),
    AddedToken("<｜Assistant｜>", 128_804, False),
    AddedToken("<|EOT|>", 128_805, True),
    AddedToken("<｜tool▁calls▁begin｜>", 128_806, False),
    AddedToken("<｜tool▁calls▁end｜>", 128_807, False),
    AddedToken("<｜tool▁call▁begin｜>", 128_808, False),
    AddedToken("<｜tool▁call▁end｜>", 128_809, False),
    AddedToken("<｜tool▁outputs▁begin｜>", 128_810, False),
    AddedToken("<｜tool▁outputs▁end｜>", 128_811, False),
    AddedToken("<｜tool▁output▁begin｜>", 128_812, False),
    AddedToken("<｜tool▁output▁end｜>", 128_813, False),
    AddedToken("<｜tool▁sep｜>", 128_814, False),
)
_DEEPSEEK_R1 = Family(
    name="deepseek-r1",
    description="DeepSeek-R1-0528: the template opens <think> and a newline; tool calls in the DeepSeek-V3 format",
    tokenizer_size=128_815,
    added_ranges=((0, 3), (128_000, 128_815)),
    named=DEEPSEEK_NAMED,
    reserved_name=lambda token_id: f"<｜place▁holder▁no▁{token_id - 128_000}｜>",
    reserved_special=True,
    bos="<｜begin▁of▁sentence｜>",
    eos="<｜end▁of▁sentence｜>",
    pad="<｜end▁of▁sentence｜>",
    unk=None,
    template="deepseek_r1_chat_template.jinja",
    model_config={
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        "vocab_size": 129_280,
        "bos_token_id": 0,
        "eos_token_id": 1,
        "max_position_embeddings": 163_840,
    },
    generation_config={"bos_token_id": 0, "eos_token_id": 1},
    model_max_length=163_840,
    chat=ChatFormat(
        reasoning="think-tags",
        think_open="<think>\n",
        think_close="\n</think>\n\n",
        answer_stop="<｜end▁of▁sentence｜>",
        tool_stop="<｜end▁of▁sentence｜>",
        prefill_tails=("<think>\n",),
        thinks_unprompted=True,
        tool_call_format="deepseek_v3",
        tool_declare_open="## Tools\n",
        tool_declare_close="\n## End of tools",
        tool_declare_gate="<｜tool▁calls▁begin｜>",
        vocabulary_markers=("<｜Assistant｜>", "<｜tool▁calls▁begin｜>"),
    ),
)

# -- GLM-4.5 [glm-stops] [sglang-budget]; role, tool and argument ids between them unverified --------------------
_GLM_CONTENTS = (
    ("<|endoftext|>", True), ("[MASK]", True), ("[gMASK]", True), ("[sMASK]", True), ("<sop>", True),
    ("<eop>", True), ("<|system|>", True), ("<|user|>", True), ("<|assistant|>", True), ("<|observation|>", True),
    ("<|begin_of_image|>", True), ("<|end_of_image|>", True), ("<|begin_of_video|>", True),
    ("<|end_of_video|>", True), ("<|begin_of_audio|>", True), ("<|end_of_audio|>", True),
    ("<|begin_of_transcription|>", True), ("<|end_of_transcription|>", True), ("<|code_prefix|>", True),
    ("<|code_middle|>", True), ("<|code_suffix|>", True), ("<think>", False), ("</think>", False),
    ("<tool_call>", False), ("</tool_call>", False), ("<tool_response>", False), ("</tool_response>", False),
    ("<arg_key>", False), ("</arg_key>", False), ("<arg_value>", False), ("</arg_value>", False),
    ("/nothink", False), ("<|begin_of_box|>", True), ("<|end_of_box|>", True), ("<|image|>", True),
    ("<|video|>", True),
)  # fmt: skip
GLM_NAMED = tuple(
    AddedToken(content, 151_329 + index, special) for index, (content, special) in enumerate(_GLM_CONTENTS)
)
_GLM45 = Family(
    name="glm-4.5",
    description="GLM-4.5 hybrid: enable_thinking (off renders <think></think>); XML-style tool calls",
    tokenizer_size=151_329 + len(_GLM_CONTENTS),
    added_ranges=((151_329, 151_329 + len(_GLM_CONTENTS)),),
    named=GLM_NAMED,
    reserved_name=lambda token_id: f"<|reserved_{token_id}|>",
    reserved_special=True,
    bos=None,
    eos="<|endoftext|>",
    pad="<|endoftext|>",
    unk=None,
    template="glm45_chat_template.jinja",
    model_config={
        "architectures": ["Glm4MoeForCausalLM"],
        "model_type": "glm4_moe",
        "vocab_size": 151_552,
        "eos_token_id": [151_329, 151_336, 151_338],
        "pad_token_id": 151_329,
        "max_position_embeddings": 131_072,
    },
    generation_config={"eos_token_id": [151_329, 151_336, 151_338], "pad_token_id": 151_329},
    chat=ChatFormat(
        reasoning="think-tags",
        think_open="<think>",
        think_close="</think>\n",
        answer_stop="<|user|>",
        tool_stop="<|observation|>",
        off_tails=("<think></think>",),
        thinks_unprompted=True,
        tool_call_format="glm45",
        tool_declare_open="\n<tools>\n",
        tool_declare_close="\n</tools>",
        vocabulary_markers=("<|assistant|>", "<|observation|>", "<arg_key>"),
        tool_declare_gate="<arg_key>",
    ),
)

# -- gpt-oss, harmony format [harmony] ---------------------------------------------------------------------------
_HARMONY_NAMED = (
    AddedToken("<|startoftext|>", 199_998, True),
    AddedToken("<|endoftext|>", 199_999, True),
    AddedToken("<|return|>", 200_002, True),
    AddedToken("<|constrain|>", 200_003, True),
    AddedToken("<|channel|>", 200_005, True),
    AddedToken("<|start|>", 200_006, True),
    AddedToken("<|end|>", 200_007, True),
    AddedToken("<|message|>", 200_008, True),
    AddedToken("<|call|>", 200_012, True),
    AddedToken("<|endofprompt|>", 200_018, True),
)
_GPT_OSS = Family(
    name="gpt-oss",
    description="gpt-oss: harmony format (analysis, commentary and final channels)",
    tokenizer_size=201_088,
    added_ranges=((199_998, 201_088),),
    named=_HARMONY_NAMED,
    reserved_name=lambda token_id: f"<|reserved_{token_id}|>",
    reserved_special=True,
    bos="<|startoftext|>",
    eos="<|return|>",
    pad="<|endoftext|>",
    unk=None,
    template="gpt_oss_chat_template.jinja",
    model_config={
        "architectures": ["GptOssForCausalLM"],
        "model_type": "gpt_oss",
        "vocab_size": 201_088,
        "eos_token_id": 200_002,
        "pad_token_id": 199_999,
        "max_position_embeddings": 131_072,
    },
    generation_config={"bos_token_id": 199_998, "eos_token_id": [200_002, 199_999, 200_012], "pad_token_id": 199_999},
    chat=ChatFormat(
        reasoning="harmony",
        think_open="<|channel|>analysis<|message|>",
        think_close="<|end|>",
        answer_open="<|start|>assistant<|channel|>final<|message|>",
        answer_open_first="<|channel|>final<|message|>",
        answer_stop="<|return|>",
        tool_stop="<|call|>",
        thinks_unprompted=True,
        tool_call_format="harmony",
        tool_declaration="typescript",
        tool_declare_open="namespace functions {",
        tool_declare_close="} // namespace functions",
        tool_declare_gate="<|start|>developer<|message|>",
        vocabulary_markers=("<|channel|>", "<|message|>", "<|start|>"),
    ),
)

FAMILIES: dict[str, Family] = {
    family.name: family
    for family in (
        _KIMI,
        replace(
            _KIMI,
            name="kimi-k2-thinking",
            description="Kimi-K2-Thinking: always thinks; the model writes <think> itself",
            # Its own template: K2-Thinking's default system prompt, call ids and history differ from K2.5's.
            template="kimi_k2_thinking_chat_template.jinja",
            chat=replace(_KIMI_FORMAT, prefill_tails=()),
        ),
        replace(
            _KIMI,
            name="kimi-k2-instruct",
            description="Kimi-K2-Instruct: no reasoning; tool calls in the Kimi-K2 format",
            # Its own template: no <think> anywhere, K2-Instruct's default system prompt and call ids.
            template="kimi_k2_instruct_chat_template.jinja",
            chat=replace(_KIMI_FORMAT, reasoning="none", prefill_tails=(), thinks_unprompted=False),
        ),
        _QWEN3,
        _QWEN3_THINKING_2507,
        _DEEPSEEK_R1,
        _GLM45,
        _GPT_OSS,
    )
}


def get_family(name: str) -> Family:
    try:
        return FAMILIES[name]
    except KeyError:
        raise KeyError(f"unknown model family {name!r}; known: {', '.join(FAMILIES)}") from None


def detect_family(vocabulary: Mapping[str, int]) -> Family | None:
    """The family whose marker tokens a vocabulary holds (the first family of its kind: a real Kimi directory
    is served as Kimi-K2.5, a Qwen3 one as the hybrid)."""
    for family in FAMILIES.values():
        if all(marker in vocabulary for marker in family.chat.vocabulary_markers):
            return family
    return None
