"""``StepRate``: the train steps' rate and the time a run has left, XLA's compilations left out,
and the progress bar that shows them."""

import time

import jax

# What jax.monitoring reports once XLA has compiled a program (jit's first call for a shape).
COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


class StepRate:
    """Steps a second over the steps during which nothing compiled.

    A step that compiles takes the compilation's time too, which says nothing of the steps that
    follow it. tqdm's own rate is an average since the bar began, so counting the first step's
    compilation makes the ETA far too long for many steps. Left out: each step during which XLA
    compiled anything (the first step, each shape of length-bucketed batches met for the first
    time, the first evaluation's programs), and each step that read a program from JAX's
    persistent compilation cache, which JAX reports as a compilation too. Steps that compiled
    nothing count whole, evaluations included, since those recur until the run ends.

    ``step_done()`` after each step: the step's seconds, or None when it compiled; ``compiled`` is
    the ``jax.monitoring`` listener that marks the current step (``watch_compilations`` registers
    it); ``rate()`` is steps a second, or 0.0 (which tqdm shows as '?') until a step that compiled
    nothing has been timed."""

    def __init__(self, clock=time.perf_counter):
        self.clock = clock
        self.last, self.steps, self.seconds, self.compiling = clock(), 0, 0.0, False
        self.watching = False

    def compiled(self, event, duration=None, **_):
        if event == COMPILE_EVENT:
            self.compiling = True

    def step_done(self):
        t = self.clock()
        seconds = None if self.compiling else t - self.last
        if seconds is not None:
            self.steps, self.seconds = self.steps + 1, self.seconds + seconds
        self.last, self.compiling = t, False
        return seconds

    def rate(self):
        return self.steps / self.seconds if self.steps and self.seconds > 0 else 0.0

    def watch_compilations(self):
        if not self.watching:
            jax.monitoring.register_event_duration_secs_listener(self.compiled)
            self.watching = True

    def stop_watching(self):
        if self.watching:
            jax.monitoring.unregister_event_duration_listener(self.compiled)
            self.watching = False


def progress_bar(rate: StepRate, **tqdm_kwargs):
    """A ``tqdm.auto`` bar (a widget in a notebook) whose rate and ETA are ``rate``'s."""
    from tqdm.auto import tqdm  # imported here: a notebook check, paid only by a run that shows a bar

    class StepRateBar(tqdm):
        @property
        def format_dict(self):  # tqdm's documented override: format_meter takes the rate given
            return {**super().format_dict, "rate": rate.rate()}

    return StepRateBar(**tqdm_kwargs)
