"""A stand-in CUDA device for code generation on a machine without one.

Inductor emits its CUDA-flavoured Triton only when torch reports a CUDA device and Triton has a GPU target. On a
CPU-only host (CI, the interpreter judge) this module makes both appear: an sm_90 device with H100-like properties,
and Triton's CUDA backend as the active target. Only code generation runs under it; nothing is launched, and the
generated kernels then run under ``TRITON_INTERPRET=1``. It patches process-wide state, so it is only ever
entered in the throwaway process that generates a seed (``ks_inductor.seeds.inductor.codegen``).
"""

from __future__ import annotations

import types
from typing import Any

# Hopper's figures: Inductor reads the SM count, the capability and the per-SM limits to pick its configs.
_PROPS = dict(
    name="NVIDIA H100 80GB HBM3", major=9, minor=0, multi_processor_count=132, total_memory=80 * 2**30,
    warp_size=32, max_threads_per_multi_processor=2048, regs_per_multiprocessor=65536, max_threads_per_block=1024,
    shared_memory_per_block_optin=232448, shared_memory_per_multiprocessor=233472, L2_cache_size=50 * 2**20,
    gcnArchName="", uuid="kernelsmith-codegen", clock_rate=1980000, memory_clock_rate=2619000,
    memory_bus_width=5120, is_integrated=False,
)


def install() -> None:
    """Make torch and Triton report one sm_90 CUDA device (for code generation only)."""
    import torch
    import torch.utils._triton as torch_triton
    from torch._dynamo.device_interface import get_interface_for_device
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import make_backend

    props = types.SimpleNamespace(**_PROPS)
    cuda: Any = torch.cuda
    cuda.is_available = lambda: True
    cuda.device_count = lambda: 1
    cuda.current_device = lambda: 0
    cuda.get_device_properties = lambda *a, **k: props
    cuda.get_device_capability = lambda *a, **k: (props.major, props.minor)
    cuda.get_device_name = lambda *a, **k: props.name
    cuda.get_rng_state = lambda *a, **k: torch.zeros(16, dtype=torch.uint8)
    cuda.set_rng_state = lambda *a, **k: None
    cuda._exchange_device = lambda d: 0
    cuda._maybe_exchange_device = lambda d: 0
    cuda.set_device = lambda d: None
    cuda.synchronize = lambda *a, **k: None

    target = GPUTarget("cuda", props.major * 10 + props.minor, props.warp_size)
    torch_triton.triton_backend = lambda: make_backend(target)
    torch_triton.has_triton = lambda: True
    iface: Any = get_interface_for_device("cuda")
    iface.Worker.get_device_properties = staticmethod(lambda device=None: props)
    iface.Worker.current_device = staticmethod(lambda: 0)
    iface.is_available = staticmethod(lambda: True)
    iface.get_compute_capability = staticmethod(lambda device=None: props.major * 10 + props.minor)
    # The interface bound torch.cuda's functions when it was defined, before the patches above.
    iface.get_device_properties = staticmethod(lambda device=None: props)
    iface.current_device = staticmethod(lambda: 0)
    iface.device_count = staticmethod(lambda: 1)
