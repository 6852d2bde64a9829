"""The OpenAI-compatible HTTP server over one engine, which a single dedicated thread owns."""

from mini_engine.server.app import create_app, serve
from mini_engine.server.loop import EngineLoop

__all__ = ["EngineLoop", "create_app", "serve"]
