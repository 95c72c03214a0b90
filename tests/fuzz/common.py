"""What every fuzz test asserts: a result, or BadInput as one line; any other exception fails the test."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ddpdoctor.errors import BadInput


def result_or_bad_input(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    try:
        return fn(*args, **kwargs)
    except BadInput as exc:
        assert "\n" not in str(exc), f"BadInput on several lines: {exc!r}"
        return exc
