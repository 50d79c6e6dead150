"""``evaluate`` of a finished run: its latest checkpoint scored on its held-out data or on
another file of pairs, the hypotheses optionally written out line for line."""

from flaxformer_mini.data import DataError, EmptySideError, SyntheticTask, TextPairs, iter_lines, iter_tsv
from flaxformer_mini.decode.evaluation import evaluate_with_hypotheses
from flaxformer_mini.decode.options import DEFAULT_LENGTH_PENALTY, check_options
from flaxformer_mini.files import write_atomic
from flaxformer_mini.runs.run import Run, warn
from flaxformer_mini.runs.run_data import unknown_tokens_note


def evaluate_run(out, batch_size=None, with_exact_match=True, beam_size=1, output=None, echo=warn, data=None,
                 force=False, columns=None, alpha=DEFAULT_LENGTH_PENALTY):
    """Evaluate the latest checkpoint of the run in ``out`` on its held-out data, or on the
    pairs of the ``source<TAB>target`` file ``data`` (``columns``: which, as ``--columns``; default the
    run's), every example decoded and scored;
    ``output``: a file to write the hypotheses into, atomically, and never over an existing
    file unless ``force`` (the caller refuses one before the work: this write refuses a file
    that appeared meanwhile).

    Pairs longer than the run's --max-len cannot be decoded: ``echo`` (stderr by default)
    says how many were left out of the metrics. ``output`` holds one line per line of
    ``data``, its pair's hypothesis, empty for a blank line and for a pair left out, so it
    lines up with ``data`` (``paste data output``), as ``generate``'s output lines up with
    its input; without ``data``, one line per evaluated held-out pair, in order. ``beam_size`` > 1:
    the best beam's hypotheses, ranked with length penalty ``alpha`` (``decode/search.py``)."""
    run = Run.open(out)
    check_options(run.config.model, beam_size=beam_size, alpha=alpha)
    if data is not None:  # before the checkpoint: fail fast
        held_out, file_lines = read_pairs(run, data, columns)
        if run.config.data.kind == "tsv" and (note := unknown_tokens_note(held_out, data, "the run's tokenizers")):
            echo(note)
    else:
        held_out = run.data.eval
    state = run.latest_state()
    if isinstance(held_out, TextPairs) and held_out.dropped:
        where = f"pairs in {data}" if data is not None else "held-out pairs"
        if output is None:
            then = ""
        elif data is not None:
            then = f"; {output} holds an empty line for each, so its lines match {data}'s"
        else:
            then = f"; {output} holds a line for each of the {len(held_out)} others, in order"
        echo(f"note: {held_out.dropped} of {held_out.dropped + len(held_out)} {where} are longer than the run's "
             f"--max-len {held_out.max_len} allows and are not evaluated" + then)
    batches = run.eval_batches(batch_size) if data is None else list(
        held_out.iter_eval_batches(batch_size or run.config.batch_size))
    result, hypotheses = evaluate_with_hypotheses(run.trainer, state.for_inference(), batches, with_exact_match, beam_size,
                                                  codec=run.codec if with_exact_match else None, alpha=alpha)
    if output is not None:
        if data is not None:
            lines = [""] * file_lines  # blank lines and pairs too long stay empty
            for line, hypothesis in zip(held_out.line_numbers, hypotheses):
                lines[line - 1] = hypothesis
            hypotheses = lines
        write_atomic(output, "".join(h + "\n" for h in hypotheses), replace=force)
    return {"step": int(state.step), **result}


def read_pairs(run, path, columns=None):
    """``TextPairs`` of the ``source<TAB>target`` file ``path``, read as training data is
    (``iter_tsv``'s rules and errors, the run's ``--columns`` unless ``columns`` is given)
    and encoded with the run's saved tokenizers (a text run) or as its integer values (a
    synthetic run); a value a synthetic run cannot read is an error naming ``path`` and the
    line. Its ``line_numbers`` are the file's line of each kept pair; returned with the file's
    number of lines (blank lines are not pairs, and an output that lines up with the file
    keeps them)."""
    d = run.config.data
    columns = d.columns if columns is None else columns
    read = [0]  # the file's lines, counted as they are read (blank lines at the end too), once: a pipe

    def counted(f):
        for lineno, line in iter_lines(f, path):
            read[0] = lineno
            yield lineno, line

    with open(path, "rb") as f:
        numbered = list(iter_tsv(path, columns, lines=counted(f)))
    pairs = [(source, target) for _, source, target in numbered]
    if d.kind == "synthetic":
        task = SyntheticTask(d.task, d.vocab_size, d.min_len, d.max_len)
        vocabs = (task, task)  # its values, read as TextPairs reads a vocabulary (encode_batch)
        for lineno, source, target in numbered:
            for side, text in (("source", source), ("target", target)):
                try:
                    task.encode_text(text)
                except ValueError as e:
                    raise DataError(f"{path}:{lineno}: {side}: {e}") from None
    else:
        vocabs = run.dir.load_vocabularies(d)
    try:
        held_out = TextPairs(pairs, *vocabs, run.config.model.max_len, run.config.data.length_multiple,
                             line_numbers=[n for n, _, _ in numbered])
    except EmptySideError as e:
        raise DataError(f"{path}:{e.where}: {e}") from None
    except DataError as e:
        raise DataError(f"{path}: {e} (the run's --max-len: a side's tokens plus its EOS)") from None
    return held_out, read[0]
