"""Problems by op family: ``FAMILY_PROBLEMS`` maps a name to (source, the family the problem must classify as, or
None where every family must decline it); ``CONTRACT_PROBLEMS`` are those whose every template variant must also
render within its space and pass the judge's static rules (tests/test_family_contract.py). A new family adds its
problems to one of them, or to a module of its own merged into ``CONTRACT_PROBLEMS``."""

from __future__ import annotations

from ks_inductor.catalogue.attention import DECODE_PROBLEMS, PREFILL_PROBLEMS
from ks_inductor.catalogue.sources import module, norm_module

FAMILY_PROBLEMS = {
    "log_softmax": (module("        return torch.log_softmax(xs[0], dim=1)", "[torch.randn(4, 40)]"),
                    "log_softmax"),
    "layernorm_by_hand": (module(
        "        x = xs[0]\n        m = x.mean(-1, keepdim=True)\n"
        "        v = ((x - m) ** 2).mean(-1, keepdim=True)\n        return (x - m) / torch.sqrt(v + 1e-5)",
        "[torch.randn(4, 32)]"), "layernorm"),
    "row_sum": (module("        return xs[0].sum(dim=1)", "[torch.randn(4, 40)]"), "reduction"),
    "col_mean": (module("        return xs[0].mean(dim=0)", "[torch.randn(40, 12)]"), "reduction"),
    "matmul_mish_mish": (module(
        "        return F.mish(F.mish(self.linear(xs[0])))", "[torch.randn(8, 16)]",
        "        self.linear = nn.Linear(16, 12)"), "matmul"),
    "bmm_relu": (module("        return torch.relu(torch.bmm(xs[0], xs[1]))",
                        "[torch.randn(2, 8, 12), torch.randn(2, 12, 6)]"), "matmul"),
    "bias_gelu": (module("        return F.gelu(xs[0] + self.bias)", "[torch.randn(6, 10)]",
                         "        self.bias = nn.Parameter(torch.randn(10))"), "pointwise"),
    "gelu_and_mul": (module("        x = xs[0]\n        return F.gelu(x[:, :8]) * x[:, 8:]", "[torch.randn(4, 16)]"),
                     "act_mul"),
    # The matmul regions of a decode step: Linear on 3-D activations with a residual add, the SiLU gate, and
    # the o-projection, which aten can run as bmm against one weight expanded over the batch.
    "linear3d_residual": (module(
        "        return xs[1] + self.lin(xs[0])",
        "[torch.randn(4, 1, 40, dtype=torch.bfloat16), torch.randn(4, 1, 24, dtype=torch.bfloat16)]",
        "        self.lin = nn.Linear(40, 24, bias=False, dtype=torch.bfloat16)"), "matmul"),
    "linear3d_silu_gate": (module(
        "        return F.silu(self.lin(xs[0]).float()).to(torch.bfloat16) * xs[1]",
        "[torch.randn(4, 1, 40, dtype=torch.bfloat16), torch.randn(4, 1, 24, dtype=torch.bfloat16)]",
        "        self.lin = nn.Linear(40, 24, bias=False, dtype=torch.bfloat16)"), "matmul"),
    "bmm_shared_weight": (module(
        "        x = xs[0]\n        return torch.bmm(x, self.w.t().unsqueeze(0).expand(x.shape[0], 40, 24))",
        "[torch.randn(4, 1, 40, dtype=torch.bfloat16)]",
        "        self.w = nn.Parameter(torch.randn(24, 40, dtype=torch.bfloat16))"), "matmul"),
    # Norms over other dims than the last, as KernelBench writes them: over the channels of an NCHW tensor
    # (strided rows, a ragged inner block, C not a power of two), over trailing dims (flattened rows), by a vector
    # norm; and a softmax over a middle dim.
    "rmsnorm_channels": (module(
        "        x = xs[0]\n        return x / torch.sqrt(torch.mean(x ** 2, dim=1, keepdim=True) + 1e-5)",
        "[torch.randn(2, 12, 5, 7)]"), "rmsnorm"),
    "instancenorm_by_hand": (module(
        "        x = xs[0]\n        m = x.mean(dim=(2, 3), keepdim=True)\n"
        "        v = ((x - m) ** 2).mean(dim=(2, 3), keepdim=True)\n        return (x - m) / torch.sqrt(v + 1e-5)",
        "[torch.randn(2, 3, 4, 5)]"), "layernorm"),
    "l2norm_rows": (module("        return xs[0] / torch.norm(xs[0], p=2, dim=1, keepdim=True)",
                           "[torch.randn(4, 40)]"), "rowwise"),
    "linf_norm_channels": (module(
        "        return xs[0] / xs[0].abs().amax(dim=1, keepdim=True)", "[torch.randn(3, 10, 6)]"), "rowwise"),
    "softmax_middle_dim": (module("        return torch.softmax(xs[0], dim=1)", "[torch.randn(2, 12, 9)]"), "softmax"),
    "max_over_dim": (module("        return torch.max(xs[0], dim=1)[0]", "[torch.randn(3, 10, 6)]"), "reduction"),
    "min_over_dim_keep": (module("        return torch.min(xs[0], dim=2, keepdim=True)[0]", "[torch.randn(3, 10, 6)]"),
                          "reduction"),
    "argmax_is_not_a_reduction_here": (module("        return torch.max(xs[0], dim=1)[1]", "[torch.randn(3, 10)]"),
                                       None),
    # Small integers as floats: the native trial is full of ties, which must resolve to the first index.
    "argmax_middle_dim": (module("        return torch.argmax(xs[0], dim=1)", "[torch.randint(0, 4, (3, 37, 6)).float()]"),
                          "reduction"),
    "argmin_last_keepdim": (module("        return torch.argmin(xs[0], dim=-1, keepdim=True)",
                                   "[torch.randint(0, 5, (5, 1100)).float()]"), "reduction"),
    "argmax_of_everything_is_not_here": (module("        return torch.argmax(xs[0])", "[torch.randn(3, 10)]"), None),
    "row_sum_keepdim": (module("        return xs[0].sum(-1, keepdim=True)", "[torch.randn(4, 40)]"), "reduction"),
    # Whole-tensor reductions: the losses (prologue, then a scalar epilogue) and x / ||x|| (a full-shape epilogue).
    "mse_loss": (module("        return F.mse_loss(xs[0], xs[1])", "[torch.randn(37, 301), torch.randn(37, 301)]"),
                 "total"),
    "huber_loss": (module("        return F.smooth_l1_loss(xs[0], xs[1])", "[torch.randn(5, 40), torch.randn(5, 40)]"),
                   "total"),
    "kl_div_batchmean": (module(
        "        return F.kl_div(torch.log(xs[0]), xs[1], reduction='batchmean')",
        "[torch.randn(4, 40).softmax(-1), torch.randn(4, 40).softmax(-1)]"), "total"),
    # the targets broadcast along the rows, and a masked lane's prologue (1 - 0 * 0) is not zero
    "hinge_broadcast": (module("        return torch.mean(torch.clamp(1 - xs[0] * xs[1], min=0))",
                               "[torch.randn(37, 301), torch.randn(301).sign()]"), "total"),
    "frobenius_normalize": (module("        return xs[0] / torch.norm(xs[0], p='fro')", "[torch.randn(3, 37, 100)]"),
                            "total"),
    "l1_norm_bf16_keepdim": (module(
        "        return torch.linalg.vector_norm(xs[0], ord=1, dim=(0, 1), keepdim=True) * 0.5 + 1",
        "[torch.randn(7, 40).bfloat16()]"), "total"),
    # Scans: forwards over rows, backwards (between flips), exclusive (the cat idiom), over a strided dim with a
    # prologue, in bf16 with an epilogue that reads the input again.
    "cumsum_rows": (module("        return torch.cumsum(xs[0], dim=1)", "[torch.randn(5, 1000)]"), "scan"),
    "cumprod_rows": (module("        return torch.cumprod(xs[0], dim=-1)", "[1 + 0.01 * torch.randn(4, 300)]"),
                     "scan"),
    "cumsum_reverse": (module("        return torch.cumsum(xs[0].flip(1), dim=1).flip(1)", "[torch.randn(5, 700)]"),
                       "scan"),
    "cumsum_exclusive": (module(
        "        x = xs[0]\n        return torch.cat([torch.zeros_like(x[:, :1]), x[:, :-1].cumsum(1)], dim=1)",
        "[torch.randn(5, 700)]"), "scan"),
    "masked_cumsum_middle_dim": (module("        return torch.cumsum(xs[0] * xs[1], dim=1)",
                                        "[torch.randn(3, 50, 7), torch.rand(3, 50, 7) > 0.5]"), "scan"),
    "cumsum_bf16_minus_input": (module("        return torch.cumsum(xs[0], dim=-1) - xs[0]",
                                       "[torch.randn(4, 600).bfloat16()]"), "scan"),
    # Pools: the 1-d ones reach aten as 2-d pools of an unsqueezed input; ceil_mode windows overhang the input.
    "max_pool1d_dilated": (module("        return F.max_pool1d(xs[0], 5, stride=2, padding=2, dilation=2)",
                                  "[torch.randn(2, 3, 37)]"), "pool"),
    "max_pool2d_ceil": (module("        return F.max_pool2d(xs[0], 3, stride=2, padding=1, ceil_mode=True)",
                               "[torch.randn(1, 2, 15, 17)]"), "pool"),
    "max_pool3d_bf16": (module("        return F.max_pool3d(xs[0], 2)", "[torch.randn(1, 2, 6, 7, 9).bfloat16()]"),
                        "pool"),
    "avg_pool1d_padded_bf16": (module("        return F.avg_pool1d(xs[0], 4, stride=3, padding=2, ceil_mode=True)",
                                      "[torch.randn(2, 3, 29).bfloat16()]"), "pool"),
    "avg_pool2d_ceil_uncounted_pad": (module(
        "        return F.avg_pool2d(xs[0], 3, stride=2, padding=1, ceil_mode=True, count_include_pad=False)",
        "[torch.randn(1, 2, 15, 17)]"), "pool"),
    "avg_pool3d_divisor": (module(
        "        return F.avg_pool3d(xs[0], (2, 3, 2), stride=(1, 2, 2), padding=(1, 1, 0), divisor_override=5)",
        "[torch.randn(1, 2, 5, 8, 7)]"), "pool"),
    # Windows that overlap along the rows (the window variant reuses each input row's partial across output rows).
    "max_pool2d_stride1": (module("        return F.max_pool2d(xs[0], 4, stride=1, padding=1)",
                                  "[torch.randn(1, 2, 21, 19)]"), "pool"),
    "max_pool2d_dilated_rows": (module(
        "        return F.max_pool2d(xs[0], (3, 2), stride=(1, 2), padding=(1, 1), dilation=(2, 1))",
        "[torch.randn(1, 2, 17, 23)]"), "pool"),
    "avg_pool3d_overlap": (module("        return F.avg_pool3d(xs[0], 3, stride=(2, 1, 2), padding=1)",
                                       "[torch.randn(1, 2, 7, 9, 11)]"), "pool"),
    # Long contiguous groups: group norm, layer norm over trailing dims, instance norm (through batch norm).
    "group_norm_affine": (norm_module("nn.GroupNorm(3, 6)", "[torch.randn(2, 6, 5, 7) * 3 + 40]"), "group_norm"),
    "layer_norm_3d": (norm_module("nn.LayerNorm((4, 6, 7))", "[torch.randn(3, 4, 6, 7)]"), "group_norm"),
    "instance_norm": (norm_module("nn.InstanceNorm2d(3)", "[torch.randn(2, 3, 9, 11)]", affine=False), "group_norm"),
    # Batch norm in training mode: a group is a channel, one strided segment per batch entry; running statistics.
    "batch_norm_2d": (norm_module("nn.BatchNorm2d(4, momentum=0.3)", "[torch.randn(3, 4, 5, 7) * 3 + 40]"),
                      "group_norm"),
    "batch_norm_1d_plain": (norm_module("nn.BatchNorm1d(3, affine=False)", "[torch.randn(5, 3, 9).bfloat16()]",
                                        affine=False), "group_norm"),
    "batch_norm_untracked": (norm_module("nn.BatchNorm1d(6, track_running_stats=False)", "[torch.randn(4, 6, 11)]"),
                             "group_norm"),
    "max_pool_indices_are_not_here": (module("        return F.max_pool2d(xs[0], 2, return_indices=True)",
                                             "[torch.randn(1, 2, 6, 6)]"), None),
    "cummax_is_not_here": (module("        return torch.cummax(xs[0], dim=1)[0]", "[torch.randn(3, 10)]"), None),
    "amax_of_everything_is_not_here": (module("        return xs[0].amax()", "[torch.randn(3, 10)]"), None),
    "two_totals_are_not_here": (module("        return xs[0].sum() + xs[1].mean()",
                                       "[torch.randn(3, 10), torch.randn(3, 10)]"), None),
    "conv": (module("        return F.conv2d(xs[0], xs[1])", "[torch.randn(1, 2, 6, 6), torch.randn(3, 2, 3, 3)]"),
             None),
}

CONTRACT_PROBLEMS: dict[str, tuple[str, str | None]] = {**DECODE_PROBLEMS, **PREFILL_PROBLEMS}

# Softmax over 11 bf16 rows of 40, scaled by a weight: rows that no block of two divides evenly.
ROWS11 = module("        x = xs[0]\n        return torch.softmax(x.float() * 2.0, dim=-1).to(x.dtype) * self.w",
                "[torch.randn(11, 40, dtype=torch.bfloat16)]",
                init="        self.w = nn.Parameter(torch.randn(40, dtype=torch.bfloat16))")
