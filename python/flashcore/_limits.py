"""Range checks for values about to be narrowed into ctypes fields.

ctypes wraps integers modulo 2**32 and rounds floats to float32 without a
word: window=(2**32, -1) would reach the library as (0, -1) and scale=1e-46
as 0, which means 1/sqrt(head_dim). Every field is checked here first.
"""

import ctypes
import math
import operator

from .errors import InvalidArgumentError

INT32_MIN, INT32_MAX = -2**31, 2**31 - 1
FLT_MAX = 3.4028234663852886e38
FLT_TRUE_MIN = 1.401298464324817e-45  # the smallest positive float32 (subnormal)


def int32(value, name):
    """value as a Python int within int32 (integer types only: 2.7 is refused,
    not truncated)."""
    try:
        n = operator.index(value)
    except TypeError:
        raise InvalidArgumentError("%s: expected an integer, got %r" % (name, value)) from None
    if not INT32_MIN <= n <= INT32_MAX:
        raise InvalidArgumentError("%s: %d is outside int32 [%d, %d]" % (name, n, INT32_MIN, INT32_MAX))
    return n


def float32(value, name, zero_means):
    """value as a float that float32 holds finite, and nonzero unless it is 0
    (zero_means says what 0 selects, for the message). The test is the
    narrowing itself, so the bounds are exact."""
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise InvalidArgumentError("%s: expected a number, got %r" % (name, value)) from None
    if x == 0.0:
        return 0.0
    f = ctypes.c_float(x).value
    if not math.isfinite(f):
        raise InvalidArgumentError("%s: %r is not a finite float32 (|%s| <= %.8g)"
                                   % (name, value, name, FLT_MAX))
    if f == 0.0:
        raise InvalidArgumentError(
            "%s: %r rounds to 0 in float32, which means %s; pass 0 for that, or a value "
            "float32 holds (|%s| >= %.7g)" % (name, value, zero_means, name, FLT_TRUE_MIN))
    return x
