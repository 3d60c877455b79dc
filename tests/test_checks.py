"""The checks on hand-made measurements: each passes the honest run and names each cheat in words."""

from __future__ import annotations

import pytest

from oomlab.errors import OomLabError
from oomlab.grading.checks import CHECKS, close, run_checks, workload_differences
from oomlab.measure.harness import Measurement
from oomlab.units import MIB, format_bytes

BUDGET = 1024 * MIB


def stats(**overrides) -> dict:
    base = {
        "peak_allocated": 500 * MIB,
        "peak_reserved": 600 * MIB,
        "peak_requested": 500 * MIB,
        "inactive_split_peak": 40 * MIB,
        "inactive_split_final": 0,
        "allocated_final": 10 * MIB,
        "reserved_final": 600 * MIB,
        "retries": 0,
        "ooms": 0,
        "segments_peak": 12,
    }
    return {**base, **overrides}


def workload(**overrides) -> dict:
    base = {
        "optimizer_steps": 3,
        "samples_per_step": [16, 16, 16],
        "train_forwards": 3,
        "train_samples": 48,
        "train_elements": 48 * 512,
        "inference_forwards": 2,
        "inference_samples": 64,
        "inference_elements": 64 * 512,
        "devices": ["cuda"],
        "backward_calls": 3,
        "backward_per_step": [1, 1, 1],
        "losses": [2.5, 2.0, 1.5],
        "param_count": 1000,
        "inference_outputs": {"digested": 2, "sum": 4.0, "sum_squares": 9.0},
        "serving": {"reserved": [600 * MIB] * 4, "inactive_split": [8 * MIB] * 4, "output_sums": [1.0, 2.0]},
    }
    return {**base, **overrides}


def digest(scale: float = 1.0, shapes=((10, 10), (10,))) -> dict:
    """A weights digest (oomlab.measure.weights.digest) of tensors whose values are ``scale`` times the reference's."""
    tensors = []
    for shape in shapes:
        values = [scale * (0.1 + 0.01 * i) for i in range(min(512, shape[0] * (shape[1] if len(shape) > 1 else 1)))]
        tensors.append(
            {
                "shape": list(shape),
                "sum": sum(values),
                "norm": sum(v * v for v in values) ** 0.5,
                "finite": True,
                "sample": values,
            }
        )
    return {"tensors": tensors}


CONTEXT = 500 * MIB


def witness(**driver) -> dict:
    """What the supervisor saw of an honest run: the driver's peak is reserved's plus the context, and so on."""
    base = {
        "available": True,
        "peak_bytes": 600 * MIB + CONTEXT,
        "at_ready_bytes": CONTEXT - 20 * MIB,
        "at_figures_bytes": 600 * MIB + CONTEXT,
    }
    return {
        "driver": {**base, **driver},
        "other_gpu_processes": [],
        "script_cpu_s": 5.0,
        "maxrss_bytes": 2000 * MIB,
        "rss_at_ready_bytes": 1800 * MIB,
    }


def measurement(status="ok", stats_=None, workload_=None, **fields) -> Measurement:
    fields.setdefault("witness", witness())
    fields.setdefault("weights_digest", digest())
    fields.setdefault("figures_witnessed", True)
    return Measurement(
        script="/course/exercises/ex/train.py",
        status=status,
        stats=stats() if stats_ is None else stats_,
        workload=workload() if workload_ is None else workload_,
        budget_bytes=BUDGET,
        **fields,
    )


REF = measurement()


def check(name: str, m: Measurement, ref: Measurement | None = REF, **params):
    return CHECKS[name].evaluate(m, ref, params)


def test_the_honest_run_passes_every_check():
    for name in CHECKS:
        result = check(name, measurement())
        assert result.passed, (name, result)
        assert result.detail == ""
        assert result.why


