"""transport.launcher = ray: the run's workers as Ray actors on a Ray cluster (transport.ray.address).

Each actor (WorkerHost) runs the same worker as a local slot, `python -m nodes.worker`, as its
child process, on whichever node Ray places it with transport.ray.num_cpus_per_worker CPUs and
num_gpus_per_worker GPUs (Ray sets CUDA_VISIBLE_DEVICES, so device=auto trains on the GPU it was
given). The worker connects back over tcp to the address the server advertises, with the run's
CURVE key pair, which reaches the actor as an argument through Ray's own channel. The server's
copy of the nodes package goes with the job (Ray's py_modules): every node trains with the
server's code and needs only the dependencies.

To the pool an actor is a process (nodes.transport.roster.Process): a worker whose actor dies, or whose
node is lost, has died like a local one, and its slot is restarted alike. Ray ends the actors
when the server's connection to the cluster ends, however the server ends; close() kills them.
Ray is imported only here, and only when a run asks for it.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nodes.contracts.keys import host_of, is_local_address, worker_keys_env
from nodes.contracts.schema import Launcher
from nodes.transport import supervisor
from nodes.transport.inbound import AddressError

if TYPE_CHECKING:
    from nodes.contracts.keys import ServerKeys
    from nodes.contracts.schema import TransportConfig

log = logging.getLogger("dpfl.server")
NODES_DIR = Path(__file__).resolve().parents[1]
CLUSTER_ADDRESS = re.compile(r"(ray://)?(?P<host>[^\s/:]+):(?P<port>\d{1,5})")
ADDRESS_FORMS = "'' (a Ray instance on this machine) | auto | HOST:PORT | ray://HOST:PORT"
PROBE_S = 5.0  # how long a cluster address gets to accept a connection: ray.init itself retries forever
ACTOR_LOST = 1  # the exit status the pool sees for a worker whose actor died under it
WILDCARDS = ("*", "0.0.0.0", "::")


class RayLaunchError(AddressError):
    """Ray cannot be reached or cannot host the workers: refused in one line before anything ran."""


def launcher_problem(t: TransportConfig) -> str:
    """'' if the transport's launcher can start the run's workers; else the one-line reason (no Ray import)."""
    if not Launcher.admits(t.launcher):
        return f"transport.launcher = {t.launcher!r}: expected {Launcher.describe()}"
    if t.launcher != Launcher.RAY:
        return ""
    if not t.address.startswith("tcp://"):
        return (
            f"transport.address = {t.address!r}: expected tcp://HOST:PORT with transport.launcher = ray "
            "(its workers connect over the network; tcp://0.0.0.0:PORT listens on every interface)"
        )
    a = t.ray.address
    m = CLUSTER_ADDRESS.fullmatch(a)
    if a not in ("", "auto") and not (m and 1 <= int(m["port"]) <= 65535):
        return f"transport.ray.address = {a!r}: expected {ADDRESS_FORMS}, PORT in 1..65535"
    import importlib.util

    if importlib.util.find_spec("ray") is None:
        return "transport.launcher = 'ray': expected Ray installed (pip install 'dpfl-emulator[ray]')"
    return ""


class WorkerHost:
    """A Ray actor that runs one worker, nodes.worker, as its child: the worker exits when the actor
    is gone (--parent), and the actor outlives a worker that ended only until the pool sees it."""

    def start(self, argv: list[str], env: dict[str, str]) -> tuple[str, str, int]:
        """Start the worker; (this node's address, its Ray node id, the worker's pid)."""
        ray = _import_ray()
        command = [sys.executable, *argv, "--parent", str(os.getpid())]
        self.proc = subprocess.Popen(command, env={**os.environ, **env})
        return ray.util.get_node_ip_address(), ray.get_runtime_context().get_node_id(), self.proc.pid

    def wait(self) -> int:
        """The worker's exit status, once it has ended."""
        return self.proc.wait()


class RayWorker:
    """One actor, as the pool sees a process: poll, wait, kill."""

    def __init__(self, ray: Any, name: str, actor: Any, started: Any):
        self.ray, self.name, self.actor, self.started = ray, name, actor, started
        self.ended = actor.wait.remote()
        self.returncode: int | None = None
        self.killed = False  # by us: its actor's end is no news

    def poll(self) -> int | None:
        if self.returncode is None and self.ray.wait([self.ended], timeout=0)[0]:
            self._end()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.poll() is None:
            if not self.ray.wait([self.ended], timeout=timeout)[0]:
                raise subprocess.TimeoutExpired(self.name, timeout or 0)
            self._end()
        assert self.returncode is not None  # set by _end
        return self.returncode

    def kill(self) -> None:
        self.killed = True
        self.ray.kill(self.actor, no_restart=True)

    def _end(self) -> None:
        try:
            self.returncode = self.ray.get(self.ended)
        except self.ray.exceptions.RayError as e:  # the actor died, or its node
            if not self.killed:
                log.warning("worker %s: its Ray actor ended: %s", self.name, _first_line(e))
            self.returncode = ACTOR_LOST
        self.kill()  # an idle actor would hold the CPUs and GPUs its slot's restart needs


