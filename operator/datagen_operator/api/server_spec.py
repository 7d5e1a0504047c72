"""spec.model and spec.server: the model, and the SGLang server that serves it (owned, or external and read-only)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, StringConstraints, field_validator, model_validator
from pydantic.alias_generators import to_camel

from datagen_operator.api.duration import Duration
from datagen_operator.api.errors import cross_field_error
from datagen_operator.api.kube_types import EnvVar, Toleration, VolumeSource
from datagen_operator.api.names import MAX_SERVER_REPLICAS
from datagen_operator.api.spec_base import (
    CPU_PATTERN,
    DNS_SUBDOMAIN_PATTERN,
    QUANTITY_PATTERN,
    SUB_PATH_PATTERN,
    SpecModel,
)
from datagen_operator.presets.sglang_names import DEFAULT_SGLANG_IMAGE, REASONING_PARSER_NAMES, TOOL_CALL_PARSER_NAMES

NO_PARSER = "none"
"""Explicitly no parser (a model without reasoning or tool calls); distinct from 'unset, use the preset'."""
AUTO_PARSER = "auto"
"""SGLang's own choice of a parser from the chat template at start-up: refused in a spec, which names its parser."""


class ThinkTokens(SpecModel):
    start: str = Field(min_length=1, description="Text of the think opener token, e.g. <think>.")
    end: str = Field(min_length=1, description="Text of the think closer token, e.g. </think>.")


class ModelSpec(SpecModel):
    preset: str | None = Field(
        default=None,
        description="Model family preset (parsers, think and stop tokens, template switch). "
        "`datagen presets` lists them. Without it, set server.reasoningParser and server.toolCallParser.",
    )
    path: str = Field(min_length=1, description="Model directory as the server sees it (inside the volume).")
    volume: VolumeSource | None = Field(default=None, description="Volume holding the model, mounted read-only.")
    tokenizer_path: str | None = Field(
        default=None,
        description="Tokenizer directory if not the model directory: the workers render prompts with it and the "
        "server loads it (--tokenizer-path), so it must be visible to both (e.g. inside the model volume).",
    )
    served_model_name: str | None = Field(default=None, pattern=r"^[A-Za-z0-9._/-]+$")
    trust_remote_code: bool | None = Field(
        default=None, description="Load the model's own code (Kimi needs it). Default: from the preset."
    )
    think_tokens: ThinkTokens | None = Field(
        default=None, description="Think tags for a model without a preset; presets already know theirs."
    )
    sub_path: str | None = Field(
        default=None,
        pattern=SUB_PATH_PATTERN,
        description="Folder inside the model volume to mount at model.path (one shared volume, one folder per "
        "model). Relative; no '.' or '..' segments.",
    )

    @property
    def tokenizer_dir(self) -> str:
        """The tokenizer's directory: tokenizerPath, else the model directory (a rule, not a field: it is
        neither written nor in the CRD)."""
        return self.tokenizer_path or self.path

    @property
    def tokenizer_field(self) -> str:
        """The spec field `tokenizer_dir` comes from, as an error message names it."""
        return "spec.model.tokenizerPath" if self.tokenizer_path else "spec.model.path"


DNS_LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
EXTERNAL_URL_PATTERN = r"^https?://[^\s/?#@]+(/[^\s?#@]*)?$"
"""A base URL without credentials, query or fragment (the URLs are shown in the run's status and logs)."""


class ExternalServiceRef(SpecModel):
    """A Kubernetes Service in front of an SGLang the run does not own (an OME InferenceService, a KServe
    LLMInferenceService, a Deployment of your own): the operator sends to http://NAME.NAMESPACE.svc:PORT."""

    name: str = Field(max_length=63, pattern=DNS_LABEL_PATTERN, description="The Service's name.")
    port: int = Field(ge=1, le=65535, description="The Service port that serves SGLang's HTTP API.")
    namespace: str | None = Field(
        default=None, max_length=63, pattern=DNS_LABEL_PATTERN, description="Its namespace; default: the run's."
    )


