"""Network namespaces joined by impaired links: a small real network on one machine (root only).

:class:`Topology` makes one namespace for the server side and one per client, and a
point-to-point link from each client namespace to the server namespace with its own /30
(``10.77.<k>.1`` on the server's side, ``10.77.<k>.2`` on the client's). These addresses exist
only inside the namespaces made here: the host's own interfaces, routes and firewall are not
touched, and no packet leaves these namespaces. Each link delays and drops packets in both
directions (:class:`Impairment`):

- with ``tc netem`` where the kernel has it (``sch_netem``): a veth pair per link, netem on
  both ends;
- otherwise with :class:`PacketPump`, a netem of this process: a TUN device at each end of
  the link and a thread that carries every IP packet from one to the other after the delay,
  or drops it. (The machines of this project run a kernel built without ``sch_netem``.)

A link is cut by setting its server-side interface down (``ip link set ... down``), as if its
cable were pulled, and restored by setting it up. :meth:`Topology.destroy` stops the pump,
reports and kills any process still inside a namespace, and deletes the namespaces (which
takes their interfaces with them).
"""

from __future__ import annotations

import dataclasses
import fcntl
import heapq
import os
import random
import selectors
import shutil
import struct
import subprocess
import threading
import time

TUNSETIFF = 0x400454CA
IFF_TUN = 0x0001
IFF_NO_PI = 0x1000


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    """Run ``ip ARGS``; raise with its message if it fails and ``check``."""
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done


