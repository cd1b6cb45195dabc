"""Scheduling policies behind one small interface: ``push`` a ready task, ``pop`` for a device.

Like StarPU's scheduling components: the scheduler calls :meth:`Policy.push` when a task's
dependencies are met and :meth:`Policy.pop` when a device is free to run something. Every
call happens under the scheduler's lock, so a policy needs no locking of its own.
"""

from __future__ import annotations

import collections
import itertools
from collections.abc import Callable, Iterable, Iterator, MutableMapping, Sequence
from typing import Any, Protocol

import hal
from hal.sched._task import Task

__all__ = [
    "POLICIES",
    "EagerPolicy",
    "EftPolicy",
    "HeftPolicy",
    "Policy",
    "PolicyEnv",
    "PriorityPolicy",
    "RoundRobinPolicy",
    "make_policy",
]


class PolicyEnv(Protocol):
    """What the scheduler offers a policy."""

    @property
    def devices(self) -> Sequence[hal.Device]:
        """The scheduler's pool, in order."""

    def now(self) -> float:
        """Return the current time (perf_counter seconds)."""

    def eligible(self, task: Task) -> list[hal.Device]:
        """Return the devices ``task`` may run on now (healthy, not drained, not excluded)."""

    def estimate(self, task: Task, device: hal.Device) -> float:
        """Return the estimated compute seconds of ``task`` on ``device``."""

    def transfer_cost(self, task: Task, device: hal.Device) -> float:
        """Return the estimated seconds to move ``task``'s inputs to ``device``."""

    def explore(self, task: Task, devices: Sequence[hal.Device]) -> hal.Device | None:
        """Return a device whose run-time history for ``task`` is stale, or None."""

    # Optional, looked up with getattr (the scheduler has both): ``clock``, the callable behind
    # now(); ``estimates(task, devices)``, estimate() of each device at once (a sequence the
    # policy reads and never changes).


class Policy:
    """Base class of scheduling policies (subclass and override push/pop/remove/depth).

    Args:
        aging: effective priority gained per second of waiting (0: none).
        aging_cap: most priority that aging adds.
    """

    name = "policy"
    #: the device whose queue :meth:`push` put the task in, when it has per-device queues (the
    #: scheduler then wakes that device's workers only); None: a shared queue, any may take it.
    #: The scheduler resets it before each push.
    placed: hal.Device | None = None

    def __init__(self, *, aging: float = 0.0, aging_cap: float = 100.0) -> None:
        if not aging >= 0 or not aging_cap >= 0:
            raise ValueError(f"aging={aging!r} and aging_cap={aging_cap!r} must be >= 0")
        self.aging = float(aging)
        self.aging_cap = float(aging_cap)
        self.env: PolicyEnv | None = None

    def attach(self, env: PolicyEnv) -> None:
        """Bind the policy to its scheduler (called once)."""
        self.env = env

    def _env(self) -> PolicyEnv:
        if self.env is None:
            raise RuntimeError(f"policy {self.name!r} is not attached to a scheduler")
        return self.env

    def effective(self, task: Task, now: float) -> float:
        """Return ``task``'s effective priority: its class plus capped aging."""
        waited = 0.0 if task.ready_t is None else max(now - task.ready_t, 0.0)
        return task.priority + min(self.aging_cap, self.aging * waited)

    def _best(self, tasks: Iterable[Task], now: float) -> Task | None:
        best, key = None, None
        for t in tasks:
            k = (self.effective(t, now), t.short, -t.seq)
            if key is None or k > key:
                best, key = t, k
        return best

    # -- the interface ---------------------------------------------------------------------
    def push(self, task: Task) -> None:
        """Accept a ready task."""
        raise NotImplementedError

    def pop(self, device: hal.Device) -> Task | None:
        """Return the next task for ``device`` (removing it), or None."""
        raise NotImplementedError

    def peek(self, device: hal.Device) -> Task | None:
        """Return the task :meth:`pop` would return, without removing it."""
        raise NotImplementedError

    def remove(self, device: hal.Device) -> list[Task]:
        """Take back the tasks queued for ``device`` (it was evicted or drained)."""
        return []

    def depth(self, device: hal.Device) -> int:
        """Return how many tasks wait for ``device``."""
        raise NotImplementedError

    def take_all(self) -> list[Task]:
        """Take back every queued task (the scheduler is cancelling)."""
        out: list[Task] = []
        for d in self._env().devices:
            out.extend(self.remove(d))
        return out

    def done(self, task: Task, device: hal.Device) -> None:
        """Note that ``task`` finished on ``device`` (success or not)."""

    def reprioritize(self, task: Task) -> None:
        """Note that queued ``task``'s priority was raised (priority inheritance)."""


