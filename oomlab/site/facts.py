"""Measured facts: small probe scripts run on a GPU, their results in ``facts.json``, and the pages' markers for them.

Every number or behaviour the course's pages state either comes from a committed
measurement that a command regenerates on a GPU, or is cited to PyTorch's source or
documentation. This module is the first kind for everything that is not an exercise run:

- each ``course/probes/NAME.py`` (names starting with ``_`` excepted) is a short script that
  prints ONE JSON object with what it measured. At module level it declares, as a literal,
  the allocator settings it runs under::

      ALLOC_CONF = ""                                   # one run, the defaults
      ALLOC_CONF = "expandable_segments:True"           # one run, these settings
      ALLOC_CONF = {"defaults": "", "expandable": "expandable_segments:True"}  # one run per variant

  and optionally ``TIMEOUT_S`` (default :data:`DEFAULT_TIMEOUT_S`);
- :func:`measure` (``oomlab dev facts``) runs each probe, each variant in a fresh process
  (``subprocess.run([sys.executable, probe])``) whose environment has no allocator settings
  but ``PYTORCH_CUDA_ALLOC_CONF`` set to the declared value, and ``OOMLAB_PROBE_VARIANT``
  naming the variant; it returns the report that :func:`write` puts in ``facts.json``:
  ``{gpu, torch, cuda, created, facts: {probe: {...}}, sources: {probe: sha256 prefix}}``
  (a probe with variants has ``facts[probe][variant]``);
- in a page, ``<!-- oomlab:fact probe.key.subkey -->`` becomes that value, formatted by its
  key's suffix (:func:`format_value`: ``_bytes`` as a size, ``_fraction`` as a percentage, ``_parameters`` as
  a count, in billions for a model's);
  :func:`render` does it for the site's markers (:mod:`oomlab.site.markers`), and raises
  :class:`UnknownFact` for a probe that does not exist or a key its results do not have.
"""

from __future__ import annotations

import ast
import datetime
import hashlib
import json
import math
import os
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from oomlab.errors import OomLabError
from oomlab.measure.stats import ALLOCATOR_VARIABLES
from oomlab.units import GIB, KIB, MIB, format_bytes

PROBES_DIR = Path("course/probes")
COMMAND = "oomlab dev facts"
VARIANT_ENV = "OOMLAB_PROBE_VARIANT"
DEFAULT_TIMEOUT_S = 120
MARKER = re.compile(r"<!--\s*oomlab:fact\s+([\w.-]+)\s*-->")
NOT_MEASURED = "*(not measured yet)*"
# Sizes below this are written with their exact byte count too where one decimal would round them.
EXACT_BELOW = 64 * MIB
# Sizes from this up are a model's or a card's (the big cases): in GiB, as the allocator counts, and in decimal GB
# beside it, as cards and models are sold and asked about ("an 80 GB GPU").
CARD_SIZED = 10 * GIB

__all__ = [
    "COMMAND",
    "MARKER",
    "NOT_MEASURED",
    "PROBES_DIR",
    "Probe",
    "ProbeFailed",
    "UnknownFact",
    "find_probes",
    "format_value",
    "load",
    "lookup",
    "measure",
    "read_probe",
    "render",
    "source_hash",
    "stale_probes",
    "write",
]


class UnknownFact(KeyError):
    """A marker names a probe that does not exist, or a key that the probe's results do not have."""

    def __str__(self) -> str:  # KeyError's own str() quotes the message
        return str(self.args[0]) if self.args else ""


class ProbeFailed(OomLabError):
    """A probe exited with an error, ran past its time, or printed no JSON object."""


@dataclass(frozen=True)
class Probe:
    name: str
    path: Path
    runs: dict[str | None, str]  # variant (None: the only run) -> PYTORCH_CUDA_ALLOC_CONF
    timeout_s: float = DEFAULT_TIMEOUT_S


# --------------------------------------------------------------------------- the probes


def read_probe(path: Path) -> Probe:
    """A probe script's declarations, read without running it."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except SyntaxError as err:
        raise OomLabError(f"{path}: not valid Python: {err}", "Fix the probe script.") from None
    values: dict[str, object] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
            if name in ("ALLOC_CONF", "TIMEOUT_S"):
                try:
                    values[name] = ast.literal_eval(node.value)
                except ValueError:
                    raise OomLabError(f"{path}: {name} must be a literal.", "Write it as a string, number or dict.") from None
    conf = values.get("ALLOC_CONF")
    if isinstance(conf, str):
        runs: dict[str | None, str] = {None: conf}
    elif isinstance(conf, dict) and conf and all(isinstance(k, str) and isinstance(v, str) for k, v in conf.items()):
        runs = dict(conf)
    else:
        raise OomLabError(
            f"{path}: no ALLOC_CONF declared at module level.",
            'Declare the allocator settings it runs under: ALLOC_CONF = "" for the defaults, a string, or {variant: settings}.',
        )
    timeout = values.get("TIMEOUT_S", DEFAULT_TIMEOUT_S)
    if not isinstance(timeout, (int, float)) or timeout <= 0:
        raise OomLabError(f"{path}: TIMEOUT_S must be a positive number of seconds.", "")
    return Probe(path.stem, path, runs, float(timeout))


def find_probes(probes_dir: Path) -> list[Probe]:
    """Every probe in the folder, by name; helpers (``_*.py``) are not probes."""
    if not probes_dir.is_dir():
        return []
    return [read_probe(p) for p in sorted(probes_dir.glob("*.py")) if not p.name.startswith("_")]


def source_hash(path: Path) -> str:
    """What ``sources`` records for a probe: the first 16 hex digits of its file's sha256."""
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def probe_env(conf: str, variant: str | None) -> dict[str, str]:
    env = {
        k: v for k, v in os.environ.items() if k not in ALLOCATOR_VARIABLES and k != VARIANT_ENV
    }  # a probe gets only its own settings
    if conf:
        env["PYTORCH_CUDA_ALLOC_CONF"] = conf
    if variant is not None:
        env[VARIANT_ENV] = variant
    env["PYTHONUNBUFFERED"] = "1"
    return env


