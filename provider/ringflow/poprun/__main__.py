"""`python -m ringflow.poprun [options] program [args]`."""

import sys

from ringflow.poprun import main

sys.exit(main())
