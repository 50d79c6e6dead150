"""The loss and held-out accuracy curves of a run, drawn from its metrics log."""

import io

from flaxformer_mini.files import write_atomic
from flaxformer_mini.run_dir import RunDir


def plot_metrics(run_dir: RunDir):
    """Draw the training and evaluation curves of ``run_dir`` into its ``loss.png``."""
    import matplotlib

    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt

    records = run_dir.read_metrics()
    train = [(r["step"], r["loss"]) for r in records if "loss" in r]
    evals = [r for r in records if "eval_loss" in r]
    if not train and not evals:
        return None
    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(10, 4))
    if train:
        ax_loss.plot(*zip(*train), label="train loss", lw=1)
    if evals:
        ax_loss.plot([r["step"] for r in evals], [r["eval_loss"] for r in evals], "o-", label="eval loss")
        ax_acc.plot([r["step"] for r in evals], [r["eval_token_accuracy"] for r in evals], "o-", label="token accuracy")
        if "eval_exact_match" in evals[0]:
            ax_acc.plot([r["step"] for r in evals], [r["eval_exact_match"] for r in evals], "s-", label="exact match")
    ax_loss.set(xlabel="step", ylabel="cross-entropy", yscale="log", title="loss")
    ax_acc.set(xlabel="step", ylabel="accuracy", ylim=(0, 1.02), title="held-out accuracy")
    for ax in (ax_loss, ax_acc):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(str(run_dir.path))
    fig.tight_layout()
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=100)
    plt.close(fig)
    write_atomic(run_dir.plot_path, png.getvalue())
    return run_dir.plot_path
