"""RewardPool: score a batch of responses with a verifier, each item under a wall-clock limit.

Isolated verifiers (``VerifierSpec.isolated``, e.g. ``math``) run in a small pool of worker processes, one
item at a time per worker, fed through a pipe each. An item that runs past ``timeout_s`` has its worker killed
(SIGKILL) and scores 0 with reason "timeout"; a worker that dies or a verifier that raises gives 0 with reason
"error". The worker is respawned when next needed; the other items of the batch are unaffected and a batch never
waits more than about ``timeout_s`` for any one item. (A ProcessPoolExecutor cannot cancel a running task, and
math-verify's own SIGALRM timeouts only work on the main thread, so they are disabled inside the verifier.)

Workers are forked (Linux; the parent's loaded modules are shared, so a respawn costs milliseconds) lazily, on
the first batch that needs them and no more than the batch has items. They ignore SIGINT (the parent handles
Ctrl-C and closes them) and die with the parent (PR_SET_PDEATHSIG where available). Items are handed out one at
a time to whichever worker is free, so a batch of 1,000 uses every worker.

Non-isolated verifiers (``exact``, ``countdown``) run in-process, without a timeout; an exception gives "error".

Verdicts of repeated (response, truth) pairs come from an LRU cache keyed by a 16-byte hash of the pair (a long
response is not kept alive by the cache), or by the pair itself when it is short. "timeout" and "error" verdicts are
not cached: they may be transient.
"""

from __future__ import annotations

import hashlib
import multiprocessing as mp
import os
import signal
import time
from collections import OrderedDict
from multiprocessing.connection import Connection, wait
from typing import Any

from rlvrlab.procs import die_with_parent
from rlvrlab.rewards.base import Verdict, VerifierSpec

TIMEOUT = Verdict(0.0, "timeout")
_SHORT = 64  # characters of response + truth up to which a cache key is the pair itself
ERROR = Verdict(0.0, "error")


def default_workers() -> int:
    """The CPU cores this process may use."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


Key = bytes | tuple[str, str]


def _key(response: str, truth: str) -> Key:
    """The pair itself when short (it costs the cache no more than its hash and takes no hashing: a toy-tier step
    scores 64 pairs), else a 16-byte hash of it."""
    if len(response) + len(truth) <= _SHORT:
        return response, truth
    h = hashlib.blake2b(digest_size=16)
    for part in (response, truth):
        data = part.encode("utf-8", "surrogatepass")
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return h.digest()


def _worker_main(conn: Connection, spec: VerifierSpec) -> None:
    """Worker loop: receive (kind, a, b), reply (True, result) or (False, error text); exit on None or EOF."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    die_with_parent(signal.SIGKILL)  # an orphaned worker would otherwise exit only at its next recv
    while True:
        try:
            task = conn.recv()
        except (EOFError, OSError):
            return
        if task is None:
            return
        kind, a, b = task
        try:
            result: Any = spec.check(a, b) if kind == "check" else bool(spec.same_answer(a, b))
            reply = (True, result)
        except BaseException as error:  # noqa: BLE001 - a verifier bug must not take the worker down
            reply = (False, f"{type(error).__name__}: {error}"[:500])
        try:
            conn.send(reply)
        except (BrokenPipeError, OSError):
            return


class _Worker:
    def __init__(self, ctx, spec: VerifierSpec) -> None:
        self.conn, child = ctx.Pipe(duplex=True)
        self.process = ctx.Process(target=_worker_main, args=(child, spec), daemon=True, name="rlvrlab-reward")
        self.process.start()
        child.close()
        self.item: int | None = None  # index of the item in flight
        self.started = 0.0

    def kill(self) -> None:
        if self.process.is_alive():
            self.process.kill()
        self.process.join(timeout=5)
        self.conn.close()

    def stop(self) -> None:
        try:
            self.conn.send(None)
        except (BrokenPipeError, OSError):
            pass
        self.process.join(timeout=1)
        self.kill()  # when it has not ended by then


