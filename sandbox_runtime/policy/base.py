"""What every policy section shares: a frozen model that refuses unknown keys, and the units limits are given in."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["GiB", "KiB", "MiB", "PositiveFloat", "PositiveInt", "Section"]

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB

PositiveInt = Annotated[int, Field(gt=0)]
PositiveFloat = Annotated[float, Field(gt=0)]


class Section(BaseModel):
    """One section of a policy file: frozen, and a key it does not know is an error (never a silent default)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
