"""Mutators: the embedded parameter/variant mutator (default, no endpoint) and the LLM local improver."""

from ks_inductor.evolve.mutators.base import Mutation, describe_source, unified_diff
from ks_inductor.evolve.mutators.embedded import EmbeddedMutator

__all__ = ["EmbeddedMutator", "Mutation", "describe_source", "unified_diff"]
