"""The SSH transport: fabric sets up each connection (ssh_config, jump hosts, keys), commands
run on paramiko channels directly. Strict host keys by default, connect retries, connect and run
timeouts, a heartbeat that finds a dead link within seconds, remote kill."""
from __future__ import annotations

import base64
import errno
import logging
import os
import select
import selectors
import shlex
import socket
import struct
import threading
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from functools import cache
from typing import Callable, Iterable, Optional, Sequence

import paramiko
from fabric import Config, Connection

from inventory.model import Node, SshSettings
from runners.transport import (
    HARNESS_GRACE_S,
    HEARTBEAT_S,
    LEASE_END_S,
    NODE_PATIENCE_S,
    SYSTEM_DIRS,
    Lease,
    Loss,
    Result,
    Transport,
    Unavailable,
    lease_argv,
    new_tag,
    node_timed_out,
)

DEFAULT_KNOWN_HOSTS = os.path.expanduser("~/.ssh/known_hosts")
# No echo of a heartbeat this long: the node is unreachable. TCP resends a segment lost on a
# dead link 1, 3, 7, 15, 31 and 63 retransmission timeouts after sending it (the timeout doubles
# each time; 200 ms on a LAN: 12.6 s for the sixth), so a link down up to 63 timeouts (12.6 s) is
# answered at the sixth resend, up to a heartbeat's round after the last echo before it: 15.6 s
# on a LAN. The limit waits for that sixth resend, and a margin, on the connection's own
# timeout (`link_dead_after`): at least LINK_DEAD_AFTER_S, at most LINK_DEAD_AFTER_MOST_S.
LINK_DEAD_AFTER_S = 18
LINK_DEAD_AFTER_MOST_S = 60  # a link whose round trip is seconds long: a dead node is not waited for minutes
TCP_SIXTH_RESEND = 63  # retransmission timeouts from a segment's send to its sixth resend
LINK_DEAD_MARGIN_S = 2.4  # beyond the sixth resend: the echo's way back, a harness a little late
TCP_INFO_BYTES, TCP_INFO_RTO_AT = 104, 8  # struct tcp_info: eight one-byte fields, then tcpi_rto (us)
SILENT_ROUNDS = 1.5  # no echo for this many heartbeats: the link was silent (a command that failed
# then failed for its link, and the run's record keeps the silence)
LATE_BEAT = 1 / 3  # a heartbeat sent this many rounds late: the harness was starved, not the link
CONNECT_TRIES = 3
CONNECT_BACKOFF_S = 1.0  # before the second try; doubled before each one after
# SSH handshakes in progress at once, over every node: each costs the harness CPU (key exchange,
# host key and auth signatures, under the GIL); 1,024 at once on a few cores would each take
# longer than the connect timeout and a healthy node would be called unreachable.
CONNECTS_AT_ONCE = 64
_connecting = threading.BoundedSemaphore(CONNECTS_AT_ONCE)
CHANNEL_CHUNK = 64 * 1024  # bytes per read from or write to a command's channel
SEND_POLL_S = 0.05  # how often stdin is retried while the node's window is full
IDLE_POLL_S = 5.0  # how often an idle connection's paramiko thread wakes (AeadFirstTransport)
# sshd runs a command through the user's login shell, and bash reads ~/.bashrc for it: a line
# that prints ("Welcome to ...") comes before the command's own output, where it would break
# every parser. Each command's stdout begins with this line; what comes before it is dropped.
OUTPUT_BEGINS = "handover-output-begins"
WATCHDOG_RESTARTS = 3  # a watchdog that keeps ending (sudo refusing it) is not started for ever
# A lost node's SSH port is knocked on (a TCP connect, closed at once) this often; one round waits
# KNOCK_WAIT_S for every port to answer, KNOCKS_AT_ONCE sockets open at a time (within the files
# a session opens per node, handover.session.FILES_PER_NODE: a lost node's connection is closed).
KNOCK_S = 3.0
KNOCK_WAIT_S = 2.0
KNOCKS_AT_ONCE = 1024
# A channel through a jump chain (a connect, a knock) is opened by the jump host's own connect
# to the node, which goes on until the node answers or TCP gives up (about 127 s on Linux),
# whatever the harness waits, and holds a socket there all that time. The harness follows each
# such open for JUMP_CONNECT_BOUND_S at most, and closes a channel that opened after it stopped
# waiting. A node has one knock waiting at a time, the harness KNOCKS_THROUGH_WAITING in all; an
# answer after a knock round's wait is heard the round after.
JUMP_CONNECT_BOUND_S = 150.0
KNOCKS_THROUGH_WAITING = 256
_knock_through_slots = threading.BoundedSemaphore(KNOCKS_THROUGH_WAITING)

log = logging.getLogger("handover.ssh")


class KnownHosts:
    """A known_hosts file read once for every connection, with its plain names indexed.

    paramiko's own load checks each line against every line before it, and each connection
    loads the file anew: on a 1,024-line file that is about 0.16 s of CPU per connection, a
    quadratic cost in the cluster's size. Here a file is read again only when it changed on
    disk, a host's keys are found by one dictionary lookup (hashed names, `|1|salt|hash`, by
    one HMAC per hashed line, as paramiko matches them), and only the lines that name the host
    are parsed. paramiko accepts exact and hashed names only (no patterns), and so does this.
    """

    _lock = threading.Lock()
    _files: dict[str, "KnownHosts"] = {}

    def __init__(self, path: str, stamp: tuple[int, int, int]):
        self.path = path
        self.stamp = stamp
        self.lines: list[str] = []
        self.plain: dict[str, list[int]] = {}
        self.hashed: list[tuple[list[str], int]] = []
        try:
            with open(path, encoding="utf-8", errors="replace") as listed:
                for line in listed:
                    self.add_line(line)
        except FileNotFoundError:
            pass

    @classmethod
    def of(cls, path: str) -> "KnownHosts":
        """The file's index, read again only when its size, mtime or inode changed."""
        stamp = _stamp(path)
        with cls._lock:
            known = cls._files.get(path)
            if known is None or known.stamp != stamp:
                known = cls._files[path] = cls(path, stamp)
            return known

    def add_line(self, line: str) -> None:
        line = line.strip()
        if not line or line.startswith("#"):
            return
        index = len(self.lines)
        self.lines.append(line)
        names = line.split(None, 1)[0].split(",")
        hashed = [name for name in names if name.startswith("|1|")]
        if hashed:
            self.hashed.append((hashed, index))
        for name in names:
            if not name.startswith("|1|"):
                self.plain.setdefault(name, []).append(index)

    def keys_of(self, name: str) -> list[paramiko.PKey]:
        """The keys the file gives for `name` (`host`, or `[host]:port` off port 22), in file order."""
        indices = set(self.plain.get(name, ()))
        for hashes, index in self.hashed:
            if any(paramiko.HostKeys.hash_host(name, salted) == salted for salted in hashes):
                indices.add(index)
        keys = []
        for index in sorted(indices):
            try:
                entry = paramiko.hostkeys.HostKeyEntry.from_line(self.lines[index], index + 1)
            except paramiko.SSHException:  # as paramiko's own load: an unreadable line is skipped
                continue
            if entry is not None:
                keys.append(entry.key)
        return keys

    def learned(self, line: str) -> None:
        """A line this process appended itself: index it, and take the file's new stamp, so the
        next connection does not read the whole file again (accept-new on a fresh cluster).
        Where the file grew by more than the line (another process wrote too), it is read again."""
        with self._lock:
            stamp = _stamp(self.path)
            if stamp[:2] == (self.stamp[0], self.stamp[1] + len(line.encode())):
                self.add_line(line)
                self.stamp = stamp
            else:
                self.stamp = (0, 0, -1)  # matches no file: the next look reads it again


