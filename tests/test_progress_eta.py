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
