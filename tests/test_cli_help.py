"""`--help` of each flaxformer-mini command names every option's default (docs/cli.md says so)."""
import argparse

import pytest

from flaxformer_mini.cli import parser


def _commands():
    sub = next(a for a in parser.build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices


@pytest.mark.parametrize("command", sorted(_commands()))
def test_each_commands_help_names_every_options_default(command, monkeypatch):
    monkeypatch.setenv("COLUMNS", "10000")  # one line per option: a default is never wrapped apart
    command_parser = _commands()[command]
    text = command_parser.format_help()
    missing = [action.option_strings[0] for action in command_parser._actions
               if action.option_strings and action.default not in (None, argparse.SUPPRESS)
               and f"(default: {action.default})" not in text and "default" not in (action.help or "")]
    assert not missing, f"{command} --help gives no default for {missing}"