def _stamp(path: str) -> tuple[int, int, int]:
    try:
        info = os.stat(path)
    except FileNotFoundError:
        return (0, 0, 0)
    return (info.st_ino, info.st_size, info.st_mtime_ns)


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
            known = KnownHosts.of(self.known_hosts)
            with open(self.known_hosts, "a", encoding="ascii") as out:
                out.write(line)
            known.learned(line)


# paramiko's AuthenticationException for a login the link cut short, not one the node refused:
# its answer did not come in time, or the connection ended mid-login (20% packet loss did both)
LOGIN_CUT_SHORT = ("Authentication timeout.", "Authentication failed: transport shut down or saw EOF")


def _classify(exc: BaseException, connect_timeout: float) -> tuple[str, str]:
    """Map a connection error to a per-node outcome word and a one-line explanation."""
    if isinstance(exc, paramiko.BadHostKeyException):
        return "host-key", (f"host key for {exc.hostname} does not match known_hosts "
                            "(possible man-in-the-middle, or the node was reinstalled)")
    if isinstance(exc, paramiko.SSHException) and "not found in known_hosts" in str(exc):
        return "host-key", f"{exc} (add it with ssh-keyscan, or set ssh.host_keys: accept-new)"
    if isinstance(exc, paramiko.AuthenticationException) and str(exc) in LOGIN_CUT_SHORT:
        return "unreachable", f"the login did not complete: {exc} (a lossy or overloaded link, or sshd)"
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


class AeadFirstTransport(paramiko.Transport):
    """paramiko's transport, offering AES-GCM first, quiet once connected, leaving no session open
    on the node that it gave up opening.

    AES-GCM's tag is checked inside the cipher, where a separate MAC is compared byte by byte in
    Python on every packet; the other ciphers stay on offer, in paramiko's order. paramiko's
    thread wakes every 0.1 s to see whether it was closed: over 1,024 connections that is 10,000
    wake-ups a second, each taking the GIL, and here they starved the heartbeats (a third of
    1,024 healthy nodes lost for "no answer to SSH keepalives"). Once connected (`settle`) it
    wakes for data, or every IDLE_POLL_S; a close shuts the socket down, which wakes it at once.
    """

    _preferred_ciphers = tuple(sorted(paramiko.Transport._preferred_ciphers,  # type: ignore[attr-defined]
                                      key=lambda name: "-gcm@" not in name))

    def settle(self) -> None:
        """Connected: the handshake's timeouts, the reason for 0.1 s wake-ups, are behind it."""
        self.sock.settimeout(IDLE_POLL_S)

    def _parse_channel_open_success(self, m: paramiko.Message) -> None:
        """A session the node confirms after its open timed out here and was given up (a loaded
        node; the command failed as an error) is closed at once. paramiko only logs such a late
        confirmation, and the node's sshd would keep the session for the connection's life, one
        of its MaxSessions each time, until it refused every command."""
        chanid, node_chanid = m.get_int(), m.get_int()
        if self._channels.get(chanid) is None:  # type: ignore[attr-defined]
            close = paramiko.Message()
            close.add_byte(paramiko.common.cMSG_CHANNEL_CLOSE)
            close.add_int(node_chanid)
            self._send_user_message(close)  # type: ignore[attr-defined]
            return
        m.rewind()
        super()._parse_channel_open_success(m)  # type: ignore[misc]

    def stop_thread(self) -> None:
        """A socket's close does not wake a recv waiting on it, its shutdown does; a jump chain's
        channel (the socket of a node behind it) wakes its reader when paramiko closes it."""
        if isinstance(self.sock, socket.socket):
            try:
                self.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        super().stop_thread()


@cache
def _ssh_config() -> paramiko.SSHConfig:
    """~/.ssh/config and /etc/ssh/ssh_config, read once for every connection, as fabric reads them."""
    return Config().base_ssh_config


def direct_host(node: Node) -> Optional[str]:
    """The host this machine itself opens a TCP connection to for the node (ssh_config's
    HostName applied); None where a jump chain, a ProxyCommand or another transport reaches it."""
    if node.transport != "ssh" or node.ssh.jump:
        return None
    config = _ssh_config().lookup(node.address)
    host = config.get("hostname", node.address)
    jump = config.get("proxyjump", "none")
    if jump.lower() != "none" and not _is_own_hop(jump, {host, node.address}):
        return None
    return host if config.get("proxycommand", "none").lower() == "none" else None


def ssh_port(node: Node) -> int:
    """The port this machine connects to for the node: the inventory's, else ssh_config's, else 22."""
    return node.ssh.port or int(_ssh_config().lookup(node.address).get("port", 22))


