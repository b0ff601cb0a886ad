"""The SSH transport, on fabric: strict host keys by default, connect and run timeouts, remote kill."""
from __future__ import annotations

import os
import shlex
import socket
import threading
import time
from io import StringIO
from typing import Optional

import paramiko
from fabric import Config, Connection
from invoke.exceptions import CommandTimedOut

from inventory.model import Node
from runners.transport import HARNESS_GRACE_S, Result, Transport, node_timed_out

DEFAULT_KNOWN_HOSTS = os.path.expanduser("~/.ssh/known_hosts")


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


class SshTransport(Transport):
    """One fabric Connection per node, opened on first use and kept for the session."""

    def __init__(self, node: Node):
        super().__init__(node)
        self._connection: Optional[Connection] = None
        self._connect_lock = threading.Lock()

    def _connect(self) -> Connection:
        with self._connect_lock:
            if self._connection is None or not self._connection.is_connected:
                self._connection = self._new_connection(self.node.address, self.node.ssh.user,
                                                        self.node.ssh.port)
                jump = self._jump_chain()
                if jump is not None:
                    self._connection.gateway = jump
                self._secure(self._connection)
                self._connection.open()
            return self._connection

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
        if ssh.identity_file:
            connect_kwargs["key_filename"] = [ssh.identity_file]
        config = Config(overrides={"run": {"hide": True, "warn": True}})
        return Connection(host, user=user, port=port, config=config, connect_timeout=timeout,
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

    def _execute(self, command, *, display, stdin, timeout):
        started = time.monotonic()
        try:
            connection = self._connect()
        except Exception as exc:  # every way of not connecting is a per-node outcome
            self._drop_connection()
            failure, detail = _classify(exc, self.node.ssh.connect_timeout)
            return Result(self.node.name, display, None, "", "", time.monotonic() - started,
                          failure=failure, detail=detail)
        try:
            ran = connection.run(shlex.join(command), in_stream=_ChunkedInput(stdin or ""),
                                 timeout=timeout + HARNESS_GRACE_S)
        except CommandTimedOut as exc:
            partial = exc.result
            return Result(self.node.name, display, None, partial.stdout, partial.stderr,
                          time.monotonic() - started, timed_out=True)
        except Exception as exc:
            self._drop_connection()
            failure, detail = _classify(exc, self.node.ssh.connect_timeout)
            return Result(self.node.name, display, None, "", "", time.monotonic() - started,
                          failure=failure, detail=detail)
        duration = time.monotonic() - started
        return Result(self.node.name, display, ran.exited, ran.stdout, ran.stderr, duration,
                      timed_out=node_timed_out(ran.exited, duration, timeout))

    def kill(self, tag: str, *, root: bool = False) -> None:
        """Nothing can be running on a node we never finished connecting to; don't wait on it."""
        connection = self._connection
        if connection is not None and connection.is_connected:
            super().kill(tag, root=root)

    def _drop_connection(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            connection.close()

    def close(self) -> None:
        """Close without the connect lock: a node stuck in connect must not hold up shutdown."""
        self._drop_connection()


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
