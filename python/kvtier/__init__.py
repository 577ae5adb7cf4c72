from . import _ext
