import sys

from modular.cli.main import main

sys.exit(main())
