"""The DataGenRun spec: what a user writes. The CRD schema is generated from these models.

Here the manifest (`DataGenRun`, `DataGenRunSpec`), the API's names and the small sections (clients, output, checks,
queue); the large sections in their own modules: server_spec (model, server), generation_spec (dataset, generation),
export_spec (export), over spec_base (the base model, the patterns) and kube_types (volumes, env, tolerations)."""

from __future__ import annotations

from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, PlainValidator, WithJsonSchema, field_validator

from datagen_operator.api.duration import Duration
from datagen_operator.api.export_spec import ExportSpec
from datagen_operator.api.generation_spec import DatasetSpec, GenerationSpec
from datagen_operator.api.kube_types import Toleration, VolumeSource
from datagen_operator.api.names import MAX_SHARDS, run_name_problem
from datagen_operator.api.server_spec import ModelSpec, ServerSpec
from datagen_operator.api.spec_base import CPU_PATTERN, DNS_SUBDOMAIN_PATTERN, QUANTITY_PATTERN, SpecModel

ApiGroupVersion = Literal["datagen.dev/v1alpha1"]
"""The one spelling of the API version: a manifest's apiVersion must be it (DataGenRun), the rest derive from it."""
API_GROUP_VERSION: str = get_args(ApiGroupVersion)[0]
API_GROUP, API_VERSION = API_GROUP_VERSION.split("/")
KIND = "DataGenRun"
PLURAL = "datagenruns"


AUTO_CONCURRENCY: Literal["auto"] = "auto"
"""clients.concurrency sized by the canary from the servers' batch limits (checks/batch_fill.py)."""
DEFAULT_CONCURRENCY = 64
MAX_CONCURRENCY = 4096
CONCURRENCY_PROBLEM = (
    f"an integer 1..{MAX_CONCURRENCY} (requests in flight per shard) or `{AUTO_CONCURRENCY}` (as many as fill the "
    "servers' batches, from their /server_info; docs/worker.md)"
)


def _concurrency(value: Any) -> int | Literal["auto"]:
    """Strict, as the CRD's int-or-string rule is: the string "64" is neither form."""
    if value == AUTO_CONCURRENCY:
        return AUTO_CONCURRENCY
    if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_CONCURRENCY:
        return value
    raise ValueError(f"{value!r} is not {CONCURRENCY_PROBLEM}")


Concurrency = Annotated[
    int | Literal["auto"],
    PlainValidator(_concurrency),
    WithJsonSchema(
        {
            "x-kubernetes-int-or-string": True,
            "x-kubernetes-validations": [  # _concurrency says the same for `datagen validate`
                {
                    "rule": f"type(self) == int ? self >= 1 && self <= {MAX_CONCURRENCY} : self == '{AUTO_CONCURRENCY}'",
                    "message": f"must be {CONCURRENCY_PROBLEM}",
                }
            ],
        }
    ),
]


class ClientsSpec(SpecModel):
    shards: int = Field(default=1, ge=1, le=MAX_SHARDS, description="Worker shards (Indexed Job completions).")
    concurrency: Concurrency = Field(
        default=DEFAULT_CONCURRENCY,
        description="In-flight requests per shard, or `auto`: the canary sizes it to fill the servers' batches "
        "(their max_running_requests and token pool, from /server_info) and the workers send at that number.",
    )
    image: str | None = Field(default=None, description="Worker image; default from the operator's configuration.")
    request_timeout: Duration = Field(
        default="1h", validate_default=True, description="Per-request timeout (long answers take minutes)."
    )
    max_attempts: int = Field(default=8, ge=1, le=100, description="Tries per record for retryable errors.")
    cpu: str | None = Field(default=None, pattern=CPU_PATTERN)
    memory: str | None = Field(default=None, pattern=QUANTITY_PATTERN)
    node_selector: dict[str, str] = Field(
        default_factory=dict, description="Node labels for the preflight, canary, worker and verify pods (CPU)."
    )
    tolerations: list[Toleration] = Field(
        default_factory=list, description="Tolerations of the preflight, canary, worker and verify pods."
    )

    def per_shard(self, resolved: int | None) -> int:
        """The requests in flight per shard the workers send at: the spec's number; with auto the one the canary
        resolved (`resolved`), else the default (a spec changed to auto after its canary ran)."""
        if isinstance(self.concurrency, int):
            return self.concurrency
        return resolved if resolved is not None else DEFAULT_CONCURRENCY


