"""Seed generation: the correct candidates a search starts from, before any mutation.

- :mod:`ks_inductor.seeds.inductor`: Inductor's own Triton for a problem, read into a plan and rendered as a
  candidate whose launch parameters the search tunes (a seed for every problem Inductor compiles to Triton);
- :mod:`ks_inductor.seeds.families`: op families, each a matcher over the problem's aten graph and templates
  that render structural variants;
- :mod:`ks_inductor.seeds.graph` and :mod:`ks_inductor.seeds.pointwise`: the aten graph the matchers read, and
  aten pointwise ops as Triton expressions, which the templates render with.

The search (:mod:`ks_inductor.evolve`) asks for seeds and templates here; nothing here imports the search.
"""