# --- same_workload ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "changes, words",
    [
        ({"samples_per_step": [16, 8, 16], "train_samples": 40}, ["Step 2", "8 samples", "smaller batch"]),
        (
            {"optimizer_steps": 2, "samples_per_step": [16, 16], "train_samples": 32},
            ["2 optimizer steps", "runs 3", "Fewer steps"],
        ),
        (
            {"inference_samples": 16, "inference_elements": 16 * 512},
            ["saw 16 samples", "reference sees 64", "Skipping evaluation"],
        ),
        ({"inference_samples": 0, "inference_elements": 0, "inference_forwards": 0}, ["saw 0 samples", "Skipping evaluation"]),
        ({"train_elements": 48 * 256}, ["12,288 elements", "24,576", "Shorter or fewer sequences"]),
        ({"devices": ["cpu", "cuda"]}, ["ran on cpu", "runs on the GPU"]),
    ],
    ids=["smaller-batch", "fewer-steps", "less-eval-data", "no-eval", "shorter-sequences", "cpu-device"],
)
def test_same_workload_names_the_cheat(changes, words):
    result = check("same_workload", measurement(workload_=workload(**changes)))
    assert not result.passed
    for word in words:
        assert word in result.detail, (word, result.detail)


def test_same_workload_reports_each_difference_once():
    w = workload(samples_per_step=[16, 8, 4], train_elements=1, inference_samples=1)
    problems = workload_differences(w, workload())
    # One line for the batch (not one per step, and not the elements it implies), one for evaluation.
    assert len(problems) == 2
    assert "Step 2" in problems[0] and "Evaluation" in problems[1]


def test_same_workload_of_a_run_that_recorded_nothing():
    result = check("same_workload", measurement(workload_={}))
    assert not result.passed and "Fewer steps" in result.detail
    assert not check("same_workload", measurement(), ref=measurement(workload_={})).passed


# --- same_results ----------------------------------------------------------------------------


def test_same_results_within_tolerance_passes():
    w = workload(losses=[2.5 * (1 + 5e-4), 2.0, 1.5])
    assert check("same_results", measurement(workload_=w), rtol=1e-3).passed
    assert not check("same_results", measurement(workload_=w), rtol=1e-4).passed
    near = measurement(weights_digest=digest(1 + 5e-4))
    assert check("same_results", near).passed
    assert not check("same_results", near, weights_rtol=1e-4).passed


@pytest.mark.parametrize(
    "changes, words",
    [
        ({"losses": [2.5, 2.1, 1.5]}, ["At optimizer step 2", "altered what the optimizer sees"]),
        ({"losses": [2.5, 2.0]}, ["stepped 2 times", "steps 3 times"]),
        ({"weights_digest": digest(1.01)}, ["tensor by tensor", "1.0e-02 apart", "did not train"]),
        ({"weights_digest": digest(shapes=((10, 10),))}, ["holds 1 tensors", "reference's holds 2"]),
        ({"weights_digest": digest(shapes=((10, 5), (10,)))}, ["tensor 1 has shape (10, 5)", "(10, 10)"]),
        ({"weights_digest": None}, ["no final weights were recorded"]),
        ({"weights_digest": {"error": "the weights file holds 3 bytes"}}, ["holds 3 bytes"]),
        (
            {"workload_": workload(inference_outputs={"digested": 2, "sum": 0.0, "sum_squares": 0.0})},
            ["evaluation", "computed, not printed"],
        ),
    ],
    ids=[
        "other-loss",
        "fewer-losses",
        "other-weights",
        "fewer-tensors",
        "other-shape",
        "no-weights",
        "broken-weights",
        "eval-not-run",
    ],
)
def test_same_results_names_the_difference(changes, words):
    fields = {k: v for k, v in changes.items() if k in ("weights_digest", "workload_")}
    w = workload(**{k: v for k, v in changes.items() if k not in fields})
    result = check("same_results", measurement(**{"workload_": w, **fields}))
    assert not result.passed
    for word in words:
        assert word in result.detail, (word, result.detail)


# --- no_oom ----------------------------------------------------------------------------------


def test_oom_names_where():
    m = measurement(
        status="oom",
        stats_=stats(ooms=1),
        message="CUDA out of memory. Tried to allocate 2.00 GiB.\nmore lines",
        line_no=42,
        line="features.append(encoder(x))",
    )
    result = check("no_oom", m)
    assert not result.passed
    assert result.measured == "OOM at train.py:42"
    assert result.detail == "CUDA out of memory. Tried to allocate 2.00 GiB."


