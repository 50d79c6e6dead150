import atexit, os, sys, time, json
_t0 = time.time()
def _log():
    t = os.times()
    with open("/tmp/spylog/procs.jsonl", "a") as f:
        f.write(json.dumps({"pid": os.getpid(), "ppid": os.getppid(), "argv": sys.argv[:6], "wall": time.time() - _t0,
                            "cpu": t.user + t.system, "children_cpu": t.children_user + t.children_system}) + "\n")
atexit.register(_log)
