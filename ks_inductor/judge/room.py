"""A region's room: how far the faster of eager and Inductor is from the floor the hardware sets.

The floor is the larger of the bytes the problem must move at the device's measured copy rate and, for problems with
a matrix product or a convolution, its FLOPs at the device's measured dense rate for the dtype, plus one kernel
launch as the judge's timing measures a call (a serving-size region moves so few bytes that the launch is most of
any kernel's time). A region whose best baseline is already within ``SETTLE_AT`` of its floor is *settled*: no
kernel can be much faster, so a search spends nothing there and the backend serves the faster baseline. Everything
else has room, and the share of a warm's time a region gets follows it.

One place for the rule: the judge builds a :class:`Room` from the baselines it times once per problem; the evolver,
warm, explain and the backend read the same dataclass (stored beside the kernels, see
``kernel_cache.store.KernelStore.put_room``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ks_core.problem_record import Problem

# A best baseline at this fraction of the floor or above is settled (within 10% of it).
SETTLE_AT = 0.9
# Eager is served instead of Inductor's code for a region only where it is faster by this much per call: below it,
# the two are a tie within what a search's timing resolves, and Inductor's code keeps its fusion across regions.
EAGER_MARGIN = 0.05
# A warm gives a region its whole time limit where its best baseline runs at this fraction of the floor or below;
# nearer the floor, a share that shrinks with the room left, never under MIN_SHARE.
FULL_SHARE_BELOW = 0.5
MIN_SHARE = 0.25
# Ops whose FLOPs can bind a region to the compute rate rather than the copy rate.
COMPUTE_OPS = frozenset({"mm", "addmm", "bmm", "baddbmm", "convolution", "sdpa", "_scaled_dot_product_flash_attention",
                         "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention"})


def tf32_rate(problem: Problem) -> bool:
    """Whether the floor takes float32 FLOPs at the TF32 rate: where eager runs them there (cuDNN's float32
    convolutions by default, matmuls where torch allows TF32), so the floor stays below what eager itself reaches."""
    import torch

    if compute_dtype(problem.dtypes) != "float32":
        return False
    ops = problem.op_summary.keys()
    return bool(("convolution" in ops and torch.backends.cudnn.allow_tf32)
                or (ops & {"mm", "addmm", "bmm", "baddbmm"} and torch.backends.cuda.matmul.allow_tf32))


def compute_dtype(dtypes: Any) -> str:
    """The dtype whose dense rate bounds a problem's FLOPs: the lowest precision among its floating inputs."""
    return next((d for d in ("bfloat16", "float16", "float32") if d in dtypes), "float32")


def floor_ms(problem: Problem, bandwidth: float | None, flops_rate: float | None,
             launch_ms: float | None = None) -> tuple[float | None, str]:
    """The problem's floor in ms and what binds it ("memory" or "compute"); (None, "") without a copy rate.
    ``launch_ms``: one minimal kernel's time as the protocol measures a call, added once, since a region served by
    a single kernel still pays its launch (left out, the floor is the roofline's alone)."""
    t_bytes = problem.bytes_moved / bandwidth * 1e3 if bandwidth else 0.0
    t_flops = (problem.flops / flops_rate * 1e3
               if flops_rate and problem.op_summary.keys() & COMPUTE_OPS else 0.0)
    if not t_bytes and not t_flops:
        return None, ""
    return max(t_bytes, t_flops) + (launch_ms or 0.0), "compute" if t_flops > t_bytes else "memory"


