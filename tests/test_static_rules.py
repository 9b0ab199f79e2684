"""The static rules that do not rest on names: modules reached through attributes, hooks, the judge's own state,
and state kept across calls however the object is reached. Each rule is shown catching the cheat and leaving the
ordinary code of a kernel wrapper alone (the renders of every template are held to no findings in
test_family_contract.py and test_templates_judge.py)."""

from __future__ import annotations

import textwrap

import pytest

from ks_inductor.judge.static_checks import static_check

_KERNEL = '''
@triton.jit
def _copy(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)
'''


def candidate(module: str = "", forward: str = "", init: str = "", members: str = "") -> str:
    """A working candidate (a copy kernel) with ``module`` code at module level, ``members`` in the class body, and
    ``init`` and ``forward`` lines at the start of those methods."""
    def block(code: str, indent: int) -> str:
        return textwrap.indent(textwrap.dedent(code).strip("\n"), " " * indent) + "\n" if code.strip() else ""

    return ("import dataclasses\nimport enum\nimport functools\nimport math\nimport operator\nimport typing\n"
            "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\nimport triton\n"
            "import triton.language as tl\n\n" + block(module, 0) + _KERNEL + "\n\nclass ModelNew(nn.Module):\n"
            + block(members, 4)
            + "    def __init__(self):\n        super().__init__()\n" + block(init, 8)
            + "\n    def forward(self, x):\n" + block(forward, 8)
            + "        out = torch.empty_like(x)\n"
            + "        _copy[(triton.cdiv(x.numel(), 256),)](x, out, x.numel(), BLOCK=256)\n"
            + "        return out\n")


def flags(source: str) -> set[str]:
    return {flag for flag, _ in static_check(source)}


def test_the_candidate_scaffold_is_clean():
    assert static_check(candidate()) == []


# -- modules reached through attributes, whatever the base
@pytest.mark.parametrize("module,forward", [
    ("", "torch.os.getcwd()"),                                    # torch imports os
    ("_t = torch\n_os = _t.os", ""),                              # through an alias of torch
    ("import torch as T\n_m = T.sys.modules", ""),
    ("_x = torch.nn\n_s = _x.modules.module.sys", ""),
    ("_s = typing.sys", ""),
    ("_b = enum.bltns", ""),                                      # enum's alias of builtins
    ("_np = F.np", ""),                                           # numpy, reached through torch.nn.functional
    ("_th = dataclasses._thread", ""),
    ("from typing import sys", ""),
    ("from torch import os", ""),
    ("", "box = [torch]\nbox[0].inspect.stack()"),
    ("", "m = functools.reduce(lambda a, b: a, [1], torch)"),    # a module handed to a function
    ("_tl = triton.language", ""),
])
def test_modules_are_reached_by_no_attribute_and_no_alias(module, forward):
    assert "module_reach" in flags(candidate(module, forward))


@pytest.mark.parametrize("name", ["ks_inductor", "kernel_cache", "ALLOWED_IMPORTS", "TORCH_ALLOWED_CALLS",
                                  "COMPUTE_METHODS", "ALLOWED_ATEN", "modules"])
def test_the_judges_own_state_is_out_of_reach(name):
    assert "module_reach" in flags(candidate(f"_v = nn.{name}"))
    assert "module_reach" in flags(candidate(forward=f"v = x.{name}"))


def test_attributes_that_only_read_tensors_and_modules_are_fine():
    src = candidate(module="_DT = {torch.float32: tl.float32}\n_N = functools.reduce(operator.mul, (2, 3), 1)",
                    forward="n = math_like = x.numel() + _DT[x.dtype].primitive_bitwidth\n"
                            "s = typing.cast(int, x.shape[0]) + torch.finfo(x.dtype).bits\n"
                            "d = x.device if x.is_cuda else torch.device('cpu')")
    assert static_check(src) == []


# -- hooks
@pytest.mark.parametrize("code", [
    "self.register_forward_hook(lambda m, a, o: o)",
    "self.register_forward_pre_hook(lambda m, a: a)",
    "self.register_full_backward_hook(lambda m, gi, go: gi)",
    "x.register_hook(lambda g: g)",
    "r = nn.modules.module\nr.register_module_forward_hook(lambda m, a, o: o)",
    "h = nn.Module.register_module_forward_pre_hook",
    "g = self._forward_hooks",
    "self._register_state_dict_hook(lambda *a: None)",
    "torch.library.register_dispatch_key",
])
def test_hooks_are_refused_by_name_on_any_base(code):
    assert "hook" in flags(candidate(forward=code))


