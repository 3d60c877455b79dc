"""Grade an estimator: its answers for hidden configs, each against a real run of that config measured on the GPU.

1. the configs are drawn from the estimator's source (:mod:`oomlab.sizing.hidden`);
2. the estimator answers for all of them in its sandbox, with no GPU and no answers
   in reach (:mod:`oomlab.sizing.sandboxed`);
3. only then is each config run on this GPU, by the course's own code in a process
   of its own (``python -m oomlab.sizing.measure`` for a training step, ``-m
   oomlab.sizing.decode`` for a generation);
4. each part of each answer is scored against its tolerance (:mod:`oomlab.sizing.score`).

What is sized (:data:`SIZED`) decides the configs, the parts and the measuring.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

from oomlab.errors import OomLabError
from oomlab.sizing import PARTS
from oomlab.sizing.config import OPTIMIZERS, config
from oomlab.sizing.decode_config import DECODE_PARTS, DECODE_TOLERANCE, decode_config
from oomlab.sizing.hidden import COUNT, hidden_configs, hidden_decode_configs, rough_bytes, rough_decode_bytes
from oomlab.sizing.sandboxed import estimator_file, estimator_modules, run_estimator
from oomlab.sizing.score import TOLERANCE, PartScore, score

__all__ = [
    "SIZED",
    "MeasuringFailed",
    "Sized",
    "SizingReport",
    "available_optimizers",
    "estimate_hidden",
    "grade_estimator",
    "measure_configs",
]

MEASURE_TIME_LIMIT_S = 300.0


class MeasuringFailed(OomLabError):
    """The configs could not be measured on this machine: its problem, not the estimator's."""


def available_optimizers() -> list[str]:
    """The optimizers this torch has: Adafactor came with torch 2.5. Read from the installed version, no import."""
    try:
        major, minor = (int(x) for x in metadata.version("torch").split(".")[:2])
    except (metadata.PackageNotFoundError, ValueError):
        return [o for o in OPTIMIZERS if o != "adafactor"]
    return [o for o in OPTIMIZERS if o != "adafactor" or (major, minor) >= (2, 5)]


@dataclass(frozen=True)
class Sized:
    """One kind of thing an estimator sizes."""

    name: str
    module: str  # measures its configs on the GPU: python -m MODULE
    function: str  # the function of MODULE that measures one config: (config, device, meter) -> parts
    model: str  # the module that defines what is sized: the learner's specification, shown on the exercise's page
    what: str  # what one config runs, in words: "training step"
    tolerance: dict[str, float]  # its parts, in order, each with its tolerance
    draw: Callable[[bytes, int], list]  # (the estimator's source, how many) -> the hidden configs
    parse: Callable[[dict], object]  # a config as a dict -> the config, or the OomLabError that says what is wrong
    rough: Callable[[object], int]  # a config -> a bound far above its bytes (what keeps a config small enough to run)

    @property
    def parts(self) -> tuple[str, ...]:
        return tuple(self.tolerance)


SIZED = {
    "train": Sized(
        "train",
        "oomlab.sizing.measure",
        "step_bytes",
        "oomlab.sizing.model",
        "training step",
        TOLERANCE,
        lambda source, count: hidden_configs(source, available_optimizers(), count),
        config,
        rough_bytes,
    ),
    "decode": Sized(
        "decode",
        "oomlab.sizing.decode",
        "decode_bytes",
        "oomlab.sizing.decode",
        "greedy generation with a KV cache",
        DECODE_TOLERANCE,
        hidden_decode_configs,
        decode_config,
        rough_decode_bytes,
    ),
}
assert SIZED["train"].parts == PARTS and SIZED["decode"].parts == DECODE_PARTS


@dataclass
class SizingReport:
    sized: Sized
    configs: list
    estimates: list[dict[str, float]]
    measured: list[dict[str, int]]
    gpu: str = ""
    torch: str = ""
    scores: list[list[PartScore]] = field(init=False)

    def __post_init__(self):
        self.scores = [score(e, m, self.sized.tolerance) for e, m in zip(self.estimates, self.measured, strict=True)]

    @property
    def within(self) -> int:
        return sum(s.within for row in self.scores for s in row)

    @property
    def total(self) -> int:
        return len(self.configs) * len(self.sized.parts)

    @property
    def passed(self) -> bool:
        return self.within == self.total

    def to_json(self) -> dict:
        """What was graded and measured, as JSON keeps it (a class's grades are made before nbgrader reads them)."""
        return {
            "sized": self.sized.name,
            "configs": [c.as_dict() for c in self.configs],
            "estimates": self.estimates,
            "measured": self.measured,
            "gpu": self.gpu,
            "torch": self.torch,
        }

    @classmethod
    def from_json(cls, data: dict) -> SizingReport:
        """The report :meth:`to_json` wrote, scored again (the scores follow from the figures and the tolerances)."""
        kind = SIZED[data["sized"]]
        configs = [kind.parse(c) for c in data["configs"]]
        return cls(kind, configs, list(data["estimates"]), list(data["measured"]), data["gpu"], data["torch"])


