"""A private network namespace for tests that need fixed, host-wide ports.

djitellopy binds UDP 0.0.0.0:8889 (replies) and 8890 (state) once per process, as a real Tello
client must.  On a host where another process holds those ports (another test run, a real Tello
client), its tests would fail with "Address already in use".  `private_network()` moves the
calling thread into a fresh network namespace (Linux `unshare(CLONE_NEWNET)`, needs root or
CAP_SYS_ADMIN) with its loopback up, so sockets and threads made inside it see only their own
ports; on exit the thread returns to the host's namespace (sockets made inside stay in it).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
import socket
import struct
from typing import Iterator

CLONE_NEWNET = 0x40000000
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1


class NamespaceUnavailable(OSError):
    """This process may not create a network namespace (not root / no CAP_SYS_ADMIN, not Linux)."""


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _loopback_up() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        req = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(s.fileno(), SIOCGIFFLAGS, req))[1]
        fcntl.ioctl(s.fileno(), SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | IFF_UP))


_shared_ns: int | None = None  # fd of this process's private namespace, once made


@contextlib.contextmanager
def private_network() -> Iterator[None]:
    """Run the body (this thread, and threads it starts) in this process's private network
    namespace: made (with loopback up) at the first use, re-entered by later ones -- djitellopy's
    sockets are process-wide, so every test module that talks to it must share one namespace."""
    global _shared_ns
    try:
        host = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    except OSError as e:
        raise NamespaceUnavailable(e.errno, f"no network namespaces here: {e}") from None
    libc = _libc()
    try:
        if _shared_ns is not None:
            if libc.setns(_shared_ns, CLONE_NEWNET) != 0:
                err = ctypes.get_errno()
                raise NamespaceUnavailable(err, f"setns into the test namespace: {os.strerror(err)}")
        else:
            if libc.unshare(CLONE_NEWNET) != 0:
                err = ctypes.get_errno()
                raise NamespaceUnavailable(err, f"unshare(CLONE_NEWNET): {os.strerror(err)}")
            _loopback_up()
            _shared_ns = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        try:
            yield
        finally:
            if libc.setns(host, CLONE_NEWNET) != 0:
                err = ctypes.get_errno()
                raise OSError(err, f"setns back to the host network: {os.strerror(err)}")
    finally:
        os.close(host)


def own_udp_ports() -> Iterator[None]:
    """Body of the module fixture of every djitellopy test module: djitellopy's process-wide UDP
    8889/8890 (and the emulators) in the private namespace, so another process holding those
    ports on the host does not matter; where no namespace is possible and they are held, skip
    with the reason."""
    import pytest

    ctx = private_network()
    try:
        ctx.__enter__()
    except NamespaceUnavailable as e:
        held = port_holder(8889) or port_holder(8890)
        if held:
            pytest.skip(f"{held}: djitellopy binds 0.0.0.0:8889/8890 process-wide, and no private network "
                        f"namespace is possible here ({e})")
        yield  # the host's ports are free: use them
        return
    try:
        yield
    finally:
        ctx.__exit__(None, None, None)


def port_holder(port: int, proto: int = socket.SOCK_DGRAM) -> str | None:
    """None if 0.0.0.0:port can be bound here, else a description of why not."""
    with socket.socket(socket.AF_INET, proto) as s:
        try:
            s.bind(("", port))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                return f"UDP {port} is held by another process on this host"
            return f"UDP {port}: {e.strerror}"
    return None
