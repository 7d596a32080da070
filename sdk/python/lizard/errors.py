"""Typed exceptions. Every error the server answers has a stable ``code`` (``NOT_FOUND``,
``ACCOUNT_SCOPE_REQUIRED``, …) and an HTTP status; the exception class follows the status,
and ``code`` keeps the server's exact word so callers can branch on it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Dict, Optional, Type

if TYPE_CHECKING:
    from .models import TemplateBuildInfo


class LizardError(Exception):
    """Base class of everything this SDK raises."""


class APIConnectionError(LizardError):
    """The server could not be reached (after the retries an idempotent call gets)."""


class APITimeoutError(APIConnectionError):
    """The call took longer than its timeout."""


class ContextError(LizardError):
    """A directory cannot be pushed as it is: no recipe file, a Dockerfile without a name,
    a file that is neither a file, a directory nor a symlink, a name that is not UTF-8."""


class BuildError(LizardError):
    """A template build ended without a template: ``code`` (``STEP_FAILED``, ``TIMED_OUT``,
    ``START_NOT_READY``, ``CANCELLED``, ``INTERNAL``), ``message``, the failing ``step``
    (1-based) and the tail of its output where a step failed; ``build`` is the whole
    build status."""

    def __init__(self, build: "TemplateBuildInfo") -> None:
        failure = build.error
        self.build = build
        self.code = failure.code if failure else build.status.upper()
        self.message = failure.message if failure else f"the build ended {build.status}"
        self.step = failure.step if failure else None
        self.output_tail = failure.output_tail if failure else None
        text = f"{self.code}: {self.message}"
        if self.output_tail:
            text += "\n" + self.output_tail
        super().__init__(text)


class APIError(LizardError):
    """The server answered with an error: ``status`` (HTTP), ``code`` and ``message``."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.status = status
        self.code = code
        self.message = message


class InvalidArgumentError(APIError):
    """422 INVALID_ARGUMENT (or another 4xx the SDK has no class for)."""


class AuthenticationError(APIError):
    """401 UNAUTHENTICATED: missing, unknown or deleted API key."""


class PermissionDeniedError(APIError):
    """403 FORBIDDEN or ACCOUNT_SCOPE_REQUIRED (a scoped key on an account-wide route)."""


class PaymentRequiredError(APIError):
    """402 PAYMENT_REQUIRED: the account's balance does not cover the call."""


class NotFoundError(APIError):
    """404 NOT_FOUND: unknown, outside the key's scope, or (a sandbox) killed or expired."""


class ConflictError(APIError):
    """409 CONFLICT: the name is taken, or the resource is not in a state that allows it."""


class RateLimitError(APIError):
    """429 RATE_LIMITED: retried with backoff; raised when the retries ran out."""


class InternalServerError(APIError):
    """500 INTERNAL."""


class NotImplementedByServerError(APIError):
    """501: the server does not implement this call."""


class BadGatewayError(APIError):
    """502 BOOT_FAILED or PORT_CLOSED."""


class UnavailableError(APIError):
    """503 UNAVAILABLE: retried with backoff; raised when the retries ran out."""


class TimedOutError(APIError):
    """408 TIMED_OUT: what the call waited for (a port to listen) did not happen in time."""


_BY_STATUS: Dict[int, Type[APIError]] = {
    401: AuthenticationError,
    402: PaymentRequiredError,
    403: PermissionDeniedError,
    404: NotFoundError,
    408: TimedOutError,
    409: ConflictError,
    429: RateLimitError,
    500: InternalServerError,
    501: NotImplementedByServerError,
    502: BadGatewayError,
    503: UnavailableError,
}


def error_for(status: int, code: Optional[str], message: str) -> APIError:
    """The typed exception for an error response."""
    cls = _BY_STATUS.get(status)
    if cls is None:
        cls = InvalidArgumentError if 400 <= status < 500 else APIError
    return cls(status, code or f"HTTP_{status}", message)
