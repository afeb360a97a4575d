#!/usr/bin/env python3
"""test_supervise.py — scripts/supervise owns its job: a signal ends the job's whole process group, a second
supervisor on the same checkpoint directory is refused (a stale lock is taken over), a command that cannot
start is one line. ctest robustness.supervise (tests/robustness/CMakeLists.txt).

The jobs are small sh scripts that start a child and sleep; every wait has a hard timeout, so a supervisor
that hangs or leaves its job running fails the test instead of hanging it.
"""
import os
import signal
import subprocess
import sys
import tempfile
import time
import unittest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SUPERVISE = os.path.join(REPO, "scripts", "supervise")
HARD_TIMEOUT_S = 60  # a loaded 2-core machine (load 20+) once needed more than 30 s


def alive(pid):
    """True while pid runs (a zombie, dead but not yet reaped, counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def wait_for(pred, timeout_s=HARD_TIMEOUT_S):
    end = time.time() + timeout_s
    while time.time() < end:
        if pred():
            return True
        time.sleep(0.05)
    return False


class SuperviseTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="sl_supervise_test_")
        self.dir = self.tmp.name
        self.procs = []

    def tearDown(self):
        for p in self.procs:  # a failed test must not leave a supervisor or its job behind
            if p.poll() is None:
                p.kill()
                p.wait()
            for pid in self.job_pids():
                if alive(pid):
                    os.kill(pid, signal.SIGKILL)
        self.tmp.cleanup()

    def job_pids(self):
        path = os.path.join(self.dir, "pids")
        try:
            with open(path) as f:
                return [int(w) for w in f.read().split()]
        except (OSError, ValueError):
            return []

    def start(self, *job, ckpt="ckpt"):
        """Starts the supervisor on `job` (argv) with --checkpoint-dir <tmp>/<ckpt>; returns the Popen."""
        cmd = [sys.executable, SUPERVISE, "--max-restarts", "0", "--heartbeat-dir", os.path.join(self.dir, "hb"),
               "--", *job, "--checkpoint-dir", os.path.join(self.dir, ckpt)]
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.procs.append(p)
        return p

    def sleeping_job(self):
        """A job like mpirun: a parent sh with a child (the 'rank'); both write their pid and sleep."""
        script = os.path.join(self.dir, "job.sh")
        with open(script, "w") as f:
            f.write(f'sleep 300 & echo $! >> "{self.dir}/pids"; echo $$ >> "{self.dir}/pids"; wait\n')
        return ["sh", script]

    def finish(self, p):
        out, _ = p.communicate(timeout=HARD_TIMEOUT_S)
        return p.returncode, out

    def check_signal_ends_job(self, sig):
        p = self.start(*self.sleeping_job())
        self.assertTrue(wait_for(lambda: len(self.job_pids()) == 2), "the fake job did not start")
        pids = self.job_pids()
        p.send_signal(sig)
        rc, out = self.finish(p)
        self.assertEqual(rc, 128 + sig, out)
        self.assertIn(f"got {signal.Signals(sig).name}: ended the job", out)
        self.assertTrue(wait_for(lambda: not any(alive(pid) for pid in pids), 10),
                        f"job processes {[q for q in pids if alive(q)]} still run after the supervisor exited:\n{out}")
        self.assertFalse(os.path.exists(os.path.join(self.dir, "ckpt", "supervise.lock")), "lock file left behind")

    def test_sigterm_ends_the_job(self):
        self.check_signal_ends_job(signal.SIGTERM)

    def test_sigint_ends_the_job(self):
        self.check_signal_ends_job(signal.SIGINT)

    def test_second_supervisor_is_refused(self):
        first = self.start(*self.sleeping_job())
        self.assertTrue(wait_for(lambda: len(self.job_pids()) == 2), "the fake job did not start")
        second = self.start("true")
        rc, out = self.finish(second)
        self.assertEqual(rc, 2, out)
        self.assertIn(f"in use by the supervisor with pid {first.pid}", out)
        self.assertNotIn("attempt 0", out, "the second supervisor started a job")
        self.assertIsNone(first.poll(), "the first supervisor must go on")
        first.send_signal(signal.SIGTERM)
        self.assertEqual(self.finish(first)[0], 128 + signal.SIGTERM)

    def test_stale_lock_is_taken_over(self):
        dead = subprocess.Popen(["true"])
        dead.wait()  # its pid is now free (reuse within this test is practically impossible)
        os.makedirs(os.path.join(self.dir, "ckpt"))
        lock = os.path.join(self.dir, "ckpt", "supervise.lock")
        with open(lock, "w") as f:
            f.write(f"{dead.pid} 2024-01-01T00:00:00\n")
        rc, out = self.finish(self.start("true"))
        self.assertEqual(rc, 0, out)
        self.assertIn(f"taking over the stale lock {lock} (pid {dead.pid} is not running)", out)
        self.assertFalse(os.path.exists(lock), "lock file left behind")

    def test_command_that_cannot_start(self):
        rc, out = self.finish(self.start("/nonexistent/prog"))
        self.assertEqual(rc, 2, out)
        self.assertNotIn("Traceback", out)
        self.assertIn("cannot start the job: /nonexistent/prog: No such file or directory", out)


if __name__ == "__main__":
    unittest.main()
