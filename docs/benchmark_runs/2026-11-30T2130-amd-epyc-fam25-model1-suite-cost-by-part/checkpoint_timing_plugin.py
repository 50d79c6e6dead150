"""pytest plugin: each checkpoint.save and checkpoint.restore call's process CPU, by test, to
/tmp/ckpt_log.<worker>.jsonl."""
import json, os, time, functools
import pytest
_current = {"test": ""}
def pytest_configure(config):
    from flaxformer_mini.train import checkpoint as C
    wid = os.environ.get("PYTEST_XDIST_WORKER", "main")
    f = open(f"/tmp/ckpt_log.{wid}.jsonl", "a")
    for name in ("save", "restore"):
        orig = getattr(C, name)
        def wrap(orig=orig, name=name):
            @functools.wraps(orig)
            def w(*a, **k):
                c0 = time.process_time()
                try:
                    return orig(*a, **k)
                finally:
                    f.write(json.dumps({"test": _current["test"], "op": name, "cpu": time.process_time() - c0}) + "\n"); f.flush()
            return w
        setattr(C, name, wrap())
@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    _current["test"] = item.nodeid
