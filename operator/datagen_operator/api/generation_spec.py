"""spec.dataset and spec.generation: what is read (the dataset and its sample) and how it is generated (sampling,
template variables, thinking, turns)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from datagen_operator.api.errors import cross_field_error
from datagen_operator.api.kube_types import VolumeSource
from datagen_operator.api.spec_base import SpecModel

SAMPLE_ONE_OF = "set exactly one of count, fraction"


class DatasetSample(SpecModel):
    """A deterministic subset of the dataset (prompts/draws.py): the lines whose seeded hash of their id is among
    the lowest, so the subset depends on neither the file's order nor the shard count, and a resume draws it again."""

    model_config = ConfigDict(
        json_schema_extra={  # the CRD's rule; _exactly_one says the same for `datagen validate`
            "x-kubernetes-validations": [
                {"rule": "has(self.count) != has(self.fraction)", "message": SAMPLE_ONE_OF},
            ]
        },
    )

    count: int | None = Field(
        default=None,
        ge=1,
        description="Prompts to keep; a dataset with fewer valid prompts is taken whole (the preflight says so).",
    )
    fraction: float | None = Field(
        default=None, gt=0, le=1, allow_inf_nan=False, description="The share of lines to keep, 0 < fraction <= 1."
    )
    seed: int = Field(default=0, ge=0, le=2**32 - 1, description="Another seed draws another subset.")

    @model_validator(mode="after")
    def _exactly_one(self) -> DatasetSample:
        if (self.count is None) == (self.fraction is None):
            raise ValueError(SAMPLE_ONE_OF)
        return self


class DatasetSpec(SpecModel):
    path: str = Field(
        min_length=1,
        description="JSONL, a JSON array file or Parquet of conversations: `messages` or `conversations`, OpenAI "
        "{role, content} or ShareGPT {from, value}, `tools` optional (docs/regenerate.md).",
    )
    volume: VolumeSource | None = None
    format: Literal["auto", "jsonl", "json", "parquet"] = "auto"
    id_field: str | None = Field(
        default=None,
        min_length=1,
        max_length=128,
        pattern=r"^[A-Za-z0-9_.-]+$",
        description="The field holding each conversation's id (default `id`). A line without one gets an id "
        "derived from its content, which survives reordering of the file.",
    )
    sample: DatasetSample | None = Field(
        default=None,
        description="Generate for a seeded subset of the dataset only (`count` or `fraction`, and `seed`): pinned "
        "as a subset of the pinned dataset, so a resume and verify hold the same lines (docs/regenerate.md).",
    )


GREEDY_TEMPERATURE = 1e-6
"""SGLang 0.5.23's `_SAMPLING_EPS`: a temperature below it is greedy (top_k 1)."""


def is_greedy(temperature: float | None, top_k: int | None) -> bool:
    """Whether SGLang 0.5.23 samples greedily (`SamplingParams.normalize`: a temperature below its epsilon becomes
    top_k 1; `is_all_greedy`: top_k <= 1 is the argmax): every sample of a prompt is then the same answer. An
    unset temperature is SGLang's default 1.0 (/generate never takes the model's generation_config)."""
    return (temperature is not None and temperature < GREEDY_TEMPERATURE) or top_k == 1


def greedy_samples_problem(samples: int) -> str:
    """The spec's side of the identical-samples rule (checks.evaluate IDENTICAL_SAMPLES): known from the spec
    alone, so refused before any server starts."""
    return (
        f"samplesPerPrompt {samples} with greedy sampling (temperature 0 or top_k 1): SGLang answers every sample "
        "of a prompt alike; set generation.sampling.temperature above 0 (and top_k other than 1), or "
        "samplesPerPrompt: 1"
    )


