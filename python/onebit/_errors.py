"""The exceptions of onebit.torch: OnebitError (the worker stopped; its exit_code is the
job's verdict) and ScriptError with its ValueError and RuntimeError kinds (onebit's own
check of the training script failed).

Their public home is onebit.torch, and their __module__ says so: tracebacks print
onebit.torch.OnebitError, and pickles name it there.
"""


class ScriptError(Exception):
    """onebit's own check of the training script failed (a second optimizer, a parameter
    without a gradient, a gradient changed after it was sent, ...): no restart fixes it.
    Caught, it is the script's to handle; uncaught, the job fails on every rank and this
    process exits 78 ("do not restart"), as does every other rank. Raised as
    ScriptValueError or ScriptRuntimeError, so `except ValueError`/`RuntimeError` still
    catch them."""
    __module__ = "onebit.torch"


class ScriptValueError(ScriptError, ValueError):
    """A ScriptError that is a ValueError: the script asks what the optimizer cannot do (a
    second optimizer in the job, a parameter without a gradient, ...)."""
    __module__ = "onebit.torch"


class ScriptRuntimeError(ScriptError, RuntimeError):
    """A ScriptError that is a RuntimeError: the script did something at the wrong time (a
    gradient changed after it went to the exchange, a parameter given memory of its own)."""
    __module__ = "onebit.torch"


class OnebitError(RuntimeError):
    """The worker stopped: the job failed (exit_code 78: do not restart), or it recovers
    (75: restart me), or this worker hit an error of its own (1).

    Uncaught, it ends the script with its exit_code, as onebit-worker would exit.

    Args:
        message: Why the worker stopped, in the coordinator's words where it gave them.
        exit_code: The exit code the job's verdict asks of this process (the attribute of
            the same name): 78, 75 or 1.
    """
    __module__ = "onebit.torch"

    def __init__(self, message, exit_code=1):
        super().__init__(message)
        self.exit_code = exit_code
