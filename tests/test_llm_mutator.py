"""The LLM local improver through the real ``openai`` client, against an OpenAI-compatible server scripted by
the test on 127.0.0.1: good edits, edits that do not apply, syntax errors, exploit attempts, 429 and 500
answers, time-outs, and an endpoint that is not there."""

from __future__ import annotations

import itertools
import json
import random
import re
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from kernel_cache.store import KernelStore
from ks_inductor.catalogue.sources import small_problem
from ks_inductor.evolve import EvolveConfig, LLMConfig, evolve_problem
from ks_inductor.evolve.archive import Archive, Program
from ks_inductor.evolve.evolver import MutationContext
from ks_inductor.evolve.mutators.embedded import EmbeddedMutator
from ks_inductor.evolve.mutators.llm import LLMClient, LLMMutator, LLMUnavailable
from ks_inductor.evolve.operators import OPERATORS
from ks_inductor.judge import Judge, JudgeConfig
from ks_inductor.seeds.families import classify


class ScriptedLLM:
    """A chat-completions endpoint answering from a script; each entry is a callable(prompt) -> (status, body,
    delay_s)."""

    def __init__(self) -> None:
        self.script: list = []
        self.requests: list[dict] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):  # keep pytest output clean
                pass

            def do_POST(self):  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                owner.requests.append(body)
                prompt = body["messages"][-1]["content"]
                step = owner.script.pop(0) if owner.script else (lambda p: (500, {"error": "script empty"}, 0))
                status, payload, delay = step(prompt)
                time.sleep(delay)
                data = json.dumps(payload).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client timed out and left

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def completion(text: str) -> tuple[int, dict, float]:
    return 200, {"id": "c1", "object": "chat.completion", "created": 0, "model": "scripted",
                 "choices": [{"index": 0, "finish_reason": "stop",
                              "message": {"role": "assistant", "content": text}}],
                 "usage": {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120}}, 0.0


def error(status: int) -> tuple[int, dict, float]:
    return status, {"error": {"message": f"scripted {status}", "type": "server_error"}}, 0.0


def current_program(prompt: str) -> str:
    m = re.search(r"# Current program[^\n]*\n```python\n(.*?)\n```", prompt, re.S)
    assert m, "the prompt carries the current program"
    return m.group(1)


_GOOD_EDITS = itertools.count()


def good_edit(prompt: str) -> tuple[int, dict, float]:
    # Halving and doubling in turn: two edits of one parent are two children, not one judged twice.
    src = current_program(prompt)
    m = re.search(r"^( *)ROWS = (\d+)$", src, re.M)
    rows = int(m.group(2))
    new = rows * 2 if next(_GOOD_EDITS) % 2 or rows == 1 else rows // 2
    return completion(f"Fewer rows per program.\n<<<<<<< SEARCH\n{m.group(0)}\n=======\n{m.group(1)}ROWS = {new}\n"
                      ">>>>>>> REPLACE\n")


def stale_edit(prompt: str):
    return completion("<<<<<<< SEARCH\n        BLOCK = 999999\n=======\n        BLOCK = 1\n>>>>>>> REPLACE")


def syntax_error(prompt: str):
    return completion("```python\nimport torch\nclass ModelNew(torch.nn.Module):\n    def forward(self, x:\n```")


def exploit(prompt: str):
    src = current_program(prompt)
    body = src.replace("        n_cols = ", "        try:\n            return torch.matmul(in0, in0.t())\n"
                                         "        except Exception:\n            pass\n        n_cols = ", 1)
    return completion("```python\n" + body + "\n```")


@pytest.fixture()
def llm():
    s = ScriptedLLM()
    yield s
    s.close()


def _free_port() -> int:
    with socket.socket() as sk:
        sk.bind(("127.0.0.1", 0))
        return sk.getsockname()[1]


def test_client_retries_rate_limits_server_errors_and_timeouts(llm) -> None:
    llm.script = [lambda p: error(429), lambda p: error(500), lambda p: (200, completion("late")[1], 1.5),
                  lambda p: completion("hello")]
    client = LLMClient(LLMConfig(base_url=llm.url, model="m", timeout_s=0.5, backoff_s=0.01, max_retries=4))
    text, usage = client.chat([{"role": "user", "content": "hi"}])
    assert text == "hello" and usage == {"prompt_tokens": 100, "completion_tokens": 20}
    assert client.usage["retries"] == 3 and client.usage["requests"] == 4
    assert llm.requests[-1]["model"] == "m"


