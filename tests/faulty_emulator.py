"""`python -m tests.faulty_emulator ARGS`: `python -m emulator ARGS` whose local workers are
tests.faulty_worker, for the fault tests that need the server in a process of its own."""

import sys

from emulator.__main__ import main
from nodes.transport import supervisor
from tests.faulty_worker import COMMAND

if __name__ == "__main__":
    supervisor.WORKER_COMMAND = COMMAND
    sys.exit(main())
