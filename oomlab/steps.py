"""The workflow's steps and what their findings mean: the one registry the rest reads.

An exercise's manifest names its step; the CLI lists the steps and runs their
tools; ``diagnose`` ranks what the tools found by :data:`FINDINGS`; the site
titles its pages with them; ``oomlab dev figures`` runs each exercise's tool.
Adding a tool means one package under ``oomlab/tools/`` and one :class:`Step`
here.

Standard library only (and :mod:`oomlab.units`, which is too): the measuring child reads it to load a probe.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from oomlab.units import format_bytes

__all__ = ["FINDINGS", "LEAKS", "STEPS", "Finding", "Step", "fix_first", "step"]


@dataclass(frozen=True)
class Step:
    """One step of the workflow and the tool that does it."""

    name: str  # the manifest's ``step``, the CLI command and the package oomlab.tools.<name>
    number: int
    title: str  # how the site and the overview title it
    short: str  # a few words for tables: "hunt references"
    summary: str  # what the tool does, one sentence: the CLI's help
    question: str = ""  # what the step decides, as the workflow diagram asks it
    remedy: str = ""  # what to do when the answer is yes
    options: dict = field(default_factory=dict, hash=False)  # probe options for a run from the command line
    figure_options: dict = field(default_factory=dict, hash=False)  # probe options for the site's pictures

    @property
    def probe(self) -> str:
        """The module of the tool's probe, which the measuring child imports by this name (it knows no tool)."""
        return f"oomlab.tools.{self.name}.probe"

    @property
    def label(self) -> str:
        return f"{self.number} {self.short}"

    @property
    def heading(self) -> str:
        return f"{self.number}. {self.title}"


STEPS: tuple[Step, ...] = (
    Step(
        "snapshot",
        1,
        "Take an allocator snapshot",
        "snapshot",
        "record the allocator's history, dump a snapshot at the OOM or the end, and explain the fragmentation "
        "(given a .pickle snapshot instead of a target, it reads that file and runs nothing)",
        question="Is the memory reserved by the allocator but in pieces no request fits?",
        remedy="fewer distinct sizes, reuse, or expandable segments",
    ),
    Step(
        "hunt",
        2,
        "Hunt dangling graph references",
        "hunt references",
        "find GPU memory that outlives its step and name the object that holds it",
        question="Does live memory grow from one step to the next?",
        remedy="drop the reference that keeps it alive",
    ),
    Step(
        "profile",
        3,
        "Profile the peak",
        "profile peaks",
        "profile memory by operator and category, and name the op and line at the peak",
        # A loop's steps repeat: the first ones show the peak, and torch's memory model over all 840 steps of
        # a 12-epoch script took minutes. `--all-steps` lifts the bound for a peak that comes late.
        options={"max_steps": 20},
        figure_options={"max_steps": 3},
        question="Does one step's peak go over the budget, flat from step to step?",
        remedy="make that line's temporaries smaller, or free them sooner",
    ),
)


def step(name: str) -> Step:
    """The step called ``name``; KeyError when there is none."""
    for s in STEPS:
        if s.name == name:
            return s
    raise KeyError(name)


@dataclass(frozen=True)
class Finding:
    """A kind of structural problem a tool can report (its result's ``kind``), and what to do about it."""

    kind: str
    advice: str


