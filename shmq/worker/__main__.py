import sys

from shmq._startup import skip_hypothesis

skip_hypothesis()

from shmq.worker.main import main  # noqa: E402 - after the entry point's import setup

sys.exit(main())
