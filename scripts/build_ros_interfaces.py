#!/usr/bin/env python3
"""Build this package's ROS 2 interfaces (msg/, action/) into the running venv.

    .venv/bin/python scripts/build_ros_interfaces.py      # what `make env` runs

The ROS 2 Jazzy wheels from PyPI (`ros-jazzy-*`, installed by `make env`) lay out a ROS prefix
inside the venv: `lib/` (C libraries), `share/` (CMake configs, ament index) and the Python
packages in site-packages.  This script configures the package with plain CMake against that
prefix (AMENT_PREFIX_PATH = CMAKE_PREFIX_PATH = the venv), builds it, and installs the interfaces
into the same prefix:

- the generated Python package `timelyllm` (timelyllm.msg, timelyllm.action) into site-packages,
- its type-support libraries into `<venv>/lib`, which the wheels' `ros_wheels_bootstrapper.pth`
  puts on LD_LIBRARY_PATH for every interpreter of the venv,
- `share/timelyllm` + the ament index entry next to the other ROS packages.

So `<venv>/bin/python -c "import rclpy; from timelyllm.action import ExecuteSegment"` works with
nothing sourced.  Before configuring it rewrites one defect of the wheels: their exported CMake
files name the wheel builder's Python and numpy include directories (/opt/python/cp311-cp311/...);
those become this interpreter's include directory and this venv's numpy include directory.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# the include directories the wheels were built with (manylinux image paths)
_BUILDER_PY_INCLUDE = re.compile(r"/opt/python/cp\d+-cp\d+t?/include/python3\.\d+t?")
_BUILDER_NUMPY_INCLUDE = re.compile(
    r"/opt/python/cp\d+-cp\d+t?/lib/python3\.\d+t?/site-packages/numpy/(?:_core|core)/include")


def fix_exported_includes(prefix: Path) -> list[Path]:
    """Point the wheels' exported Python/numpy include dirs at this interpreter's; idempotent."""
    import numpy  # the venv's numpy: the generated C extensions compile against it

    py_include = sysconfig.get_paths()["include"]
    np_include = numpy.get_include()
    changed = []
    for f in sorted((prefix / "share").glob("*/cmake/*.cmake")):
        text = f.read_text()
        if "/opt/python/" not in text:
            continue
        new = _BUILDER_NUMPY_INCLUDE.sub(np_include, text)
        new = _BUILDER_PY_INCLUDE.sub(py_include, new)
        if new != text:
            f.write_text(new)
            changed.append(f)
    return changed


def _run(cmd: list[str], env: dict[str, str]) -> None:
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, env=env)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build-dir", type=Path, default=ROOT / "build" / "ros-interfaces")
    ap.add_argument("--prefix", type=Path, default=Path(sys.prefix),
                    help="ROS prefix to build against and install into (default: this venv)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args(argv)
    prefix = args.prefix.resolve()
    if not (prefix / "share" / "rosidl_default_generators").is_dir():
        print(f"error: no ROS 2 build wheels in {prefix} (rosidl_default_generators missing); "
              "run `make env`", file=sys.stderr)
        return 2
    cmake = shutil.which("cmake")
    if cmake is None:
        print("error: cmake not found on PATH (apt-get install cmake, or pip install cmake)",
              file=sys.stderr)
        return 2
    for f in fix_exported_includes(prefix):
        print(f"fixed include dirs in {f.relative_to(prefix)}")

    env = dict(os.environ)
    env["AMENT_PREFIX_PATH"] = os.pathsep.join(
        [str(prefix)] + [p for p in env.get("AMENT_PREFIX_PATH", "").split(os.pathsep) if p])
    env["CMAKE_PREFIX_PATH"] = str(prefix)
    # the generators run as `python -m ...` subprocesses and import the wheels' packages
    env["PATH"] = os.pathsep.join([str(prefix / "bin"), env.get("PATH", "")])
    gen = ["-G", "Ninja"] if shutil.which("ninja") else []
    _run([cmake, "-S", str(ROOT), "-B", str(args.build_dir), *gen,
          f"-DCMAKE_INSTALL_PREFIX={prefix}",
          f"-DCMAKE_PREFIX_PATH={prefix}",
          f"-DPython3_EXECUTABLE={prefix / 'bin' / 'python'}",
          "-DPython3_FIND_VIRTUALENV=ONLY",
          "-DBUILD_TESTING=OFF",
          "-DTIMELYLLM_INTERFACES_ONLY=ON",
          "-DCMAKE_BUILD_TYPE=Release"], env)
    _run([cmake, "--build", str(args.build_dir), "--parallel", str(args.jobs)], env)
    # files of the previous install (an interface removed since must not linger in the venv)
    manifest = args.build_dir / "install_manifest.txt"
    if manifest.is_file():
        for line in manifest.read_text().splitlines():
            Path(line).unlink(missing_ok=True)
    _run([cmake, "--install", str(args.build_dir)], env)
    return 0


if __name__ == "__main__":
    sys.exit(main())
