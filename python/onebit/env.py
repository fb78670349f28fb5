"""Where this process stands in its job, read from the launcher's environment.

Three launchers are understood; for each value the first variable set wins:

    value              onebit's own          torchrun's          Slurm's (srun)
    rank               ONEBIT_RANK           RANK                SLURM_PROCID
    world size         ONEBIT_WORLD_SIZE     WORLD_SIZE          SLURM_NTASKS
    local rank         ONEBIT_LOCAL_RANK     LOCAL_RANK          SLURM_LOCALID
    local world size   ONEBIT_LOCAL_WORLD_SIZE  LOCAL_WORLD_SIZE  SLURM_NTASKS_PER_NODE,
                                                                 SLURM_TASKS_PER_NODE
    rendezvous host    -                     MASTER_ADDR         first of SLURM_JOB_NODELIST
    rendezvous port    -                     MASTER_PORT         (29500)

With none of them this is one process: rank 0 of 1. The coordinator is ONEBIT_COORDINATOR
(host:port) when set; otherwise rank 0 runs it inside its own process (the embedded
coordinator, onebit.torch) on MASTER_PORT + 1 (gRPC) and MASTER_PORT + 2 (REST), so that
MASTER_PORT itself stays free for torch.distributed's own store, and every rank finds it at
MASTER_ADDR:MASTER_PORT + 1.
"""
import os
import re
import socket

__all__ = ["rank", "world_size", "local_rank", "local_world_size", "Rendezvous", "rendezvous"]

DEFAULT_MASTER_PORT = 29500
COORDINATOR_PORT_OFFSET = 1  # gRPC; REST on the next port
_LOOPBACK = ("127.", "localhost", "::1")


def _first_int(names, default, environ):
    for name in names:
        value = environ.get(name)
        if value is None or value == "":
            continue
        m = re.match(r"^\s*(\d+)", value)  # SLURM_TASKS_PER_NODE: "4(x2),3"
        if not m:
            raise ValueError(f"${name} is {value!r}, not a whole number")
        return int(m.group(1))
    return default


def rank(environ=os.environ):
    """This process's rank in the job (0 when nothing says).

    Args:
        environ: The environment to read: os.environ, or a dict in its place.
    """
    return _first_int(("ONEBIT_RANK", "RANK", "SLURM_PROCID"), 0, environ)


def world_size(environ=os.environ):
    """The number of worker processes in the job (1 when nothing says).

    Args:
        environ: The environment to read: os.environ, or a dict in its place.
    """
    return _first_int(("ONEBIT_WORLD_SIZE", "WORLD_SIZE", "SLURM_NTASKS"), 1, environ)


def local_rank(environ=os.environ):
    """This process's rank among the workers on its machine: the GPU it takes.

    Args:
        environ: The environment to read: os.environ, or a dict in its place.
    """
    return _first_int(("ONEBIT_LOCAL_RANK", "LOCAL_RANK", "SLURM_LOCALID"), 0, environ)


def local_world_size(environ=os.environ):
    """The number of workers on this machine.

    Args:
        environ: The environment to read: os.environ, or a dict in its place.
    """
    return _first_int(("ONEBIT_LOCAL_WORLD_SIZE", "LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE",
                       "SLURM_TASKS_PER_NODE"), 1, environ)


def restart_count(environ=os.environ):
    """How many times a launcher restarted this process's group (torchrun's and onebit-run's
    TORCHELASTIC_RESTART_COUNT; 0 when nothing says)."""
    return _first_int(("TORCHELASTIC_RESTART_COUNT",), 0, environ)


def max_restarts(environ=os.environ):
    """The launcher's --max_restarts (TORCHELASTIC_MAX_RESTARTS), or None when not launched
    by one that restarts."""
    return _first_int(("TORCHELASTIC_MAX_RESTARTS",), None, environ)


def first_slurm_host(nodelist):
    """The first host of a Slurm node list: "node[03-05,7],gpu1" -> "node03"."""
    nodelist = nodelist.strip()
    m = re.match(r"^([^,\[]+)(?:\[([^\]]+)\])?", nodelist)
    if not m or not m.group(1):
        raise ValueError(f"$SLURM_JOB_NODELIST {nodelist!r} names no host")
    prefix, ranges = m.group(1), m.group(2)
    if not ranges:
        return prefix
    first = ranges.split(",")[0].split("-")[0]
    return prefix + first


