"""The decision one pod at a time, as the extender serves it and the simulator runs it.

A ``Decider`` holds what the decisions share between pods, apart from any node source, HTTP or
file: the engine (swapped whole on a policy reload), the job memo (pods resolved once per
content: a controller's burst, the same pod sent to filter then prioritize), the learned
workload (the fragmentation score's target) and the scoring of grouped verdicts with it. The
extender's ``service.decisions.ExtenderService`` decides requests with one, over its node index
and the source's reservations; ``gpuplace simulate``'s gpuplace policy
(``simulator.baselines.GpuplacePolicy``) decides simulated pods with one, over its classes of
simulated nodes; both select best-only with ``served.selection``.

Thread-safe where the extender needs it: the memo is ``BoundedMemo`` (locked), the workload
tracker is behind a lock.
"""

from __future__ import annotations

import threading
from typing import Mapping

from scheduler_extender.core.engine import Engine
from scheduler_extender.core.job import Job
from scheduler_extender.core.pod import Pod
from scheduler_extender.core.workload import WorkloadProfile, WorkloadTracker
from scheduler_extender.served.grouped import GroupedEngine, GroupedResults, ScoredGroups, as_grouped, decision_job, named_job
from scheduler_extender.served.memo import BoundedMemo

MAX_JOBS = 256
"""Resolved pods remembered by content (namespace, annotations, container resources, namespace labels, policy)."""

MAX_JOB_BYTES = 16 * 2**20
"""... and the bytes they may keep alive: a job keeps at most the strings of its pod (charged at
``Pod.content_key``'s size) and reasons cut to a bounded length (``JOB_OVERHEAD_BYTES``)."""

JOB_OVERHEAD_BYTES = 4096


class Decider:
    """The engine, the job memo and the learned workload (module docstring)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine  # a GroupedEngine (the property below wraps a plain Engine)
        # digest of a pod's content -> its decision_job (``job``)
        self._specs: BoundedMemo[Job] = BoundedMemo(MAX_JOBS, MAX_JOB_BYTES)
        self.workload = WorkloadTracker()
        self._workload_lock = threading.Lock()

    @property
    def engine(self) -> GroupedEngine:
        """The engine pods are decided with; swapped whole on a policy reload."""
        return self._engine

    @engine.setter
    def engine(self, engine: Engine) -> None:
        self._engine = as_grouped(engine)

    def job(self, pod: Pod, namespace_labels: Mapping[str, str] | None, engine: GroupedEngine | None = None,
            ignored_annotations: frozenset[str] = frozenset()) -> Job:
        """``engine.job`` for ``pod`` (this decider's engine by default), shared by pods with the
        same content: a pod is resolved from its namespace, name, annotations and container
        resources, its namespace's labels and the policy (``core.job.resolve_job``), and the name
        is set apart (``named_job``), so the memo is keyed by the rest (``Pod.content_key``).
        Nothing a request claims about a pod's identity (uid, resourceVersion) is part of the
        key: a request forged with another pod's uid gets its own content's job and cannot
        change what that pod gets. ``ignored_annotations`` change nothing the pod asks for (the
        extender's requeue mark): left out of the key."""
        engine = engine or self.engine
        content, size = pod.content_key(ignored_annotations)
        key = (engine.serial, content, frozenset(namespace_labels.items()) if namespace_labels is not None else None)
        decision = self._specs.get(key)
        if decision is not None:
            return named_job(decision, pod.name)
        job = engine.job(pod, namespace_labels)
        self._specs.put(key, decision_job(job), size + JOB_OVERHEAD_BYTES)
        return job

    def learn(self, job: Job, key: str | None = None) -> None:
        """Count a resolved pod in the learned workload (once per ``key``, a pod's uid, when given)."""
        with self._workload_lock:
            self.workload.observe_job(job, key)

    def workload_profile(self) -> WorkloadProfile:
        """The learned target workload's current snapshot (immutable; empty until enough pods were seen)."""
        with self._workload_lock:
            return self.workload.profile()

    def score(self, job: Job, grouped: GroupedResults, supply: Mapping[str, float] | None = None,
              workload: WorkloadProfile | None = None) -> ScoredGroups:
        """Scores of the grouped verdicts (``GroupedEngine.score_grouped``) against the learned
        workload (``workload``: a snapshot the caller took already); ``supply``: free devices per
        model over the nodes of the request (None: counted over ``grouped``)."""
        return self.engine.score_grouped(job, grouped, workload if workload is not None else self.workload_profile(),
                                         supply)

    def reset_workload(self) -> None:
        """Forget the learned workload (a new simulation run)."""
        with self._workload_lock:
            self.workload = WorkloadTracker()