class SamplingParams(BaseModel):
    """SGLang /generate sampling_params, spelled as SGLang spells them (max_new_tokens, not max_tokens)."""

    model_config = ConfigDict(
        extra="forbid",
        use_attribute_docstrings=True,
        json_schema_extra={  # the CRD's rules; _sglang_cross_field_bounds checks the same for `datagen validate`
            "x-kubernetes-validations": [
                {
                    "rule": "!has(self.top_k) || self.top_k != 0 || (has(self.temperature) && self.temperature < 1e-6)",
                    "message": "top_k must be -1 (the whole vocabulary) or at least 1; SGLang refuses 0",
                    "fieldPath": ".top_k",
                    "reason": "FieldValueInvalid",
                },
                {
                    "rule": "!has(self.min_new_tokens) || self.min_new_tokens <= self.max_new_tokens",
                    "message": "min_new_tokens must be at most max_new_tokens",
                    "fieldPath": ".min_new_tokens",
                    "reason": "FieldValueInvalid",
                },
            ]
        },
    )

    # Ranges are those of SGLang 0.5.23's SamplingParams.verify, which refuses a request outside them
    # (tests/contract/test_spec_sampling.py holds them to SGLang's own code). One deliberate difference:
    # max_new_tokens 0 is accepted by SGLang but makes no data.
    max_new_tokens: int = Field(ge=1, description="Always sent: SGLang's default is only 128.")
    temperature: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: int | None = Field(default=None, ge=-1, description="-1 (the whole vocabulary) or at least 1.")
    min_p: float | None = Field(default=None, ge=0, le=1)
    min_new_tokens: int | None = Field(default=None, ge=0, description="At most max_new_tokens.")
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    repetition_penalty: float | None = Field(default=None, gt=0, le=2, description="1.0 is no penalty.")
    stop_token_ids: list[int] | None = None
    sampling_seed: int | None = Field(
        default=None,
        ge=-(2**63),
        le=2**63 - 1,
        description="Reproducible samples: the server is then launched with --enable-deterministic-inference "
        "(SGLang ignores the seed without it); sample k of a prompt is sent with seed + k.",
    )

    def restarted_by_retraction(self) -> tuple[str, ...]:
        """The parameters whose state SGLang builds from the tokens generated so far and starts again after a
        retraction (`Req.reset_for_retract`, then a fresh penalizer in `SamplingBatchInfo.from_schedule_batch`):
        the penalties counted over the output, and min_new_tokens' count of new tokens. Each is the one whose
        penalizer SGLang 0.5.23 runs (`_is_required`): tests/contract/test_retraction.py holds them to it."""
        names = []
        if self.frequency_penalty not in (None, 0.0):
            names.append("frequency_penalty")
        if self.presence_penalty not in (None, 0.0):
            names.append("presence_penalty")
        if self.repetition_penalty not in (None, 1.0):
            names.append("repetition_penalty")
        if self.min_new_tokens not in (None, 0):
            names.append("min_new_tokens")
        return tuple(names)

    @property
    def greedy(self) -> bool:
        """SGLang takes the argmax: every request of a prompt gets the same answer (`is_greedy`)."""
        return is_greedy(self.temperature, self.top_k)

    @model_validator(mode="after")
    def _sglang_cross_field_bounds(self) -> SamplingParams:
        # SGLang turns temperature 0 into greedy sampling (top_k 1) before checking top_k.
        greedy = self.temperature is not None and self.temperature < GREEDY_TEMPERATURE
        if self.top_k == 0 and not greedy:
            raise cross_field_error("top_k", "top_k must be -1 (the whole vocabulary) or at least 1; SGLang refuses 0")
        if self.min_new_tokens is not None and self.min_new_tokens > self.max_new_tokens:
            raise cross_field_error(
                "min_new_tokens", f"min_new_tokens must be at most max_new_tokens ({self.max_new_tokens})"
            )
        return self


class TemplateVariableChoice(SpecModel):
    value: Any = Field(
        description="The variable's value (any JSON value: a string, number, boolean...).",
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True},
    )
    weight: float = Field(gt=0, allow_inf_nan=False, description="Relative weight (4, 4, 2: 40%, 40%, 20%).")

    @field_validator("value")
    @classmethod
    def _not_null(cls, value: Any) -> Any:
        if value is None:
            raise ValueError("a value is required (null renders as an unset variable: leave the choice out)")
        return value


