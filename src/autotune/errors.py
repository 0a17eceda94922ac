"""User-facing errors: the CLI turns these into one line on stderr and exit code 2."""

from __future__ import annotations


class UserError(Exception):
    """Bad input from the user (unknown model, bad flag value, unreadable file).

    Raised anywhere below the CLI; the CLI prints `str(error)` alone, never a traceback.
    """

    exit_code = 2


class NothingFitsError(Exception):
    """No candidate configuration fits the hardware; the tuner exits with code 3."""

    exit_code = 3


class TrialsFailedError(UserError):
    """Trials ran but none finished (timeouts, crashes): not "nothing fits", and the message says why.

    Exit code 2, like other input the user must change (a longer --trial-timeout, a working launcher)."""