def test_oom_caught_by_the_script_still_fails():
    # The script swallowed the OutOfMemoryError and ran to its end: the allocator's counter remembers.
    result = check("no_oom", measurement(status="ok", stats_=stats(ooms=2)))
    assert not result.passed
    assert "2 allocation(s) failed and were handled inside the run" in result.detail


def test_a_caught_oom_is_not_blamed_on_the_script_alone():
    # The counter also counts a failure a library handled itself (cuDNN falling back to a smaller workspace).
    detail = check("no_oom", measurement(status="ok", stats_=stats(ooms=1))).detail
    assert "by the script or by a library" in detail and "the script caught" not in detail


# --- untampered ------------------------------------------------------------------------------


def test_tampering_is_named():
    m = measurement(tamper=["reset the peak memory statistics the grader reads (torch._C._cuda_resetPeakMemoryStats)"])
    result = check("untampered", m)
    assert not result.passed
    assert "reset the peak memory statistics" in result.detail


def test_reserving_more_than_the_budget_is_tampering():
    result = check("untampered", measurement(stats_=stats(peak_reserved=BUDGET + MIB)))
    assert not result.passed
    assert "1,025.0 MiB, more than the 1,024.0 MiB budget" in result.detail
    assert check("untampered", measurement(stats_=stats(peak_reserved=BUDGET))).passed


# --- retries ---------------------------------------------------------------------------------


def test_retries_above_max_fail():
    assert check("retries", measurement(stats_=stats(retries=2)), max=2).passed
    result = check("retries", measurement(stats_=stats(retries=3)), max=2)
    assert not result.passed and "3 time(s)" in result.detail
    assert not check("retries", measurement(stats_=stats(retries=1))).passed  # max defaults to 0


def test_retries_without_figures_fail():
    m = measurement()
    m.stats = None
    result = check("retries", m)
    assert not result.passed and "No allocator figures" in result.detail


# --- relative bytes --------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["peak_allocated", "peak_reserved", "inactive_split_peak"])
def test_relative_bytes_tolerance(name):
    ref = measurement(stats_=stats(**{name: 400 * MIB}))
    at = lambda n: measurement(stats_=stats(**{name: n}))  # noqa: E731
    assert check(name, at(440 * MIB), ref, tolerance=0.10).passed
    failed = check(name, at(440 * MIB + 1), ref, tolerance=0.10)
    assert not failed.passed
    assert "1.10x the reference's 400.0 MiB" in failed.detail
    assert "440.0 MiB" in failed.threshold
    # Without a tolerance the default is 10%.
    assert check(name, at(440 * MIB), ref).passed
    assert not check(name, at(441 * MIB), ref).passed
    assert check(name, at(600 * MIB), ref, tolerance=0.5).passed


@pytest.mark.parametrize("name", ["peak_allocated", "peak_reserved", "inactive_split_peak"])
def test_relative_bytes_slack_for_small_figures(name):
    ref = measurement(stats_=stats(**{name: 10 * MIB}))
    at = lambda n: measurement(stats_=stats(**{name: n}))  # noqa: E731
    # 10% of 10 MiB is 1 MiB; the slack allows 32 MiB more.
    assert not check(name, at(12 * MIB), ref, tolerance=0.10).passed
    assert check(name, at(42 * MIB), ref, tolerance=0.10, slack_mib=32).passed
    assert not check(name, at(42 * MIB + 1), ref, tolerance=0.10, slack_mib=32).passed


def test_relative_bytes_without_figures_fail():
    m = measurement()
    m.stats = None
    result = check("peak_allocated", m)
    assert not result.passed and "No memory figures" in result.detail
    assert not check("peak_allocated", measurement(), ref=None).passed


# --- running and validating checks -----------------------------------------------------------