def test_unconfigured_or_unreachable_endpoint(monkeypatch) -> None:
    for k in ("KERNELSMITH_LLM_BASE_URL", "KERNELSMITH_LLM_MODEL"):
        monkeypatch.delenv(k, raising=False)
    fm = classify(small_problem("rmsnorm_bf16"))
    embedded = EmbeddedMutator(fm, inductor=False)
    with pytest.raises(LLMUnavailable, match="KERNELSMITH_LLM_BASE_URL"):
        LLMMutator(LLMConfig(), embedded)
    monkeypatch.setenv("KERNELSMITH_LLM_BASE_URL", f"http://127.0.0.1:{_free_port()}/v1")
    monkeypatch.setenv("KERNELSMITH_LLM_MODEL", "m")
    seed = embedded.seeds()[0]
    parent = Program(id="p", source_hash=seed.source_hash, candidate=seed.to_json(), descriptor={}, island=0,
                     correct=True, timed=False)
    ctx = MutationContext(small_problem("rmsnorm_bf16"), fm, Archive(), {"device": "cpu"}, {})
    strict = LLMMutator(LLMConfig(backoff_s=0.01, timeout_s=2), embedded)
    with pytest.raises(LLMUnavailable, match="cannot be reached"):
        strict.propose([(parent, 0)], ctx, random.Random(0))
    lenient = LLMMutator(LLMConfig(backoff_s=0.01, timeout_s=2, fallback="embedded"), embedded)
    muts = lenient.propose([(parent, 0)], ctx, random.Random(0))
    assert lenient.fallback_active and muts[0].candidate is not None
    assert muts[0].kind in {"param", *OPERATORS} and muts[0].operator == muts[0].kind


def test_llm_loop_records_every_outcome(llm, tmp_path) -> None:
    problem = small_problem("rmsnorm_bf16")
    llm.script = [good_edit, stale_edit, syntax_error, exploit, lambda p: error(429), good_edit]
    store = KernelStore(f"sqlite:///{tmp_path}/k.db")
    # The row-wise template seeds its one-block variant (Inductor's seeds off; its other variants are operators'
    # steps); four LLM steps are judged after it.
    cfg = EvolveConfig(budget=5, islands=1, parallel=1, seed=0, inductor_seeds=False,
                       llm=LLMConfig(base_url=llm.url, model="scripted", concurrency=1, backoff_s=0.01,
                                     timeout_s=10))
    with Judge(JudgeConfig(backend="triton-interpret", trials=2)) as judge:
        summary = evolve_problem(problem, cfg, store, judge=judge, progress=False)
    steps = store.steps(run_id=summary.run_id)
    by = [(s.mutation, s.verdict) for s in steps]
    assert by.count(("seed", "accepted")) == 1
    assert summary.judged == 5 and summary.failed_steps == 1
    assert by.count(("llm-diff", "accepted")) == 2, by
    failed = [s for s in steps if s.verdict == "failed"]
    assert len(failed) == 1 and "SEARCH" in failed[0].feedback and failed[0].response
    rejected = {tuple(s.feedback.split("\n")[:2]) for s in steps if s.verdict == "rejected"}
    assert len(rejected) == 2
    fb = "\n".join(s.feedback for s in steps if s.verdict == "rejected")
    assert "syntax error" in fb and "try/except" in fb
    llm_steps = [s for s in steps if s.mutation.startswith("llm")]
    assert all(s.prompt and "class Model" in s.prompt and "Hardware" in s.prompt for s in llm_steps)
    # Once a step was judged, later prompts list the changes tried on the problem and how they fared.
    assert "already tried on this problem" not in llm_steps[0].prompt
    assert "- llm-diff: 1 children, 1 correct" in llm_steps[-1].prompt
    assert summary.tokens["prompt_tokens"] == 500 and summary.tokens["retries"] == 1
    assert summary.best is not None and summary.best.timed is False
    store.close()


CUMMAX_PROBLEM = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.cummax(x, dim=1).values


def get_inputs():
    return [torch.randn(4, 32)]


def get_init_inputs():
    return []