def test_registering_a_hook_by_import_is_refused():
    assert "hook" in flags(candidate("from torch.nn.modules.module import register_module_forward_hook"))


def test_members_are_registered_in_init_without_a_finding():
    src = candidate(init="self.register_buffer('scale', torch.ones(4))\n"
                         "self.register_parameter('w', nn.Parameter(torch.ones(4)))")
    assert static_check(src) == []


# -- state kept across calls
@pytest.mark.parametrize("module,forward", [
    ("_CACHE = {}", "_CACHE.update({x.shape: x})"),
    ("_CACHE = {}", "_CACHE.setdefault(x.data_ptr(), x)"),
    ("_CACHE = {}", "_CACHE[x.data_ptr()] = x"),                 # a pointer-keyed cache
    ("_CACHE = {}", "del _CACHE[0]"),
    ("_SEEN = []", "_SEEN.append(x)"),
    ("_SEEN = []", "_SEEN.extend([x])"),
    ("_SEEN = []", "_SEEN.insert(0, x)"),
    ("_SEEN = set()", "_SEEN.add(x.data_ptr())"),
    ("_SEEN = []", "_SEEN.pop()"),
    ("_SEEN = []", "_SEEN.clear()"),
    ("_Q = dict()", "_Q.put(x)"),
    ("_CACHE = {}", "dict.update(_CACHE, {1: x})"),              # through the type's method
    ("_CACHE = {}", "fill = _CACHE.update\nfill({1: x})"),       # a bound mutator handed out
    ("_CACHE = {}\n_fill = _CACHE.update", "_fill({1: x})"),
    ("_CACHE = {}\n_put = lambda k, v: _CACHE.update({k: v})", "_put(1, x)"),
    ("class _Box:\n    pass\n\n\n_BOX = _Box()", "_BOX.last = x"),
    ("", "ModelNew.cache = {x.data_ptr(): x}"),
])
def test_module_level_state_is_not_changed_by_a_call(module, forward):
    assert "result_cache" in flags(candidate(module, forward))


@pytest.mark.parametrize("forward", [
    "c = _CACHE\nc[x.data_ptr()] = x",
    "c = _CACHE if x.is_cuda else {}\nc.update({1: x})",
    "c, n = _CACHE, 0\nc.setdefault(1, x)",
    "inner = _CACHE.get('a')\ninner.append(x)",                 # an element of a kept container
    "for inner in _CACHE.values():\n    inner.append(x)",
    "copy = list(_CACHE.values())\ncopy[0].append(x)",           # a copy still holds the kept elements
])
def test_kept_containers_are_not_changed_through_another_name(forward):
    assert {"result_cache", "stateful"} & flags(candidate("_CACHE = {'a': []}", forward))


def test_a_function_that_mutates_module_state_is_refused_wherever_it_is_defined():
    src = candidate(module="def _remember(k, v):\n    _CACHE[k] = v\n\n\n_CACHE = {}", forward="_remember(1, x)")
    assert "result_cache" in flags(src)


@pytest.mark.parametrize("forward", [
    "ModelNew.cache.update({x.data_ptr(): x})",
    "type(self).cache[x.data_ptr()] = x",
    "self.__class__.cache[x.data_ptr()] = x",
])
def test_class_level_containers_are_not_changed_by_a_call(forward):
    assert "result_cache" in flags(candidate(forward=forward, members="cache = {}\n"))
    aliased = candidate(forward="k = type(self)\nk.cache[0] = x", members="cache = {}\n")
    assert {"result_cache", "stateful"} & flags(aliased)


def test_a_classmethod_may_not_change_its_class():
    src = candidate(members="cache = {}\n\n@classmethod\ndef remember(cls, k, v):\n    cls.cache[k] = v\n",
                    forward="self.remember(1, x)")
    assert "result_cache" in flags(src)


@pytest.mark.parametrize("forward", [
    "self.cache.update({x.data_ptr(): x})",
    "self.cache[x.data_ptr()] = x",
    "self.last = x",
    "c = self.cache\nc.append(x)",
    "self.buf.copy_(x)",
    "self.cache.get(0).append(x)",
])
def test_forward_keeps_nothing_on_the_instance(forward):
    src = candidate(init="self.cache = {}\nself.buf = torch.empty(4)", forward=forward)
    assert "stateful" in flags(src)


def test_a_helper_method_keeps_nothing_on_the_instance_either():
    src = candidate(members="def _remember(self, k, v):\n    self.cache[k] = v\n\n",
                    init="self.cache = {}", forward="self._remember(x.data_ptr(), x)")
    assert "stateful" in flags(src)


