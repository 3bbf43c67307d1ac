"""`python -m syncdoctor.cli`: the `syncdoctor` command."""

import sys

from syncdoctor.cli.app import main

sys.exit(main())
