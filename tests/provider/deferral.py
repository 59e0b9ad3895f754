"""A deferrable task run in-process the way Airflow runs one: `execute` until it defers, the
trigger re-made from its serialized form (as the triggerer makes it) and run in an event
loop until its event, then `execute_complete` on a fresh operator (Airflow resumes a task
on a new instance). The real triggerer runs it in tests/e2e; here the hosts are the point."""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import Callable
from typing import Any

from airflow.sdk.exceptions import TaskDeferred


def remake(trigger: Any) -> Any:
    """The trigger as the triggerer makes it from the database: class path and kwargs."""
    classpath, kwargs = trigger.serialize()
    module, name = classpath.rsplit(".", 1)
    return getattr(importlib.import_module(module), name)(**kwargs)


async def first_event(trigger: Any, timeout: float) -> Any:
    async def first() -> Any:
        async for event in trigger.run():
            return event
        raise AssertionError("the trigger ended without an event")

    return await asyncio.wait_for(first(), timeout)


def execute_deferred(op: Any, context: dict, fresh: Callable[[], Any], log: Any = None,
                     timeout: float = 300) -> tuple[Any, Any]:
    """(the task's result, the trigger that watched it); raises what the task raises."""
    try:
        op.execute(context)
    except TaskDeferred as deferred:
        trigger = remake(deferred.trigger)
        if log is not None:
            trigger._log = log
        event = asyncio.run(first_event(trigger, timeout))
        resumed = fresh()
        return getattr(resumed, deferred.method_name)(context, event.payload), trigger
    raise AssertionError("the task did not defer")
