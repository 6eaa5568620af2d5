"""Long-running clients for the measures that need company: vector_add survivors (their
--loops calibrated natively to run about 4 s) and a hold_memory victim that prints READY
once it holds its memory. It exists because the kill -9 test and the vandal test share
them; the steps are those of sections 3 and 4 of scripts/gpu-e2e.sh before issue 24.
"""

import time

from e2e import H, alive, grep_first, log, now_ns, run, section, show_output, spawn, tdiv, verdict, wait, executable


def calibrate_loops():
    """H.loops: vector_add --loops that run about 4 s natively (100 to 20,000; 200 if
    vector_add is missing). Once a run: when the quiet round begins, as gpu-e2e.sh did
    before its concurrency section, or else before the first test that needs it."""
    if H.calibrated:
        return
    H.calibrated = True
    section("calibrating vector_add --loops (native)")
    va = H.bin / "vector_add"
    if not executable(va):
        return
    t0 = now_ns()
    run([va, "--loops", "10"], "/dev/null")
    t1 = now_ns()
    run([va, "--loops", "60"], "/dev/null")
    t2 = now_ns()
    per = tdiv((t2 - t1) - (t1 - t0), 50)
    if per > 0:
        H.loops = tdiv(4_000_000_000, per)
    H.loops = min(max(H.loops, 100), 20000)
    log(f"one loop ~{tdiv(per, 1000)} us natively (start-up ~{tdiv((t1 - t0) - 10 * per, 1_000_000)} ms): "
        f"using --loops {H.loops} (~4 s)")


class Scenario:
    """nsurv vector_add survivors (mode native or omps) and, if victim, a hold_memory
    victim; `ok` is False if the victim never printed READY (within 30 s)."""

    def __init__(self, mode, nsurv, victim):
        self.mode = mode
        self.survivors = []
        for i in range(nsurv):
            o = H.work / f"surv.{mode}.{i}"
            if mode == "omps":
                argv = H.as_omps(H.bin / "vector_add", "--loops", str(H.loops))
            else:
                argv = H.native(H.bin / "vector_add", "--loops", str(H.loops))
            self.survivors.append(spawn(argv, o, f"{o}.err"))
        self.victim = None
        self.ok = True
        if not victim:
            return
        o = H.work / f"victim.{mode}"
        # no wrapper: the pid must be the victim's own (env execs it)
        if mode == "omps":
            argv = ["env", f"OMPS_PIPE_DIRECTORY={H.omps.pipe}", f"LD_PRELOAD={H.shim}", H.bin / "hold_memory"]
        else:
            argv = [H.bin / "hold_memory"]
        self.victim = spawn(argv, o, f"{o}.err")
        t0 = now_ns()
        while grep_first(r"^READY", o) is None:
            if not alive(self.victim) or now_ns() - t0 > 30_000_000_000:
                log("victim never printed READY")
                show_output(f"hold_memory {mode}", o)
                self.ok = False
                return
            time.sleep(0.02)
        log(f"victim pid {self.victim.pid} READY after {(now_ns() - t0) // 1_000_000} ms")

    def alive_count(self):
        return sum(1 for p in self.survivors if alive(p))

    def kill_victim(self):
        if self.victim is not None:
            try:
                self.victim.kill()
            except ProcessLookupError:
                pass

    def wait_survivors(self):
        """Waits for every survivor; "k/n" of them passed."""
        ok = 0
        for i, p in enumerate(self.survivors):
            rc = wait(p)
            out = H.work / f"surv.{self.mode}.{i}"
            if verdict(rc, out) == "PASS":
                ok += 1
            else:
                show_output(f"survivor {self.mode} {i} (rc={rc})", out)
        return f"{ok}/{len(self.survivors)}"
