"""Rewards in [0, 1] for a sampled answer against the ground truth.

Two rewards, picked by name through :func:`get_reward`:

- ``exact_match``: the embedded task. The answer is written least-significant digit first,
  so no normalisation beyond whitespace is needed.
- ``math_verify``: the GPU profile (competition math, e.g. deepscaler). The ``\\boxed{}``
  answer of the response is parsed from LaTeX and compared symbolically with the LaTeX
  ground truth by the ``math-verify`` package, so ``\\frac{1}{2}``, ``0.5`` and ``1/2``
  all score 1.0.

Why the math-verify reward runs in worker processes
----------------------------------------------------
Parsing and comparing with sympy can take unbounded time and memory on a pathological
response (``\\boxed{9^{9^{9^{9^{9}}}}}`` asks Python for a number with hundreds of millions
of digits), and a policy under RL produces such answers sooner or later. math-verify's own
timeout uses ``signal.alarm``, which only works in the main thread and cannot interrupt C
code (a big-integer power never returns to the interpreter). A reward that hangs stalls the
whole run, so every verification is bounded *from outside*:

- a small pool of long-lived worker processes (started with ``subprocess``, i.e. fork+exec,
  so it is safe from a parent that holds CUDA or vLLM state and never re-imports the
  caller's ``__main__``) does ``parse`` + ``verify``;
- inside a worker an interval timer interrupts Python-level work at ``timeout_s``
  (cheap: the worker lives on);
- the parent kills a worker that has not answered by ``timeout_s + grace`` (stuck in C
  code) and starts a replacement in the background; that answer scores 0.0;
- both clocks count the worker's CPU time, not the wall clock (the parent reads it from
  ``/proc``; elsewhere it falls back to the wall clock), so whether an answer times out does
  not depend on how long it waited for a core: a reward, and the ground-truth checks of
  ``dots prepare``, come out the same on a busy machine as on an idle one (up to the CPU time
  itself growing under contention: ``scripts/reward_load_probe.py``). A worker whose
  answer has taken ``WALL_FACTOR`` times its budget in wall-clock time, however little CPU it
  got (stopped, blocked), is killed as well;
- each worker's address space is capped (``DOTS_REWARD_MEMORY_MB``, default 4096) so a
  huge number fails with MemoryError instead of swapping the machine;
- any exception while scoring one answer scores 0.0 for that answer. Only a worker that
  cannot *start* (math-verify not installed) raises, because silently scoring a whole run 0
  would be worse than stopping.

The process hop costs about 0.1 ms a call (measured on two CPU cores: 0.19 ms for a trivial
answer through the pool against 0.08 ms in-process; ``tests/test_rewards.py`` prints it), less
than one sympy parse; each worker caches its ground-truth parses, so a question's G responses
parse the gold once. :func:`math_verify_rewards` scores a whole batch at once, spread over the
workers (``DOTS_REWARD_WORKERS``, default min(8, CPU count)).
"""

from __future__ import annotations

import atexit
import json
import math
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection, wait
from pathlib import Path

from .processes import cpu_seconds
from .redact import environ_snapshot


def exact_match(text: str, answer: str) -> float:
    """1.0 when the decoded response is exactly the answer (whitespace ignored), else 0.0."""
    return 1.0 if "".join(text.split()) == answer else 0.0


# --------------------------------------------------------------------------------------
# math-verify, scored in worker processes
# --------------------------------------------------------------------------------------

DEFAULT_TIMEOUT_S = 5.0
GRACE_S = 0.5  # extra time the parent grants before killing a worker that ignores its own alarm
# An item's budget is CPU time; past this many times it in wall-clock seconds the worker is taken
# for hung (stopped, blocked), however little CPU it used. Generous: a loaded machine is not a hang.
WALL_FACTOR = 10.0
STARTUP_TIMEOUT_S = 120.0  # importing sympy on a loaded machine can take a while


class RewardUnavailable(RuntimeError):
    """The math_verify reward cannot run at all (e.g. the package is not installed)."""


class _Timeout(BaseException):
    """Raised by the worker's interval timer. A BaseException so that math-verify's internal
    ``except Exception`` handlers cannot swallow it and carry on past the deadline."""


_DELIMITERS = (("$$", "$$"), ("\\[", "\\]"), ("\\(", "\\)"), ("$", "$"))


