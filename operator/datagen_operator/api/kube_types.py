"""Volumes, env, scheduling: small typed subsets of the Kubernetes core types, as a DataGenRun spec holds them."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from datagen_operator.api.spec_base import SpecModel


class PersistentVolumeClaimSource(SpecModel):
    claim_name: str = Field(min_length=1, description="Name of a PersistentVolumeClaim in the run's namespace.")
    read_only: bool = False


class HostPathSource(SpecModel):
    path: str = Field(min_length=1, description="Absolute path on the node.")


class NfsSource(SpecModel):
    server: str = Field(min_length=1)
    path: str = Field(min_length=1)
    read_only: bool = False


class VolumeSource(SpecModel):
    """Where a path lives in a cluster: exactly one source. Ignored by `datagen run` on one machine."""

    persistent_volume_claim: PersistentVolumeClaimSource | None = None
    host_path: HostPathSource | None = None
    nfs: NfsSource | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> VolumeSource:
        count = sum(s is not None for s in (self.persistent_volume_claim, self.host_path, self.nfs))
        if count != 1:
            raise ValueError("set exactly one of persistentVolumeClaim, hostPath, nfs")
        return self


class SecretKeyRef(SpecModel):
    name: str = Field(min_length=1, description="Secret name (its value never appears in status or logs).")
    key: str = Field(min_length=1)


class EnvVarSource(SpecModel):
    secret_key_ref: SecretKeyRef


class EnvVar(SpecModel):
    name: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    value: str | None = None
    value_from: EnvVarSource | None = None

    @model_validator(mode="after")
    def _one_value(self) -> EnvVar:
        if (self.value is None) == (self.value_from is None):
            raise ValueError(f"env {self.name}: set exactly one of value, valueFrom")
        return self


class Toleration(SpecModel):
    key: str | None = None
    operator: Literal["Exists", "Equal"] | None = None
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    toleration_seconds: int | None = None
