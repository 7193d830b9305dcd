"""``python -m kernelbridge.cli``: the ``kernelbridge`` command (setup prints it where the script is
not on PATH)."""

import sys

from kernelbridge.cli.main import main

sys.exit(main())