def test_run_checks_always_includes_untampered():
    tampered = measurement(tamper=["changed the exercise's memory budget (torch._C._cuda_setMemoryFraction)"])
    always = ["untampered", "settings", "driver", "cpu_time", "host_memory"]
    results = run_checks({"no_oom": {}}, tampered, REF)
    assert [r.name for r in results] == [*always, "no_oom"]
    assert not results[0].passed
    assert [r.name for r in run_checks({}, measurement(), REF)] == always
    # Named in the manifest too (to set its parameters): still run once.
    names = [r.name for r in run_checks({"no_oom": {}, "untampered": {}, "host_memory": {"slack_mib": 1024}}, measurement(), REF)]
    assert names == [*always, "no_oom"]


def test_run_checks_passes_the_manifests_parameters():
    m = measurement(stats_=stats(retries=1))
    assert not run_checks({"retries": {}}, m, REF)[-1].passed
    assert run_checks({"retries": {"max": 1}}, m, REF)[-1].passed


@pytest.mark.parametrize(
    "name, params, words",
    [
        ("retries", {"maximum": 1}, ["unknown parameter 'maximum'", "Allowed: max"]),
        ("retries", {"max": 1.5}, ["max should be a int"]),
        ("retries", {"max": True}, ["max should be a int"]),
        ("peak_allocated", {"tolerance": "10%"}, ["tolerance should be a float"]),
        ("no_oom", {"strict": True}, ["unknown parameter 'strict'", "Allowed: caught_max"]),
        ("same_workload", {"padded": 1}, ["padded should be a bool"]),
        ("untampered", {"strict": True}, ["unknown parameter 'strict'", "Allowed: none"]),
    ],
)
def test_validate_rejects_bad_parameters(name, params, words):
    with pytest.raises(OomLabError) as err:
        CHECKS[name].validate(params, where="ex.toml: [checks.x]")
    for word in words:
        assert word in str(err.value)
    assert str(err.value).startswith("ex.toml: [checks.x]")


def test_validate_accepts_an_int_for_a_float_and_evaluate_uses_it():
    params = {"tolerance": 1, "slack_mib": 32}  # TOML writes 1 for 1.0
    CHECKS["peak_allocated"].validate(params, where="ex.toml")  # raises on a type it does not accept
    ref = Measurement(script="ref.py", status="ok", stats=stats(peak_allocated=100 * MIB))
    at_limit = Measurement(script="fix.py", status="ok", stats=stats(peak_allocated=200 * MIB))
    over = Measurement(script="fix.py", status="ok", stats=stats(peak_allocated=200 * MIB + 1))
    assert CHECKS["peak_allocated"].evaluate(at_limit, ref, params).passed  # 100 MiB x (1 + 1)
    assert not CHECKS["peak_allocated"].evaluate(over, ref, params).passed


# --- judged by what the optimizer saw ----------------------------------------------------------


def test_micro_batches_whose_losses_add_up_to_the_batch_pass():
    # The child sums the losses backpropagated between optimizer steps: two halves, each loss / 2.
    split = workload(backward_calls=6, backward_per_step=[2, 2, 2], losses=[2.5 * (1 + 1e-6), 2.0, 1.5])
    assert check("same_results", measurement(workload_=split), rtol=1e-4).passed
    assert check("same_workload", measurement(workload_=split)).passed


def test_backward_per_step_asks_for_the_whole_batch_once_the_bugs_are_gone():
    split = measurement(workload_=workload(backward_per_step=[4, 4, 4]))
    result = check("backward_per_step", split, max=1)
    assert not result.passed and "hyperparameter-level" in result.detail
    assert check("backward_per_step", split, max=4).passed


# --- padded inputs -----------------------------------------------------------------------------


def test_padded_inputs_are_judged_by_samples_steps_and_results_not_elements():
    padded = measurement(workload_=workload(train_elements=48 * 768))
    assert not check("same_workload", padded).passed  # strict: the shapes are the workload
    assert check("same_workload", padded, padded=True).passed
    truncated = measurement(workload_=workload(train_elements=48 * 256, losses=[2.4, 2.0, 1.5]))
    assert check("same_workload", truncated, padded=True).passed
    assert not check("same_results", truncated).passed  # fewer tokens: another loss
    smaller = measurement(workload_=workload(samples_per_step=[16, 8, 16]))
    assert not check("same_workload", smaller, padded=True).passed


