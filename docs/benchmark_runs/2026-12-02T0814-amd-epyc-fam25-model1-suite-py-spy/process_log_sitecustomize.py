import os, sys, time, atexit, resource
_log = os.environ.get("PROC_LOG")
if _log:
    _t0 = time.time()
    def _w(kind):
        ru = resource.getrusage(resource.RUSAGE_SELF)
        with open(_log, "a") as f:
            f.write(f"{kind}\t{os.getpid()}\t{os.getppid()}\t{time.time():.2f}\t{ru.ru_utime+ru.ru_stime:.2f}\t{'jax' in sys.modules}\t{' '.join(sys.argv[:6])!r}\n")
    _w("start")
    atexit.register(_w, "exit")