def netns_unavailable(tag: str) -> str | None:
    """Why network namespaces cannot be made here, or ``None`` if they can."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "needs root to make network namespaces (ip netns add)"
    if shutil.which("ip") is None:
        return "needs the 'ip' command (iproute2)"
    probe = f"fedgo-{tag}-probe"
    made = ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"'ip netns add' fails here: {made.stderr.strip()}"
    try:
        run = subprocess.run(
            ["ip", "netns", "exec", probe, "true"], capture_output=True, text=True, timeout=30
        )
        if run.returncode != 0:
            return f"'ip netns exec' fails here: {run.stderr.strip()}"
    finally:
        ip("netns", "del", probe, check=False)
    return None


@dataclasses.dataclass(frozen=True)
class Impairment:
    """Per direction: each packet is dropped with probability ``loss``, else delayed by
    ``delay_ms`` plus a uniform jitter of up to ``jitter_ms`` either way."""

    delay_ms: float = 50.0
    jitter_ms: float = 10.0
    loss: float = 0.02

    def netem_args(self) -> list[str]:
        return [
            "netem",
            "delay",
            f"{self.delay_ms:g}ms",
            f"{self.jitter_ms:g}ms",
            "loss",
            f"{100 * self.loss:g}%",
        ]

    def __str__(self) -> str:
        return (
            f"delay {self.delay_ms:g} ms ± {self.jitter_ms:g} ms and loss {100 * self.loss:g}% "
            "each way"
        )


class PacketPump(threading.Thread):
    """Carries IP packets between the two TUN devices of each link, impaired like tc netem.

    A packet read from one end is dropped with probability ``loss``; otherwise it is written
    to the other end after ``delay ± jitter``, never before a packet that came earlier the same
    way (no reordering). A packet for an end that is down cannot be written and is lost, as on
    a cut cable. Seeded, so the drops follow the same sequence on every run.
    """

    def __init__(self, impairment: Impairment, seed: int = 0) -> None:
        super().__init__(name="packet-pump", daemon=True)
        self.impairment = impairment
        self.rng = random.Random(seed)
        self.peer: dict[int, int] = {}
        self.stats = {"forwarded": 0, "dropped": 0, "undeliverable": 0}
        self.error: BaseException | None = None
        self._stop_event = threading.Event()
        self._wake_r, self._wake_w = os.pipe()

    def add_link(self, fd_a: int, fd_b: int) -> None:
        if self.is_alive():
            raise RuntimeError("add links before starting the pump")
        self.peer[fd_a], self.peer[fd_b] = fd_b, fd_a

    def stop(self) -> None:
        self._stop_event.set()
        os.write(self._wake_w, b"x")
        if self.is_alive():
            self.join(timeout=10)
        for fd in [*self.peer, self._wake_r, self._wake_w]:
            try:
                os.close(fd)  # closing a TUN device's descriptor deletes the device
            except OSError:
                pass
        self.peer = {}

    def run(self) -> None:
        try:
            self._pump()
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc

    def _pump(self) -> None:
        imp = self.impairment
        selector = selectors.DefaultSelector()
        for fd in [*self.peer, self._wake_r]:
            selector.register(fd, selectors.EVENT_READ)
        queue: list[tuple[float, int, int, bytes]] = []  # (due, seq, out fd, packet)
        last_due = dict.fromkeys(self.peer, 0.0)
        seq = 0
        while not self._stop_event.is_set():
            timeout = max(0.0, queue[0][0] - time.monotonic()) if queue else 1.0
            for key, _ in selector.select(timeout):
                if key.fd == self._wake_r:
                    continue
                while True:
                    try:
                        packet = os.read(key.fd, 65536)
                    except (BlockingIOError, OSError):
                        break
                    if self.rng.random() < imp.loss:
                        self.stats["dropped"] += 1
                        continue
                    jitter = self.rng.uniform(-imp.jitter_ms, imp.jitter_ms)
                    due = time.monotonic() + (imp.delay_ms + jitter) / 1000
                    due = last_due[key.fd] = max(due, last_due[key.fd])
                    heapq.heappush(queue, (due, seq, self.peer[key.fd], packet))
                    seq += 1
            now = time.monotonic()
            while queue and queue[0][0] <= now:
                _, _, out, packet = heapq.heappop(queue)
                try:
                    os.write(out, packet)
                    self.stats["forwarded"] += 1
                except OSError:  # that end is down (a cut link)
                    self.stats["undeliverable"] += 1
        selector.close()


class LinksUnavailable(RuntimeError):
    """Neither tc netem nor TUN devices can be had here: links cannot be impaired."""


def open_tun(name: str) -> int:
    """A new TUN device ``name`` (IP packets, no extra header) in this namespace; its fd."""
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    try:
        fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH22x", name.encode(), IFF_TUN | IFF_NO_PI))
    except OSError:
        os.close(fd)
        raise
    return fd


class Topology:
    """A server namespace and ``num_nodes`` client namespaces, one impaired link each."""

    def __init__(self, tag: str, num_nodes: int, impairment: Impairment) -> None:
        self.tag = tag
        self.server = f"fedgo-{tag}-srv"
        self.nodes = [f"fedgo-{tag}-n{k}" for k in range(num_nodes)]
        self.impairment = impairment
        self.pump: PacketPump | None = None
        self.mode = ""
        self.made: list[str] = []

    @staticmethod
    def server_addr(k: int) -> str:
        return f"10.77.{k}.1"

    @staticmethod
    def node_addr(k: int) -> str:
        return f"10.77.{k}.2"

    def server_if(self, k: int) -> str:
        return f"srv{k}"

    def create(self) -> None:
        """Make the namespaces and links (netem if the kernel has it, else the pump)."""
        for ns in [self.server, *self.nodes]:
            ip("netns", "add", ns)
            self.made.append(ns)
            ip("-n", ns, "link", "set", "lo", "up")
        if self._netem_works():
            self.mode = "veth pairs with tc netem"
            for k in range(len(self.nodes)):
                self._veth_link(k)
        else:
            self.mode = "TUN pairs with a userspace netem (this kernel has no sch_netem)"
            self.pump = PacketPump(self.impairment, seed=12)
            for k in range(len(self.nodes)):
                self._tun_link(k)
            self.pump.start()

    def _netem_works(self) -> bool:
        ip("-n", self.server, "link", "add", "probe0", "type", "veth", "peer", "name", "probe1")
        try:
            tc = ["tc", "qdisc", "add", "dev", "probe0", "root", *self.impairment.netem_args()]
            cmd = ["ip", "netns", "exec", self.server, *tc]
            return subprocess.run(cmd, capture_output=True, timeout=30).returncode == 0
        finally:
            ip("-n", self.server, "link", "del", "probe0")

    def _address(self, ns: str, dev: str, addr: str, peer: str) -> None:
        ip("-n", ns, "addr", "add", addr, "peer", peer, "dev", dev)
        ip("-n", ns, "link", "set", dev, "up")

    def _veth_link(self, k: int) -> None:
        node_if = f"node{k}"
        peer = ["peer", "name", node_if, "netns", self.nodes[k]]
        ip("-n", self.server, "link", "add", self.server_if(k), "type", "veth", *peer)
        for ns, dev in [(self.server, self.server_if(k)), (self.nodes[k], node_if)]:
            tc = ["tc", "qdisc", "add", "dev", dev, "root", *self.impairment.netem_args()]
            subprocess.run(["ip", "netns", "exec", ns, *tc], check=True, capture_output=True)
        self._address(self.server, self.server_if(k), self.server_addr(k), self.node_addr(k))
        self._address(self.nodes[k], node_if, self.node_addr(k), self.server_addr(k))

    def _tun_link(self, k: int) -> None:
        assert self.pump is not None
        fds = []
        for ns, dev, addr, peer in [
            (self.server, self.server_if(k), self.server_addr(k), self.node_addr(k)),
            (self.nodes[k], f"node{k}", self.node_addr(k), self.server_addr(k)),
        ]:
            # Made in this namespace under a name unique on the machine, moved at once.
            tmp = f"fg{self.tag[-6:]}{dev[0]}{k}"
            try:
                fd = open_tun(tmp)
            except OSError as exc:
                raise LinksUnavailable(
                    f"this kernel has no sch_netem and TUN devices cannot be made ({exc})"
                ) from exc
            fds.append(fd)
            ip("link", "set", "dev", tmp, "netns", ns)
            ip("-n", ns, "link", "set", "dev", tmp, "name", dev)
            self._address(ns, dev, addr, peer)
        self.pump.add_link(*fds)

    def cut(self, k: int) -> None:
        ip("-n", self.server, "link", "set", self.server_if(k), "down")

    def restore(self, k: int) -> None:
        ip("-n", self.server, "link", "set", self.server_if(k), "up")

    def link_state(self, k: int) -> str:
        return ip("-n", self.server, "-br", "link", "show", self.server_if(k)).stdout

    def pids_inside(self) -> dict[str, list[int]]:
        """Processes still running in each namespace."""
        found = {}
        for ns in self.made:
            out = ip("netns", "pids", ns, check=False).stdout.split()
            if out:
                found[ns] = [int(p) for p in out]
        return found

    def destroy(self) -> dict[str, list[int]]:
        """Stop the pump, kill what still runs inside, delete the namespaces; return what
        was still running (it should be nothing)."""
        if self.pump is not None:
            self.pump.stop()
        left = self.pids_inside()
        for pids in left.values():
            for pid in pids:
                try:
                    os.kill(pid, 9)
                except ProcessLookupError:
                    pass
        for ns in reversed(self.made):
            ip("netns", "del", ns, check=False)
        return left

    def remaining(self) -> list[str]:
        """Namespaces of this topology that still exist."""
        listed = ip("netns", "list").stdout.split()
        return [ns for ns in self.made if ns in listed]
