"""A notebook kernel on "hosta" for tests/test_two_hosts.py: a real IPython shell with the extension
loaded, running the cells the test sends, one JSON line each on stdin, and answering one JSON line
each on stdout: success, the error's type and text, what the cell printed and displayed, and how
long it took. It ends when stdin closes (or is killed by the test)."""
from __future__ import annotations

import json
import sys
import time

from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output


def main() -> None:
    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "jaxpar_magic")
    reply = sys.stdout
    print(json.dumps({"ready": True}), file=reply, flush=True)
    for line in sys.stdin:
        cell = json.loads(line)["cell"]
        started = time.monotonic()
        with capture_output() as captured:
            result = shell.run_cell(cell, store_history=False)
        error = result.error_in_exec or result.error_before_exec
        answer = {
            "success": result.success,
            "error_type": type(error).__name__ if error else None,
            "error": str(error) if error else None,
            "stdout": captured.stdout,
            "stderr": captured.stderr,
            "shown": [output.data.get("text/plain", "") for output in captured.outputs],
            "elapsed": time.monotonic() - started,
        }
        print(json.dumps(answer), file=reply, flush=True)


if __name__ == "__main__":
    main()