def last_json_object(stdout: str) -> dict | None:
    """The JSON object the probe printed: its whole output, or else its last line."""
    for text in (stdout.strip(), *reversed([line for line in stdout.splitlines() if line.strip()][-1:])):
        try:
            value = json.loads(text)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return None


def run_probe(probe: Probe, variant: str | None, cwd: Path) -> dict:
    """One run of a probe in a fresh process; its JSON object, or :class:`ProbeFailed` with its output."""
    label = probe.name + (f" ({variant})" if variant is not None else "")
    try:
        proc = subprocess.run(
            [sys.executable, str(probe.path)],
            cwd=cwd,
            env=probe_env(probe.runs[variant], variant),
            capture_output=True,
            text=True,
            timeout=probe.timeout_s,
        )
    except subprocess.TimeoutExpired:
        raise ProbeFailed(
            f"probe {label} ran past its {probe.timeout_s:g} s.", "Make it smaller, or raise its TIMEOUT_S."
        ) from None
    tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-15:])
    if proc.returncode != 0:
        raise ProbeFailed(f"probe {label} exited with {proc.returncode}:\n{tail}", f"Run it alone: python {probe.path}")
    result = last_json_object(proc.stdout)
    if result is None:
        raise ProbeFailed(f"probe {label} printed no JSON object:\n{tail}", "A probe prints one JSON object on stdout.")
    return result


ENVIRONMENT = """
import json, torch
cuda = torch.cuda.is_available()
print(json.dumps({"gpu": torch.cuda.get_device_name(0) if cuda else None,
                  "torch": torch.__version__, "cuda": torch.version.cuda}))
"""


def environment(cwd: Path) -> dict:
    """GPU, torch and CUDA versions, asked in a process of their own (this one never starts CUDA)."""
    proc = subprocess.run([sys.executable, "-c", ENVIRONMENT], cwd=cwd, capture_output=True, text=True, timeout=120)
    found = last_json_object(proc.stdout) if proc.returncode == 0 else None
    return found or {"gpu": None, "torch": None, "cuda": None}


