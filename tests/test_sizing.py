"""Sizing a training step, on the CPU: the configs, the count of a real step's bytes, the reference estimate against
that count, the hidden configs, the scores, and the sandbox an estimator runs in. The GPU's measurement is the
truth check's (``oomlab dev verify``); here the same step is counted tensor by tensor."""

from __future__ import annotations

import errno
import io
import json
import platform
import random
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from oomlab.errors import OomLabError
from oomlab.measure import sandbox
from oomlab.sizing import PARTS
from oomlab.sizing.config import OPTIMIZERS, PRECISIONS, TrainConfig, config
from oomlab.sizing.hidden import COUNT, MOST_TOKENS, hidden_configs
from oomlab.sizing.sandboxed import run_estimator
from oomlab.sizing.score import TOLERANCE, checked_estimate, score
from tests.sizing_helpers import count_on_cpu, load

REPO = Path(__file__).resolve().parents[1]
REFERENCE = REPO / "solutions" / "size-a-training-step" / "estimate.py"
SMALL = dict(layers=2, width=64, heads=4, sequence=32, batch=2, vocabulary=300)


def reference():
    return load(REFERENCE, "reference_estimate")


def counted(cfg: TrainConfig) -> dict[str, int]:
    from oomlab.sizing.measure import step_bytes

    return count_on_cpu(step_bytes, cfg)


# -- configs ----------------------------------------------------------------------------------------------------------


def test_a_config_is_checked_field_by_field():
    assert config(SMALL) == TrainConfig(**SMALL)
    for bad, said in (
        ({**SMALL, "width": 66}, "must divide by its heads"),
        ({**SMALL, "layers": 0}, "layers must be at least 1"),
        ({**SMALL, "batch": 2.0}, "batch must be a whole number, not 2.0"),
        ({**SMALL, "checkpointing": 1}, "checkpointing must be true or false, not 1"),
        ({**SMALL, "layers": True}, "layers must be a whole number, not True"),
        ({**SMALL, "precision": "fp16"}, "precision must be one of fp32, bf16-autocast, bf16"),
        ({**SMALL, "dropout": 0.1}, "has no field dropout"),
        ({k: v for k, v in SMALL.items() if k != "vocabulary"}, "lacks vocabulary"),
        ([1, 2], "not list"),
    ):
        with pytest.raises(OomLabError, match=said):
            config(bad)


# -- the step, counted on the CPU -------------------------------------------------------------------------------------


def test_the_count_of_a_step_sees_each_tensor_once_and_lets_it_go():
    torch = pytest.importorskip("torch")
    from oomlab.sizing.tracker import LiveBytes

    with LiveBytes() as live:
        a = torch.ones(1000)
        view = a[10:]  # a view of a's storage: nothing new
        b = a * 2
        assert live.allocated() == 8000 and view.numel() == 990
        del a, view
        assert live.allocated() == 4000  # a's storage went with its last view
        c = torch.empty(250)  # noqa: F841 - held, so the peak stays at what was live at once
        live.reset_peak()
        del b
        assert live.allocated() == 1000 and live.peak() == 5000


def test_the_counted_parts_are_the_tensors_the_step_holds():
    torch = pytest.importorskip("torch")
    from oomlab.sizing import model as decoder

    cfg = config({**SMALL, "optimizer": "adamw"})
    parts = counted(cfg)
    net, _ = decoder.build(cfg, torch.device("cpu"))
    n = sum(p.numel() for p in net.parameters())
    assert parts["parameters"] == parts["gradients"] == 4 * n
    # AdamW's two running averages per weight; on the CPU its step counters (one 4-byte tensor each) are counted too
    assert parts["optimizer_state"] == 8 * n + 4 * len(list(net.parameters()))
    assert parts["activations"] > 0 and parts["peak"] > parts["parameters"] + parts["optimizer_state"] + parts["activations"]


def test_checkpointing_keeps_fewer_activations_and_sgd_keeps_no_state():
    plain = counted(config({**SMALL, "optimizer": "sgd"}))
    checkpointed = counted(config({**SMALL, "optimizer": "sgd", "checkpointing": True}))
    assert plain["optimizer_state"] == 0
    assert checkpointed["activations"] < plain["activations"] / 2
    assert checkpointed["parameters"] == plain["parameters"]


