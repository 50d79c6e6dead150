"""``flaxformer-mini train``: the options become a ``TrainOptions`` and a ``DataConfig``, the
run is launched on every process (``runs/launch.py``) and trained (``runs/fit.py``); the last
evaluation is printed as one JSON line.

``main`` imports this module with the stop handler already in (``StopRequests``): a SIGTERM
while JAX loads, its runtime starts or a step compiles stops every process at the same step.
"""

import json
import os
import sys

from flaxformer_mini.cli.parser import (DEFAULTS, LENGTH_MULTIPLE, LENGTH_PENALTY, SYNTHETIC_EVAL_SEQUENCES,
                                        SYNTHETIC_MAX_LEN, SYNTHETIC_MIN_LEN, SYNTHETIC_VOCAB_SIZE, TEXT_MAX_LEN, VALID_SIZE,
                                        split_sizes)
from flaxformer_mini.files import same_file
from flaxformer_mini.runs import init_from, tokenizer_from
from flaxformer_mini.runs.config import DataConfig, TrainOptions
from flaxformer_mini.runs.fit import fit
from flaxformer_mini.runs.launch import launch
from flaxformer_mini.scale import distributed
from flaxformer_mini.scale.partitioning import format_mesh, parse_mesh
from flaxformer_mini.scale.sharding import training_mesh


def run(args, stop):
    """Train the run the options describe; ``stop``: the ``StopRequests`` main installed."""
    # gloo prints its connection lines on stdout (C++): they go to stderr, the result to stdout.
    with distributed.stdout_for_results() as results:
        # Scale-out: the multi-process runtime starts before anything touches a device.
        distributed.start_runtime(args.coordinator, args.num_processes, args.process_id, args.distributed_timeout,
                                  program=f"flaxformer-mini {args.command}")
        echo = lambda m: print(m, file=sys.stderr) if distributed.is_main() else None  # noqa: E731
        batch_size = args.batch_size or DEFAULTS["batch_size"]
        if args.max_tokens is not None and args.batch_size is not None:
            echo(f"note: --max-tokens {args.max_tokens} wins: training batches hold up to that many tokens; "
                 f"--batch-size {args.batch_size} sets only the evaluation batch size")
        options = TrainOptions(preset=args.preset, embed_size=args.embed_size, heads=args.heads,
                               num_layers=args.layers, ffn_dim=args.ffn_dim, batch_size=batch_size, lr=args.lr,
                               schedule=args.schedule, warmup=args.warmup, weight_decay=args.weight_decay,
                               steps=args.steps,
                               clip_norm=args.clip_norm, label_smoothing=args.label_smoothing, dropout=args.dropout,
                               dtype=args.dtype, seed=args.seed, max_tokens=args.max_tokens,
                               accumulate=args.accumulate, scan_layers=args.scan_layers, remat=args.remat,
                               init_from=args.init_from, tie_embeddings=args.tie_embeddings,
                               eval_beam_size=args.eval_beam_size,
                               eval_length_penalty=(LENGTH_PENALTY if args.eval_length_penalty is None
                                                    else args.eval_length_penalty),
                               best_metric=args.best_metric, ema=args.ema)
        run, mesh = launch(args.out, options, lambda: _prepare(args, batch_size, echo), echo)
        try:
            result = fit(run, args.steps, log_every=args.log_every, eval_every=args.eval_every,
                         save_every=args.save_every, max_to_keep=args.keep, progress=not args.no_progress,
                         mesh=mesh, sharding=args.sharding, echo=echo, stop=stop, plot=not args.no_plot,
                         # A run written before --best-metric existed resumes without it (Run.create's note).
                         patience=args.patience if run.config.evaluation.best_metric is not None else None)
        except (RuntimeError, ValueError) as e:
            lost = distributed.as_lost_process(e)
            if lost is None:
                raise
            raise lost from None
        if result and distributed.is_main():
            print(json.dumps(result), file=results)  # its step: the run's own where it had gone past --steps


def _prepare(args, batch_size, echo):
    """(data config, mesh, identity) of this process, before anything is written (``launch``)."""
    data = _data_config(args, echo)  # --tokenizer-from's run may be missing on this host alone
    # With --max-tokens, --batch-size sets only the evaluation's batches, which every process
    # runs alone: nothing for the mesh to divide.
    mesh = training_mesh(args.devices, args.sharding, None if args.max_tokens is not None else batch_size,
                         model_sizes=split_sizes(args), mesh_shape=None if args.mesh is None else parse_mesh(args.mesh))
    return data, mesh, _identity(args)


def _data_config(args, echo):
    """The run's DataConfig from the options: a synthetic task's, or a text run's."""
    if args.task:
        return DataConfig(kind="synthetic", task=args.task, vocab_size=args.vocab_size or SYNTHETIC_VOCAB_SIZE,
                          min_len=args.min_len or SYNTHETIC_MIN_LEN, max_len=args.max_len or SYNTHETIC_MAX_LEN,
                          eval_sequences=args.eval_sequences or SYNTHETIC_EVAL_SEQUENCES,
                          eval_decode_lines=args.eval_decode_lines)
    if args.valid is not None and same_file(args.valid, args.data):  # allowed: a check that it can fit at all
        echo(f"warning: --valid {args.valid} is the --data file: the held-out scores are on pairs it trains on")
    # --max-len is the model's max_len for text: the longest side, with its EOS. Absolute paths
    # in the run's config: evaluate and resume may run from another directory.
    return DataConfig(kind="tsv", max_len=(args.max_len or TEXT_MAX_LEN) - 1, train_path=os.path.abspath(args.data),
                      valid_path=args.valid and os.path.abspath(args.valid), eval_pairs=args.valid_size or VALID_SIZE,
                      holdout=0 if args.valid else args.valid_size or VALID_SIZE,
                      eval_decode_lines=args.eval_decode_lines, columns=args.columns,
                      length_multiple=args.length_multiple or LENGTH_MULTIPLE, **_tokenizer_settings(args, echo))


def _tokenizer_settings(args, echo):
    """A text run's DataConfig tokenizer fields: from the options, or --tokenizer-from's run."""
    if args.tokenizer_from is None:
        return {"tokenizer": args.tokenizer or "word", "tokenizer_vocab_size": args.vocab_size,
                "shared_vocab": args.shared_vocab}
    return tokenizer_from.settings(args.tokenizer_from, args.out, echo)


def _identity(args):
    """What every process of a run must agree on: its options (not the process id) and
    the content of its data files."""
    # Options that act on one process only may differ (--debug on the host being watched).
    own = {"process_id", "coordinator", "distributed_timeout", "no_progress", "no_plot", "run", "debug",
           "keep_freed_memory"}
    identity = {f"--{k.replace('_', '-')}": v for k, v in vars(args).items() if k not in own}
    if args.mesh is not None:  # one mesh, however spelled: 'model=2,data=2' is 'data=2,model=2'
        identity["--mesh"] = format_mesh(parse_mesh(args.mesh))
    for option in ("data", "valid"):
        if getattr(args, option, None):
            identity[f"--{option} (sha256 of the file)"] = distributed.file_digest(getattr(args, option))
    if getattr(args, "init_from", None) and os.path.exists(args.init_from):  # a missing one: named by Run.start
        identity["--init-from (sha256)"] = init_from.digest(os.path.abspath(args.init_from))
    return identity
