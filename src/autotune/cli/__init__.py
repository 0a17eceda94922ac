"""The `autotune` command: a thin typer layer that parses, calls the library and prints.

`autotune --model M --gpus N` runs the tuner (the default command); subcommands stay available.

Exit codes: 0 success, 1 `check` found errors, 2 bad input (one line on stderr, before any trial; also
trials that could not complete), 3 nothing fits, 4 the pre-launch hook failed (the tuning process
crashed or a waiting process timed out), 130 interrupted, 143 stopped by SIGTERM.
`AUTOTUNE_DEBUG=1` in the environment prints the traceback before that one line.
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Mapping

import typer

try:  # typer >= 0.20 vendors click
    from typer._click import exceptions as click_errors
except ImportError:  # pragma: no cover - older typer depends on click itself
    # the same module, from click itself: to mypy a second module bound to the name
    from click import exceptions as click_errors  # type: ignore[no-redef]

from autotune.errors import AutotuneError
from autotune.infra.terminate import INTERRUPTED_EXIT, Terminated

app = typer.Typer(
    name="autotune",
    help="GPU-memory-aware auto-tuner for DeepSpeed: finds the fastest config that fits and writes ds_config.json.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # plain click help: flags show no `<bool>` value, choices show as [a|b]
    context_settings={"help_option_names": ["-h", "--help"]},
)


@app.callback()
def _group() -> None:
    """Always a group of subcommands, even when only the invoked one is registered."""


_COMMAND_MODULES = ("tune", "plan", "probe", "model", "check", "hook")
_DEFAULT_COMMAND = "tune"


def _register_commands(only: str | None = None) -> None:
    """Register the subcommands; just `only` when the command line names one, so a cache hit does not
    import what `check` and `plan` need (about 0.9 s of imports on a 2-core machine)."""
    import importlib

    for name in _COMMAND_MODULES if only not in _COMMAND_MODULES else (only,):
        try:
            module = importlib.import_module(f"autotune.cli.{name}")
        except ModuleNotFoundError as error:
            if error.name == f"autotune.cli.{name}":
                continue  # command not built yet in this checkout
            raise
        module.register(app)


def _route_default(argv: list[str]) -> list[str]:
    """`autotune --model x ...` means `autotune tune --model x ...`."""
    if argv and argv[0].startswith("-") and argv[0] not in ("-h", "--help", "--version"):
        return [_DEFAULT_COMMAND, *argv]
    return argv


DEBUG_VARIABLE = "AUTOTUNE_DEBUG"


def debug_wanted(environ: Mapping[str, str]) -> bool:
    """`AUTOTUNE_DEBUG=1` (any value but empty or 0): errors show their traceback, for a bug report."""
    return environ.get(DEBUG_VARIABLE, "").strip() not in ("", "0")


def fail_with(message: str, code: int, *, show_traceback: bool = False) -> None:
    """One line on stderr and exit `code`; with `show_traceback` the handled error's traceback first."""
    if show_traceback:
        traceback.print_exc(file=sys.stderr)
    print(f"autotune: error: {message}", file=sys.stderr)
    raise SystemExit(code)


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if args == ["--version"]:
        from autotune.core.versions import AUTOTUNE_VERSION as __version__

        print(f"autotune {__version__}")
        return
    debug = debug_wanted(os.environ)
    routed = _route_default(args)
    named = routed[0] if routed and not any(flag in routed[1:] for flag in ("-h", "--help")) else None
    _register_commands(named)
    try:
        code = app(args=routed, prog_name="autotune", standalone_mode=False)
    except click_errors.NoArgsIsHelpError as error:
        print(error.ctx.get_help() if error.ctx else "", file=sys.stderr)
        raise SystemExit(2) from None
    except click_errors.ClickException as error:
        fail_with(error.format_message().replace("\n", " "), 2)
    except typer.Abort:
        fail_with("aborted", 130)
    except KeyboardInterrupt:
        fail_with("interrupted", 130, show_traceback=debug)
    except (AutotuneError, Terminated) as error:  # Terminated: SIGTERM, after cleanup (infra/terminate.py)
        fail_with(str(error), error.exit_code, show_traceback=debug)
    if code == INTERRUPTED_EXIT:  # typer turns Ctrl-C outside a tuning into Exit(130) and says nothing
        fail_with("interrupted by SIGINT (Ctrl-C) before finishing; files are written whole or not at all", code)
    raise SystemExit(code if isinstance(code, int) else 0)
