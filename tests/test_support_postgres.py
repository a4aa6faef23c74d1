"""The test-database finder honours an explicit URL, even when that server is down."""

import pytest

from tests.support.postgres import ENV_URL, require_postgres, resolve_postgres

UNREACHABLE = "postgresql+asyncpg://postgres@127.0.0.1:1/test"  # nothing listens on port 1


def test_unreachable_explicit_url_gives_no_url_and_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_URL, UNREACHABLE)

    target = resolve_postgres()

    # An explicit URL must never silently fall back to another server (default or throwaway).
    assert target.url is None
    assert ENV_URL in target.reason
    assert "127.0.0.1:1/test" in target.reason
    assert "unreachable" in target.reason
    target.stop()  # a no-op here, but must be callable


@pytest.mark.parametrize(("value", "expected"), [("1", True), ("true", True), ("0", False), ("", False)])
def test_require_postgres_reads_the_environment(
    monkeypatch: pytest.MonkeyPatch, value: str, expected: bool
) -> None:
    monkeypatch.setenv("HORDE_LITE_REQUIRE_POSTGRES", value)
    assert require_postgres() is expected