class _Central(Policy):
    """One queue shared by all devices."""

    def __init__(self, **kw: float) -> None:
        super().__init__(**kw)
        self._queue: list[Task] = []

    def push(self, task: Task) -> None:
        self._queue.append(task)

    def _candidates(self, device: hal.Device) -> Iterable[Task]:
        return (
            t
            for t in self._queue
            if device not in t.excluded and (t.pinned is None or device in t.pinned)
        )

    def peek(self, device: hal.Device) -> Task | None:
        now = self._env().now()
        return self._best(self._candidates(device), now)

    def pop(self, device: hal.Device) -> Task | None:
        now = self._env().now()
        t = self._best(self._candidates(device), now)
        if t is not None:
            t.effective_priority = self.effective(t, now)
            self._queue.remove(t)
        return t

    def depth(self, device: hal.Device) -> int:
        return sum(1 for _ in self._candidates(device))

    def take_all(self) -> list[Task]:
        out, self._queue = self._queue, []
        return out


class EagerPolicy(_Central):
    """Baseline: one FIFO queue; any free device takes the oldest task it may run."""

    name = "eager"

    def _best(self, tasks: Iterable[Task], now: float) -> Task | None:
        return next(iter(tasks), None)


class PriorityPolicy(_Central):
    """One queue ordered by effective priority: the task's class plus aging, capped.

    A low-priority task waiting ``w`` seconds competes as ``priority + min(cap, aging*w)``,
    so a stream of higher-priority arrivals cannot starve it forever.
    """

    name = "priority"

    def __init__(self, *, aging: float = 10.0, aging_cap: float = 100.0) -> None:
        super().__init__(aging=aging, aging_cap=aging_cap)


class RoundRobinPolicy(Policy):
    """Baseline: tasks go to the eligible devices in turn, FIFO per device."""

    name = "round-robin"

    def __init__(self, **kw: float) -> None:
        super().__init__(**kw)
        self._queues: dict[hal.Device, collections.deque[Task]] = collections.defaultdict(
            collections.deque
        )
        self._turn = itertools.count()

    def push(self, task: Task) -> None:
        env = self._env()
        devs = env.eligible(task)
        order = [d for d in env.devices if d in devs]
        dev = order[next(self._turn) % len(order)]
        self._queues[dev].append(task)
        self.placed = dev

    def peek(self, device: hal.Device) -> Task | None:
        q = self._queues.get(device)
        return q[0] if q else None

    def pop(self, device: hal.Device) -> Task | None:
        q = self._queues.get(device)
        return q.popleft() if q else None

    def remove(self, device: hal.Device) -> list[Task]:
        q = self._queues.pop(device, None)
        return list(q or ())

    def depth(self, device: hal.Device) -> int:
        return len(self._queues.get(device, ()))


class _DevState:
    """One device's EFT state: its queue, the estimated seconds queued in it, when its running
    work is expected to end, and whether the queue is *simple* (see ``EftPolicy._simple``)."""

    __slots__ = ("queue", "queued", "running_until", "simple")

    def __init__(self) -> None:
        self.queue: list[Task] = []
        self.queued = 0.0
        self.running_until = 0.0
        self.simple = False


_FRESH: dict[str, Callable[[], Any]] = {
    "queue": list,
    "queued": float,
    "running_until": float,
    "simple": bool,
}


