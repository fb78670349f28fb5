"""The processes an optimizer's job needs beside its worker, and this process's end: rank
0's embedded coordinator and a node's parameter-server shard (_Processes, _NodeShard),
which end with the job; one optimizer in a job at a time per process (_BUILT); and what
the script's end does to its optimizers: they close at its exit (atexit), an uncaught
OnebitError exits with the code the job's verdict asks for, an uncaught ScriptError fails
the job on every rank (the excepthook), and a rank a launcher started dies with it.
"""

import atexit
import os
import sys
import weakref

from onebit import env as _env
from onebit._core import _core
from onebit._errors import OnebitError, ScriptError, ScriptValueError
from onebit._job import _code_digest
from onebit.env import local_rank, local_world_size, rank

_BUILT = weakref.WeakSet()  # this process's optimizers: one at a time may be in a job


def _exit_with_the_workers_code(kind, value, tb):
    """An OnebitError nobody caught ends the script with the code the coordinator asked
    for (75: the job recovers, restart me; 78: the job failed, do not restart), as
    onebit-worker would exit."""
    _previous_excepthook[0](kind, value, tb)
    if isinstance(value, OnebitError):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(value.exit_code)
    what = f"the script raised {kind.__name__}: {value}"
    if isinstance(value, (ScriptError, KeyboardInterrupt)):
        # No restart fixes it (a Ctrl-C is the user's word): the job fails on every rank.
        for opt in list(_BUILT):
            if not (opt._closed or opt._done):
                opt.close(what, restartable=False)
            opt._close_processes()
        if isinstance(value, ScriptError):
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(78)
        return  # KeyboardInterrupt: Python's own exit (130)
    _uncaught.append(what)


# The script's uncaught exception (the end-of-script close names it, and lets the job
# recover from it, as from a lost process: a restart may fix it).
_uncaught = []


_previous_excepthook = [None]


def _die_with_the_launcher():
    """A rank a launcher started (torchrun, onebit-run, srun: RANK or the like is set) gets
    SIGTERM when the launcher dies, so that a SIGKILLed launcher leaves no orphans that
    train on (Linux's PR_SET_PDEATHSIG; elsewhere nothing). Once, at the first optimizer."""
    if _previous_excepthook[0] is not None or not sys.platform.startswith("linux"):
        return
    if not any(os.environ.get(v) for v in ("RANK", "ONEBIT_RANK", "SLURM_PROCID")):
        return
    import ctypes  # noqa: PLC0415
    import signal  # noqa: PLC0415
    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def _install_excepthook():
    """Puts _exit_with_the_workers_code before the script's own sys.excepthook, once the
    first optimizer is built: importing onebit.torch changes nothing global."""
    if _previous_excepthook[0] is None:
        _previous_excepthook[0] = sys.excepthook
        sys.excepthook = _exit_with_the_workers_code


def _track(opt):
    """Makes `opt` one of this process's optimizers: closed at the script's exit
    (opt._at_exit, told the script's uncaught exception, if any) and by the excepthook. The
    first one makes this process die with its launcher, and installs the excepthook."""
    me = weakref.ref(opt)
    atexit.register(lambda: me() is not None and me()._at_exit(_uncaught[-1] if _uncaught
                                                               else None))
    _BUILT.add(opt)
    _die_with_the_launcher()
    _install_excepthook()


def _refuse_a_second_member(opt):
    """Each optimizer is this rank's member of a job: a second one in the job at once
    would be a second member of the same rank (and rank 0's a second coordinator on
    MASTER_PORT + 1)."""
    if any(other is not opt and other._in_job() for other in list(_BUILT)):
        raise ScriptValueError(
            "another onebit optimizer of this process is still in its job: one at a "
            "time, since each is this rank's member of a job. Put every parameter into "
            "one optimizer (param groups for their own lr and weight_decay); optimizers "
            "that step by turns in one loop (a GAN's generator and discriminator) are "
            "not supported")


