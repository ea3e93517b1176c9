#!/usr/bin/env python3
"""Lay out the ROS package `timelyllm` (its ament install) inside a prefix: by default this venv.

    .venv/bin/python scripts/install_ros_layout.py             # what `make env` runs
    .venv/bin/python scripts/install_ros_layout.py --prefix /tmp/p --copy

What `colcon build` installs from CMakeLists.txt (minus the Python package, which pip installed
into the venv already, and the interfaces, which scripts/build_ros_interfaces.py installed):

- `lib/timelyllm/planner_node`, `lib/timelyllm/executor_node`: scripts/ros/*, with this prefix's
  Python in the shebang (as pip writes console scripts), so launch_ros' `Node(package="timelyllm",
  executable="planner_node")` starts them with nothing sourced;
- `share/timelyllm/`: package.xml and the data directories (`SHARE_DIRS`: config, robots, launch,
  profiles, models, workloads; msg/srv/action when the interface build has not put them there):
  symlinks to this source tree (like `colcon build --symlink-install`), or copies with --copy;
- `share/ament_index/resource_index/packages/timelyllm`: the ament index entry;
- in a venv, `<site-packages>/timelyllm_ament_prefix.pth`: puts the prefix on AMENT_PREFIX_PATH for
  every interpreter of the venv (the ROS wheels do not set it), so
  `ament_index_python.get_package_share_directory('timelyllm')` works with nothing sourced.

Idempotent: what it made before is replaced; nothing else in the prefix is touched.
"""

from __future__ import annotations

import argparse
import os
import shutil
import stat
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "timelyllm"
EXECUTABLES = ("planner_node", "executor_node")  # scripts/ros/<name> -> lib/timelyllm/<name>
# as CMakeLists.txt's install(DIRECTORY ...) (tests/test_ros_package.py keeps the two equal)
SHARE_DIRS = ("launch", "robots", "config", "profiles", "msg", "srv", "action", "models", "workloads")
INTERFACE_DIRS = ("msg", "srv", "action")  # the rosidl install may own these already
PTH_NAME = "timelyllm_ament_prefix.pth"


def _remove(path: Path) -> None:
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.is_dir():
        shutil.rmtree(path)


def _place(src: Path, dst: Path, copy: bool) -> None:
    _remove(dst)
    if not copy:
        dst.symlink_to(src, target_is_directory=src.is_dir())
    elif src.is_dir():
        shutil.copytree(src, dst, symlinks=False)
    else:
        shutil.copy2(src, dst)


def site_packages(prefix: Path) -> Path | None:
    """The prefix's site-packages, if it is a Python environment (a venv) of this Python's version."""
    sp = prefix / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
    return sp if sp.is_dir() else None


def pth_line(prefix: Path) -> str:
    """One line the site module executes at start: `prefix` first on AMENT_PREFIX_PATH, kept once."""
    p = str(prefix)
    return ("import os; os.environ['AMENT_PREFIX_PATH'] = os.pathsep.join([" + repr(p) + "] + [x for x in "
            "os.environ.get('AMENT_PREFIX_PATH', '').split(os.pathsep) if x and x != " + repr(p) + "])\n")


def install(prefix: Path, *, python: str, copy: bool = False, pth: bool = True) -> list[Path]:
    """Lay the package out in `prefix`; returns what it wrote."""
    made: list[Path] = []
    share = prefix / "share" / PACKAGE
    share.mkdir(parents=True, exist_ok=True)
    for d in SHARE_DIRS:
        dst = share / d
        if d in INTERFACE_DIRS and dst.is_dir() and not dst.is_symlink():
            continue  # installed by the interface build (CMake's manifest owns it)
        if (ROOT / d).is_dir():
            _place(ROOT / d, dst, copy)
            made.append(dst)
    shutil.copy2(ROOT / "package.xml", share / "package.xml")
    made.append(share / "package.xml")

    lib = prefix / "lib" / PACKAGE
    lib.mkdir(parents=True, exist_ok=True)
    for name in EXECUTABLES:
        body = (ROOT / "scripts" / "ros" / name).read_text().split("\n", 1)[1]  # without its shebang
        dst = lib / name
        _remove(dst)
        dst.write_text(f"#!{python}\n{body}")
        dst.chmod(dst.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        made.append(dst)

    index = prefix / "share" / "ament_index" / "resource_index" / "packages" / PACKAGE
    index.parent.mkdir(parents=True, exist_ok=True)
    if not index.exists():
        index.write_text("")
    made.append(index)

    sp = site_packages(prefix) if pth else None
    if sp is not None:
        (sp / PTH_NAME).write_text(pth_line(prefix))
        made.append(sp / PTH_NAME)
    return made


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prefix", type=Path, default=Path(sys.prefix), help="install prefix (default: this venv)")
    ap.add_argument("--python", default="", help="interpreter for the executables' shebang "
                                                 "(default: <prefix>/bin/python if present, else this one)")
    ap.add_argument("--copy", action="store_true", help="copy the data directories instead of symlinking them")
    ap.add_argument("--no-pth", action="store_true", help="do not put the prefix on AMENT_PREFIX_PATH (.pth)")
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args(argv)
    prefix = args.prefix.absolute()
    if not prefix.is_dir():
        print(f"error: --prefix {prefix}: no such directory", file=sys.stderr)
        return 2
    python = args.python or (str(prefix / "bin" / "python") if (prefix / "bin" / "python").exists() else sys.executable)
    made = install(prefix, python=python, copy=args.copy, pth=not args.no_pth)
    if not args.quiet:
        print(f"ROS package layout of {PACKAGE} in {prefix}: {len(made)} entries "
              f"(lib/{PACKAGE}/{{{','.join(EXECUTABLES)}}}, share/{PACKAGE}, ament index)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
