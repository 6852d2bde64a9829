"""The engine: device state storage, model runner, cache manager, scheduler and the embedded API."""
