"""Start one training run on every process of a job, or on none: the options and data files
agreed on, the run directory made or resumed by process 0, and process 0's config and
tokenizers adopted by the others.

An error on one process (its --data missing on that host, another device count, a directory
it cannot use) stops every process at once (``distributed.all_started``): the others would
otherwise wait for it in the next collective until the timeout, then abort. In one process
every step is a plain call.
"""

from flaxformer_mini.runs.run import Run
from flaxformer_mini.scale import distributed


def launch(out, options, prepare, echo):
    """``(run, mesh)``: the run in ``out`` started (new or resumed) on every process.

    ``prepare()`` -> ``(data_config, mesh, identity)`` is computed on each process before
    anything is written: the data settings, the device mesh, and what every process must
    agree on (the options and the data files' digests). Call after
    ``distributed.start_runtime``; close the run (``fit`` does) when done."""
    error = prepared = None
    try:
        prepared = prepare()
    except (ValueError, OSError) as e:
        error = e
    distributed.all_started(error)
    data, mesh, identity = prepared
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
