"""``python -m dagrunner``.  That ``python`` may be another environment's (a project's venv
first on PATH) that finds this package but not its dependencies: said as a coded error,
not a traceback (docs/errors.md, ``dependency-missing``)."""

import sys

try:
    from dagrunner.cli.main import entry
except ModuleNotFoundError as exc:
    if not exc.name or exc.name.partition(".")[0] == "dagrunner":
        raise  # the package itself is broken: a traceback is the right report
    print(
        f"error[dependency-missing]: {sys.executable} cannot import {exc.name}, which "
        "dagrunner needs\n  hint: run the `dagrunner` command of the environment it was "
        "installed in, or install dagrunner into this one (a checkout: `python -m pip install -e "
        "PATH`)",
        file=sys.stderr,
    )
    sys.exit(3)
except KeyboardInterrupt:  # a Ctrl-C before the command could say so itself
    print("interrupted", file=sys.stderr)
    sys.exit(130)

entry()
