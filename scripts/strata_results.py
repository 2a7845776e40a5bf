"""The results reader for scripts beside it (`import strata_results as sr`): the module strata_analysis.results
itself, from python/ in a checkout or share/strata/python when installed."""
import os
import sys

_here = os.path.dirname(os.path.abspath(__file__))
for _folder in (os.path.join(_here, "..", "python"), os.path.join(_here, "..", "share", "strata", "python")):
    if os.path.isfile(os.path.join(_folder, "strata_analysis", "__init__.py")):
        sys.path.insert(0, os.path.normpath(_folder))
        break

from strata_analysis import results as _results  # noqa: E402

sys.modules[__name__] = _results