def latex_answer(text: str) -> str:
    """A ground truth (or response) as math-verify should see it.

    - Percent signs are dropped (``24\\%`` -> ``24``), as the DeepScaleR/verl graders do: math-verify
      reads ``%`` as the start of a LaTeX comment, so ``\\boxed{24\\%}`` parses to nothing and
      ``\\boxed{24\\% + 1}`` to ``1`` (measured, math-verify 0.9).
    - Math delimiters around a whole ground truth (``\\[ 6 \\]``, ``$6$``) are removed, so it can be
      wrapped in ``\\boxed{}``.
    """
    t = text.replace("\\%", "").replace("%", "").strip()
    for left, right in _DELIMITERS:
        inner = t[len(left):-len(right)]
        if (len(t) > len(left) + len(right) and t.startswith(left) and t.endswith(right)
                and left not in inner and right not in inner):  # one block, not "$a$ and $b$"
            t = inner.strip()
            break
    return t


def _gold_candidates(answer: str) -> list[str]:
    """LaTeX renderings of a ground truth to try, best first.

    Measured on the 10,240 deepscaler ground truths: wrapping in ``\\boxed{}`` parses more of them than
    ``$...$`` (10,167 against 10,161 before percent signs were dropped), so boxed comes first.
    """
    g = latex_answer(answer)
    return [f"\\boxed{{{g}}}", f"${g}$"]


def _worker_main() -> None:  # pragma: no cover - runs in the worker process
    """Serve scoring requests on the two pipe fds named in argv until the parent closes them."""
    req_fd, res_fd = int(sys.argv[1]), int(sys.argv[2])
    requests = Connection(req_fd, writable=False)
    results = Connection(res_fd, readable=False)
    try:
        import logging
        import resource
        import signal

        limit_mb = int(os.environ.get("DOTS_REWARD_MEMORY_MB", "4096"))
        if limit_mb > 0:
            try:
                resource.setrlimit(resource.RLIMIT_AS, (limit_mb << 20, limit_mb << 20))
            except (ValueError, OSError):
                pass
        from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify
        from sympy import Basic, MatrixBase

        # We bound time ourselves; silence math-verify's "timeout disabled/timed out" warnings.
        logging.getLogger("math_verify").setLevel(logging.ERROR)
        logging.getLogger("latex2sympy2_extended").setLevel(logging.ERROR)
    except BaseException as exc:  # noqa: BLE001 - report any startup failure to the parent
        try:
            results.send_bytes(json.dumps({"error": f"{type(exc).__name__}: {exc}"}).encode())
        except (BrokenPipeError, OSError):
            pass
        return

    def on_alarm(signum, frame):
        raise _Timeout()

    signal.signal(signal.SIGPROF, on_alarm)  # ITIMER_PROF: the budget is this process's CPU time
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle; it closes us
    latex_only = [LatexExtractionConfig()]
    # Boxed answers first (the prompt asks for \boxed{}), then any other LaTeX, then plain expressions.
    pred_config = [LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig()]
    gold_cache: dict[str, tuple[list, bool]] = {}  # a question's G responses share one gold parse

    def parse_gold(answer: str) -> tuple[list, bool]:
        """(what a response is verified against, whether math-verify made a sympy object of it)."""
        if answer in gold_cache:
            return gold_cache[answer]
        gold: list = []
        parsed_ok = False
        for candidate in _gold_candidates(answer):
            parsed = parse(candidate, extraction_config=latex_only, parsing_timeout=None)
            if parsed and isinstance(parsed[0], (Basic, MatrixBase)):
                gold, parsed_ok = list(parsed), True
                break
            gold = gold or list(parsed)
        for verbatim in (answer.strip(), latex_answer(answer)):
            if verbatim and verbatim not in gold:
                gold.append(verbatim)  # exact textual matches always count
        if len(gold_cache) > 4096:
            gold_cache.clear()
        gold_cache[answer] = (gold, parsed_ok)
        return gold, parsed_ok

    def score_one(item: list) -> dict:
        text, answer = item
        gold, _ = parse_gold(answer)
        text = text.replace("\\%", "").replace("%", "")  # see latex_answer
        pred = parse(text, extraction_config=pred_config, parsing_timeout=None)
        return {"score": 1.0 if pred and verify(gold, pred, timeout_seconds=None) else 0.0}

    def check_gold(answer: str) -> dict:
        return {"parsed": parse_gold(answer)[1]}

    try:
        results.send_bytes(json.dumps({"ready": True, "cpu": time.process_time()}).encode())
    except (BrokenPipeError, OSError):
        return  # the parent went away (or closed the pool) while we were starting
    while True:
        try:
            job = json.loads(requests.recv_bytes())
        except (EOFError, OSError):
            return
        # One request carries a list of items; one reply goes back per item, as soon as it is done,
        # so the parent's deadline is per item however long the list.
        work = check_gold if job.get("op") == "gold" else score_one
        for item in job["items"]:
            status, out = "ok", {}
            try:
                signal.setitimer(signal.ITIMER_PROF, max(float(job["timeout"]), 1e-3))
                try:
                    out = work(item)
                finally:
                    signal.setitimer(signal.ITIMER_PROF, 0)
            except _Timeout:
                status = "timeout"
            except BaseException as exc:  # noqa: BLE001 - any failure scores 0.0 / reads as unparsed
                status = f"error: {type(exc).__name__}"
                if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                    return
            try:  # "cpu": where the parent starts counting the next item's budget
                results.send_bytes(json.dumps({**out, "status": status, "cpu": time.process_time()}).encode())
            except (BrokenPipeError, OSError):
                return


