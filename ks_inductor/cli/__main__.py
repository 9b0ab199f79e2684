"""``python -m ks_inductor.cli``: the ``kernelsmith`` command."""

import sys

from ks_inductor.cli import main

sys.exit(main())
