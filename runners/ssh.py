"""The SSH transport, on fabric: strict host keys by default, connect retries, connect and run
timeouts, a heartbeat that finds a dead link within seconds, remote kill."""
from __future__ import annotations

import logging
import os
import shlex
import socket
import threading
import time
from functools import cache
from io import StringIO
from typing import Callable, Optional

import paramiko
from fabric import Config, Connection
from fabric.runners import Remote
from invoke.exceptions import CommandTimedOut

from inventory.model import Node
from runners.transport import (
    HARNESS_GRACE_S,
    HEARTBEAT_S,
    NODE_PATIENCE_S,
    Lease,
    Result,
    Transport,
    Unavailable,
    lease_argv,
    new_tag,
    node_timed_out,
)

DEFAULT_KNOWN_HOSTS = os.path.expanduser("~/.ssh/known_hosts")
LINK_DEAD_AFTER_S = 12  # no echo of a heartbeat this long: the node is unreachable
CONNECT_TRIES = 3
CONNECT_BACKOFF_S = 1.0  # before the second try; doubled before each one after

log = logging.getLogger("handover.ssh")


class AcceptNewPolicy(paramiko.MissingHostKeyPolicy):
    """ssh's StrictHostKeyChecking=accept-new: learn unknown hosts, never accept a changed key.

    A changed key never reaches a policy: paramiko raises BadHostKeyException first.
    """

    _lock = threading.Lock()

    def __init__(self, known_hosts: str):
        self.known_hosts = known_hosts

    def missing_host_key(self, client, hostname, key):
        line = f"{hostname} {key.get_name()} {key.get_base64()}\n"
        with self._lock:
            os.makedirs(os.path.dirname(self.known_hosts) or ".", mode=0o700, exist_ok=True)
            with open(self.known_hosts, "a", encoding="ascii") as out:
                out.write(line)


class _ChunkedInput(StringIO):
    """invoke asks a non-terminal stdin for one character per 10 ms tick, so a 2 KB payload
    took 20 s to ship; hand it whole chunks instead."""

    CHUNK = 64 * 1024

    def read(self, size: Optional[int] = -1) -> str:
        return super().read(self.CHUNK)


def _classify(exc: BaseException, connect_timeout: float) -> tuple[str, str]:
    """Map a connection error to a per-node outcome word and a one-line explanation."""
    if isinstance(exc, paramiko.BadHostKeyException):
        return "host-key", (f"host key for {exc.hostname} does not match known_hosts "
                            "(possible man-in-the-middle, or the node was reinstalled)")
    if isinstance(exc, paramiko.SSHException) and "not found in known_hosts" in str(exc):
        return "host-key", f"{exc} (add it with ssh-keyscan, or set ssh.host_keys: accept-new)"
    if isinstance(exc, paramiko.AuthenticationException):
        return "auth", f"authentication failed: {exc}"
    if isinstance(exc, (socket.timeout, TimeoutError)):
        return "unreachable", f"no answer within the connect timeout ({connect_timeout:g} s)"
    if isinstance(exc, (OSError, paramiko.SSHException, EOFError)):
        return "unreachable", f"{type(exc).__name__}: {exc}"
    return "error", f"{type(exc).__name__}: {exc}"


def _transient(exc: BaseException, failure: str) -> bool:
    """Worth another try: refused, reset or dropped while sshd starts or sheds load. Not a
    connect timeout (a dead node would cost it again), a name that does not resolve, a key or
    an authentication."""
    return failure == "unreachable" and not isinstance(exc, (socket.timeout, TimeoutError, socket.gaierror))


class _QuietRemote(Remote):
    """fabric's runner, without its busy waiting: invoke polls every 10 ms in two threads per
    command for as long as the command runs, which with a command on every node of a big
    cluster is most of the harness's CPU. It waits on paramiko's exit-status event instead,
    and its stdin thread hands the payload over, closes the node's stdin and ends."""

    def wait(self) -> None:
        while not (self.process_is_finished or self.has_dead_threads):
            self.channel.status_event.wait(0.5)

    def handle_stdin(self, input_, output, echo=False) -> None:
        while data := self.read_our_stdin(input_):
            self.write_proc_stdin(data)
        self.close_proc_stdin()


class AeadFirstTransport(paramiko.Transport):
    """paramiko's transport, offering AES-GCM first: its tag is checked inside the cipher, where
    a separate MAC is compared byte by byte in Python on every packet. The other ciphers stay
    on offer, in paramiko's order, for servers that do not take GCM."""

    _preferred_ciphers = tuple(sorted(paramiko.Transport._preferred_ciphers,  # type: ignore[attr-defined]
                                      key=lambda name: "-gcm@" not in name))


