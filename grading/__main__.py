"""``python -m grading``: grading/cli.py."""

import sys

from grading.cli import main

sys.exit(main())
