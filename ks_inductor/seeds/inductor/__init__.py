"""Seeds from Inductor's own Triton: every problem Inductor compiles to Triton kernels starts its search from a
correct kernel at Inductor's speed, whatever op family it belongs to.

- :mod:`codegen` asks Inductor for its code (in a throwaway process) and reads it into a plan;
- :mod:`program` is that plan, plain data;
- :mod:`render` turns a plan and launch parameters into a candidate module;
- :mod:`generate` runs the throwaway process and keeps its plans for the search's lifetime.
"""

from ks_inductor.seeds.inductor.generate import inductor_programs
from ks_inductor.seeds.inductor.program import InductorProgram, SeedUnavailable

__all__ = ["InductorProgram", "SeedUnavailable", "inductor_programs"]