@dataclass
class Room:
    """What a region can still gain: its floor against the baselines timed in one run (per call, L2 flushed,
    inputs refreshed before every call)."""

    problem_key: str
    floor_ms: float | None = None
    bound: str = ""  # "memory" | "compute"
    bytes_moved: int = 0
    flops: int = 0
    bandwidth: float | None = None  # bytes/s, device-to-device copy, measured beside the baselines
    flops_rate: float | None = None  # FLOP/s of a dense matmul in ``dtype``, measured likewise
    # One minimal kernel's time per call (ms), measured likewise and part of ``floor_ms``; None in a room stored
    # without it, whose floor has no launch term.
    launch_ms: float | None = None
    dtype: str = ""
    eager_ms: float | None = None
    inductor_ms: float | None = None
    # A serving stack's own kernels timed beside them (``JudgeConfig.peers``), by name.
    peer_ms: dict[str, float] = field(default_factory=dict)
    device: str = ""
    # Why a figure is missing (a baseline that did not build, no floor on this device, ...), in one line.
    note: str = ""

    def _timed(self) -> dict[str, float]:
        return {k: v for k, v in (("eager", self.eager_ms), ("inductor", self.inductor_ms),
                                  *sorted(self.peer_ms.items())) if v}

    @property
    def best(self) -> str | None:
        """The fastest baseline ("eager", "inductor" or a stack's own kernel), or None when none was timed."""
        ms = self._timed()
        return min(ms, key=ms.get) if ms else None

    @property
    def best_ms(self) -> float | None:
        b = self.best
        return None if b is None else self._timed()[b]

    @property
    def fraction(self) -> float | None:
        """The best baseline's speed as a fraction of the floor's (1.0: at the floor)."""
        best = self.best_ms
        return self.floor_ms / best if self.floor_ms and best else None

    def settled(self, at: float = SETTLE_AT) -> bool:
        f = self.fraction
        return f is not None and f >= at

    @property
    def eager_gain(self) -> float | None:
        """Inductor's time over eager's: above 1, eager is faster."""
        return self.inductor_ms / self.eager_ms if self.eager_ms and self.inductor_ms else None

    @property
    def serves_eager(self) -> bool:
        """Eager's ops are the faster of the two baselines by the margin: the backend keeps them out of Inductor."""
        g = self.eager_gain
        return g is not None and g >= 1 + EAGER_MARGIN

    @property
    def weight(self) -> float:
        """A region's place in a warm's order: the time its best baseline spends above the floor (ms per call), or
        its whole time where there is no floor."""
        best = self.best_ms
        if best is None:
            return 0.0
        return max(0.0, best - (self.floor_ms or 0.0))

    def summary(self) -> str:
        """One line: the baselines against the floor."""
        if self.best_ms is None:
            return f"room not measured: {self.note}" if self.note else "room not measured"
        parts = [f"eager {self.eager_ms:.4g} ms" if self.eager_ms else "eager -",
                 f"Inductor {self.inductor_ms:.4g} ms" if self.inductor_ms else "Inductor -",
                 *(f"{k} {v:.4g} ms" for k, v in sorted(self.peer_ms.items()))]
        if self.fraction is None:
            return ", ".join(parts) + " (no floor on this device)"
        state = "settled" if self.settled() else "room"
        launch = f" with a {self.launch_ms:.2g} ms launch" if self.launch_ms else ""
        return (f"{', '.join(parts)}; floor {self.floor_ms:.4g} ms ({self.bound}{launch}): best ({self.best}) at "
                f"{100 * self.fraction:.0f}% of the floor, {state}")

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "fraction": self.fraction, "best": self.best, "settled": self.settled()}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Room:
        names = cls.__dataclass_fields__.keys()
        return cls(**{k: v for k, v in data.items() if k in names})


def room_cell(data: dict[str, Any] | None) -> str:
    """A stored room (``Room.to_json()``) in a table cell: the best baseline's share of the floor, and whether that
    settles the region."""
    if not data:
        return "-"
    r = Room.from_json(data)
    if r.fraction is None:
        return "no floor" if r.best_ms else "-"
    return f"{r.best} at {100 * r.fraction:.0f}% of floor" + (" (settled)" if r.settled() else "")


def time_share(room: Room | None) -> float:
    """The share of a region's time limit its search gets: all of it where the best baseline is at half its floor
    or further (or where the room is unknown), less as the floor nears, and at least ``MIN_SHARE``."""
    f = room.fraction if room is not None else None
    if f is None:
        return 1.0
    return max(MIN_SHARE, min(1.0, (1.0 - f) / (1.0 - FULL_SHARE_BELOW)))