@cache
def _shared_config() -> Config:
    """One fabric Config for every connection, as fabric's own Group shares one: building it
    (and reading ~/.ssh/config) per node cost milliseconds each."""
    return Config(overrides={"run": {"hide": True, "warn": True}, "runners": {"remote": _QuietRemote}})


class SshLease(Lease):
    """One connection and its node-side watchdog, with the heartbeat that keeps both honest.

    Every HEARTBEAT_S the harness sends one byte on the lease's channel and waits for its echo:
    no echo for LINK_DEAD_AFTER_S means the link or the node is gone, and `on_lost` is told
    while the commands on the connection are still waiting (they end as unreachable).
    """

    def __init__(self, connection: Connection, tag: str, on_lost: Callable[[str], object]):
        super().__init__(tag)
        self.connection = connection
        self._on_lost = on_lost
        self._stopped = threading.Event()
        self._channel: Optional[paramiko.Channel] = None

    def start(self, *, root: bool, timeout: float) -> "SshLease":
        transport = self.connection.client.get_transport()
        if transport is None:
            raise EOFError("the connection closed before the watchdog started")
        channel = transport.open_session(timeout=timeout)
        channel.exec_command(shlex.join(lease_argv(self.tag, patience_s=NODE_PATIENCE_S, root=root)))
        self._channel = channel
        threading.Thread(target=self._beat, args=(channel,), daemon=True,
                         name=f"heartbeat-{self.connection.host}").start()
        return self

    @property
    def standing(self) -> bool:
        return not self._stopped.is_set() and self.connection.is_connected

    def close(self) -> None:
        self._stopped.set()
        self.connection.close()

    def closed_within(self, seconds: float) -> bool:
        """Whether the connection is down, or goes down within `seconds`: a channel that ends
        without an exit status is unlinked by paramiko a moment before the transport stops."""
        deadline = time.monotonic() + seconds
        while self.connection.is_connected and not self._stopped.is_set():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.02)
        return True

    def _beat(self, channel: paramiko.Channel) -> None:
        channel.settimeout(LINK_DEAD_AFTER_S)
        while not self._stopped.is_set():
            echo: Optional[bytes]
            try:
                channel.sendall(b".")
                echo = channel.recv(64)
            except socket.timeout:
                echo = None
            except (OSError, EOFError, paramiko.SSHException):
                echo = b""
            if self._stopped.is_set():
                return
            if echo is None:
                self._lost(f"no answer to SSH keepalives for {LINK_DEAD_AFTER_S} s")
                return
            if not echo:
                self._ended(channel)
                return
            self._stopped.wait(HEARTBEAT_S)

    def _lost(self, reason: str) -> None:
        """Say why first, then end the connection: the commands waiting on it return at once
        and find the reason."""
        self._on_lost(reason)
        self.close()

    def _ended(self, channel: paramiko.Channel) -> None:
        if self.closed_within(1.0):
            self._lost("the connection closed")
            return
        why = channel.recv_stderr(4096).decode(errors="replace").strip() if channel.recv_stderr_ready() else ""
        log.warning("%s: the node-side watchdog ended (%s); commands there are bounded by their "
                    "own timeouts only", self.connection.host, why or "it said nothing")


