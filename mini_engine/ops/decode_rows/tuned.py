"""The decode gemm's choices measured ahead of time, per GPU model: ``decode_gemm="tuned"``.

``gemm.choose`` (``decode_gemm="auto"``) times the candidates on the device at the engine's start: 1-6 s, and
its choice follows that moment's timings, so two processes may choose differently for one weight, and a row's
bits differ with the gemm that computed them (a replay in a new process would not be exact). The table here is
the same timing done once (``scripts/tune_decode_gemms.py`` on the GPU), kept in the package
(``tuned_gemms.json``) and looked up by the device's name, the weight's dtype and its shape: the same choice in
every process on that GPU model, at no cost at start. A weight the table does not list, a GPU it does not name,
or a choice this triton cannot launch (TMA, dependent launches) goes to cuBLAS (``inv.linear``), the
``"cublas"`` default. ``EngineConfig.decode_gemm_table`` names a table file to read in the package's place (a GPU
model the package does not list, tuned where it runs; or a re-tuning tried before it replaces the package's).

An entry (``record``) keeps its evidence: the chosen configuration, or ``null`` for cuBLAS, the microseconds
``gemm.rank_by_batch`` measured for it and for cuBLAS (summed over the batches it was timed at), at each batch its,
cuBLAS's and the fastest candidate's there (``by_batch``; entries written before session 27 have none), and the
triton and torch it was measured with.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import torch

from mini_engine.ops import pdl
from mini_engine.ops.decode_rows.gemm import GemmConfig

__all__ = ["TABLE", "entry_key", "launchable", "load", "lookup", "record", "tuned"]

TABLE = Path(__file__).with_name("tuned_gemms.json")


def entry_key(dtype: torch.dtype, shape: tuple[int, int]) -> str:
    """The table's key of a weight: its dtype and [N, K], e.g. ``"bfloat16 6144x1024"``."""
    return f"{str(dtype).removeprefix('torch.')} {shape[0]}x{shape[1]}"


def load(path: str | Path = TABLE) -> dict[str, dict[str, dict[str, Any]]]:
    """The table: device name -> weight key -> entry. A missing file is an empty table; a malformed one raises
    ValueError naming the file (a table nobody can read must not quietly fall back)."""
    path = Path(path)
    if not path.exists():
        return {}
    try:
        table = json.loads(path.read_text())
        for entries in table.values():
            for entry in entries.values():
                for config in [entry["config"], *(b["fastest"] for b in entry.get("by_batch", {}).values())]:
                    if config is not None:
                        GemmConfig(**config)
    except (json.JSONDecodeError, AttributeError, KeyError, TypeError) as err:
        raise ValueError(f"{path}: not a decode gemm table ({type(err).__name__}: {err}); rewrite it with "
                         "scripts/tune_decode_gemms.py") from None
    return table


@cache
def _packaged() -> dict[str, dict[str, dict[str, Any]]]:
    return load(TABLE)


def launchable(config: GemmConfig) -> bool:
    """Whether this triton can launch ``config``: a dependent launch needs ``pdl.available()``, a TMA tile the
    tensor descriptors of triton 3.4 on."""
    if config.pdl and not pdl.available():
        return False
    if config.tma:
        try:
            from triton.tools.tensor_descriptor import TensorDescriptor  # noqa: F401
        except ImportError:
            return False
    return True


def lookup(table: dict, device_name: str, dtype: torch.dtype, shape: tuple[int, int]) -> GemmConfig | None:
    """The table's choice for a weight, or None (cuBLAS): also for an unlisted device or weight, and for a choice
    this triton cannot launch."""
    entry = table.get(device_name, {}).get(entry_key(dtype, shape))
    if entry is None or entry["config"] is None:
        return None
    config = GemmConfig(**entry["config"])
    return config if launchable(config) else None


def tuned(weight: torch.Tensor, table: dict | None = None) -> GemmConfig | None:
    """The table's choice for ``weight`` on its CUDA device (None: cuBLAS): the packaged table's, or ``table``'s
    (``load``ed from a file ``scripts/tune_decode_gemms.py --out`` wrote: ``EngineConfig.decode_gemm_table``)."""
    if not weight.is_cuda:
        return None
    return lookup(_packaged() if table is None else table, torch.cuda.get_device_name(weight.device), weight.dtype,
                  tuple(weight.shape))


def record(table: dict, device_name: str, weight: torch.Tensor,
           ranking: list[tuple[GemmConfig | None, dict[int, float]]]) -> dict[str, Any]:
    """Put ``ranking``'s winner (``gemm.rank_by_batch``: candidates with their microseconds at each batch, fastest
    by their sum first) in ``table`` for ``weight`` on ``device_name``; returns the entry. Beside the sums
    (``us``, ``cublas_us``) it keeps each batch's times: the winner's, cuBLAS's and the fastest candidate's at that
    batch (``by_batch``), where the one choice gives up time at a batch."""
    import triton

    best, times = ranking[0]
    cublas = next(t for config, t in ranking if config is None)
    by_batch = {}
    for batch in times:
        fastest, fastest_times = min(ranking, key=lambda pair: pair[1][batch])
        by_batch[str(batch)] = {"us": round(times[batch], 2), "cublas_us": round(cublas[batch], 2),
                                "fastest": None if fastest is None else fastest._asdict(),
                                "fastest_us": round(fastest_times[batch], 2)}
    entry = {"config": None if best is None else best._asdict(), "us": round(sum(times.values()), 2),
             "cublas_us": round(sum(cublas.values()), 2), "by_batch": by_batch, "triton": triton.__version__,
             "torch": torch.__version__}
    table.setdefault(device_name, {})[entry_key(weight.dtype, tuple(weight.shape))] = entry
    return entry
