"""`python -m ringflow.launch`: the same options as `ringflow launch`."""

import sys

from ringflow.launch.cli import launch_main

sys.exit(launch_main())
