"""A search's samplers: each is one class that knows its options (the spec's ``sampler`` object), how it builds
its Optuna sampler, whether it takes the search's constraints and when it stays random for a whole study.

>>> sampler = TPESamplerSpec(n_startup_trials=4)
>>> sampler.options(), sampler.takes_constraints
({'n_startup_trials': 4}, True)
>>> sampler.startup_warning(n_trials=3, n_params=2)[:56]
'tpe samples its first n_startup_trials = 4 trials at ran'
"""

from __future__ import annotations

import functools
import importlib
import math
from typing import TYPE_CHECKING, Annotated, Any, Callable, ClassVar, Literal, Union, get_args

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag

if TYPE_CHECKING:
    import optuna

Seed = Annotated[int, Field(ge=0, lt=2**32, description="seed of the sampler's generator")]


class Sampler(BaseModel):
    """A sampler's options. ``optuna_class``: the Optuna sampler's dotted name; ``needs``: a module it imports
    (an optional package); ``takes_constraints``: whether it prefers trials within the search's constraints."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    optuna_class: ClassVar[str]
    needs: ClassVar[str | None] = None
    takes_constraints: ClassVar[bool] = False

    seed: Seed = 0

    def options(self) -> dict[str, Any]:
        """The Optuna sampler's keyword arguments the spec sets (besides the seed)."""
        return {k: v for k, v in self.model_dump(exclude={"name", "seed"}).items() if v is not None}

    def build(self, space: Any, constraints: Callable | None) -> "optuna.samplers.BaseSampler":
        """The seeded Optuna sampler over ``space`` (the search's :class:`~mase_lite.search.space.Space`);
        ``constraints`` is passed where the sampler takes it. ``ImportError``
        where its package is missing; ``TypeError``/``ValueError`` for an option Optuna refuses."""
        import optuna

        if self.needs:
            importlib.import_module(self.needs)
        extra = {"constraints_func": constraints} if constraints is not None and self.takes_constraints else {}
        return getattr(optuna.samplers, self.optuna_class)(seed=self.seed, **self.options(), **extra)

    def startup_warning(self, n_trials: int, n_params: int) -> str | None:
        """Why the sampler would stay random (its start-up) for all of ``n_trials`` trials, else ``None``."""
        return None


class GridSamplerSpec(Sampler):
    """Every combination of the space's values (choices, unlogged ints, floats with a step)."""

    name: Literal["grid"]

    def build(self, space: Any, constraints: Callable | None) -> "optuna.samplers.BaseSampler":
        return _grid_sampler_class()(space.grid(), seed=self.seed, **self.options())


@functools.cache
def _grid_sampler_class() -> type:
    import optuna

    class GridSampler(optuna.samplers.GridSampler):
        """Optuna's grid sampler; the engine's loop (not ``Study.stop``) ends a walked-through grid."""

        def after_trial(self, study, trial, state, values) -> None:
            pass

    return GridSampler


class RandomSamplerSpec(Sampler):
    name: Literal["random"]
    optuna_class: ClassVar[str] = "RandomSampler"


class TPESamplerSpec(Sampler):
    """Tree-structured Parzen estimator; random for its first ``n_startup_trials`` trials."""

    name: Literal["tpe"] = "tpe"
    optuna_class: ClassVar[str] = "TPESampler"
    takes_constraints: ClassVar[bool] = True
    n_startup_trials: int | None = Field(None, ge=0, le=10**6, description="random trials first (Optuna's default: 10)")
    n_ei_candidates: int | None = Field(None, ge=1, le=10**4)
    multivariate: bool | None = None
    group: bool | None = None
    constant_liar: bool | None = None
    consider_endpoints: bool | None = None
    prior_weight: float | None = Field(None, gt=0, le=1e6)
    warn_independent_sampling: bool | None = None

    def startup_warning(self, n_trials: int, n_params: int) -> str | None:
        startup = 10 if self.n_startup_trials is None else self.n_startup_trials
        if n_trials <= startup:
            return f"tpe samples its first n_startup_trials = {startup} trials at random; with n_trials = {n_trials} " \
                   "every trial is random (set n_startup_trials below n_trials)"
        return None


class NSGA2SamplerSpec(Sampler):
    """NSGA-II; its first generation (``population_size`` trials) is random."""

    name: Literal["nsga2"]
    optuna_class: ClassVar[str] = "NSGAIISampler"
    takes_constraints: ClassVar[bool] = True
    population_size: int | None = Field(None, ge=2, le=10**6, description="trials per generation (Optuna's default: 50)")
    mutation_prob: float | None = Field(None, ge=0, le=1)
    crossover_prob: float | None = Field(None, ge=0, le=1)
    swapping_prob: float | None = Field(None, ge=0, le=1)

    def startup_warning(self, n_trials: int, n_params: int) -> str | None:
        size = self.population_size or 50
        if n_trials <= size:
            return f"nsga2's first generation (population_size = {size} trials) is random; with n_trials = {n_trials} " \
                   "the study never breeds a second one (set population_size below n_trials)"
        return None


class QMCSamplerSpec(Sampler):
    """Quasi-Monte Carlo points (needs scipy)."""

    name: Literal["qmc"]
    optuna_class: ClassVar[str] = "QMCSampler"
    needs: ClassVar[str | None] = "scipy.stats.qmc"
    qmc_type: Literal["sobol", "halton"] | None = None
    scramble: bool | None = None
    warn_independent_sampling: bool | None = None
    warn_asynchronous_seeding: bool | None = None


class CmaEsSamplerSpec(Sampler):
    """CMA-ES (needs the cmaes package); it learns after each generation of ``popsize`` trials."""

    name: Literal["cmaes"]
    optuna_class: ClassVar[str] = "CmaEsSampler"
    needs: ClassVar[str | None] = "cmaes"
    n_startup_trials: int | None = Field(None, ge=0, le=10**6, description="random trials first (Optuna's default: 1)")
    sigma0: float | None = Field(None, gt=0, le=1e6)
    popsize: int | None = Field(None, ge=1, le=10**6, description="trials per generation (default: 4 + 3 ln(parameters))")
    use_separable_cma: bool | None = None
    with_margin: bool | None = None
    lr_adapt: bool | None = None
    consider_pruned_trials: bool | None = None
    warn_independent_sampling: bool | None = None

    def startup_warning(self, n_trials: int, n_params: int) -> str | None:
        size = self.popsize or 4 + math.floor(3 * math.log(max(n_params, 1)))
        startup = 1 if self.n_startup_trials is None else self.n_startup_trials
        if n_trials < startup + size:
            return f"cmaes updates after each generation of popsize = {size} trials (after {startup} random ones); with " \
                   f"n_trials = {n_trials} it never updates (set popsize, or raise n_trials to {startup + size})"
        return None


def _sampler_name(value: Any) -> Any:
    """The sampler's name (``tpe`` when none is given), which picks its options' model."""
    return value.get("name", "tpe") if isinstance(value, dict) else getattr(value, "name", None)


# sampler name (each model's `name` literal) -> the model of its options
SAMPLERS = {
    get_args(m.model_fields["name"].annotation)[0]: m
    for m in (GridSamplerSpec, RandomSamplerSpec, TPESamplerSpec, NSGA2SamplerSpec, QMCSamplerSpec, CmaEsSamplerSpec)
}
SamplerSpec = Annotated[Union[tuple(Annotated[m, Tag(n)] for n, m in SAMPLERS.items())], Discriminator(_sampler_name)]
