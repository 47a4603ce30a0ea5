"""Starts two children and sleeps: cancel must stop the whole process group."""

import subprocess
import sys
import time

children = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"]) for _ in range(2)]
print("pids", " ".join(str(p) for p in [__import__("os").getpid(), *[c.pid for c in children]]), flush=True)
time.sleep(600)
