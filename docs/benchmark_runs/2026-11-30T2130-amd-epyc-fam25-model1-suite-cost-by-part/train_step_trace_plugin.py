"""pytest plugin: log each trace of train_step by a Trainer, with what makes it distinct, to
$TRACE_LOG.<worker>.jsonl (default /tmp/trace_log)."""
import json, os
import pytest

LOG = os.environ.get("TRACE_LOG", "/tmp/trace_log")
_current = {"test": ""}

def pytest_configure(config):
    import flaxformer_mini.train.step as S
    import flaxformer_mini.train.trainer as T
    orig = S.train_step
    wid = os.environ.get("PYTEST_XDIST_WORKER", "main")
    f = open(f"{LOG}.{wid}.jsonl", "a")
    import functools
    @functools.wraps(orig)
    def logged_train_step(state, batch):
        import jax
        rec = {"test": _current["test"], "config": repr(state.config),
               "batch": [list(x.shape) for x in jax.tree.leaves(batch)],
               "params": sum(int(__import__("numpy").prod(x.shape)) for x in jax.tree.leaves(state.params)),
               "ema": state.ema is not None,
               "ptypes": sorted({str(x.dtype) for x in jax.tree.leaves(state.params)}),
               "sharding": str(getattr(jax.tree.leaves(state.params)[0], "sharding", None))[:80]}
        f.write(json.dumps(rec) + "\n"); f.flush()
        return orig(state, batch)
    S.train_step = logged_train_step
    T.train_step = logged_train_step

@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    _current["test"] = item.nodeid
