"""Record a run's topics to a rosbag2 MCAP bag, and read one back.

Writing uses rosbags' rosbag2 writer with its MCAP storage plugin: rosbags is already the
project's ROS-message library (CDR round-trips in the tests), is maintained, and writes a
complete rosbag2 directory (metadata.yaml + .mcap, message definitions included) that
`ros2 bag`, rosbags and Foxglove read — no second MCAP library needed.

The recorder subscribes with rclpy in *raw* mode: the CDR bytes that crossed DDS are stored as
they came, nothing is re-serialised.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

from timelyllm_ros.ros import cdr


@dataclass(frozen=True)
class Topic:
    name: str  # absolute, e.g. /request_status
    msg_type: str  # e.g. timelyllm/msg/RequestStatus
    qos: str  # transport QoS name (transport/base.py)


class BagRecorder:
    """Record `topics` seen by an rclpy node (an `RclpyTransport`'s node) into the rosbag2
    directory `path` (it must not exist yet)."""

    def __init__(self, node: Any, path: str | Path, topics: Sequence[Topic]) -> None:
        from rosbags.rosbag2 import StoragePlugin, Writer

        from timelyllm_ros.ros.message_fields import message_class
        from timelyllm_ros.transport.rclpy_transport import qos_profile

        self.path = Path(path)
        self._node = node
        self._lock = threading.Lock()
        self._closed = False
        self.counts: dict[str, int] = {t.name: 0 for t in topics}
        self._writer = Writer(self.path, version=9, storage_plugin=StoragePlugin.MCAP)
        self._writer.open()
        ts = cdr.typestore()
        self._subs = []
        for t in topics:
            conn = self._writer.add_connection(t.name, t.msg_type, typestore=ts)
            self._subs.append(node.create_subscription(
                message_class(t.msg_type), t.name, lambda data, c=conn, n=t.name: self._write(c, n, data),
                qos_profile(t.qos), raw=True))

    def _write(self, conn: Any, topic: str, data: bytes) -> None:
        with self._lock:
            if self._closed:
                return
            self._writer.write(conn, time.time_ns(), data)
            self.counts[topic] += 1

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        for s in self._subs:
            self._node.destroy_subscription(s)
        self._writer.close()

    def files(self) -> list[Path]:
        return sorted(self.path.glob("*.mcap"))


def read_bag(path: str | Path) -> Iterator[tuple[str, str, int, dict[str, Any]]]:
    """(topic, message type, timestamp ns, field dict) of every message in a rosbag2 bag."""
    from rosbags.rosbag2 import Reader

    ts = cdr.typestore()
    with Reader(Path(path)) as reader:
        for conn, stamp, raw in reader.messages():
            msg = ts.deserialize_cdr(raw, conn.msgtype)
            yield conn.topic, conn.msgtype, stamp, cdr.from_rosbags(msg, ts)


__all__ = ["BagRecorder", "Topic", "read_bag"]
