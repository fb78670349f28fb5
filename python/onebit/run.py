"""torchrun's contract on one machine, for where torchrun is missing or broken (Debian 12's
fails at start):

    onebit-run --nproc_per_node=4 train.py --lr 3e-4      (or python3 -m onebit.run ...)

starts train.py once per local rank with the variables torchrun sets: RANK, WORLD_SIZE,
LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR and MASTER_PORT, so the same script
runs under torchrun, srun or this unchanged. --nnodes and --node_rank place this machine's
processes in a wider job (each node runs its own onebit-run with the same --master_addr).

The first process that fails ends the others (SIGTERM, then SIGKILL after --grace_s).
With --max_restarts K (torchrun's flag and meaning) the whole group is then started again,
up to K times, with TORCHELASTIC_RESTART_COUNT and TORCHELASTIC_MAX_RESTARTS set as
torchrun sets them; a job with a checkpoint.dir resumes from its last checkpoint (rank 0's
embedded coordinator reads the job's state there). Exit code 78 (onebit's "the job failed:
do not restart") ends the run at once. Once no restart is left, the failed process's exit
code is onebit-run's. SIGINT and SIGTERM are passed on to every process and
end the run without a restart.
--master_port 0 picks a free port whose next two (onebit's embedded coordinator: gRPC on
MASTER_PORT + 1, REST on + 2) are free too. --log_dir writes each rank's output to
rank-N.log there instead of this terminal.

torchrun's command lines run unchanged where they mean the same on one machine:
--standalone (one node, a free port), --nproc_per_node gpu, cpu or auto, -m/--module (the
script is a module, python -m), --no_python (the script is a program of its own),
--rdzv_endpoint HOST[:PORT] (with --rdzv_backend c10d or static: MASTER_ADDR and
MASTER_PORT), --rdzv_id (a name: no effect), and an --nnodes range whose two ends agree.
An elastic range (--nnodes=1:4) is an error: the world size is fixed.
"""
import argparse
import os
import random
import signal
import socket
import subprocess
import sys
import time


def _ephemeral_low():
    """The lowest port of the kernel's range for port-0 binds and outgoing connections."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def free_port_run(host="127.0.0.1", count=3):
    """A port p with p .. p + count - 1 free on host a moment ago.

    Drawn below the kernel's ephemeral range where there is room (as torchrun's 29500 is).
    There no outgoing connection of any process can take one of the ports between this
    probe and the coordinator's bind, as one did when p came from a port-0 bind.

    Args:
        host: The address to bind the ports on.
        count: How many consecutive ports must be free.

    Returns:
        The first port, p. SystemExit when 50 tries found none.
    """
    low = _ephemeral_low()
    lowest = 10000
    if low - count > lowest:
        candidates = [random.randrange(lowest, low - count + 1) for _ in range(50)]
    else:
        candidates = [None] * 50  # no room below: the kernel's choice
    for base in candidates:
        if base is None:
            with socket.socket() as s:
                s.bind((host, 0))
                base = s.getsockname()[1]
        if base + count - 1 > 65535:
            continue
        probes = []
        try:
            for port in range(base, base + count):
                probe = socket.socket()
                probes.append(probe)
                probe.bind((host, port))
            return base
        except OSError:
            continue
        finally:
            for probe in probes:
                probe.close()
    raise SystemExit(f"onebit-run: no {count} free consecutive ports on {host}")


def _nproc(value):
    """--nproc_per_node: a number, or torchrun's gpu, cpu or auto."""
    if value.isdigit():
        return int(value)
    if value not in ("gpu", "cpu", "auto"):
        raise argparse.ArgumentTypeError(f"{value} is not a number, gpu, cpu or auto")
    gpus = 0
    if value != "cpu":
        try:
            import torch  # noqa: PLC0415 (only for counting GPUs)
            gpus = torch.cuda.device_count()
        except ImportError:
            pass
        if value == "gpu" and gpus == 0:
            raise argparse.ArgumentTypeError("gpu: this machine has no GPU that torch sees")
    return gpus or os.cpu_count() or 1


def _nnodes(value):
    """--nnodes: N, or torchrun's MIN:MAX where both agree (a fixed world size)."""
    low, _, high = value.partition(":")
    if high and high != low:
        raise argparse.ArgumentTypeError(
            f"{value} is an elastic range: onebit's jobs have a fixed world size (give one "
            "number, or MIN:MAX with MIN = MAX)")
    try:
        return int(low)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value} is not a number of nodes") from None


