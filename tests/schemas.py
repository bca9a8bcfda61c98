"""Validators of the pipeline and search JSON Schemas for the shipped specs, built once per test process: the
schema is checked against its meta-schema once (``jsonschema.validate`` checks it again on every call, which took
most of these tests' time)."""

import functools

import jsonschema

from mase_lite.pipeline.spec import pipeline_schema
from mase_lite.search.spec import search_schema


@functools.cache
def validator(kind: str) -> jsonschema.protocols.Validator:
    """The validator of the ``"pipeline"`` or ``"search"`` schema of the built-in passes and formats."""
    schema = pipeline_schema() if kind == "pipeline" else search_schema()
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)
