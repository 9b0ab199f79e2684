"""Feeding the judge's speed verdict synthetic samples, as its workers would report them."""

from __future__ import annotations


def judge_speed(judge, r, problem, msg):
    """``Judge._judge_speed`` fed synthetic samples: the candidate's as its worker reports them, the baselines' as
    their trusted worker does."""
    from ks_inductor.judge.service import _Baselines

    samples, steady = msg["samples"], msg.get("steady_samples") or {}
    base = _Baselines({"samples": {k: v for k, v in samples.items() if k != "candidate"},
                       "steady_samples": {k: v for k, v in steady.items() if k != "candidate"},
                       "bandwidth": msg.get("bandwidth"), "launch_ms": msg.get("launch_ms")}, at=0.0)
    own = {"samples": {"candidate": samples["candidate"]}, "wall": msg.get("wall"),
           "steady_samples": {"candidate": steady["candidate"]} if "candidate" in steady else {},
           "steady_skipped": msg.get("steady_skipped")}
    judge._judge_speed(r, problem, own, base)
