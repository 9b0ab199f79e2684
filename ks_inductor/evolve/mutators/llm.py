"""The LLM local improver, through the ``openai`` client against any OpenAI-compatible endpoint.

One targeted change to a working kernel per step (SEARCH/REPLACE blocks, a full rewrite allowed), with the
reference, the hardware, the parent's metrics, the judge's feedback, the room left to the roofline floor, the
changes already tried on the problem with their gains, and top and diverse inspirations in the prompt. Rate limits,
server errors and time-outs are retried with exponential back-off; a step that still fails, or whose edit does not
apply, is a failed step with feedback, never a silent no-op. Where no template covers the problem, the model writes
the first seed from the reference.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ks_inductor.candidate import Candidate
from ks_inductor.evolve.archive import Program
from ks_inductor.evolve.config import LLMConfig
from ks_inductor.evolve.diffs import DiffError, apply_response, parse_rewrite
from ks_inductor.evolve.mutators.base import Mutation, describe_source, unified_diff
from ks_inductor.evolve.mutators.embedded import EmbeddedMutator
from ks_inductor.evolve.operators import history
from ks_inductor.evolve.prompts import build_messages, build_seed_messages, problem_info

log = logging.getLogger(__name__)


class LLMUnavailable(RuntimeError):
    """The endpoint is not configured or cannot be reached."""


class LLMError(RuntimeError):
    """One request failed after its retries (rate limit, server error, time-out)."""


class LLMClient:
    """A thin, thread-safe wrapper: retries with back-off, time limits, token accounting."""

    def __init__(self, config: LLMConfig) -> None:
        cfg = config.resolved()
        if not cfg.base_url or not cfg.model:
            raise LLMUnavailable(
                "no LLM endpoint configured: pass --llm-base-url and --llm-model (or set KERNELSMITH_LLM_BASE_URL "
                "and KERNELSMITH_LLM_MODEL), or use the embedded mutator")
        from openai import OpenAI

        self.cfg = cfg
        # The client's own retries are off: ours count, back off and report per step.
        self.client = OpenAI(base_url=cfg.base_url, api_key=cfg.api_key, timeout=cfg.timeout_s, max_retries=0)
        self.usage = {"prompt_tokens": 0, "completion_tokens": 0, "requests": 0, "retries": 0, "failures": 0}
        self._lock = threading.Lock()
        self._ever_ok = False

    def chat(self, messages: list[dict[str, str]]) -> tuple[str, dict[str, int]]:
        import openai

        cfg = self.cfg
        last: Exception | None = None
        for attempt in range(cfg.max_retries + 1):
            if attempt:
                delay = cfg.backoff_s * (2 ** (attempt - 1)) * (1 + 0.25 * random.random())
                with self._lock:
                    self.usage["retries"] += 1
                time.sleep(delay)
            try:
                with self._lock:
                    self.usage["requests"] += 1
                resp = self.client.chat.completions.create(model=cfg.model, messages=messages,  # type: ignore[arg-type]
                                                           max_tokens=cfg.max_tokens, temperature=cfg.temperature)
            except openai.RateLimitError as e:
                last = e
                continue
            except openai.APITimeoutError as e:
                last = e
                continue
            except openai.APIConnectionError as e:
                last = e
                if not self._ever_ok and attempt >= min(1, cfg.max_retries):
                    raise LLMUnavailable(f"LLM endpoint {cfg.base_url} cannot be reached: {e}") from None
                continue
            except openai.APIStatusError as e:
                last = e
                if e.status_code >= 500 or e.status_code in (408, 409):
                    continue
                raise LLMError(f"the endpoint refused the request ({e.status_code}): {str(e)[:300]}") from None
            self._ever_ok = True
            text = (resp.choices[0].message.content or "") if resp.choices else ""
            usage = {"prompt_tokens": int(getattr(resp.usage, "prompt_tokens", 0) or 0),
                     "completion_tokens": int(getattr(resp.usage, "completion_tokens", 0) or 0)}
            with self._lock:
                self.usage["prompt_tokens"] += usage["prompt_tokens"]
                self.usage["completion_tokens"] += usage["completion_tokens"]
            return text, usage
        with self._lock:
            self.usage["failures"] += 1
        raise LLMError(f"no answer after {cfg.max_retries + 1} attempts: {type(last).__name__}: {str(last)[:300]}")


class LLMMutator:
    kind = "llm"

    def __init__(self, config: LLMConfig, embedded: EmbeddedMutator) -> None:
        self.config = config.resolved()
        self.embedded = embedded
        self.fallback = self.config.fallback == "embedded"
        self.fallback_active = False
        try:
            self.client: LLMClient | None = LLMClient(config)
        except LLMUnavailable:
            if not self.fallback:
                raise
            log.warning("no LLM endpoint configured; using the embedded mutator")
            self.client = None
            self.fallback_active = True
        self.seed_steps: dict[str, Mutation] = {}  # candidate id -> the step that wrote it (prompt, answer)
        self.pool = ThreadPoolExecutor(max_workers=max(1, self.config.concurrency or 1), thread_name_prefix="ks-llm")

    @property
    def usage(self) -> dict[str, int]:
        return dict(self.client.usage) if self.client else {}

    def descriptor(self, cand: Candidate) -> dict[str, Any]:
        return self.embedded.descriptor(cand)

    def _unavailable(self, e: LLMUnavailable) -> None:
        if not self.fallback:
            raise e
        if not self.fallback_active:
            log.warning("%s; falling back to the embedded mutator", e)
        self.fallback_active = True

    # ------------------------------------------------------------------ seeds
    def seeds(self, ctx: Any) -> list[Candidate]:
        seeds = self.embedded.seeds(ctx)
        if seeds or self.fallback_active or self.client is None:
            return seeds
        messages = build_seed_messages(ctx.problem.source, problem_info(ctx.problem), ctx.hardware)
        try:
            text, usage = self.client.chat(messages)
        except LLMUnavailable as e:
            self._unavailable(e)
            return seeds
        except LLMError as e:
            log.warning("the LLM could not write a seed: %s", e)
            return []
        src = parse_rewrite(text)
        if src is None:
            log.warning("the LLM's seed answer held no program defining ModelNew")
            return []
        cand = Candidate(src, mutation="llm-seed")
        self.seed_steps[cand.id] = Mutation("llm-seed", cand, prompt=messages[-1]["content"], response=text,
                                            tokens=usage, descriptor=describe_source(src))
        return [cand]

    # ------------------------------------------------------------------ steps
    def propose(self, parents: list[tuple[Program, int]], ctx: Any, rng: random.Random) -> list[Mutation]:
        if self.fallback_active:
            return self.embedded.propose(parents, ctx, rng)
        seeds = [rng.randrange(2**31) for _ in parents]
        futures = [self.pool.submit(self._improve, p, ctx, random.Random(s)) for (p, _), s in zip(parents, seeds)]
        out = []
        for f in futures:
            try:
                out.append(f.result())
            except LLMUnavailable as e:
                self._unavailable(e)
                return self.embedded.propose(parents, ctx, rng)
        return out

    def _improve(self, parent: Program, ctx: Any, rng: random.Random) -> Mutation:
        assert self.client is not None
        pc = Candidate.from_json(parent.candidate)
        insp = []
        for p in ctx.archive.inspirations(parent, self.config.inspirations, rng):
            label = "Top program" if p.id in ctx.archive.elites[:3] else "Diverse program"
            score = f"speedup {p.score:.3f}x" if p.timed else "correct"
            insp.append((label, score, Candidate.from_json(p.candidate).source))
        messages = build_messages(ctx.problem.source, problem_info(ctx.problem), ctx.hardware, pc.source,
                                  parent.metrics, parent.score if parent.timed else None, parent.feedback, insp,
                                  tried=history(ctx.archive))
        prompt = messages[-1]["content"]
        try:
            text, usage = self.client.chat(messages)
        except LLMError as e:
            return Mutation("llm", error=f"LLM request failed: {e}", prompt=prompt)
        try:
            child_src, kind = apply_response(pc.source, text)
        except DiffError as e:
            return Mutation("llm-diff", error=f"the edit did not apply: {e}", prompt=prompt, response=text,
                            tokens=usage)
        child = Candidate(child_src, parent_id=parent.id, mutation=kind, generation=parent.generation + 1)
        return Mutation(kind, child, diff=unified_diff(pc.source, child_src), prompt=prompt, response=text,
                        tokens=usage, descriptor=describe_source(child_src))
