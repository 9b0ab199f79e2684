"""The served-call benchmark (``benchmarks/served_call.py``) times the path a served call takes, serving."""

from __future__ import annotations

import torch

from benchmarks.served_call import measure, served_op


def test_the_benchmarked_op_serves_its_signature_and_counts_each_call():
    args = (torch.randn(16, 1, 64), torch.randn(64))
    op = served_op(args)
    with torch.no_grad():
        assert all(op(*args) is args[0] for _ in range(3))
    assert op._hit() == 4  # the check call in served_op, then three


def test_a_measurement_times_both_arities():
    got = measure("cpu", calls=50)
    assert got["device"] == "cpu" and got["calls"] == 50
    for n in (2, 4):
        assert got[f"served_{n}_inputs_us"] > 0 and got[f"bare_{n}_inputs_us"] > 0
