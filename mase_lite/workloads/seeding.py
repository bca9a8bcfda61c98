"""One call that makes a run repeatable: python's, numpy's and torch's generators (every device)
seeded together, as transformers' ``set_seed`` does.

Example::

    seed_everything(0)
"""

from transformers import set_seed as seed_everything

__all__ = ["seed_everything"]
