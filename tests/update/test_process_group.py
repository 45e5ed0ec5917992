"""rlvrlab.update.dist: the process group rlvrlab creates is destroyed at exit, before interpreter finalization.

Left to finalization, gloo's worker threads can still hold work with Python references and the process aborts
with SIGABRT after the run has finished ("terminate called without an active exception"; seen in CI on the
2-rank ZeRO-2 packing check, pytorch/pytorch#190489). The abort itself is a race; what is checked is the cause."""

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# atexit runs handlers last-registered first: this one, registered before the group exists, runs after rlvrlab's
SCRIPT = """
import atexit
import torch.distributed as dist
atexit.register(lambda: print("initialized at exit:", dist.is_initialized(), flush=True))
from rlvrlab.update.dist import all_sum, init_process_group
import torch
init_process_group()
assert dist.is_initialized() and float(all_sum(torch.ones(1))[0]) == 1.0
print("trained", flush=True)
"""


def test_the_process_group_is_destroyed_before_the_interpreter_goes():
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    result = subprocess.run([sys.executable, "-c", SCRIPT], cwd=REPO, env={**env, "PYTHONPATH": str(REPO)},
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.splitlines()[-2:] == ["trained", "initialized at exit: False"], result.stdout


# the first port _free_port finds is taken (a listening socket of this process) before the store binds it
TAKEN = """
import socket
import torch.distributed as dist
from rlvrlab.update import dist as rdist
held = socket.socket()
held.bind(("127.0.0.1", 0))
held.listen()
ports = [held.getsockname()[1]]
free = rdist._free_port
rdist._free_port = lambda: ports.pop() if ports else free()
rdist.init_process_group()
import os
assert dist.is_initialized() and int(os.environ["MASTER_PORT"]) != held.getsockname()[1]
print("initialized on another port", flush=True)
"""


def test_a_port_taken_before_the_store_binds_it_is_chosen_again():
    """One process's group picks a free port, which any process may take before the store binds it (CI: EADDRINUSE
    beside other tests); rlvrlab picks another, where the port was its own choice."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    result = subprocess.run([sys.executable, "-c", TAKEN], cwd=REPO, env={**env, "PYTHONPATH": str(REPO)},
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.splitlines()[-1] == "initialized on another port", result.stdout
