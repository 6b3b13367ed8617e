"""Sum a py-spy raw profile (bench/gpu_gil.sh) by thread and by the innermost envvault function of each stack."""
import sys, collections, re
# py-spy raw: "thread (id): name;frame;frame;... count"
by_thread = collections.Counter(); by_leaf = collections.Counter(); by_fn = collections.defaultdict(collections.Counter)
total = 0
for line in open(sys.argv[1]):
    line = line.rstrip("\n")
    if not line: continue
    stack, n = line.rsplit(" ", 1); n = int(n)
    frames = stack.split(";")
    th = re.sub(r"^thread \(\w+\): ", "", frames[0])
    th = re.sub(r"[-_]\d+$", "", re.sub(r"_\d+$", "", th))
    total += n; by_thread[th] += n
    leaf = frames[-1]
    by_leaf[leaf] += n
    # envvault frames: the innermost envvault function
    ev = [f for f in frames[1:] if "envvault/" in f]
    by_fn[th][ev[-1] if ev else leaf] += n
print("total samples", total)
for th, n in by_thread.most_common():
    print(f"{n:7d} {100*n/total:5.1f}%  {th}")
    for fn, m in by_fn[th].most_common(12):
        print(f"           {m:6d} {100*m/total:5.1f}%  {fn[:140]}")
print("leaves:")
for leaf, n in by_leaf.most_common(25):
    print(f"{n:7d} {100*n/total:5.1f}%  {leaf[:150]}")
