"""hang_probe.py's variants side by side, one process each; a variant still running after the limit has
cuda-gdb attach and list the device's active kernels (which kernel never ends), then it is killed.

    python3 scripts/device/hang_probe_driver.py VARIANTS_FILE [seconds, default 150]

VARIANTS_FILE: one line of hang_probe.py arguments per variant (without --log). Logs go under $OUT."""
import os, subprocess, sys, time, shlex
out = os.environ.get("OUT", "/tmp/out")
variants = [l.strip() for l in open(sys.argv[1]) if l.strip() and not l.startswith("#")]
limit = float(sys.argv[2]) if len(sys.argv) > 2 else 150
procs = []
for i, v in enumerate(variants):
    logf = open(f"{out}/v{i}.out", "w")
    cmd = [sys.executable, "scripts/device/hang_probe.py", "--log", f"{out}/v{i}.steps"] + shlex.split(v)
    procs.append((i, v, subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT), time.time()))
pending = list(procs)
while pending:
    time.sleep(2)
    for item in list(pending):
        i, v, pr, t0 = item
        if pr.poll() is not None:
            pending.remove(item); continue
        if time.time() - t0 > limit:
            try:
                g = subprocess.run(["cuda-gdb", "-batch", "-p", str(pr.pid), "-ex", "info cuda kernels",
                                    "-ex", "info cuda blocks", "-ex", "bt"], capture_output=True, text=True, timeout=90)
                open(f"{out}/v{i}.gdb", "w").write(g.stdout[-20000:] + g.stderr[-5000:])
            except Exception as e:
                open(f"{out}/v{i}.gdb", "w").write(repr(e))
            pr.kill(); pending.remove(item)
for i, v, pr, t0 in procs:
    txt = open(f"{out}/v{i}.out").read()
    res = [l for l in txt.splitlines() if l.startswith("RESULT") or "Error" in l]
    steps = open(f"{out}/v{i}.steps").read().splitlines() if os.path.exists(f"{out}/v{i}.steps") else []
    print(f"[{i}] {v}\n   rc={pr.returncode} {res[-1] if res else 'NO RESULT'}\n   last step: {steps[-1] if steps else '-'}")
    if os.path.exists(f"{out}/v{i}.gdb"):
        g = open(f"{out}/v{i}.gdb").read()
        print("   gdb:", "\n   ".join([l for l in g.splitlines() if "Kernel" in l or "kernel" in l or "*" in l][:8]))
