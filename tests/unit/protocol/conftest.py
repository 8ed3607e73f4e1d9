"""Import kafka-python's protocol package (a test oracle) once, with its import-time warnings off.

kafka-python 3.0.12 loads its JSON schemas with ``importlib.resources.open_text``; that
DeprecationWarning is attributed to ``importlib``, so the pyproject filter for ``read_text`` does
not cover it and pytest's "warnings are errors" would fail the first test that imports it.
"""

from __future__ import annotations

import warnings

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from _protocol_util import kafka_python_class

    kafka_python_class(18, "request")  # imports every kafka.protocol message module
