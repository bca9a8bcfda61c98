"""How long an idle OpenMP thread spins before it sleeps: GNU OpenMP's (torch's and the kernels' team) spins about
300,000 times by default at every join and barrier, so on a machine whose cores other processes take, a thread
waiting for one the scheduler preempted burns a core for milliseconds. Measured (``benchmarks/gptq_vs_gptqmodel.py``'s
tool process, the 156 M Llama beside two busy processes on two cores; ``benchmarks/RESULTS.md``): 68.8 CPU seconds
against 42.8 quiet by default, 44.4 against 50.7 with ``GOMP_SPINCOUNT=10000``, the same weights; a decoding step's
barriers (well under the spin) never sleep.

The runtime reads it once, when torch loads it: :func:`calm` sets it first thing on ``import mase_lite`` (and so in
``mase-lite``) unless the environment says otherwise (``GOMP_SPINCOUNT`` or ``OMP_WAIT_POLICY`` set: yours stands).
Where torch was imported before mase_lite it has no effect (set ``GOMP_SPINCOUNT`` yourself).

>>> calm({"OMP_WAIT_POLICY": "active"})
{'OMP_WAIT_POLICY': 'active'}
>>> calm({})
{'GOMP_SPINCOUNT': '10000'}
"""

from __future__ import annotations

from collections.abc import MutableMapping

SPIN_COUNT = 10_000
"""Spins before an idle OpenMP thread sleeps (about a fifth of a millisecond)."""


def calm(environ: MutableMapping[str, str]) -> MutableMapping[str, str]:
    """``environ`` with ``GOMP_SPINCOUNT`` set to :data:`SPIN_COUNT` unless it or ``OMP_WAIT_POLICY`` is set."""
    if "GOMP_SPINCOUNT" not in environ and "OMP_WAIT_POLICY" not in environ:
        environ["GOMP_SPINCOUNT"] = str(SPIN_COUNT)
    return environ
