"""Third-party pure-Python code the driver ships, unchanged, with its
licence beside it; never installed into the session's environment, and
compiled only when first used (boot.py leaves these out of the eager
import, so an interpreter that never saves its state never loads them).

cloudpickle 3.1.3 (BSD-3-Clause, cloudpickle.LICENSE): the module
cloudpickle/cloudpickle.py of the wheel cloudpickle-3.1.3-py3-none-any.whl
from PyPI, as it is (sha256 of the file a723bcbdf02bf0ccd6ca1b1eedaf241a08e513e5fb4c060a0c501ef4b25b24cc). It pickles what the standard pickler cannot: functions,
classes and lambdas defined in cells (by value), for saving a session's
state (state.py).
"""
