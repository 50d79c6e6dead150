"""The ``flaxformer-mini`` command line: ``main.py`` parses (``parser.py``) and dispatches to one
module per command (``train.py``, ``evaluate.py``, ``generate.py``, ``average.py``); ``errors.py`` maps what they
raise to exit codes and one-line messages; ``arriving_lines.py`` reads ``generate``'s standard
input as it arrives.

The top floor of the house: it may import every other subpackage, and nothing imports it.
"""