class _StateView(MutableMapping[hal.Device, Any]):
    """One field of every device's :class:`_DevState`, seen as the dict keyed by device that it
    once was (``policy._queues[d]``, ``policy._queued[d] = 0.0``). Reading a device's item makes
    its state, as a ``defaultdict`` would; ``get`` and ``in`` do not."""

    __slots__ = ("_field", "_states")

    def __init__(self, states: dict[hal.Device, _DevState], field: str) -> None:
        self._states = states
        self._field = field

    def _state(self, device: hal.Device) -> _DevState:
        st = self._states.get(device)
        if st is None:
            st = self._states[device] = _DevState()
        return st

    def __getitem__(self, device: hal.Device) -> Any:
        return getattr(self._state(device), self._field)

    def __setitem__(self, device: hal.Device, value: Any) -> None:
        setattr(self._state(device), self._field, value)

    def __delitem__(self, device: hal.Device) -> None:
        st = self._states.get(device)
        if st is None:
            raise KeyError(device)
        setattr(st, self._field, _FRESH[self._field]())

    def __contains__(self, device: object) -> bool:
        return device in self._states

    def get(self, device: hal.Device, default: Any = None) -> Any:
        st = self._states.get(device)
        return default if st is None else getattr(st, self._field)

    def __iter__(self) -> Iterator[hal.Device]:
        return iter(self._states)

    def __len__(self) -> int:
        return len(self._states)