def measure_configs(configs: list, module: str = SIZED["train"].module, time_limit_s: float = MEASURE_TIME_LIMIT_S):
    """Each config's parts measured on this GPU in a fresh process of the course's code; (parts, GPU, torch).

    ``module`` measures them (:func:`oomlab.sizing.measure.serve`). An OomLabError says why they could not be.
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
        raise MeasuringFailed(
            f"Measuring {len(configs)} configs on the GPU took over {time_limit_s:.0f} s.",
            "Another job may hold the GPU: see `nvidia-smi`, then check again.",
        ) from None
    try:
        reply = json.loads(done.stdout)
    except ValueError:
        reply = None
    if not isinstance(reply, dict):
        tail = (done.stderr or "").strip()[-1500:]
        raise MeasuringFailed(f"Measuring the configs on the GPU failed (exit status {done.returncode}).\n{tail}".rstrip())
    if "error" in reply:
        raise MeasuringFailed(
            f"The configs cannot be measured here: {reply['error']}.",
            "An estimate is graded against real runs on a GPU: check on a machine with one (`oomlab doctor` says what this one has).",
        )
    for cfg, measured in zip(configs, reply["measured"], strict=True):
        if "error" in measured:
            raise MeasuringFailed(f"Measuring {cfg} ran {measured['error']}.", "Free the GPU of other jobs, then check again.")
    return reply["measured"], reply["gpu"], reply["torch"]


def estimator_source(script: Path) -> bytes:
    """What the hidden configs are drawn from: the file's text, then each module beside it that it may import, by
    name (:func:`~oomlab.sizing.sandboxed.estimator_modules`). Any change to the estimator draws new configs, a change
    to a helper too: answers measured in advance for the configs of a given ``estimate.py``, kept in a module beside
    it, are answers to configs it is no longer graded on."""
    script = Path(script).resolve()
    source = [script.read_bytes()]
    for helper in estimator_modules(script):
        if helper != script:
            source += [b"\0" + helper.name.encode() + b"\0", helper.read_bytes()]
    return b"".join(source)


def grade_estimator(
    script: Path,
    course_root: Path | None,
    sized: str = "train",
    count: int = COUNT,
    sandbox_required: bool = True,
    hide: tuple[Path, ...] = (),
) -> SizingReport:
    """The ``estimate()`` in ``script`` graded on ``count`` configs of :data:`SIZED` ``[sized]`` drawn from its source;
    ``hide`` keeps more folders from it (a class's)."""
    kind, configs, estimates = estimate_hidden(script, course_root, sized, count, sandbox_required, hide)
    return measured_report(kind, configs, estimates)


def estimate_hidden(
    script: Path,
    course_root: Path | None,
    sized: str = "train",
    count: int = COUNT,
    sandbox_required: bool = True,
    hide: tuple[Path, ...] = (),
) -> tuple[Sized, list, list[dict[str, float]]]:
    """The first half of :func:`grade_estimator`, which needs no GPU: the hidden configs and the estimator's answers
    for them, made in its sandbox (so that an estimator that fails says so on any machine)."""
    script = estimator_file(script)
    kind = SIZED[sized]
    configs = kind.draw(estimator_source(script), count)
    estimates = run_estimator(script, [c.as_dict() for c in configs], course_root, sandbox_required, hide=hide, parts=kind.parts)
    return kind, configs, estimates


def measured_report(kind: Sized, configs: list, estimates: list[dict[str, float]]) -> SizingReport:
    """The second half of :func:`grade_estimator`: the configs measured on this GPU, each answer scored against them."""
    measured, gpu, torch_version = measure_configs(configs, kind.module)
    return SizingReport(kind, configs, estimates, measured, gpu, torch_version)