# -- the reference estimate against the count -------------------------------------------------------------------------


def small_configs(seed: int, count: int):
    """Configs shaped like the hidden ones, small enough to count on the CPU in a second each."""
    rng = random.Random(seed)
    for i in range(count):
        heads = rng.choice((2, 4, 8))
        yield config(
            dict(
                layers=rng.randint(1, 4),
                width=heads * rng.choice((16, 32)),
                heads=heads,
                sequence=rng.choice((32, 64, 128)),
                batch=rng.randint(1, 4),
                vocabulary=rng.choice((500, 2000, 4000)),
                precision=list(PRECISIONS)[i % 3],
                optimizer=list(OPTIMIZERS)[i % 4],
                checkpointing=i % 2 == 1,
            )
        )


@pytest.mark.parametrize("seed", [0, 1])
def test_the_reference_estimate_agrees_with_the_count_within_the_tolerances(seed):
    """Exactly for what a dtype and a count decide, to the byte for the saved activations, and within the peak's
    tolerance (the count has no allocator rounding and no library workspace; the GPU's measurement decides)."""
    pytest.importorskip("torch")
    ref = reference()
    for cfg in small_configs(seed, 12):
        estimate, parts = ref.estimate(cfg.as_dict()), counted(cfg)
        assert estimate["parameters"] == parts["parameters"] and estimate["gradients"] == parts["gradients"], cfg
        # Adafactor and AdamW keep a 4-byte step counter per tensor, on the CPU even for a GPU's weights
        assert abs(estimate["optimizer_state"] - parts["optimizer_state"]) <= 4 * 200, cfg
        assert abs(estimate["activations"] - parts["activations"]) <= 16, cfg  # the loss and its total weight
        assert abs(estimate["peak"] - parts["peak"]) <= TOLERANCE["peak"] * parts["peak"], cfg


def test_a_naive_estimate_scores_low():
    """Parameters times four bytes for every part: right for the weights and gradients of fp32 only."""
    pytest.importorskip("torch")
    for cfg in small_configs(2, 6):
        n = reference().parameter_count(cfg.as_dict())
        naive = dict.fromkeys(PARTS, 4.0 * n)
        within = [s.part for s in score(naive, counted(cfg)) if s.within]
        assert not {"activations", "peak"} & set(within), cfg


# -- hidden configs ---------------------------------------------------------------------------------------------------


def test_the_hidden_configs_follow_the_source_and_cover_every_precision_and_optimizer():
    first = hidden_configs(b"def estimate(cfg): ...")
    assert first == hidden_configs(b"def estimate(cfg): ...")  # the same code is graded on the same configs
    assert first != hidden_configs(b"def estimate(cfg): ...  # changed")
    for source in (b"a", b"b", b"c"):
        drawn = hidden_configs(source)
        assert len(drawn) == COUNT
        assert {c.precision for c in drawn} == set(PRECISIONS)
        assert {c.optimizer for c in drawn} == set(OPTIMIZERS)
        assert sum(c.checkpointing for c in drawn) == COUNT // 2
        assert all(c.tokens <= MOST_TOKENS and c.width % c.heads == 0 for c in drawn)
    assert "adafactor" not in {c.optimizer for c in hidden_configs(b"a", optimizers=("adamw", "sgd", "sgd-momentum"))}


# -- scores -----------------------------------------------------------------------------------------------------------


def test_each_part_is_scored_against_its_own_tolerance():
    measured = {"parameters": 1000, "gradients": 1000, "optimizer_state": 0, "activations": 1000, "peak": 1000}
    estimate = {"parameters": 1020, "gradients": 1021, "optimizer_state": 0, "activations": 899, "peak": 1150}
    assert [(s.part, s.within) for s in score(estimate, measured)] == [
        ("parameters", True),
        ("gradients", False),
        ("optimizer_state", True),
        ("activations", False),
        ("peak", True),
    ]
    assert not score({**estimate, "optimizer_state": 1}, measured)[2].within  # any guess at nothing is wrong


