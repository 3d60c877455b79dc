"""Grade an estimator: its answers for hidden configs, each against a real step of that config measured on the GPU.

1. the configs are drawn from the estimator's source (:mod:`oomlab.sizing.hidden`);
2. the estimator answers for all of them in its sandbox, with no GPU and no answers
   in reach (:mod:`oomlab.sizing.sandboxed`);
3. only then is each config trained for two steps on this GPU, by the course's own
   code in a process of its own (``python -m oomlab.sizing.measure``);
4. each part of each answer is scored against its tolerance (:mod:`oomlab.sizing.score`).
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

from oomlab.errors import OomLabError
from oomlab.sizing import PARTS
from oomlab.sizing.config import OPTIMIZERS, TrainConfig
from oomlab.sizing.hidden import COUNT, hidden_configs
from oomlab.sizing.sandboxed import run_estimator
from oomlab.sizing.score import PartScore, score

__all__ = ["SizingReport", "available_optimizers", "grade_estimator", "measure_configs"]

MEASURE_TIME_LIMIT_S = 300.0


@dataclass
class SizingReport:
    configs: list[TrainConfig]
    estimates: list[dict[str, float]]
    measured: list[dict[str, int]]
    gpu: str = ""
    torch: str = ""
    scores: list[list[PartScore]] = field(init=False)

    def __post_init__(self):
        self.scores = [score(e, m) for e, m in zip(self.estimates, self.measured, strict=True)]

    @property
    def within(self) -> int:
        return sum(s.within for row in self.scores for s in row)

    @property
    def total(self) -> int:
        return len(self.configs) * len(PARTS)

    @property
    def passed(self) -> bool:
        return self.within == self.total


def available_optimizers() -> list[str]:
    """The optimizers this torch has: Adafactor came with torch 2.5. Read from the installed version, no import."""
    try:
        major, minor = (int(x) for x in metadata.version("torch").split(".")[:2])
    except (metadata.PackageNotFoundError, ValueError):
        return [o for o in OPTIMIZERS if o != "adafactor"]
    return [o for o in OPTIMIZERS if o != "adafactor" or (major, minor) >= (2, 5)]


def measure_configs(
    configs: list, module: str = "oomlab.sizing.measure", time_limit_s: float = MEASURE_TIME_LIMIT_S
) -> tuple[list[dict], str, str]:
    """Each config's parts measured on this GPU in a fresh process of the course's code; (parts, GPU, torch).

    ``module`` measures them (:func:`oomlab.sizing.measure.serve`): training steps, or ``oomlab.sizing.decode``'s
    generations.
    """
    try:
        done = subprocess.run(
            [sys.executable, "-m", module],
            input=json.dumps([c.as_dict() for c in configs]),
            capture_output=True,
            text=True,
            timeout=time_limit_s,
        )
    except subprocess.TimeoutExpired:
        raise OomLabError(
            f"Measuring {len(configs)} configs on the GPU took over {time_limit_s:.0f} s.",
            "Another job may hold the GPU: see `nvidia-smi`, then check again.",
        ) from None
    try:
        reply = json.loads(done.stdout)
    except ValueError:
        reply = None
    if not isinstance(reply, dict):
        tail = (done.stderr or "").strip()[-1500:]
        raise OomLabError(f"Measuring the configs on the GPU failed (exit status {done.returncode}).\n{tail}".rstrip())
    if "error" in reply:
        raise OomLabError(
            f"The configs cannot be measured here: {reply['error']}.",
            "An estimate is graded against real steps on a GPU: check on a machine with one (`oomlab doctor` says what this one has).",
        )
    for cfg, measured in zip(configs, reply["measured"], strict=True):
        if "error" in measured:
            raise OomLabError(f"Measuring {cfg} ran {measured['error']}.", "Free the GPU of other jobs, then check again.")
    return reply["measured"], reply["gpu"], reply["torch"]


def grade_estimator(script: Path, course_root: Path | None, count: int = COUNT, sandbox_required: bool = True) -> SizingReport:
    """The estimator in ``script`` graded on ``count`` configs drawn from its source."""
    script = Path(script)
    if not script.is_file():
        raise OomLabError(f"{script} does not exist.", "Restore it with `oomlab reset`, or name the file that holds estimate().")
    source = script.read_bytes()
    configs = hidden_configs(source, available_optimizers(), count)
    estimates = run_estimator(script, [c.as_dict() for c in configs], course_root, sandbox_required)
    measured, gpu, torch_version = measure_configs(configs)
    return SizingReport(configs, estimates, measured, gpu, torch_version)
