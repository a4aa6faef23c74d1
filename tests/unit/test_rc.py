"""The `rc` vocabulary: every code has an HTTP status, and the raise sites can only name codes."""

from __future__ import annotations

import ast
import inspect
import typing
from pathlib import Path

import horde_lite
from horde_lite.api.errors import OPENAI_CODES, RETRYABLE_RCS
from horde_lite.core.errors import HordeError
from horde_lite.rc import Rc

PACKAGE = Path(horde_lite.__file__).parent


def test_every_code_has_an_error_status_and_its_own_name_on_the_wire() -> None:
    for rc in Rc:
        assert rc.name == rc.value == str(rc) == f"{rc}"  # the wire spelling, upstream's
        assert isinstance(rc.status, int)
        assert 400 <= rc.status < 600, rc


def test_the_codes_statuses_stay_upstreams() -> None:
    assert Rc.BadRequest.status == 400
    assert Rc.InvalidAPIKey.status == 401
    assert Rc.NotModerator.status == 403
    assert Rc.RequestNotFound.status == 404
    assert Rc.Locked.status == 423
    assert Rc.TooManyPrompts.status == 429
    assert Rc.WorkerFailed.status == 502
    assert Rc.DatabaseUnavailable.status == 503


def test_the_openai_face_and_the_retry_rule_name_codes() -> None:
    assert all(isinstance(rc, Rc) for rc in OPENAI_CODES)
    assert all(isinstance(rc, Rc) for rc in RETRYABLE_RCS)


def test_a_refusal_takes_the_code_type() -> None:
    """No scan of the raise sites is needed for a status: `HordeError` is typed to take an `Rc`."""
    hints = typing.get_type_hints(HordeError.__init__)
    assert hints["rc"] is Rc
    assert "rc" in inspect.signature(HordeError).parameters


def test_no_raise_site_passes_a_bare_string() -> None:
    """The project runs no type checker, so the type above is also checked here: every
    `HordeError(...)` names its code through `Rc` (or passes one on), and so does every other call
    given a code as its first argument (a subclass's `super().__init__`, a helper's)."""
    codes = {rc.value for rc in Rc}
    bare = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Call) or not node.args:
                continue
            first = node.args[0]
            constant = isinstance(first, ast.Constant)
            if (getattr(node.func, "id", None) == "HordeError" and constant) or (
                constant and first.value in codes
            ):
                bare.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    assert not bare, bare
