"""A run started on every process of a (possibly multi-process) training job: each process
prepares its options, every process agrees on them, then ``Run.start``; an error on any one
process, at any of these points, stops every process at once."""

from flaxformer_mini.runs.run import Run
from flaxformer_mini.scale import distributed


def launch(out, options, prepare, echo):
    """``(run, mesh)`` of this process, once every process of the job has started the run in
    ``out`` with ``options``. ``prepare()``: this process's ``(data config, mesh, identity)``,
    built before anything is written (``identity``: what every process must agree on)."""
    # An error here on one process (its --data missing on that host, another device count)
    # stops every process at once: the others would otherwise wait for it in agree_on until
    # the timeout, then abort.
    error = mesh = identity = data = None
    try:
        data, mesh, identity = prepare()
    except (ValueError, OSError) as e:
        error = e
    distributed.all_started(error)
    distributed.agree_on(identity)  # every process started with the same options, or none runs
    error = run = None
    try:
        run = Run.start(out, options, data, echo=echo)
    except (ValueError, FileNotFoundError) as e:
        error = e
    distributed.all_started(error)  # process 0 refused the directory: every process stops
    try:
        error = None
        try:
            distributed.agree_on_shared_directory(run.path)  # before the first save could hang on it
            # A resumed older run's own settings and process 0's tokenizers, on every process. The
            # others read process 0's files here, after the last collective: an error reading them
            # is gathered, or process 0 would wait for that process in fit until the timeout.
            run = run.follow_main()
        except (ValueError, FileNotFoundError) as e:  # RunConfigError, TokenizerFileError, DataError: ValueErrors
            error = e
        distributed.all_started(error)
    except BaseException:
        run.close()
        raise
    return run, mesh