@pytest.mark.parametrize("code", [
    "def forward(self, x, _memo={}):",
    "def forward(self, x, _calls=[0]):",
    "def forward(self, x, *, _seen=set()):",
])
def test_a_mutable_default_argument_is_a_cache(code):
    src = candidate().replace("def forward(self, x):", code)
    assert "result_cache" in flags(src)


def test_parameters_and_closures_are_not_the_functions_own():
    helper = "def _put(memo, k, v):\n    memo[k] = v\n"
    assert "stateful" in flags(candidate(helper))
    closure = ("def _make():\n    seen = {}\n\n    def put(k, v):\n        seen[k] = v\n    return put\n\n\n"
               "_put = _make()")
    assert "result_cache" in flags(candidate(closure))


def test_a_helper_fills_the_tensor_it_is_handed():
    helper = "def _clear(buf, acc):\n    buf.zero_()\n    acc[..., :4] = 0\n    acc.view(-1)[2:] = 1\n"
    assert static_check(candidate(helper, forward="_clear(torch.empty(4), torch.empty(2, 8))")) == []
    assert "stateful" in flags(candidate("def _keep(buf, k):\n    buf[k] = 0\n"))
    assert "stateful" in flags(candidate("def _tag(t, v):\n    t.cached = v\n"))  # a cache kept on a tensor


def test_objects_a_call_makes_are_its_own_to_change():
    src = candidate(
        module="_CONFIGS = []\n_CONFIGS.append(4)\n_LOOKUP = {torch.float32: 1}",
        init="self.sizes = []\nself.sizes.append(4)\nself.norm = nn.LayerNorm(4)\nself.norm.weight = "
             "nn.Parameter(torch.ones(4))",
        forward="outs = []\nouts.append(x)\nshape = list(x.shape)\nshape.append(1)\n"
                "dims = [1] * (4 - x.dim()) + list(x.shape)\ndims[0] = 2\nflat = torch.empty(8)\n"
                "flat.view(2, 4)[0] = 0\nflat.zero_()\nk = _LOOKUP[x.dtype] + _LOOKUP.get(x.dtype, 0)\n"
                "ok = x.dtype in _LOOKUP and len(_CONFIGS) > 0\nfor c in _CONFIGS:\n    k += c")
    assert static_check(src) == []


@pytest.mark.parametrize("forward,flag", [
    ("typing._cleanups.append(x)", "introspection"),               # a library's private container
    ("nn.Module.call_super_init.update({1: x})", "monkeypatch"),   # any container living in a library
    ("torch.nn.functional.pad = None", "monkeypatch"),
])
def test_a_librarys_state_is_no_place_for_results(forward, flag):
    assert flag in flags(candidate(forward=forward))


def test_functions_of_a_module_are_not_mutations():
    src = candidate(init="self.w = nn.Parameter(torch.empty(4))\nnn.init.normal_(self.w)",
                    forward="n = functools.reduce(operator.add, x.shape, 0) + operator.add(1, 2)\n"
                            "scale = 1.0 / math.sqrt(x.shape[-1])")
    assert static_check(src) == []


def test_state_is_read_inside_triton_kernels_without_findings():
    src = candidate().replace("    tl.store(out_ptr + offs", "    acc = tl.zeros([BLOCK], tl.float32)\n"
                                                            "    acc += 1.0\n    tl.store(out_ptr + offs")
    assert static_check(src) == []


# -- dynamic access and files
@pytest.mark.parametrize("module,forward,flag", [
    ("", "f = functools.reduce(getattr, ['os'], x)", "forbidden_builtin"),
    ("_get = getattr", "", "forbidden_builtin"),
    ("_reach = operator.attrgetter('sys.modules')", "", "forbidden_builtin"),
    ("", "operator.setitem(self._buffers, 'k', x)", "forbidden_builtin"),
    ("", "x.numpy().tofile('/tmp/out')", "forbidden_builtin"),
    ("", "y = torch.UntypedStorage.from_file('/tmp/out')", "forbidden_builtin"),
    ("_load = torch.load", "", "forbidden_torch_call"),
    ("_hub = torch.hub", "", "forbidden_torch_call"),
])
def test_dynamic_attribute_access_and_file_access_are_refused_as_values_too(module, forward, flag):
    assert flag in flags(candidate(module, forward))


def test_a_parameter_named_like_a_builtin_is_only_a_parameter():
    src = candidate().replace("def forward(self, x):", "def forward(self, x, input=None, compile=1):")
    assert static_check(src) == []
