"""A run's memory budget, checked before anything is written: the train step's least memory
(``model/memory.py``) for the largest batch the run's data and options make, against what the
machine has free. What cannot fit is refused naming the options that size it, with both
figures; the run directory is left untouched."""

from flaxformer_mini.data import TextPairs
from flaxformer_mini.decode.options import OptionError, check_decoding_memory
from flaxformer_mini.model import memory
from flaxformer_mini.runs.config import RunConfig, RunConfigError


def check_training(config: RunConfig, train):
    """Refuse (``RunConfigError``) a run whose largest training batch and model cannot fit.
    ``train``: the run's training examples (``TextPairs`` or a synthetic task)."""
    rows, source_len, target_len = largest_batch(config, train)
    parts = memory.training_bytes(config.model, rows, source_len, target_len, remat=config.remat,
                                  ema=config.train.ema_decay is not None)
    needed = sum(parts.values())
    short = memory.shortfall(needed)
    if short is None:
        return
    if memory.shortfall(parts["model"]) is not None:  # the model alone does not fit: no batch size helps
        m = config.model
        sizes = (f"the model's {memory.param_count(m):,} parameters with their gradients and Adam's two moments "
                 f"(vocabularies {m.source_vocab_size:,} and {m.target_vocab_size:,}, width {m.embed_size:,}, "
                 f"{m.num_layers} + {m.num_layers} layers)")
        remedy = "a smaller --vocab-size, --embed-size, --layers or --ffn-dim"
    else:
        option = (f"--max-tokens {config.max_tokens}" if config.max_tokens is not None
                  else f"--batch-size {config.batch_size}")
        sizes = (f"a training batch of {rows:,} rows of up to {max(source_len, target_len):,} tokens ({option}) "
                 f"over a target vocabulary of {config.model.target_vocab_size:,}")
        remedy = "a smaller " + option.split()[0] + (" or --remat" if not config.remat else "")
    raise RunConfigError(f"one train step takes at least {memory.gib(needed)} with {sizes}, more than the {short} "
                         f"free: give {remedy}. Nothing was written")


def check_evaluation(config: RunConfig):
    """Refuse (``RunConfigError``) an --eval-beam-size whose decoding cannot fit: the evaluation
    during training decodes --batch-size rows, each up to the model's max_len."""
    beam, m = config.evaluation.beam_size, config.model
    if beam > 1:
        try:
            check_decoding_memory(m, config.batch_size, beam, m.max_len, m.max_len)
        except OptionError as e:  # in the words of evaluate's options: train's are --eval-beam-size and --batch-size
            raise RunConfigError(f"the evaluation during training: {e.cli.replace('--beam-size', '--eval-beam-size')}. "
                                 f"Nothing was written") from None


def largest_batch(config: RunConfig, train):
    """(rows, source length, target length) of the largest batch the run trains on: each
    side's tokens with its EOS (or BOS), the longest the data holds."""
    if not isinstance(train, TextPairs):  # a synthetic task: every batch is batch_size rows
        length = train.max_len + 1
        return config.batch_size, length, length
    source_len, target_len = int(train.source_lengths.max()), int(train.target_lengths.max())
    if config.max_tokens is None:
        return config.batch_size, source_len, target_len
    # A --max-tokens batch of the longest pairs is padded to the budget's rows at that length,
    # and never to more rows than the corpus holds (TextPairs.batch_of_rows).
    return min(config.max_tokens // max(source_len, target_len), len(train)), source_len, target_len
