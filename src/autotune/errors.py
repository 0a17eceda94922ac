"""Errors the CLI turns into one line on stderr and a documented exit code, never a traceback.

Every error a user may see derives from `AutotuneError` and carries its `exit_code`, so the CLI has one
handler for all of them (`cli/__init__.py`); `AUTOTUNE_DEBUG=1` adds the traceback. SIGTERM's
`Terminated` (infra/terminate.py) is the one exception: a BaseException on purpose, so no `except Exception`
swallows it, and the CLI catches it beside this base with the same one-line treatment.
"""

from __future__ import annotations


class AutotuneError(Exception):
    """Base of the errors the CLI reports as one line; `exit_code` is the process's exit status."""

    exit_code = 1  # a generic failure; each subclass names its own documented code


class UserError(AutotuneError):
    """Bad input from the user (unknown model, bad flag value, unreadable file); exit code 2.

    Raised anywhere below the CLI; the CLI prints `str(error)` alone, never a traceback.
    """

    exit_code = 2


class NothingFitsError(AutotuneError):
    """No candidate configuration fits the hardware; the tuner exits with code 3."""

    exit_code = 3


class TrialsFailedError(UserError):
    """Trials ran but none finished (timeouts, crashes): not "nothing fits", and the message says why.

    Exit code 2, like other input the user must change (a longer --trial-timeout, a working launcher)."""


class MalformedReportError(UserError):
    """A stored tuning report that does not read back as this version's `TuneReport` (report/data.py): a key
    missing or unknown, or a value of the wrong type. The results cache treats it as a miss and tunes again."""


class HookError(AutotuneError):
    """The pre-launch hook could not give this job a config (timeout, failed tuning, --strict); exit code 4."""

    exit_code = 4
