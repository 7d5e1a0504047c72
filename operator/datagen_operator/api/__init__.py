"""The DataGenRun API: spec and status models, parsing, and the CRD generated from them."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from pydantic import ValidationError

from datagen_operator.api.errors import UNKNOWN_FIELD, FieldError, SpecError, field_errors
from datagen_operator.api.extra_args import extra_arg_errors, speculative_sampling_errors
from datagen_operator.api.spec import API_GROUP_VERSION, KIND, DataGenRun, DataGenRunSpec

if TYPE_CHECKING:
    from datagen_operator.api.resolve import ResolvedModel


def parse_run(document: dict[str, Any]) -> DataGenRun:
    """A manifest as a DataGenRun, with every field error named; cross-field rules included."""
    return _parse(document)[0]


def _parse(document: dict[str, Any]) -> tuple[DataGenRun, ResolvedModel]:
    from datagen_operator.api.resolve import resolve_model

    try:
        # As the CRD's OpenAPI schema: no coercion ("8" is not 8, "yes" is not true) and only the wire
        # (camelCase) names; Python code may still build models by attribute name.
        run = DataGenRun.model_validate(document, strict=True, by_alias=True, by_name=False)
    except ValidationError as error:
        errors = field_errors(error)
        # Unknown fields alone, as the API server reports them (it refuses them before validating anything;
        # a misspelled key's "missing" twin is no news).
        raise SpecError([e for e in errors if e.message.startswith(UNKNOWN_FIELD)] or errors) from None
    extra_args = run.spec.server.extra_args
    errors = extra_arg_errors(extra_args)
    errors += speculative_sampling_errors(extra_args, run.spec.generation.sampling.model_dump())
    resolved = None
    try:
        resolved = resolve_model(run.spec)
    except SpecError as error:
        errors = error.errors + errors
    if errors or resolved is None:
        raise SpecError(errors)
    return run, resolved


def parse_spec(spec: dict[str, Any]) -> DataGenRunSpec:
    """Just the spec (what the operator gets from kopf), with the same rules as parse_run."""
    return parse_spec_resolved(spec)[0]


def parse_spec_resolved(spec: dict[str, Any]) -> tuple[DataGenRunSpec, ResolvedModel]:
    """The spec and its model as resolved while validating it: a caller resolves nothing again."""
    run, resolved = _parse({"apiVersion": API_GROUP_VERSION, "kind": KIND, "metadata": {"name": "x"}, "spec": spec})
    return run.spec, resolved


def load_run(path: str | Path) -> DataGenRun:
    text = Path(path).read_text(encoding="utf-8")
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise SpecError([FieldError("(file)", f"not valid YAML: {error}")]) from None
    if not isinstance(document, dict):
        raise SpecError([FieldError("(file)", "expected one DataGenRun manifest (a YAML mapping)")])
    return parse_run(document)


__all__ = [
    "DataGenRun",
    "DataGenRunSpec",
    "FieldError",
    "SpecError",
    "anchor_paths",
    "load_run",
    "parse_run",
    "parse_spec",
    "parse_spec_resolved",
]


def anchor_paths(run: DataGenRun, base: Path) -> DataGenRun:
    """A copy whose relative model, tokenizer, dataset and output paths are resolved against `base`
    (the manifest's folder): how `datagen run` and `datagen verify` read paths on one machine."""

    def anchored(path: str | None) -> str | None:
        if path is None:
            return None
        candidate = Path(path).expanduser()
        return str(candidate if candidate.is_absolute() else (base / candidate).resolve())

    spec = run.spec
    model = spec.model.model_copy(
        update={"path": anchored(spec.model.path), "tokenizer_path": anchored(spec.model.tokenizer_path)}
    )
    dataset = spec.dataset.model_copy(update={"path": anchored(spec.dataset.path)})
    output = spec.output.model_copy(update={"path": anchored(spec.output.path)})
    return run.model_copy(
        update={"spec": spec.model_copy(update={"model": model, "dataset": dataset, "output": output})}
    )
