"""The CLI's help (issue 48): ``-h`` is ``--help`` everywhere, and a command's usage line names its positional words.
Imported by :mod:`raycpt.cli` only (typer at the top: ``import raycpt`` and the library do not load it)."""

from __future__ import annotations

from typer.core import TyperCommand

HELP = {"help_option_names": ["-h", "--help"]}
"""The context settings of the top-level command: ``-h`` is ``--help`` there and, inherited through click's context,
on every group and command below it."""


class NamedWords(TyperCommand):
    """A command whose usage line shows each positional argument's metavar as written (``RUN_DIR [CONFIG.yaml]
    [KEY=VALUE]...``, :attr:`raycpt.usage.Row.metavar`), where typer would show ``[args]...``: typer wraps a metavar
    in brackets and adds ``...``."""

    def collect_usage_pieces(self, ctx) -> list[str]:
        out = [self.options_metavar] if self.options_metavar else []
        for param in self.get_params(ctx):
            named = param.param_type_name == "argument" and param.metavar
            out.extend([param.metavar] if named else param.get_usage_pieces(ctx))
        return out
