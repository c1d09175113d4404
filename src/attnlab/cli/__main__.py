"""``python -m attnlab.cli ...`` (what torchrun launches): the same as the ``attnlab`` command."""

import sys

from attnlab.cli import main

sys.exit(main())