# In the order to fix them: the structure of the program first, the size of its work last.
FINDINGS: tuple[Finding, ...] = (
    Finding(
        "fragmentation",
        "Fix the allocation order first: long-lived tensors sit in segments that short-lived ones were freed "
        "from. Allocate what lives long early and in one piece (a preallocated buffer filled slice by slice).",
    ),
    Finding(
        "graph-pools",
        "CUDA graphs replay at the addresses they recorded, so their private pool keeps that memory for as long as "
        'the graphs live, and torch.compile(mode="reduce-overhead") records a graph for every input shape it sees. '
        "Give the compiled code few shapes (pad to a few bucket sizes and mask the padding out), or compile without "
        "CUDA graphs where the shapes vary.",
    ),
    Finding(
        "graph-leak",
        "These tensors still carry the autograd graph of a forward pass that never ran backward, so every "
        "activation that graph saved stays on the device. Run that code under torch.no_grad() (or "
        "torch.inference_mode()) when no gradient is needed, or keep loss.item() / tensor.detach() "
        "instead of the tensor.",
    ),
    Finding(
        "cycle",
        "These objects reference each other, so reference counting never frees them; only the garbage "
        "collector does, and it runs rarely. Break the cycle (a weakref, or del the attribute when done) "
        "or call gc.collect() before memory runs out.",
    ),
    Finding(
        "container-leak",
        "This holder gains tensors every step and never lets go of them. Keep Python numbers (.item()), "
        "move what you must keep to the CPU (.cpu()), or bound what it keeps.",
    ),
    Finding(
        "transient-peak",
        "Cut the peak first: one operation briefly holds several copies of a large tensor. "
        "Use the fused operation (for a loss, F.cross_entropy on class indices) or process it in chunks.",
    ),
)
NOTHING_STRUCTURAL = "Nothing structural to fix: the memory is spent on the work the job has to do."
HYPERPARAMETERS_LAST = "Tune hyperparameters (batch size, sequence length, precision) only after the structural fixes."


def advice(kind: str) -> str | None:
    """What to do about a finding of ``kind``; None for a kind that is not a structural problem."""
    return next((f.advice for f in FINDINGS if f.kind == kind), None)


LEAKS = ("graph-leak", "cycle", "container-leak")  # findings of memory that outlives its step


def fix_first(results: dict[str, dict]) -> dict:
    """One verdict from the tools' results (``{step name: result}``): what to fix first, and why.

    Findings rank as :data:`FINDINGS` lists them, with one exception. A leak
    that grew across optimizer steps by more than fragmentation strands comes
    before the fragmentation: memory full of what a leak kept also leaves free
    fragments, too small for the next request, and defragmenting would buy a
    step or two. The growth is the hunt's (the culprit's ``grew_bytes``); what
    fragmentation strands is the snapshot's ``culprit_bytes`` (free bytes in
    segments that live blocks pin). ``why`` says so when it applies.
    """
    kinds = {name: r.get("kind", "none") for name, r in results.items()}
    first = next((f.kind for f in FINDINGS if f.kind in kinds.values()), None)
    source = next((name for name, kind in kinds.items() if kind == first), None)
    why = ""
    if first == "fragmentation":
        stranded = int(results[source].get("culprit_bytes") or 0)
        for name, result in results.items():
            grew = _culprit_growth(result) if kinds[name] in LEAKS else 0
            if grew > stranded:
                first, source = kinds[name], name
                why = (
                    f"The leak grew by {format_bytes(grew)} across optimizer steps, more than the "
                    f"{format_bytes(stranded)} that fragmentation strands, so it comes first."
                )
                break
    return {
        "fix_first": first,
        "found_by": source,
        "headline": results[source]["headline"] if source else "No structural problem found: the memory goes to the work itself.",
        # The tool's own advice where it has one that fits what it found (the profile's names the peak's operator).
        "advice": (results[source].get("advice") or advice(first)) if first else NOTHING_STRUCTURAL,
        "why": why,
        "findings": {name: {"kind": kinds[name], "headline": r.get("headline", "")} for name, r in results.items()},
        "then": HYPERPARAMETERS_LAST,
    }


def _culprit_growth(result: dict) -> int:
    """How much the hunt's culprit grew since its baseline step, in bytes (0 when unknown)."""
    culprit = result.get("culprit")
    holder = next((h for h in result.get("holders") or [] if h.get("name") == culprit), None)
    return int((holder or {}).get("grew_bytes") or 0) if culprit else 0
