"""Exceptions of the FlashCore binding.

Every non-OK fc_status of the C library becomes one of these, carrying the
status number and the library's fc_last_error() message. Checks the binding
makes itself before calling the library raise the same classes (status
FC_ERR_INVALID_ARGUMENT or FC_ERR_UNSUPPORTED), so callers catch one hierarchy.
"""

# Pinned fc_status values (flashcore.h: "The numeric values are pinned").
OK = 0
ERR_INVALID_ARGUMENT = 1
ERR_UNSUPPORTED = 2
ERR_OUT_OF_MEMORY = 3
ERR_CUDA = 4
ERR_NO_DEVICE = 5
ERR_INTERNAL = 6

STATUS_NAMES = {
    OK: "FC_OK",
    ERR_INVALID_ARGUMENT: "FC_ERR_INVALID_ARGUMENT",
    ERR_UNSUPPORTED: "FC_ERR_UNSUPPORTED",
    ERR_OUT_OF_MEMORY: "FC_ERR_OUT_OF_MEMORY",
    ERR_CUDA: "FC_ERR_CUDA",
    ERR_NO_DEVICE: "FC_ERR_NO_DEVICE",
    ERR_INTERNAL: "FC_ERR_INTERNAL",
}


class FlashCoreError(Exception):
    """A FlashCore call failed. `.status` is the fc_status number, `.message`
    the library's (or the binding's) explanation."""

    default_status = ERR_INTERNAL

    def __init__(self, message, status=None):
        super().__init__(message)
        self.message = message
        self.status = self.default_status if status is None else int(status)

    @property
    def status_name(self):
        return STATUS_NAMES.get(self.status, "unknown status %d" % self.status)


class InvalidArgumentError(FlashCoreError, ValueError):
    """FC_ERR_INVALID_ARGUMENT: a bad shape, stride, dtype, pointer, option."""

    default_status = ERR_INVALID_ARGUMENT


class UnsupportedError(FlashCoreError):
    """FC_ERR_UNSUPPORTED: a valid request that no built kernel handles."""

    default_status = ERR_UNSUPPORTED


class OutOfMemoryError(FlashCoreError, MemoryError):
    """FC_ERR_OUT_OF_MEMORY: a host or device allocation failed."""

    default_status = ERR_OUT_OF_MEMORY


class CudaError(FlashCoreError):
    """FC_ERR_CUDA: a CUDA runtime call or launch failed."""

    default_status = ERR_CUDA


class NoDeviceError(FlashCoreError):
    """FC_ERR_NO_DEVICE: CUDA was asked for but no usable device is there."""

    default_status = ERR_NO_DEVICE


class InternalError(FlashCoreError):
    """FC_ERR_INTERNAL (or an unknown status): a bug in FlashCore."""

    default_status = ERR_INTERNAL


class LibraryNotFoundError(FlashCoreError, ImportError):
    """libflashcore could not be found or loaded (no fc_status involved)."""

    default_status = ERR_INTERNAL


_CLASSES = {
    ERR_INVALID_ARGUMENT: InvalidArgumentError,
    ERR_UNSUPPORTED: UnsupportedError,
    ERR_OUT_OF_MEMORY: OutOfMemoryError,
    ERR_CUDA: CudaError,
    ERR_NO_DEVICE: NoDeviceError,
    ERR_INTERNAL: InternalError,
}


def error_for_status(status, message):
    """The exception for a non-OK status (unknown values give InternalError)."""
    cls = _CLASSES.get(int(status), InternalError)
    return cls(message or STATUS_NAMES.get(int(status), "unknown status"), status)