class SshTransport(Transport):
    """One fabric Connection per node, opened on first use and kept for the session."""

    def __init__(self, node: Node):
        super().__init__(node)
        self._connect_lock = threading.Lock()

    def _open(self) -> Lease:
        with self._connect_lock:
            lease = self._lease
            if lease is not None and lease.standing:
                return lease
            if lease is not None:
                lease.close()
            connection = self._connect()
            try:
                self._lease = SshLease(connection, new_tag(), self.lose).start(
                    root=self.node.sudo, timeout=self.node.ssh.connect_timeout)
            except Exception as exc:
                connection.close()
                raise Unavailable(*_classify(exc, self.node.ssh.connect_timeout)) from None
            return self._lease

    def _connect(self) -> Connection:
        """Open the node's connection, trying again (with backoff) after transient failures."""
        timeout = self.node.ssh.connect_timeout
        attempt = 0
        while True:
            attempt += 1
            connection = self._new_connection(self.node.address, self.node.ssh.user, self.node.ssh.port)
            jump = self._jump_chain()
            if jump is not None:
                connection.gateway = jump
            self._secure(connection)
            try:
                connection.open()
                return connection
            except Exception as exc:  # every way of not connecting is a per-node outcome
                connection.close()
                failure, detail = _classify(exc, timeout)
                if attempt == CONNECT_TRIES or not _transient(exc, failure):
                    tries = f" (after {attempt} tries)" if attempt > 1 else ""
                    raise Unavailable(failure, detail + tries) from None
                delay = CONNECT_BACKOFF_S * 2 ** (attempt - 1)
                log.warning("%s: connect try %d of %d failed (%s); trying again in %g s",
                            self.node.name, attempt, CONNECT_TRIES, detail, delay)
                time.sleep(delay)

    def _jump_chain(self) -> Optional[Connection]:
        """ssh -J a,b: reach b through a, then the node through b; host keys checked at each hop.

        Without an inventory jump, fabric applies ~/.ssh/config's ProxyJump itself.
        """
        gateway = None
        for hop in filter(None, (self.node.ssh.jump or "").split(",")):
            connection = self._new_connection(*_split_jump(hop.strip()))
            connection.gateway = gateway
            gateway = connection
        return gateway

    def _new_connection(self, host: str, user: Optional[str], port: Optional[int]) -> Connection:
        ssh = self.node.ssh
        timeout = ssh.connect_timeout
        connect_kwargs: dict[str, object] = {"banner_timeout": timeout, "auth_timeout": timeout,
                          "channel_timeout": timeout}
        connect_kwargs["transport_factory"] = AeadFirstTransport
        if ssh.identity_file:
            connect_kwargs["key_filename"] = [ssh.identity_file]
        return Connection(host, user=user, port=port, config=_shared_config(), connect_timeout=timeout,
                          connect_kwargs=connect_kwargs)

    def _secure(self, connection: Connection) -> None:
        """Apply the host-key policy to a connection and every hop before it, including hops
        fabric made from ~/.ssh/config's ProxyJump (fabric itself would auto-add their keys)."""
        while isinstance(connection, Connection):
            ssh = self.node.ssh
            known_hosts = (ssh.known_hosts
                           or _expand(connection.ssh_config.get("userknownhostsfile"))
                           or DEFAULT_KNOWN_HOSTS)
            client = connection.client
            if os.path.exists(known_hosts):
                client.load_host_keys(known_hosts)
            if ssh.host_keys == "accept-new":
                client.set_missing_host_key_policy(AcceptNewPolicy(known_hosts))
            else:
                client.set_missing_host_key_policy(paramiko.RejectPolicy())
            connection = connection.gateway

    def _execute(self, lease, command, *, display, stdin, timeout):
        assert isinstance(lease, SshLease)
        started = time.monotonic()
        try:
            ran = lease.connection.run(shlex.join(command), in_stream=_ChunkedInput(stdin or ""),
                                       timeout=timeout + HARNESS_GRACE_S)
        except CommandTimedOut as exc:
            partial = exc.result
            return Result(self.node.name, display, None, partial.stdout, partial.stderr,
                          time.monotonic() - started, timed_out=True)
        except Exception as exc:
            duration = time.monotonic() - started
            if lease.closed_within(1.0):
                return self._cut_off(display, "", "", duration)
            # The connection stands: the node refused a session, or something in between broke.
            return Result(self.node.name, display, None, "", "", duration, failure="error",
                          detail=f"{type(exc).__name__}: {exc}")
        duration = time.monotonic() - started
        if ran.exited == -1 and lease.closed_within(1.0):  # no exit status: the channel died with the link
            return self._cut_off(display, ran.stdout, ran.stderr, duration)
        return Result(self.node.name, display, ran.exited, ran.stdout, ran.stderr, duration,
                      timed_out=node_timed_out(ran.exited, duration, timeout))

    def _cut_off(self, display: str, stdout: str, stderr: str, duration: float) -> Result:
        """A command whose connection went away under it: the node is unreachable, whatever the
        command itself was doing."""
        loss = self.lose("the connection closed")  # unless the heartbeat said why first
        return Result(self.node.name, display, None, stdout, stderr, duration, failure="unreachable",
                      detail=f"{loss.reason}, {duration:.0f} s into `{display}`")


def _split_jump(jump: str) -> tuple[str, Optional[str], Optional[int]]:
    """'user@host:port' as ssh -J takes it."""
    user, _, hostport = jump.rpartition("@")
    host, _, port = hostport.partition(":")
    return host, user or None, int(port) if port else None


def _expand(path: Optional[str]) -> Optional[str]:
    if not path:
        return None
    first = path.split()[0] if isinstance(path, str) else path[0]
    return os.path.expanduser(first)