def knock(addresses: Iterable[tuple], wait_s: float) -> set[tuple]:
    """The socket addresses (getaddrinfo's) whose TCP port accepted a connection within wait_s,
    every connect at once; each is closed as soon as it is made, before a byte is sent."""
    selector = selectors.DefaultSelector()
    pending: dict[int, tuple[socket.socket, tuple]] = {}  # by file descriptor
    answered: set[tuple] = set()
    try:
        for address in addresses:
            sock = socket.socket(socket.AF_INET6 if len(address) == 4 else socket.AF_INET, socket.SOCK_STREAM)
            pending[sock.fileno()] = (sock, address)
            sock.setblocking(False)
            if sock.connect_ex(address) in (0, errno.EINPROGRESS):
                selector.register(sock, selectors.EVENT_WRITE)
        deadline = time.monotonic() + wait_s
        while selector.get_map() and (left := deadline - time.monotonic()) > 0:
            for key, _ in selector.select(left):
                sock, address = pending[key.fd]
                if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0:
                    answered.add(address)
                selector.unregister(sock)
    finally:
        selector.close()
        for sock, _ in pending.values():
            sock.close()
    return answered


def knock_through(transports: Sequence[SshTransport], wait_s: float) -> set[SshTransport]:
    """The transports whose node's SSH port answered a knock through its open jump chain: one
    started now and answered within wait_s, or an earlier one answered since (knock_through_jump)."""
    started = [answer for transport in transports if (answer := transport.knock_through_jump()) is not None]
    deadline = time.monotonic() + wait_s
    for answer in started:
        answer.wait(max(0.0, deadline - time.monotonic()))
    return {transport for transport in transports if transport.knock_heard()}


class Knocker:
    """Knocks on the SSH port of every lost node, every KNOCK_S, and tells its transport once the
    port answers (Transport.heard): its next command tries the node then, not at its next blind
    try (RECONNECT_AFTER_S), so a node whose switch rebooted is used again within seconds of its
    link rather than minutes, and its recovery's time on the record is close to the link's. A
    port only answers while the node's sshd listens and its link is up, so a dead node still
    costs no command a connect timeout. A node this machine reaches directly is knocked on with
    a TCP connect (knock); one behind a jump chain with a direct-tcpip channel of that chain,
    while the chain is open for other nodes (knock_through): the jump host connects, and a knock
    never opens a chain. One thread knocks for every node: started with the first loss, ended
    when no lost node is left to knock on."""

    def __init__(self) -> None:
        self._lost: dict[SshTransport, Optional[tuple]] = {}  # -> its socket address, once resolved
        self._lock = threading.Lock()
        self._thread: Optional[threading.Thread] = None

    def watch(self, transport: SshTransport) -> None:
        with self._lock:
            self._lost.setdefault(transport, None)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, daemon=True, name="knocker")
                self._thread.start()

    def _run(self) -> None:
        while True:
            time.sleep(KNOCK_S)
            with self._lock:
                for transport in [t for t in self._lost if t.retriable_loss() is None]:
                    del self._lost[transport]  # back, closed, or its tries spent
                if not self._lost:
                    self._thread = None
                    return
                lost = dict(self._lost)
            losses = {transport: transport.retriable_loss() for transport in lost}
            unheard = [transport for transport in lost
                       if (loss := losses[transport]) is not None and loss.heard_at is None]
            direct = {transport: lost[transport] or self._resolve(transport) for transport in unheard
                      if transport.jump_target is None}
            knocked = [address for address in direct.values() if address is not None]
            answered: set[tuple] = set()
            for start in range(0, len(knocked), KNOCKS_AT_ONCE):
                answered |= knock(knocked[start:start + KNOCKS_AT_ONCE], KNOCK_WAIT_S)
            heard = {transport for transport, address in direct.items() if address in answered}
            heard |= knock_through([t for t in unheard if t.jump_target is not None], KNOCK_WAIT_S)
            for transport in heard:
                loss = losses[transport]
                if loss is not None:
                    transport.heard(loss)

    def _resolve(self, transport: SshTransport) -> Optional[tuple]:
        """The node's socket address, kept once known. A name that does not resolve is not
        knocked on again (each try could wait for the resolver): its blind tries stand."""
        host = direct_host(transport.node)
        address = None
        try:
            if host is not None:
                address = socket.getaddrinfo(host, ssh_port(transport.node), type=socket.SOCK_STREAM)[0][4]
        except (OSError, UnicodeError):
            pass
        with self._lock:
            if address is None:
                self._lost.pop(transport, None)
            elif transport in self._lost:
                self._lost[transport] = address
        return address


_knocker = Knocker()


def _config() -> Config:
    """A fabric Config of the connection's own. fabric's Connection writes into its config as it
    is made (inline_ssh_env), and invoke merges every level anew on each write, so a Config
    shared by many threads was seen half-merged by the others ("No attribute or config key
    found for 'gateway'"). Only the parsed ssh_config files are shared: reading them per node
    cost milliseconds each."""
    return Config(ssh_config=_ssh_config())