# --- no_oom with recovery ----------------------------------------------------------------------


def test_caught_ooms_pass_only_up_to_the_manifests_number():
    once = measurement(stats_=stats(ooms=1))
    assert not check("no_oom", once).passed
    assert check("no_oom", once, caught_max=1).passed
    assert not check("no_oom", measurement(stats_=stats(ooms=2)), caught_max=1).passed
    assert not check("no_oom", measurement(status="oom", stats_=stats(ooms=1)), caught_max=1).passed


# --- settings ----------------------------------------------------------------------------------


def test_settings_the_exercise_does_not_leave_to_the_learner_fail():
    m = measurement(alloc_conf="expandable_segments:True", alloc_conf_declared=True)
    result = check("settings", m, alloc_conf="", learner_settings=False)
    assert not result.passed and "wants the fix in the code" in result.detail
    assert check("settings", m, alloc_conf="", learner_settings=True).passed
    assert check("settings", measurement(), alloc_conf="", learner_settings=False).passed


def test_another_allocator_backend_is_never_a_fix():
    m = measurement(alloc_conf="backend:cudaMallocAsync", alloc_conf_declared=True)
    result = check("settings", m, alloc_conf="", learner_settings=True)
    assert not result.passed and "native caching allocator" in result.detail


# --- plateau and a worker's outputs ------------------------------------------------------------


def serving_run(reserved, stranded=None, sums=(1.0, 2.0)):
    stranded = stranded or [0] * len(reserved)
    w = workload(optimizer_steps=0, samples_per_step=[], losses=[], weights_sum=None, weights_norm=None)
    w["serving"] = {
        "reserved": [r * MIB for r in reserved],
        "inactive_split": [s * MIB for s in stranded],
        "output_sums": list(sums),
    }
    return measurement(workload_=w)


def test_plateau_fails_memory_that_grows_after_warm_up():
    flat = serving_run([100, 300, 300, 300, 300, 300])
    growing = serving_run([100, 150, 200, 250, 300, 350], [0, 10, 20, 30, 40, 50])
    assert check("plateau", flat, slack_mib=16).passed
    result = check("plateau", growing, slack_mib=16)
    assert not result.passed
    assert "reserved memory grew by 150.0 MiB" in result.detail and "non-releasable memory grew by 30.0 MiB" in result.detail
    assert not check("plateau", serving_run([100]), slack_mib=16).passed  # nothing to judge


def test_a_worker_without_an_optimizer_is_judged_by_its_outputs():
    ref = serving_run([100, 100], sums=(1.0, 2.0))
    assert check("same_results", serving_run([100, 100], sums=(1.0, 2.0 + 1e-9)), ref=ref).passed
    result = check("same_results", serving_run([100, 100], sums=(1.0, 2.5)), ref=ref)
    assert not result.passed and "request 2" in result.detail
    assert not check("same_results", serving_run([100], sums=(1.0,)), ref=ref).passed


# --- the tolerance rule ----------------------------------------------------------------------------


def test_close_scales_with_the_reference_and_lets_values_near_zero_agree_by_atol():
    # The relative part scales with the second operand, the reference: 1 <= 0.00995 * 101 but 1 > 0.00995 * 100.
    assert close(100.0, 101.0, rtol=0.00995, atol=0.0) and not close(101.0, 100.0, rtol=0.00995, atol=0.0)
    assert close(1e-9, 0.0, rtol=1e-3, atol=1e-8) and not close(1e-7, 0.0, rtol=1e-3, atol=1e-8)
    assert not close(float("nan"), float("nan"), rtol=1.0, atol=1.0)


def test_same_log_and_same_results_share_the_rule_at_its_edge():
    # Exactly on the boundary passes, a hair beyond fails, in both checks.
    assert check("same_log", measurement(stdout="x 1.5\n"), ref=measurement(stdout="x 1.0\n"), rtol=0.5).passed
    assert not check("same_log", measurement(stdout="x 1.5001\n"), ref=measurement(stdout="x 1.0\n"), rtol=0.5).passed
    ref = serving_run([100, 100], sums=(1.0, 2.0))
    assert check("same_results", serving_run([100, 100], sums=(1.0, 3.0)), ref=ref, rtol=0.5, atol=0.0).passed
    assert not check("same_results", serving_run([100, 100], sums=(1.0, 3.001)), ref=ref, rtol=0.5, atol=0.0).passed


