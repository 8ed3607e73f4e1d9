"""``python -m shmq``: the ``shmq`` command."""

import sys

from shmq.cli import entry

if __name__ == "__main__":
    sys.exit(entry())