class SshLease(Lease):
    """One connection and its node-side watchdog, with the heartbeat that keeps both honest.

    Every HEARTBEAT_S the harness sends one byte on the lease's channel and waits for its echo:
    no echo for `link_dead_after` means the link or the node is gone, and `on_lost` is told
    while the commands on the connection are still waiting (they end as unreachable).
    """

    def __init__(self, connection: Connection, tag: str, on_lost: Callable[[str], object],
                 on_closed: Callable[[], None], on_silence: Callable[[float, float, str], None]):
        super().__init__(tag)
        self.connection = connection
        self._on_lost = on_lost
        self._on_silence = on_silence  # (time.time() of the last echo before, of the first after, why)
        self._on_closed = on_closed  # once, after the connection closed (its jump chain's share)
        self._closing = threading.Lock()
        self._stopped = threading.Event()
        self._channel: Optional[paramiko.Channel] = None
        self._root, self._timeout = False, 0.0
        self._restarts = 0  # watchdogs started again on this connection after one ended
        self._answered = time.monotonic()  # the last echo of a heartbeat
        self._gap: Optional[tuple[float, float]] = None  # the last silence: last echo before, first after
        self._dead_after = float(LINK_DEAD_AFTER_S)  # no echo this long: the link is lost (link_dead_after)

    def start(self, *, root: bool, timeout: float) -> "SshLease":
        transport = self.connection.client.get_transport()
        if transport is None:
            raise EOFError("the connection closed before the watchdog started")
        if isinstance(transport, AeadFirstTransport):
            transport.settle()
        self._root, self._timeout = root, timeout
        # Read once, while the link is sound: read again after a silence, the timeout could
        # still be the one TCP doubled for each resend.
        self._dead_after = link_dead_after(transport.sock)
        self._watch(transport)
        return self

    def _watch(self, transport: paramiko.Transport) -> None:
        """Start the node-side watchdog on its own channel, and the heartbeat that feeds it. The
        node waits for heartbeats as much longer than NODE_PATIENCE_S as the harness waits for
        echoes longer than LINK_DEAD_AFTER_S: it never gives the harness up first."""
        patience = NODE_PATIENCE_S + self._dead_after - LINK_DEAD_AFTER_S
        channel = transport.open_session(timeout=self._timeout)
        _exec_within(channel, login_shell_line(lease_argv(self.tag, patience_s=patience, root=self._root)),
                     self._timeout)
        self._channel = channel
        threading.Thread(target=self._beat, args=(channel,), daemon=True,
                         name=f"heartbeat-{self.connection.host}").start()

    @property
    def standing(self) -> bool:
        return not self._stopped.is_set() and self.connection.is_connected

    def close(self) -> None:
        """End the watchdog's input and wait for it to exit before the connection goes: closed at
        once, the harness could not tell whether the node finished its cleanup (the TERM grace,
        the removal of our temporary directories) or was cut short by what came next there."""
        if not self._stopped.is_set():
            self._stopped.set()
            self._end_watchdog()
        self._close_connection()

    def _close_connection(self) -> None:
        with self._closing:
            self.connection.close()
            on_closed, self._on_closed = self._on_closed, _nothing
        on_closed()

    def _end_watchdog(self) -> None:
        channel = self._channel
        if channel is None or not self.connection.is_connected:
            return
        try:
            channel.shutdown_write()
        except (OSError, EOFError, paramiko.SSHException):
            return
        channel.status_event.wait(LEASE_END_S)

    def closed_within(self, seconds: float) -> bool:
        """Whether the connection is down, or goes down within `seconds`: a channel that ends
        without an exit status is unlinked by paramiko a moment before the transport stops."""
        deadline = time.monotonic() + seconds
        while self.connection.is_connected and not self._stopped.is_set():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.02)
        return True

    def silence(self, since: float) -> Optional[str]:
        """Why a command that failed on this connection (started at `since`) failed for its link:
        no echo came for longer than SILENT_ROUNDS heartbeats, now or since the command started
        (its channel did not open on a link gone silent, which may be back by now), or the
        heartbeat gives the link up before the next echo. None when the node answered all along:
        the failure was the node's (it refused a session)."""
        now = time.monotonic()
        if now - self._answered > HEARTBEAT_S * SILENT_ROUNDS:
            return f"no answer to SSH keepalives for {now - self._answered:.0f} s"
        gap = self._gap
        if gap is not None and gap[1] > since:
            return f"no answer to SSH keepalives for {gap[1] - gap[0]:.0f} s"
        return None if self._next_echo(now) != "closed" else "the connection closed"

    def answers_again(self) -> bool:
        """Whether an echo of the heartbeat comes before the heartbeat gives the link up."""
        return self._next_echo(time.monotonic()) == "echo"

    def _next_echo(self, moment: float) -> str:
        """What follows `moment`: an "echo" of the heartbeat, the link given up ("closed"), or
        neither by when the heartbeat should have done one or the other ("late")."""
        deadline = moment + self._dead_after + HEARTBEAT_S
        while self.connection.is_connected and not self._stopped.is_set():
            if self._answered > moment:
                return "echo"
            if time.monotonic() > deadline:
                return "late"
            time.sleep(0.05)
        return "closed"

    def _beat(self, channel: paramiko.Channel) -> None:
        """A heartbeat every HEARTBEAT_S, whether the last one's echo came or not: the watchdog
        counts the gap between heartbeats it receives, and one sent only after a late echo (up to
        the link's limit late) let that gap pass the node's patience on a slow link, so the node
        killed our work while the harness still took the link for sound. A heartbeat is answered
        when every one sent so far has its echo: one read per heartbeat took the OUTPUT_BEGINS
        line for the first echo, and from then on each read found the echo before, already
        waiting, so a link gone silent looked answered for a round more. The link is lost when
        no heartbeat was answered for its limit (`link_dead_after`); a shorter silence, of more than
        SILENT_ROUNDS heartbeats, is told to `on_silence` once answered, unless a heartbeat in it
        went out late (the harness itself was starved, not the link). A watchdog started again
        on the connection (`_ended`) carries on from the last echo of the one before: counted from
        the restart, a silence that ended the watchdog was neither given up nor recorded."""
        echoes = _Echoes()
        due = time.monotonic()
        on_time = True  # since the last echo, every heartbeat went out, and was waited for, on time
        while not self._stopped.is_set():
            sent = time.monotonic()
            on_time = on_time and sent - due < HEARTBEAT_S * LATE_BEAT
            due = sent + HEARTBEAT_S
            try:
                channel.sendall(b".")
                ended = not echoes.wait_for_all(channel, until=min(due, self._answered + self._dead_after))
            except (OSError, EOFError, paramiko.SSHException):
                ended = True
            on_time = on_time and time.monotonic() - due < HEARTBEAT_S * LATE_BEAT
            if self._stopped.is_set():
                return
            if ended:
                self._ended(channel)
                return
            if echoes.all_in:
                self._answer(time.monotonic(), on_time)
                on_time = True
            elif time.monotonic() - self._answered >= self._dead_after:
                self._lost(f"no answer to SSH keepalives for {self._dead_after:.0f} s")
                return
            self._stopped.wait(max(0.0, min(due, self._answered + self._dead_after) - time.monotonic()))

    def _answer(self, now: float, on_time: bool) -> None:
        """An echo came `now`: the end of a silence, where there was one (the gap is set before
        the answer, for a command that waits for the answer to read it)."""
        before = self._answered
        if now - before > HEARTBEAT_S * SILENT_ROUNDS:
            self._gap = (before, now)
            if on_time:
                self._on_silence(_epoch(before), _epoch(now), f"no answer to SSH keepalives for {now - before:.0f} s")
        self._answered = now

    def _lost(self, reason: str) -> None:
        """Say why first, then end the connection: the commands waiting on it return at once
        and find the reason."""
        self._on_lost(reason)
        self._stopped.set()  # no watchdog to wait for on a link that is gone
        self._close_connection()

    def _ended(self, channel: paramiko.Channel) -> None:
        """The watchdog ended while the connection stands: it missed the heartbeats for
        NODE_PATIENCE_S (a starved harness) and killed our work there, or something killed it.
        Without one, a harness killed later would leave the node's commands to their own
        timeouts (days, for a node lock's holder): it is started again, a few times at most."""
        if self.closed_within(1.0):
            self._lost("the connection closed")
            return
        why = channel.recv_stderr(4096).decode(errors="replace").strip() if channel.recv_stderr_ready() else ""
        transport = self.connection.client.get_transport()
        if self._restarts < WATCHDOG_RESTARTS and transport is not None:
            self._restarts += 1
            log.warning("%s: the node-side watchdog ended (%s); starting it again (%d of %d)",
                        self.connection.host, why or "it said nothing", self._restarts, WATCHDOG_RESTARTS)
            try:
                self._watch(transport)
                return
            except (OSError, EOFError, paramiko.SSHException) as error:
                why = f"{why or 'it said nothing'}; starting it again failed: {error}"
        log.warning("%s: the node-side watchdog ended (%s); commands there are bounded by their "
                    "own timeouts only", self.connection.host, why or "it said nothing")


