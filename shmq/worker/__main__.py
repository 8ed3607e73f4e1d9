import sys

from shmq.worker.main import main

sys.exit(main())
