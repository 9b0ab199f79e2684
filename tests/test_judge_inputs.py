"""Where the judge draws a problem's own inputs: on the trial's device, never through host memory first."""

from __future__ import annotations

import types


def test_the_problems_own_draw_happens_on_the_trial_device():
    import torch

    from ks_inductor.judge.inputs import make_inputs

    # 4 TiB each: drawn on the host first, these would fail to allocate; on the meta device they cost nothing. The
    # GPU case is the same path (KernelBench's avg pool 2d draws 16 GiB, over the worker's host-memory limit).
    huge = 1 << 40
    mod = types.SimpleNamespace(get_inputs=lambda: [torch.rand(huge), torch.randint(0, 9, (huge,)),
                                                    torch.arange(3, device="cpu")])
    specs = [{"kind": "tensor", "dtype": "float32", "shape": [huge], "stride": [1]},
             {"kind": "tensor", "dtype": "int64", "shape": [huge], "stride": [1]},
             {"kind": "tensor", "dtype": "int64", "shape": [3], "stride": [1]}]
    native = make_inputs(mod, specs, 3, "native", "meta")
    assert [x.device.type for x in native] == ["meta"] * 3
    assert native[0].shape == (huge,) and native[1].dtype == torch.int64
