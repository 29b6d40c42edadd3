#!/usr/bin/env python3
"""Resident text by role category and keelson module. Usage: text-attrib.py BIN OUTPREFIX.json CMD-SUBSTR (e.g. nftables)
Crates are taken from the first path segment of the demangled symbol;
generic code lands in the crate of its type (often core/alloc)."""
import sys, json, subprocess, re, collections
BIN, MAP, sel = sys.argv[1], sys.argv[2], sys.argv[3]
ph = subprocess.run(["readelf", "-lW", BIN], capture_output=True, text=True).stdout
for l in ph.splitlines():
    p = l.split()
    if p and p[0] == "LOAD" and "E" in p[6:-1]:
        off, va = int(p[1], 16), int(p[2], 16)
delta = va - off
out = subprocess.run(["nm", "-S", "--defined-only", "-C", BIN], capture_output=True, text=True).stdout
def path_of(name):
    n = name
    while n.startswith("<"): n = n[1:]
    n = n.lstrip("&*").replace("mut ", "").replace("dyn ", "").replace("const ", "")
    m = re.match(r"([A-Za-z_][A-Za-z0-9_]*)(?:::([A-Za-z_][A-Za-z0-9_]*))?", n)
    return (m.group(1), m.group(2) or "") if m else ("?", "")
NODE = {"zbus","zbus_names","zvariant","tonic","prost","keelson_cri","keelson_probes","oci_spec","containerd_client","tower","axum","nix_node"}
STARTUP = {"clap","clap_builder","clap_lex","serde_yaml","serde_saphyr","granit_parser","tracing_subscriber","regex","regex_automata","regex_syntax","aho_corasick","rustls","rustls_webpki","webpki","ring","aws_lc_rs","pem","rustls_pemfile","jsonpath_rust","pest","annotate_snippets","serde_path_to_error","jiff"}
PROXY = {"keelson_netplane","tokio","serde_json","serde","serde_core","netlink_bindings","nftables","rtnetlink","netlink_packet_route","netlink_packet_core","netlink_sys","aya","aya_obj","sha2","bytes","hashbrown","foldhash","k8s_openapi","kube_client","kube_core","kube_runtime","hyper","hyper_util","h2","http","http_body_util","futures_util","futures_core","futures_channel","tracing","tracing_core"}
STD = {"core","alloc","std","T","_","memchr"}
def cat(c):
    for nm, s in (("node role only", NODE), ("startup: CLI/config/TLS/log setup", STARTUP), ("proxy steady state + API client", PROXY), ("std/core/alloc (generic, all roles)", STD)):
        if c in s: return nm
    if c == "keelson": return None
    return "other dependencies"
syms = []
for l in out.splitlines():
    p = l.split(" ", 3)
    if len(p) == 4 and p[2] in "tTwW":
        a, s = int(p[0], 16), int(p[1], 16)
        if s: syms.append((a, s, path_of(p[3])))
d = json.load(open(MAP))
for pid, st in d.items():
    if sel not in st["cmd"]: continue
    pages = set(st["peak_pages"])
    by = collections.Counter(); tot = collections.Counter()
    for a, s, (c, m) in syms:
        k = cat(c) or f"keelson::{m}"
        f0 = (a - delta) // 4096; f1 = (a + s - 1 - delta) // 4096
        r = sum(min(a + s, (pg + 1) * 4096 + delta) - max(a, pg * 4096 + delta) for pg in range(f0, f1 + 1) if pg in pages)
        by[k] += r; tot[k] += s
    print(f"{st['cmd'][:90]}: peak {st['peak_kib']/1024:.1f} MiB, text resident {len(pages)*4/1024:.1f} MiB; symbols {sum(tot.values())/2**20:.1f} MiB, resident {sum(by.values())/2**20:.1f} MiB")
    for k, r in sorted(by.items(), key=lambda x: -x[1])[:22]:
        print(f"  {k:42} {r/2**20:6.2f} of {tot[k]/2**20:6.2f} MiB")
