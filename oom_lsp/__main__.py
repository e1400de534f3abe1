import sys

from oom_lsp.cli import main

sys.exit(main())