def measure(probes: list[Probe], cwd: Path, note: Callable[[str], None] = lambda _: None) -> dict:
    """Run every probe (each variant in its own process) and return the report ``facts.json`` holds.

    A probe that fails is left out of ``facts`` and ``sources`` and its error goes under
    ``errors``; :func:`write` refuses such a report, so ``facts.json`` is always whole.
    """
    if not probes:
        raise OomLabError(f"There are no probes in {PROBES_DIR}.", "Write one: a script that prints one JSON object.")
    env = environment(cwd)
    report: dict = {**env, "created": "", "facts": {}, "sources": {}}
    errors: dict[str, str] = {}
    for probe in probes:
        results = {}
        for variant in probe.runs:
            note(probe.name + (f" ({variant})" if variant is not None else ""))
            try:
                results[variant] = run_probe(probe, variant, cwd)
            except ProbeFailed as err:
                errors[probe.name] = f"{err.what}\n{err.todo}"
                break
        if probe.name in errors:
            continue
        report["facts"][probe.name] = results[None] if list(results) == [None] else results
        report["sources"][probe.name] = source_hash(probe.path)
    report["created"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    if errors:
        report["errors"] = errors
    return report


def write(report: dict, path: Path) -> None:
    """Write the report as ``facts.json``; never one that lacks a failed probe's results."""
    from oomlab.course.state import write_atomic

    if report.get("errors"):
        raise ProbeFailed(f"Not written: {', '.join(report['errors'])} failed.", f"Fix them and run `{COMMAND}` again.")
    write_atomic(path, json.dumps(report, indent=2, sort_keys=False) + "\n")  # makes the folder as needed


def merged(committed: dict, report: dict, probes: list[Probe]) -> dict:
    """``report``'s probes written over the committed report's, whose other probes are kept, and whose facts of probes
    no longer in ``probes`` are dropped: the report of a run of only the stale probes (:func:`stale_probes`).

    Facts side by side on a page must come from one machine: where the two were measured on another GPU, torch or
    CUDA, nothing is merged and the error says so.
    """
    differs = [key for key in ("gpu", "torch", "cuda") if committed.get(key) != report.get(key)]
    if differs:
        was = ", ".join(f"{key} {committed.get(key)}" for key in differs)
        now = ", ".join(f"{key} {report.get(key)}" for key in differs)
        raise OomLabError(
            f"The committed facts were measured with {was}; these with {now}: nothing merged.",
            f"Run every probe here (`{COMMAND}` without --stale), or only the stale ones where the others were measured.",
        )
    names = {p.name for p in probes}
    kept = {key: value for key, value in committed.items() if key not in ("facts", "sources", "errors")}
    facts_now = {name: value for name, value in committed["facts"].items() if name in names} | report["facts"]
    sources_now = {name: value for name, value in committed["sources"].items() if name in names} | report["sources"]
    return {**kept, "created": report["created"], "facts": facts_now, "sources": sources_now}


# --------------------------------------------------------------------------- the pages


def load(path: Path) -> dict | None:
    """The committed report, or None where there is none yet. Raises ValueError if it is not one."""
    if not path.is_file():
        return None
    report = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(report, dict) or not isinstance(report.get("facts"), dict) or not isinstance(report.get("sources"), dict):
        raise ValueError(f"{path} has no 'facts' and 'sources'; write it with `{COMMAND}`.")
    return report


def stale_probes(report: dict, probes: list[Probe]) -> list[str]:
    """Probes whose results are missing from the report or were measured with another version of the script."""
    return [p.name for p in probes if report["sources"].get(p.name) != source_hash(p.path) or p.name not in report["facts"]]


def lookup(report: dict, name: str, probes: dict[str, Probe]):
    """The value a marker names (``probe.key.subkey``), or :data:`NOT_MEASURED` where the probe has not run yet.

    Raises :class:`UnknownFact` for a probe that does not exist, or a key that its results lack.
    """
    probe, _, path = name.partition(".")
    if probe not in probes:
        known = ", ".join(sorted(probes)) or "none"
        raise UnknownFact(f"unknown fact {name!r}: there is no probe {PROBES_DIR}/{probe}.py (probes: {known})")
    if not path:
        raise UnknownFact(f"unknown fact {name!r}: name a key of the probe's results, as in {probe}.KEY")
    if report is None or probe not in report["facts"]:
        return NOT_MEASURED
    value = report["facts"][probe]
    for part in path.split("."):
        if not isinstance(value, dict) or part not in value:
            keys = ", ".join(sorted(value)) if isinstance(value, dict) else "none: it is a single value"
            raise UnknownFact(f"unknown fact {name!r}: {part!r} is not in the results of probe {probe} (keys there: {keys})")
        value = value[part]
    return value


def format_value(key: str, value) -> str:
    """A fact as a page shows it; the key's last part says what the value is."""
    last = key.rsplit(".", 1)[-1]
    if isinstance(value, dict | list):
        raise UnknownFact(f"fact {key!r} is not a single value; name one of its keys")
    if value is None:
        return "n/a"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, str):
        return value
    if last.endswith("_bytes") and abs(value) >= CARD_SIZED:
        return f"{value / GIB:,.1f} GiB ({value / 1e9:,.0f} GB)"
    if last.endswith("_bytes"):
        shown = format_bytes(value)
        number, unit = shown.split(" ")
        scale = {"B": 1, "KiB": KIB, "MiB": MIB}[unit]
        exact = float(number.replace(",", "")) * scale == value
        return shown if exact or abs(value) >= EXACT_BELOW else f"{shown} ({value:,} bytes)"
    if last.endswith("_fraction"):
        if 0 < abs(value) < 0.005:  # would read 0%: say how small it is instead, as the next power of ten above it
            power = math.floor(math.log10(abs(value) * 100)) + 1
            return f"under {10.0**power:.{max(0, -power)}f}%"
        return f"{value:.0%}"
    if last.endswith("_s"):
        return f"{value:,.1f} s"
    if last.endswith("_parameters") and value >= 1e9 and value % 1e8 == 0:  # a model's size, as it is asked about
        return f"{value / 1e9:g} billion"
    if isinstance(value, int):
        return f"{value:,}"
    return f"{value:,.3g}"


def render(markdown: str, report: dict | None, probes: dict[str, Probe], extra: dict | None = None) -> tuple[str, list[str]]:
    """Every fact marker in the page replaced by its value; and the facts it showed, in order.

    ``extra`` holds facts that are not a probe's (``{"course": {...}}``: figures derived from
    the manifests); a value there may be :data:`NOT_MEASURED` too.
    """
    shown: list[str] = []

    def value_of(m: re.Match) -> str:
        name = m.group(1)
        head, _, rest = name.partition(".")
        if extra and head in extra:
            if rest not in extra[head]:
                raise UnknownFact(f"unknown fact {name!r}: {head} has {', '.join(sorted(extra[head]))}")
            value = extra[head][rest]
        else:
            value = lookup(report, name, probes)
        if name not in shown:
            shown.append(name)
        return value if value is NOT_MEASURED else format_value(name, value)

    return MARKER.sub(value_of, markdown), shown
