"""Where the dg command is: $DG_BIN, else the build of the source tree this
package sits in (python/dg -> build/cli/dg), else dg on PATH."""

import os
import shutil

from . import errors


def dg_binary():
    env = os.environ.get("DG_BIN")
    if env:
        if not os.access(env, os.X_OK):
            raise errors.from_dg("not_found", "$DG_BIN=%s is not an executable file" % env)
        return env
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    built = os.path.join(here, "build", "cli", "dg")
    if os.access(built, os.X_OK):
        return built
    found = shutil.which("dg")
    if found:
        return found
    raise errors.from_dg("not_found", "no dg command: not in $DG_BIN, %s or PATH" % built,
                         "build it (./setup.sh build) or set DG_BIN=/path/to/dg")
