"""SQLAlchemy 2 models: the current schema. Older schemas live, frozen, in :mod:`kernel_cache.migrations`."""

from __future__ import annotations

from typing import Any

from sqlalchemy import JSON, Boolean, Float, ForeignKey, Index, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    pass


class SchemaVersion(Base):
    __tablename__ = "schema_version"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)  # always 1: a single row
    version: Mapped[int] = mapped_column(Integer, nullable=False)
    written_by: Mapped[str] = mapped_column(String(64), default="")
    updated_at: Mapped[float] = mapped_column(Float, nullable=False)


class ProblemRow(Base):
    __tablename__ = "problems"

    key: Mapped[str] = mapped_column(String(128), primary_key=True)
    name: Mapped[str] = mapped_column(String(256), default="")
    source: Mapped[str] = mapped_column(Text, nullable=False)  # the reference, KernelBench format
    op_summary: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    signature: Mapped[str] = mapped_column(Text, default="")  # input signature, e.g. "float32[64, 256]"
    problem_json: Mapped[dict[str, Any]] = mapped_column(JSON, nullable=False)  # Problem.to_json()
    created_at: Mapped[float] = mapped_column(Float, nullable=False)
    updated_at: Mapped[float] = mapped_column(Float, nullable=False)


class KernelRow(Base):
    __tablename__ = "kernels"
    __table_args__ = (
        UniqueConstraint("problem_key", "sha256", "fingerprint_id", name="uq_kernels_identity"),
        # The lookup: best verified kernel for (key, hardware), ordered by rank.
        Index("ix_kernels_lookup", "problem_key", "status", "hardware_id", "rank_speedup"),
        Index("ix_kernels_family", "op_family"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    problem_key: Mapped[str] = mapped_column(String(128), nullable=False)
    source: Mapped[str] = mapped_column(Text, nullable=False)
    sha256: Mapped[str] = mapped_column(String(64), nullable=False)
    launch_params: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    backend: Mapped[str] = mapped_column(String(32), nullable=False)
    fingerprint: Mapped[dict[str, Any]] = mapped_column(JSON, nullable=False)
    fingerprint_id: Mapped[str] = mapped_column(String(32), nullable=False)
    hardware_id: Mapped[str] = mapped_column(String(32), nullable=False)
    torch_minor: Mapped[str] = mapped_column(String(16), nullable=False)
    triton_minor: Mapped[str] = mapped_column(String(16), nullable=False)
    status: Mapped[str] = mapped_column(String(16), nullable=False)
    op_family: Mapped[str | None] = mapped_column(String(64))
    median_ms: Mapped[float | None] = mapped_column(Float)
    eager_ms: Mapped[float | None] = mapped_column(Float)
    inductor_ms: Mapped[float | None] = mapped_column(Float)
    speedup_eager: Mapped[float | None] = mapped_column(Float)
    speedup_inductor: Mapped[float | None] = mapped_column(Float)
    speedup_lcb: Mapped[float | None] = mapped_column(Float)
    speedup_graph: Mapped[float | None] = mapped_column(Float)
    # speedup_lcb, else speedup_inductor, else speedup_eager: what "best" sorts by (indexed).
    rank_speedup: Mapped[float | None] = mapped_column(Float)
    trials: Mapped[int] = mapped_column(Integer, default=0)
    timed: Mapped[bool] = mapped_column(Boolean, default=True)
    run_id: Mapped[str | None] = mapped_column(String(64))
    parent_id: Mapped[str | None] = mapped_column(String(64))
    candidate_id: Mapped[str | None] = mapped_column(String(64))
    plan: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[float] = mapped_column(Float, nullable=False)
    updated_at: Mapped[float] = mapped_column(Float, nullable=False)


class RunRow(Base):
    __tablename__ = "runs"
    __table_args__ = (Index("ix_runs_problem", "problem_key", "fingerprint_id", "status"),)

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    problem_key: Mapped[str] = mapped_column(String(128), nullable=False)
    fingerprint: Mapped[dict[str, Any]] = mapped_column(JSON, nullable=False)
    fingerprint_id: Mapped[str] = mapped_column(String(32), nullable=False)
    config: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    state: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    summary: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    status: Mapped[str] = mapped_column(String(16), nullable=False)  # running | finished
    started_at: Mapped[float] = mapped_column(Float, nullable=False)
    updated_at: Mapped[float] = mapped_column(Float, nullable=False)
    finished_at: Mapped[float | None] = mapped_column(Float)


class EvaluationRow(Base):
    __tablename__ = "evaluations"
    __table_args__ = (Index("ix_evaluations_lookup", "problem_key", "candidate_hash", "fingerprint_id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    problem_key: Mapped[str] = mapped_column(String(128), nullable=False)
    candidate_hash: Mapped[str] = mapped_column(String(64), nullable=False)
    fingerprint_id: Mapped[str] = mapped_column(String(32), nullable=False)
    run_id: Mapped[str | None] = mapped_column(ForeignKey("runs.id", ondelete="SET NULL"))
    verdict: Mapped[str] = mapped_column(String(16), nullable=False)
    correct: Mapped[bool] = mapped_column(Boolean, default=False)
    stage: Mapped[str] = mapped_column(String(16), default="")
    median_ms: Mapped[float | None] = mapped_column(Float)
    speedup_eager: Mapped[float | None] = mapped_column(Float)
    speedup_inductor: Mapped[float | None] = mapped_column(Float)
    result: Mapped[dict[str, Any]] = mapped_column(JSON, nullable=False)  # EvalResult.to_json()
    created_at: Mapped[float] = mapped_column(Float, nullable=False)


class StepRow(Base):
    __tablename__ = "evolution_steps"
    __table_args__ = (Index("ix_steps_run", "run_id"), Index("ix_steps_problem", "problem_key"))

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), nullable=False)
    problem_key: Mapped[str] = mapped_column(String(128), nullable=False)
    parent_id: Mapped[str | None] = mapped_column(String(64))
    child_id: Mapped[str] = mapped_column(String(64), nullable=False)
    mutation: Mapped[str] = mapped_column(String(32), nullable=False)
    diff: Mapped[str] = mapped_column(Text, default="")
    prompt: Mapped[str | None] = mapped_column(Text)
    response: Mapped[str | None] = mapped_column(Text)
    verdict: Mapped[str] = mapped_column(String(16), default="")
    correct: Mapped[bool] = mapped_column(Boolean, default=False)
    speedup_delta: Mapped[float | None] = mapped_column(Float)
    feedback: Mapped[str] = mapped_column(Text, default="")
    # The rest of the StepRecord (speedups, noise, sources, island, tokens, fingerprint), kept whole: a field added
    # to the record lands here without a schema change.
    detail: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    created_at: Mapped[float] = mapped_column(Float, nullable=False)


class MissRow(Base):
    __tablename__ = "misses"

    problem_key: Mapped[str] = mapped_column(String(128), primary_key=True)
    count: Mapped[int] = mapped_column(Integer, default=0)
    signature: Mapped[str] = mapped_column(Text, default="")
    shapes: Mapped[list[Any]] = mapped_column(JSON, default=list)
    problem_json: Mapped[dict[str, Any]] = mapped_column(JSON, nullable=False)
    fingerprint: Mapped[dict[str, Any]] = mapped_column(JSON, nullable=False)  # where it was last met
    first_seen: Mapped[float] = mapped_column(Float, nullable=False)
    last_seen: Mapped[float] = mapped_column(Float, nullable=False)
