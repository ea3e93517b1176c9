"""The private network namespace helper lives in `timelyllm_ros/netns.py` (the ROS-graph demo uses
it too); the tests import it from here, with the module fixture body of the djitellopy tests."""
from __future__ import annotations

from typing import Iterator

from timelyllm_ros.netns import NamespaceUnavailable, port_holder, private_network  # noqa: F401


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
