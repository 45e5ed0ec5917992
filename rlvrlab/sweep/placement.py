"""GPU placement for sweep workers on one machine: with `--workers N --gpus-per-run k`, worker i owns the disjoint
devices [i*k, (i+1)*k) of the machine's list and every seed run it starts sees only those
(`CUDA_VISIBLE_DEVICES`). The device list is the one the machine shows (torch's device count, or the indices in an
inherited `CUDA_VISIBLE_DEVICES`), or one given explicitly (tests on CPU give it).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from rlvrlab.errors import RlvrlabError


def visible_devices(environ: dict[str, str] | None = None) -> list[str]:
    """The GPUs this process may use: the entries of CUDA_VISIBLE_DEVICES when set, else 0..count-1."""
    env = os.environ if environ is None else environ
    if env.get("CUDA_VISIBLE_DEVICES") is not None:
        return [d.strip() for d in env["CUDA_VISIBLE_DEVICES"].split(",") if d.strip()]
    import torch

    return [str(i) for i in range(torch.cuda.device_count())]


def assign(workers: int, gpus_per_run: int, devices: Sequence[str]) -> list[str]:
    """The CUDA_VISIBLE_DEVICES value of each of `workers` workers (disjoint sets of `gpus_per_run` devices); a
    one-line error when they do not fit."""
    if workers < 1 or gpus_per_run < 1:
        raise RlvrlabError(f"--workers {workers} and --gpus-per-run {gpus_per_run} must both be at least 1")
    if len(set(devices)) != len(devices):
        raise RlvrlabError(f"the device list {','.join(devices)} names a device twice; give each once")
    needed = workers * gpus_per_run
    if needed > len(devices):
        shown = ",".join(devices) or "none"
        raise RlvrlabError(f"--workers {workers} x --gpus-per-run {gpus_per_run} needs {needed} GPUs, but this "
                           f"machine shows {len(devices)} ({shown}); lower one of them")
    return [",".join(devices[i * gpus_per_run:(i + 1) * gpus_per_run]) for i in range(workers)]
