"""The engine port is core's (`timelyllm_ros.core.engine`); re-exported here for adapters and
callers that import it from the engines package."""

from ..core.engine import (Engine, EngineError, EngineOutput, EngineStats, StepRecord, Tokenizer,
                           host_gaps)

__all__ = ["Engine", "EngineError", "EngineOutput", "EngineStats", "StepRecord", "Tokenizer", "host_gaps"]