class ExternalServer(SpecModel):
    """An SGLang server the run does not own: it starts, scales and stops nothing, and holds it to the same
    checks as its own (preflight, parser check on /server_info, canary, rolling checks, verification)."""

    model_config = ConfigDict(
        json_schema_extra={  # the CRD's rules; _one_form checks the same for `datagen validate`
            "x-kubernetes-validations": [
                {
                    "rule": "has(self.urls) != has(self.service)",
                    "message": "set exactly one of urls, service",
                    "fieldPath": ".urls",
                    "reason": "FieldValueInvalid",
                },
                {
                    "rule": "!has(self.urls) || self.urls.all(u, self.urls.exists_one(v, v == u))",
                    "message": "each URL once: a repeated URL would take twice the requests",
                    "fieldPath": ".urls",
                    "reason": "FieldValueInvalid",
                },
            ]
        }
    )

    urls: list[Annotated[str, StringConstraints(max_length=2048, pattern=EXTERNAL_URL_PATTERN)]] | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_SERVER_REPLICAS,
        description="Base URLs of SGLang servers (http://host:30000), each probed and checked; every shard's "
        "worker spreads its requests over the ones that answer. No credentials in them.",
    )
    service: ExternalServiceRef | None = Field(
        default=None, description="A Kubernetes Service (the operator only; `datagen run` needs urls)."
    )

    @model_validator(mode="after")
    def _one_form(self) -> ExternalServer:
        if (self.urls is None) == (self.service is None):
            raise cross_field_error("urls", "set exactly one of urls, service")
        if self.urls is not None and len(set(self.urls)) != len(self.urls):
            raise cross_field_error("urls", "each URL once: a repeated URL would take twice the requests")
        return self


OWNED_SERVER_FIELDS: tuple[str, ...] = (
    "image",
    "gpus",
    "nodes",
    "tensor_parallel",
    "attention_data_parallel",
    "replicas",
    "mem_fraction_static",
    "extra_args",
    "port",
    "shm_size",
    "cpu",
    "memory",
    "env",
    "node_selector",
    "tolerations",
    "affinity",
    "priority_class_name",
    "runtime_class_name",
    "log_level",
)
"""ServerSpec fields that configure a server the run starts: refused away from their defaults with
server.external (the parsers stay: they say what the external server must run; startupTimeout stays: how long
the run waits for it to answer)."""


def external_server_refusal(field_alias: str) -> str:
    """Why a field of an owned server is refused beside server.external: the one wording of both validators."""
    return (
        f"server.external is set: the run starts no server, so server.{field_alias} has nothing to configure; remove "
        "it (set it where the external server is deployed)"
    )


