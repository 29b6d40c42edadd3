#!/usr/bin/env python3
"""Sample which pages of keelson's text are resident (pagemap present bit),
for every process whose exe is BIN; record the page set at each process's
RSS peak and the union. Usage: text-map.py BIN OUTPREFIX (SECS=<limit>; touch OUTPREFIX.stop to end)
Writes OUTPREFIX.json. Run as root beside a keelson-bench run.
See docs/benchmarks.md, "Which text is resident"."""
import os, sys, struct, time, json
BIN = os.path.realpath(sys.argv[1]); OUT = sys.argv[2]
PAGE = 4096
state = {}  # pid -> dict(peak_rss, pages_at_peak, union, cmd)
def maps(pid):
    res = []
    with open(f"/proc/{pid}/maps") as f:
        for l in f:
            p = l.split()
            if len(p) >= 6 and os.path.realpath(p[5]) == BIN:
                a, b = (int(x, 16) for x in p[0].split('-'))
                res.append((a, b, p[1], int(p[2], 16)))
    return res
def resident(pid, a, b):
    n = (b - a) // PAGE
    with open(f"/proc/{pid}/pagemap", "rb") as f:
        f.seek(a // PAGE * 8); d = f.read(n * 8)
    out = []
    for i in range(len(d) // 8):
        (v,) = struct.unpack_from("<Q", d, i * 8)
        if v >> 63: out.append(i)
    return out
def rss(pid):
    with open(f"/proc/{pid}/status") as f:
        for l in f:
            if l.startswith("VmRSS"): return int(l.split()[1])
    return 0
t_end = time.time() + float(os.environ.get("SECS", "900"))
while time.time() < t_end:
    for d in os.listdir("/proc"):
        if not d.isdigit(): continue
        try:
            if os.path.realpath(f"/proc/{d}/exe") != BIN: continue
            pid = int(d); r = rss(pid)
            st = state.setdefault(pid, {"peak": 0, "peak_pages": [], "union": set(),
                 "cmd": open(f"/proc/{d}/cmdline").read().replace("\0", " ")[:300]})
            pages = []; ro = 0
            for a, b, perm, off in maps(pid):
                if 'x' in perm:
                    pages += [off // PAGE + i for i in resident(pid, a, b)]
                elif perm.startswith('r--'):
                    ro += len(resident(pid, a, b))
            st["union"].update(pages)
            if r > st["peak"]:
                st["peak"], st["peak_pages"] = r, pages
                st["ro_pages"] = ro
                st["rollup"] = open(f"/proc/{d}/smaps_rollup").read()
        except (FileNotFoundError, ProcessLookupError, PermissionError, ValueError):
            pass
    time.sleep(0.3)
    if os.path.exists(OUT + ".stop"): break
json.dump({str(p): {"peak_kib": s["peak"], "cmd": s["cmd"], "peak_pages": s["peak_pages"],
           "union": sorted(s["union"]), "rollup": s.get("rollup", ""), "ro_pages": s.get("ro_pages", 0)} for p, s in state.items()}, open(OUT + ".json", "w"))