class _Echoes:
    """The watchdog's echoes of the heartbeats one channel sent: a dot for each dot, after the
    OUTPUT_BEGINS line (a login's message of the day before it may hold dots of its own)."""

    BEGINS = (OUTPUT_BEGINS + "\n").encode()

    def __init__(self) -> None:
        self.sent = 0
        self.echoed = 0
        self._preamble: Optional[bytes] = b""  # None once OUTPUT_BEGINS has come

    @property
    def all_in(self) -> bool:
        return self.echoed >= self.sent

    def wait_for_all(self, channel: paramiko.Channel, *, until: float) -> bool:
        """Count one more heartbeat sent, and read echoes until every one has come or `until`;
        False when the channel ended (the watchdog exited, or the connection closed)."""
        self.sent += 1
        while not self.all_in:
            remaining = until - time.monotonic()
            if remaining <= 0:
                return True
            channel.settimeout(remaining)
            try:
                data = channel.recv(64)
            except socket.timeout:
                return True
            if not data:
                return False
            self.echoed += self._dots(data)
        return True

    def _dots(self, data: bytes) -> int:
        if self._preamble is not None:
            _, found, after = (self._preamble + data).partition(self.BEGINS)
            if not found:
                self._preamble = (self._preamble + data)[-len(self.BEGINS):]
                return 0
            self._preamble, data = None, after
        return data.count(b".")


def _nothing() -> None:
    pass


def link_dead_after(sock: object) -> float:
    """How long the heartbeat waits for an echo before giving the link up: until TCP's sixth resend
    of the first heartbeat a silence lost, on the connection's own retransmission timeout, and a
    margin. Over 40 ms of round trip the timeout is about 240 ms, and a link down 10 s was given
    up at a fixed 18 s though its echo was on its way. LINK_DEAD_AFTER_S where the connection is
    not a TCP socket of ours (through a jump host) or says nothing."""
    timeout = retransmission_timeout(sock)
    if timeout is None:
        return float(LINK_DEAD_AFTER_S)
    waited = HEARTBEAT_S + TCP_SIXTH_RESEND * timeout + LINK_DEAD_MARGIN_S
    return min(float(LINK_DEAD_AFTER_MOST_S), max(float(LINK_DEAD_AFTER_S), waited))


def retransmission_timeout(sock: object) -> Optional[float]:
    """A TCP socket's retransmission timeout now, in seconds (Linux's TCP_INFO tcpi_rto); None for
    anything else."""
    if not isinstance(sock, socket.socket) or not hasattr(socket, "TCP_INFO"):
        return None
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, TCP_INFO_BYTES)
    except OSError:
        return None
    if len(info) < TCP_INFO_RTO_AT + 4:
        return None
    return struct.unpack_from("=I", info, TCP_INFO_RTO_AT)[0] / 1e6


def _epoch(moment: float) -> float:
    """A time.monotonic() reading as time.time() reads it."""
    return time.time() - (time.monotonic() - moment)


class ChannelNotOpened(Exception):
    """A command's session channel did not open: the command never started on the node."""


def session_refused(cause: BaseException) -> str:
    """Why the node's sshd refused a session (a connection's sessions past its MaxSessions, or
    none allowed), in words that say what to change; '' for any other failure."""
    if not isinstance(cause, paramiko.ChannelException):
        return ""
    return (f"the node's sshd refused a new session ({cause.text}, code {cause.code}): each command the harness "
            "runs on a node at once takes one of sshd's MaxSessions (10 by default), and its watchdog one; "
            "every rail of a pair runs at once, so raise MaxSessions in sshd_config to the rails + 2 or more")


def _jump_chain_key(ssh: SshSettings, connection: Connection) -> Optional[SshSettings]:
    """The node's jump chain, and what its hops are opened with (nodes alike in it share them):
    the inventory's `ssh.jump`, else the ProxyJump that ssh_config gives the node. As fabric
    and ssh do, none for a node that is itself one of its chain's hops (`Host *` configs)."""
    jump = ssh.jump or connection.ssh_config.get("proxyjump")
    if not jump or jump.lower() == "none":
        return None
    if not ssh.jump and _is_own_hop(jump, {connection.host, connection.original_host}):
        return None
    return SshSettings(identity_file=ssh.identity_file, known_hosts=ssh.known_hosts,
                       host_keys=ssh.host_keys, jump=jump, connect_timeout=ssh.connect_timeout)


@dataclass
class _Chain:
    gateway: Connection  # the last hop; its .gateway the one before it
    users: int = 0
    opening: threading.Lock = field(default_factory=threading.Lock)
    failed: Optional[tuple[float, BaseException]] = None  # when and why its last opening failed


