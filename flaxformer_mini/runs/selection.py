"""Which checkpoint a run keeps as its best, and when it stops early (``train --best-metric``,
``--patience``).

A ``Selection`` follows a run's evaluations: each is better than the best so far (strictly:
lower loss, WER or CER; higher BLEU, chrF or exact match, as fairseq's
``--maximize-best-checkpoint-metric`` compares) or not, and it counts the evaluations since the
best one. It is a function of the evaluations alone, which the run's ``metrics.jsonl`` holds (an
``eval_<metric>`` value per evaluation, the floats written exactly by ``json``): a resumed run
replays the ones up to its restored step (the log is cut there on resume), so it continues the
comparison and the count where the checkpoint left them, and ends bit-identical to a run never
stopped, including which checkpoint is best and when it stops early.

Importing it starts no JAX: the parser takes the metric names from here.
"""

import dataclasses
import math

# Each metric --best-metric takes, and whether a lower value is better. Every evaluation during
# training computes all six (decode/evaluation.py: the text metrics through the run's codec,
# a synthetic run's integers read as words).
LOWER_IS_BETTER = {"loss": True, "wer": True, "cer": True, "bleu": False, "chrf": False, "exact_match": False}
BEST_METRICS = tuple(LOWER_IS_BETTER)


@dataclasses.dataclass
class Selection:
    """The best evaluation so far by ``metric`` and the evaluations since it."""

    metric: str
    best_step: int | None = None
    best_value: float | None = None
    since_best: int = 0  # evaluations after the best one that were no better

    def __post_init__(self):
        if self.metric not in LOWER_IS_BETTER:
            raise ValueError(f"unknown best metric {self.metric!r}; choose one of {', '.join(BEST_METRICS)}")

    def better(self, value):
        """Whether ``value`` beats the best so far (a NaN never does; the first finite one does)."""
        if not math.isfinite(value):
            return False
        if self.best_value is None:
            return True
        return value < self.best_value if LOWER_IS_BETTER[self.metric] else value > self.best_value

    def value_of(self, result):
        """The metric's value in an evaluation's ``result``; an error naming it when absent."""
        if self.metric not in result:
            raise ValueError(f"--best-metric {self.metric}: the evaluation computed no {self.metric} (it computed "
                             f"{', '.join(sorted(result))})")
        return float(result[self.metric])

    def observe(self, step, value, improved=None):
        """Count the evaluation at ``step``; returns whether it is the new best. ``improved``:
        the decision already agreed by every process (``better`` decides otherwise)."""
        improved = self.better(value) if improved is None else improved
        if improved:
            self.best_step, self.best_value, self.since_best = step, value, 0
        else:
            self.since_best += 1
        return improved

    def exhausted(self, patience):
        """Whether ``patience`` evaluations in a row were no better than the best."""
        return patience is not None and self.best_step is not None and self.since_best >= patience

    @classmethod
    def replay(cls, metric, records, upto):
        """The selection after the evaluations that ``records`` (metrics.jsonl's lines) log at
        steps up to ``upto``, in order."""
        selection = cls(metric)
        key = f"eval_{metric}"
        for record in records:
            step = record.get("step")
            if key in record and isinstance(step, int) and step <= upto:
                selection.observe(step, float(record[key]))
        return selection

    def to_json(self):
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d):
        return cls(**d)

    def summary(self):
        """What train's result line adds: the best step and its value."""
        return {"best_step": self.best_step, f"best_{self.metric}": self.best_value}
