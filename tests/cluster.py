"""Local Redis Cluster and Sentinel set-ups for the scale-out tests: real redis-server processes from the
binary project.devredis finds (no Docker), on free loopback ports, in temporary directories, always stopped."""

from __future__ import annotations

import atexit
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Callable, NamedTuple

import redis
from django.db import OperationalError
import redis.cluster

from project.devredis import PortTaken, find_binary, free_port

NODE_TIMEOUT_MS = 1000  # how long a silent master takes to be judged failed (cluster and sentinel alike)
SLOTS = 16384


def wait_for(condition: Callable[[], object], timeout: float, what: str) -> object:
    """Poll `condition` until it returns something true (errors count as not yet); raise after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            result = condition()
        except (redis.RedisError, OSError, OperationalError):  # SQLite's table locked by a writer meanwhile
            result = None
        if result:
            return result
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


def cluster_port() -> int:
    """A free port whose cluster bus port (port + 10000) is free too."""
    while True:
        port = free_port()
        if port + 10000 < 65536:
            try:
                with socket.socket() as probe:
                    probe.bind(("127.0.0.1", port + 10000))
                return port
            except OSError:
                pass


class Node:
    """One redis-server process with extra configuration lines; killed or stopped on request."""

    def __init__(self, directory: Path, *config: str, sentinel: bool = False,
                 choose: Callable[[], int] = free_port) -> None:
        for attempt in range(3):
            try:
                self._start(directory, choose(), config, sentinel)
                return
            except PortTaken:  # another process took the port between its choice and the start: choose again
                if attempt == 2:
                    raise

    def _start(self, directory: Path, port: int, config: tuple[str, ...], sentinel: bool) -> None:
        self.port = port
        self.directory = Path(tempfile.mkdtemp(prefix=f"{port}-", dir=directory))  # a failed start's beside it
        lines = [f"port {self.port}", "bind 127.0.0.1", 'save ""', "appendonly no", f"dir {self.directory}",
                 "repl-diskless-sync-delay 0", "loglevel warning", f"logfile {self.directory / 'log'}", *config]
        conf = self.directory / "redis.conf"
        conf.write_text("\n".join(lines) + "\n")
        command = [find_binary(), str(conf)] + (["--sentinel"] if sentinel else [])
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.client = redis.Redis(port=self.port, socket_connect_timeout=0.5, socket_timeout=2, decode_responses=True)
        try:  # the server answering must be this one: another process may hold the port (ours then exits)
            wait_for(lambda: self.process.poll() is not None or self._pid() == self.process.pid, 10,
                     f"redis-server on port {self.port}")
        except RuntimeError:
            self.kill()
            raise
        if self.process.poll() is not None:
            self.client.close()
            log = (self.directory / "log").read_text(errors="replace") if (self.directory / "log").exists() else ""
            error = PortTaken if "in use" in log else RuntimeError
            raise error(f"redis-server on port {self.port} exited: {log[-2000:]}")

    def _pid(self) -> int:
        return self.client.info("server")["process_id"]

    def kill(self) -> None:
        """Die at once, as a crashed server or a lost machine would."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()

    def crash(self) -> None:
        """kill(), and its address stays dead until stop(): the port is held (bound, not listening), so that no
        server another test starts meanwhile answers there, empty, for the dead one (a 200 where 503 was due)."""
        self.kill()
        self.held = socket.socket()
        self.held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # past the port's closed connections
        self.held.bind(("127.0.0.1", self.port))

    def stop(self) -> None:
        if getattr(self, "held", None) is not None:
            self.held.close()
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.kill()
        self.client.close()


def wait_replicated(master: Node, replica: Node, timeout: float = 10) -> None:
    """Until the replica has applied every write the master took (replication is asynchronous: writes of
    the last instant before a crash may never reach the replica)."""
    offset = master.client.info("replication")["master_repl_offset"]
    wait_for(lambda: replica.client.info("replication")["slave_repl_offset"] >= offset, timeout, "the replica to catch up")


