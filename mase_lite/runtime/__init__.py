"""Running a compressed model: the whole-model decoding step, generation with a key/value cache, weights streamed
from disk."""
