"""Where the bundled data lives: ONE resolver for robots/, profiles/, workloads/, models/, msg/ ...

A data directory is the source tree's (the repository this package sits in: a checkout, an
editable install), else the ROS package's installed share directory, `share/timelyllm/<sub>`, as
`ament_index_python.get_package_share_directory` finds it (what `colcon build` and
`scripts/install_ros_layout.py` lay out: launch, robots, config, profiles, msg, srv, action, models,
workloads).  With neither, the source tree's path is returned all the same, so that whatever opens
it fails naming the path it expected.

This module sits at the bottom of the package: it imports only the standard library and the
package's name (`timelyllm_ros.PACKAGE`; ament_index_python lazily, and only when the source tree
lacks the directory).  So `core/` may import it for its defaults (`core/robots.ROBOTS_DIR`,
`core/length_predictor.DEFAULT_MODEL_DIR`) without importing upward; injecting the paths instead
would have made every caller of `load_robots()` name the bundled directory.
"""

from __future__ import annotations

from pathlib import Path

from timelyllm_ros import PACKAGE

SOURCE_ROOT = Path(__file__).resolve().parents[1]  # the repository root when run from a source tree


def installed_share() -> Path | None:
    """share/timelyllm of the installed ROS package, or None where ament cannot find it."""
    try:
        from ament_index_python.packages import get_package_share_directory  # type: ignore

        return Path(get_package_share_directory(PACKAGE))
    except Exception:
        return None


def data_dir(sub: str) -> Path:
    """The data directory `sub` (e.g. "robots", "models"): the source tree's, else the installed
    share/timelyllm/<sub>, else the source tree's path (missing: its user's error names it)."""
    src = SOURCE_ROOT / sub
    if src.is_dir():
        return src
    share = installed_share()
    if share is not None and (share / sub).is_dir():
        return share / sub
    return src