class OutputSpec(SpecModel):
    path: str = Field(min_length=1, description="Output directory (inside the volume); never deleted by the operator.")
    volume: VolumeSource | None = None


class ChecksSpec(SpecModel):
    canary_prompts: int = Field(default=8, ge=0, le=256, description="Dataset prompts in the canary (plus probes).")
    canary_max_new_tokens: int = Field(
        default=2048,
        ge=16,
        description="max_new_tokens for canary requests (capped so the verdict comes within a minute on a GPU).",
    )
    min_reasoning_rate: float = Field(default=0.98, ge=0, le=1)
    max_truncation_rate: float = Field(default=0.02, ge=0, le=1)
    max_identical_sample_rate: float = Field(
        default=0.5,
        ge=0,
        le=1,
        description="With samplesPerPrompt > 1 and temperature > 0: prompts whose samples all came back identical "
        "(first turns), out of the prompts with two or more. SGLang samples each request anew, so a high rate is a "
        "seeding mistake (a fixed sampling_seed under deterministic inference) or a greedy server.",
    )
    max_retraction_rate: float = Field(
        default=0.01,
        ge=0,
        le=1,
        description="Records SGLang retracted (KV memory ran short) while penalties or min_new_tokens were set: "
        "their penalty state restarted, so they were not sampled as asked.",
    )
    max_token_mismatch_rate: float = Field(default=0.0, ge=0, le=1)
    max_error_rate: float = Field(default=0.01, ge=0, le=1, description="Records rejected by the server (4xx).")
    fidelity_sample: int = Field(default=64, ge=0, description="Records re-rendered to prove prompt fidelity.")
    on_failure: Literal["Halt", "Warn"] = Field(
        default="Halt", description="Halt stops before bulk work (canary) or pauses workers (rolling checks)."
    )


KUEUE_NAME_MAX_LENGTH = 63
"""A Kueue object's name as its label holds it: a DNS-1123 subdomain (Kueue's own check) no longer than a label
value may be."""


class QueueSpec(SpecModel):
    """Kueue (docs/kueue.md): the LocalQueue that admits the run's server, all its pods as one unit, and its
    priority. Unset: no Kueue labels (a `default` LocalQueue in the namespace is still Kueue's own rule)."""

    name: str = Field(
        max_length=KUEUE_NAME_MAX_LENGTH,
        pattern=DNS_SUBDOMAIN_PATTERN,
        description="The LocalQueue in the run's namespace (Kueue's label kueue.x-k8s.io/queue-name).",
    )
    workload_priority_class_name: str | None = Field(
        default=None,
        max_length=KUEUE_NAME_MAX_LENGTH,
        pattern=DNS_SUBDOMAIN_PATTERN,
        description="A Kueue WorkloadPriorityClass (label kueue.x-k8s.io/priority-class): the order in the queue "
        "and who may preempt whom. Not the pods' PriorityClass (server.priorityClassName).",
    )


class DataGenRunSpec(SpecModel):
    model: ModelSpec
    server: ServerSpec = Field(default_factory=ServerSpec)
    dataset: DatasetSpec
    generation: GenerationSpec
    clients: ClientsSpec = Field(default_factory=ClientsSpec)
    output: OutputSpec
    checks: ChecksSpec = Field(default_factory=ChecksSpec)
    export: ExportSpec | None = Field(default=None, description="Export the verified records (docs/export.md).")
    suspend: bool = Field(default=False, description="Suspend (Kueue style): releases the GPUs, keeps the output.")
    queue: QueueSpec | None = Field(
        default=None,
        description="Queue the server in Kueue (docs/kueue.md); unset, the run is not labelled for it. Ignored by "
        "`datagen run` on one machine.",
    )


class ObjectMeta(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str
    namespace: str | None = None

    @field_validator("name")
    @classmethod
    def _children_can_be_named(cls, value: str) -> str:
        problem = run_name_problem(value)
        if problem:
            raise ValueError(problem)
        return value


class DataGenRun(BaseModel):
    """A whole manifest (apiVersion, kind, metadata, spec) as `datagen validate` reads it."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    api_version: ApiGroupVersion = Field(alias="apiVersion")
    kind: Literal["DataGenRun"]
    metadata: ObjectMeta
    spec: DataGenRunSpec
    status: dict[str, Any] | None = None