class _Worker:
    """One worker process and the two pipes to it."""

    def __init__(self) -> None:
        req_r, req_w = os.pipe()
        res_r, res_w = os.pipe()
        env = environ_snapshot()  # dict(os.environ) can die of MLflow's telemetry thread changing it
        pkg_root = str(Path(__file__).resolve().parents[1])
        env["PYTHONPATH"] = pkg_root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", "from dots.rewards import _worker_main; _worker_main()",
                 str(req_r), str(res_w)],
                pass_fds=(req_r, res_w), stdin=subprocess.DEVNULL, env=env, close_fds=True,
            )
        finally:
            os.close(req_r)
            os.close(res_w)
        self.requests = Connection(req_w, readable=False)
        self.results = Connection(res_r, writable=False)
        self.ready = False
        self.started = time.monotonic()
        self.job: list[int] | None = None  # indices of the items sent and not yet answered, in order
        self.cpu = 0.0  # the worker's CPU seconds at its last reply
        self.cpu_limit = math.inf  # ... at which its current item has run out of budget (+ grace)
        self.item_started = 0.0  # wall clock, when the current item's budget began
        self.check_at = math.inf  # wall clock, the earliest its budget could run out: look then
        self.budget_s = 0.0  # the current item's: timeout + grace

    def start_item(self, now: float, budget_s: float) -> None:
        self.budget_s, self.item_started, self.check_at = budget_s, now, now + budget_s
        self.cpu_limit = self.cpu + budget_s

    def out_of_time(self, now: float, wall_factor: float) -> bool:
        """Whether the current item has used up its CPU budget, or taken ``wall_factor`` times it in
        wall-clock time however little CPU it got; if not, when to look again (``check_at``). CPU time
        runs no faster than the wall clock for this one-threaded worker, so looking earlier is never
        needed."""
        if now < self.check_at:
            return False
        cpu = cpu_seconds(self.proc.pid)
        hung_at = self.item_started + wall_factor * self.budget_s
        if cpu is None or cpu >= self.cpu_limit or now >= hung_at:
            return True  # (no /proc: the wall clock, as the budget's only measure)
        self.check_at = min(now + self.cpu_limit - cpu, hung_at)
        return False

    def kill(self) -> None:
        try:
            self.proc.kill()
        except OSError:
            pass
        for conn in (self.requests, self.results):
            try:
                conn.close()
            except OSError:
                pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass

    def close_requests(self) -> None:
        """EOF on the request pipe: the worker finishes and exits by itself."""
        try:
            self.requests.close()
        except OSError:
            pass


