"""`ditto-lsp bench` reaches the tools through an entry point (lsp_server/cli.py, issue 57): the
product imports no tool until their command is asked for, and without them it says so in one line."""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata

import pytest

from lsp_server.cli import TOOL_GROUP, main

IMPORTED = """
import sys
from lsp_server.cli import build_parser
build_parser({argv!r})
print('ditto_bench' in sys.modules)
"""


@pytest.mark.parametrize("argv,imported", [(["serve", "--model", "tiny-random"], False),
                                           (["complete", "a.py:1:1"], False),
                                           (["-v", "bench", "--repo", "."], True)])
def test_the_tools_are_imported_only_for_their_command(argv, imported):
    out = subprocess.run([sys.executable, "-c", IMPORTED.format(argv=argv)], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str(imported)


def test_bench_is_registered_in_the_group_the_cli_reads():
    """Fails on an editable install made before the entry point existed: re-run pip install -e ."""
    (ep,) = [ep for ep in metadata.entry_points(group=TOOL_GROUP) if ep.name == "bench"]
    assert ep.value == "ditto_bench.cli" and hasattr(ep.load(), "configure")


def _one_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    return err


def test_without_the_tools_bench_says_so_in_one_line(monkeypatch, capsys):
    monkeypatch.setattr(metadata, "entry_points", lambda **kw: [])
    assert main(["bench", "--repo", ".", "--mode", "session"]) == 2
    err = _one_line(capsys)
    assert "bench" in err and "not installed" in err and "pip install -e ." in err


def test_a_tool_that_does_not_import_says_why(monkeypatch, capsys):
    broken = metadata.EntryPoint(name="bench", value="no_such_tools_package.cli", group=TOOL_GROUP)
    monkeypatch.setattr(metadata, "entry_points", lambda **kw: [broken])
    assert main(["bench", "--repo", "."]) == 2
    assert "no_such_tools_package" in _one_line(capsys)


def test_the_products_commands_still_refuse_unknown_options(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["models", "--no-such-option"])
    assert exc.value.code == 2 and "unrecognized arguments: --no-such-option" in capsys.readouterr().err
