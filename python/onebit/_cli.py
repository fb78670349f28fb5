"""The commands a pip-installed onebit puts on PATH: each runs the binary the wheel holds
(onebit/bin/, the layout of bazel-bin), with the same arguments and exit status."""
import os
import sys

BIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin")


def _exec(relative, extra=()):
    path = os.path.join(BIN, relative)
    if not os.access(path, os.X_OK):
        sys.exit(f"onebit: {path} is missing: this onebit was not installed from its wheel "
                 "(python/wheel/build.sh builds one)")
    os.execv(path, [os.path.basename(path), *extra, *sys.argv[1:]])


def coordinator():
    _exec("coordinator/onebit-coordinator")


def server():
    _exec("server/onebit-server")


def worker():
    _exec("worker/onebit-worker")


def ctl():
    _exec("tools/onebitctl")


def launch():
    given = any(a == "--bin_dir" or a.startswith("--bin_dir=") for a in sys.argv[1:])
    _exec("deploy/onebit-launch", () if given else ("--bin_dir=" + BIN,))


def run():
    """onebit-run: torchrun's variables for N local processes (onebit/run.py)."""
    from onebit import run as _run  # noqa: PLC0415
    sys.exit(_run.main())
