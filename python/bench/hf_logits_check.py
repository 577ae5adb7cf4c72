"""Whether a logit difference after a restore is the GPU's or the restore's: in one process, the
next-token logits from copies of the saved K/V (twice: the GPU's own reproducibility) and from
kvtier.hf restores (RAM tier and disk), each with and without a full device sync between the
restore and the model's step. A restore that raced the model would differ only without the
sync; the K/V are compared byte for byte each time. Prints one JSON line.

usage: PYTHONPATH=build/default/python python3 python/bench/hf_logits_check.py [--dir D]
"""
import os, sys, json, argparse
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch
from transformers import DynamicCache
import kvtier, kvtier.hf
from bench_hf_ttft import build, forward, kv_of

ap = argparse.ArgumentParser()
ap.add_argument("--dir", default="/root/race"); ap.add_argument("--layers", type=int, default=32)
ap.add_argument("--hidden", type=int, default=4096); ap.add_argument("--tokens", type=int, default=16384)
args = ap.parse_args()
os.makedirs(args.dir, exist_ok=True)
model, prompt = build(args)
forward(model, prompt[:, :256])
ref = forward(model, prompt[:, :-1]); ref_cache = ref.past_key_values
saved = [(k.clone(), v.clone()) for k, v in kv_of(ref_cache)]
def cont_from(kv, contig=False):
    c = DynamicCache()
    for i, (k, v) in enumerate(kv):
        kvtier.hf._adopt(c, i, (k.contiguous() if contig else k).clone(), (v.contiguous() if contig else v).clone())
    return forward(model, prompt[:, -1:], c).logits[:, -1].float()
a = cont_from(saved); b = cont_from(saved); c2 = cont_from(saved, contig=True)
res = dict(det=bool(torch.equal(a, b)), contig_vs_ref=float((c2 - a).abs().max()),
           saved_contig=[bool(saved[0][0].is_contiguous())])
pc = kvtier.hf.prompt_cache(model, os.path.join(args.dir, "pc"), ram_max_bytes=3 << 30,
                            spill_queue_max_bytes=0, keep_saved_cached=True)
kvtier.hf.save_cache(pc, prompt[:, :-1], ref_cache)
pc.flush()
del ref, ref_cache; torch.cuda.empty_cache()
def one(fresh, sync):
    if fresh: pc.clear()
    n, cache = kvtier.hf.restore_cache(pc, prompt)
    if sync:
        kvtier.hf.wait_restored(cache); torch.cuda.synchronize()
    lg = forward(model, prompt[:, n:], cache).logits[:, -1].float()
    torch.cuda.synchronize()
    kvok = all(torch.equal(k[:, :, :n], sk) and torch.equal(v[:, :, :n], sv) for (k, v), (sk, sv) in zip(kv_of(cache), saved))
    return dict(fresh=fresh, sync=sync, n=n, kv=kvok, diff=float((lg - a).abs().max()), diff_contig=float((lg - c2).abs().max()))
out = []
for rep in range(2):
    for fresh in (False, True):
        for sync in (True, False):
            out.append(one(fresh, sync))
res["runs"] = out
print(json.dumps(res), flush=True)
pc.close(flush=False)