class ServerSpec(SpecModel):
    # The CRD's rules for this object, beside the validators that check the same for `datagen validate`.
    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "!has(self.tensorParallel) || !has(self.gpus) || (has(self.nodes) && self.nodes > 1)"
                    " || self.gpus % self.tensorParallel == 0",
                    "message": "tensorParallel must divide gpus (SGLang needs tp-size x dp-size = GPUs)",
                    "fieldPath": ".tensorParallel",
                    "reason": "FieldValueInvalid",
                },
                {
                    "rule": "!has(self.tensorParallel) || !has(self.gpus) || !has(self.nodes) || self.nodes <= 1"
                    " || self.tensorParallel == self.gpus * self.nodes",
                    "message": "with nodes > 1, tensorParallel must be gpus x nodes (one SGLang server spans every "
                    "GPU of the group)",
                    "fieldPath": ".tensorParallel",
                    "reason": "FieldValueInvalid",
                },
                {
                    "rule": "!has(self.attentionDataParallel) || !has(self.gpus) || self.attentionDataParallel <= 1"
                    " || (!has(self.tensorParallel) ? self.gpus * (has(self.nodes) ? self.nodes : 1)"
                    " : self.tensorParallel) % self.attentionDataParallel == 0",
                    "message": "attentionDataParallel must divide tensorParallel (SGLang splits the tensor-parallel "
                    "group into attention data-parallel groups)",
                    "fieldPath": ".attentionDataParallel",
                    "reason": "FieldValueInvalid",
                },
                {
                    "rule": "!has(self.attentionDataParallel) || !has(self.gpus) || self.attentionDataParallel <= 1"
                    " || !has(self.tensorParallel) || self.tensorParallel == self.gpus * (has(self.nodes) ? self.nodes"
                    " : 1)",
                    "message": "attentionDataParallel needs tensorParallel = gpus x nodes: SGLang refuses "
                    "data-parallel replicas (--dp-size) together with --attn-dp-size",
                    "fieldPath": ".attentionDataParallel",
                    "reason": "FieldValueInvalid",
                },
                {
                    # has(): the API server also checks the rules against the `{}` default, before nested defaults
                    "rule": "!has(self.image) || (!self.image.endsWith(':latest') && (self.image.contains('@sha256:')"
                    " || self.image.split('/')[self.image.split('/').size() - 1].contains(':')))",
                    "message": "server.image must be pinned by tag or digest, never :latest",
                    "fieldPath": ".image",
                    "reason": "FieldValueInvalid",
                },
            ]
        }
    )

    image: str = Field(
        default=DEFAULT_SGLANG_IMAGE,
        pattern=r"^\S+$",
        description="SGLang image, pinned by tag or digest (never :latest).",
    )
    gpus: int = Field(default=8, ge=1, le=64, description="GPUs per server pod (in limits).")
    nodes: int = Field(
        default=1,
        ge=1,
        le=32,
        description="Pods (nodes) per server. Above 1 the server is a LeaderWorkerSet group (LWS must be "
        "installed): one SGLang server over nodes x gpus GPUs, HTTP on the leader.",
    )
    tensor_parallel: int | None = Field(
        default=None,
        ge=1,
        description="--tp-size; must divide gpus (with nodes > 1: must be gpus x nodes). Default: every GPU "
        "of the server.",
    )
    attention_data_parallel: int | None = Field(
        default=None,
        ge=1,
        le=512,
        description="--attn-dp-size: attention data-parallel groups inside the tensor-parallel group, each "
        "with its own KV cache (MLA models: Kimi, DeepSeek). Must divide tensorParallel.",
    )
    replicas: int = Field(
        default=1,
        ge=1,
        le=MAX_SERVER_REPLICAS,
        description="Data-parallel servers (pods, or groups with nodes > 1); workers spread over them.",
    )
    mem_fraction_static: float | None = Field(default=None, gt=0, le=1, description="--mem-fraction-static.")
    reasoning_parser: str | None = Field(
        default=None, description="--reasoning-parser; default from the preset; `none` for no parser."
    )
    tool_call_parser: str | None = Field(
        default=None, description="--tool-call-parser; default from the preset; `none` for no parser."
    )
    # Bounded so the API server can price the CEL rules on each item (and validate refuses the same).
    extra_args: list[Annotated[str, StringConstraints(max_length=1024)]] = Field(
        default_factory=list,
        max_length=64,
        description="More sglang.launch_server flags; flags the operator manages are refused.",
    )
    startup_timeout: Duration = Field(
        default="45m",
        validate_default=True,
        description="How long model loading may take before the server counts as failed.",
    )
    port: int = Field(default=30000, ge=1024, le=65535)
    shm_size: str = Field(default="64Gi", pattern=QUANTITY_PATTERN, description="Memory-backed /dev/shm size.")
    cpu: str | None = Field(default=None, pattern=CPU_PATTERN)
    memory: str | None = Field(default=None, pattern=QUANTITY_PATTERN)
    env: list[EnvVar] = Field(default_factory=list)
    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: list[Toleration] = Field(default_factory=list)
    affinity: dict[str, Any] = Field(
        default_factory=dict,
        description="Kubernetes affinity for the server pods (nodeAffinity, podAntiAffinity, ...), passed through.",
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True},
    )
    priority_class_name: str | None = None
    runtime_class_name: str | None = Field(
        default=None,
        max_length=253,
        pattern=DNS_SUBDOMAIN_PATTERN,
        description="RuntimeClass of the server pods (e.g. `nvidia` where the GPU runtime is not the default).",
    )
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    external: ExternalServer | None = Field(
        default=None,
        description="Use an SGLang server the run does not own (urls, or a Kubernetes Service): no server is "
        "started, scaled or stopped; the fields that configure one are refused. reasoningParser and "
        "toolCallParser say what it must run (checked on its /server_info).",
    )

    @field_validator("image")
    @classmethod
    def _pinned_image(cls, value: str) -> str:
        last = value.rsplit("/", 1)[-1]
        if "@sha256:" not in value and (":" not in last or last.endswith(":latest")):
            raise ValueError(f"{value!r} is not pinned; name a tag like {DEFAULT_SGLANG_IMAGE} or a digest")
        return value

    @field_validator("reasoning_parser")
    @classmethod
    def _known_reasoning_parser(cls, value: str | None) -> str | None:
        return _known_parser(value, REASONING_PARSER_NAMES, "reasoning")

    @field_validator("tool_call_parser")
    @classmethod
    def _known_tool_parser(cls, value: str | None) -> str | None:
        return _known_parser(value, TOOL_CALL_PARSER_NAMES, "tool-call")

    @model_validator(mode="after")
    def _external_owns_nothing(self) -> ServerSpec:
        # The same rules as crd.external_server_cel_rules, one per field, in OWNED_SERVER_FIELDS' order.
        if self.external is None:
            return self
        for name in OWNED_SERVER_FIELDS:
            field = type(self).model_fields[name]
            if getattr(self, name) != field.get_default(call_default_factory=True):
                raise cross_field_error(to_camel(name), external_server_refusal(to_camel(name)))
        return self

    @model_validator(mode="after")
    def _parallelism_fits_the_gpus(self) -> ServerSpec:
        # The same rules as the CEL ones above, in their order.
        if self.nodes == 1 and self.gpus % self.tp_size:
            raise cross_field_error(
                "tensorParallel",
                f"tensorParallel {self.tp_size} does not divide gpus {self.gpus}: SGLang needs "
                f"tp-size x dp-size = GPUs; set tensorParallel to a divisor of {self.gpus}",
            )
        if self.nodes > 1 and self.tp_size != self.server_gpus:
            raise cross_field_error(
                "tensorParallel",
                f"tensorParallel {self.tp_size} is not gpus x nodes = {self.gpus} x {self.nodes}: one SGLang "
                f"server spans every GPU of the group; set tensorParallel to {self.server_gpus} or leave it unset",
            )
        attention_dp = self.attn_dp_size
        if attention_dp > 1 and self.tp_size % attention_dp:
            raise cross_field_error(
                "attentionDataParallel",
                f"attentionDataParallel {attention_dp} does not divide tensorParallel {self.tp_size}: SGLang "
                "splits the tensor-parallel group into attention data-parallel groups",
            )
        if attention_dp > 1 and self.dp_size > 1:
            raise cross_field_error(
                "attentionDataParallel",
                f"attentionDataParallel {attention_dp} with tensorParallel {self.tp_size} below gpus x nodes "
                f"({self.server_gpus}): SGLang refuses data-parallel replicas (--dp-size {self.dp_size}) together "
                "with --attn-dp-size; set tensorParallel to gpus x nodes",
            )
        return self

    @property
    def server_gpus(self) -> int:
        """GPUs of one server: every pod of its group."""
        return self.gpus * self.nodes

    @property
    def tp_size(self) -> int:
        return self.tensor_parallel or self.server_gpus

    @property
    def dp_size(self) -> int:
        return self.server_gpus // self.tp_size

    @property
    def attn_dp_size(self) -> int:
        return self.attention_data_parallel or 1


def _known_parser(value: str | None, names: tuple[str, ...], kind: str) -> str | None:
    if value is None or value == NO_PARSER or value in names:
        return value
    choices = f"{', '.join(sorted(names))}, or {NO_PARSER!r}"
    if value == AUTO_PARSER:
        # SGLang accepts it and picks a parser from the chat template at start-up (parser/template_detection.py).
        raise ValueError(
            f"{AUTO_PARSER!r} lets SGLang pick the {kind} parser from the chat template when it starts; a run names "
            f"its parser so that the parser check and the canary hold the server to it: leave it unset (the "
            f"preset's) or use one of: {choices}"
        )
    raise ValueError(f"{value!r} is not a {kind} parser of the pinned SGLang; use one of: {choices}")