'''

CUMMAX_SEED = '''```python
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _larger(a, b):
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)  # a running max keeps NaN, as torch.cummax does


@triton.jit
def _cummax_rows(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    m = cols < n
    x = tl.load(x_ptr + row * n + cols, mask=m, other=0.0)
    tl.store(out_ptr + row * n + cols, tl.associative_scan(x, 0, _larger), mask=m)


class ModelNew(nn.Module):
    def forward(self, x):
        x = x.contiguous()
        out = torch.empty_like(x)
        _cummax_rows[(x.shape[0],)](x, out, x.shape[1], BLOCK=triton.next_power_of_2(x.shape[1]))
        return out
```'''


def test_llm_writes_the_first_seed_and_repairs_it_where_no_template_fits(llm, tmp_path) -> None:
    """No template covers a running maximum: the LLM writes the first seed. That seed stores its input unchanged, the judge
    rejects it, and with nothing correct to improve the loop hands the rejected seed back with the judge's
    feedback rather than stopping; the one-line repair is accepted."""
    from ks_inductor.problem_tracing import problem_from_source

    problem = problem_from_source(CUMMAX_PROBLEM, name="cummax")
    assert classify(problem) is None
    broken = CUMMAX_SEED.replace("tl.associative_scan(x, 0, _larger)", "x")
    fix = ("Store the running maximum, not the input.\n<<<<<<< SEARCH\n"
           "    tl.store(out_ptr + row * n + cols, x, mask=m)\n=======\n"
           "    tl.store(out_ptr + row * n + cols, tl.associative_scan(x, 0, _larger), mask=m)\n>>>>>>> REPLACE\n")
    llm.script = [lambda p: completion("Here it is.\n" + broken), lambda p: completion(fix)]
    store = KernelStore(f"sqlite:///{tmp_path}/k.db")
    # Inductor's seeds off: the case is a problem with no seed at all (Inductor writes a cummax scan).
    cfg = EvolveConfig(budget=2, islands=1, parallel=1, inductor_seeds=False,
                       llm=LLMConfig(base_url=llm.url, model="scripted", concurrency=1, backoff_s=0.01))
    with Judge(JudgeConfig(backend="triton-interpret", trials=2)) as judge:
        summary = evolve_problem(problem, cfg, store, judge=judge, progress=False)
    assert "Write a first Triton implementation" in llm.requests[0]["messages"][-1]["content"]
    repair_prompt = llm.requests[1]["messages"][-1]["content"]
    assert "tl.store(out_ptr + row * n + cols, x, mask=m)" in current_program(repair_prompt)
    steps = store.steps(run_id=summary.run_id)
    assert [s.mutation for s in steps] == ["llm-seed", "llm-diff"] and steps[0].verdict != "accepted"
    assert steps[0].verdict in repair_prompt and steps[1].verdict == "accepted"
    assert "cummax" in steps[0].prompt and "tl.associative_scan" in steps[1].response
    assert summary.best is not None and "tl.associative_scan" in summary.best.source
    store.close()


def test_llm_improves_inductors_kernel_where_no_template_fits(llm, tmp_path) -> None:
    """No template covers a running maximum, but Inductor writes a scan for it: the judged Inductor seed is the
    working kernel the LLM is asked to improve, and no first kernel is asked of it."""
    from ks_inductor.problem_tracing import problem_from_source

    problem = problem_from_source(CUMMAX_PROBLEM, name="cummax")
    assert classify(problem) is None
    llm.script = [stale_edit, stale_edit, stale_edit, stale_edit]
    store = KernelStore(f"sqlite:///{tmp_path}/k.db")
    cfg = EvolveConfig(budget=3, islands=1, parallel=1,
                       llm=LLMConfig(base_url=llm.url, model="scripted", concurrency=1, backoff_s=0.01))
    with Judge(JudgeConfig(backend="triton-interpret", trials=2)) as judge:
        summary = evolve_problem(problem, cfg, store, judge=judge, progress=False)
    prompts = [r["messages"][-1]["content"] for r in llm.requests]
    assert prompts and not any("Write a first Triton implementation" in p for p in prompts)
    assert "Inductor's kernels" in current_program(prompts[0])
    seeds = [s for s in store.steps(run_id=summary.run_id) if s.mutation == "seed"]
    assert seeds and any(s.verdict == "accepted" for s in seeds)
    store.close()
