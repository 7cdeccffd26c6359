"""``python -m jaxrl_mt.data build|inspect`` (see :mod:`jaxrl_mt.data.cli`)."""

import sys

from jaxrl_mt.data.cli import main

if __name__ == "__main__":
    sys.exit(main())