def test_an_answer_that_is_not_bytes_for_every_part_says_what_is_wrong():
    good = dict.fromkeys(PARTS, 1)
    assert checked_estimate(good, "x") == dict.fromkeys(PARTS, 1.0)
    for bad, said in (
        ([1], "returned list, not a dict"),
        ({"parameters": 1}, "has no gradients, optimizer_state, activations, peak"),
        ({**good, "peak": -1}, "peak is -1"),
        ({**good, "peak": float("nan")}, "peak is nan"),
        ({**good, "peak": True}, "peak is True"),
        ({**good, "peak": "1 GiB"}, "peak is '1 GiB'"),
    ):
        with pytest.raises(OomLabError, match=said):
            checked_estimate(bad, "estimate()")


# -- the sandbox ------------------------------------------------------------------------------------------------------


def landlock():
    abi, why = sandbox.availability()
    if not abi:
        pytest.skip(f"no Landlock here: {why}")


def write(folder: Path, text: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "estimate.py"
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


CONFIGS = [dict(SMALL, precision="fp32", optimizer="adamw", checkpointing=False)] * 2


def test_the_estimator_answers_from_its_sandbox_and_its_prints_stay_out_of_the_answer(tmp_path):
    landlock()
    course = tmp_path / "course"
    script = write(
        course / "exercises" / "size",
        """
        import helper
        print("thinking out loud")
        def estimate(cfg):
            print(cfg)
            return {part: helper.BYTES * cfg["layers"] for part in
                    ("parameters", "gradients", "optimizer_state", "activations", "peak")}
        if __name__ == "__main__":
            raise SystemExit("the demo is not run")
        """,
    )
    (script.parent / "helper.py").write_text("BYTES = 10\n")
    assert run_estimator(script, CONFIGS, course) == [dict.fromkeys(PARTS, 20.0)] * 2


def test_the_estimator_can_read_no_answer_and_reach_no_gpu(tmp_path):
    landlock()
    course = tmp_path / "course"
    (course / ".oomlab").mkdir(parents=True)
    (course / ".oomlab" / "measured.json").write_text("{}")
    (course / "solutions").mkdir()
    script = write(
        course / "exercises" / "size",
        f"""
        import os
        seen = {{}}
        for name, path in (("answers", {str(course / ".oomlab" / "measured.json")!r}),
                           ("solutions", {str(course / "solutions")!r}),
                           ("parent", "/proc/%d/mem" % os.getppid())):
            try:
                os.listdir(path) if name == "solutions" else open(path).read()
                seen[name] = 1.0
            except OSError:
                seen[name] = 0.0
        def estimate(cfg):
            return {{"parameters": seen["answers"], "gradients": seen["parent"], "optimizer_state": 0,
                    "activations": float(os.environ.get("CUDA_VISIBLE_DEVICES") == ""), "peak": 0}}
        """,
    )
    (answer,) = run_estimator(script, CONFIGS[:1], course)
    assert answer["parameters"] == 0.0 and answer["gradients"] == 0.0  # neither the cache nor the parent's memory
    assert answer["activations"] == 1.0  # and CUDA sees no device, besides the device files it cannot open


@pytest.mark.parametrize("where", ["at load", "in estimate()"])
def test_an_estimator_cannot_simulate_the_step_with_torch_and_is_told_why(tmp_path, where):
    landlock()
    pytest.importorskip("torch")  # torch is installed, only the estimator cannot reach it
    text = (
        "import torch\ndef estimate(cfg):\n    return {}\n"
        if where == "at load"
        else "def estimate(cfg):\n    from torch.utils import checkpoint\n    return {}\n"
    )
    with pytest.raises(OomLabError, match="imports torch. torch cannot be imported by an estimator") as err:
        run_estimator(write(tmp_path / "ex", text), CONFIGS[:1], tmp_path)
    assert "arithmetic on the config" in str(err.value) and "oomlab run" in err.value.todo


def test_an_estimator_that_removes_the_finder_still_cannot_read_torch(tmp_path):
    landlock()
    pytest.importorskip("torch")
    script = write(
        tmp_path / "ex",
        """
        import sys
        sys.meta_path[:] = [f for f in sys.meta_path if type(f).__name__ != "NoTorch"]
        try:
            import torch
            reached = 1.0
        except OSError:  # the folder is there, and its files cannot be opened
            reached = 0.0
        def estimate(cfg):
            return dict.fromkeys(("parameters", "gradients", "optimizer_state", "activations", "peak"), reached)
        """,
    )
    (answer,) = run_estimator(script, CONFIGS[:1], tmp_path)
    assert answer["peak"] == 0.0


def test_an_estimator_cannot_open_another_environments_torch_but_may_use_numpy(tmp_path):
    # A second installation (another virtualenv, a conda environment) is outside what the estimator may read.
    landlock()
    pytest.importorskip("numpy")
    other = tmp_path / "other-env" / "lib" / "python3.11" / "site-packages"
    (other / "torch").mkdir(parents=True)
    (other / "torch" / "__init__.py").write_text("SIMULATED = 1.0\n")
    script = write(
        tmp_path / "course" / "ex",
        f"""
        import sys
        import numpy as np
        sys.meta_path[:] = [f for f in sys.meta_path if type(f).__name__ != "NoTorch"]
        sys.path.insert(0, {str(other)!r})
        try:
            import torch
            reached = torch.SIMULATED
        except OSError:
            reached = 0.0
        def estimate(cfg):
            return dict.fromkeys(("parameters", "gradients", "optimizer_state", "activations", "peak"),
                                 reached + float(np.int64(cfg["layers"])))
        """,
    )
    (answer,) = run_estimator(script, CONFIGS[:1], tmp_path / "course")
    assert answer["peak"] == 2.0  # numpy answered; the other torch could not be read
    # Nor a copy beside the estimator, under its own name or another: only the folder's modules can be read.
    text = script.read_text().replace(repr(str(other)), repr(str(script.parent)))
    for name in ("torch", "notorch"):
        beside = script.parent / name
        beside.mkdir()
        (beside / "__init__.py").write_text("SIMULATED = 1.0\n")
        estimator = write(script.parent, text.replace("import torch", f"import {name} as torch"))
        (answer,) = run_estimator(estimator, CONFIGS[:1], tmp_path / "course")
        assert answer["peak"] == 2.0, name


def test_an_estimator_opens_no_socket_to_fetch_a_torch_or_ask_another_process(tmp_path):
    # With a socket, an estimator could download a torch into its writable working folder, or ask a local process to
    # measure for it. Each way it might try counts 1.0 in its answer where it got through; a server here listens.
    landlock()
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        script = write(
            tmp_path / "ex",
            f"""
            import socket, subprocess, sys
            tries = {{
                "tcp": lambda: socket.create_connection(("127.0.0.1", {port}), timeout=5),
                "udp": lambda: socket.socket(socket.AF_INET6, socket.SOCK_DGRAM),
                "unix": lambda: socket.socket(socket.AF_UNIX),
                "pair": lambda: socket.socketpair(),
                "child": lambda: subprocess.run([sys.executable, "-c",
                    "import socket; socket.create_connection(('127.0.0.1', {port}), timeout=5)"], check=True),
            }}
            reached = 0.0
            for way, attempt in tries.items():
                try:
                    attempt()
                    reached += 1.0
                except (OSError, subprocess.CalledProcessError):
                    pass
            def estimate(cfg):
                return dict.fromkeys(("parameters", "gradients", "optimizer_state", "activations", "peak"), reached)
            """,
        )
        (answer,) = run_estimator(script, CONFIGS[:1], tmp_path)
    assert answer["peak"] == 0.0


def test_the_socket_filter_checks_the_table_before_the_number():
    # On x86-64 a 32-bit call (int 0x80) indexes the i386 table, where socket is 359, not 41: a filter that checked
    # only numbers would let it through. The call is made from machine code, unfiltered and filtered.
    from oomlab.measure import socket_filter

    with pytest.raises(socket_filter.Unavailable, match="no socket filter is written for riscv64"):
        socket_filter.program("riscv64")
    if platform.machine() != "x86_64":
        pytest.skip("the 32-bit table is x86-64's")
    code = """
        import ctypes, mmap, sys
        # push rbx; mov eax, 359 (i386 socket); mov ebx, AF_INET; mov ecx, SOCK_STREAM; xor edx, edx; int 0x80; pop rbx; ret
        machine = bytes.fromhex("53b867010000bb02000000b90100000031d2cd805bc3")
        page = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
        page.write(machine)
        call = ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(page)))
        if sys.argv[1] == "filtered":
            from oomlab.measure import socket_filter
            socket_filter.apply()
        print(call())
    """
    answers = {}
    for how in ("unfiltered", "filtered"):
        done = subprocess.run([sys.executable, "-c", textwrap.dedent(code), how], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        answers[how] = int(done.stdout)
    if answers["unfiltered"] == -errno.ENOSYS:
        pytest.skip("this kernel runs no 32-bit calls")
    assert answers["unfiltered"] >= 0 and answers["filtered"] == -errno.EACCES


def test_answers_measured_in_advance_in_a_module_beside_the_estimator_answer_other_configs(tmp_path):
    # The configs are drawn from the estimator's code, by an algorithm anyone can run: a learner with a GPU could draw
    # them for a fixed estimate.py, measure them, and keep the answers in a helper module it imports. The helper is
    # part of what the configs are drawn from, so its table answers configs the estimator is not graded on.
    from oomlab.sizing.grade import SIZED, estimate_hidden, estimator_source

    draw = SIZED["train"].draw  # as the grade draws them (with only the optimizers this torch has)
    landlock()
    folder = tmp_path / "ex"
    script = write(
        folder,
        """
        import table
        def estimate(cfg):
            key = tuple(sorted(cfg.items()))
            return table.ANSWERS.get(key) or dict.fromkeys(table.PARTS, 0.0)
        """,
    )
    assert estimator_source(script) == script.read_bytes()  # alone, as every estimator the course ships is
    prepared = draw(script.read_bytes(), COUNT)
    answers = {tuple(sorted(c.as_dict().items())): dict.fromkeys(PARTS, 1.0) for c in prepared}
    (folder / "table.py").write_text(f"PARTS = {list(PARTS)!r}\nANSWERS = {answers!r}\n", encoding="utf-8")
    _, configs, estimates = estimate_hidden(script, tmp_path)
    assert not set(configs) & set(prepared)
    assert estimates == [dict.fromkeys(PARTS, 0.0)] * COUNT  # no table entry for any config it is graded on
    (folder / "table.py").write_text(f"PARTS = {list(PARTS)!r}\nANSWERS = {{}}\n", encoding="utf-8")
    assert draw(estimator_source(script), COUNT) != configs  # a change to the helper draws new configs too


def test_every_torch_in_the_folders_an_estimator_reads_is_hidden(tmp_path):
    from oomlab.sizing.sandboxed import estimator_policy, torch_folders

    base = tmp_path / "base-python"
    copies = [base / "lib" / "python3.11" / "site-packages" / "torch", base / "lib" / "python3" / "dist-packages" / "torch"]
    for copy in copies:
        copy.mkdir(parents=True)
    (base / "lib" / "python3.11" / "site-packages" / "torchvision").mkdir()
    assert set(copies) <= set(torch_folders([base]))
    assert not any(p.name == "torchvision" for p in torch_folders([base]))
    script = write(tmp_path / "course" / "exercises" / "size", "def estimate(cfg):\n    return {}\n")
    policy = estimator_policy(script, tmp_path / "run", tmp_path / "run" / "work", tmp_path / "course")
    assert policy.kind_of("/") == policy.kind_of(str(tmp_path / "elsewhere")) == "hidden"
    assert policy.kind_of(str(script)) == "visible"
    assert policy.kind_of(str(tmp_path / "course" / "solutions")) == "hidden"
    pytest.importorskip("torch")
    import torch

    assert policy.kind_of(torch.__file__) == "hidden"


@pytest.mark.parametrize(
    "text, said",
    [
        ("def estimate(cfg):\n    return 1 / 0\n", r"(?s)estimate\(\) failed on config 1 \(layers=2.*ZeroDivisionError"),
        ("x = (\n", r"(?s)Loading estimate.py failed:\n.*SyntaxError"),
        ("def estimat(cfg):\n    pass\n", r"defines no function estimate\(config\)"),
        ("def estimate(cfg):\n    return [1]\n", r"config 1 returned list, not a dict"),
        ("import os\ndef estimate(cfg):\n    os._exit(3)\n", r"ended \(exit status 3\) without its answers"),
    ],
)
def test_an_estimator_that_fails_says_how(tmp_path, text, said):
    landlock()
    with pytest.raises(OomLabError, match=said):
        run_estimator(write(tmp_path / "ex", text), CONFIGS[:1], tmp_path)


def test_an_estimator_that_never_answers_is_stopped(tmp_path):
    landlock()
    script = write(tmp_path / "ex", "import time\ndef estimate(cfg):\n    time.sleep(60)\n")
    with pytest.raises(OomLabError, match="did not answer within 1 s"):
        run_estimator(script, CONFIGS[:1], tmp_path, time_limit_s=1)


def test_measuring_without_a_gpu_says_so():
    pytest.importorskip("torch")
    import torch

    from oomlab.sizing.grade import measure_configs

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the truth check measures there")
    with pytest.raises(OomLabError, match="no CUDA device is visible to torch"):
        measure_configs([config(SMALL)])


def test_the_measuring_child_reads_configs_and_refuses_a_bad_one():
    done = subprocess.run(
        [sys.executable, "-m", "oomlab.sizing.measure"],
        input=json.dumps([{**SMALL, "heads": 5}]),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0 and "must divide by its heads" in done.stderr


def test_a_rehearsal_takes_each_configs_code_paths_in_a_fraction_of_its_bytes():
    # What a library allocates at its first use of a path (cuBLAS's and cuBLASLt's workspaces, per thread) must be
    # allocated before the first measured step: the rehearsal keeps every field that picks a path and runs.
    from oomlab.sizing.hidden import rough_bytes
    from oomlab.sizing.measure import rehearsal, step_bytes

    drawn = hidden_configs(b"any estimator")
    for cfg in drawn:
        small = rehearsal(cfg)
        assert config(small.as_dict()) == small
        for path in ("precision", "optimizer", "checkpointing", "width", "heads"):
            assert getattr(small, path) == getattr(cfg, path)
        assert rough_bytes(small) < rough_bytes(cfg) / 2
    for precision in PRECISIONS:
        small = rehearsal(TrainConfig(**SMALL, precision=precision, checkpointing=True))
        assert count_on_cpu(step_bytes, small)["peak"] > 0


@pytest.mark.parametrize("full_at", ["rehearsal", "config"])
def test_a_gpu_too_full_is_reported_per_config_as_out_of_memory(monkeypatch, capsys, full_at):
    # The rehearsal runs before any config: a GPU too full for it must say "out of memory" for each config (the grade
    # then says "Free the GPU of other jobs"), not fail with a traceback that the grade can only quote.
    import torch

    from oomlab.sizing import measure

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "init", lambda: None)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda: "a full GPU")
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr("sys.stdin", io.StringIO(json.dumps(["a", "b"])))

    def measure_one(cfg, device, meter):
        if cfg == full_at or (full_at == "config" and cfg == "b"):
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB\nmore")
        return {"peak": 1}

    assert measure.serve(str, measure_one, lambda cfg: "rehearsal") == 0
    measured = json.loads(capsys.readouterr().out)["measured"]
    if full_at == "rehearsal":
        assert [m["error"] for m in measured] == [
            "out of memory in the rehearsal before it: CUDA out of memory. Tried to allocate 2.00 GiB"
        ] * 2
    else:
        assert measured == [{"peak": 1}, {"error": "out of memory: CUDA out of memory. Tried to allocate 2.00 GiB"}]


# -- grading an estimator ---------------------------------------------------------------------------------------------


def test_the_hidden_generation_configs_follow_the_source_and_cover_each_kind_of_attention():
    from oomlab.sizing.hidden import hidden_decode_configs, rough_decode_bytes

    first = hidden_decode_configs(b"def estimate(cfg): ...")
    assert first == hidden_decode_configs(b"def estimate(cfg): ...") != hidden_decode_configs(b"# changed")
    for source in (b"a", b"b", b"c"):
        drawn = hidden_decode_configs(source)
        kinds = {"multi-query" if c.kv_heads == 1 else "multi-head" if c.kv_heads == c.heads else "grouped" for c in drawn}
        assert kinds == {"multi-query", "grouped", "multi-head"}
        assert {c.precision for c in drawn} == {"fp32", "bf16"}
        assert all(c.heads % c.kv_heads == 0 and rough_decode_bytes(c) <= 8 << 30 for c in drawn)


def test_an_estimator_is_graded_part_by_part_against_what_was_measured(tmp_path, monkeypatch):
    """The grading's logic with the GPU stood in for: each hidden config "measured" at the reference estimate times a
    factor; the estimator itself runs in its sandbox."""
    landlock()
    import oomlab.sizing.grade as grade

    def measured_as(factor):
        def measure(configs, module, time_limit_s=0):
            assert module == "oomlab.sizing.measure"
            return [{k: int(v * factor) for k, v in reference().estimate(c.as_dict()).items()} for c in configs], "GPU", "t"

        return measure

    script = write(tmp_path / "ex", REFERENCE.read_text(encoding="utf-8"))
    monkeypatch.setattr(grade, "measure_configs", measured_as(1.0))
    report = grade.grade_estimator(script, None)
    assert report.passed and report.within == report.total == COUNT * len(PARTS) and report.gpu == "GPU"
    assert report.configs == hidden_configs(script.read_bytes(), grade.available_optimizers())

    monkeypatch.setattr(grade, "measure_configs", measured_as(1.12))  # 11% short of every figure
    report = grade.grade_estimator(script, None)
    failed = {s.part for row in report.scores for s in row if not s.within}
    assert not report.passed and "peak" not in failed and {"parameters", "activations"} <= failed


def test_measuring_failures_are_the_machines_and_say_so(monkeypatch):
    import oomlab.sizing.grade as grade

    monkeypatch.setattr(
        grade.subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 0, json.dumps({"error": "no CUDA device"}), "")
    )
    with pytest.raises(grade.MeasuringFailed, match="cannot be measured here: no CUDA device") as err:
        grade.measure_configs([config(SMALL)])
    assert isinstance(err.value, OomLabError) and "machine with one" in err.value.todo


