#!/usr/bin/python3
"""Runs the parity tests' Python steps (the scripts in this directory) in one long-lived process,
so that a test script imports torch once instead of once per step: `import torch` alone costs
about 2 s of CPU, and parity_deepseek.sh, for one, runs some 40 steps.

  pystep.py --serve        the server pystep.sh starts: requests on fd 5, replies on fd 6

A step is SCRIPT (a file name in this directory, e.g. deepseek_ref.py) with ARGS: it runs as
`python3 SCRIPT ARGS... >OUT 2>ERR` would (-E: stderr into OUT; without -o/-e the server's own
stdout/stderr, i.e. the test's), but in this process: sys.argv = [SCRIPT, ARGS...], then SCRIPT's
main(); its status is what that command's would be (main's return value or SystemExit's code,
1 and a traceback on an exception).

Request (--serve): NUL-terminated fields, the first the count of those that follow: the shell's
working directory (the step runs there, as a fresh python3 would), OUT, ERR ("" for none, "&1"
for -E), SCRIPT, ARGS... Reply: the status, then a newline.

Steps must not see each other: before each, the state a step could change and the next could read
is put back as it was at start-up -- torch's default dtype, grad mode and
thread count, the global generators of torch, numpy and random, numpy's error handling. (The
scripts themselves draw from seeded generators of their own and build every config afresh.) The
parity scripts can compare a run through this server with one fresh process per step:
TRILL_PYSTEP_SEPARATE=1 (see pystep.sh).
"""

import contextlib
import importlib
import os
import random
import sys
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

# Every script here but compare.py and gen_inputs.py needs torch: import it at start-up, while the
# test's shell may still be busy elsewhere. Without it, the steps that need it fail one by one.
try:
    import numpy as np
    import torch
except ImportError:
    np = torch = None


class Start:
    """The process state at start-up, put back before each step."""

    def __init__(self):
        self.random = random.getstate()
        if torch is not None:
            self.dtype = torch.get_default_dtype()
            self.grad = torch.is_grad_enabled()
            self.threads = torch.get_num_threads()
            self.torch_rng = torch.get_rng_state()
            self.np_rng = np.random.get_state()
            self.np_err = np.geterr()

    def restore(self):
        random.setstate(self.random)
        if torch is not None:
            if torch.get_default_dtype() != self.dtype:
                torch.set_default_dtype(self.dtype)
            torch.set_grad_enabled(self.grad)
            if torch.get_num_threads() != self.threads:
                torch.set_num_threads(self.threads)
            torch.set_rng_state(self.torch_rng)
            np.random.set_state(self.np_rng)
            np.seterr(**self.np_err)


START = Start()


def exit_status(code):
    """What `sys.exit(code)` would make the process's exit status."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def run_step(cwd, out, err, script, args):
    """Runs SCRIPT's main() with ARGS in folder CWD; returns its exit status."""
    if os.path.basename(script) != script or not script.endswith(".py") \
            or not os.path.isfile(os.path.join(HERE, script)):
        print(f"pystep: {script!r} is not a script in {HERE}", file=sys.stderr)
        return 2
    START.restore()
    os.chdir(cwd)
    with contextlib.ExitStack() as files:
        fout = files.enter_context(open(out, "w")) if out else sys.stdout
        ferr = fout if err == "&1" else files.enter_context(open(err, "w")) if err else sys.stderr
        argv, sys.argv = sys.argv, [os.path.join(HERE, script)] + list(args)
        try:
            with contextlib.redirect_stdout(fout), contextlib.redirect_stderr(ferr):
                try:
                    status = exit_status(importlib.import_module(script[:-3]).main())
                except SystemExit as e:
                    status = exit_status(e.code)
                except Exception:  # noqa: BLE001  (as python3 SCRIPT would: traceback, status 1)
                    traceback.print_exc()
                    status = 1
                sys.stdout.flush()
                sys.stderr.flush()
        finally:
            sys.argv = argv
    return status


def serve(rfd=5, wfd=6):
    buf = b""

    def field():
        nonlocal buf
        while b"\0" not in buf:
            chunk = os.read(rfd, 65536)
            if not chunk:
                if buf:
                    raise SystemExit("pystep: request cut short")
                return None
            buf += chunk
        f, buf = buf.split(b"\0", 1)
        return os.fsdecode(f)

    while True:
        n = field()
        if n is None:
            return 0  # the test closed its end
        fields = []
        for _ in range(int(n)):
            f = field()
            if f is None:
                raise SystemExit("pystep: request cut short")
            fields.append(f)
        status = run_step(fields[0], fields[1], fields[2], fields[3], fields[4:])
        os.write(wfd, f"{status}\n".encode())


def main():
    if sys.argv[1:] == ["--serve"]:
        return serve()
    print(__doc__.split("\n\n")[1], file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