class EftPolicy(Policy):
    """Online earliest finish time (StarPU's dmda): each ready task goes to the device where
    it would finish first, counting that device's queued work, the input transfers and the
    history-based run-time estimate. Per-device queues are served by effective priority.
    """

    name = "eft"
    #: An idle device takes a task queued elsewhere when it would finish it earlier than its
    #: owner would (estimates are only estimates: this corrects placements that went wrong).
    steal = True

    def __init__(self, *, aging: float = 10.0, aging_cap: float = 100.0) -> None:
        super().__init__(aging=aging, aging_cap=aging_cap)
        #: every device's state in one object: a placement or a pop looks a device up once
        #: (a ``hal.Device`` key hashes in Python), and a placement over the same devices as the
        #: last one not at all (``_placing``)
        self._devq: dict[hal.Device, _DevState] = {}
        self._placing: tuple[list[hal.Device], list[_DevState]] = ([], [])
        # the per-device dicts these fields once were, as views
        self._queues: MutableMapping[hal.Device, list[Task]] = _StateView(self._devq, "queue")
        self._queued: MutableMapping[hal.Device, float] = _StateView(self._devq, "queued")
        self._running_until: MutableMapping[hal.Device, float] = _StateView(
            self._devq, "running_until"
        )
        #: devices whose queue holds one priority class in (ready time, submission) order: its
        #: head is then the task of highest effective priority (aging is monotone in the wait,
        #: ties go to the earliest submitted), so a pop need not scan the queue
        self._simple: MutableMapping[hal.Device, bool] = _StateView(self._devq, "simple")
        #: neither ``_pick`` nor ``effective`` is overridden: :meth:`pop` may do what they do inline
        cls = type(self)
        self._plain = cls._pick is EftPolicy._pick and cls.effective is Policy.effective
        #: some device runs several tasks at once (its queued work is shared among its streams)
        self._multi = True
        self._estimates: Callable[[Task, Sequence[hal.Device]], Sequence[float]] | None = None
        self._estimates_env: PolicyEnv | None = None

    def attach(self, env: PolicyEnv) -> None:
        super().attach(env)
        #: ``env.now``, or the clock itself where the environment shows it (the scheduler's ``clock``)
        self._now: Callable[[], float] = getattr(env, "clock", None) or env.now
        #: ``env.estimates`` (every device's estimate at once) where it has one, for env only
        self._estimates = getattr(env, "estimates", None)
        self._estimates_env = env
        slots = getattr(env, "slots", None)
        self._multi = slots is not None and any(slots(d) > 1 for d in env.devices)

    def expected_free(self, device: hal.Device, now: float) -> float:
        """Return when ``device`` is expected to have finished its running and queued work.

        A device running ``k`` tasks at once (``Scheduler(concurrency=k)``) shares its queued
        work among its ``k`` streams.
        """
        slots = getattr(self.env, "slots", None)
        st = self._devq.get(device) or self._state(device)
        free = st.running_until
        if free < now:
            free = now
        queued = st.queued
        if not queued:
            return free
        return free + queued / (slots(device) if slots is not None else 1)

    def place(self, task: Task, devices: Sequence[hal.Device]) -> tuple[hal.Device, float]:
        """Return the device of earliest estimated finish and the task's estimated duration
        (the first such device of ``devices`` on a tie)."""
        env = self.env
        if env is None:
            env = self._env()
        now = self._now()
        # the estimates of every device at once where the environment keeps them (the
        # scheduler does, per op and input bytes, while its model's version holds)
        many = self._estimates if env is self._estimates_env else getattr(env, "estimates", None)
        if many is not None:
            ests: Sequence[float] = many(task, devices)
        else:
            estimate = env.estimate
            ests = [estimate(task, d) for d in devices]
        transfer = env.transfer_cost if task.args else None  # no inputs: nothing to move
        slots = getattr(env, "slots", None) if self._multi else None  # None: one task at a time
        placing = self._placing
        if devices == placing[0]:
            states = placing[1]
        else:
            states = [self._devq.get(d) or self._state(d) for d in devices]
            self._placing = (list(devices), states)
        if transfer is None and slots is None and states:  # the loop below, what applies of it
            i = pick = 0
            best_t = 0.0
            for st in states:
                free = st.running_until
                t = (free if free > now else now) + st.queued + ests[i]
                if not i or t < best_t:
                    pick, best_t = i, t
                i += 1
            return devices[pick], ests[pick]
        best: hal.Device | None = None
        best_t = best_dur = 0.0
        for d, st, dur in zip(devices, states, ests, strict=True):  # expected_free, inlined
            if transfer is not None:
                dur += transfer(task, d)
            free = st.running_until
            if free < now:
                free = now
            work = st.queued
            if work:
                free += work / (slots(d) if slots is not None else 1)
            t = free + dur
            if best is None or t < best_t:
                best, best_t, best_dur = d, t, dur
        assert best is not None
        return best, best_dur

    def _state(self, device: hal.Device) -> _DevState:
        """Return ``device``'s state, made on first use."""
        st = self._devq.get(device)
        if st is None:
            st = self._devq[device] = _DevState()
        return st

    def _enqueue(self, task: Task, device: hal.Device, dur: float) -> None:
        task.estimate = dur
        st = self._devq.get(device) or self._state(device)
        q = st.queue
        if not q:
            st.simple = True
        elif st.simple:
            last = q[-1]
            ready, last_ready = task.ready_t, last.ready_t
            if not (
                task.priority == last.priority
                and task.short == last.short
                and task.seq >= last.seq
                and ready is not None
                and last_ready is not None
                and ready >= last_ready
            ):
                st.simple = False
        q.append(task)
        st.queued += dur
        self.placed = device

    def push(self, task: Task) -> None:
        env = self.env
        if env is None:
            env = self._env()
        devices = env.eligible(task)
        stale = env.explore(task, devices)
        if stale is not None:  # measure a device again rather than exile it on old samples
            self._enqueue(task, stale, env.transfer_cost(task, stale) + env.estimate(task, stale))
            return
        dev, dur = self.place(task, devices)
        self._enqueue(task, dev, dur)

    def _pick(self, device: hal.Device, now: float) -> Task | None:
        st = self._devq.get(device)
        if st is None or not st.queue:
            return None
        if st.simple:
            return st.queue[0]
        return self._best(st.queue, now)

    def peek(self, device: hal.Device) -> Task | None:
        return self._pick(device, self._env().now())

    def _steal(self, device: hal.Device, now: float) -> tuple[Task, hal.Device] | None:
        env = self._env()
        best: tuple[float, Task, hal.Device] | None = None
        for owner, st in self._devq.items():
            q = st.queue
            if not q or owner is device or owner == device:
                continue
            cand = q[-1]  # what the owner would reach last
            if device in cand.excluded or device not in env.eligible(cand):
                continue
            gain = self.expected_free(owner, now) - (
                now + env.transfer_cost(cand, device) + env.estimate(cand, device)
            )
            if gain > 0 and (best is None or gain > best[0]):
                best = (gain, cand, owner)
        return None if best is None else (best[1], best[2])

    def pop(self, device: hal.Device) -> Task | None:
        env = self.env
        if env is None:
            env = self._env()
        now = self._now()
        st = self._devq.get(device)
        if self._plain:  # _pick, inlined
            q = None if st is None else st.queue
            t = (q[0] if st.simple else self._best(q, now)) if q and st is not None else None
        else:
            t = self._pick(device, now)
        owner, own = device, st
        if t is None:
            if not self.steal:
                return None
            stolen = self._steal(device, now)
            if stolen is None:
                return None
            t, owner = stolen
            own = self._devq[owner]
        assert own is not None
        q = own.queue
        if q[0] is t:
            del q[0]
        else:
            q.remove(t)
        left = own.queued - t.estimate
        own.queued = left if left > 0.0 else 0.0
        if owner is not device:
            t.estimate = env.estimate(t, device)
        if self._plain:  # effective(t, now), inlined
            ready = t.ready_t
            waited = 0.0 if ready is None or now < ready else now - ready
            aged = self.aging * waited
            t.effective_priority = t.priority + (aged if aged < self.aging_cap else self.aging_cap)
        else:
            t.effective_priority = self.effective(t, now)
        if st is None:
            st = self._state(device)
        st.running_until = now + t.estimate
        return t

    def done(self, task: Task, device: hal.Device) -> None:
        if self.env is None:
            self._env()
        (self._devq.get(device) or self._state(device)).running_until = self._now()

    def reprioritize(self, task: Task) -> None:
        for st in self._devq.values():
            if task in st.queue:
                st.simple = False  # the queue no longer holds one class in order

    def remove(self, device: hal.Device) -> list[Task]:
        st = self._devq.get(device)
        if st is None:
            return []
        tasks, st.queue = st.queue, []
        st.queued = 0.0
        return tasks

    def depth(self, device: hal.Device) -> int:
        st = self._devq.get(device)
        return 0 if st is None else len(st.queue)


