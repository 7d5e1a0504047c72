"""Which sglang.launch_server flags `spec.server.extraArgs` may not carry, and why: one table for
`datagen validate` and the CRD's CEL rules, so both refuse the same manifests at the same field.

Every SGLang flag that can change which tokens come out was reviewed (docs/data-args.md): it is refused
here, or the server fingerprint records it (`output/fingerprint.py`), so a resume under another value is
refused. SGLang's parser takes any unambiguous prefix of a flag (`--preferred-sampling` is
`--preferred-sampling-params`), so a prefix of a refused or managed flag is refused as that flag; no flag
SGLang reads exactly is such a prefix (tests/contract/test_data_args.py).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from datagen_operator.api.errors import FieldError

# Flags the operator sets from the spec, with their SGLang aliases: an extra arg naming one of these
# would silently override (or duplicate) a managed choice, so it is refused.
MANAGED_FLAGS: frozenset[str] = frozenset(
    {
        "--model-path", "--model", "--tp-size", "--tensor-parallel-size", "--dp-size", "--data-parallel-size",
        "--mem-fraction-static", "--reasoning-parser", "--tool-call-parser", "--host", "--port",
        "--served-model-name", "--trust-remote-code", "--enable-metrics", "--incremental-streaming-output",
        "--log-level", "--tokenizer-path", "--nnodes", "--node-rank", "--dist-init-addr", "--nccl-init-addr",
        "--attn-dp-size", "--attention-data-parallel-size", "--enable-dp-attention",
    }
)  # fmt: skip
MANAGED_REASON = (
    "is managed by the operator; set it through the spec (model.path, server.tensorParallel, server.nodes, "
    "server.attentionDataParallel, server.reasoningParser, ...) instead"
)

_CHAT_ONLY = (
    "the workers render prompts with the tokenizer's default template themselves, so the parser probe and the data "
    "would see different prompts"
)

# Flags refused because they would change the records without the spec saying so, or split what the
# server does from what the data records. Each reason ends with the fix.
REFUSED_FLAGS: dict[str, str] = {
    "--chat-template": (
        "changes only the server's chat endpoint: the workers render prompts with the template in the model "
        "directory, so the parser probe and the data would use different templates; put the template in the "
        "model directory (chat_template.jinja) or in model.tokenizerPath instead"
    ),
    "--hf-chat-template-name": (
        f"picks one of the tokenizer's templates for the server's chat endpoint only: {_CHAT_ONLY}; make the "
        "template you want the tokenizer's default (model.tokenizerPath) instead"
    ),
    "--default-chat-template-kwargs": (
        f"renders the server's chat endpoint with other template switches (enable_thinking, ...): {_CHAT_ONLY}; "
        "set generation.thinking instead"
    ),
    "--preferred-sampling-params": (
        "fills every request's unsent sampling keys on the server: records would be sampled with values the "
        "spec never names; set them in generation.sampling instead"
    ),
    "--sampling-defaults": (
        "chooses the sampling defaults of the server's chat endpoint only; the workers' /generate never takes "
        "the model's generation_config defaults: set the sampling in generation.sampling instead"
    ),
    "--enable-deterministic-inference": (
        "is set by the operator when generation.sampling.sampling_seed is set; without a seed SGLang gives "
        "every request seed 42, so the samples of one prompt would be identical: set sampling_seed instead"
    ),
    "--rl-on-policy-target": (
        "matches an RL trainer's numerics and turns on deterministic inference, which then gives every unseeded "
        "request seed 42 (identical samples per prompt); it cannot be used: for reproducible samples set "
        "generation.sampling.sampling_seed"
    ),
    "--enable-strict-thinking": (
        "masks tokens (tool-call markers, ...) while the model reasons, on every request: records would not be "
        "the model's own samples; it cannot be used"
    ),
    "--enable-watermark": (
        "lets the server watermark sampled tokens (Aaronson-Gumbel: the token is chosen by a keyed hash, on "
        "every request when the config says so); it cannot be used"
    ),
    "--watermark-config": (
        "configures watermarking of sampled tokens (the token is chosen by a keyed hash); it cannot be used"
    ),
    "--allow-auto-truncate": (
        "cuts prompts longer than the context, so a record's input_ids would not be the prompt the model saw; "
        "leave it out: over-long prompts are set aside as too_long"
    ),
    "--speculative-accept-threshold-single": (
        "accepts draft tokens the target model would not sample (below 1.0 speculative decoding is lossy); "
        "leave it out (1.0 keeps the target model's distribution)"
    ),
    "--speculative-accept-threshold-acc": (
        "raises the acceptance of draft tokens above their target probability (below 1.0 speculative decoding "
        "is lossy); leave it out (1.0 keeps the target model's distribution)"
    ),
    "--forward-hooks": (
        "attaches code to the model's layers that can change their outputs: the data must come from the "
        "model as loaded; it cannot be used"
    ),
    "--config": (
        "reads more flags from a file this check never sees (any flag refused here among them); put the flags "
        "in server.extraArgs instead"
    ),
}

SPECULATIVE_FLAG = "--speculative-algorithm"
# Sampling keys SGLang's speculative verify step does not honour exactly (speculative/eagle_utils.py,
# `eagle_sample`): it never applies min_p, and applies the penalties accumulated before a draft window
# (min_new_tokens' stop mask among them) to every token of it, "a relaxed version of penalties". Each with
# its neutral value (as if unset). temperature, top_p and top_k keep the target model's distribution.
SPECULATIVE_INEXACT_SAMPLING: dict[str, float] = {
    "min_p": 0.0,
    "frequency_penalty": 0.0,
    "presence_penalty": 0.0,
    "repetition_penalty": 1.0,
    "min_new_tokens": 0,
}


def flag_of(arg: str) -> str:
    """`--tp-size=4` and `--tp-size 4` name the same flag."""
    return arg.split("=", 1)[0]


def read_as(flag: str, flags: Iterable[str]) -> str | None:
    """The flag of `flags` SGLang's parser reads `flag` as: itself, or the one it is a prefix of."""
    known = sorted(flags)
    if flag in known:
        return flag
    if not flag.startswith("--") or len(flag) <= 2:
        return None
    return next((candidate for candidate in known if candidate.startswith(flag)), None)