# --- the script's own log ------------------------------------------------------------------------


def test_same_log_compares_the_numbers_a_script_prints():
    ref = measurement(stdout="step 10  dead 0.512  norm 3.25\nstep 20  dead 0.498  norm 3.31\n")
    same = measurement(stdout="step 10  dead 0.5120001  norm 3.25\nstep 20  dead 0.498  norm 3.31\n[oomlab] note\n")
    assert check("same_log", same, ref=ref).passed
    quiet = check("same_log", measurement(stdout="step 10\nstep 20\n"), ref=ref)
    assert not quiet.passed and "printed 2 numbers; the reference prints 6" in quiet.detail
    other = check("same_log", measurement(stdout="step 10  dead 0.9  norm 3.25\nstep 20  dead 0.498  norm 3.31\n"), ref=ref)
    assert not other.passed and "Number 2 of the log is 0.9" in other.detail


def test_same_log_can_compare_only_the_lines_that_carry_the_evaluation():
    ref = measurement(stdout="step 2  loss 6.1  412 ms\nstep 4  loss 5.9  398 ms\nval_loss 5.8300  (4,096 tokens)\n")
    slower = measurement(stdout="step 2  loss 6.1  519 ms\nstep 4  loss 5.9  530 ms\nval_loss 5.8300  (4,096 tokens)\n")
    assert not check("same_log", slower, ref=ref).passed  # the timings differ: every line compared
    assert check("same_log", slower, ref=ref, lines="val_loss").passed
    fewer = measurement(stdout="step 2  loss 6.1  519 ms\nstep 4  loss 5.9  530 ms\nval_loss 5.8300  (1,024 tokens)\n")
    result = check("same_log", fewer, ref=ref, lines="val_loss")
    assert not result.passed and "on lines with 'val_loss'" in result.threshold


def test_losses_a_constant_multiple_of_the_references_pass_only_with_the_same_weights():
    # Backward on the unscaled loss of 8 micro-batches, gradients divided by 8 afterwards: 8x the loss, same training.
    scaled = workload(losses=[2.5 * 8, 2.0 * 8, 1.5 * 8])
    result = check("same_results", measurement(workload_=scaled), rtol=1e-4)
    assert result.passed and "8x the reference's" in result.measured
    other_weights = measurement(workload_=scaled, weights_digest=digest(1.01))
    assert not check("same_results", other_weights, rtol=1e-4).passed
    not_constant = workload(losses=[2.5 * 8, 2.0 * 4, 1.5 * 8])
    assert not check("same_results", measurement(workload_=not_constant), rtol=1e-4).passed


# --- the witness: driver, cpu_time, host_memory -----------------------------------------------------------------


def test_another_process_of_the_run_on_the_gpu_fails_the_driver_check():
    w = witness()
    w["other_gpu_processes"] = [{"pid": 4242, "command": "python wrapped.py", "used_bytes": 3 << 30}]
    result = check("driver", measurement(witness=w))
    assert not result.passed and "pid 4242" in result.detail and "python wrapped.py" in result.detail


@pytest.mark.parametrize(
    "driver, stats_, words",
    [
        (
            {"at_figures_bytes": 600 * MIB + CONTEXT + 256 * MIB, "peak_bytes": 856 * MIB + CONTEXT},
            {},
            ["256.0 MiB more than the reference", "CuPy"],
        ),
        ({"peak_bytes": 3000 * MIB + CONTEXT}, {}, ["Figures disagree with the driver", "more than the 1,024.0 MiB budget"]),
        ({"peak_bytes": 700 * MIB + CONTEXT}, {}, ["Figures disagree with the driver", "reset or replaced"]),
        ({}, {"peak_reserved": 1000 * MIB}, ["never saw the process hold more"]),
    ],
    ids=["memory-around-the-allocator", "cap-lifted-and-peaks-reset", "peak-forged-lower", "peak-claimed-higher"],
)
def test_figures_the_driver_does_not_back_fail_with_what_it_saw(driver, stats_, words):
    result = check("driver", measurement(stats_=stats(**stats_), witness=witness(**driver)))
    assert not result.passed, result
    for word in words:
        assert word in result.detail, (word, result.detail)


