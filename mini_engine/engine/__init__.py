"""The engine: device state storage, model runner, cache manager, scheduler and the embedded API."""

from mini_engine.engine.config import EngineConfig
from mini_engine.engine.engine import Engine, RequestIdInUse, RequestResult
from mini_engine.engine.request import SamplingParams

__all__ = ["Engine", "EngineConfig", "RequestIdInUse", "RequestResult", "SamplingParams"]
