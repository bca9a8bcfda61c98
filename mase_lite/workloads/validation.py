"""Spec sections given as dicts become pydantic models, or one UserError naming each bad field.

Example::

    spec = validate_section(DataSpec, {"dataset": "json"}, "data")   # UserError: data: dataset 'json' needs 'path' ...
"""

from __future__ import annotations

from typing import TypeVar

from pydantic import BaseModel, ValidationError

from mase_lite.infra.errors import UserError, validation_problems

Section = TypeVar("Section", bound=BaseModel)


def validate_section(model: type[Section], value: Section | dict | None, section: str) -> Section:
    """``value`` as a ``model`` (``None`` means all defaults)."""
    if isinstance(value, model):
        return value
    try:
        return model.model_validate(value or {})
    except ValidationError as err:
        raise UserError(problems=validation_problems(err, model=model), location=(section,)) from None
