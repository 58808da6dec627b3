"""Model backends behind one interface (:class:`~backend.generators.base.Generator`)."""

from backend.generators.base import Constraint, Generation, GenerationError, Generator, SamplingParams

__all__ = ["Constraint", "Generation", "GenerationError", "Generator", "SamplingParams"]