class LocalCluster:
    """Three masters (or `masters`), each with one replica unless told, cluster-enabled; slots split evenly."""

    def __init__(self, masters: int = 3, replicas: bool = True) -> None:
        self.directory = Path(tempfile.mkdtemp(prefix="ratelimit-cluster-"))
        atexit.register(self.stop)  # even if the test run is interrupted before its fixture stops us
        self.masters: list[Node] = []
        self.replicas: list[Node] = []
        config = ("cluster-enabled yes", "cluster-config-file nodes.conf", f"cluster-node-timeout {NODE_TIMEOUT_MS}")
        try:
            self.masters = [Node(self.directory, *config, choose=cluster_port) for _ in range(masters)]
            self.replicas = [Node(self.directory, *config, choose=cluster_port)
                             for _ in range(masters if replicas else 0)]
            self._join()
        except BaseException:
            self.stop()
            raise

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.masters[0].port}"

    @property
    def nodes(self) -> list[Node]:
        return self.masters + self.replicas

    def _join(self) -> None:
        per_master = SLOTS // len(self.masters)
        for i, master in enumerate(self.masters):
            last = SLOTS if i == len(self.masters) - 1 else (i + 1) * per_master
            master.client.execute_command("CLUSTER ADDSLOTS", *range(i * per_master, last))
            master.client.execute_command("CLUSTER SET-CONFIG-EPOCH", i + 1)
        first = self.masters[0].client
        for node in self.nodes[1:]:
            first.execute_command("CLUSTER MEET", "127.0.0.1", node.port)
        for node in self.nodes:
            wait_for(lambda node=node: self._known_by(node) == len(self.nodes), 20, "every node to know the others")
        for master, replica in zip(self.masters, self.replicas):
            master_id = master.client.execute_command("CLUSTER MYID")
            wait_for(lambda: replica.client.execute_command("CLUSTER REPLICATE", master_id), 20, "a replica to attach")
        self.wait_healthy()

    @staticmethod
    def _known_by(node: Node) -> int:
        """How many nodes `node` knows and has finished its handshake with (itself included)."""
        nodes = node.client.execute_command("CLUSTER NODES")  # redis-py parses it: address -> fields
        return sum(1 for fields in nodes.values() if "handshake" not in fields["flags"] and "noaddr" not in fields["flags"])

    def wait_healthy(self, timeout: float = 30) -> None:
        """Every live node says the cluster is ok and every master has a replica in sync."""
        for node in self.nodes:
            if node.process.poll() is None:
                wait_for(lambda node=node: node.client.cluster("info")["cluster_state"] == "ok", timeout, "cluster_state ok")
        for replica in self.replicas:
            if replica.process.poll() is None and replica.client.info("replication")["role"] == "slave":
                wait_for(lambda replica=replica: replica.client.info("replication").get("master_link_status") == "up",
                         timeout, "replicas in sync")

    def whole(self) -> bool:
        """Whether every node still runs and answers at once (none was killed, stopped or frozen)."""
        for node in self.nodes:
            if node.process.poll() is not None:
                return False
            try:
                with redis.Redis(port=node.port, socket_connect_timeout=0.2, socket_timeout=0.2) as probe:
                    probe.ping()
            except redis.RedisError:
                return False
        return True

    def renew(self) -> None:
        """The same processes as a new cluster: keys, libraries, statistics, clients and membership gone,
        the slots split again. About 1 s (a reset master waits cluster-node-timeout before it takes writes)
        rather than a new process's 2 s (Redis's CLUSTER_WRITABLE_DELAY) and its start."""
        for node in self.nodes:
            client = node.client
            client.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")  # the last test's pools
            if client.info("replication")["role"] == "master":
                client.flushall()
            client.execute_command("CLUSTER", "RESET", "HARD")
            client.function_flush()
            client.script_flush()
            client.config_resetstat()
        self._join()

    def master_of(self, key: str) -> Node:
        """The node serving `key` now, as the cluster itself says."""
        live = next(node for node in self.nodes if node.process.poll() is None)
        with redis.cluster.RedisCluster(host="127.0.0.1", port=live.port) as client:
            port = client.get_node_from_key(key).port
        return next(node for node in self.nodes if node.port == port)

    def replica_of(self, master: Node) -> Node:
        return self.replicas[self.masters.index(master)]

    def flush(self) -> None:
        for node in self.nodes:
            if node.process.poll() is None and node.client.info("replication")["role"] == "master":
                node.client.flushall()

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()
        shutil.rmtree(self.directory, ignore_errors=True)


