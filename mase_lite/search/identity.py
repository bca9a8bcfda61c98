"""A study records the search spec that made it; a different spec on the same study is refused.

What decides a study's trials is recorded (its pipeline's content, space, objectives, constraints,
sampler and prefix cache); what may change between runs of the same search is not (``n_trials``,
``timeout``, heartbeats, ``plots``, where the files are).

Example::

    adopt(study, made_by(spec, study), "runs/s/study.journal")   # UserError if another spec made it
"""

from __future__ import annotations

import json
from typing import Any

from mase_lite.infra.errors import UserError

KEY = "mase_lite.search_spec"
_UNKEYED_PIPELINE = ("name", "output_dir")  # trials set their own


def made_by(spec, study) -> dict[str, Any]:
    """What of ``spec`` decides the trials of ``study`` (a :class:`~mase_lite.search.engine.Study`)."""
    pipeline = {k: v for k, v in study.space.pipeline.items() if k not in _UNKEYED_PIPELINE}
    return json.loads(json.dumps({
        "pipeline": pipeline,
        "space": [e.model_dump(mode="json") for e in study.space.entries],
        "objectives": [o.model_dump(mode="json") for o in spec.objectives],
        "constraints": [c.model_dump(mode="json") for c in spec.constraints],
        "sampler": (study.variant.sampler or spec.sampler).model_dump(mode="json"),
        "cache": spec.cache,
    }, sort_keys=True, default=str))


def adopt(study, made: dict[str, Any], storage: str) -> None:
    """Record ``made`` in a new study, or refuse (``UserError``) a study another spec made."""
    recorded = study.study.user_attrs.get(KEY)
    if recorded is None:
        study.study.set_user_attr(KEY, made)
        recorded = study.study.user_attrs.get(KEY, made)  # a worker starting at the same moment may have won
    if recorded != made:
        differs = ", ".join(k for k in made if recorded.get(k) != made.get(k)) or "its fields"
        raise UserError(
            f"output_dir: study {study.name!r} in {storage} was made by another search spec (this one differs in "
            f"{differs}); give this search another output_dir or study_name, or run the spec that made it "
            "(search_report.json records it)"
        )
