"""The loss and held-out accuracy curves of a run, drawn from its metrics log."""

import io

from flaxformer_mini.files import write_atomic
from flaxformer_mini.runs.directory import RunDir


def plot_metrics(run_dir: RunDir):
    """Draw the training and evaluation curves of ``run_dir`` into its ``loss.png``."""
    # A Figure of its own, not pyplot's: no GUI backend to choose, no global figure registry to
    # close, and none of pyplot's import (matplotlib's advice for writing files from a program).
    # Imported here: matplotlib takes most of a second to load, and only drawing needs it.
    from matplotlib.figure import Figure

    records = run_dir.read_metrics()
    train = [(r["step"], r["loss"]) for r in records if "loss" in r]
    evals = [r for r in records if "eval_loss" in r]
    if not train and not evals:
        return None
    text = [r for r in evals if "eval_bleu" in r]  # runs scored as text (BLEU, chrF, WER, CER)
    fig = Figure(figsize=(15 if text else 10, 4))
    axes = fig.subplots(1, 3 if text else 2)
    ax_loss, ax_acc = axes[:2]
    if text:
        steps = [r["step"] for r in text]
        ax_text = axes[2]
        for key, label in (("eval_bleu", "BLEU"), ("eval_chrf", "chrF")):
            ax_text.plot(steps, [r[key] for r in text], "o-", label=label)
        ax_text.set(xlabel="step", ylabel="score (0-100)", ylim=(0, 101), title="held-out text metrics")
        ax_rate = ax_text.twinx()  # rates (0 is perfect) on their own axis
        for key, label in (("eval_wer", "WER"), ("eval_cer", "CER")):
            ax_rate.plot(steps, [r[key] for r in text], "s--", label=label)
        ax_rate.set(ylabel="error rate")
        ax_rate.legend(loc="center right")
    if train:
        ax_loss.plot(*zip(*train), label="train loss", lw=1)
    if evals:
        ax_loss.plot([r["step"] for r in evals], [r["eval_loss"] for r in evals], "o-", label="eval loss")
        ax_acc.plot([r["step"] for r in evals], [r["eval_token_accuracy"] for r in evals], "o-", label="token accuracy")
        if "eval_exact_match" in evals[0]:
            ax_acc.plot([r["step"] for r in evals], [r["eval_exact_match"] for r in evals], "s-", label="exact match")
    ax_loss.set(xlabel="step", ylabel="cross-entropy", yscale="log", title="loss")
    ax_acc.set(xlabel="step", ylabel="accuracy", ylim=(0, 1.02), title="held-out accuracy")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(str(run_dir.path))
    # Fixed margins: tight_layout measures every tick label first, most of a tiny run's plotting.
    fig.subplots_adjust(left=0.07 if not text else 0.05, right=0.98 if not text else 0.95, bottom=0.13, top=0.85,
                        wspace=0.25 if not text else 0.3)
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=100)
    write_atomic(run_dir.plot_path, png.getvalue())
    return run_dir.plot_path