class _NodeShard:
    """A parameter-server shard run by this process for its node (exchange.servers
    "per_node"): onebit-server as a child process, which registers with the job's
    coordinator as shard `index` and ends with the job, or with this process."""

    def __init__(self, config_path, coordinator, index, host, job_key):
        import subprocess  # noqa: PLC0415
        binary = self.binary()
        argv = [binary, "--config=" + config_path, "--coordinator=" + coordinator,
                f"--shard={index}", "--host=" + host, "--port=0", "--metrics_port=0",
                "--job_key=" + job_key]
        token_file = os.environ.get("ONEBIT_MEMBER_TOKEN_FILE")
        if token_file:
            argv.append("--member_token_file=" + token_file)
        self.index = index
        self.process = subprocess.Popen(argv, preexec_fn=self._die_with_parent)
        print(f"onebit: this node's shard {index} runs as process {self.process.pid} "
              f"({binary})", file=sys.stderr, flush=True)

    @staticmethod
    def binary():
        """onebit-server: $ONEBIT_SERVER_BIN, else the wheel's (onebit/bin/server/), else
        Bazel's beside the extension (bazel-bin/server/)."""
        given = os.environ.get("ONEBIT_SERVER_BIN")
        if given:
            return given
        here = os.path.dirname(_core().lib().path)
        for path in (os.path.join(here, "bin", "server", "onebit-server"),
                     os.path.join(here, os.pardir, "server", "onebit-server")):
            if os.access(path, os.X_OK):
                return os.path.normpath(path)
        raise OnebitError('onebit.exchange.servers "per_node" needs onebit-server: install the '
                          "wheel, build //server:onebit-server, or set ONEBIT_SERVER_BIN")

    @staticmethod
    def _die_with_parent():
        import ctypes  # noqa: PLC0415
        import signal  # noqa: PLC0415
        PR_SET_PDEATHSIG = 1  # Linux: SIGTERM to the shard when this process dies
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)

    def close(self, wait_s):
        """Waits up to wait_s for the shard to end with the job, then stops it (SIGTERM)."""
        import subprocess  # noqa: PLC0415
        try:
            self.process.wait(timeout=max(0.0, wait_s))
        except subprocess.TimeoutExpired:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()




class _Processes:
    """The processes this rank runs for its job (`job`, a written _Job) beside its worker:
    the job's coordinator, inside this process, where the rendezvous makes this rank 0 of
    a job without ONEBIT_COORDINATOR (then `coordinator` is set); and the node's shard,
    where exchange.servers is "per_node" and this is the node's local rank 0 (start_shard).
    `address` is the coordinator's, for the worker. Both end with the job (close)."""

    def __init__(self, job, coordinator):
        self.rendezvous = _env.rendezvous(coordinator)
        self.coordinator = None
        self.shard = None
        self.address = self.rendezvous.coordinator
        if self.rendezvous.embedded:
            job.say()  # the job's one coordinator says them once
            self.coordinator = self._start_coordinator(job)
            self.address = self.address or self.coordinator.address
            restart = _env.restart_count()
            if restart and not job.config["onebit"].get("checkpoint", {}).get("dir"):
                print(f"onebit: the launcher's restart {restart}, and the job has no "
                      "onebit.checkpoint.dir to resume from: it starts again at step 1 (give "
                      "it a checkpoint.dir on storage every node sees)", file=sys.stderr)

    def _start_coordinator(self, job):
        rv = self.rendezvous
        try:
            return _core().Coordinator(job.path, host=rv.bind_host, port=rv.grpc_port,
                                       rest_port=rv.rest_port, metrics_port=0,
                                       code_digest=_code_digest(), job_key=job.key)
        except (RuntimeError, ValueError, TimeoutError) as e:
            where = f"{rv.bind_host}:{rv.grpc_port}"
            raise OnebitError(
                f"rank 0 could not start the job's coordinator on {where} (MASTER_PORT + 1) "
                f"and {rv.rest_port} (MASTER_PORT + 2): {e}. Choose another MASTER_PORT, or "
                "set ONEBIT_COORDINATOR to a running onebit-coordinator") from e

    def start_shard(self, job):
        """exchange.servers "per_node": local rank 0 of each node runs the node's shard."""
        if job.node_shards and local_rank() == 0:
            self.shard = _NodeShard(job.path, self.address, rank() // local_world_size(),
                                    self.rendezvous.host, job.key)

    def close(self, job_over, timeout):
        """Rank 0 keeps the embedded coordinator until the job is over (every worker ran its
        last step, or the job failed), so that the others finish, then stops it: it waits
        up to `timeout` where this worker's job is over (`job_over`), else not. A node's
        shard ends with the job (it hears the end from the coordinator)."""
        if self.shard is not None:
            self.shard.close(wait_s=timeout if job_over else 5.0)
            self.shard = None
        if self.coordinator is None:
            return
        import time  # noqa: PLC0415
        # Only a job this worker finished can end while rank 0 waits.
        deadline = time.monotonic() + (timeout if job_over else 0.0)
        while self.coordinator.poll() == "running" and time.monotonic() < deadline:
            time.sleep(0.05)
        self.coordinator.close()  # once the others have heard the end (at most 5 s)
        self.coordinator = None

    def leave(self, what, restartable):
        """Rank 0 of a job whose coordinator it runs stops before the job's end: the job
        cannot go on without this process. Where a restart may fix the reason (the script
        raised, the worker stopped by itself), the job recovers, so that a launcher's restart
        resumes it from the state file (a job that is not running is left as it is); a
        loop that ended early would end early again: the job fails."""
        if self.coordinator is None:
            return
        reason = f"rank 0, which runs the job's coordinator, {what}"
        if restartable:
            self.coordinator.recover(reason)
        else:
            self.coordinator.abandon(reason)
