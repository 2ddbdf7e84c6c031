"""Run the example: start a worker, send tasks from this process, read their results.

    python examples/django_project/demo.py [DIR]      # DIR: where the tasks live (a temp dir)

What a web app does (``task.enqueue(...)``, later ``get_result``) beside what ops run
(``python manage.py ledgerq_worker``).  The test suite runs this file.
"""

from __future__ import annotations

import datetime
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> None:
    tasks_dir = Path(sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp()).resolve()
    os.environ["TASKS_DIR"] = str(tasks_dir)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "mysite.settings")
    sys.path.insert(0, str(HERE))

    import django

    django.setup()
    from django.utils import timezone
    from shop.tasks import charge, rebuild_search_index, refund, report, send_receipt

    # The web side: enqueue returns at once with a result id to keep.
    results = [
        rebuild_search_index.enqueue(),
        charge.enqueue(1001, cents=2599),
        send_receipt.enqueue(1001, "ada@example.com"),
        report.using(run_after=timezone.now() + datetime.timedelta(seconds=1)).enqueue("monday"),
        refund.enqueue(1002),
    ]
    print(f"enqueued {len(results)} tasks into {tasks_dir}")

    # The ops side: a worker, as `python manage.py ledgerq_worker` in its own process.
    worker = subprocess.Popen(
        [sys.executable, "manage.py", "ledgerq_worker", "--processes", "2", "--verbosity", "0"],
        cwd=HERE,
        env=dict(os.environ),
    )
    try:
        deadline = time.monotonic() + 60
        for result in results:
            while True:
                result.refresh()  # reads the results database: any process can
                if result.is_finished:
                    break
                if time.monotonic() > deadline:
                    raise SystemExit(f"{result.task.name} did not finish")
                time.sleep(0.05)
            if result.status == "SUCCESSFUL":
                print(f"{result.task.name}: {result.return_value!r} (attempts {result.attempts})")
            else:
                error = result.errors[-1]
                last_line = error.traceback.strip().splitlines()[-1]
                print(f"{result.task.name}: FAILED with {error.exception_class_path}: {last_line}")
        delayed = results[3]
        assert delayed.started_at >= delayed.task.run_after, "run_after is never early"
    finally:
        worker.send_signal(signal.SIGTERM)  # running tasks finish, then it exits
        print(f"worker stopped (exit code {worker.wait(60)})")


if __name__ == "__main__":
    main()
