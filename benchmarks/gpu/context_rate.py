"""How fast fresh processes can make a CUDA context, on one device and spread over several.

    python benchmarks/gpu/context_rate.py [--n 48] [--concurrency 1,4,8,16] [--out PATH]

The judge gives every candidate a fresh process, forked from a warm parent that imported torch and never touched
the device (``ks_inductor/judge/forkserver.py``); each child makes its own context. This measures that step alone:
a parent imports torch, then forks ``--n`` children, ``--concurrency`` at a time, each of which selects a device
(round-robin over the devices of the run), makes its context with torch, synchronises, and exits. Reported per
(devices, concurrency): children per second, and each child's context time and exit time (median, max). If the rate
stays the same when the children are spread over more devices, context creation is serialised on the host, and a
judge that makes one context per judgment is bounded by that rate whatever the number of GPUs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time


def _child(device: int, w: int) -> None:
    code = 1
    try:
        os.environ["CUDA_VISIBLE_DEVICES"] = str(device)
        import torch

        t0 = time.perf_counter()
        torch.empty(1, device="cuda").add_(1)
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        os.write(w, (json.dumps({"ctx_s": t1 - t0, "exit_at": time.time()}) + "\n").encode())
        code = 0
    finally:
        os._exit(code)


def run(devices: list[int], concurrency: int, n: int) -> dict:
    ctx, exits = [], []
    in_flight: dict[int, tuple[int, float]] = {}
    started = 0
    t0 = time.perf_counter()
    while started < n or in_flight:
        while started < n and len(in_flight) < concurrency:
            r, w = os.pipe()
            pid = os.fork()
            if pid == 0:
                os.close(r)
                _child(devices[started % len(devices)], w)
            os.close(w)
            in_flight[pid] = (r, time.time())
            started += 1
        pid, _status = os.wait()
        reaped = time.time()
        if pid not in in_flight:
            continue
        r, _ = in_flight.pop(pid)
        data = b""
        while chunk := os.read(r, 4096):
            data += chunk
        os.close(r)
        if data:
            msg = json.loads(data)
            ctx.append(msg["ctx_s"])
            exits.append(reaped - msg["exit_at"])
    wall = time.perf_counter() - t0
    return {
        "devices": devices, "concurrency": concurrency, "children": n, "ok": len(ctx), "wall_s": round(wall, 3),
        "children_per_s": round(n / wall, 2),
        "ctx_median_s": round(statistics.median(ctx), 3) if ctx else None,
        "ctx_max_s": round(max(ctx), 3) if ctx else None,
        "exit_median_s": round(statistics.median(exits), 3) if exits else None,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=48)
    ap.add_argument("--concurrency", default="1,4,8,16")
    ap.add_argument("--out")
    args = ap.parse_args()
    import torch  # the warm parent's import; it must not initialise the device

    listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout
    count = max(1, sum(1 for ln in listed.splitlines() if ln.startswith("GPU ")))
    assert not torch.cuda.is_initialized()
    rows = []
    for devs in ([0], list(range(count))) if count > 1 else ([0],):
        for c in (int(x) for x in args.concurrency.split(",")):
            rows.append(run(devs, c, args.n))
            print(json.dumps(rows[-1]), file=sys.stderr)
    report = {"what": "CUDA contexts made by fresh forked processes", "torch": torch.__version__, "rows": rows}
    text = json.dumps(report, indent=1)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    else:
        print(text)


if __name__ == "__main__":
    main()