def test_what_an_estimator_leaves_running_neither_holds_its_answer_nor_the_grade(tmp_path):
    """A thread that never ends and a forked process that keeps the answer's pipe open: the answer is read once
    written, and the process is stopped a few seconds later, not waited for."""
    landlock()
    script = write(
        tmp_path / "ex",
        """
        import os, threading, time
        threading.Thread(target=time.sleep, args=(600,)).start()  # not a daemon: Python waits for it at exit
        if os.fork() == 0:
            time.sleep(600)  # holds every descriptor of its parent, the answer's pipe included
            os._exit(0)
        def estimate(cfg):
            return dict.fromkeys(("parameters", "gradients", "optimizer_state", "activations", "peak"), 1)
        """,
    )
    began = time.monotonic()
    assert run_estimator(script, CONFIGS[:1], tmp_path, time_limit_s=60) == [dict.fromkeys(PARTS, 1.0)]
    assert time.monotonic() - began < 30


def test_a_missing_estimator_is_said_the_same_way_wherever_it_is_graded(tmp_path):
    from oomlab.sizing.grade import grade_estimator

    missing = tmp_path / "estimate.py"
    for grade in (lambda: run_estimator(missing, CONFIGS, tmp_path), lambda: grade_estimator(missing, tmp_path)):
        with pytest.raises(OomLabError, match=f"{missing} does not exist") as err:
            grade()
        assert "oomlab reset" in err.value.todo
