"""``python -m shmq``: the ``shmq`` command."""

import sys

from shmq.cli import main

if __name__ == "__main__":
    sys.exit(main())
