"""``python -m mq ...`` is the ``mq`` command."""

import sys

from mq.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
