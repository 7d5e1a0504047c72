"""Which sglang.launch_server flags `spec.server.extraArgs` may not carry, and why: one table for
`datagen validate` and the CRD's CEL rules, so both refuse the same manifests at the same field."""

from __future__ import annotations

import json
from typing import Any

from datagen_operator.api.errors import FieldError

# Flags the operator sets from the spec, with their SGLang aliases: an extra arg naming one of these
# would silently override (or duplicate) a managed choice, so it is refused.
MANAGED_FLAGS: frozenset[str] = frozenset(
    {
        "--model-path", "--model", "--tp-size", "--tp", "--tensor-parallel-size", "--dp-size", "--dp",
        "--data-parallel-size", "--mem-fraction-static", "--reasoning-parser", "--tool-call-parser",
        "--host", "--port", "--served-model-name", "--trust-remote-code", "--enable-metrics",
        "--incremental-streaming-output", "--log-level", "--tokenizer-path", "--nnodes", "--node-rank",
        "--dist-init-addr", "--nccl-init-addr", "--attn-dp-size", "--attention-data-parallel-size",
        "--enable-dp-attention",
    }
)  # fmt: skip
MANAGED_REASON = (
    "is managed by the operator; set it through the spec (model.path, server.tensorParallel, server.nodes, "
    "server.attentionDataParallel, server.reasoningParser, ...) instead"
)

# Flags refused because they would split what the server does from what the data records.
REFUSED_FLAGS: dict[str, str] = {
    "--chat-template": (
        "changes only the server's chat endpoint: the workers render prompts with the template in the model "
        "directory, so the parser probe and the data would use different templates; put the template in the "
        "model directory (chat_template.jinja) or in model.tokenizerPath instead"
    ),
}


def flag_of(arg: str) -> str:
    """`--tp=4` and `--tp 4` name the same flag."""
    return arg.split("=", 1)[0]


def extra_arg_errors(extra_args: list[str]) -> list[FieldError]:
    errors = []
    for index, arg in enumerate(extra_args):
        flag = flag_of(arg)
        if flag in REFUSED_FLAGS:
            errors.append(FieldError(f"spec.server.extraArgs[{index}]", f"{flag} {REFUSED_FLAGS[flag]}"))
        elif flag in MANAGED_FLAGS:
            errors.append(FieldError(f"spec.server.extraArgs[{index}]", f"{flag} {MANAGED_REASON}"))
    return errors


def _flag_pattern(flags: list[str]) -> str:
    return "^(" + "|".join(sorted(flags)) + ")(=.*)?$"


def extra_arg_cel_rules() -> list[dict[str, Any]]:
    """The same refusals as CEL rules on each item (the API server then names `spec.server.extraArgs[i]`)."""
    rules = [
        {"rule": f"!self.matches({json.dumps(_flag_pattern([flag]))})", "message": f"{flag} {reason}"}
        for flag, reason in REFUSED_FLAGS.items()
    ]
    rules.append(
        {
            "rule": f"!self.matches({json.dumps(_flag_pattern(sorted(MANAGED_FLAGS)))})",
            "messageExpression": f"self.split('=')[0] + {json.dumps(' ' + MANAGED_REASON)}",
        }
    )
    return rules