class MathVerifyPool:
    """A few long-lived math-verify worker processes with hard per-answer deadlines.

    Thread-safe (one batch at a time). Workers start on first use and are replaced when one
    is killed for running past its deadline; :attr:`stats` counts outcomes.
    """

    def __init__(self, workers: int | None = None, wall_factor: float = WALL_FACTOR) -> None:
        if workers is None:
            workers = int(os.environ.get("DOTS_REWARD_WORKERS", "0")) or min(8, os.cpu_count() or 1)
        self.size = max(1, int(workers))
        self.wall_factor = float(wall_factor)
        self._workers: list[_Worker] = []
        self._lock = threading.Lock()
        self._pid = os.getpid()  # a forked child must not touch (or kill) its parent's workers
        self.stats = {"ok": 0, "timeout": 0, "killed": 0, "error": 0}

    # -- lifecycle ---------------------------------------------------------------------------
    def _ensure_started(self) -> None:
        while len(self._workers) < self.size:
            self._workers.append(_Worker())

    def close(self) -> None:
        """Stop all workers: ask politely (EOF), wait up to a second in all, then kill."""
        with self._lock:
            if os.getpid() != self._pid:  # inherited through fork: the workers are the parent's
                self._workers = []
                return
            for w in self._workers:
                w.close_requests()
            deadline = time.monotonic() + 1.0
            for w in self._workers:
                try:
                    w.proc.wait(timeout=max(0.01, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    pass
                w.kill()
            self._workers = []

    def _replace(self, w: _Worker) -> None:
        w.kill()
        self._workers[self._workers.index(w)] = _Worker()

    def _startup_failed(self, message: str) -> None:
        for w in self._workers:
            w.kill()
        self._workers = []
        raise RewardUnavailable(f"reward math_verify: worker failed to start ({message}); is math-verify "
                                f"installed (pip install 'math-verify>=0.8') and DOTS_REWARD_MEMORY_MB "
                                f"large enough?")

    # -- scoring -----------------------------------------------------------------------------
    def score(self, texts: Sequence[str], answers: Sequence[str],
              timeout_s: float = DEFAULT_TIMEOUT_S) -> list[float]:
        """Scores in {0.0, 1.0}, one per (text, answer); each bounded by ~timeout_s of CPU time."""
        if len(texts) != len(answers):
            raise ValueError(f"math_verify_rewards: {len(texts)} texts but {len(answers)} answers")
        timeout_s = _positive_timeout(timeout_s, "math_verify_rewards")
        scores = [0.0] * len(texts)
        todo = [i for i, (t, a) in enumerate(zip(texts, answers))
                if isinstance(t, str) and isinstance(a, str) and t.strip() and a.strip()]

        def done(i: int, msg: dict | None, outcome: str) -> None:
            if msg is None:  # died mid-answer (crash, OOM kill) or killed past its deadline
                self.stats["error" if outcome == "died" else "killed"] += 1
                return
            scores[i] = float(msg.get("score", 0.0))
            status = str(msg.get("status", "error"))
            self.stats[status if status in ("ok", "timeout") else "error"] += 1

        # one answer per request: a step's answers are few and uneven in cost, so they spread best singly
        self._dispatch("score", [[texts[i], answers[i]] for i in range(len(texts))], todo, timeout_s, 1, done)
        return scores

    def check_answers(self, answers: Sequence[str], timeout_s: float = DEFAULT_TIMEOUT_S) -> list[str | None]:
        """For each ground truth, None when math-verify parses it into a mathematical object, else
        why not ("unparsed", "timeout", "error: ..."). Each distinct answer is parsed once, in batches
        of many answers per request (one reply per answer, so the deadline stays per answer)."""
        timeout_s = _positive_timeout(timeout_s, "math_verify check_answers")
        distinct = list(dict.fromkeys(a for a in answers if isinstance(a, str)))
        status: list[str | None] = ["unparsed"] * len(distinct)

        def done(i: int, msg: dict | None, outcome: str) -> None:
            if msg is None:
                status[i] = "timeout" if outcome == "killed" else "error: the worker died"
            elif msg.get("status") != "ok":
                status[i] = str(msg.get("status"))
            else:
                status[i] = None if msg.get("parsed") else "unparsed"

        chunk = max(1, min(256, math.ceil(len(distinct) / (4 * self.size))))
        self._dispatch("gold", distinct, list(range(len(distinct))), timeout_s, chunk, done)
        by_answer = dict(zip(distinct, status))
        return [by_answer[a] if isinstance(a, str) else "not a string" for a in answers]

    def _dispatch(self, op: str, items: list, todo: list[int], timeout_s: float, chunk: int,
                  done: Callable[[int, dict | None, str], None]) -> None:
        """Send ``items[i]`` for i in ``todo`` to the workers, ``chunk`` per request, and call
        ``done(i, reply, outcome)`` once per item: outcome "ok" with the worker's reply, or reply None
        and outcome "killed" (no answer within ``timeout_s`` + grace of CPU time) or "died" (the worker
        exited)."""
        queue = [todo[k:k + chunk] for k in range(0, len(todo), chunk)]
        queue.reverse()  # pop() from the end hands out work in order
        with self._lock:
            if os.getpid() != self._pid:
                raise RuntimeError("MathVerifyPool: used in a forked child; create a new pool there")
            self._ensure_started()
            try:
                self._run(op, items, timeout_s, queue, done)
            except BaseException:
                # Interrupted (Ctrl-C) or startup failure: a busy worker would later answer for an
                # item it no longer owns, so restart those before anyone reuses the pool.
                for w in list(self._workers):
                    if w.job is not None:
                        self._replace(w)
                raise

    def _run(self, op: str, items: list, timeout_s: float, queue: list[list[int]], done) -> None:
        busy = 0

        def give_up(w: _Worker, outcome: str) -> None:
            """The worker's current item fails; the rest of its request goes back to the queue."""
            nonlocal busy
            busy -= 1
            first, rest = w.job[0], w.job[1:]
            w.job = None
            if rest:
                queue.append(rest)
            self._replace(w)
            done(first, None, outcome)

        while queue or busy:
            now = time.monotonic()
            for w in list(self._workers):  # hand out work to idle, ready workers
                if queue and w.ready and w.job is None:
                    job = queue.pop()
                    try:
                        w.requests.send_bytes(json.dumps(
                            {"op": op, "items": [items[i] for i in job], "timeout": timeout_s}).encode())
                    except (BrokenPipeError, OSError):
                        queue.append(job)  # the worker died while idle: not this item's fault
                        self._replace(w)
                        continue
                    w.job = list(job)
                    w.start_item(now, timeout_s + GRACE_S)
                    busy += 1
            deadlines = [w.check_at for w in self._workers if w.job is not None]
            deadlines += [w.started + STARTUP_TIMEOUT_S for w in self._workers if not w.ready]
            wait_s = max(0.0, min(deadlines) - time.monotonic()) if deadlines else None
            readable = wait([w.results for w in self._workers], timeout=wait_s)
            now = time.monotonic()
            for w in list(self._workers):
                if w.results in readable:
                    try:
                        msg = json.loads(w.results.recv_bytes())
                    except (EOFError, OSError, ValueError):
                        msg = None  # the worker exited (or wrote garbage)
                    if not w.ready:
                        if msg is None or "error" in msg:
                            self._startup_failed("exited" if msg is None else msg["error"])
                        w.ready = True
                        w.cpu = float(msg.get("cpu", 0.0))
                    elif w.job is None:
                        if msg is None:  # died while idle: replace it
                            self._replace(w)
                    elif msg is None:  # died mid-item (crash, OOM kill): that item fails, replace
                        give_up(w, "died")
                    else:
                        i = w.job.pop(0)
                        w.cpu = float(msg.get("cpu", w.cpu))
                        if w.job:
                            w.start_item(now, w.budget_s)  # the budget restarts for the next item
                        else:
                            busy -= 1
                            w.job, w.check_at = None, math.inf
                        done(i, msg, "ok")
                elif w.job is not None and w.out_of_time(now, self.wall_factor):
                    give_up(w, "killed")  # stuck where its own alarm cannot reach (C code), or hung
                elif not w.ready and now >= w.started + STARTUP_TIMEOUT_S:
                    self._startup_failed(f"not ready after {STARTUP_TIMEOUT_S:.0f}s")


def _positive_timeout(timeout_s: float, who: str) -> float:
    timeout_s = float(timeout_s)
    if not timeout_s > 0:
        raise ValueError(f"{who}: timeout_s must be > 0; got {timeout_s}")
    return timeout_s


_POOL: MathVerifyPool | None = None
_POOL_LOCK = threading.Lock()


def _pool() -> MathVerifyPool:
    global _POOL
    with _POOL_LOCK:
        if _POOL is None or _POOL._pid != os.getpid():  # first use, or first use in a forked child
            _POOL = MathVerifyPool()
            atexit.register(_POOL.close)
        return _POOL


def math_verify_rewards(texts: Sequence[str], answers: Sequence[str],
                        timeout_s: float = DEFAULT_TIMEOUT_S) -> list[float]:
    """Score many responses at once, spread over the shared worker pool (the fast path for a step's
    rollouts). Each answer costs at most ``timeout_s`` (+0.5 s grace) and scores 0.0 past it."""
    return _pool().score(texts, answers, timeout_s)


def math_verify_reward(text: str, answer: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> float:
    """1.0 when the response's final (preferably ``\\boxed{}``) answer is mathematically equal to the
    LaTeX ground truth according to math-verify, else 0.0.

    Never hangs and never raises for a bad answer: parse + verify run in a worker process with a
    hard deadline of ``timeout_s`` (see the module docstring for why); timeouts and errors score 0.0.
    """
    return math_verify_rewards([text], [answer], timeout_s)[0]


REWARDS = {"exact_match": exact_match, "math_verify": math_verify_reward}


def get_reward(name: str):
    """The reward function called `name`; refuses an unknown name, or ``math_verify`` without its
    package, at config time rather than after a model has been loaded."""
    try:
        fn = REWARDS[name]
    except KeyError:
        raise ValueError(f"reward: unknown reward {name!r}; allowed: {sorted(REWARDS)}") from None
    if name == "math_verify":
        import importlib.util

        if importlib.util.find_spec("math_verify") is None:
            raise RewardUnavailable("reward math_verify: the math-verify package is not installed; "
                                    "install it with: pip install 'math-verify>=0.8'")
    return fn


def same_answers(reward: str, pairs: Sequence[tuple[str, str]],
                 timeout_s: float = DEFAULT_TIMEOUT_S) -> list[bool]:
    """For each pair of ground truths (a, b), whether the reward called `reward` takes them for one
    answer: a response that answers a is rewarded against b (``\\boxed{a}`` for ``math_verify``, so
    ``\\dfrac{1}{2}`` and ``0.5`` agree). Why: two rows of a dataset that ask one question with
    answers that do not agree leave no label to trust (DeepScaleR gives five answers to one question)."""
    get_reward(reward)
    same = [a == b for a, b in pairs]
    todo = [i for i, s in enumerate(same) if not s]
    if reward == "exact_match":
        for i in todo:
            same[i] = exact_match(*pairs[i]) == 1.0
    elif todo:
        texts = [f"\\boxed{{{latex_answer(pairs[i][0])}}}" for i in todo]
        scores = math_verify_rewards(texts, [pairs[i][1] for i in todo], timeout_s)
        for i, score in zip(todo, scores):
            same[i] = score == 1.0
    return same


def unreadable_answers(reward: str, answers: Sequence[str],
                       timeout_s: float = DEFAULT_TIMEOUT_S) -> list[str | None]:
    """Why the reward called `reward` cannot read each ground truth, or None where it can.

    - ``math_verify``: the ground truth is parsed exactly as scoring parses it (same candidates, same
      worker pool, each answer bounded by ``timeout_s``), all distinct answers in a few batched
      requests. One that does not become a mathematical object is only ever matched by a verbatim
      copy of its text, so an equivalent answer in any other form scores 0.
    - ``exact_match``: whitespace is stripped from every response before the comparison, so a ground
      truth holding whitespace can never be matched.
    """
    get_reward(reward)  # an unknown name, or math_verify without its package: a clear error now
    if reward == "exact_match":
        return [None if "".join(a.split()) == a else "holds whitespace, which exact_match strips from every "
                "response, so no response can ever match it" for a in answers]
    why = {"unparsed": "math-verify cannot parse it (as \\boxed{} or $...$), so only a verbatim copy of "
                       "the text would ever be rewarded",
           "timeout": f"math-verify did not parse it within reward.timeout_s={timeout_s:g}s of CPU time, so "
                      "every response to it would time out"}
    out = []
    for status in _pool().check_answers(answers, timeout_s):
        out.append(None if status is None else why.get(status, f"math-verify failed on it ({status})"))
    return out
