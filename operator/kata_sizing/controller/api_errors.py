"""The API failures the operator tells apart, without the client: `kube` raises them, the rest
names them (docs/operation.md, API failures)."""

from __future__ import annotations


class ApiError(Exception):
    def __init__(self, status: int | None, message: str):
        super().__init__(message)
        self.status = status


class NotFound(ApiError):
    """404: the object, or for a create the namespace it would live in, does not exist."""


class Conflict(ApiError):
    """409 (stale resourceVersion, or the object already exists) or 422 on a failed test."""


class Invalid(ApiError):
    """422: the server refused the object (for example a changed immutable field)."""


class TransientApiError(ApiError):
    """Worth retrying after a back-off: 5xx, 429, timeouts, dropped connections."""


class PermanentApiError(ApiError):
    pass