def parse(argv):
    """onebit-run's command line, checked (`onebit-run --help` lists the flags). A bad one
    exits 2 with argparse's message.

    Args:
        argv: The arguments after the program's name.

    Returns:
        An argparse.Namespace; master_port is a number, picked where it was 0.
    """
    p = argparse.ArgumentParser(prog="onebit-run", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nproc_per_node", "--nproc-per-node", type=_nproc, default=1,
                   help="processes on this node: a number, or torchrun's gpu (one per GPU), "
                        "cpu (one per core) or auto (gpu where there are GPUs, else cpu)")
    p.add_argument("--nnodes", type=_nnodes, default=1,
                   help="nodes (torchrun's MIN:MAX where MIN = MAX)")
    p.add_argument("--node_rank", "--node-rank", type=int, default=0)
    p.add_argument("--master_addr", "--master-addr", default="127.0.0.1")
    p.add_argument("--master_port", "--master-port", type=int, default=None,
                   help="default 29500 (0 with --standalone: a free one)")
    p.add_argument("--log_dir", "--log-dir", help="each rank's output to LOG_DIR/rank-N.log")
    p.add_argument("--max_restarts", "--max-restarts", type=int, default=0,
                   help="after a failure, start the whole group again up to this many times")
    p.add_argument("--grace_s", type=float, default=15.0,
                   help="after SIGTERM, how long the others get before SIGKILL")
    p.add_argument("--standalone", action="store_true",
                   help="torchrun's: one node, on a free port (--master_port 0)")
    p.add_argument("-m", "--module", action="store_true",
                   help="the script is a module name: python -m SCRIPT")
    p.add_argument("--no_python", "--no-python", action="store_true",
                   help="the script is a program: run it without this Python")
    p.add_argument("--rdzv_endpoint", "--rdzv-endpoint",
                   help="torchrun's rendezvous HOST[:PORT]: the master address and port")
    p.add_argument("--rdzv_backend", "--rdzv-backend", default="static",
                   choices=("static", "c10d"),
                   help="torchrun's; both mean the fixed group onebit-run starts")
    p.add_argument("--rdzv_id", "--rdzv-id", help="torchrun's rendezvous name (no effect)")
    p.add_argument("script", help="the training script (run with this Python), or a module "
                                  "name with -m")
    p.add_argument("args", nargs=argparse.REMAINDER, help="its arguments")
    a = p.parse_args(argv)
    if a.standalone and a.nnodes != 1:
        p.error("--standalone runs one node: leave --nnodes out, or give 1")
    if a.master_port is None:
        a.master_port = 0 if a.standalone else 29500
    if a.rdzv_endpoint:
        host, colon, port = a.rdzv_endpoint.rpartition(":")
        if not colon:  # no port: the host alone
            host, port = a.rdzv_endpoint, ""
        a.master_addr = host.strip("[]") or a.master_addr
        if port:
            if not port.isdigit():
                p.error(f"--rdzv_endpoint {a.rdzv_endpoint}: the port is not a number")
            a.master_port = int(port)
    if a.module and a.no_python:
        p.error("-m and --no_python: give one")
    if a.nproc_per_node < 1 or a.nnodes < 1:
        p.error("--nproc_per_node and --nnodes must be >= 1")
    if a.max_restarts < 0:
        p.error("--max_restarts must be >= 0")
    if not 0 <= a.node_rank < a.nnodes:
        p.error(f"--node_rank must be in [0, {a.nnodes})")
    if not 0 <= a.master_port <= 65533:
        p.error("--master_port must be in [0, 65533] (onebit uses it, + 1 and + 2)")
    if a.master_port == 0:
        if a.nnodes > 1:
            p.error("--master_port 0 (a free one) works on one node only: the others must "
                    "know it")
        a.master_port = free_port_run(a.master_addr, 3)
    if not a.module and not a.no_python and not os.path.exists(a.script):
        p.error(f"{a.script}: no such file")
    return a


# onebit's members exit 78 when their job failed for good (coordinator/member.h).
JOB_FAILED = 78


def _signal_name(number):
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


