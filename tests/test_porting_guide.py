"""docs/porting.md runs as written: its ```python blocks run in order in one namespace, and each
```text block right after one is exactly what that block printed (numbers below 1e-4 in
scientific notation are compared as "tiny": float32 rounding noise may differ in the last
bits between machines; every number that shows a fault is compared as printed).
"""

import contextlib
import io
import re
from pathlib import Path

GUIDE = Path(__file__).resolve().parents[1] / "docs" / "porting.md"
_BLOCK = re.compile(r"```(python|text)\n(.*?)```", re.DOTALL)
_TINY = re.compile(r"\b\d\.\d{3}e-(0[5-9]|[1-9]\d)\b")


def run_guide(text):
    """[(python source, what it printed, the text block shown after it or None)]."""
    blocks = [(m.group(1), m.group(2)) for m in _BLOCK.finditer(text)]
    namespace, out = {"__name__": "porting_guide"}, []
    for i, (kind, body) in enumerate(blocks):
        if kind != "python":
            continue
        buffer = io.StringIO()
        with contextlib.redirect_stdout(buffer):
            exec(compile(body, f"docs/porting.md block {len(out)}", "exec"), namespace)  # noqa: S102 - our own doc
        shown = blocks[i + 1][1] if i + 1 < len(blocks) and blocks[i + 1][0] == "text" else None
        out.append((body, buffer.getvalue(), shown))
    return out


def _normal(text):
    return _TINY.sub("tiny", text).rstrip()


def test_porting_guide_runs_and_prints_what_it_shows():
    results = run_guide(GUIDE.read_text())
    assert len(results) >= 6
    for source, printed, shown in results:
        if shown is not None:
            assert _normal(printed) == _normal(shown), f"block:\n{source}\nprinted:\n{printed}\nshown:\n{shown}"


if __name__ == "__main__":  # print each block's output, to paste into the guide
    for source, printed, _ in run_guide(GUIDE.read_text()):
        print("=" * 30, source.splitlines()[0], "\n" + printed)
