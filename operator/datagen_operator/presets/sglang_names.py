"""What the pinned SGLang release accepts, copied as data from its wheel.

`tests/unit/test_sglang_contract.py` re-reads these lists from the real wheel
(`pip download --no-deps sglang==PINNED_SGLANG_VERSION`, files `sglang/srt/parser/reasoning_parser_names.py`
and `sglang/srt/function_call/parser_names.py`) and fails when they drift.
"""

PINNED_SGLANG_VERSION = "0.5.23"
DEFAULT_SGLANG_IMAGE = f"lmsysorg/sglang:v{PINNED_SGLANG_VERSION}"

REASONING_PARSER_NAMES: tuple[str, ...] = (
    "apertus2509", "beam", "deepseek-r1", "deepseek-v3", "deepseek-v4", "deepseek-v41", "dots", "glm45",
    "ling3", "hunyuan", "gpt-oss", "k2_horizon", "kimi", "kimi_k2", "kimi_k3", "mimo", "muse",
    "poolside_v1", "qwen3", "qwen3-thinking", "minimax", "minimax-append-think", "minimax-m3", "nanbeige",
    "step3", "step3p5", "mistral", "nemotron_3", "granite_thinking_parser", "interns1", "gemma4",
    "inkling", "iquest_q1", "cohere_command4", "gigachat35", "response_template",
)  # fmt: skip

TOOL_CALL_PARSER_NAMES: tuple[str, ...] = (
    "apertus2509", "beam", "cohere_command4", "deepseekv3", "deepseekv31", "deepseekv32", "deepseekv4",
    "deepseekv41", "dots", "glm", "glm45", "glm47", "gpt-oss", "k2_horizon", "kimi_k2", "kimi_k3", "lfm2",
    "ling3", "llama3", "mimo", "minicpm5", "mistral", "muse", "poolside_v1", "pythonic", "qwen", "qwen25",
    "qwen3_coder", "spark25", "step3", "step3p5", "minimax-m2", "minimax-m3", "nanbeige", "trinity",
    "interns1", "hermes", "hunyuan", "gigachat3", "gigachat35", "gemma4", "inkling", "iquest_q1",
    "response_template",
)  # fmt: skip

# Tags each reasoning parser looks for (its detector's start and end tokens in
# sglang/srt/parser/reasoning_parser.py); `kimi` is the old ◁think▷ format that silently finds nothing in
# Kimi-K2 output. Only the parsers the presets and the simulator use are listed; which family
# writes which is presets/think_markers.py's to say (several parsers read `<think>`).
REASONING_PARSER_TAGS: dict[str, tuple[str, str]] = {
    "kimi_k2": ("<think>", "</think>"),
    "kimi": ("◁think▷", "◁/think▷"),
    "qwen3": ("<think>", "</think>"),
    "qwen3-thinking": ("<think>", "</think>"),
    "deepseek-r1": ("<think>", "</think>"),
    "deepseek-v3": ("<think>", "</think>"),
    "glm45": ("<think>", "</think>"),
    "minimax": ("<think>", "</think>"),
    "gpt-oss": ("<|channel|>analysis<|message|>", "<|end|>"),  # GptOssDetector: harmony's analysis channel
}

# Names SGLang rewrites while resolving its arguments (`handle_deprecated_args` in
# `sglang/srt/arg_groups/serving_hook.py`); `/server_info` reports the resolved name. The contract tests run
# SGLang's own resolution over every name of the lists above and fail when this table drifts from it.
RESOLVED_TOOL_CALL_PARSERS: dict[str, str] = {"qwen25": "qwen", "glm45": "glm"}
RESOLVED_REASONING_PARSERS: dict[str, str] = {}


def resolved_tool_call_parser(name: str | None) -> str | None:
    """The name `/server_info` reports for `--tool-call-parser name`."""
    return None if name is None else RESOLVED_TOOL_CALL_PARSERS.get(name, name)


def resolved_reasoning_parser(name: str | None) -> str | None:
    """The name `/server_info` reports for `--reasoning-parser name`."""
    return None if name is None else RESOLVED_REASONING_PARSERS.get(name, name)


# Added tokens SGLang 0.5.23 stops on besides the eos ids (`attach_additional_stop_token_ids` in
# sglang/srt/utils/hf_transformers/common.py, `_ADDITIONAL_STOP_TOKEN_TEXTS`): turn-final markers some
# checkpoints ship without eos metadata. tests/contract holds this equal to the wheel's own tuple.
SGLANG_ADDITIONAL_STOP_TEXTS: tuple[str, ...] = ("<|eom_id|>", "<|content_model_end_sampling|>", "<|ifm|im_end|>")
