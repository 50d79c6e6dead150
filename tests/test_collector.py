"""A command runs Python's collector at ``collector.THRESHOLDS`` and leaves the calling
process's collector as it found it (flaxformer_mini/collector.py)."""

import gc

import pytest
from helpers import cli

from flaxformer_mini.collector import THRESHOLDS, collecting_rarely

CPYTHON_DEFAULT = (700, 10, 10)


@pytest.fixture
def thresholds_of_a_plain_process():
    """The collector as a process that set nothing runs it (the pytest workers raise theirs)."""
    kept = gc.get_threshold()
    gc.set_threshold(*CPYTHON_DEFAULT)
    yield
    gc.set_threshold(*kept)


def test_a_command_runs_at_the_rare_thresholds_and_gives_the_callers_back(thresholds_of_a_plain_process, monkeypatch):
    import flaxformer_mini.cli.generate as generate

    seen = []
    monkeypatch.setattr(generate, "run", lambda args: seen.append(gc.get_threshold()))
    result = cli("generate", "--checkpoint", "unread", "1 2")
    assert result.returncode == 0, result.stderr
    assert seen == [THRESHOLDS]
    assert gc.get_threshold() == CPYTHON_DEFAULT


def test_a_failing_command_gives_the_callers_thresholds_back(thresholds_of_a_plain_process, monkeypatch):
    import flaxformer_mini.cli.generate as generate

    def fail(args):
        raise FileNotFoundError("no run here")

    monkeypatch.setattr(generate, "run", fail)
    result = cli("generate", "--checkpoint", "unread", "1 2")
    assert result.returncode != 0 and "no run here" in result.stderr
    assert gc.get_threshold() == CPYTHON_DEFAULT


def test_higher_thresholds_of_the_caller_are_kept_inside(thresholds_of_a_plain_process):
    gc.set_threshold(500_000, 5, 1_000)
    with collecting_rarely():
        assert gc.get_threshold() == (500_000, THRESHOLDS[1], 1_000)
    assert gc.get_threshold() == (500_000, 5, 1_000)
