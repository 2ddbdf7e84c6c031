"""The tests' client process: enqueue tasks and read results from outside the test.

python client.py enqueue < jobs.json     # [{"task": "tasksapp.tasks.add", "args": [1, 2],
                                         #   "priority": 0, "queue": "default",
                                         #   "run_after_s": 1.5}, ...] -> ids, one a line
python client.py result ID ...           # each result as one JSON line
"""

from __future__ import annotations

import datetime
import json
import os
import sys

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testsite.settings")

import django

django.setup()

from django.utils import timezone  # noqa: E402
from django.utils.module_loading import import_string  # noqa: E402

try:
    from django.tasks import default_task_backend
except ImportError:
    from django_tasks import default_task_backend


def enqueue() -> None:
    for job in json.load(sys.stdin):
        task = import_string(job["task"])
        changes = {}
        if "priority" in job:
            changes["priority"] = job["priority"]
        if "queue" in job:
            changes["queue_name"] = job["queue"]
        if "run_after_s" in job:
            changes["run_after"] = timezone.now() + datetime.timedelta(seconds=job["run_after_s"])
        if changes:
            task = task.using(**changes)
        result = task.enqueue(*job.get("args", []), **job.get("kwargs", {}))
        print(result.id, flush=True)


def show(result_id: str) -> dict[str, object]:
    result = default_task_backend.get_result(result_id)
    times = ("enqueued_at", "started_at", "finished_at", "last_attempted_at")
    return {
        "id": result.id,
        "status": str(result.status),
        "task": result.task.module_path,
        "priority": result.task.priority,
        "args": result.args,
        "kwargs": result.kwargs,
        "attempts": result.attempts,
        "worker_ids": result.worker_ids,
        "errors": [[e.exception_class_path, e.traceback] for e in result.errors],
        "return_value": result._return_value,
        **{name: getattr(result, name) and getattr(result, name).isoformat() for name in times},
    }


if __name__ == "__main__":
    if sys.argv[1] == "enqueue":
        enqueue()
    else:
        for result_id in sys.argv[2:]:
            print(json.dumps(show(result_id)), flush=True)
