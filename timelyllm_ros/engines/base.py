"""The engine port is core's (`timelyllm_ros.core.engine`); re-exported here for adapters and
callers that import it from the engines package, next to the step-log files (I/O, so not core)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Sequence

from ..core.engine import (Engine, EngineError, EngineOutput, EngineStats, StepRecord, Tokenizer,
                           host_gaps)

__all__ = ["Engine", "EngineError", "EngineOutput", "EngineStats", "StepRecord", "Tokenizer", "host_gaps",
           "load_step_log", "save_step_log"]


def save_step_log(path: str | Path, records: Sequence[StepRecord]) -> None:
    """StepRecords as JSON lines (a planner node's serving steps, read by `timelyllm demo`)."""
    Path(path).write_text("".join(json.dumps(dataclasses.asdict(r)) + "\n" for r in records))


def load_step_log(path: str | Path) -> list[StepRecord]:
    return [StepRecord(**json.loads(line)) for line in Path(path).read_text().splitlines() if line.strip()]