class HeftPolicy(EftPolicy):
    """HEFT for graphs submitted with :meth:`Scheduler.submit_graph`: the whole graph is
    planned at submission (upward ranks, insertion-based earliest finish); each task then
    runs on its planned device, in rank order. Tasks outside a graph, or whose planned
    device became ineligible, are placed by earliest finish time.
    """

    name = "heft"
    steal = False  # the plan is static

    def push(self, task: Task) -> None:
        devs = self._env().eligible(task)
        if task.planned is not None and task.planned in devs:
            self._enqueue(task, task.planned, self._env().estimate(task, task.planned))
        else:
            super().push(task)

    def _pick(self, device: hal.Device, now: float) -> Task | None:
        st = self._devq.get(device)
        q = None if st is None else st.queue
        if not q:
            return None
        planned = [t for t in q if t.planned is not None]
        if planned:
            return max(planned, key=lambda t: (t.plan_rank, -t.seq))
        return super()._pick(device, now)


POLICIES: dict[str, type[Policy]] = {
    "eager": EagerPolicy,
    "round-robin": RoundRobinPolicy,
    "priority": PriorityPolicy,
    "eft": EftPolicy,
    "heft": HeftPolicy,
}


def make_policy(policy: str | Policy) -> Policy:
    """Return a policy instance from a name (``eft``, ``heft``, ``priority``, ``eager``,
    ``round-robin``) or an instance."""
    if isinstance(policy, Policy):
        return policy
    if isinstance(policy, str):
        cls = POLICIES.get(policy.strip().lower().replace("_", "-"))
        if cls is not None:
            return cls()
    raise ValueError(f"policy={policy!r} is not a Policy or one of {', '.join(POLICIES)}")
