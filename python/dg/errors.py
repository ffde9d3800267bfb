"""Errors from the cluster as Python exceptions: TensorFlow's classes
(tf.errors.*), each carrying dg's own error code (doc/errors.md), message
and hint."""

__all__ = ["OpError", "CancelledError", "UnknownError", "InvalidArgumentError",
           "DeadlineExceededError", "NotFoundError", "AlreadyExistsError",
           "PermissionDeniedError", "UnauthenticatedError", "ResourceExhaustedError",
           "FailedPreconditionError", "AbortedError", "OutOfRangeError",
           "UnimplementedError", "InternalError", "UnavailableError", "DataLossError"]

# TensorFlow's canonical error codes (tf.errors.OK ...).
OK, CANCELLED, UNKNOWN, INVALID_ARGUMENT, DEADLINE_EXCEEDED, NOT_FOUND = 0, 1, 2, 3, 4, 5
ALREADY_EXISTS, PERMISSION_DENIED, RESOURCE_EXHAUSTED, FAILED_PRECONDITION = 6, 7, 8, 9
ABORTED, OUT_OF_RANGE, UNIMPLEMENTED, INTERNAL, UNAVAILABLE, DATA_LOSS = 10, 11, 12, 13, 14, 15
UNAUTHENTICATED = 16


class OpError(Exception):
    """A failure reported by dg. ``code`` is dg's error name (``"shape_mismatch"``),
    ``error_code`` TensorFlow's number, ``message`` and ``hint`` dg's text."""

    error_code = UNKNOWN

    def __init__(self, node_def, op, message, code="internal", hint=None):
        super().__init__(message)
        self.node_def = node_def
        self.op = op
        self.message = message
        self.code = code
        self.hint = hint

    def __str__(self):
        if self.hint:
            return "%s (hint: %s)" % (self.message, self.hint)
        return self.message


def _cls(name, num):
    return type(name, (OpError,), {"error_code": num, "__doc__": "tf.errors.%s" % name})


CancelledError = _cls("CancelledError", CANCELLED)
UnknownError = _cls("UnknownError", UNKNOWN)
InvalidArgumentError = _cls("InvalidArgumentError", INVALID_ARGUMENT)
DeadlineExceededError = _cls("DeadlineExceededError", DEADLINE_EXCEEDED)
NotFoundError = _cls("NotFoundError", NOT_FOUND)
AlreadyExistsError = _cls("AlreadyExistsError", ALREADY_EXISTS)
PermissionDeniedError = _cls("PermissionDeniedError", PERMISSION_DENIED)
UnauthenticatedError = _cls("UnauthenticatedError", UNAUTHENTICATED)
ResourceExhaustedError = _cls("ResourceExhaustedError", RESOURCE_EXHAUSTED)
FailedPreconditionError = _cls("FailedPreconditionError", FAILED_PRECONDITION)
AbortedError = _cls("AbortedError", ABORTED)
OutOfRangeError = _cls("OutOfRangeError", OUT_OF_RANGE)
UnimplementedError = _cls("UnimplementedError", UNIMPLEMENTED)
InternalError = _cls("InternalError", INTERNAL)
UnavailableError = _cls("UnavailableError", UNAVAILABLE)
DataLossError = _cls("DataLossError", DATA_LOSS)

# dg's codes (core/src/status.c) to the nearest TensorFlow class.
_BY_CODE = {
    "invalid_argument": InvalidArgumentError, "shape_mismatch": InvalidArgumentError,
    "dtype_mismatch": InvalidArgumentError, "not_found": NotFoundError,
    "exists": AlreadyExistsError, "conflict": AbortedError, "too_large": ResourceExhaustedError,
    "unauthorized": UnauthenticatedError, "unavailable": UnavailableError,
    "io_error": DataLossError, "out_of_memory": ResourceExhaustedError,
    "internal": InternalError, "timeout": DeadlineExceededError,
    "device_error": InternalError, "unsupported": UnimplementedError,
    "canceled": CancelledError, "stale": AbortedError, "closed": OutOfRangeError,
    "disk_full": ResourceExhaustedError,
}

# The exit codes of the dg command (doc/errors.md) to dg's codes.
_BY_EXIT = {2: "invalid_argument", 3: "not_found", 4: "exists", 5: "shape_mismatch",
            6: "dtype_mismatch", 7: "conflict", 8: "too_large", 9: "unauthorized",
            10: "unavailable", 11: "io_error", 12: "out_of_memory", 13: "internal",
            14: "timeout", 15: "device_error", 16: "unsupported", 17: "canceled",
            18: "stale", 19: "closed", 20: "disk_full"}


def from_dg(code, message, hint=None, op=None):
    """The exception for dg error ``code`` (a name such as ``"not_found"``)."""
    return _BY_CODE.get(code, UnknownError)(None, op, message, code, hint)


def from_exit(status, stderr, op=None):
    """The exception for a dg command that exited with ``status``, from its
    stderr lines ``dg: MESSAGE`` and ``dg: hint: HINT``."""
    msg, hint = [], None
    for line in stderr.splitlines():
        if line.startswith("dg: hint: "):
            hint = line[len("dg: hint: "):]
        elif line.startswith("dg: "):
            msg.append(line[4:])
    text = "; ".join(msg) or stderr.strip() or ("dg exited with status %d" % status)
    return from_dg(_BY_EXIT.get(status, "internal"), text, hint, op)
