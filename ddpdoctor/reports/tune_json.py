"""The JSON shapes of `tune`'s sections (docs/json.md `tune`, docs/tune.md), as TypedDicts: what reports/tune.py
writes and the tune views read, from a fresh run or a saved report.json."""

from __future__ import annotations

from typing import TypedDict


class NumericsJson(TypedDict, total=False):
    state: str  # "identical" | "within tolerance" | "changed" | "not finite" | "undecided"
    loss_rel_diff: float | None
    baseline_rel_spread: float | None
    tolerance: float
    iterations: int
    changed: bool | None
    nonfinite: bool


class GpuHoursJson(TypedDict, total=False):
    value: float
    interval: list[float]
    gpus_total: int


class StepJson(TypedDict, total=False):
    step_ms: float | None
    interval: list[float] | None


class VariantJson(TypedDict, total=False):
    """One measured variant against the baseline (ms throughout, intervals [lo, hi] at 90%)."""

    setting: str
    options: dict[str, float | bool | str]
    step_ms: float | None
    interval: list[float] | None
    n: int
    baseline: StepJson
    diff_ms: float | None
    diff_interval: list[float] | None
    predicted_ms: float | None
    winner: bool
    verdict: str
    why: str
    launches: int
    launch_medians_ms: list[float]
    in_effect: bool
    effect: str
    buckets: int | None
    baseline_buckets: int | None
    expected_buckets: float | None
    numerics: NumericsJson | None
    change: str
    gpu_hours_per_day: GpuHoursJson | None


class BaselineJson(TypedDict, total=False):
    setting: str
    step_ms: float | None
    interval: list[float] | None
    n: int
    launch_medians_ms: list[float]
    launch_spread_ms: float | None
    effect: str
    options: dict[str, float | bool | None]


class CandidateJson(TypedDict, total=False):
    setting: str
    options: dict[str, float | bool | str]
    source: str  # "what-if" | "rule" | "--try"
    chosen: bool
    why: str
    predicted_ms: float | None


class DesignJson(TypedDict, total=False):
    warmup: int
    steps: int
    rounds: int
    launches: int
    order: list[str]
    profile_run: str
    trials_dir: str


class TuneWhatIfJson(TypedDict, total=False):
    available: bool
    reason: str | None
    current_bucket_cap_mb: float | None
    best_bucket_cap_mb: float | None
    saving_ms_per_step: float | None


class ScriptJson(TypedDict, total=False):
    path: str
    sha256_before: str | None
    sha256_after: str | None
    unchanged: bool


class TuneJson(TypedDict, total=False):
    """The "tune" object: the baseline, every variant considered and why, the design, the what-if, the script."""

    baseline: BaselineJson
    candidates: list[CandidateJson]
    design: DesignJson
    whatif: TuneWhatIfJson
    script: ScriptJson