class RewardPool:
    """Scores (response, truth) pairs with the verifier `spec` (a VERIFIERS name or a VerifierSpec).

    workers: worker processes for an isolated verifier (0 = all cores). timeout_s: wall-clock seconds per item.
    cache_size: verdicts kept (LRU; 0 = no cache). math_extraction: the ``math`` verifier's extraction setting.
    After `score`, `last_seconds` holds how long each item of the batch took (0 for cache hits).
    """

    def __init__(self, spec: str | VerifierSpec, *, workers: int = 0, timeout_s: float = 5.0,
                 cache_size: int = 100_000, math_extraction: str = "boxed") -> None:
        if isinstance(spec, str):
            from rlvrlab.rewards import verifier_spec

            self.name = spec
            spec = verifier_spec(spec, math_extraction=math_extraction)
        else:
            self.name = getattr(spec.check, "__name__", "custom")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        if workers < 0:
            raise ValueError(f"workers must be >= 0 (0 = all cores), got {workers}")
        self.spec = spec
        self.workers = workers or default_workers()
        self.timeout_s = float(timeout_s)
        self.cache_size = cache_size
        self._cache: OrderedDict[Key, Verdict] = OrderedDict()
        self._pool: list[_Worker] = []
        self._ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
        self.last_seconds: list[float] = []
        self.stats = {"items": 0, "cache_hits": 0, "timeouts": 0, "errors": 0, "respawns": 0}

    # ------------------------------------------------------------------ public API

    def score(self, responses: list[str], truths: list[str]) -> list[Verdict]:
        """One Verdict per (response, truth), in order."""
        if len(responses) != len(truths):
            raise ValueError(f"{len(responses)} responses but {len(truths)} truths")
        n = len(responses)
        out: list[Verdict | None] = [None] * n
        seconds = [0.0] * n
        todo: list[int] = []
        first_of: dict[Key, int] = {}  # duplicates within the batch are verified once
        duplicates: list[tuple[int, int]] = []
        keys = [_key(r, t) if isinstance(r, str) and isinstance(t, str) else None for r, t in zip(responses, truths)]
        for i, key in enumerate(keys):
            hit = self._cache_get(key)
            if hit is not None:
                out[i] = hit
                self.stats["cache_hits"] += 1
            elif key is not None and key in first_of:
                duplicates.append((i, first_of[key]))
            else:
                if key is not None:
                    first_of[key] = i
                todo.append(i)
        tasks = [("check", responses[i], truths[i]) for i in todo]
        results, took = self._run(tasks)
        for i, result, s in zip(todo, results, took):
            verdict = result if isinstance(result, Verdict) else (TIMEOUT if result == "timeout" else ERROR)
            out[i], seconds[i] = verdict, s
            if verdict.reason not in ("timeout", "error"):
                self._cache_put(keys[i], verdict)
        for i, j in duplicates:
            out[i] = out[j]
        self.stats["items"] += n
        self.stats["timeouts"] += sum(v.reason == "timeout" for v in out if v is not None)
        self.stats["errors"] += sum(v.reason == "error" for v in out if v is not None)
        self.last_seconds = seconds
        return out  # type: ignore[return-value]

    def same_answer(self, pairs: list[tuple[str, str]]) -> list[bool]:
        """Whether each pair of extracted answers is equivalent (False on timeout or error)."""
        results, _ = self._run([("same", a, b) for a, b in pairs])
        return [r is True for r in results]

    def close(self) -> None:
        """Stop the workers (idempotent). The pool can still be used: workers are started again on demand."""
        for worker in self._pool:
            worker.stop()
        self._pool = []

    def __enter__(self) -> RewardPool:  # noqa: PYI034
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001, S110 - at interpreter exit the pipes may already be gone
            pass

    # ------------------------------------------------------------------ internals

    def _cache_get(self, key: Key | None) -> Verdict | None:
        if key is None or not self.cache_size:
            return None
        verdict = self._cache.get(key)
        if verdict is not None:
            self._cache.move_to_end(key)
        return verdict

    def _cache_put(self, key: Key | None, verdict: Verdict) -> None:
        if key is None or not self.cache_size:
            return
        self._cache[key] = verdict
        self._cache.move_to_end(key)
        while len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)

    def _run(self, tasks: list[tuple[str, str, str]]) -> tuple[list[Any], list[float]]:
        """Results (a Verdict/bool, or "timeout"/"error") and seconds, one per task, in order."""
        if not tasks:
            return [], []
        if not self.spec.isolated:
            return self._run_inline(tasks)
        return self._run_workers(tasks)

    def _run_inline(self, tasks: list[tuple[str, str, str]]) -> tuple[list[Any], list[float]]:
        results: list[Verdict | bool | str] = []  # str: "error", a verifier that raised
        took: list[float] = []
        for kind, a, b in tasks:
            tic = time.perf_counter()
            try:
                results.append(self.spec.check(a, b) if kind == "check" else bool(self.spec.same_answer(a, b)))
            except Exception:  # noqa: BLE001 - a verifier bug scores 0 with reason "error"
                results.append("error")
            took.append(time.perf_counter() - tic)
        return results, took

    def _run_workers(self, tasks: list[tuple[str, str, str]]) -> tuple[list[Any], list[float]]:
        self._prepare_parent()
        n = len(tasks)
        results: list[Any] = [None] * n
        took = [0.0] * n
        pending = list(range(n - 1, -1, -1))  # a stack: pop() hands out items in order
        wanted = min(self.workers, n)
        while len(self._pool) < wanted:
            self._pool.append(self._spawn())
        done = 0
        try:
            while done < n:
                # hand an item to every idle worker
                for k, worker in enumerate(self._pool):
                    if worker.item is None and pending:
                        i = pending.pop()
                        try:
                            worker.conn.send(tasks[i])
                        except (BrokenPipeError, OSError):  # died while idle: replace it and retry the item
                            worker = self._replace(k)
                            worker.conn.send(tasks[i])
                        worker.item, worker.started = i, time.perf_counter()
                busy = [w for w in self._pool if w.item is not None]
                now = time.perf_counter()
                deadline = min(w.started for w in busy) + self.timeout_s
                ready = wait([w.conn for w in busy], timeout=max(0.0, deadline - now))
                now = time.perf_counter()
                for k, worker in enumerate(self._pool):
                    if worker.item is None:
                        continue
                    i = worker.item
                    if worker.conn in ready:
                        try:
                            ok, value = worker.conn.recv()
                            results[i] = value if ok else "error"
                            worker.item = None
                        except (EOFError, OSError):  # the worker died (segfault, os._exit, OOM kill)
                            results[i] = "error"
                            self._replace(k)
                    elif now - worker.started >= self.timeout_s:
                        results[i] = "timeout"
                        self._replace(k)
                    else:
                        continue
                    took[i] = now - worker.started if results[i] == "timeout" else time.perf_counter() - worker.started
                    done += 1
        except BaseException:  # interrupted (Ctrl-C): the workers' state is unknown, start over next time
            for worker in self._pool:
                worker.kill()
            self._pool = []
            raise
        return results, took

    def _spawn(self) -> _Worker:
        return _Worker(self._ctx, self.spec)

    def _replace(self, k: int) -> _Worker:
        self._pool[k].kill()
        self.stats["respawns"] += 1
        self._pool[k] = self._spawn()
        return self._pool[k]

    def _prepare_parent(self) -> None:
        """Import the verifier's heavy modules once in the parent, so forked workers start ready (a respawn
        after a timeout then costs milliseconds, not a second of imports)."""
        if self._ctx.get_start_method() != "fork":
            return
        check = getattr(self.spec.check, "func", self.spec.check)
        if getattr(check, "__module__", "") == "rlvrlab.rewards.math":
            from rlvrlab.rewards import math as math_verifier

            math_verifier.warm_up()
