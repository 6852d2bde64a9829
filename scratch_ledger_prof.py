import cProfile, pstats, os, sys, io
sys.path.insert(0, "benchmarks")
import torch
from engine_throughput import run, MODES
from mini_engine.model.builtin import build_builtin, QWEN35_08B
out = os.environ["OUT"]
model = build_builtin(QWEN35_08B).cuda().cast_projections(torch.bfloat16)
settings = dict(device="cuda", dtype="bfloat16", max_tokens=64)
names = ["copy, overlap", "copy, overlap, ledger"]
for n in names: run(model, MODES[n], **settings)
stats = {}
for i, n in enumerate(names):
    p = cProfile.Profile(); p.enable(); r = run(model, MODES[n], **settings); p.disable()
    p.dump_stats(f"{out}/prof{i}.pstats")
    print(n, r["seconds"], r["safeguard_work"]["ledger_host_seconds"], r["ledger_rows"])
    stats[n] = {k: v for k, v in pstats.Stats(p).stats.items()}
a, b = stats[names[0]], stats[names[1]]
rows = []
for k in set(a) | set(b):
    ta = a.get(k, (0, 0, 0, 0))[2]; tb = b.get(k, (0, 0, 0, 0))[2]
    ca = a.get(k, (0, 0, 0, 0))[1]; cb = b.get(k, (0, 0, 0, 0))[1]
    rows.append((tb - ta, cb - ca, k))
rows.sort(reverse=True)
for d, c, k in rows[:45]:
    print(f"{d*1e3:8.1f} ms {c:8d} calls  {k[0].split('/')[-1]}:{k[1]} {k[2]}")
for n in names:
    s = io.StringIO(); pstats.Stats(f"{out}/prof{names.index(n)}.pstats", stream=s).sort_stats("cumulative").print_stats(r"mini_engine", 30); open(f"{out}/cum{names.index(n)}.txt", "w").write(s.getvalue())
