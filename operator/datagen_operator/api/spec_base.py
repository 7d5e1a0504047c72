"""What every part of the DataGenRun spec shares: the base model (camelCase on the wire, unknown fields refused) and
the patterns the CRD checks strings with."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel

QUANTITY_PATTERN = r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|k|M|G|T|P)?$"
CPU_PATTERN = QUANTITY_PATTERN + "|^[0-9]+m$"
DNS_SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
SUB_PATH_PATTERN = r"^[A-Za-z0-9_-][A-Za-z0-9._-]*(/[A-Za-z0-9_-][A-Za-z0-9._-]*)*$"
"""A relative folder path whose segments never start with a dot: no '..' escape (RE2 has no lookahead)."""


class SpecModel(BaseModel):
    """Base of every spec model: camelCase on the wire, unknown fields refused."""

    model_config = ConfigDict(
        extra="forbid",
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
        use_attribute_docstrings=True,
    )
