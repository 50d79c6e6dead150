"""Investigation tools, not part of the product: run from a source checkout, never installed.

    xla_profile.py  where a Flax path spends its time: a ``jax.profiler`` trace summed per HLO
                    instruction; instructions are put in categories by reading the optimised
                    HLO text with regular expressions (a heuristic, good enough to point at
                    the matmuls, the RNG and the layout copies; not a stable interface)
    ablations.py    Flax train-step variants timed side by side, each group of them in one
                    process (issue 48's GPU lease runs them: ``gpu_items.sh decide``)
    ablation_variants.py  the variants, by name; some swap a function of flaxformer_mini (its
                    Linear class, its LayerNorm call, the step's loss) while a model is built or
                    its step traced, which only an investigation may do
    dispatch.py     per-call dispatch cost of small jitted steps (docs/benchmarks.md)
    build_idioms.py docs/idioms.md from docs/idioms_template.md, quoting the source
                    (``--check``: exit 1 when the guide no longer matches the code)
    measure_loading.py  time and peak memory of loading a 1M-line TSV (docs/data.md)
    recipe_sweep.py recipe configurations trained for the same wall time each, then scored on
                    the validation file, greedily and with a beam
    dropout_expectation.py  whether the twins' dropouts agree in distribution: the mean
                    train-mode loss over many dropout draws, torch against Flax
    suite_profile.py  where the test suite's time goes: a pytest plugin recording each test's
                    and each XLA compilation's CPU time, and a summary of its files
    gpu_items.sh    the GPU items, one command each, for a lent GPU machine
                    (docs/benchmarks.md, "GPU")

``python -m tools.xla_profile --preset base`` and ``python -m tools.ablations --preset base``;
the product is ``python -m benchmarks`` (and ``python -m benchmarks.scaling``).
"""


def where_and_what():
    """The machine, the date and the code, as the benchmark's report heads its figures: the
    tools' output is quoted in the docs too."""
    from benchmarks import code_version, machine

    return (f"{machine.one_line(machine.describe())}; {machine.date_utc()}\n"
            f"code: {code_version.describe(code_version.code_version())}")
