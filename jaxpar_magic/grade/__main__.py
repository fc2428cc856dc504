"""``python -m jaxpar_magic.grade submissions/*.ipynb --out grades.csv`` (the package's docstring)."""
import sys

from . import main

sys.exit(main())