def extra_arg_value(extra_args: list[str], target: str) -> str | None:
    """The value SGLang's parser takes for `target` from `extra_args` (`--x=v` or `--x v`, abbreviations
    included; the last one wins, as argparse does), or None when it is not given."""
    value = None
    for index, arg in enumerate(extra_args):
        if read_as(flag_of(arg), [target]) != target:
            continue
        if "=" in arg:
            value = arg.split("=", 1)[1]
        elif index + 1 < len(extra_args):
            value = extra_args[index + 1]
    return value


def _abbreviated(flag: str, target: str) -> str:
    return "" if flag == target else f"{flag} is read by SGLang as {target} (it takes any unambiguous prefix): "


def extra_arg_errors(extra_args: list[str]) -> list[FieldError]:
    errors = []
    for index, arg in enumerate(extra_args):
        flag = flag_of(arg)
        refused = read_as(flag, REFUSED_FLAGS)
        managed = read_as(flag, MANAGED_FLAGS)
        if refused is not None:
            message = f"{_abbreviated(flag, refused)}{refused} {REFUSED_FLAGS[refused]}"
            errors.append(FieldError(f"spec.server.extraArgs[{index}]", message))
        elif managed is not None:
            errors.append(FieldError(f"spec.server.extraArgs[{index}]", f"{flag} {MANAGED_REASON}"))
    return errors


def _speculative_message(key: str) -> str:
    how = {
        "min_p": "never applies min_p",
        "min_new_tokens": "masks stop tokens by a count kept per draft window, not per token",
    }.get(key, "applies the penalties of a draft window's start to all its tokens")
    return (
        f"{key} is not sampled as written under speculative decoding ({SPECULATIVE_FLAG} in server.extraArgs): "
        f"SGLang's verify step {how}; drop {key} or speculative decoding"
    )


def speculative_sampling_errors(extra_args: list[str], sampling: Mapping[str, Any]) -> list[FieldError]:
    """Speculative decoding keeps the target model's distribution only for temperature, top_p and top_k."""
    if not any(read_as(flag_of(arg), [SPECULATIVE_FLAG]) for arg in extra_args):
        return []
    return [
        FieldError(f"spec.generation.sampling.{key}", _speculative_message(key))
        for key, neutral in SPECULATIVE_INEXACT_SAMPLING.items()
        if sampling.get(key) is not None and sampling[key] != neutral
    ]


# CEL twins of `read_as` on an extraArgs item `self` (or `arg`): the part before `=`, of more than `--`,
# that is a prefix of the flag.
def _cel_reads_as(flag_expression: str, item: str = "self") -> str:
    part = f"{item}.split('=')[0]"
    return f"({item}.startsWith('--') && {part}.size() > 2 && {flag_expression}.startsWith({part}))"


def _cel_message(flag: str, reason: str) -> str:
    part = "self.split('=')[0]"
    abbreviated = f"{part} + {json.dumps(f' is read by SGLang as {flag} (it takes any unambiguous prefix): ')}"
    return f"({part} == {json.dumps(flag)} ? '' : {abbreviated}) + {json.dumps(f'{flag} {reason}')}"


def extra_arg_cel_rules() -> list[dict[str, Any]]:
    """The same refusals as CEL rules on each item (the API server then names `spec.server.extraArgs[i]`)."""
    rules = [
        {
            "rule": f"!{_cel_reads_as(json.dumps(flag))}",
            "messageExpression": _cel_message(flag, reason),
        }
        for flag, reason in REFUSED_FLAGS.items()
    ]
    managed = json.dumps(sorted(MANAGED_FLAGS))
    rules.append(
        {
            "rule": f"!{managed}.exists(flag, {_cel_reads_as('flag')})",
            "messageExpression": f"self.split('=')[0] + {json.dumps(' ' + MANAGED_REASON)}",
        }
    )
    return rules


def speculative_sampling_cel_rules() -> list[dict[str, Any]]:
    """`speculative_sampling_errors` as CEL rules on the spec, each naming its sampling field."""
    speculative = (
        f"has(self.server) && has(self.server.extraArgs) && "
        f"self.server.extraArgs.exists(arg, {_cel_reads_as(json.dumps(SPECULATIVE_FLAG), 'arg')})"
    )
    rules = []
    for key, neutral in SPECULATIVE_INEXACT_SAMPLING.items():
        field = f"self.generation.sampling.{key}"
        set_to_other = f"has(self.generation.sampling) && has({field}) && {field} != {json.dumps(neutral)}"
        rules.append(
            {
                "rule": f"!({set_to_other} && {speculative})",
                "message": _speculative_message(key),
                "fieldPath": f".generation.sampling.{key}",
                "reason": "FieldValueForbidden",
            }
        )
    return rules