class JumpChains:
    """The nodes' jump chains (`ssh.jump`, or ssh_config's ProxyJump), each one SSH connection for every node behind
    it, as OpenSSH's ControlMaster would share it: 1,024 nodes behind a bastion are channels of
    one connection, not 1,024 handshakes that its sshd (MaxStartups 10:30:100 by default) would
    mostly drop. A chain closes with the last connection through it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._chains: dict[SshSettings, _Chain] = {}

    def peek(self, key: SshSettings) -> Optional[Connection]:
        """The chain's last hop while it is open for the nodes behind it; None, never opened, if not."""
        with self._lock:
            chain = self._chains.get(key)
        return chain.gateway if chain is not None and chain.gateway.is_connected else None

    def take(self, key: SshSettings, build: Callable[[], Connection]) -> Connection:
        """The chain's last hop, open; opened once for all the nodes that asked at once: those
        waiting while it failed get its error, not a connect timeout each, one after another."""
        asked = time.monotonic()
        with self._lock:
            chain = self._chains.get(key)
            if chain is None:
                chain = self._chains[key] = _Chain(build())
            chain.users += 1
        try:
            with chain.opening:
                if not chain.gateway.is_connected:
                    if chain.failed is not None and chain.failed[0] >= asked:
                        raise chain.failed[1]
                    try:
                        with _connecting:
                            chain.gateway.open()
                    except Exception as exc:
                        _close_hops(chain.gateway)
                        chain.failed = (time.monotonic(), exc)
                        raise
            return chain.gateway
        except BaseException:
            self.give_back(key)
            raise

    def give_back(self, key: SshSettings) -> None:
        with self._lock:
            chain = self._chains[key]
            chain.users -= 1
            if chain.users:
                return
            del self._chains[key]
        _close_hops(chain.gateway)


def open_later(through: paramiko.Transport, host: str, port: int) -> Future[paramiko.Channel]:
    """A direct-tcpip channel of a jump chain to host:port, opened on a thread of its own: the jump
    host's connect ends when the node answers or TCP gives up (JUMP_CONNECT_BOUND_S at most),
    whatever the caller waits; the Future holds the channel or why there is none (refused,
    unreachable, no answer, the chain closed meanwhile)."""
    opened: Future[paramiko.Channel] = Future()

    def open_it() -> None:
        try:
            opened.set_result(through.open_channel("direct-tcpip", (host, port), ("", 0),
                                                   timeout=JUMP_CONNECT_BOUND_S))
        except Exception as exc:  # the Future's to tell
            opened.set_exception(exc)

    threading.Thread(target=open_it, daemon=True, name="open-through").start()
    return opened


def open_through(through: paramiko.Transport, host: str, port: int, wait_s: float) -> paramiko.Channel:
    """open_later's channel, waited on for wait_s (a timeout is socket.timeout, as a direct
    connect's). paramiko keeps a channel whose open timed out, and the jump host opens it once its
    own connect gets through: that late channel is closed as it opens, where it would stay open on
    the jump host until the node's sshd dropped it."""
    opened = open_later(through, host, port)
    try:
        return opened.result(timeout=wait_s)
    except FutureTimeout:
        opened.add_done_callback(_close_if_opened)
        raise socket.timeout(f"no channel to {host}:{port} through the jump chain within {wait_s:g} s") from None


def _close_if_opened(opened: Future[paramiko.Channel]) -> bool:
    """Close the channel if there is one; whether there was."""
    if opened.exception() is not None:
        return False
    opened.result().close()
    return True


def _close_hops(gateway: Optional[Connection]) -> None:
    """Close a chain's hops, last first (fabric closes a connection, never its gateway)."""
    while isinstance(gateway, Connection):
        gateway.close()
        gateway = gateway.gateway


_jump_chains = JumpChains()