class LocalSentinel:
    """A master, its replica and one sentinel watching them (quorum 1), under a service name of its own
    (django-redis keeps one pool per LOCATION and process: a name used twice would reach a stopped sentinel)."""

    def __init__(self) -> None:
        self.directory = Path(tempfile.mkdtemp(prefix="ratelimit-sentinel-"))
        atexit.register(self.stop)  # even if the test run is interrupted before its fixture stops us
        self.nodes: list[Node] = []
        try:
            self.master = Node(self.directory)
            self.service = f"service{self.master.port}"
            self.nodes.append(self.master)
            self.replica = Node(self.directory, f"replicaof 127.0.0.1 {self.master.port}")
            self.nodes.append(self.replica)
            wait_for(lambda: self.replica.client.info("replication").get("master_link_status") == "up", 20, "the replica")
            self.sentinel = Node(
                self.directory,
                f"sentinel monitor {self.service} 127.0.0.1 {self.master.port} 1",
                f"sentinel down-after-milliseconds {self.service} {NODE_TIMEOUT_MS}",
                f"sentinel failover-timeout {self.service} 5000",
                sentinel=True,
            )
            self.nodes.append(self.sentinel)
            wait_for(lambda: self.sentinel.client.execute_command("SENTINEL", "REPLICAS", self.service), 20,
                     "the sentinel to find the replica")
        except BaseException:
            self.stop()
            raise

    def master_port(self) -> int:
        return int(self.sentinel.client.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.service)[1])

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()
        shutil.rmtree(self.directory, ignore_errors=True)


# --- for `make bench`: decisions/s against 1 and 3 masters, round trips per request on a cluster ------


class ClusterScaling(NamedTuple):
    one_master: float  # decisions/s, `processes` client processes, a cluster of 1 master
    three_masters: float  # the same against 3 masters
    processes: int
    trips_one_shard: float  # round trips of a request whose policies count one subject (typically all)
    trips_two_shards: float  # round trips (sends to nodes) of a request counting subjects in two shards


def measure_scaling(processes: int = 6, seconds: float = 2.0) -> ClusterScaling:
    """Start local clusters of 1 and 3 masters (no replicas: they would only take cores from the masters)
    and measure the engine against each (Django must be set up).

    Every process decides one fixed-window policy for subjects spread over every shard, so each master
    gets its share. On a machine with fewer cores than masters + processes the clients, not Redis, set
    the pace: read the ratio with the core count in mind.
    """
    from bench.measure import Wire, throughput
    from django.test.utils import override_settings

    from ratelimit_app import engine
    from ratelimit_app.engine import keys
    from tests.helpers import check, policy, subject

    limited = policy(limit=10**9, window=3600)
    rates = []
    for masters in (1, 3):
        cluster = LocalCluster(masters=masters, replicas=False)
        try:
            cache = {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": cluster.url, "OPTIONS": {
                "CONNECTION_FACTORY": "ratelimit_app.connection.ClusterConnectionFactory",
                "SOCKET_CONNECT_TIMEOUT": 0.25, "SOCKET_TIMEOUT": 0.25}}
            with override_settings(CACHES={"default": cache}, RATELIMIT_CACHE="default", RATELIMIT_SHARDS=16):
                def make_operation():
                    counter = iter(range(10**9))
                    return lambda: engine.decide([check(limited, f"ip:10.{next(counter) % 65536}.0.1")])

                make_operation()()  # loads the script before the processes fork
                rates.append(throughput(make_operation, processes=processes, seconds=seconds))
                if masters == 3:
                    one = [check(limited, "ip:10.0.0.1"), check(policy(limit=10**9, key="user"), "ip:10.0.0.1")]
                    names = (f"ip:10.1.0.{i}" for i in range(1000))
                    other = next(name for name in names if keys.shard_of(subject(name).key) != keys.shard_of(one[0].subject.key))
                    two = [one[0], check(one[1].policy, other)]
                    trips = []
                    for checks in (one, two):
                        engine.decide(checks)
                        wire = Wire()
                        with wire.watching():
                            for _ in range(100):
                                engine.decide(checks)
                        trips.append(wire.trips / 100)
            engine.breaker.reset()
        finally:
            cluster.stop()
    return ClusterScaling(rates[0], rates[1], processes, trips[0], trips[1])


def until_limited_again(request, timeout: float = 30.0) -> tuple[list[int], float]:
    """After a master died: the statuses `request()` answered until one was 429 again, and the seconds it took."""
    killed = time.monotonic()
    meanwhile = []
    while (status := request()) != 429:
        meanwhile.append(status)
        assert time.monotonic() - killed < timeout, "limiting did not resume"
        time.sleep(0.02)
    return meanwhile, time.monotonic() - killed