class RayLauncher:
    """Connects to the cluster (transport.ray.address) and starts workers there
    (nodes.transport.supervisor.WorkerLauncher)."""

    kind = Launcher.RAY.value

    def __init__(self, transport: TransportConfig):
        problem = launcher_problem(transport)
        if problem:
            raise RayLaunchError(problem)
        self.ray, self.cfg = _import_ray(), transport.ray
        self.workers: list[RayWorker] = []
        self.placed: dict[str, dict[str, Any]] = {}  # worker name -> its node's address and Ray id, its pid there
        # a process already connected (a notebook) keeps its connection, and then ships no code
        self.own_connection = not self.ray.is_initialized()
        if self.own_connection:
            self._connect()
        try:
            self._check_resources()
        except BaseException:
            self.close()
            raise
        if self.cfg.address and is_local_address(transport.address):
            log.warning(
                "transport.address = %r is loopback: only workers on this machine can reach it", transport.address
            )
        self.host = self.ray.remote(WorkerHost).options(
            num_cpus=self.cfg.num_cpus_per_worker,
            num_gpus=self.cfg.num_gpus_per_worker,
            max_restarts=0,  # the pool restarts a slot itself, under a new name, counted
            max_task_retries=0,
            scheduling_strategy="SPREAD",  # over the nodes, not packed onto the first: a lost node loses fewer
        )

    def _connect(self) -> None:
        a = self.cfg.address
        m = CLUSTER_ADDRESS.fullmatch(a)
        if m:
            host, port = m["host"], m["port"]
            try:
                socket.create_connection((host, int(port)), timeout=PROBE_S).close()
            except OSError as e:
                raise RayLaunchError(
                    f"transport.ray.address = {a!r}: nothing answers at {host}:{port} ({e.strerror or e})"
                ) from None
        local = {} if a else {"include_dashboard": False}  # only a new instance takes these
        # ray.init makes SIGTERM a SystemExit: the server's own handling (a stop like Ctrl-C) stays
        on_sigterm = signal.getsignal(signal.SIGTERM)
        try:
            self.ray.init(
                address=a or None,
                runtime_env={"py_modules": [str(NODES_DIR)]},
                logging_level=logging.WARNING,
                **local,
            )
        except Exception as e:  # Ray's own: ConnectionError, ValueError (no ray[client]), RuntimeError...
            raise RayLaunchError(
                f"transport.ray.address = {a!r}: Ray did not connect ({type(e).__name__}: {_first_line(e)})"
            ) from None
        finally:
            if on_sigterm is not None and threading.current_thread() is threading.main_thread():  # may set it
                signal.signal(signal.SIGTERM, on_sigterm)

    def _check_resources(self) -> None:
        """A worker that no node can host would wait forever to be placed: refuse it now."""
        have = self.ray.cluster_resources()
        for key, need, name in (
            ("num_cpus_per_worker", self.cfg.num_cpus_per_worker, "CPU"),
            ("num_gpus_per_worker", self.cfg.num_gpus_per_worker, "GPU"),
        ):
            if need > have.get(name, 0):
                raise RayLaunchError(
                    f"transport.ray.{key} = {need:g}: expected at most the {have.get(name, 0):g} {name}s "
                    "of the Ray cluster"
                )

    def start(self, name: str, address: str, keys: ServerKeys | None, max_bytes: int) -> RayWorker:
        argv = [
            *supervisor.WORKER_COMMAND[1:],  # the interpreter is the node's own
            "--connect",
            self._advertised(address),
            "--id",
            name,
            "--max-message-bytes",
            str(max_bytes),
        ]
        actor = self.host.remote()
        w = RayWorker(self.ray, name, actor, actor.start.remote(argv, worker_keys_env(keys) if keys else {}))
        self.workers.append(w)
        return w

    def _advertised(self, bound: str) -> str:
        """The server's address as the cluster reaches it: a wildcard bind becomes this node's address."""
        host = host_of(bound)
        if host in WILDCARDS:
            host = self.ray.util.get_node_ip_address()
        return f"tcp://{f'[{host}]' if ':' in host else host}:{bound.rsplit(':', 1)[1]}"

    def placements(self) -> dict[str, dict[str, Any]]:
        """Every worker started so far that got a node: its name -> {node, node_id, pid} (for run.json)."""
        if self.ray.is_initialized():
            for w in self.workers:
                if w.name not in self.placed and self.ray.wait([w.started], timeout=0)[0]:
                    try:
                        node, node_id, pid = self.ray.get(w.started)
                    except self.ray.exceptions.RayError:  # its actor died before the worker started
                        continue
                    self.placed[w.name] = {"node": node, "node_id": node_id, "pid": pid}
        return dict(self.placed)

    def close(self) -> None:
        """Kill every actor (their workers follow); disconnect if this launcher connected."""
        if not self.ray.is_initialized():
            return
        self.placements()  # while they can still be asked
        for w in self.workers:
            w.kill()
        if self.own_connection:
            self.ray.shutdown()


def _import_ray() -> Any:
    """Ray, typed as Any: whether it is installed must not change what the type checker says."""
    import importlib

    return importlib.import_module("ray")


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [""])[0][:300]
