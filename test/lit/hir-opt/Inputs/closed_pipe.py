"""Runs a command whose stdout is a pipe that the reader has already closed.

`python3 closed_pipe.py CMD ARGS...` prints the command's exit status and its stderr,
so that a lit test can check that a command writing into a closed pipe ends quietly
(as `hir-opt --list-passes | head -1` does when `head` exits first).
"""

import subprocess
import sys

process = subprocess.Popen(sys.argv[1:], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
process.stdout.close()  # the reader goes away before the command writes anything
stderr = process.stderr.read().decode(errors="replace")
print(f"status {process.wait()}")
print(f"stderr [{stderr}]")
