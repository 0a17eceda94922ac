"""One error base: every error the CLI reports as one line carries the exit code the README documents."""

from __future__ import annotations

import pytest

from autotune.errors import AutotuneError, HookError, NothingFitsError, TrialsFailedError, UserError
from autotune.infra.terminate import TERMINATED_EXIT, Terminated


@pytest.mark.parametrize(
    ("error", "code"),
    [(UserError, 2), (TrialsFailedError, 2), (NothingFitsError, 3), (HookError, 4)],
)
def test_each_error_has_its_documented_exit_code_and_the_one_base(error: type[AutotuneError], code: int) -> None:
    assert issubclass(error, AutotuneError) and error.exit_code == code
    assert error("why").exit_code == code and str(error("why")) == "why"


def test_hook_error_is_one_class_wherever_it_is_imported_from() -> None:
    from autotune.hook import HookError as from_hook
    from autotune.hook.coordinate import HookError as from_coordinate

    assert from_hook is from_coordinate is HookError


def test_sigterm_stays_outside_except_exception_with_its_own_exit_code() -> None:
    # Terminated is a BaseException on purpose (infra/terminate.py): cleanup code's `except Exception` must not
    # swallow SIGTERM, so it cannot share AutotuneError's base; the CLI catches the two in one clause.
    assert not issubclass(Terminated, Exception) and Terminated().exit_code == TERMINATED_EXIT == 143
    with pytest.raises(Terminated):
        try:
            raise Terminated()
        except Exception:  # the point: this must not catch it
            pytest.fail("except Exception caught SIGTERM's Terminated")