class SshTransport(Transport):
    """One fabric Connection per node, opened on first use and kept for the session."""

    def __init__(self, node: Node):
        super().__init__(node)
        self._connect_lock = threading.Lock()
        # where a jump chain reaches the node: the chain, and the host and port its last hop
        # connects to (ssh_config applied); set by the first connect
        self.jump_target: Optional[tuple[SshSettings, str, int]] = None
        self._knock_lock = threading.Lock()
        self._knock_waiting = False  # a knock through the jump chain waits on the jump host's connect
        self._knock_heard = False  # ... and one was answered since knock_heard() last said so

    def lose(self, reason: str) -> Loss:
        """Transport.lose; the node's SSH port is knocked on from now (Knocker) where this
        machine connects to it directly or through a jump chain (not a ProxyCommand)."""
        with self._knock_lock:
            if self.loss is None:
                self._knock_heard = False  # an answer to a knock of an earlier loss says nothing of this one
        loss = super().lose(reason)
        if direct_host(self.node) is not None or self.jump_target is not None:
            _knocker.watch(self)
        return loss

    def knock_through_jump(self) -> Optional[threading.Event]:
        """Knock on the node's SSH port with a direct-tcpip channel of its jump chain, on a
        thread of its own; the event is set when the port answers (the channel is closed at once:
        the jump host's connection to the node ends before a byte of SSH). None where no knock
        was started: the chain is not open (a knock opens none), this node's last knock still
        waits on the jump host's connect, or KNOCKS_THROUGH_WAITING knocks do."""
        if self.jump_target is None:
            return None
        chain, host, port = self.jump_target
        gateway = _jump_chains.peek(chain)
        if gateway is None or gateway.transport is None:
            return None
        with self._knock_lock:
            if self._knock_waiting or not _knock_through_slots.acquire(blocking=False):
                return None
            self._knock_waiting = True
        answer = threading.Event()
        open_later(gateway.transport, host, port).add_done_callback(lambda opened: self._knocked(opened, answer))
        return answer

    def _knocked(self, opened: Future[paramiko.Channel], answer: threading.Event) -> None:
        answered = _close_if_opened(opened)
        with self._knock_lock:
            self._knock_waiting = False
            self._knock_heard = self._knock_heard or answered
        _knock_through_slots.release()
        if answered:
            answer.set()

    def knock_heard(self) -> bool:
        """Whether a knock through the jump chain was answered since this was last asked."""
        with self._knock_lock:
            heard, self._knock_heard = self._knock_heard, False
        return heard

    def _open(self) -> Lease:
        with self._connect_lock:
            lease = self._lease
            if lease is not None and lease.standing:
                return lease
            if lease is not None:
                lease.close()
            connection, release = self._connect()
            try:
                self._lease = SshLease(connection, new_tag(), self.lose, release, self.blipped).start(
                    root=self.node.sudo, timeout=self.node.ssh.connect_timeout)
            except Exception as exc:
                connection.close()
                release()
                raise Unavailable(*_classify(exc, self.node.ssh.connect_timeout)) from None
            return self._lease

    def _connect(self) -> tuple[Connection, Callable[[], None]]:
        """Open the node's connection, trying again (with backoff) after transient failures;
        with what to call once it is closed (its share of the jump chain). A lost node's try is
        one connect: RECONNECT_AFTER_S is its backoff."""
        timeout = self.node.ssh.connect_timeout
        tries = 1 if self.loss is not None else CONNECT_TRIES
        attempt = 0
        while True:
            attempt += 1
            connection = self._new_connection(self.node.address, self.node.ssh.user, self.node.ssh.port)
            chain = _jump_chain_key(self.node.ssh, connection)
            if chain is not None:
                connection.gateway = None  # reached through the shared chain's channel instead
                self.jump_target = (chain, connection.host, int(connection.port))
            self._secure(connection)
            try:
                if chain is None:
                    with _connecting:  # the timeouts start once its turn has come
                        connection.open()
                    return connection, _nothing
                return connection, self._open_through(connection, chain)
            except Exception as exc:  # every way of not connecting is a per-node outcome
                connection.close()
                failure, detail = _classify(exc, timeout)
                if attempt >= tries or not _transient(exc, failure):
                    after = f" (after {attempt} tries)" if attempt > 1 else ""
                    raise Unavailable(failure, detail + after) from None
                delay = CONNECT_BACKOFF_S * 2 ** (attempt - 1)
                log.warning("%s: connect try %d of %d failed (%s); trying again in %g s",
                            self.node.name, attempt, tries, detail, delay)
                time.sleep(delay)

    def _open_through(self, connection: Connection, chain: SshSettings) -> Callable[[], None]:
        """Open the connection through a direct-tcpip channel of the node's shared jump chain."""
        gateway = _jump_chains.take(chain, lambda: self._jump_chain(chain.jump or ""))
        try:
            with _connecting:
                connection.connect_kwargs["sock"] = open_through(
                    gateway.transport, connection.host, int(connection.port), self.node.ssh.connect_timeout)
                connection.open()
        except BaseException:
            _jump_chains.give_back(chain)
            raise
        return lambda: _jump_chains.give_back(chain)

    def _jump_chain(self, jump: str) -> Connection:
        """ssh -J a,b: reach b through a, then the node through b; host keys checked at each hop,
        the node's connect timeout at each (fabric's own hops from ProxyJump had none)."""
        gateway = None
        for hop in filter(None, jump.split(",")):
            connection = self._new_connection(*_split_jump(hop.strip()))
            connection.gateway = gateway
            gateway = connection
        assert gateway is not None
        self._secure(gateway)
        return gateway

    def _new_connection(self, host: str, user: Optional[str], port: Optional[int]) -> Connection:
        ssh = self.node.ssh
        timeout = ssh.connect_timeout
        connect_kwargs: dict[str, object] = {"banner_timeout": timeout, "auth_timeout": timeout,
                          "channel_timeout": timeout}
        connect_kwargs["transport_factory"] = AeadFirstTransport
        if ssh.identity_file:
            connect_kwargs["key_filename"] = [ssh.identity_file]
        return Connection(host, user=user, port=port, config=_config(), connect_timeout=timeout,
                          connect_kwargs=connect_kwargs)

    def _secure(self, connection: Connection) -> None:
        """Apply the host-key policy to a connection and every hop before it (fabric itself
        would auto-add the keys of hops)."""
        while isinstance(connection, Connection):
            ssh = self.node.ssh
            known_hosts = (ssh.known_hosts
                           or _expand(connection.ssh_config.get("userknownhostsfile"))
                           or DEFAULT_KNOWN_HOSTS)
            client = connection.client
            name = connection.host if connection.port == 22 else f"[{connection.host}]:{connection.port}"
            trusted, types = client.get_host_keys(), set()
            for key in KnownHosts.of(known_hosts).keys_of(name):
                if key.get_name() not in types:  # the first line of each key type, as paramiko
                    types.add(key.get_name())
                    trusted.add(name, key.get_name(), key)
            if ssh.host_keys == "accept-new":
                client.set_missing_host_key_policy(AcceptNewPolicy(known_hosts))
            else:
                client.set_missing_host_key_policy(paramiko.RejectPolicy())
            connection = connection.gateway

    def _execute(self, lease, command, *, display, stdin, timeout):
        """Run the command; where its channel did not open on a link that fell silent and the
        node answers again before the heartbeat gives the link up, run it again, once (it never
        started there): a link that dropped for a few seconds under a command failed the
        command, and the node's checks for RECONNECT_AFTER_S after. The silence is on the
        run's record (on_silence)."""
        assert isinstance(lease, SshLease)
        started = time.monotonic()
        line, tries = login_shell_line(command), 0
        while True:
            tried, tries = time.monotonic(), tries + 1
            try:
                ran = _run_on_channel(lease, line, (stdin or "").encode(), open_timeout=self.node.ssh.connect_timeout,
                                      deadline=tried + timeout + HARNESS_GRACE_S)
                break
            except Exception as exc:
                silence = lease.silence(tried)
                if silence is None:
                    # The connection stands: the node refused a session, or something in between broke.
                    cause = exc.__cause__ or exc  # ChannelNotOpened: paramiko's own error
                    return Result(self.node.name, display, None, "", "", time.monotonic() - started,
                                  failure="error", detail=session_refused(cause) or f"{type(cause).__name__}: {cause}")
                # Decided while `exc` is held: its traceback keeps the channel whose open timed
                # out, which the node opens once the link is back; paramiko closes it when it
                # goes, where, forgotten, it would hold one of sshd's MaxSessions.
                if tries > 1 or not isinstance(exc, ChannelNotOpened) or not lease.answers_again():
                    return self._cut_off(display, "", "", time.monotonic() - started, silence)
                log.warning("%s: `%s` did not start while the link was silent (%s); running it again",
                            self.node.name, display, silence)
        duration = time.monotonic() - started
        stdout, stderr = own_output(ran.stdout.decode(errors="replace")), ran.stderr.decode(errors="replace")
        if ran.timed_out:
            return Result(self.node.name, display, None, stdout, stderr, duration, timed_out=True)
        if ran.exit_code == -1 and lease.closed_within(1.0):  # no exit status: the channel died with the link
            return self._cut_off(display, stdout, stderr, duration)
        return Result(self.node.name, display, ran.exit_code, stdout, stderr, duration,
                      timed_out=node_timed_out(ran.exit_code, duration, timeout))

    def _cut_off(self, display: str, stdout: str, stderr: str, duration: float,
                 why: str = "the connection closed") -> Result:
        """A command whose connection went away under it: the node is unreachable, whatever the
        command itself was doing."""
        loss = self.lose(why)  # unless the heartbeat said why first
        return Result(self.node.name, display, None, stdout, stderr, duration, failure="unreachable",
                      detail=f"{loss.reason}, {duration:.0f} s into `{display}`")


