"""The training bar's rate and ETA leave out the steps during which XLA compiled."""

import io
import itertools
import re

import jax
import jax.numpy as jnp
import pytest

from flaxformer_mini.runs.step_rate import COMPILE_EVENT, StepRate, progress_bar


class FakeClock:
    def __init__(self, times):
        self.times = iter(times)

    def __call__(self):
        return next(self.times)


def recorded_rate():
    """A bar started at 0 s whose first step compiled for 30 s, then ten 1 s steps."""
    rate = StepRate(clock=FakeClock([0.0, *range(30, 41)]))
    rate.compiled(COMPILE_EVENT, 30.0, fun_name="jit(train_step)")
    rate.step_done()  # at 30 s, the compiled step
    for _ in range(10):
        rate.step_done()  # 31 s ... 40 s
    return rate


def test_the_rate_counts_only_the_steps_that_compiled_nothing():
    rate = recorded_rate()
    assert (rate.steps, rate.seconds, rate.rate()) == (10, 10.0, 1.0)  # counted from the first step: 11 / 40 s


def test_the_bar_shows_the_time_left_at_the_warm_steps_rate():
    bar = progress_bar(recorded_rate(), total=100, desc="train", unit="step", file=io.StringIO())
    bar.n = 11
    line = bar.format_meter(**{**bar.format_dict, "elapsed": 40.0, "ncols": 100})
    # 89 steps at 1 step a second; tqdm's own average (11 steps in 40 s) gives 05:23.
    assert re.search(r"11/100 \[00:40<01:29, +1\.00step/s\]", line), line
    bar.close()


def test_no_rate_is_claimed_before_a_step_that_compiled_nothing():
    rate = StepRate(clock=FakeClock([0.0, 30.0]))
    rate.compiled(COMPILE_EVENT, 30.0)
    rate.step_done()
    bar = progress_bar(rate, total=100, unit="step", file=io.StringIO())
    bar.n = 1
    assert "<?, ?step/s" in bar.format_meter(**{**bar.format_dict, "elapsed": 30.0, "ncols": 100})
    bar.close()


def test_a_compilation_that_jax_reports_marks_the_step(monkeypatch):
    rate = StepRate(clock=FakeClock(itertools.count()))
    rate.watch_compilations()
    try:
        jax.jit(lambda x: x * 3 + 1)(jnp.arange(3))  # a program no other test compiles
        assert rate.compiling
        rate.step_done()
        rate.step_done()
    finally:
        rate.stop_watching()
    assert (rate.steps, rate.watching) == (1, False)


def test_a_program_read_from_the_persistent_compilation_cache_marks_the_step_too():
    # conftest.py gives every test process JAX's persistent cache, which caches any compile.
    assert jax.config.jax_compilation_cache_dir and jax.config.jax_persistent_cache_min_compile_time_secs == 0
    hits = []

    def count_hits(event, **_):
        hits.append(event == "/jax/compilation_cache/cache_hits")

    def program():
        def times_5_minus_2(x):
            return x * 5 - 2  # a program no other test compiles
        return times_5_minus_2

    jax.jit(program())(jnp.arange(4))  # compiled, and written to the cache
    rate = StepRate(clock=FakeClock(itertools.count()))
    rate.watch_compilations()
    jax.monitoring.register_event_listener(count_hits)
    try:
        jax.jit(program())(jnp.arange(4))  # a new function: JAX's in-memory caches miss, the file is read
    finally:
        jax.monitoring.unregister_event_listener(count_hits)
        rate.stop_watching()
    # JAX reports the cache read as the backend compile's duration, and the step is left out.
    assert any(hits) and rate.compiling


@pytest.mark.parametrize("event", ["/jax/compilation_cache/cache_retrieval_time_sec", "/jax/core/compile/jaxpr_trace_duration"])
def test_other_events_leave_the_step_counted(event):
    rate = StepRate(clock=FakeClock([0.0, 2.0]))
    rate.compiled(event, 1.0)
    rate.step_done()
    assert rate.rate() == 0.5


def test_the_training_bar_counts_the_steps_after_a_compilation_and_stops_listening_when_closed():
    import numpy as np

    from flaxformer_mini.runs.fit import _StepLog

    log = _StepLog(None, steps=10, start=0, log_every=100, progress=True, write=False)
    try:
        assert log.rate.watching and log.bar.format_dict["rate"] == 0.0
        jax.jit(lambda x: x - 7)(jnp.arange(2))  # as the first step's compilation
        for step in (1, 2, 3):
            log.push(step, {"loss": np.float32(1.0)}, tokens=3)
        assert log.rate.steps == 2 and log.bar.format_dict["rate"] == log.rate.rate() > 0
    finally:
        log.close()
    assert not log.rate.watching


def test_the_logged_tokens_per_s_counts_only_the_steps_that_compiled_nothing(tmp_path):
    import types

    import numpy as np

    from flaxformer_mini.runs import tensorboard
    from flaxformer_mini.runs.directory import RunDir
    from flaxformer_mini.runs.fit import _StepLog

    run_dir = RunDir(tmp_path)
    # Logged every 2 steps: steps 1 and 2 compile (30 s, then a new shape's 15 s); steps 3 and 4
    # take 2 s and 1 s; step 5 compiles (22 s), step 6 takes 2 s.
    clock = FakeClock([0.0, 30.0, 45.0, 47.0, 48.0, 70.0, 72.0])
    log = _StepLog(types.SimpleNamespace(dir=run_dir), steps=6, start=0, log_every=2, progress=False, clock=clock)
    try:
        assert log.rate.watching  # no bar, yet the log needs to know which steps compiled
        for step, tokens, compiled in [(1, 100, True), (2, 100, True), (3, 90, False), (4, 60, False),
                                       (5, 100, True), (6, 30, False)]:
            if compiled:
                log.rate.compiled(COMPILE_EVENT, 20.0)
            log.push(step, {"loss": np.float32(step)}, tokens)
        log.flush()
    finally:
        log.close()
    # The wall clock's windows would read 200/45, 150/3 and 130/24 tokens/s.
    assert run_dir.read_metrics() == [{"step": 2, "loss": 2.0},  # every step compiled: no rate to claim
                                      {"step": 4, "loss": 4.0, "tokens_per_s": 150 / 3},
                                      {"step": 6, "loss": 6.0, "tokens_per_s": 30 / 2}]
    scalars = tensorboard.read_scalars(run_dir.tensorboard)
    assert scalars["train/tokens_per_s"] == [(4, 50.0), (6, 15.0)]
    assert [step for step, _ in scalars["train/loss"]] == [2, 4, 6]


def test_without_a_bar_a_real_compilation_leaves_its_step_out_of_the_logged_tokens_per_s(tmp_path):
    import types

    import numpy as np

    from flaxformer_mini.runs.directory import RunDir
    from flaxformer_mini.runs.fit import _StepLog

    run_dir = RunDir(tmp_path)
    log = _StepLog(types.SimpleNamespace(dir=run_dir), steps=2, start=0, log_every=1, progress=False)
    try:
        jax.jit(lambda x: x * 5 - 2)(jnp.arange(4))  # as the first step's compilation
        log.push(1, {"loss": np.float32(1.0)}, tokens=40)
        log.push(2, {"loss": np.float32(2.0)}, tokens=30)
        log.flush()
    finally:
        log.close()
    first, second = run_dir.read_metrics()
    assert first == {"step": 1, "loss": 1.0}
    # The rate has counted step 2 alone: its seconds are the step's.
    assert log.rate.steps == 1 and second == {"step": 2, "loss": 2.0, "tokens_per_s": 30 / log.rate.seconds}
