import sys

from fusedopt.bench.cli import main

sys.exit(main())