def _exec_within(channel: paramiko.Channel, command: str, timeout: float) -> None:
    """channel.exec_command, which waits for the node's answer without bound: the watchdog starts
    before the heartbeat that would find a node's sshd stalled (stopped, or stuck in a fork), so
    the channel is closed after `timeout`, as a connect that takes too long."""
    fired = threading.Event()  # set before the close wakes exec_command: it tells why it ended

    def expire() -> None:
        fired.set()
        try:
            channel.close()
        except Exception:  # the connection went first: nothing left to close
            pass

    expired = threading.Timer(timeout, expire)
    expired.daemon = True
    expired.start()
    try:
        channel.exec_command(command)
    except paramiko.SSHException:
        if not fired.is_set():
            raise
    finally:
        expired.cancel()
    if fired.is_set():  # also where the answer came as the channel was closed: it is closed now
        raise TimeoutError(f"the node did not start the watchdog within {timeout:g} s")


@dataclass(frozen=True)
class _Ran:
    exit_code: int  # -1: the channel closed without an exit status (a signal, or the link)
    stdout: bytes
    stderr: bytes
    timed_out: bool


def login_shell_line(command: Sequence[str]) -> str:
    """The line sshd hands the user's login shell: the OUTPUT_BEGINS line, then /bin/sh running
    the command from a base64 word, so that only one fixed line of it meets the login shell. A
    csh-family shell (tcsh) cannot parse a quoted newline, as the node-side scripts hold, and
    expands `!` even inside single quotes; no shell does anything to a base64 word. The
    command's PATH has the SYSTEM_DIRS appended."""
    system_dirs = ":".join(SYSTEM_DIRS)
    script = f'PATH="${{PATH:+$PATH:}}{system_dirs}"; export PATH; exec {shlex.join(command)}'
    encoded = base64.b64encode(script.encode()).decode()
    return f"""printf '%s\\n' {OUTPUT_BEGINS}; exec /bin/sh -c 'eval "$(printf %s {encoded} | base64 -d)"'"""


def own_output(stdout: str) -> str:
    """The command's own stdout: what follows the OUTPUT_BEGINS line (all of it where the line
    never came: the session ended before the command started)."""
    _, found, own = stdout.partition(OUTPUT_BEGINS + "\n")
    return own if found else stdout


def _run_on_channel(lease: "SshLease", command: str, stdin: bytes, *, open_timeout: float,
                    deadline: float) -> _Ran:
    """One command on its own session channel, in the calling thread: stdin sent as the node's
    window allows, then closed; stdout and stderr read as they come (both at once, so neither
    can fill the window and stall the other); then the exit status. invoke's Runner spent three
    threads and a 10 ms polling loop on each command; this waits on the channel's pipe instead.
    Past the deadline it returns what came so far, timed out (the caller kills the work)."""
    transport = lease.connection.client.get_transport()
    if transport is None:
        raise EOFError("the connection is closed")
    try:
        channel = transport.open_session(timeout=open_timeout)
    except paramiko.SSHException as exc:
        raise ChannelNotOpened(f"{type(exc).__name__}: {exc}") from exc
    try:
        channel.exec_command(command)
        pending = memoryview(stdin)
        if not pending:
            channel.shutdown_write()
        stdout, stderr = bytearray(), bytearray()
        # The channel's pipe is readable while output or an EOF waits. poll, not select: a
        # harness with a thousand connections has descriptors past select's limit of 1,024.
        ready = select.poll()
        ready.register(channel.fileno(), select.POLLIN)
        while True:
            while channel.recv_ready():
                stdout += channel.recv(CHANNEL_CHUNK)
            while channel.recv_stderr_ready():
                stderr += channel.recv_stderr(CHANNEL_CHUNK)
            if pending and channel.send_ready():
                pending = pending[channel.send(pending[:CHANNEL_CHUNK]):]
                if not pending:
                    channel.shutdown_write()
            remaining = deadline - time.monotonic()
            if channel.closed or channel.eof_received:
                # All output is in; the exit status comes with or just after the EOF.
                if not channel.status_event.wait(max(0.0, remaining)):
                    return _Ran(-1, bytes(stdout), bytes(stderr), timed_out=True)
                while channel.recv_ready():
                    stdout += channel.recv(CHANNEL_CHUNK)
                while channel.recv_stderr_ready():
                    stderr += channel.recv_stderr(CHANNEL_CHUNK)
                return _Ran(channel.recv_exit_status(), bytes(stdout), bytes(stderr), timed_out=False)
            if remaining <= 0:
                return _Ran(-1, bytes(stdout), bytes(stderr), timed_out=True)
            # Stdin waiting on a full window is polled: nothing else signals the window opening.
            ready.poll(1000 * (min(remaining, SEND_POLL_S) if pending else remaining))
    finally:
        channel.close()


def _is_own_hop(jump: str, names: set[str]) -> bool:
    """Whether a ProxyJump chain passes through the node it is for (by any of its names): as
    ssh and fabric do, such a node (the bastion under a `Host *` ProxyJump) is reached directly."""
    return bool({_split_jump(hop.strip())[0] for hop in jump.split(",")} & names)


def _split_jump(jump: str) -> tuple[str, Optional[str], Optional[int]]:
    """'user@host:port' as ssh -J takes it; an IPv6 host in brackets ([2001:db8::1]:22)."""
    user, _, hostport = jump.rpartition("@")
    if hostport.startswith("["):
        host, _, rest = hostport[1:].partition("]")
        port = rest.removeprefix(":")
    else:
        host, _, port = hostport.partition(":")
    return host, user or None, int(port) if port else None


def _expand(path: Optional[str]) -> Optional[str]:
    if not path:
        return None
    first = path.split()[0] if isinstance(path, str) else path[0]
    return os.path.expanduser(first)