class TemplateVariableMix(SpecModel):
    """Chat-template variables drawn per line from weighted choices (prompts/draws.py), seeded by the line's id."""

    seed: int = Field(default=0, ge=0, le=2**32 - 1, description="Another seed draws other values.")
    variables: dict[str, Annotated[list[TemplateVariableChoice], Field(min_length=1)]] = Field(
        min_length=1,
        description="Variable name -> its weighted choices, e.g. reasoning_effort: [{value: low, weight: 4}, "
        "{value: medium, weight: 4}, {value: high, weight: 2}].",
    )


HistoryReasoning = Literal["keep", "drop"]
"""generation.historyReasoning (prompts/conversation.py `client_messages`)."""


class GenerationSpec(SpecModel):
    # The CRD's rule, beside _samples_can_differ that checks the same for `datagen validate`.
    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "!has(self.samplesPerPrompt) || self.samplesPerPrompt <= 1 || !("
                    "(has(self.sampling.temperature) && self.sampling.temperature < 1e-6) || "
                    "(has(self.sampling.top_k) && self.sampling.top_k == 1))",
                    "message": greedy_samples_problem(2).replace("samplesPerPrompt 2", "samplesPerPrompt > 1"),
                    "fieldPath": ".samplesPerPrompt",
                    "reason": "FieldValueInvalid",
                }
            ]
        }
    )

    thinking: bool | None = Field(
        default=None, description="Render prompts with thinking on. Default: the preset's default."
    )
    sampling: SamplingParams
    samples_per_prompt: int = Field(default=1, ge=1, le=1024, description="Records per prompt (sample index 0..n-1).")
    template_variables: dict[str, Any] = Field(
        default_factory=dict,
        description="Extra chat-template variables for every prompt (e.g. gpt-oss reasoning_effort); a dataset line's "
        "own chat_template_kwargs are rendered over them. The thinking switch is generation.thinking.",
        # Free-form: the API server keeps the values (CEL cannot read the keys of such an object, so the two rules on
        # them are resolve.py's alone: datagen validate and the operator's InvalidSpec, not the CRD).
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True},
    )
    template_variable_mix: TemplateVariableMix | None = Field(
        default=None,
        description="Template variables drawn per line from weighted choices, seeded (a resume draws the same), "
        "rendered as the line's own chat_template_kwargs would be; a line's own value of the variable wins. Not a "
        "variable of templateVariables (docs/regenerate.md).",
    )
    turns: Literal["last", "all"] = Field(
        default="last",
        description="`last`: one answer per line, to its last user message (a trailing assistant turn is dropped). "
        "`all`: the dataset's assistant turns are not sent; every user turn is answered in order, each on the "
        "model's own earlier answers (docs/regenerate.md).",
    )
    history_reasoning: HistoryReasoning = Field(
        default="keep",
        description="What earlier assistant messages a request sends (the model's own answers with turns all, the "
        "dataset's with last): `keep`: each with its reasoning_content, as SGLang's chat endpoint returned it, and "
        "the chat template decides what the prompt holds; `drop`: without it, as SpecForge's regenerate_train_data.py "
        "sends them. Same prompts for templates that drop earlier reasoning; not for Kimi-K2-Thinking's or Qwen3's "
        "(docs/regenerate.md, History reasoning).",
    )
    stream: bool = Field(
        default=False,
        description="Stream responses (incremental deltas; the server gets --incremental-streaming-output).",
    )

    @model_validator(mode="after")
    def _samples_can_differ(self) -> GenerationSpec:
        if self.samples_per_prompt > 1 and self.sampling.greedy:
            raise cross_field_error("samplesPerPrompt", greedy_samples_problem(self.samples_per_prompt))
        return self