class _Group:
    """This node's processes, started once per attempt."""

    def __init__(self, a):
        self.a, self.procs, self.logs = a, [], []
        self.signalled = False

    def rank(self, local):
        return self.a.node_rank * self.a.nproc_per_node + local

    def start(self, restart_count):
        a = self.a
        world = a.nnodes * a.nproc_per_node
        self.close()  # the previous attempt's logs
        self.procs, self.logs = [], []
        for local in range(a.nproc_per_node):
            rank = self.rank(local)
            env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(local),
                       LOCAL_WORLD_SIZE=str(a.nproc_per_node), GROUP_RANK=str(a.node_rank),
                       MASTER_ADDR=a.master_addr, MASTER_PORT=str(a.master_port),
                       TORCHELASTIC_RESTART_COUNT=str(restart_count),
                       TORCHELASTIC_MAX_RESTARTS=str(a.max_restarts))
            out = None
            if a.log_dir:
                os.makedirs(a.log_dir, exist_ok=True)
                # A restart appends, so that the log keeps what the failed attempt printed.
                out = open(os.path.join(a.log_dir, f"rank-{rank}.log"),
                           "a" if restart_count else "w")
                self.logs.append(out)
            command = ([a.script] if a.no_python else
                       [sys.executable, "-m", a.script] if a.module else
                       [sys.executable, a.script])
            self.procs.append(subprocess.Popen([*command, *a.args], env=env,
                                               stdout=out,
                                               stderr=subprocess.STDOUT if out else None))

    def forward(self, signum, _frame):
        self.signalled = True
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signum)

    def wait(self, restarts_left):
        """Until every process ended: (0, False), or the exit code of the first that failed
        (which ended the others) and whether the group starts again."""
        failed, again = None, False
        while True:
            ended = [proc.poll() for proc in self.procs].count(None) == 0  # polls every one
            if failed is None:
                failed = next((i for i, proc in enumerate(self.procs)
                               if proc.returncode not in (None, 0)), None)
                if failed is not None:
                    code = self.procs[failed].returncode
                    how = f"was killed by {_signal_name(-code)}" if code < 0 else \
                        f"exited with code {code}"
                    again, then = self.after(code, restarts_left)
                    print(f"onebit-run: rank {self.rank(failed)} {how}; {then}",
                          file=sys.stderr, flush=True)
                    self.stop()
                    continue
            if ended:
                break
            time.sleep(0.05)
        return (0, False) if failed is None else (self.procs[failed].returncode, again)

    def after(self, code, restarts_left):
        """What follows a failure with exit `code`, and the words for it: the group starts
        again where restarts are left, nobody signalled onebit-run, and the code is not
        onebit's 78 (the job failed: no restart fixes it)."""
        if restarts_left > 0 and not self.signalled and code == JOB_FAILED:
            return False, (f"stopping the others; exit code {JOB_FAILED} says the job failed "
                           "and no restart fixes it, so the group is not restarted")
        if restarts_left > 0 and not self.signalled:
            return True, "restarting the group"
        return False, "stopping the others"

    def stop(self):
        """SIGTERM to every process still running, SIGKILL after --grace_s."""
        for other in self.procs:
            if other.poll() is None:
                other.terminate()
        deadline = time.monotonic() + self.a.grace_s
        while any(o.poll() is None for o in self.procs) and time.monotonic() < deadline:
            time.sleep(0.05)
        for other in self.procs:
            if other.poll() is None:
                other.kill()

    def close(self):
        for out in self.logs:
            out.close()


def main(argv=None):
    """onebit-run: starts the processes and waits for them, restarting the group after a
    failure while --max_restarts allows.

    Args:
        argv: The command line's arguments; None: sys.argv[1:].

    Returns:
        The exit code: 0, the failed process's, or 128 + the signal that ended it.
    """
    a = parse(sys.argv[1:] if argv is None else argv)
    group = _Group(a)
    signal.signal(signal.SIGINT, group.forward)
    signal.signal(signal.SIGTERM, group.forward)
    restart = 0
    while True:
        group.start(restart)
        code, again = group.wait(a.max_restarts - restart)
        if not again:
            break
        restart += 1
        print(f"onebit-run: restart {restart} of at most {a.max_restarts}", file=sys.stderr,
              flush=True)
    group.close()
    # A process a signal ended: the shell's convention, 128 + the signal.
    return 128 - code if code < 0 else code


if __name__ == "__main__":
    sys.exit(main())
