"""docs/porting.md runs as written: its ```python blocks run in order in one namespace, and each
```text block right after one is exactly what that block printed (numbers below 1e-4 in
scientific notation are compared as "tiny": float32 rounding noise may differ in the last
bits between machines; so is a relative difference beside a tiny absolute one, since that is
noise divided by a near-zero value (4.4e-4 on one CPU, 7.3e-4 on another); every number that
shows a fault, and every "within" verdict, is compared as printed).
"""

import contextlib
import io
import re
from pathlib import Path

GUIDE = Path(__file__).resolve().parents[1] / "docs" / "porting.md"
_BLOCK = re.compile(r"```(python|text)\n(.*?)```", re.DOTALL)
_TINY = re.compile(r"\b\d\.\d{3}e-(0[5-9]|[1-9]\d)\b")
# A table row's "max abs diff  max rel diff": the relative one is noise when the absolute is.
_TINY_ABS_THEN_REL = re.compile(r"\b\d\.\d{3}e-(?:0[5-9]|[1-9]\d)(\s+)\d\.\d{3}e[-+]\d\d\b")


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
    return _TINY.sub("tiny", _TINY_ABS_THEN_REL.sub(r"tiny\1tiny", text)).rstrip()


def test_porting_guide_runs_and_prints_what_it_shows():
    results = run_guide(GUIDE.read_text())
    assert len(results) >= 6
    for source, printed, shown in results:
        if shown is not None:
            assert _normal(printed) == _normal(shown), f"block:\n{source}\nprinted:\n{printed}\nshown:\n{shown}"


if __name__ == "__main__":  # print each block's output, to paste into the guide
    for source, printed, _ in run_guide(GUIDE.read_text()):
        print("=" * 30, source.splitlines()[0], "\n" + printed)


def test_only_rounding_noise_is_normalised_a_fault_is_compared_as_printed():
    noise = "grad:w  (8, 8)  2.235e-08     4.438e-04  yes"
    assert _normal(noise) == _normal("grad:w  (8, 8)  1.117e-08     7.304e-04  yes")
    fault = "grad:w  (8, 8)  3.100e-02     4.438e-04  no"
    assert _normal(fault) != _normal("grad:w  (8, 8)  3.100e-02     7.304e-04  no")