def test_the_driver_check_allows_the_context_to_grow_within_its_slack_and_the_sample_to_miss_a_little():
    # Kernels loaded after the reserved peak (the optimizer's, say) grow the context by the end.
    assert check("driver", measurement(witness=witness(at_figures_bytes=600 * MIB + CONTEXT + 40 * MIB))).passed
    # A reserved peak that lasted less than a sample: the driver saw a little less.
    assert check("driver", measurement(witness=witness(peak_bytes=560 * MIB + CONTEXT))).passed


def test_a_run_the_driver_could_not_witness_passes_the_learners_own_check_and_says_so():
    result = check("driver", measurement(witness=witness(available=False, reason="a container")))
    assert result.passed and result.measured == "not witnessed"


def test_cpu_time_far_beyond_the_references_fails():
    slow = witness()
    slow["script_cpu_s"] = 60.0
    result = check("cpu_time", measurement(witness=slow))
    assert not result.passed and "60.0 s" in result.detail and "on the CPU" in result.detail
    a_bit_more = witness()
    a_bit_more["script_cpu_s"] = 24.0  # within the reference's 5 s plus the slack of 20 s
    assert check("cpu_time", measurement(witness=a_bit_more)).passed


def test_host_memory_that_grows_far_beyond_the_references_fails_unless_the_exercise_allows_it():
    offloaded = witness()
    offloaded["maxrss_bytes"] = 1800 * MIB + 3000 * MIB
    result = check("host_memory", measurement(witness=offloaded))
    assert not result.passed and "grew by 3,000.0 MiB" in result.detail
    assert check("host_memory", measurement(witness=offloaded), slack_mib=4096).passed
    within = witness()
    within["maxrss_bytes"] = 1800 * MIB + 1100 * MIB  # the reference's 200 MiB and the default slack of 1 GiB
    assert check("host_memory", measurement(witness=within)).passed


def largest_passing(check, params: dict, base: int) -> int:
    """The largest figure ``check.evaluate`` passes against a reference of ``base``, found by bisection."""
    as_run = lambda v: Measurement(script="", status="ok", stats={check.stat: v})  # noqa: E731
    passes = lambda v: check.evaluate(as_run(v), as_run(base), params).passed  # noqa: E731
    lo, hi = base, 2 * base + 2
    while passes(hi):
        lo, hi = hi, 2 * hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if passes(mid) else (lo, mid)
    return lo


@pytest.mark.parametrize("params", [{}, {"tolerance": 0.02}, {"tolerance": 0.05, "slack_mib": 64}, {"slack_mib": 0.5}], ids=str)
@pytest.mark.parametrize("base", [1, 3 << 20, 1_308_622_848])
def test_the_words_a_byte_check_gives_its_threshold_are_the_limit_it_grades_by(params, base):
    """The exercise pages print ``passes_when``; what they say must be what ``evaluate`` does, byte for byte."""
    check = CHECKS["peak_reserved"]
    limit = largest_passing(check, params, base)
    assert int(check.limit(base, params)) == limit
    words = check.passes_when(params, {"peak_reserved": base}, "an H200")
    assert words.endswith(f"at most {format_bytes(limit)}")
    tolerance, slack = check.allowance(params)
    assert f"plus {tolerance:.0%}" in words and (f"plus {format_bytes(slack)}" in words) == bool(slack)


def test_the_retry_check_says_the_most_retries_it_lets_through():
    check = CHECKS["retries"]
    for most in (0, 2):
        passes = [
            check.evaluate(Measurement(script="", status="ok", stats={"retries": n}), None, {"max": most}).passed
            for n in range(5)
        ]
        assert passes.index(False) == most + 1, f"max = {most} lets {most} retries through, not one more"
        assert check.passes_when({"max": most}).startswith("no " if most == 0 else f"at most {most} ")
