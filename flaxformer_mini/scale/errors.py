"""The errors of a multi-process run, by what the command line does with them: a run that
cannot start together (exit code 2, nothing written) and a peer lost mid-run (exit code 1)."""


class DistributedError(ValueError):
    """The processes of a multi-process run cannot start together: an unreachable coordinator,
    a process id out of range, processes started with different options (CLI exit code 2)."""


class ProcessLostError(RuntimeError):
    """Another process of the run stopped mid-run (CLI exit code 1); the last checkpoint is kept."""
