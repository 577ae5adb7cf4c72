"""Exceptions: every failure of the library becomes a :class:`KvtierError` carrying kvtier's
code (``.code``: a negative ``KVT_E_*`` value or ``-errno``) and message (``.message``: what
failed and where, e.g. the file, offset and FORMAT.md check ID)."""
import builtins
import errno as _errno

from . import _ext


class KvtierError(Exception):
    """Base of every kvtier failure. ``code`` is kvtier's code, ``message`` its message."""

    code: int = 0
    message: str = ""


class FormatError(KvtierError):
    """Not an .mlxkv file (unknown magic)."""


class CorruptError(KvtierError):
    """An integrity or structural failure: a hash, a count, an offset that does not check."""


class MismatchError(KvtierError):
    """An intact file for another model, tokenizer, namespace or layer layout."""


class UnsupportedError(KvtierError):
    """Another format version, cache kind, dtype or feature."""


class TooLargeError(KvtierError):
    """The entry exceeds a configured byte cap."""


class StateError(KvtierError):
    """The operation is not allowed in the object's state (closed, empty, not trimmable)."""


class RefusedError(KvtierError):
    """The engine's exclusion refused a step."""


class TimeoutError(KvtierError, builtins.TimeoutError):
    """A bounded wait ran out (a flush: see ``report``)."""

    report = None


class InvalidArgumentError(KvtierError, ValueError):
    """The library rejected an argument (-EINVAL): shapes or dtypes that do not fit the
    kind, bad parameters."""


class KvtierOSError(KvtierError, OSError):
    """An operating-system failure (-errno): ``errno`` is set."""


_BY_CODE = {
    _ext.E_FORMAT: FormatError,
    _ext.E_CORRUPT: CorruptError,
    _ext.E_MISMATCH: MismatchError,
    _ext.E_UNSUPPORTED: UnsupportedError,
    _ext.E_TOO_LARGE: TooLargeError,
    _ext.E_STATE: StateError,
    _ext.E_REFUSED: RefusedError,
    _ext.E_TIMEOUT: TimeoutError,
}


def from_code(code: int, message: str) -> KvtierError:
    """The exception for kvtier ``code`` with ``message`` (called by the extension)."""
    if -1000 < code < 0:
        if -code == _errno.EINVAL:
            exc = InvalidArgumentError(message)
        else:
            exc = KvtierOSError(-code, message)
    else:
        exc = _BY_CODE.get(code, KvtierError)(message)
    exc.code = code
    exc.message = message
    return exc


_ext._set_error_factory(from_code)