class Rendezvous:
    """How this process finds its job's coordinator: rendezvous() makes one. Each argument
    is an attribute of the same name.

    Args:
        coordinator: host:port of the coordinator every rank dials; None where this process
            runs it alone on a free port.
        embedded: True where this process (rank 0) runs the coordinator.
        bind_host: Where the embedded coordinator listens; None when not embedded.
        grpc_port: The embedded coordinator's gRPC port (0: a free one); None when not
            embedded.
        rest_port: Its REST port, the next one (0: a free one); None when not embedded.
        host: This worker's own address, for gloo and /metrics.
    """

    def __init__(self, coordinator, embedded, bind_host, grpc_port, rest_port, host):
        self.coordinator = coordinator  # host:port every rank dials
        self.embedded = embedded        # True: this process (rank 0) runs it
        self.bind_host = bind_host      # where the embedded coordinator listens
        self.grpc_port = grpc_port
        self.rest_port = rest_port
        self.host = host                # this worker's own address (gloo, /metrics)

    def __repr__(self):
        return (f"Rendezvous(coordinator={self.coordinator!r}, embedded={self.embedded}, "
                f"host={self.host!r})")


def _own_address(toward):
    """The local address this machine uses to reach `toward` (no packet is sent)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((toward, 9))
            return s.getsockname()[0]
    except OSError:
        return socket.gethostname()


def rendezvous(coordinator=None, environ=os.environ):
    """Where the coordinator is, and whether this process must run it.

    Args:
        coordinator: host:port of a running coordinator; None: $ONEBIT_COORDINATOR, else
            rank 0 runs it on MASTER_PORT + 1.
        environ: The environment to read: os.environ, or a dict in its place.

    Returns:
        A Rendezvous. ValueError for a MASTER_PORT or ONEBIT_COORDINATOR_PORT that is no
        port.
    """
    explicit = coordinator or environ.get("ONEBIT_COORDINATOR")
    master = environ.get("MASTER_ADDR")
    if not master and environ.get("SLURM_JOB_NODELIST"):
        master = first_slurm_host(environ["SLURM_JOB_NODELIST"])
    port_text = environ.get("MASTER_PORT")
    if port_text is not None and not port_text.isdigit():
        raise ValueError(f"$MASTER_PORT is {port_text!r}, not a port")
    loopback = not master or master.startswith(_LOOPBACK)
    host = environ.get("ONEBIT_HOST") or ("127.0.0.1" if loopback else _own_address(master))
    if explicit:
        return Rendezvous(explicit, False, None, None, None, host)
    if world_size(environ) == 1 and not master and port_text is None:
        # Alone: nobody needs to find it, so any free port.
        return Rendezvous(None, True, "127.0.0.1", 0, 0, host)
    master = master or "127.0.0.1"
    base = int(port_text) if port_text is not None else DEFAULT_MASTER_PORT
    grpc_port = base + COORDINATOR_PORT_OFFSET
    # $ONEBIT_COORDINATOR_PORT: another port than MASTER_PORT + 1 (and + 2 for REST), where
    # those are another service's; every rank must be given the same.
    given = environ.get("ONEBIT_COORDINATOR_PORT")
    if given is not None:
        if not given.isdigit() or not 0 < int(given) < 65535:
            raise ValueError(f"$ONEBIT_COORDINATOR_PORT is {given!r}, not a port below 65535")
        grpc_port = int(given)
        if base in (grpc_port, grpc_port + 1):
            raise ValueError(f"$ONEBIT_COORDINATOR_PORT {grpc_port} collides with MASTER_PORT "
                             f"{base} (torch.distributed's store) or the REST port after it")
    if grpc_port + 1 > 65535:
        raise ValueError(f"$MASTER_PORT {base} leaves no room for the coordinator's ports "
                         f"({grpc_port} and {grpc_port + 1})")
    embedded = rank(environ) == 0
    # Rank 0 listens where the others dial: MASTER_ADDR itself when it is loopback, every
    # interface otherwise (as torch.distributed's store does).
    bind = master if loopback else "0.0.0.0"
    return Rendezvous(f"{master}:{grpc_port}" if ":" not in master else f"[{master}]:{grpc_port}",
                      embedded, bind, grpc_port, grpc_port + 1, host)
